"""The report of ``memlab invert`` with a pooled ``--states``: per chunk and in total, beside the control's
figures.

Each total is a :class:`~memlab.probes.readings.Reading` with the percentile interval of a bootstrap over chunks
(:func:`memlab.probes.readings.bootstrap`):

* ``exact_match``: share of chunks recovered token for token; ``exact_text``: share whose recovered text is the
  true text (different token sequences can decode to the same text); ``certified``: share whose recovered pooled
  state matches the target within the search's ``tol`` (float noise): whatever text that is, the state cannot tell
  it from the truth;
* ``token_accuracy``: share of the chunks' tokens recovered at their position (the probe's definition; the search
  never sees a true token, so it is also the free-running accuracy);
* ``token_f1``: token-set F1 between the recovered and the true tokens (order-free, as vec2text's TF1);
* ``bleu``: sacrebleu's sentence BLEU (0-100) of the recovered text against the true text, averaged over chunks;
* ``runner_up``: mean relative distance of the nearest evaluated sequence other than the one returned (the gap
  beside a certified answer);
* ``distance``: mean relative distance ``|pool(h_L) - z*| / |z*|`` reached, ``start_distance`` at the start;
* ``forwards_per_chunk``, ``seconds_per_chunk``: the compute spent.

The **control** runs the same search against the pooled state of another chunk (the next one in the list) and
scores what it recovers against the TRUE chunk: what the start and the prior alone recover
(``control_exact_match``, ``control_token_accuracy``, ``control_token_f1``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from memlab.probes.invert.report import ChunkRead, InvertRun, _cell, readings
from memlab.probes.readings import Reading, set_f1


@dataclass
class PooledChunk(ChunkRead):
    """One chunk: the true tokens, the search's best sequence and the control's, each scored against the truth."""

    token_f1: float
    distance: float
    start_distance: float
    forwards: int
    seconds: float
    control_of: int | None = None
    """The chunk whose pooled state the control searched (None: no control run)."""
    control_ids: list[int] = field(default_factory=list)
    control_exact: bool = False
    control_token_accuracy: float = math.nan
    control_token_f1: float = math.nan
    control_distance: float = math.nan
    exact_text: bool = False
    certified: bool = False
    runner_up: float = math.nan
    bleu: float = math.nan
    proposal: str = ""
    """The proposer's text before correction (empty without one)."""
    control_exact_text: bool = False
    control_bleu: float = math.nan
    rouge1: float = math.nan
    """ROUGE-1 F-measure of the recovered text against the true text (rouge_score, stemmed)."""
    rouge_l: float = math.nan
    """ROUGE-L F-measure of the recovered text against the true text."""
    cosine: float = math.nan
    """Cosine between the recovered text's pooled vector and the target."""
    relax_distance: float = math.nan
    """--method relax or relax-correct: the relative distance of the relaxation's nearest projection."""
    relax_steps: int = 0
    """--method relax or relax-correct: relaxation steps the chunk took part in (0: not relaxed)."""


def sentence_bleu(hyp: str, ref: str) -> float:
    """sacrebleu's sentence BLEU (0-100, its default smoothing) of ``hyp`` against ``ref``."""
    import sacrebleu

    return float(sacrebleu.sentence_bleu(hyp, [ref]).score)


def same_text(a: str, b: str) -> bool:
    """Texts equal up to whitespace (a tokenizer's decoding may space punctuation differently)."""
    return " ".join(a.split()) == " ".join(b.split())


def pooled_chunk(index: int, text: str, true: list[int], res, decode, control=None,
                 control_of: int | None = None, tol: float = 0.0) -> PooledChunk:
    """A :class:`PooledChunk` from the search's result (:class:`~memlab.probes.invert.pooled.searcher.PooledResult` or
    :class:`~memlab.probes.invert.pooled.recover.RecoverResult`) and the control's, each scored against the true chunk
    ``true``; ``tol``: the relative distance within which a result is certified."""
    hits = sum(a == b for a, b in zip(res.ids, true)) / max(len(true), 1)
    ref = decode(list(true))
    got = decode(res.ids)
    c = PooledChunk(index, text, list(true), res.ids, got, res.ids == list(true), hits,
                    set_f1(res.ids, true), res.distance, res.start_distance, res.forwards, res.seconds)
    c.exact_text, c.certified = same_text(got, ref), res.distance <= tol
    runner = float(getattr(res, "runner_up", math.nan))
    c.runner_up, c.bleu = (runner if math.isfinite(runner) else math.nan), sentence_bleu(got, ref)
    c.proposal = getattr(res, "proposal", "")
    from memlab.metrics import sentence_rouge

    c.rouge1, c.rouge_l = sentence_rouge(got, ref)
    if control is not None:
        c.control_of, c.control_ids = control_of, control.ids
        c.control_exact = control.ids == list(true)
        c.control_exact_text = same_text(decode(control.ids), ref)
        c.control_token_accuracy = sum(a == b for a, b in zip(control.ids, true)) / max(len(true), 1)
        c.control_token_f1, c.control_distance = set_f1(control.ids, true), control.distance
        c.control_bleu = sentence_bleu(decode(control.ids), ref)
    return c


