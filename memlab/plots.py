"""Plots of run metrics (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def plot_metrics(metrics_path: str | Path, out_dir: str | Path, keys: tuple[str, ...] = ("loss", "token_accuracy")) -> list[Path]:
    """One PNG per metric, train and eval curves against step. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
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
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        f = out / f"{key}.png"
        fig.savefig(f, dpi=100)
        plt.close(fig)
        written.append(f)
    return written
