"""The probe's readings: the reconstruction's scores, and their paired bootstrap intervals.

First the scores of a fitted decoder's greedy reconstruction beside token accuracy and H_r, and what limits the
reading.

Definitions (held-out chunks, the reconstruction against the true chunk; the reconstruction is greedy, with a
repetition penalty for autoregressive decoders, see :func:`reconstruct_ids`):

* **Token-set F1** (TF1, order-free, as vec2text's): F1 between the set of
  token ids of the reconstruction and the set of the true chunk, per chunk,
  averaged over chunks.
* **Sentence BLEU**: :func:`memlab.metrics.sentence_bleu` (NLTK, whitespace
  tokens, smoothing method 4, 0-1) of the decoded reconstruction against the
  decoded chunk, averaged over chunks.
* **Exact match**: share of chunks rebuilt token for token.
* **Free-running accuracy**: share of the held-out target tokens where the reconstruction's token at position i
  equals the true token at i (positional, as token accuracy is, but the decoder reads its own previous outputs,
  never the true tokens); per chunk, so it gets a paired bootstrap interval against the control's.
* **Information gain**: ``(CE_control - CE_probe) / CE_control``.

Then the paired bootstrap intervals of the readings, and whether they show retention. Every reading is a statistic
of the held-out chunks. The chunks are resampled with replacement (``n_resamples`` times, seeded) and the probe's and
the control's numbers of a chunk are drawn together (a paired bootstrap), so the interval of a difference is that of
the difference, not of two independent noises. The interval is the percentile interval at ``level`` (95 % by
default), as ``scipy.stats.bootstrap(..., paired=True, method="percentile")`` gives; the statistics here are ratios
of sums over chunks, vectorised over resamples.

Readings (:func:`readings`, each a :class:`~memlab.probes.readings.Reading`; nats summed over a chunk's target
tokens, as :func:`memlab.probes.decoder.fit.evaluate` gives them per chunk):

* ``bits_per_chunk``: mean over chunks of ``(NLL_control - NLL_probe) / ln 2``:
  what the embedding adds, in bits, for a chunk of the shared text;
* ``bits_per_char``: the same sum over all chunks divided by their characters;
* ``bits_per_token``: the same sum divided by the chunks' target tokens (bits per chunk over the mean target tokens
  per chunk);
* ``information_gain``: ``(sum NLL_control - sum NLL_probe) / sum NLL_control``;
* ``token_accuracy`` and ``token_accuracy_gain`` (over the control);
* ``token_set_f1`` and ``token_set_f1_gain`` (over the control);
* ``free_running_accuracy`` and ``free_running_accuracy_gain`` (over the control's greedy reconstruction);
* ``bow_recovered`` and ``bow_gain`` (over its frequency prior), and for any other read-out ``NAME``
  (:mod:`memlab.probes.parts`) ``NAME_recovered`` and ``NAME_gain``; a read-out whose per-chunk numbers hold
  ``nll`` and ``prior_nll`` also gives ``NAME_bits_per_chunk`` (mean of ``(prior_nll - nll) / ln 2``), and one
  with ``tf1`` and ``prior_tf1`` gives ``NAME_token_set_f1`` and ``NAME_token_set_f1_gain``.

A gain whose interval holds zero (or lies below it) is reported as "no evidence of retention at this budget", never
as a bare figure, and never as the embedding misleading the decoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from memlab.metrics import sentence_bleu

from memlab.probes.chunks.batch import mask_of, rows
from memlab.probes.parts import get_part, own_options, reads_tokens


@dataclass(frozen=True)
class Reading:
    """One reading with the percentile interval of its paired bootstrap over held-out chunks
    (:mod:`memlab.probes.readings`)."""

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, r) -> Reading | None:
        """``r`` as a Reading: a Reading, report.json's ``{value, low, high}`` or None."""
        return r if r is None or isinstance(r, Reading) else cls(r["value"], r["low"], r["high"])

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}

    def __getitem__(self, key: str) -> float:
        """``reading["value"]``: report.json's form, for scripts written against it."""
        if key not in ("value", "low", "high"):
            raise KeyError(key)
        return getattr(self, key)


