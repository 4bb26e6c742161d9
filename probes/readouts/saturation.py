"""The learning curve inside every probe run, and its verdict: is the reading still limited by the training chunks?

A reading at one budget can be the model or the probe: a decoder that would read more from more chunks says less
than the embedding holds. So every probe run (with a sequence decoder and its control) also fits the decoders on
the first ``share * n_train`` training chunks for each share of ``curve_shares`` (default a half, a quarter, an
eighth and a sixteenth; the chunks come in a seeded random order, so a prefix is a sample), each with the probe's
own fit (:func:`memlab.probes.decoder.fit.fit_decoders`: its control trained on the same prefix, the same candidates and
early stopping), each read on the same held-out chunks. The run's own fit is the curve's last point. The prefixes'
decoders are also the online code's (:mod:`memlab.probes.readouts.online_code`): each sends the block of training chunks
after its prefix. A share of fewer than :data:`MIN_CHUNKS` chunks is not fitted.

The verdict, report.json's ``saturation``:

* ``curve``: per size, bits per chunk and token accuracy on the held-out chunks with their paired bootstrap
  intervals, the start kept and the seconds;
* ``last_doubling``: the bits per chunk the last step of the curve added (the full run over its largest share),
  with the interval of a paired bootstrap over the held-out chunks (both fits' probe and control per chunk, drawn
  together);
* ``ceiling``: the most bits a chunk can give (``bits_per_chunk``: the control's whole code of a held-out chunk) and
  what the probe still pays (``left``: its own code); ``reached`` when ``left`` is at most :data:`TOLERANCE` of the
  bits read (the chunks come back nearly whole: nothing left to rise to);
* ``saturated``: true at the ceiling, or when the last step's gain is not shown to exceed :data:`TOLERANCE` of the
  reading (its interval's low end at or below ``TOLERANCE * bits``, or at or below zero): more chunks would not
  change the reading by much;
* ``limit`` (where still rising): the curve's limit as ``n`` grows, a saturating power law
  ``b(n) = L - a * n^-alpha`` (alpha on a grid, L and a by least squares; L at most the ceiling) fitted to the last :data:`FIT_POINTS`
  points, with the percentile interval of the same fit over bootstrap resamples of the held-out chunks; the same for
  token accuracy (capped at 1). A fit whose alpha sits at the grid's low end grows like ``log n`` (or faster) over the
  range: ``limit`` is then None, with a note.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from memlab.probes.readouts.online_code import Block, online_code, uniform_block
from memlab.probes.readings import ChunkScores, Reading, readings
from memlab.probes.decoder.fit import evaluate, fit_decoders
from memlab.probes.decoder.records import ControlStore, FitData

MIN_CHUNKS = 64
"""The fewest training chunks a share of the curve is fitted on."""
TOLERANCE = 0.05
"""The share of the reading the last doubling must be shown to add for the reading to count as still rising."""
FIT_POINTS = 4
"""How many of the curve's largest sizes the extrapolation fits."""
ALPHAS = np.geomspace(0.05, 4.0, 80)
"""The exponents the saturating power law is fitted over (the least-squares best per resample)."""
LN2 = math.log(2)


@dataclass
class Point:
    """One size of the curve: its training chunks, the probe's and control's numbers per held-out chunk, which
    start was kept, and the seconds."""

    n: int
    probe: ChunkScores
    control: ChunkScores
    kept: str | None = None
    seconds: float = 0.0


def curve_sizes(shares, n_train: int) -> list[int]:
    """The curve's training sizes below ``n_train`` (each share's, rounded; fewer than :data:`MIN_CHUNKS` left out)."""
    sizes = {int(round(float(s) * n_train)) for s in (shares or ())}
    return sorted(n for n in sizes if MIN_CHUNKS <= n < n_train)


def _control_decoder(store: ControlStore, kept: str | None):
    """The control the kept probe is read against: the control's first run for a probe from a random start, else its
    second run."""
    entry = store.get()
    if entry is None:
        return None
    return entry.start if kept == "scratch" else entry.control


def _own_constant(dec, n: int, fallback: torch.Tensor) -> torch.Tensor:
    """(n, D) of the constant the control ``dec`` was trained on (its standardisation's mean: read as exact zeros)."""
    mean = getattr(dec, "z_mean", None)
    z = (mean.detach().cpu().float() if mean is not None else fallback).reshape(1, -1)
    return z.expand(n, z.shape[1])


