"""One table: the inversion and the trained probe on the same held-out chunks, in the units they share.

Rows (instruments): the inversion, its control (pooled searches: the same search from another chunk's state, scored
against the true chunk), the trained probe (its saved decoder, :mod:`memlab.probes.invert.beside.side`) and the probe's
control (the decoder trained on a constant embedding, where the run kept it). Columns:

* ``token_accuracy``: teacher-forced (the decoder reads the true previous tokens); a search reads no true token and
  assigns no probabilities, so the inversion has none;
* ``free_running_accuracy``: share of the chunks' tokens found at their position by the instrument's own output
  (the probe's greedy reconstruction; the inversion's recovered tokens);
* ``exact_match``: share of chunks given back token for token;
* ``token_set_f1``: order-free (the set of token ids), mean over chunks;
* ``bits_per_chunk``: ``(NLL_control - NLL_probe) / ln 2`` summed over a chunk's tokens, mean over chunks, as the
  probe defines it (:mod:`memlab.probes.readings`): only where a read-out assigns probabilities and its control is
  at hand.

Every figure has the percentile interval of one bootstrap over the chunks (the same resamples for every row, so the
rows are paired), by :func:`memlab.probes.invert.report.readings`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from memlab.probes.invert.report import readings
from memlab.probes.readings import Reading, set_f1

COLUMNS = ("token_accuracy", "free_running_accuracy", "exact_match", "token_set_f1", "bits_per_chunk")
HEADS = ("token acc. (forced)", "free-running acc.", "exact match", "token-set F1", "bits per chunk")
ROWS = ("inversion", "inversion control", "trained probe", "probe control")


@dataclass
class ProbeTable:
    """report.json's ``table``: the instruments' figures on the same chunks (a row's missing cell: None)."""

    probe_run: str
    chunks: list[int]
    """Indices of the held-out chunks both instruments read (the first of the run's held-out chunks)."""
    rows: dict[str, dict[str, Reading | None]]
    what: dict[str, str]
    """Each row's instrument, in words."""
    notes: list[str]
    per_chunk: list[dict] = field(default_factory=list)
    """Each chunk: its tokens, what the inversion and the probe's greedy reconstruction gave back, the NLLs."""

    def to_dict(self) -> dict:
        return {"probe_run": self.probe_run, "chunks": self.chunks, "columns": list(COLUMNS),
                "rows": {r: {c: (v.to_dict() if v is not None else None) for c, v in cells.items()}
                         for r, cells in self.rows.items()},
                "what": self.what, "notes": self.notes, "per_chunk": self.per_chunk}


def _share(num: str, den: str = "tokens"):
    return lambda c: c[num].sum(-1) / np.maximum(c[den].sum(-1), 1e-12)


def _mean(col: str):
    return lambda c: c[col].mean(-1)


def build_table(side, inverted: list, states: str, layer: int, seed: int = 0) -> ProbeTable:
    """The table from the probe's side (:class:`~memlab.probes.invert.beside.side.ProbeSide`) and the inversion's chunks
    (``ChunkResult`` or ``PooledChunk``, in the order of ``side.ids``)."""
    if [c.true_ids for c in inverted] != side.ids:
        raise ValueError("the inversion and the probe did not read the same chunks")
    tokens = np.array([len(t) for t in side.ids], dtype=np.float64)
    cols = {"tokens": tokens,
            "inv_hits": np.array([c.token_accuracy for c in inverted]) * tokens,
            "inv_exact": np.array([c.exact for c in inverted], dtype=np.float64),
            "inv_tf1": np.array([set_f1(c.recovered_ids, c.true_ids) for c in inverted])}
    specs = {("inversion", "free_running_accuracy"): _share("inv_hits"),
             ("inversion", "exact_match"): _mean("inv_exact"), ("inversion", "token_set_f1"): _mean("inv_tf1")}
    controlled = [c for c in inverted if getattr(c, "control_of", None) is not None]
    if controlled and len(controlled) == len(inverted):
        cols |= {"ictl_hits": np.array([c.control_token_accuracy for c in inverted]) * tokens,
                 "ictl_exact": np.array([c.control_exact for c in inverted], dtype=np.float64),
                 "ictl_tf1": np.array([c.control_token_f1 for c in inverted])}
        specs |= {("inversion control", "free_running_accuracy"): _share("ictl_hits"),
                  ("inversion control", "exact_match"): _mean("ictl_exact"),
                  ("inversion control", "token_set_f1"): _mean("ictl_tf1")}
    for row, pre, reads in (("trained probe", "p", side.probe), ("probe control", "c", side.control)):
        if reads is None:
            continue
        cols |= {f"{pre}_hits": reads.hits, f"{pre}_free": reads.free_hits, f"{pre}_nll": reads.nll,
                 f"{pre}_exact": reads.exact.astype(np.float64), f"{pre}_tf1": reads.tf1}
        specs |= {(row, "token_accuracy"): _share(f"{pre}_hits"), (row, "free_running_accuracy"): _share(f"{pre}_free"),
                  (row, "exact_match"): _mean(f"{pre}_exact"), (row, "token_set_f1"): _mean(f"{pre}_tf1")}
    if side.control is not None:
        specs[("trained probe", "bits_per_chunk")] = lambda c: ((c["c_nll"] - c["p_nll"]) / math.log(2)).mean(-1)
    got = readings({f"{r}|{k}": f for (r, k), f in specs.items()}, cols, seed=seed)
    present = [r for r in ROWS if any(k.startswith(r + "|") for k in got)]
    rows = {r: {k: got.get(f"{r}|{k}") for k in COLUMNS} for r in present}
    what = {"inversion": f"white-box inversion from the {_states(states)} at layer {layer}, the model's own weights",
            "inversion control": "the same search from the next chunk's state, scored against the true chunk",
            "trained probe": f"the probe's saved decoder on its {side.facts.get('pool')} state at layer "
                             f"{side.facts.get('layer')} ({side.facts.get('encoder_dtype')} encoder)",
            "probe control": "the probe's decoder trained on a constant embedding"}
    notes = [side.control_note]
    if states == "positions":
        notes.append("per-position states: the search has no control (every position is certified or not)")
    notes.append("the inversion reads no true token and assigns no probabilities: no teacher-forced accuracy and no "
                 "bits per chunk; its token accuracy is free-running")
    per_chunk = [{"index": i, "text": side.texts[i], "true_ids": side.ids[i],
                  "inversion_ids": inverted[i].recovered_ids,
                  "probe_ids": side.probe.ids[i] if side.probe.ids is not None else None,
                  "probe_nll": float(side.probe.nll[i]),
                  "control_nll": float(side.control.nll[i]) if side.control is not None else None}
                 for i in range(len(side.ids))]
    return ProbeTable(side.run, list(range(len(side.ids))), rows, {r: what[r] for r in present}, notes, per_chunk)


def _states(states: str) -> str:
    return {"positions": "per-position states", "last": "last position's state",
            "mean": "mean over positions"}[states]


def _cell(r: Reading | None) -> str:
    return "-" if r is None else f"{r.value:.3f} [{r.low:.3f}, {r.high:.3f}]"


def table_lines(t: ProbeTable) -> list[str]:
    """The table as ``memlab invert`` prints it."""
    w = 24
    lines = [f"beside the trained probe ({t.probe_run}): the same {len(t.chunks)} held-out chunks, 95% bootstrap "
             "intervals over them (paired)",
             f"{'':<18}" + "".join(f"{h:<{w}}" for h in HEADS)]
    for row, cells in t.rows.items():
        lines.append(f"{row:<18}" + "".join(f"{_cell(cells[k]):<{w}}" for k in COLUMNS).rstrip())
    lines += [f"  {r}: {w_}" for r, w_ in t.what.items()]
    lines += [f"  note: {n}" for n in t.notes]
    return lines
