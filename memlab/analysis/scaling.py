"""Scaling laws: sweep model sizes, fit ``L(N) = a * N^-alpha + b``, bootstrap an interval, plot.

``N`` is the count of non-embedding parameters (2-D weights other than input
embeddings and the output head, as Kaplan et al. count), ``L`` the final
evaluation loss of each run. The fit is least squares in ``L`` (scipy's
``curve_fit``, ``a`` fitted through ``log a`` so it stays positive, ``b`` held in
``[0, min L]``); the interval is a residual bootstrap: resample the fit's
residuals, refit, take percentiles. With four sizes the three parameters are
barely determined, so read the interval before the point estimate.

A sweep config (``configs/scaling/*.yaml``)::

    name: scaling-cpu
    bootstrap: 300
    families:
      - label: token_lm
        base: configs/token_lm/toy.yaml        # an experiment config
        overrides: [train.max_steps=100]       # dotted overrides for every size
        sizes:                                 # model.overrides, one entry per size
          - {hidden_size: 16, intermediate_size: 32}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memlab.errors import ConfigError, MemlabError
from memlab.rundir import write_atomic


@dataclass
class SweepFamily:
    """One family's line in a scaling sweep."""

    label: str
    """Name of the line in the table and plot."""
    base: str
    """Experiment config (YAML) every size starts from; relative paths are from the working directory."""
    sizes: list[dict] = field(default_factory=list)
    """``model.overrides`` for each size (at least four sizes)."""
    overrides: list[str] = field(default_factory=list)
    """Dotted overrides applied to every size, e.g. ``train.max_steps=100``."""
    metric: str = "loss"
    """Final eval metric fitted as L (``loss``, or e.g. ``next_token_loss`` to compare next-token CE across families)."""


@dataclass
class SweepConfig:
    """A scaling sweep over model sizes for one or more families."""

    name: str = "scaling"
    """Name of the sweep (used in run names)."""
    families: list[SweepFamily] = field(default_factory=list)
    """The families (lines) to sweep."""
    bootstrap: int = 300
    """Bootstrap resamples for the parameter intervals."""
    seed: int = 0
    """Seed of the bootstrap."""
    min_sizes: int = 4
    """Fewest sizes a family may have (the fit has three parameters)."""


def fit_power_law(N, L, start: dict[str, float] | None = None, maxfev: int = 2000) -> dict[str, float]:
    """Least-squares fit of ``L = a * N^-alpha + b``; returns a, alpha, b and R^2.

    Without ``start`` several starting points are tried (b at 0, 50, 80 and 95% of min L) and
    the best fit is kept; with ``start`` (a previous fit) only that one (bootstrap refits).
    """
    from scipy.optimize import curve_fit

    N = np.asarray(N, dtype=float)
    L = np.asarray(L, dtype=float)
    if N.shape != L.shape or N.ndim != 1:
        raise MemlabError("fit_power_law needs two 1-D sequences of equal length")
    if len(N) < 3:
        raise MemlabError(f"a 3-parameter power law needs at least 3 points, got {len(N)}")
    if np.any(N <= 0) or not np.all(np.isfinite(L)):
        raise MemlabError("sizes must be positive and losses finite")
    x = np.log(N)

    def f(x, log_a, alpha, b):
        return np.exp(log_a - alpha * x) + b

    lmin = float(L.min())
    starts = []
    if start is not None:
        starts.append([float(np.log(max(start["a"], 1e-30))), float(np.clip(start["alpha"], 0.0, 5.0)),
                       float(np.clip(start["b"], 0.0, lmin * (1 - 1e-9)))])
    else:
        for frac in (0.0, 0.5, 0.8, 0.95):  # a few starting points for b; keep the best fit
            b0 = frac * lmin
            slope, icpt = np.polyfit(x, np.log(np.clip(L - b0, 1e-12, None)), 1)
            starts.append([icpt, float(np.clip(-slope, 1e-3, 4.0)), b0])
    best = None
    for p0 in starts:
        try:
            p, _ = curve_fit(f, x, L, p0=p0, bounds=([-100.0, 0.0, 0.0], [100.0, 5.0, lmin]), maxfev=maxfev)
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((f(x, *p) - L) ** 2))
        if best is None or sse < best[1]:
            best = (p, sse)
    if best is None:
        raise MemlabError("the power-law fit did not converge")
    (log_a, alpha, b), sse = best
    sst = float(np.sum((L - L.mean()) ** 2))
    return {"a": float(np.exp(log_a)), "alpha": float(alpha), "b": float(b), "r2": 1.0 - sse / sst if sst > 0 else 1.0}


def predict(fit: dict[str, float], N) -> np.ndarray:
    return fit["a"] * np.asarray(N, dtype=float) ** -fit["alpha"] + fit["b"]


