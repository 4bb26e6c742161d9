"""The probe report: report.json and PNGs in the run directory, and a printed summary.

report.json (:class:`memlab.probes.result.ProbeReport`'s ``to_dict``) holds the bits per chunk the
embedding adds with their paired bootstrap interval (:mod:`memlab.probes.intervals`), the probed model and layer, the data, the probe's and the
control's metrics (see :mod:`memlab.probes.train` for their definitions), the
information gain ``(CE_control - CE_probe) / CE_control``, a few
reconstructions beside their inputs, timings (encoder pass, decoder training)
and the peak memory.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch

from memlab.plots import finish_axes, pyplot, save_figure
from memlab.probes.intervals import NO_EVIDENCE, cell, shows_retention
from memlab.probes.parts import readout_lines, readout_summary
from memlab.probes.result import Calibration, Reading


def peak_memory_mb() -> dict:
    """Peak resident memory of this process (MB) and, on CUDA, peak allocated GPU memory."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"peak_rss_mb": round(rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024, 1)}
    if torch.cuda.is_available():
        out["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


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


def write_report(report, run_dir: str | Path) -> list[Path]:
    """Write report.json (``report.to_dict()``) and plots/*.png into ``run_dir``; returns the files written."""
    out = Path(run_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    files = [out / "report.json"]
    files[0].write_text(json.dumps(report.to_dict(), indent=2))
    files.append(plot_accuracy_by_position(report, out / "plots" / "accuracy_by_position.png"))
    files.append(plot_training(report, out / "plots" / "training.png"))
    return files


def _metrics_line(name: str, m: dict) -> str:
    return (f"{name:<8} token_accuracy={m['token_accuracy']:.3f}  "
            f"free_running_accuracy={m.get('free_running_accuracy', float('nan')):.3f}  "
            f"TF1={m.get('token_set_f1', float('nan')):.3f}  "
            f"BLEU={m.get('sentence_bleu', float('nan')):.3f}  exact={m.get('exact_match', float('nan')):.3f}  "
            f"CE={m['ce']:.3f}  H_r={m['entropy_ratio']:.3f}")


def calibration_lines(cal: Calibration | None) -> list[str]:
    """The calibration status, with a warning when a positive control failed."""
    if not cal:
        return []
    if cal.status == "unchecked":
        return [f"calibration: unchecked ({cal.note or ''})"]
    parts = [f"{c.control} {c.metric}={c.value:.3f} ({'ok' if c.passed else 'FAILED'}, needs {c.needs})"
             for c in cal.checks]
    lines = [f"calibration: {cal.status}: " + "; ".join(parts)]
    if cal.status == "failed":
        lines.append("WARNING: the probe failed a positive control: at this budget it cannot read what is there, so a "
                     "low reading says the probe could not see, not that the model forgot")
    return lines


READING_LINES = (("bits_per_chunk", "bits per chunk", True, 2), ("bits_per_char", "bits per character", True, 4),
                 ("information_gain", "information gain", True, 3), ("token_accuracy", "token accuracy", False, 3),
                 ("token_accuracy_gain", "token accuracy over the control", True, 3),
                 ("free_running_accuracy", "free-running token accuracy", False, 3),
                 ("free_running_accuracy_gain", "free-running token accuracy over the control", True, 3),
                 ("token_set_f1", "TF1", False, 3), ("token_set_f1_gain", "TF1 over the control", True, 3))
"""The summary's interval lines of the sequence decoder: (reading, label, is a gain, digits); each read-out's
follow (:func:`memlab.probes.parts.readout_lines`)."""


def reading_lines(readings: dict[str, Reading], level: float, readouts=()) -> list[str]:
    """``label: value [low, high]`` per reading (the decoder's, then each of ``readouts``'); a gain without evidence
    says so (never a bare negative figure)."""
    out = []
    for key, label, gain, digits in READING_LINES + tuple(x for n in readouts for x in readout_lines(n)):
        r = readings.get(key)
        if r is None:
            continue
        text = cell(r, gain, digits)
        if gain and not shows_retention(r):
            text = text.replace("no evidence", NO_EVIDENCE + ",", 1)
        out.append(f"  {label}: {text}")
    return [f"readings ({level:.0%} paired bootstrap intervals over held-out chunks):"] + out if out else []


def seen_line(seen: dict[str, float]) -> str:
    """``text.targets.seen_in_training`` in words."""
    parts = [f"{100 * v:.1f} % at least {'once' if k == '1' else k + ' times'}" for k, v in seen.items()]
    return "held-out target tokens seen in training: " + ", ".join(parts)


def format_summary(report) -> str:
    """A few lines for the terminal: the bits the embedding adds first, with their interval."""
    p, c = report.probe, report.control
    enc, text = report.encoder, report.text
    lines = [f"model: {report.model}  layer: {enc.get('layer')}  pool: {enc.get('pool')}  dim: {enc.get('dim')}  "
             f"V: {report.vocab_size}  n_train: {report.n_train}  n_eval: {report.n_eval}",
             f"text: chunks of {text.per_chunk} ({text.mean_chars:.0f} characters, {text.mean_tokens:.1f} "
             f"tokens on average, at most {text.max_tokens}); bits counted over {text.rendering}",
             f"retention: {report.retention}"]
    tg = text.targets or {}
    if tg and tg.get("tokenizer") != "the encoder's":  # the bits are counted over the decoder's tokens
        lines[1] = lines[1].split("; bits counted over")[0].replace(" tokens on average", " encoder tokens on average")
        lines.insert(2, f"targets: the chunk texts in the tokens of {tg['tokenizer']} (V {tg['vocab_size']}, "
                        f"{tg['mean_tokens']:.1f} tokens on average, {tg['n_tokens']} held out); bits counted over "
                        f"{tg['rendering']}")
    if tg.get("seen_in_training") and p:
        lines.append(seen_line(tg["seen_in_training"]) + " (a decoder learns each token from its occurrences)")
    lines += reading_lines(report.readings, report.options.get("ci_level", 0.95), list(report.readouts or {}))
    if p:
        lines.append(_metrics_line("probe:", p))
    if c:
        lines.append(_metrics_line("control:", c))
    choice = (p or {}).get("decoder_choice")
    if choice:
        lines.append(f"decoder kept: {choice['kept']} (held-back CE {choice['bag_head']:.3f} with the bag head, "
                     f"{choice['plain']:.3f} plain)")
    start = (p or {}).get("start")
    if start:
        what = {"control": "the control itself (no start read the embedding better on held-back chunks)",
                "contained": "the probe started as the trained control", "scratch": "the probe from a random start"}
        lines.append(f"probe kept: {what[start['kept']]} (held-back CE {start['contained'] or float('nan'):.3f} "
                     f"started as the control, against {start['control']:.3f}; {start['scratch']:.3f} from a random "
                     f"start, against {start['control_first_run']:.3f})")
    if report.limited_by:
        lines.append(f"limited by: {report.limited_by}")
    for name, result in (report.readouts or {}).items():
        lines.append(readout_summary(name, result.values))
    lines += calibration_lines(report.calibration)
    if report.budget_note:
        lines.append(f"note: {report.budget_note}")
    t = report.timing
    lines.append(f"time: encode {t.get('encode_s', 0):.1f}s, probe decoder {t['train_s']:.1f}s"
                 + (f", control {t['control_s']:.1f}s" if c else "") + f", read-outs {t.get('bow_s', 0):.1f}s; "
                 f"peak memory {report.memory}")
    for ex in report.examples[:3]:
        lines.append(f"  in:  {ex['input']!r}\n  out: {ex['reconstruction']!r}")
    return "\n".join(lines)
