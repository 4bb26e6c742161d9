"""The report of ``memlab invert``: per chunk and in total, with bootstrap intervals over chunks.

Figures (each total a :class:`~memlab.probes.readings.Reading`: the value and the percentile interval of a bootstrap
over chunks, by :func:`memlab.probes.readings.bootstrap`):

* ``exact_match``: share of chunks recovered token for token;
* ``token_accuracy``: share of the chunks' tokens recovered at their position (the probe's definition: positional,
  over the real tokens);
* ``certified``: share of the positions with a certificate (``match``, ``separated`` or ``nearest``; an
  ``ambiguous`` position, whose best two candidates the states as read cannot tell apart, is not certified);
* ``candidates_per_token``: candidates verified per token (ranked and exhaustive);
* ``seconds_per_token``: wall time per token (search and verification, not model loading).

Beside them the distribution of candidates tried per position (median, 90th percentile, max), of the true token's
rank in the first ranking, and the certificates (best relative distance, runner-up, gap).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from memlab.probes.readings import Reading, bootstrap

CERTIFICATES = ("match", "separated", "nearest", "ambiguous", "none")
"""The kinds of certificate (:mod:`memlab.probes.invert.positions.searcher`), strongest first."""

CERTIFIED = ("match", "separated", "nearest")
"""The kinds that certify a position (``ambiguous`` and ``none`` do not)."""


@dataclass
class ChunkRead:
    """One chunk as any inversion reads it: the true tokens, the recovered ones, and how they compare."""

    index: int
    text: str
    true_ids: list[int]
    recovered_ids: list[int]
    recovered_text: str
    exact: bool
    token_accuracy: float


@dataclass
class ChunkResult(ChunkRead):
    """One chunk of the per-position search: beside the tokens, each position's search."""

    tried: list[int]
    certificates: list[str]
    distances: list[float]
    runner_up: list[float]
    exhaustive: list[bool]
    true_ranks: list[int | None]
    seconds: float
    prior_ranks: list[int | None] = field(default_factory=list)
    """The true token's rank in the model's next-token distribution at each position (None: no prior there)."""
    grad_ranks: list[int | None] = field(default_factory=list)
    """The true token's rank in each position's first first-order ranking (None: not ranked)."""
    found_at: list[int | None] = field(default_factory=list)
    """Candidates verified when the kept token was first verified (None: read off the first-position table)."""
    from_table: list[bool] = field(default_factory=list)
    """Whether the position was read off the shared first-position table (its ``tried`` is the whole vocabulary,
    verified once per model and layer; left out of the candidates per token)."""
    secant_ranks: list[int | None] = field(default_factory=list)
    """The true token's rank in each position's first secant order (None: the position settled before it)."""
    noise: list[float] = field(default_factory=list)
    """Each position's noise floor as read (``--states-dtype``, a relative distance; 0 at float32)."""


@dataclass
class Spread:
    """A distribution over positions."""

    median: float
    p90: float
    max: float

    @classmethod
    def of(cls, values) -> "Spread":
        a = np.asarray([v for v in values if v is not None], dtype=np.float64)
        if a.size == 0:
            return cls(math.nan, math.nan, math.nan)
        return cls(float(np.median(a)), float(np.quantile(a, 0.9)), float(a.max()))


@dataclass
class InvertRun:
    """What every ``memlab invert`` report.json begins with: which states of which model, read how, on what."""

    model: str
    states_from: str
    """The model whose states were inverted (the same as ``model`` unless ``--states-from`` names another)."""
    layer: int | None
    """The layer read (None: a space's vector, read at no layer)."""
    num_layers: int | None
    states: str
    hooks: dict
    text: dict
    """How the chunks were cut: corpus, split, chunk_by, seq_len, seed, the probe's n_eval they are the first of."""
    search: dict
    noise: float
    machine: dict