def bootstrap_fit(N, L, n_boot: int = 300, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """The fit plus residual-bootstrap percentile intervals ``{param: [lo, hi]}`` at ``level``."""
    N = np.asarray(N, dtype=float)
    L = np.asarray(L, dtype=float)
    fit = fit_power_law(N, L)
    resid = L - predict(fit, N)
    rng = np.random.default_rng(seed)
    samples = {k: [] for k in ("a", "alpha", "b")}
    for _ in range(n_boot):
        Lb = predict(fit, N) + rng.choice(resid, size=len(resid), replace=True)
        try:
            fb = fit_power_law(N, Lb, start=fit, maxfev=500)
        except MemlabError:
            continue
        for k in samples:
            samples[k].append(fb[k])
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    ci = {k: [float(v) for v in np.percentile(s, q)] if s else [float("nan")] * 2 for k, s in samples.items()}
    return {**fit, "ci": ci, "level": level, "n_boot": len(samples["a"])}


# ---------------------------------------------------------------------- the sweep
def non_embedding_params(model) -> int:
    """2-D weights other than input embeddings and the output head (Kaplan's N)."""
    import torch

    skip = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is not None:
        skip.add(id(head.weight))
    return sum(p.numel() for p in model.parameters() if p.ndim >= 2 and id(p) not in skip)


def load_sweep_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep: every size's experiment config is built and checked strictly."""
    from memlab.config import from_dict, read_yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep config not found: {p}")
    cfg = from_dict(SweepConfig, read_yaml(p) or {})
    if not cfg.families:
        raise ConfigError(f"{p}: a sweep needs at least one entry in 'families'")
    for fam in cfg.families:
        if len(fam.sizes) < cfg.min_sizes:
            raise ConfigError(f"{p}: family '{fam.label}' has {len(fam.sizes)} sizes; a sweep needs at least {cfg.min_sizes}")
        for i in range(len(fam.sizes)):
            experiment_for(cfg, fam, i)
    return cfg


def experiment_for(sweep: SweepConfig, fam: SweepFamily, i: int):
    """The validated ExperimentConfig of size ``i`` of ``fam``."""
    from memlab.config import apply_overrides, experiment_from_dict, read_yaml

    base = Path(fam.base)
    if not base.is_file():
        raise ConfigError(f"sweep family '{fam.label}': base config not found: {base}")
    data = read_yaml(base) or {}
    apply_overrides(data, list(fam.overrides))
    model = data.setdefault("model", {})
    model["overrides"] = {**(model.get("overrides") or {}), **fam.sizes[i]}
    data["name"] = f"{sweep.name}-{fam.label}-s{i}"
    return experiment_from_dict(data)


def run_sweep(sweep: SweepConfig, out_dir: str | Path, train: bool = True) -> dict[str, Any]:
    """Train every size of every family into ``out_dir/<label>/s<i>``, fit, plot; writes ``scaling.json``."""
    from memlab.registry import FAMILIES
    from memlab.train.experiment import run_experiment

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"name": sweep.name, "families": {}}
    for fam in sweep.families:
        points = []
        for i in range(len(fam.sizes)):
            cfg = experiment_for(sweep, fam, i)
            model = FAMILIES.get(cfg.model.family).make_model(cfg.model.preset, **cfg.model.overrides)
            n = non_embedding_params(model)
            del model
            summary = run_experiment(cfg, out / fam.label / f"s{i}") if train else {}
            loss = (summary.get("eval") or {}).get(fam.metric)
            points.append({"size": i, "overrides": fam.sizes[i], "params": n, "eval_loss": loss, "metric": fam.metric,
                           "run_dir": str(out / fam.label / f"s{i}")})
        entry: dict[str, Any] = {"points": points}
        ok = [(p["params"], p["eval_loss"]) for p in points if p["eval_loss"] is not None]
        if len(ok) >= 3:
            try:
                entry["fit"] = bootstrap_fit([a for a, _ in ok], [b for _, b in ok], sweep.bootstrap, sweep.seed)
            except MemlabError as e:
                entry["fit_error"] = str(e)
        results["families"][fam.label] = entry
    write_atomic(out / "scaling.json", json.dumps(results, indent=2))
    if any("fit" in e or e["points"] for e in results["families"].values()):
        plot_scaling(results, out / "scaling.png")
    return results


def plot_scaling(results: dict[str, Any], path: str | Path) -> None:
    """Eval loss against N (log x) per family, with the fitted curve."""
    from memlab.plots import finish_axes, pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, entry in results["families"].items():
        pts = [(p["params"], p["eval_loss"]) for p in entry["points"] if p["eval_loss"] is not None]
        if not pts:
            continue
        n, l = np.array(pts).T
        line = ax.plot(n, l, "o", label=label)[0]
        if "fit" in entry:
            f = entry["fit"]
            xs = np.geomspace(n.min() / 1.5, n.max() * 1.5, 100)
            ax.plot(xs, predict(f, xs), "-", color=line.get_color(),
                    label=f"{label}: {f['a']:.3g} N^-{f['alpha']:.3f} + {f['b']:.3f}")
    ax.set_xscale("log")
    finish_axes(ax, "non-embedding parameters N", "eval loss", log=True, legend_fontsize=7)
    save_figure(fig, path, dpi=120)


def format_table(results: dict[str, Any]) -> str:
    """A markdown table of the fits."""
    rows = ["| family | sizes | a | alpha (95% CI) | b (95% CI) | R^2 |", "|---|---|---|---|---|---|"]
    for label, e in results["families"].items():
        f = e.get("fit")
        if not f:
            rows.append(f"| {label} | {len(e['points'])} | - | - | - | - |")
            continue
        ca, cb = f["ci"]["alpha"], f["ci"]["b"]
        rows.append(f"| {label} | {len(e['points'])} | {f['a']:.3g} | {f['alpha']:.3f} [{ca[0]:.3f}, {ca[1]:.3f}] "
                    f"| {f['b']:.3f} [{cb[0]:.3f}, {cb[1]:.3f}] | {f['r2']:.4f} |")
    return "\n".join(rows)
