"""The probe report: report.json and PNGs in the run directory, and a printed summary.

report.json (:class:`memlab.probes.result.ProbeReport`'s ``to_dict``) holds the bits per chunk the
embedding adds with their paired bootstrap interval (:mod:`memlab.probes.readings`), the probed model and layer, the data, the probe's and the
control's metrics (see :mod:`memlab.probes.train` for their definitions), the
information gain ``(CE_control - CE_probe) / CE_control``, a few
reconstructions beside their inputs, timings (encoder pass, decoder training)
and the peak memory.

Its calibration section (:func:`calibration`): does the probe read what is there? A probe of a synthetic encoder
(:mod:`memlab.probes.synthetic`) is checked against what it must read (``concat``: token accuracy >= 0.99; ``bag``:
token-set F1 of the bag-of-words read-out >= 0.9; ``constant``: the interval of its information gain holds 0; with
the alignment read-out also :func:`check_align`). With ``calibrate=True`` a probe of any model also fits the same
decoder on ``synthetic:concat`` codes and the bag-of-words read-out on ``synthetic:bag`` codes of the same chunks in
the model's own tokenizer: when these positive controls fail, the report says that the probe could not see, not that
the model forgot (``report["calibration"]``).
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch

from memlab.plots import finish_axes, pyplot, save_figure
from memlab.probes.chunks import fill_pad, mask_of
from memlab.probes.parts import encoder_kind, fit_readout, readout_lines, readout_summary, resolve
from memlab.probes.readings import NO_EVIDENCE, cell, shows_retention
from memlab.probes.result import Calibration, CalibrationCheck, Fit, Reading, ReadoutResult
from memlab.probes.synthetic import SyntheticEncoder
from memlab.probes.train import FitData, fit_selected
from memlab.rundir import write_atomic


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
    write_atomic(files[0], json.dumps(report.to_dict(), indent=2))
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


EXPECT = {"concat": ("token_accuracy", 0.99), "bag": ("bow_token_set_f1", 0.9), "constant": ("information_gain", 0.01)}
"""What a working probe reads from each synthetic encoder: (metric, threshold). For ``bag`` the set is read by the
bag-of-words read-out: its top-k at the chunk's own k is a token-set F1 (precision = recall there); a decoder
that emits every position at once cannot spread an order-free set over positions (it repeats the likeliest
token), so its TF1 is reported but not the test."""


def _check(control: str, metric: str, value, passed: bool, needs: str, **extra) -> CalibrationCheck:
    return CalibrationCheck(control, metric, value, needs, passed, extra)


_verdict = Calibration.verdict


ALIGN_SLACK = 0.05
"""The alignment read-out's positive control: of a synthetic encoder that keeps every token (``concat``) it reads at
least its target's own reading of the same chunks less this much (the map loses no more); of ``constant`` its gain's
interval holds 0."""


def check_align(kind: str, fit: Fit) -> list[CalibrationCheck]:
    """The alignment read-out's checks on a synthetic encoder (:data:`ALIGN_SLACK`); none when it was not fitted."""
    a = fit.readouts.get("align")
    if not a or kind == "bag":  # a bag keeps no order: what a target that reads sequences makes of it is not known
        return []
    name = f"synthetic:{kind} (align read-out into {a.values.get('target', 'its target')})"
    if kind == "constant":
        r = fit.readings.get("align_gain")
        if r is None:
            return []
        return [_check(name, "align gain", r.value, r.low <= 0.0 <= r.high, "its interval holds 0",
                       interval=[r.low, r.high])]
    own = (a.values.get("own") or {}).get("recovered")
    if own is None:
        return []
    return [_check(name, "recovered", a.recovered, a.recovered >= own - ALIGN_SLACK,
                   f"recovered >= its target's own {own:.3f} - {ALIGN_SLACK}", own=own,
                   r2=a.values["own"].get("r2"))]


def check_synthetic_spec(spec: str, fit: Fit) -> Calibration:
    """:func:`check_synthetic` of the encoder ``synthetic:KIND[:TOKENIZER_DIR]`` (the synthetic kind's
    ``known_content``)."""
    return check_synthetic(spec.split(":")[1], fit)