@dataclass
class InvertReport(InvertRun):
    """report.json of ``memlab invert --states positions``."""

    totals: dict[str, Reading]
    tried: Spread
    true_rank: Spread
    certificates: dict[str, int]
    worst_gap: float
    """Least gap (runner-up over best distance) over the certified positions."""
    exhaustive_positions: int
    chunks: list[ChunkResult] = field(default_factory=list)
    prior_rank: Spread | None = None
    """The true token's rank in the model's next-token distribution (positions with a prior)."""
    grad_rank: Spread | None = None
    """The true token's rank in the first first-order ranking of its position."""
    secant_rank: Spread | None = None
    """The true token's rank in the first secant order of its position (positions that reached it)."""
    found_at: Spread | None = None
    """Candidates verified per position when the kept token was first verified (the floor is 1)."""
    vocab_size: int = 0
    share_of_vocab: float = math.nan
    """Mean candidates verified per ranked position over the vocabulary size (table-read positions apart)."""
    table: dict | None = None
    """The trained probe beside the inversion on the same chunks (``--probe``, :mod:`memlab.probes.invert.beside.table`)."""
    states_dtype: str = "float32"
    """The precision the observed states were read at (``--states-dtype``)."""
    noise_floor: Spread | None = None
    """The positions' noise floors as read (None at float32, where it is 0)."""
    least_margin: float = math.nan
    """Least ``(runner-up - best) / noise floor`` over the certified positions: how many floors apart the
    certificates stand (nan at float32)."""
    ambiguous: list[list[int]] = field(default_factory=list)
    """The ``ambiguous`` positions as ``[chunk, position]``."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["totals"] = {k: v.to_dict() for k, v in self.totals.items()}
        return out


def chunk_result(index: int, text: str, true: list[int], positions, decode, seconds: float) -> ChunkResult:
    """A chunk's :class:`ChunkResult` from its searched positions (:class:`~memlab.probes.invert.positions.searcher.Position`)."""
    got = [p.token for p in positions]
    hits = sum(a == b for a, b in zip(got, true))
    return ChunkResult(index, text, list(true), got, decode(got), got == list(true), hits / max(len(true), 1),
                       [p.tried for p in positions], [p.certificate for p in positions],
                       [p.distance for p in positions], [p.runner_up for p in positions],
                       [p.exhaustive for p in positions], [p.true_rank for p in positions], seconds,
                       [getattr(p, "prior_rank", None) for p in positions],
                       [getattr(p, "grad_rank", None) for p in positions],
                       [getattr(p, "found_at", None) for p in positions],
                       [bool(getattr(p, "from_table", False)) for p in positions],
                       [getattr(p, "secant_rank", None) for p in positions],
                       [float(getattr(p, "noise", 0.0)) for p in positions])


def totals(chunks: list[ChunkResult], n_resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Reading]:
    """Each total with its bootstrap interval over chunks."""
    cols = {
        "exact": np.array([c.exact for c in chunks], dtype=np.float64),
        "hits": np.array([c.token_accuracy * len(c.true_ids) for c in chunks]),
        "tokens": np.array([len(c.true_ids) for c in chunks], dtype=np.float64),
        "certified": np.array([sum(x in CERTIFIED for x in c.certificates) for c in chunks], dtype=np.float64),
        "tried": np.array([sum(t for t, f in zip(c.tried, _table(c)) if not f) for c in chunks], dtype=np.float64),
        "ranked": np.array([sum(not f for f in _table(c)) for c in chunks], dtype=np.float64),
        "seconds": np.array([c.seconds for c in chunks]),
    }
    ratio = lambda a, b: (lambda c: c[a].sum(-1) / np.maximum(c[b].sum(-1), 1e-12))  # noqa: E731
    specs = {"exact_match": lambda c: c["exact"].mean(-1), "token_accuracy": ratio("hits", "tokens"),
             "certified": ratio("certified", "tokens"), "candidates_per_token": ratio("tried", "ranked"),
             "seconds_per_token": ratio("seconds", "tokens")}
    return readings(specs, cols, n_resamples, level, seed)


def _table(c: ChunkResult) -> list[bool]:
    return c.from_table or [False] * len(c.tried)


def _noise(c: ChunkResult) -> list[float]:
    return c.noise or [0.0] * len(c.tried)  # a record kept before the floors were: float32's 0


def readings(specs: dict, cols: dict[str, np.ndarray], n_resamples: int = 2000, level: float = 0.95,
             seed: int = 0) -> dict[str, Reading]:
    """Each statistic of ``specs`` (name -> a function of the (R, M) columns) over the chunks' ``cols`` (M rows),
    with its bootstrap interval over chunks."""
    out = {}
    for name, stat in specs.items():
        value = float(stat({k: v[None] for k, v in cols.items()})[0])
        lo, hi = bootstrap(stat, cols, n_resamples, level, seed)
        out[name] = Reading(value, lo, hi)
    return out


def build_report(chunks: list[ChunkResult], **meta) -> InvertReport:
    """The whole report from the chunk results and the run's description (``meta``: the fields of
    :class:`InvertReport` other than the figures)."""
    certs = [x for c in chunks for x in c.certificates]
    gaps = [r / d if d > 0 else math.inf for c in chunks for d, r, x in zip(c.distances, c.runner_up, c.certificates)
            if x in CERTIFIED]
    chunks = sorted(chunks, key=lambda c: c.index)
    dtype = meta.pop("states_dtype", "float32")
    floors = [f for c in chunks for f in _noise(c)]
    margins = [(r - d) / f for c in chunks for d, r, x, f in zip(c.distances, c.runner_up, c.certificates, _noise(c))
               if x in CERTIFIED and f > 0]
    ranked = [t for c in chunks for t, f in zip(c.tried, _table(c)) if not f]
    vocab = int(meta.pop("vocab_size", 0) or 0)
    return InvertReport(**meta, totals=totals(chunks), tried=Spread.of(ranked),
                        true_rank=Spread.of([r for c in chunks for r in c.true_ranks]),
                        certificates={k: certs.count(k) for k in CERTIFICATES},
                        worst_gap=min(gaps) if gaps else math.nan,
                        exhaustive_positions=sum(x for c in chunks for x, f in zip(c.exhaustive, _table(c)) if not f),
                        chunks=chunks, prior_rank=Spread.of([r for c in chunks for r in c.prior_ranks]),
                        grad_rank=Spread.of([r for c in chunks for r in c.grad_ranks]),
                        secant_rank=Spread.of([r for c in chunks for r in c.secant_ranks]),
                        found_at=Spread.of([r for c in chunks for r in c.found_at]), vocab_size=vocab,
                        share_of_vocab=(float(np.mean(ranked)) / vocab) if ranked and vocab else math.nan,
                        states_dtype=dtype, noise_floor=None if dtype == "float32" else Spread.of(floors),
                        least_margin=min(margins) if margins else math.nan,
                        ambiguous=[[c.index, i] for c in chunks for i, x in enumerate(c.certificates)
                                   if x == "ambiguous"])


