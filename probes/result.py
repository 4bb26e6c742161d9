"""The probe's one typed report: what report.json holds, what the summary, the sweeps and the quickstart read."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

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
ever added within one version (``tests/test_probe_report_schema.py`` pins the layout)."""


@dataclass
class Fit:
    """One fit of a set of cached embeddings (:func:`memlab.probes.run.fit_one`): what a probe's report, every row
    of a sweep and every cell of a comparison are read from."""

    probe: dict | None = None
    """The kept sequence decoder's held-out metrics (None: no sequence decoder)."""
    control: dict | None = None
    """The control's held-out metrics (None: no control)."""
    information_gain: float | None = None
    control_shared_with: str | None = None
    """The probe that trained the control this fit reuses (None: trained here, or none)."""
    limited_by: str | None = None
    readouts: dict = field(default_factory=dict)
    """Each read-out's result by name."""
    readings: dict = field(default_factory=dict)
    """Each reading with its interval: {name: {value, low, high}}."""
    retention: str = ""
    calibration: dict = field(default_factory=dict)
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

    ``report["key"]`` reads a field as report.json would hold it (``report["_fitted"]``: the fitted probe).
    """

    model: str
    encoder: dict
    options: dict
    vocab_size: int
    seq_len: int
    n_train: int
    n_eval: int
    text: dict
    """How the text was cut and rendered: chunk_by, words or tokens per chunk, characters, tokens, rendering."""
    probe: dict | None
    control: dict | None
    information_gain: float | None
    readings: dict
    """Each reading with its interval: {name: {value, low, high}} (memlab.probes.intervals)."""
    retention: str
    """One line: the bits the embedding adds with their interval, or 'no evidence of retention'."""
    readouts: dict
    """Each read-out's result by name."""
    calibration: dict
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
    run_dir: str | None = None
    schema_version: int = SCHEMA_VERSION
    """The layout of this report (:data:`SCHEMA_VERSION`)."""
    fitted: Any = field(default=None, repr=False, compare=False)
    bow: dict | None = None
    """report.json's ``bow``: ``readouts["bow"]`` again, kept for the scripts that read it (schema version 1)."""

    def __post_init__(self):
        if self.bow is None:
            self.bow = (self.readouts or {}).get(LEGACY_READOUT)

    def to_dict(self) -> dict:
        """report.json's content (JSON types only; without the fitted probe)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "fitted"}

    def __getitem__(self, key: str):
        if key == "_fitted":
            return self.fitted
        if key not in {f.name for f in fields(self)} or key == "fitted":
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        try:
            return self[key]
        except KeyError:
            return default