def fit_share(opts, data: FitData, n: int, n_next: int, cache: dict, owner: str | None,
              control_key) -> tuple[Point, Block]:
    """The probe's fit (:func:`memlab.probes.decoder.fit.fit_decoders`) on the first ``n`` training chunks, read on the
    held-out chunks (the curve's point) and on the training chunks ``[n, n_next)`` (the online code's block);
    ``control_key(opts, tokenizer, train_ids, eval_ids)``: the key its control is kept under
    (:func:`memlab.probes.run.control_key`)."""
    t0 = time.perf_counter()
    o = replace(opts, n_train=n, calibrate=False)
    d = FitData(data.tok, data.train_ids[:n], data.eval_ids, data.z_train[:n], data.z_eval, data.table)
    store = ControlStore(cache, control_key(o, d.tok, d.train_ids, d.eval_ids, d.table), owner)
    got = fit_decoders(o, d, store, desc=f"probe decoder ({n} chunks)")
    kept = (got.probe.scores.metrics.get("start") or {}).get("kept")
    ids, z = data.train_ids[n:n_next], data.z_train[n:n_next]
    block_p = evaluate(got.probe.decoder, z, ids).chunks
    ctl = _control_decoder(store, kept)
    block_c = evaluate(ctl, _own_constant(ctl, ids.shape[0], d.z_train.mean(0)), ids).chunks if ctl is not None \
        else block_p
    point = Point(n, got.probe.scores.chunks, got.control.scores.chunks, kept, time.perf_counter() - t0)
    return point, Block(n, n_next, np.asarray(block_p.nll, dtype=np.float64),
                        np.asarray(block_c.nll, dtype=np.float64), np.asarray(block_p.tokens))


def _bits(p: ChunkScores, c: ChunkScores) -> np.ndarray:
    """(M,) bits the embedding adds per held-out chunk."""
    return (np.asarray(c.nll, dtype=np.float64) - np.asarray(p.nll, dtype=np.float64)) / LN2


def _acc(p: ChunkScores) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(p.hits, dtype=np.float64), np.asarray(p.tokens, dtype=np.float64)


