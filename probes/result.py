"""The probe's one typed report: what report.json holds, what the summary, the sweeps and the quickstart read."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
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



def jsonable(x):
    """``x`` as report.json holds it: each typed part by its ``to_dict()``, containers element by element."""
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


@dataclass(frozen=True)
class Reading:
    """One reading with the percentile interval of its paired bootstrap over held-out chunks
    (:mod:`memlab.probes.readings`)."""

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, r) -> Reading | None:
        """``r`` as a Reading: a Reading, report.json's ``{value, low, high}`` or None."""
        return r if r is None or isinstance(r, Reading) else cls(r["value"], r["low"], r["high"])

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}

    def __getitem__(self, key: str) -> float:
        """``reading["value"]``: report.json's form, for scripts written against it."""
        if key not in ("value", "low", "high"):
            raise KeyError(key)
        return getattr(self, key)


@dataclass
class ChunkScores:
    """One decoder's numbers per held-out chunk: what its paired intervals resample."""

    nll: Any
    """Summed NLL of each chunk's target tokens, nats."""
    hits: Any
    """Teacher-forced argmax hits per chunk."""
    tokens: Any
    """Real target tokens per chunk."""
    tf1: list | None = None
    """Token-set F1 of each chunk's greedy reconstruction (None: not scored)."""
    free_hits: list | None = None
    """Free-running hits per chunk: positions where the greedy reconstruction holds the true token."""


@dataclass
class Reconstructed:
    """The scorers' readings of a decoder's greedy reconstructions (:func:`memlab.probes.readings.reconstruction_scores`):
    ``metrics`` (each scorer's mean and ``free_running_accuracy``), the numbers per chunk its intervals resample and
    the decoded reconstructions."""

    metrics: dict
    tf1: list
    """Token-set F1 of each chunk's reconstruction."""
    free_hits: list
    """Positions per chunk where the reconstruction holds the true token."""
    texts: list
    """The reconstructions, decoded."""


@dataclass
class DecoderScores:
    """A fitted sequence decoder's held-out scores: ``metrics`` (report.json's ``probe`` or ``control``), its
    numbers per chunk and its decoded greedy reconstructions. ``scores["ce"]`` reads ``metrics``."""

    metrics: dict
    chunks: ChunkScores | None = None
    reconstruction: list | None = None

    def with_reconstruction(self, rec: Reconstructed) -> DecoderScores:
        """These teacher-forced scores (:func:`memlab.probes.train.evaluate`) and the scorers' ``rec``."""
        chunks = None if self.chunks is None else replace(self.chunks, tf1=rec.tf1, free_hits=rec.free_hits)
        return DecoderScores({**self.metrics, **rec.metrics}, chunks, rec.texts)

    def noted(self, **notes) -> DecoderScores:
        """The same scores, ``notes`` added to (a copy of) the metrics."""
        return replace(self, metrics={**self.metrics, **notes})

    def __getitem__(self, key: str):
        return self.metrics[key]


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


TEXT_FIELDS = ("chunk_by", "per_chunk", "mean_chars", "mean_tokens", "max_tokens", "truncated_chunks", "rendering")


@dataclass
class TextAccounting:
    """How the text was cut and rendered (report.json's ``text``): words or tokens per chunk, characters and tokens
    per held-out chunk, the rendering the bits are counted over and the decoder's targets."""

    chunk_by: str
    per_chunk: Any
    mean_chars: float
    mean_tokens: float
    max_tokens: int
    truncated_chunks: int
    rendering: str
    targets: dict | None = None
    """The decoder's targets (:meth:`memlab.probes.chunks.Targets.describe`)."""

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in TEXT_FIELDS}
        return {**out, **({"targets": self.targets} if self.targets is not None else {})}

    @property
    def target_rendering(self) -> str:
        """The rendering the bits are counted over: the targets' when they have one, else the text's."""
        return (self.targets or {}).get("rendering", self.rendering)


@dataclass
class ProbeText:
    """The probe's text as :func:`memlab.probes.chunks.probe_data` cut it: how (``accounting``, report.json's
    ``text``), the training and held-out chunk texts, the characters of each held-out chunk and the token cap the
    chunks were cut to."""

    accounting: TextAccounting
    train_texts: list
    eval_texts: list
    chars: list
    """Characters of each held-out chunk's text (bits per character divide by their sum)."""
    cap: int | None = None
    """The ``max_chunk_tokens`` the chunks were cut to: the option's, or the encoder's limit when chunks of the
    default length do not fit it whole (None: none)."""

    @property
    def texts(self) -> tuple[list, list]:
        """(training texts, held-out texts)."""
        return self.train_texts, self.eval_texts


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