@dataclass
class ChunkScores:
    """One decoder's numbers per held-out chunk: what its paired intervals resample."""

    nll: Any
    """Summed NLL of each chunk's target tokens, nats."""
    hits: Any
    """Teacher-forced argmax hits per chunk."""
    tokens: Any
    """Real target tokens per chunk."""
    tf1: list | None = None
    """Token-set F1 of each chunk's greedy reconstruction (None: not scored)."""
    free_hits: list | None = None
    """Free-running hits per chunk: positions where the greedy reconstruction holds the true token."""


@dataclass
class Reconstructed:
    """The scorers' readings of a decoder's greedy reconstructions (:func:`memlab.probes.readings.reconstruction_scores`):
    ``metrics`` (each scorer's mean and ``free_running_accuracy``), the numbers per chunk its intervals resample and
    the decoded reconstructions."""

    metrics: dict
    tf1: list
    """Token-set F1 of each chunk's reconstruction."""
    free_hits: list
    """Positions per chunk where the reconstruction holds the true token."""
    texts: list
    """The reconstructions, decoded."""


@dataclass
class DecoderScores:
    """A fitted sequence decoder's held-out scores: ``metrics`` (report.json's ``probe`` or ``control``), its
    numbers per chunk and its decoded greedy reconstructions. ``scores["ce"]`` reads ``metrics``."""

    metrics: dict
    chunks: ChunkScores | None = None
    reconstruction: list | None = None

    def with_reconstruction(self, rec: Reconstructed) -> DecoderScores:
        """These teacher-forced scores (:func:`memlab.probes.decoder.fit.evaluate`) and the scorers' ``rec``."""
        chunks = None if self.chunks is None else replace(self.chunks, tf1=rec.tf1, free_hits=rec.free_hits)
        return DecoderScores({**self.metrics, **rec.metrics}, chunks, rec.texts)

    def noted(self, **notes) -> DecoderScores:
        """The same scores, ``notes`` added to (a copy of) the metrics."""
        return replace(self, metrics={**self.metrics, **notes})

    def __getitem__(self, key: str):
        return self.metrics[key]


@torch.no_grad()
def reconstruct_ids(dec, z: torch.Tensor, seq_len: int, batch_size: int = 128,
                    repeat_penalty: float | None = None) -> torch.Tensor:
    """The reconstruction ``(N, T)`` token ids from embeddings ``z`` (N, D).

    Blank inputs: every position's argmax at once. Teacher inputs: greedy, token by token, where each token
    already in the reconstruction has its log-probability lowered by ``repeat_penalty`` nats (default: the
    decoder's ``config.repeat_penalty``; 0 is plain greedy), so a weak decoder does not loop on one phrase.
    """
    dec.eval()
    device = next(dec.parameters()).device
    start = int(dec.config.start_id)
    penalty = float(getattr(dec.config, "repeat_penalty", 0.0) if repeat_penalty is None else repeat_penalty)
    incremental = getattr(dec, "incremental_decoding", False)  # else every step reruns the whole prefix
    out = []
    for i in range(0, z.shape[0], batch_size):
        zb = z[i : i + batch_size].to(device)  # (b, D)
        if not reads_tokens(dec.config):  # every position at once: the inputs never hold a true token
            seq = dec.predict_full(dec(zb, torch.full((zb.shape[0], seq_len), start, device=device)))  # (b, T)
        else:
            seq = torch.full((zb.shape[0], 1), start, dtype=torch.long, device=device)  # (b, 1)
            state, pen = {}, None
            for _ in range(seq_len):
                logits = (dec(zb, seq, mode="next", state=state) if incremental else dec(zb, seq)[:, -1:]).float()
                if pen is not None:  # the same shift of a class's logit shifts its log-probability alike
                    logits = logits - pen.unsqueeze(1)  # (b, 1, C)
                nxt = dec.predict_full(logits)  # (b, 1)
                if penalty:  # each class already written loses ``penalty`` nats from now on
                    pen = torch.zeros(logits.shape[0], logits.shape[-1], device=device) if pen is None else pen
                    pen.scatter_(1, dec.to_compact[nxt], penalty)  # (b, C)
                seq = torch.cat([seq, nxt], dim=1)  # (b, t + 2)
            seq = seq[:, 1:]  # (b, T)
        out.append(seq)
    return torch.cat(out).cpu()  # (N, T)