def power_limit(ns, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares fits of ``y = L - a * n^-alpha`` (alpha on :data:`ALPHAS`) to curves ``ys`` (R, K) at sizes
    ``ns`` (K,): (L, a, alpha), each (R,). A falling or flat curve (a <= 0 at its best alpha) gets L = its last
    value and a = 0."""
    ns = np.asarray(ns, dtype=np.float64)
    ys = np.atleast_2d(np.asarray(ys, dtype=np.float64))  # (R, K)
    best = np.full(ys.shape[0], np.inf)
    out_l, out_a, out_al = ys[:, -1].copy(), np.zeros(ys.shape[0]), np.full(ys.shape[0], np.nan)
    for alpha in ALPHAS:
        x = -(ns / ns[-1]) ** -alpha  # (K,) scaled so a is in the curve's units
        xm, ym = x.mean(), ys.mean(1, keepdims=True)  # (), (R, 1)
        var = ((x - xm) ** 2).sum()
        a = ((x - xm) * (ys - ym)).sum(1) / var  # (R,) slope: a, with x = -n^-alpha
        lim = ym[:, 0] - a * xm  # (R,) intercept: L
        sse = ((ys - lim[:, None] - a[:, None] * x) ** 2).sum(1)  # (R,)
        take = (sse < best) & (a > 0)
        best = np.where(take, sse, best)
        out_l, out_a, out_al = np.where(take, lim, out_l), np.where(take, a, out_a), np.where(take, alpha, out_al)
    return out_l, out_a, out_al


def _limit(ns, curves: np.ndarray, value: float, level: float, cap: float | None = None) -> dict:
    """The extrapolated limit of ``curves`` (R+1, K: the curve itself first, then its resamples)."""
    lim, a, alpha = power_limit(ns, curves)
    if cap is not None:
        lim = np.minimum(lim, cap)
    if not a[0] > 0:
        return {"value": value, "low": value, "high": value, "alpha": None, "note": "not rising over the fitted sizes"}
    q = (1.0 - level) / 2
    lo, hi = np.quantile(lim[1:], [q, 1.0 - q])
    out = {"value": float(lim[0]), "low": float(lo), "high": float(hi), "alpha": float(alpha[0])}
    if alpha[0] <= ALPHAS[1]:  # at the grid's low end: log-like growth, no limit in sight
        return {"value": None, "low": None, "high": None, "alpha": float(alpha[0]),
                "note": "growing like log n or faster over the fitted sizes: no limit in sight"}
    return out


def verdict(points: list[Point], level: float = 0.95, n_resamples: int = 2000, seed: int = 0,
            chars=None) -> dict:
    """report.json's ``saturation`` from the curve's points (smallest first; the last is the run's own fit)."""
    m = len(points[-1].probe.nll)
    chars = np.ones(m) if chars is None else np.asarray(chars)
    rows = []
    for pt in points:
        r = readings(pt.probe, pt.control, chars, n_resamples=n_resamples, level=level, seed=seed)
        rows.append({"n_train": pt.n, "bits_per_chunk": r["bits_per_chunk"].to_dict(),
                     "token_accuracy": r["token_accuracy"].to_dict(), "kept": pt.kept,
                     "seconds": round(pt.seconds, 2)})
    out = {"curve": rows, "tolerance": TOLERANCE, "definition": DEFINITION}
    if len(points) < 2:
        return {**out, "saturated": None, "last_doubling": None, "limit": None,
                "note": f"no curve: every share of the training chunks is under {MIN_CHUNKS} chunks"}
    idx = np.random.default_rng(seed).integers(0, m, size=(n_resamples, m))  # (R, M) shared by every column
    bits = np.stack([_bits(pt.probe, pt.control) for pt in points])  # (K, M)
    hits, toks = zip(*(_acc(pt.probe) for pt in points))
    hits, toks = np.stack(hits), np.stack(toks)  # (K, M)
    gain = bits[-1] - bits[-2]  # (M,)
    g_res = gain[idx].mean(1)  # (R,)
    q = (1.0 - level) / 2
    g_lo, g_hi = np.quantile(g_res, [q, 1.0 - q])
    last = Reading(float(gain.mean()), float(g_lo), float(g_hi))
    top = float(bits[-1].mean())
    ceiling = float(np.asarray(points[-1].control.nll, dtype=np.float64).mean() / LN2)  # all the control's code
    left = float(np.asarray(points[-1].probe.nll, dtype=np.float64).mean() / LN2)  # what the probe still pays
    at_ceiling = top > 0 and left <= TOLERANCE * top
    saturated = bool(at_ceiling or last.low <= max(0.0, TOLERANCE * top))
    out.update(saturated=saturated, last_doubling={"from": points[-2].n, "to": points[-1].n, **last.to_dict()},
               ceiling={"bits_per_chunk": ceiling, "left": left, "reached": bool(at_ceiling)})
    if saturated or len(points) < 3:
        out["limit"] = None
        if not saturated:
            out["note"] = "still rising; too few sizes (under 3) to extrapolate"
        return out
    k = slice(max(0, len(points) - FIT_POINTS), len(points))
    ns = [pt.n for pt in points[k]]
    b_curves = np.concatenate([bits[k].mean(1)[None], bits[k][:, idx].mean(2).T])  # (R+1, K)
    a_curves = np.concatenate([(hits[k].sum(1) / toks[k].sum(1))[None],
                               (hits[k][:, idx].sum(2) / toks[k][:, idx].sum(2)).T])  # (R+1, K)
    out["limit"] = {"bits_per_chunk": _limit(ns, b_curves, top, level, cap=ceiling),
                    "token_accuracy": _limit(ns, a_curves, float(a_curves[0, -1]), level, cap=1.0),
                    "fitted_sizes": ns, "law": "L - a * n^-alpha"}
    return out


DEFINITION = ("readings at growing shares of the training chunks (the probe's own fit on each prefix, the same "
              "held-out chunks; the last point is the run itself); saturated: the last doubling's gain in bits per "
              "chunk (paired bootstrap over held-out chunks) is not shown to exceed tolerance x the reading; limit: "
              "L of a saturating power law L - a n^-alpha fitted to the largest sizes, interval over bootstrap "
              "resamples of the held-out chunks")


def learning_curve(opts, data: FitData, probe: ChunkScores, control: ChunkScores, kept: str | None, control_key,
                   cache: dict | None = None, owner: str | None = None, chars=None, seconds: float = 0.0,
                   log=None) -> tuple[dict, dict | None]:
    """The run's curve and verdict (``saturation``) and its online code (``online_code``; None without a curve):
    the probe's fit on each prefix of :func:`curve_sizes` (controls looked up and kept in ``cache``, a dict when
    None; ``control_key``: :func:`memlab.probes.run.control_key`), then the run's own fit (``probe``, ``control``,
    ``kept``: its numbers per held-out chunk)."""
    n_all = int(data.train_ids.shape[0])
    sizes = curve_sizes(getattr(opts, "curve_shares", ()), n_all)
    cache = {} if cache is None else cache
    points, blocks = [], []
    for n, n_next in zip(sizes, sizes[1:] + [n_all]):
        pt, blk = fit_share(opts, data, n, n_next, cache, owner, control_key)
        points.append(pt)
        blocks.append(blk)
        if log is not None:
            r = _bits(pt.probe, pt.control).mean()
            log(f"learning curve: {n} chunks, {r:.2f} bits per chunk ({pt.seconds:.0f}s)")
    points.append(Point(n_all, probe, control, kept, seconds))
    sat = verdict(points, opts.ci_level, opts.ci_resamples, opts.seed, chars)
    sat["seconds"] = round(sum(p.seconds for p in points[:-1]), 2)
    if not blocks:
        return sat, None
    tokens0 = (data.train_ids[: sizes[0]] >= 0).sum(1).numpy()
    vocab = len(data.tok)
    code = online_code([uniform_block(sizes[0], tokens0, vocab), *blocks], vocab, opts.ci_resamples, opts.ci_level,
                       opts.seed)
    return sat, code


def limit_note(limited_by: str | None, sat: dict | None) -> str | None:
    """The ``limited by:`` line, with the training chunks named where the curve still rises."""
    if not sat or sat.get("saturated") is not False:
        return limited_by
    d = sat["last_doubling"]
    lim = (sat.get("limit") or {}).get("bits_per_chunk") or {}
    acc = (sat.get("limit") or {}).get("token_accuracy") or {}
    where = ""
    if lim.get("value") is not None:
        where = f"; extrapolated limit {lim['value']:.1f} bits per chunk [{lim['low']:.1f}, {lim['high']:.1f}]"
        if acc.get("value") is not None:
            where += f", token accuracy {acc['value']:.3f} [{acc['low']:.3f}, {acc['high']:.3f}]"
    elif lim.get("note"):
        where = f"; {lim['note']}"
    rising = (f"the training chunks: still rising, +{d['value']:.2f} bits per chunk [{d['low']:.2f}, {d['high']:.2f}] "
              f"from {d['from']} to {d['to']} chunks{where}")
    return rising if not limited_by else f"{limited_by}; and by {rising}"


def summary_lines(sat: dict | None, code: dict | None) -> list[str]:
    """The summary's lines of the curve, its verdict and the online code."""
    lines = []
    if sat and sat.get("curve"):
        pts = ", ".join(f"{r['n_train']}: {r['bits_per_chunk']['value']:.1f} (acc {r['token_accuracy']['value']:.3f})"
                        for r in sat["curve"])
        word = {True: "saturated", False: "still rising", None: "not judged"}[sat.get("saturated")]
        lines.append(f"learning curve (bits per chunk by training chunks): {pts}; {word}")
        d = sat.get("last_doubling")
        if d:
            lines[-1] += (f" (last step +{d['value']:.2f} [{d['low']:.2f}, {d['high']:.2f}], tolerance "
                          f"{sat['tolerance']:.0%} of the reading"
                          + ("; at the ceiling: the chunks come back nearly whole" if sat["ceiling"]["reached"]
                             else "") + ")")
    if code:
        b, c = code["bits_per_chunk"], code["compression"]
        lines.append(f"online code: {b['value']:.2f} bits per chunk saved [{b['low']:.2f}, {b['high']:.2f}], "
                     f"compression {c['value']:.3f} [{c['low']:.3f}, {c['high']:.3f}] over the control's code "
                     f"({code['probe_bits']:.0f} against {code['control_bits']:.0f} bits for {code['n_chunks']} "
                     "training chunks)")
    return lines
