"""The probe report: report.json and PNGs in the run directory, and a printed summary.

The typed report (:class:`ProbeReport` and its records) and its files. report.json (its ``to_dict``) holds the bits
per chunk the embedding adds with their paired bootstrap interval (:mod:`memlab.probes.readings`), the probed model and layer, the data, the probe's and the
control's metrics (see :mod:`memlab.probes.decoder.fit` for their definitions), the
information gain ``(CE_control - CE_probe) / CE_control``, a few
reconstructions beside their inputs, timings (encoder pass, decoder training)
and the peak memory.

Its calibration section comes from :func:`memlab.probes.encoders.synthetic.calibration` (positive controls).
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from memlab.probes.chunks.cut import ProbeText, TextAccounting
from memlab.probes.readouts import pointwise, saturation
from memlab.probes.parts import readout_lines, readout_summary
from memlab.probes.readings import NO_EVIDENCE, ChunkScores, DecoderScores, Reading, cell, shows_retention
from memlab.rundir import write_atomic

DEFINITIONS = {
    "seen_in_training": "text.targets.seen_in_training[k]: share of the held-out target tokens whose id occurs at "
                        "least k times among the training chunks' targets (a decoder learns a token from its "
                        "occurrences: a rarely seen token caps token accuracy whatever the embedding holds)",
    "bits_per_chunk": "what the embedding adds: (NLL_control - NLL_probe) summed over a chunk's target tokens, in "
                      "bits, mean over held-out chunks (the text rendered as report.text.rendering says)",
    "bits_per_char": "the same bits summed over all held-out chunks, divided by their characters",
    "bits_per_token": "the same bits summed over all held-out chunks, divided by their target tokens (bits per "
                      "chunk over the mean target tokens per chunk)",
    "token_accuracy": "share of held-out target tokens where the decoder's argmax equals the true token",
    "free_running_accuracy": "share of held-out target tokens where the greedy reconstruction (the decoder reading "
                             "its own previous outputs, never the true tokens) holds the true token at the same "
                             "position; beside the teacher-forced token_accuracy",
    "ce": "mean cross-entropy per target token, nats, over the full vocabulary",
    "entropy_ratio": "H_r = 1 - CE / ln V",
    "information_gain": "(CE_control - CE_probe) / CE_control; control = same decoder on a constant embedding",
    "token_set_f1": "F1 between the sets of token ids of the greedy reconstruction and of the chunk, mean over chunks",
    "sentence_bleu": "NLTK sentence BLEU (whitespace tokens, smoothing 4, 0-1) of the decoded greedy reconstruction",
    "exact_match": "share of chunks rebuilt token for token",
    "intervals": "readings.*: value with the percentile interval of a paired bootstrap over held-out chunks (probe "
                 "and control resampled together); a gain whose interval holds 0 is 'no evidence of retention'",
}

LEGACY_READOUT = "bow"
"""The read-out that report.json also holds at its top level (``bow``), as schema version 1 did."""
SCHEMA_VERSION = 1
"""The layout of report.json (``schema_version``): raised when a key is renamed, moved or removed; keys are only
ever added within one version (``tests/probes/test_probe_report_schema.py`` pins the layout)."""



def jsonable(x):
    """``x`` as report.json holds it: each typed part by its ``to_dict()``, containers element by element."""
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


@dataclass
class ReadoutResult:
    """One fitted read-out: ``values`` (report.json's ``readouts[name]``: ``recovered``, ``prior``, ``gain``,
    ``seconds`` and the read-out's own) and its numbers per held-out chunk (``chunks``, for its intervals)."""

    name: str
    values: dict
    chunks: dict | None = None

    @classmethod
    def split(cls, name: str, result: dict) -> ReadoutResult:
        """A read-out's result dict (:func:`memlab.probes.parts.fit_readout`), its ``_per_chunk`` moved into
        ``chunks``."""
        return cls(name, {k: v for k, v in result.items() if not k.startswith("_")}, result.get("_per_chunk") or None)

    @property
    def recovered(self) -> float:
        return self.values["recovered"]

    @property
    def prior(self) -> float:
        return self.values["prior"]

    @property
    def gain(self) -> float:
        return self.values["gain"]

    @property
    def seconds(self) -> float:
        return self.values.get("seconds", 0.0)

    def to_dict(self) -> dict:
        return jsonable(self.values)


@dataclass
class CalibrationCheck:
    """One positive control: what it read (``metric``, ``value``), what it needs and whether it passed; ``extra``:
    what the check adds (``interval``, ``own``, ``r2``, ``seconds``)."""

    control: str
    metric: str
    value: Any
    needs: str
    passed: bool
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"control": self.control, "metric": self.metric, "value": self.value, "needs": self.needs,
                "passed": self.passed, **self.extra}


@dataclass
class Calibration:
    """The report's calibration: ``passed``, ``failed`` (a positive control failed) or ``unchecked`` (``note``
    says why), with its checks."""

    status: str
    checks: list = field(default_factory=list)
    """Each :class:`CalibrationCheck`."""
    note: str | None = None

    @classmethod
    def verdict(cls, checks: list[CalibrationCheck], note: str | None = None) -> Calibration:
        return cls("passed" if all(c.passed for c in checks) else "failed", list(checks), note)

    @classmethod
    def unchecked(cls, note: str) -> Calibration:
        return cls("unchecked", [], note)

    def to_dict(self) -> dict:
        out = {"status": self.status, "checks": [c.to_dict() for c in self.checks]}
        return out if self.note is None else {**out, "note": self.note}