def pooled_totals(chunks: list[PooledChunk], n_resamples: int = 2000, level: float = 0.95,
                  seed: int = 0) -> dict[str, Reading]:
    """Each total with its bootstrap interval over chunks (token accuracy weighted by tokens)."""
    n = np.array([len(c.true_ids) for c in chunks], dtype=np.float64)
    cols = {"tokens": n, "hits": np.array([c.token_accuracy for c in chunks]) * n,
            "control_hits": np.array([c.control_token_accuracy for c in chunks]) * n}
    means = {"exact_match": "exact", "exact_text": "exact_text", "certified": "certified", "bleu": "bleu",
             "runner_up": "runner_up", "control_exact_text": "control_exact_text", "control_bleu": "control_bleu",
             "token_f1": "token_f1", "distance": "distance", "rouge1": "rouge1", "rouge_l": "rouge_l",
             "cosine": "cosine",
             "start_distance": "start_distance", "forwards_per_chunk": "forwards", "seconds_per_chunk": "seconds",
             "control_exact_match": "control_exact", "control_token_f1": "control_token_f1",
             "control_distance": "control_distance"}
    for col in set(means.values()):
        cols[col] = np.array([float(getattr(c, col)) for c in chunks], dtype=np.float64)
    specs = {name: (lambda col: lambda c: c[col].mean(-1))(col) for name, col in means.items()}
    specs["runner_up"] = lambda c: np.nanmean(c["runner_up"], -1) if np.isfinite(c["runner_up"]).any() else \
        np.full(c["runner_up"].shape[:-1], np.nan)
    # paired over the same chunks: the search's reading minus the control's
    specs["token_f1_over_control"] = lambda c: (c["token_f1"] - c["control_token_f1"]).mean(-1)
    specs["token_accuracy_over_control"] = lambda c: (c["hits"] - c["control_hits"]).sum(-1) / np.maximum(
        c["tokens"].sum(-1), 1e-12)
    specs["token_accuracy"] = lambda c: c["hits"].sum(-1) / np.maximum(c["tokens"].sum(-1), 1e-12)
    specs["control_token_accuracy"] = lambda c: c["control_hits"].sum(-1) / np.maximum(c["tokens"].sum(-1), 1e-12)
    return readings(specs, cols, n_resamples, level, seed)