def _cell(r: Reading, digits: int = 3) -> str:
    return f"{r.value:.{digits}f} [{r.low:.{digits}f}, {r.high:.{digits}f}]"


def _ranks(rep: InvertReport) -> str:
    parts = []
    for name, sp in (("the model's next-token distribution", rep.prior_rank), ("the gradient", rep.grad_rank),
                     ("the secant order", rep.secant_rank), ("kept token found after", rep.found_at)):
        if sp is not None and not math.isnan(sp.median):
            parts.append(f"{name}: median {sp.median:.0f}, p90 {sp.p90:.0f}, max {sp.max:.0f}")
    return ("; " + "; ".join(parts)) if parts else ""


def summary_lines(rep: InvertReport) -> list[str]:
    """The lines ``memlab invert`` prints."""
    t = rep.totals
    n_pos = sum(len(c.true_ids) for c in rep.chunks)
    n_table = sum(sum(_table(c)) for c in rep.chunks)
    m = rep.machine
    gflop = t["seconds_per_token"].value * m.get("matmul_gflops", math.nan)
    src = "" if rep.states_from == rep.model else f" (states of {rep.states_from})"
    noise = f", noise {rep.noise:g} of the state norm" if rep.noise else ""
    if rep.noise_floor is not None:
        noise += (f", read as {rep.states_dtype} (noise floor median {rep.noise_floor.median:.3g}, max "
                  f"{rep.noise_floor.max:.3g} of the state norm)")
    lines = [
        f"model: {rep.model}{src}, layer {rep.layer} of {rep.num_layers}, states {rep.states}{noise}",
        f"chunks: {len(rep.chunks)} ({rep.text['seq_len']} {rep.text['chunk_by']} of {rep.text['corpus']} "
        f"{rep.text['split']}), {n_pos} positions",
        f"exact match: {_cell(t['exact_match'])} (95% bootstrap interval over chunks)",
        f"token accuracy: {_cell(t['token_accuracy'])}",
        f"certified positions: {_cell(t['certified'])}; "
        + ", ".join(f"{k} {v}" for k, v in rep.certificates.items()) + f"; least gap {rep.worst_gap:.3g}",
        f"candidates per position: mean {t['candidates_per_token'].value:.1f}"
        + (f" ({100 * rep.share_of_vocab:.3f} % of the {rep.vocab_size} tokens)" if rep.vocab_size else "")
        + f", median {rep.tried.median:.0f}, p90 {rep.tried.p90:.0f}, max {rep.tried.max:.0f}; exhaustive searches "
        f"{rep.exhaustive_positions}" + (f"; {n_table} first positions searched apart (one pass shared by the chunks)" if n_table else ""),
        f"true token's rank in the first ranking: median {rep.true_rank.median:.0f}, p90 {rep.true_rank.p90:.0f}, "
        f"max {rep.true_rank.max:.0f}" + _ranks(rep),
        f"seconds per token: {_cell(t['seconds_per_token'], 2)} ({gflop:.0f} GFLOP-equivalents at the "
        f"{m.get('matmul_gflops', math.nan):.0f} GFLOP/s fp32 matmul rate measured in this run)",
    ]
    if rep.noise_floor is not None:
        shown = ", ".join(f"chunk {c} position {i}" for c, i in rep.ambiguous[:5])
        lines.append(f"ambiguous (two candidates within the noise floor of the states as read): {len(rep.ambiguous)} "
                     f"positions" + (f" ({shown}{', ...' if len(rep.ambiguous) > 5 else ''})" if shown else "")
                     + f"; least margin of a certificate {rep.least_margin:.3g} noise floors")
    none = [(c.index, i) for c in rep.chunks for i, x in enumerate(c.certificates) if x == "none"]
    if none:
        shown = ", ".join(f"chunk {c} position {i}" for c, i in none[:5])
        lines.append(f"no certificate: {len(none)} positions ({shown}{', ...' if len(none) > 5 else ''})")
    return lines