@dataclass
class Fit:
    """One fit of a set of cached embeddings (:func:`memlab.probes.run.fit_one`): what a probe's report, every row
    of a sweep and every cell of a comparison are read from."""

    probe: dict | None = None
    """The kept sequence decoder's held-out metrics (None: no sequence decoder)."""
    control: dict | None = None
    """The control's held-out metrics (None: no control)."""
    probe_chunks: ChunkScores | None = None
    """The probe's numbers per held-out chunk (its intervals' input)."""
    control_chunks: ChunkScores | None = None
    """The control's numbers per held-out chunk."""
    information_gain: float | None = None
    control_shared_with: str | None = None
    """The probe that trained the control this fit reuses (None: trained here, or none)."""
    limited_by: str | None = None
    readouts: dict = field(default_factory=dict)
    """Each read-out's :class:`ReadoutResult` by name."""
    readings: dict = field(default_factory=dict)
    """Each :class:`Reading` by name."""
    retention: str = ""
    calibration: Calibration | None = None
    history: dict = field(default_factory=lambda: {"probe": [], "control": []})
    timing: dict = field(default_factory=lambda: {"train_s": 0.0, "control_s": 0.0, "bow_s": 0.0})
    """Seconds: the decoders' (``train_s``, ``control_s``) and the read-outs' (``bow_s``, report.json's name)."""
    decoder: Any = None
    """The fitted sequence decoder (None: none)."""
    reconstruction: list | None = None
    """The greedy reconstructions of the held-out chunks, decoded."""


@dataclass
class ProbeReport:
    """One probe run. ``to_dict()`` is report.json; ``fitted`` (the fitted probe, an EmbeddingSpace) is not saved.

    Its parts are typed (:class:`Reading`, :class:`ReadoutResult`, :class:`Calibration`, :class:`TextAccounting`)
    and read by attribute; ``report["key"]`` reads a field as report.json holds it (``report["_fitted"]``: the
    fitted probe).
    """

    model: str
    encoder: dict
    options: dict
    vocab_size: int
    seq_len: int
    n_train: int
    n_eval: int
    text: TextAccounting
    """How the text was cut and rendered: chunk_by, words or tokens per chunk, characters, tokens, rendering."""
    probe: dict | None
    control: dict | None
    information_gain: float | None
    readings: dict
    """Each :class:`Reading` by name (:mod:`memlab.probes.readings`); report.json: {name: {value, low, high}}."""
    retention: str
    """One line: the bits the embedding adds with their interval, or 'no evidence of retention'."""
    readouts: dict
    """Each read-out's :class:`ReadoutResult` by name."""
    calibration: Calibration
    limited_by: str | None = None
    control_shared_with: str | None = None
    decoder: dict | None = None
    history: dict = field(default_factory=dict)
    examples: list = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    definitions: dict = field(default_factory=lambda: dict(DEFINITIONS))
    data_split: str | None = None
    budget_note: str | None = None
    eval_note: str | None = None
    """Set when the held-out split holds fewer chunks than ``n_eval`` asked: all there are are scored."""
    saturation: dict | None = None
    """The learning curve inside the run and its verdict (:mod:`memlab.probes.readouts.saturation`)."""
    online_code: dict | None = None
    """The online code of the training chunks against the control's (:mod:`memlab.probes.readouts.online_code`)."""
    pointwise: dict | None = None
    """Bits per held-out chunk and the chunks the embedding helps most and least (:mod:`memlab.probes.readouts.pointwise`)."""
    run_dir: str | None = None
    schema_version: int = SCHEMA_VERSION
    """The layout of this report (:data:`SCHEMA_VERSION`)."""
    fitted: Any = field(default=None, repr=False, compare=False)
    bow: ReadoutResult | None = None
    """report.json's ``bow``: ``readouts["bow"]`` again, kept for the scripts that read it (schema version 1)."""

    def __post_init__(self):
        if self.bow is None:
            self.bow = (self.readouts or {}).get(LEGACY_READOUT)

    def to_dict(self) -> dict:
        """report.json's content (JSON types only; without the fitted probe)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self) if f.name != "fitted"}

    def __getitem__(self, key: str):
        """A field as report.json holds it (``report["readings"]["bits_per_chunk"]["value"]``)."""
        if key == "_fitted":
            return self.fitted
        if key not in {f.name for f in fields(self)} or key == "fitted":
            raise KeyError(key)
        return jsonable(getattr(self, key))

    def get(self, key: str, default=None):
        try:
            return self[key]
        except KeyError:
            return default


def peak_memory_mb() -> dict:
    """Peak resident memory of this process (MB) and, on CUDA, peak allocated GPU memory."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"peak_rss_mb": round(rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024, 1)}
    if torch.cuda.is_available():
        out["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def write_report(report, run_dir: str | Path) -> list[Path]:
    """Write report.json (``report.to_dict()``) and plots/*.png into ``run_dir``; returns the files written."""
    out = Path(run_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    files = [out / "report.json"]
    write_atomic(files[0], json.dumps(report.to_dict(), indent=2))
    from memlab.probes.report.plots import plot_accuracy_by_position, plot_training

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
                 ("online_bits_per_chunk", "online code saved, bits per chunk", True, 2),
                 ("online_compression", "online code compression over the control", False, 3),
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
    lines += saturation.summary_lines(report.saturation, report.online_code)
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
    lines += pointwise.summary_lines(report.pointwise)
    if report.budget_note:
        lines.append(f"note: {report.budget_note}")
    t = report.timing
    lines.append(f"time: encode {t.get('encode_s', 0):.1f}s, probe decoder {t['train_s']:.1f}s"
                 + (f", control {t['control_s']:.1f}s" if c else "") + f", read-outs {t.get('bow_s', 0):.1f}s; "
                 f"peak memory {report.memory}")
    for ex in report.examples[:3]:
        lines.append(f"  in:  {ex['input']!r}\n  out: {ex['reconstruction']!r}")
    return "\n".join(lines)