@dataclass
class PooledReport(InvertRun):
    """report.json of ``memlab invert`` with a pooled ``--states``."""

    prior: bool
    """Whether the model's next-token distribution was read (greedy/sampled starts, the prior term)."""
    totals: dict[str, Reading]
    chunks: list[PooledChunk] = field(default_factory=list)
    table: dict | None = None
    """The trained probe beside the search on the same chunks (``--probe``, :mod:`memlab.probes.invert.beside.table`)."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["totals"] = {k: v.to_dict() for k, v in self.totals.items()}
        return out


def search_line(s: dict, prior: bool) -> str:
    """How the search ran, in one line."""
    budget = f"{s['gflops']:g} GFLOP-equivalents ({s.get('budget_seconds', math.nan):.0f} s)" \
        if "gflops" in s else "no time limit"
    if s.get("method", "swap") == "swap":
        return (f"search: swap, {budget} or {s['forwards']} candidate forwards per chunk, batch {s['batch_size']}, "
                f"top-{s['topk']}, {s['restarts']} restarts, start {s['init']}"
                f"{', prior weight %g' % s['prior_weight'] if prior else ''}"
                f"{'' if prior else ' (no prior: no readable next-token head)'}")
    prop = f", proposer {s['proposer']} ({s['beams']} beams x {s['branch']})" if s.get("proposer") else ""
    if s.get("method") in ("relax", "relax-correct"):
        share = 1.0 if s["method"] == "relax" else s["relax_share"]
        prop = (f", relaxation of {s['relax_rows']} rows per chunk in batches of {s['relax_group']} chunks, at most "
                f"{s['relax_steps']} steps and {share:.0%} of the budget (loss {s.get('relax_loss', 'log')}, "
                f"lr {s['relax_lr']:g}, temperature "
                f"{s['relax_temp']:g}, decay {s['relax_decay']:g}, moments reset every {s['relax_reset']}, rows drawn "
                f"again every {s['relax_reinit']})")
        if s["method"] == "relax":
            return f"search: relax{prop}, {budget} per chunk"
    return (f"search: {s['method']}{prop}, {budget} or {s['forwards']} forwards per chunk; edits of batch "
            f"{s['batch_size']}, top-{s['topk']}, moves {s['move_share']:g}, insert/deletes {s['insert_share']:g}"
            + (f", table top-{s['table_topk']}" if s.get("table_topk") else "")
            + (f", pairs of the best {s['pair_top']}" if s.get("pair_top", 0) > 1 else "")
            + (f", merges of up to {s['merge']}" if s.get("merge", 0) > 1 else "")
            + (f", bf16 screen keeping {s['screen']}" if s.get("screen") else "")
            + (f"; distance whitened ({s['whiten']:g}, {s['whitening_chunks']} training chunks)"
               if s.get("whitening_chunks") else ""))


def pooled_summary(rep: PooledReport) -> list[str]:
    """The lines that ``memlab invert`` with a pooled ``--states`` prints."""
    t, m, s = rep.totals, rep.machine, rep.search
    rate = m.get("matmul_gflops", math.nan)
    src = "" if rep.states_from == rep.model else f" (states of {rep.states_from})"
    control = not math.isnan(t["control_token_accuracy"].value)
    where = "the space's vector" if rep.layer is None else f"layer {rep.layer} of {rep.num_layers}"
    lines = [
        f"model: {rep.model}{src}, {where}, states {rep.states} (pooled)",
        f"chunks: {len(rep.chunks)} ({rep.text['seq_len']} {rep.text['chunk_by']} of {rep.text['corpus']} "
        f"{rep.text['split']}), {sum(len(c.true_ids) for c in rep.chunks)} tokens",
        search_line(s, rep.prior),
        *([f"note: {s['proposer_note']}"] if s.get("proposer_note") else []),
        "                 search                  control (another chunk's state, scored against the true chunk)",
        f"exact match:     {_cell(t['exact_match'])}   " + (_cell(t['control_exact_match']) if control else "-"),
        f"exact text:      {_cell(t['exact_text'])}   " + (_cell(t['control_exact_text']) if control else "-"),
        f"token accuracy:  {_cell(t['token_accuracy'])}   " + (_cell(t['control_token_accuracy']) if control else "-"),
        f"token-set F1:    {_cell(t['token_f1'])}   " + (_cell(t['control_token_f1']) if control else "-"),
        f"BLEU:            {_cell(t['bleu'], 1)}   " + (_cell(t['control_bleu'], 1) if control else "-"),
        f"ROUGE-1, ROUGE-L: {t['rouge1'].value:.3f}, {t['rouge_l'].value:.3f}; cosine to the target "
        f"{t['cosine'].value:.3f}",
        f"certified:       {t['certified'].value:.2f} of the chunks matched their target within {s['tol']:g} "
        f"(relative distance); the nearest other sequence tried was at {t['runner_up'].value:.4g} on average",
        f"relative distance: {_cell(t['distance'], 4)} reached, from {t['start_distance'].value:.4f} at the start"
        + (f"; the control reached {t['control_distance'].value:.4f} to its own target" if control else ""),
        f"per chunk: {t['forwards_per_chunk'].value:.0f} forwards, {_cell(t['seconds_per_chunk'], 1)} s "
        f"({t['seconds_per_chunk'].value * rate:.0f} GFLOP-equivalents at the {rate:.0f} GFLOP/s fp32 matmul rate "
        "measured in this run; the control's search not counted)",
    ]
    relaxed = relax_summary_line(rep.chunks, s["tol"])
    if relaxed:
        lines.append(relaxed)
    if s.get("token_table_seconds"):
        n = len(rep.chunks) * (2 if control else 1)
        g = s["token_table_seconds"] * rate
        lines.append(f"token table (every token's pooled state alone, once for the run): "
                     f"{s['token_table_seconds']:.1f} s ({g:.0f} GFLOP-equivalents; {g / n:.0f} per search over the "
                     f"run's {n} searches)")
    if s.get("whitening_chunks"):
        n = len(rep.chunks) * (2 if control else 1)
        g = s["whitening_seconds"] * rate
        lines.append(f"whitening ({s['whitening_chunks']} training chunks' pooled states, once for the run): "
                     f"{s['whitening_seconds']:.1f} s ({g:.0f} GFLOP-equivalents; {g / n:.0f} per search)")
    return lines


def relax_summary_line(chunks, tol: float) -> str | None:
    """One summary line of what the relaxation alone reached (None when no chunk was relaxed); ``tol``: the
    certificate's relative distance."""
    relaxed = [c for c in chunks if getattr(c, "relax_steps", 0)]
    if not relaxed:
        return None
    alone = sum(c.relax_distance <= tol for c in relaxed)
    d = sorted(c.relax_distance for c in relaxed)
    med = d[len(d) // 2] if d else math.nan
    steps = sum(c.relax_steps for c in relaxed) / len(relaxed)
    return (f"relaxation: {alone} of {len(relaxed)} chunks certified by the relaxation alone, median distance of its "
            f"nearest projection {med:.3g}, {steps:.0f} steps per chunk")
