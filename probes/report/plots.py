"""The probe report's figures: token accuracy by position, probe against control, and the training curves."""

from __future__ import annotations

from pathlib import Path

from memlab.plots import finish_axes, pyplot, save_figure


def plot_accuracy_by_position(report, path: Path) -> Path:
    """Token accuracy at each chunk position, probe against control."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, style in (("probe", "-o"), ("control", "--")):
        if getattr(report, key):
            acc = getattr(report, key)["accuracy_by_position"]
            ax.plot(range(len(acc)), acc, style, ms=3, label=key)
    ax.set_ylim(0, 1)
    ax.set_title(f"{report.model} (layer {report.encoder.get('layer')}, {report.encoder.get('pool')})")
    finish_axes(ax, "position in chunk", "token accuracy")
    return save_figure(fig, path)


def plot_training(report, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in ("probe", "control"):
        hist = report.history.get(key) or []
        train = [h for h in hist if "loss" in h]
        val = [h for h in hist if "val_ce" in h]
        if train:
            line, = ax.plot([h["step"] for h in train], [h["loss"] for h in train], label=f"{key} train")
            if val:
                ax.plot([h["step"] for h in val], [h["val_ce"] for h in val], "o--", color=line.get_color(),
                        label=f"{key} held-back (early stopping)")
    finish_axes(ax, "step", "CE (nats per token, full vocabulary)")
    return save_figure(fig, path)