def _cut(pred: torch.Tensor, true: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    """Each chunk's real tokens and as many of its reconstruction (a padded chunk is rebuilt to its own length; a
    reconstruction shorter than its chunk, PAD after it, keeps its own tokens only)."""
    t = rows(true)
    return [[x for x in p[: len(r)] if x >= 0] for p, r in zip(pred.tolist(), t)], t


def set_f1(pred: list[int], true: list[int]) -> float:
    """F1 between the sets of token ids of two sequences (0 when they share none)."""
    ps, ts = set(pred), set(true)
    hit = len(ps & ts)
    return 0.0 if not hit else 2 * hit / (len(ps) + len(ts))


def token_set_f1_per_chunk(pred: torch.Tensor, true: torch.Tensor) -> list[float]:
    """Each chunk's F1 between the sets of token ids of ``pred`` and ``true`` (both (N, T); PAD skipped)."""
    return [set_f1(p, t) for p, t in zip(*_cut(pred, true))]


def token_set_f1(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Mean over chunks of :func:`token_set_f1_per_chunk`."""
    scores = token_set_f1_per_chunk(pred, true)
    return sum(scores) / max(len(scores), 1)


def free_running_hits(pred: torch.Tensor, true: torch.Tensor) -> list[int]:
    """Each chunk's count of real (non-PAD) positions where ``pred`` holds the true token (both (N, T))."""
    real = mask_of(true)  # (N, T)
    return ((pred[:, : true.shape[1]] == true) & real).sum(1).tolist()


def free_running_accuracy(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Share of the real tokens of ``true`` (N, T) that ``pred`` (N, T) holds at the same position."""
    return sum(free_running_hits(pred, true)) / max(int(mask_of(true).sum()), 1)


def exact_match(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Share of chunks whose reconstruction equals the chunk token for token."""
    p, t = _cut(pred, true)
    return sum(a == b for a, b in zip(p, t)) / len(t) if len(t) else 0.0


def reconstruction_scores(dec, z: torch.Tensor, ids: torch.Tensor, tokenizer, scorers: list[str],
                          opts=None) -> Reconstructed:
    """Each registered scorer in ``scorers`` on the greedy reconstruction of ``ids`` (N, T) from ``z`` (N, D) and its
    free-running accuracy; the per-chunk TF1 and free-running hits, for their intervals, and the decoded
    reconstructions."""
    pred = reconstruct_ids(dec, z, ids.shape[1])  # (N, T)
    cut, true = _cut(pred, ids)
    hyps = tokenizer.batch_decode(cut, skip_special_tokens=True)
    refs = tokenizer.batch_decode(true, skip_special_tokens=True)
    parts = {name: get_part("scorer", name) for name in scorers}  # each given its own options, when it has any
    out = {n: float(p.impl(pred, ids, hyps, refs, **own_options(p, opts))) for n, p in parts.items()}
    free = free_running_hits(pred, ids)
    out["free_running_accuracy"] = sum(free) / max(int(mask_of(ids).sum()), 1)
    return Reconstructed(out, token_set_f1_per_chunk(pred, ids), free, hyps)


def limit_line(probe: dict, control: dict | None) -> str:
    """Which of order and content limits the reading, in one sentence."""
    if "token_set_f1" not in probe:
        return None
    f1, acc = probe["token_set_f1"], probe["token_accuracy"]
    c_f1 = control["token_set_f1"] if control else 0.0
    c_acc = control["token_accuracy"] if control else 0.0
    if f1 >= 0.95 and acc >= 0.95:
        return "not limited: the chunks come back whole"
    if f1 - c_f1 < 0.05 and acc - c_acc < 0.05:
        return (f"content-limited: no more of the token set (TF1 {f1:.2f} vs control {c_f1:.2f}) or of the "
                "positions than the control; the embedding gives the probe nothing it can read")
    if f1 - acc >= 0.2:
        return (f"order-limited: the probe reads which tokens occur (TF1 {f1:.2f}, control {c_f1:.2f}) far better "
                f"than where (token accuracy {acc:.2f}, control {c_acc:.2f})")
    return (f"content-limited: the token set comes back only in part (TF1 {f1:.2f}, control {c_f1:.2f}), "
            f"and where it does, mostly in place (token accuracy {acc:.2f})")


NO_EVIDENCE = "no evidence of retention"


def bootstrap(stat, columns: dict[str, np.ndarray], n_resamples: int, level: float, seed: int) -> tuple[float, float]:
    """Percentile interval of ``stat(columns)`` over paired resamples of the rows (chunks) of every column.

    ``stat`` takes a dict of (R, M) arrays (R resamples of M chunks) and returns (R,) values.
    """
    m = len(next(iter(columns.values())))
    idx = np.random.default_rng(seed).integers(0, m, size=(n_resamples, m))  # (R, M) the same rows for all columns
    values = stat({k: np.asarray(v, dtype=np.float64)[idx] for k, v in columns.items()})  # (R,)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _ratio(num: str, den: str, sign: tuple[str, str] | None = None, scale: float = 1.0):
    def stat(c):
        top = c[sign[0]] - c[sign[1]] if sign else c[num]
        return scale * top.sum(-1) / np.maximum(c[den].sum(-1), 1e-12)

    return stat


def _mean(a: str, b: str | None = None, scale: float = 1.0):
    return lambda c: scale * ((c[a] - c[b]) if b else c[a]).mean(-1)


def readings(probe: ChunkScores | None, control: ChunkScores | None, chars, n_resamples: int = 2000,
             level: float = 0.95, seed: int = 0, readouts: dict | None = None) -> dict[str, Reading]:
    """Each :class:`~memlab.probes.readings.Reading` (see the module doc) from per-chunk numbers.

    ``probe`` / ``control``: each decoder's numbers per held-out chunk (NLL, hits and tokens, and the greedy
    reconstruction's token-set F1 and free-running hits where scored); ``chars``: characters of each held-out
    chunk; ``readouts``: each read-out's per-chunk numbers by name.
    """
    ln2 = math.log(2)
    specs: dict[str, tuple] = {}
    cols: dict[str, np.ndarray] = {}
    if probe is not None:
        cols.update(p_nll=probe.nll, p_hits=probe.hits, tokens=probe.tokens, chars=np.asarray(chars))
        specs["token_accuracy"] = _ratio("p_hits", "tokens")
        if probe.tf1 is not None:
            cols["p_tf1"] = np.asarray(probe.tf1)
            specs["token_set_f1"] = _mean("p_tf1")
        if probe.free_hits is not None:
            cols["p_free"] = np.asarray(probe.free_hits)
            specs["free_running_accuracy"] = _ratio("p_free", "tokens")
    if probe is not None and control is not None:
        cols.update(c_nll=control.nll, c_hits=control.hits)
        specs["bits_per_chunk"] = _mean("c_nll", "p_nll", scale=1 / ln2)
        specs["bits_per_char"] = _ratio("", "chars", sign=("c_nll", "p_nll"), scale=1 / ln2)
        specs["bits_per_token"] = _ratio("", "tokens", sign=("c_nll", "p_nll"), scale=1 / ln2)
        specs["information_gain"] = _ratio("", "c_nll", sign=("c_nll", "p_nll"))
        specs["token_accuracy_gain"] = _ratio("", "tokens", sign=("p_hits", "c_hits"))
        if probe.tf1 is not None and control.tf1 is not None:
            cols["c_tf1"] = np.asarray(control.tf1)
            specs["token_set_f1_gain"] = _mean("p_tf1", "c_tf1")
        if probe.free_hits is not None and control.free_hits is not None:
            cols["c_free"] = np.asarray(control.free_hits)
            specs["free_running_accuracy_gain"] = _ratio("", "tokens", sign=("p_free", "c_free"))
    for i, (name, per) in enumerate((readouts or {}).items()):
        pairs = [("recovered", "prior", "recovered", "gain"), ("tf1", "prior_tf1", "token_set_f1", "token_set_f1_gain")]
        for got, base, level_name, gain_name in pairs:
            if got in per and base in per:
                cols.update({f"r{i}_{got}": np.asarray(per[got]), f"r{i}_{base}": np.asarray(per[base])})
                specs[f"{name}_{level_name}"] = _mean(f"r{i}_{got}")
                specs[f"{name}_{gain_name}"] = _mean(f"r{i}_{got}", f"r{i}_{base}")
        if "nll" in per and "prior_nll" in per:
            cols.update({f"r{i}_nll": np.asarray(per["nll"]), f"r{i}_prior_nll": np.asarray(per["prior_nll"])})
            specs[f"{name}_bits_per_chunk"] = _mean(f"r{i}_prior_nll", f"r{i}_nll", scale=1 / ln2)
    out = {}
    for name, stat in specs.items():
        value = float(stat({k: np.asarray(v, dtype=np.float64)[None] for k, v in cols.items()})[0])
        lo, hi = bootstrap(stat, cols, n_resamples, level, seed)
        out[name] = Reading(value, lo, hi)
    return out


def shows_retention(r: Reading | dict | None) -> bool:
    """A gain's interval lies above zero."""
    return r is not None and Reading.of(r).low > 0


def retention(read: dict, level: float = 0.95, gains: dict[str, str] | None = None) -> str:
    """One line: what the embedding adds in bits (with its interval), or "no evidence of retention": the sequence
    probe's bits over its control, else a read-out's bits over its prior, else the first read-out gain of ``gains``
    (reading -> its unit, in the read-outs' order) there is."""
    aligned = [k for k in read if k.endswith("_bits_per_chunk")]
    gained = [k for k in (gains or {}) if k in read]
    key = "bits_per_chunk" if "bits_per_chunk" in read else aligned[0] if aligned else gained[0] if gained else None
    if key is None:
        return "no control: retention not measured"
    r = Reading.of(read[key])
    unit = ("bits per chunk" if key == "bits_per_chunk" else gains[key] if key in (gains or {})
            else f"bits per chunk ({key[: -len('_bits_per_chunk')]} read-out over its prior)")
    span = f"{r.value:.3g} {unit}, {level:.0%} interval [{r.low:.3g}, {r.high:.3g}]"
    if shows_retention(r):
        return f"retained: {span}"
    return f"{NO_EVIDENCE} at this budget: {span}"  # at or below zero: the decoder found nothing to read


def cell(r: Reading | dict | None, gain: bool, digits: int = 3) -> str:
    """A table cell: ``value [low, high]``; a gain without evidence reads ``no evidence [low, high]`` (``r``: a
    Reading, or report.json's form of one)."""
    if r is None:
        return ""
    r = Reading.of(r)
    span = f"[{r.low:.{digits}f}, {r.high:.{digits}f}]"
    if gain and not shows_retention(r):
        return f"no evidence {span}"
    return f"{r.value:.{digits}f} {span}"


# the built-in scorers (registered in memlab.probes.catalog)

def score_token_set_f1(pred, true, hyps, refs) -> float:
    return token_set_f1(pred, true)


def score_sentence_bleu(pred, true, hyps, refs) -> float:
    return sentence_bleu(hyps, refs) if refs else 0.0


def score_exact_match(pred, true, hyps, refs) -> float:
    return exact_match(pred, true)
