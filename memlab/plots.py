"""Plots of run metrics (matplotlib, headless)."""

from __future__ import annotations

import os
from pathlib import Path

from memlab.rundir import fsync_path, guarded, read_metrics, replace_synced


def pyplot():
    """matplotlib's pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish_axes(ax, xlabel: str | None = None, ylabel: str | None = None, log: bool = False,
                legend_fontsize: int | None = None) -> None:
    """Labels, a light grid (on minor log ticks too when ``log``) and a legend (when something is labelled)."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3) if log else ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:  # a panel with nothing labelled (e.g. a read-out-only row) has no legend
        ax.legend(fontsize=legend_fontsize)


def save_figure(fig, path: str | Path, dpi: int = 100) -> Path:
    """Tight layout, write the PNG, free the figure."""
    import matplotlib.pyplot as plt

    path = Path(path)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}{path.suffix}")
    fig.tight_layout()
    try:
        with guarded(str(path), tmp):  # a full disk is one line, and leaves no half-written PNG
            fig.savefig(tmp, dpi=dpi)
            fsync_path(tmp)
            replace_synced(tmp, path)
    finally:
        plt.close(fig)
    return path


def plot_metrics(metrics_path: str | Path, out_dir: str | Path, keys: tuple[str, ...] = ("loss", "token_accuracy"),
                 records: list[dict] | None = None) -> list[Path]:
    """One PNG per metric, train and eval curves against step (``records``: already read from ``metrics_path``).
    Returns the files written."""
    plt = pyplot()
    records = read_metrics(metrics_path) if records is None else records
    out = Path(out_dir)
    written: list[Path] = []
    for key in keys:
        series = {}
        for r in records:
            if key in r:
                series.setdefault(r.get("split", "train"), []).append((r["step"], r[key]))
        if not series:
            continue
        out.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 4))
        for split, pts in sorted(series.items()):
            xs, ys = zip(*pts)
            ax.plot(xs, ys, label=split, marker="o" if split != "train" else None, ms=3)
        finish_axes(ax, "step", key)
        written.append(save_figure(fig, out / f"{key}.png"))
    return written