def check_synthetic(kind: str, fit: Fit) -> Calibration:
    """Calibration of a synthetic encoder's own probe: its metric against its threshold (:data:`EXPECT`), and the
    alignment read-out's checks when it was fitted (:func:`check_align`)."""
    got = _check_synthetic(kind, fit)
    extra = check_align(kind, fit)
    if not extra:
        return got
    if got.status == "unchecked":
        return _verdict(extra, note=got.note)
    return _verdict(got.checks + extra)


def _check_synthetic(kind: str, fit: Fit) -> Calibration:
    metric, thr = EXPECT[kind]
    name, bow = f"synthetic:{kind}", fit.readouts.get("bow")
    if metric == "bow_token_set_f1" and bow:
        value = bow.recovered
        return _verdict([_check(name, metric, value, value >= thr, f"{metric} >= {thr}")])
    missing = ("the bag-of-words read-out (readouts=[bow, ...])" if metric == "bow_token_set_f1" and not bow else
               "the control (control=true)" if metric == "information_gain" and fit.probe is not None
               and fit.information_gain is None else None)
    if missing or (fit.probe is None and not bow):
        fits = missing or ("the sequence probe (sequence=true) or the bag-of-words read-out" if kind == "concat"
                           else "the bag-of-words read-out")
        return Calibration.unchecked(f"{name} is checked by {fits}, which this probe did not fit")
    if fit.probe is None:  # no sequence probe (a BoW-only sweep): the read-out's share or gain
        if kind == "constant":
            value = bow.gain
            return _verdict([_check(name, "bow gain", value, abs(value) <= thr, f"bow gain |x| <= {thr}")])
        value, thr = bow.recovered, EXPECT["bag"][1]
        return _verdict([_check(name, "bow recovered", value, value >= thr, f"bow recovered >= {thr}")])
    if metric == "information_gain":
        value, r = fit.information_gain, fit.readings.get("information_gain")
        if r is not None:  # nothing is there to read: the interval must hold 0
            return _verdict([_check(name, metric, value, r.low <= 0.0 <= r.high,
                                    "its interval holds 0", interval=[r.low, r.high])])
        return _verdict([_check(name, metric, value, value is not None and abs(value) <= thr,
                                f"|information gain| <= {thr}")])
    value = fit.probe[metric]
    return _verdict([_check(name, metric, value, value >= thr, f"{metric} >= {thr}")])


def _codes(kind: str, tok, ids: torch.Tensor) -> torch.Tensor:
    """Synthetic ``kind`` embeddings (N, D) of chunks ``ids`` (N, T) in their own tokenizer."""
    return SyntheticEncoder(kind, tok, max_len=ids.shape[1]).encode(fill_pad(ids), mask_of(ids).long())


def calibrate_on(opts, tok, train_ids, eval_ids) -> Calibration:
    """Positive controls in the model's tokenizer on the same chunks: concat (sequence decoder), bag (BoW)."""
    got = fit_selected(opts, FitData(tok, train_ids, eval_ids, _codes("concat", tok, train_ids),
                                     _codes("concat", tok, eval_ids)), desc="calibration decoder")
    m, secs = got.scores, got.seconds
    b = ReadoutResult.split("bow", fit_readout(train_ids, eval_ids, _codes("bag", tok, train_ids),
                                               _codes("bag", tok, eval_ids), "bow", seed=opts.seed, device=opts.device))
    (m_concat, t_concat), t_bag = EXPECT["concat"], EXPECT["bag"][1]
    return _verdict([
        _check("synthetic:concat", m_concat, m[m_concat], m[m_concat] >= t_concat, f"{m_concat} >= {t_concat}",
               seconds=secs),
        _check("synthetic:bag (bag-of-words read-out)", "recovered", b.recovered, b.recovered >= t_bag,
               f"recovered >= {t_bag}", seconds=b.seconds),
    ])


def calibration(opts, tok, train_ids, eval_ids, fit: Fit) -> Calibration:
    """The report's calibration section (see the module doc)."""
    kind = encoder_kind(opts.model)
    if kind is not None and kind.impl.known_content is not None:  # an encoder of known content checks itself
        return resolve(kind.impl.known_content)(opts.model, fit)
    if opts.calibrate and fit.probe:
        return calibrate_on(opts, tok, train_ids, eval_ids)
    return Calibration.unchecked("positive controls not run on these chunks (calibrate=true, or the quickstart's "
                                 "calibration rows)")
