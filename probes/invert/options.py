"""``memlab invert``'s options: one dataclass per section, defaults written once (no torch here).

The command builds its grouped ``--help`` from these classes (each field one flag, its docstring the help), checks
every flag while the arguments are read, before torch is imported, and hands the typed :class:`InvertOptions` to
:func:`memlab.probes.invert.run.run_invert`. The searches take their own section (:class:`PositionsOptions`,
:class:`PooledOptions`); a flag of the search that was not chosen is refused in one line.

A field's ``metadata`` carries what its flag needs beyond its type: ``least``/``most`` (the range taken), ``inf``
(infinity taken), ``choices``, ``flag`` (another flag name), ``shown`` (the default as the docs show it).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields

from memlab.probes.catalog import POOLINGS
from memlab.probes.sections import FitSection, TextSection

POOLED = (*POOLINGS, "logits", "space")
"""The ``--states`` read by the pooled search: the probe's poolings (catalog.POOLINGS), next-token logits, a space."""

STATES = ("positions", *POOLED)
"""What the states are: one per position (a causal model's state at every position), or one per chunk (a pooling,
the next-token distribution, a space's vector)."""

SPACE = "space"  # the --states of a space's vector (--model space:NAME:ARG), and a space's default

STATES_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")  # --states-dtype (positions.precision)


def pooled_names() -> str:  # last, mean, first, second_last, logits or space
    return ", ".join(POOLED[:-1]) + " or " + POOLED[-1]


def is_space(model: str | None) -> bool:
    """Whether ``model`` names a memlab space (``space:NAME[:ARG]``, as ``memlab probe --model`` names one)."""
    return str(model or "").startswith("space:")


def check_space_states(model: "ModelOptions") -> None:
    """A space's vector is read by ``--states space`` alone, and ``--states space`` reads only a space: one
    ConfigError line otherwise."""
    from memlab.errors import ConfigError

    if not is_space(model.model) and model.states == SPACE:
        raise ConfigError(f"--states space reads a memlab space's vector (--model space:memory_ae:PATH, a memory "
                          f"model); for {model.model or 'a transformers model'} give --states positions, last, mean, "
                          "first or second_last")
    if is_space(model.model) and model.states != SPACE:
        raise ConfigError(f"--states {model.states} reads a transformers model's states at a layer; {model.model} is "
                          "a space, whose vector --states space reads (the default for a space)")


def settle_space(model: "ModelOptions", given: set[str]) -> None:
    """``--states`` and the settings that apply to a space's vector, in place: a space reads ``--states space`` (its
    default) at no layer, from its own weights, whole on ``--device``; ``--states space`` reads only a space. One
    ConfigError line for a setting that does not apply (``given``: the field names the user set)."""
    from memlab.errors import ConfigError

    if is_space(model.model) and "states" not in given:
        model.states = SPACE
    check_space_states(model)
    if not is_space(model.model):
        return
    for name, flag, why in (("layer", "--layer", "a space's vector is its encoder's output, at no layer"),
                            ("states_from", "--states-from", "the vector is the space's own"),
                            ("device_map", "--device-map", "a space is placed whole on --device")):
        if getattr(model, name) is not None:
            raise ConfigError(f"{flag} does not apply to {model.model}: {why} (leave {flag} out)")


def _opt(default, *, least=None, most=None, inf=False, choices=None, flag=None, shown=None):
    meta = {"least": least, "most": most, "inf": inf, "choices": choices, "flag": flag, "shown": shown}
    return field(default=default, metadata={k: v for k, v in meta.items() if v is not None and v is not False})


@dataclass
class ModelOptions:
    """What is inverted: the model, its layer, which states, and where they are computed."""

    model: str | None = _opt(None, shown="required; with --probe: the run's")
    """Causal model: shortcut (smollm2, memlab-lm), local folder or memlab run, FILE.gguf or hub name (offline: the
    HF cache); for a pooled --states (last, mean, first, second_last), any encoder memlab loads; space:memory_ae:PATH
    for a memory model's memory vector (--states space)."""
    layer: int | None = _opt(None, shown="required; with --probe: the run's; none for a space")
    """Hidden state: 0 = embeddings, k = output of block k-1, negative from the end (the probe's numbering)."""
    states: str = _opt("positions", choices=STATES,
                       shown="positions; with --probe: the probe's pooling; space for a space")
    """Which states are inverted: positions (every position's state at the layer, a causal model), or one pooled
    state per chunk as the probe pools it: last (the last position's state), mean (the mean over positions), first
    (the first position's state: a bidirectional encoder's [CLS]) or second_last (the state before the last
    position); for bidirectional encoders the pooled ones apply, for causal models last and mean (second_last
    only where a special token follows the chunk; first never: it reads only what precedes the chunk); logits:
    a causal model's next-token log-probabilities after the chunk, the whole vocabulary (read after the last
    block: no --layer, or -1); or space:
    the vector of --model space:NAME:PATH (a memory model's K memory vectors, flattened as the probe reads
    them)."""
    probe: str | None = None
    """A trained probe's run folder (memlab probe --out RUN): invert the first --n of its held-out chunks with its
    model, layer and pooling, read the same chunks with its saved decoder (and its control, when the run kept one
    in its --cache-dir), and report both instruments in one table; a flag that contradicts the run is refused."""
    states_from: str | None = _opt(None, shown="the model")
    """Take the states from this model instead (same tokenizer and width): other weights, e.g. a float copy of a
    quantised model; the certificate then shows the mismatch."""
    noise: float = _opt(0.0, least=0.0)
    """Gaussian noise added to each observed state, its expected norm this share of the state's norm."""
    device: str = "cpu"
    """cpu, cuda, cuda:N, mps or auto."""
    device_map: str | None = _opt(None, choices=("auto", "none"), shown="auto when the model does not fit --device")
    """Placement of the model: auto (accelerate: blocks over the GPUs, then host memory, then disk) or none (whole
    on --device)."""
    threads: int | None = _opt(None, least=1, shown="torch's")
    """Torch CPU threads."""


@dataclass
class TextOptions:
    """Which chunks: the probe's held-out chunks (the same settings give the same texts; its defaults but seq_len)."""

    seq_len: int = _opt(16, least=2)
    """Words per chunk (chunk_by=words, as memlab probe cuts them) or tokens (chunk_by=tokens). 16, half the probe's
    32, on purpose: a search costs more the longer the chunk, so a default inversion ends in minutes; --probe RUN
    reads the run's own."""
    chunk_by: str = _opt(TextSection.chunk_by, choices=("words", "tokens"))
    """Cut chunks by words (the probe's default) or by the model's tokens."""
    n: int = _opt(16, least=1)
    """Chunks inverted: the first N of the probe's held-out chunks."""
    n_eval: int = _opt(TextSection.n_eval, least=1)
    """Held-out chunks the probe draws (memlab probe's n_eval); the N inverted are the first of them, so both
    instruments read the same chunks."""
    corpus: str = TextSection.corpus
    """Corpus of the held-out text: austen (bundled), a local file or folder, or hf:NAME."""
    eval_split: str = _opt(TextSection.eval_split, choices=("test", "validation"))
    """The held-out split the chunks come from."""
    seed: int = _opt(FitSection.seed, least=0)
    """Seed of the chunk draw (memlab probe's seed)."""


@dataclass
class PositionsOptions:
    """The per-position search (--states positions): rank candidates, verify them through the blocks with the
    prefix's key-value cache, search the whole vocabulary when no ranked candidate matches."""

    batch_size: int = _opt(64, least=1)
    """Ranked candidates verified per batch (one batched pass through the first layer blocks)."""
    budget: int = _opt(2048, least=1)
    """Ranked candidates tried at a position before the exhaustive search."""
    exhaustive: bool = True
    """Search the whole vocabulary when no ranked candidate gives a match (off: keep the best ranked one,
    uncertified)."""
    exhaustive_batch: int = _opt(512, least=1)
    """Candidates per batch of the exhaustive search."""
    tol: float = _opt(1e-3, least=0.0)
    """Relative distance |h - h*| / |h*| within which a candidate matches."""
    min_gap: float = _opt(2.0, least=1.0)
    """Least ratio of the runner-up's distance to the best one's for a certificate."""
    accept_gap: float = _opt(10.0, least=1.0, inf=True)
    """Accept a best candidate outside --tol without the exhaustive search when every other verified candidate is
    this many times farther (certificate separated; inf: never)."""
    separation_min: int = _opt(32, least=1)
    """Candidates verified before a separated certificate is considered (a gap over a few is no evidence)."""
    relinearize: bool = True
    """Rank by the first-order score at the best verified token too, re-linearised as it changes (off: the mean
    embedding's ranking alone)."""
    first_batch: int = _opt(8, least=1)
    """Candidates verified per chunk in a position's first round; each later round twice as many, up to
    --batch-size."""
    prior: bool = True
    """Rank by the model's own next-token distribution from the recovered prefix too, in turn with the gradient
    (causal models whose head can be read: output embeddings tied to the input table)."""
    secant: bool = True
    """Rank by the secant order too once a position has verified --secant-after candidates: a linear map from
    embedding rows to states fitted to the verified candidates, refitted as they grow by half."""
    secant_after: int = _opt(120, least=2)
    """Candidates verified at a position before the secant order joins the rankings."""
    chunk_batch: int = _opt(16, least=1)
    """Chunks searched together, position by position (their candidates verified in one batched pass)."""
    pass_memory_mb: float = _opt(1024.0, least=1.0)
    """Most megabytes of copied key-value cache in one verification pass (long chunks: fewer candidates a pass)."""
    cache_dir: str | None = None
    """Keep the first-position states of every token here (keyed by the weights, layer and prefix; a model that
    reads no BOS) and reuse them, checked by sha256 when read; without it the first positions are searched in
    shared ranked rounds instead of one pass over the vocabulary."""
    states_dtype: str = _opt("float32", choices=STATES_DTYPES)
    """Read the observed states as a copy kept at this precision gives them back (bfloat16, float16: a cast; int8,
    int4: symmetric quantisation of each state vector), the candidates at the run's own; where the best two lie
    within the copy's noise floor the position is ambiguous, never match (float32: the states as they are)."""


METHODS = ("propose-correct", "relax-correct", "propose", "correct", "relax", "swap")
"""The pooled search's --method words."""
RELAX_METHODS = ("relax-correct", "relax")
"""The --method words that run the continuous relaxation (:mod:`memlab.probes.invert.pooled.relax`)."""


@dataclass
class PooledOptions:
    """The pooled search (--states last, mean, first, second_last, logits or space): text proposed by a language
    model and kept by the encoder's pooled distance, or a continuous relaxation of the input descended through the
    weights, then corrected by gradient-ranked edits each verified exactly, within a budget, beside a control
    search from another chunk's state."""

    method: str = _opt("propose-correct", choices=METHODS)
    """propose-correct: proposals, then corrections; relax-correct: the continuous relaxation of the input, then
    corrections from its nearest projection; propose, correct or relax: one stage alone; swap: the
    gradient-guided single-token swap search alone (restarts from the model's own text)."""
    gflops: float = _opt(20000.0, least=0.0, inf=True)
    """Budget per chunk in GFLOP-equivalents (seconds x the matmul rate measured in the run); inf: none."""
    forwards: int = _opt(200000, least=1)
    """At most this many candidate sequences evaluated per chunk (each one sequence through the layer's
    blocks)."""
    seconds: float = _opt(math.inf, least=0.0, inf=True, shown="none")
    """Wall-time budget per chunk in seconds (whichever budget runs out first stops the search)."""
    proposer: str = _opt("auto", shown="auto: the model itself if causal with a readable head, else smollm2")
    """Causal language model that proposes text (any model memlab loads; its tokenizer may differ), or none."""
    beams: int = _opt(8, least=1)
    """Proposal texts kept after each step (the nearest to the target)."""
    branch: int = _opt(16, least=1)
    """Next tokens the proposer offers per beam and step."""
    propose_share: float = _opt(0.25, least=0.0, most=1.0)
    """Most share of the budget's time the proposal may take (the rest goes to the correction)."""
    bow_weight: float = _opt(0.0, least=0.0)
    """Bias of the proposals toward the tokens the target's first-order scores favour (0: off)."""
    relax_share: float = _opt(0.75, least=0.0, most=1.0)
    """--method relax-correct: most share of the budget the relaxation takes (the rest, and what a certified
    relaxation leaves, goes to the correction)."""
    relax_steps: int = _opt(3000, least=1)
    """Most relaxation steps per chunk (each one forward and backward pass of its rows, and one forward pass of
    their projections)."""
    relax_rows: int = _opt(1, least=1)
    """Relaxed sequences per chunk, from different draws (one: the budget buys steps rather than rows)."""
    relax_group: int = _opt(16, least=1)
    """Chunks (and their controls) relaxed together in one batch (a larger batch fills the cores)."""
    relax_loss: str = _opt("auto", choices=("auto", "huber", "log"), shown="auto: huber for logits, log for a state")
    """huber: SODA's Huber loss between the centred next-token log-probabilities (--states logits only); log: the
    logarithm of the divergence (KL for --states logits, the relative squared distance for a state)."""
    relax_lr: float = _opt(0.065, least=0.0)
    """Learning rate of the relaxation (Adam without bias correction, on the logits over the vocabulary)."""
    relax_temp: float = _opt(0.05, least=1e-6)
    """Softmax temperature of each position's mixture of embedding rows."""
    relax_decay: float = _opt(0.9, least=0.0, most=1.0)
    """Every relaxation logit is multiplied by this after each step (1: no decay)."""
    relax_reset: int = _opt(50, least=0)
    """Steps between resets of the relaxation's Adam moments (0: never)."""
    relax_reinit: int = _opt(1500, least=0)
    """Steps between fresh draws of each relaxed sequence (0: never)."""
    batch_size: int = _opt(128, least=1)
    """Edits (swaps, moves, insert/deletes) verified per step (one batched forward pass)."""
    topk: int = _opt(32, least=1)
    """Tokens kept per position from the gradient ranking (for swaps and insertions)."""
    move_share: float = _opt(0.25, least=0.0)
    """Share of each batch of edits spent on word order: moves of a block of 1-3 tokens to another place, exchanges
    of two tokens, reversals of a short span."""
    insert_share: float = _opt(0.25, least=0.0)
    """Share of each batch of edits spent on an insertion at one position and a deletion at another."""
    merge: int = _opt(8, least=0)
    """After each step, its best 2, 3, ... up to this many improving swaps at different positions are verified
    together too, and kept when nearer than the best single edit (0: off)."""
    table_topk: int = _opt(16, least=0, shown="16; causal models: 0")
    """Tokens kept per position from a second ranking, by every token's pooled state alone (computed once per run):
    the change of the state a swap would make estimated from the two tokens' states; half the swaps come from it
    (0: off, the gradient's ranking alone)."""
    whiten: float = _opt(0.9, least=0.0, most=1.0)
    """The distance the correction descends, whitened: measured where the pooled states of --whiten-chunks chunks of
    the corpus's training split have unit variance, each eigenvalue l of their covariance taken as X l + (1 - X)
    mean(l) (1: fully whitened; 0: the plain distance). The reported distance and the certificate stay the plain
    one."""
    whiten_chunks: int = _opt(1000, least=2)
    """Chunks of the training split (cut as the held-out ones) whose pooled states give the whitening, once per
    run."""
    screen: int = _opt(16, least=0)
    """Rank each batch of edits through a bfloat16 copy of the model (about twice as fast on CPUs with native bf16)
    and verify only the nearest this many in float32 (0, or a device without native bf16: verify every edit)."""
    pair_top: int = _opt(12, least=0)
    """After a step in which no single edit lowers the distance, the best this many single edits are combined two
    at a time and each pair verified (0: off)."""
    patience: int = _opt(6, least=1)
    """Steps without a fall of the objective after which a correction round ends (the best is perturbed and
    corrected again while the budget lasts)."""
    perturb: int = _opt(3, least=0)
    """Random edits applied to the best sequence before each further correction round; doubled after each round
    that finds nothing nearer (up to 8 times, at most half the chunk)."""
    restarts: int = _opt(2, least=1)
    """--method swap: searches from different starts sharing the budget; the best is kept."""
    prior_weight: float = _opt(0.0, least=0.0)
    """Weight of the model's mean next-token negative log-probability (nats per token) in the objective (causal
    models with a readable head)."""
    init: str = _opt("greedy", choices=("greedy", "sample", "random"), shown="greedy; bidirectional models: random")
    """--method swap: first start: greedy text from the model, sampled text, or random tokens (later restarts:
    sampled/random)."""
    tol: float = _opt(1e-5, least=0.0)
    """Stop once the relative distance is within this: the recovered text's pooled state matches the target to
    float noise (the certificate)."""
    control: bool = True
    """Run the control search (from the next chunk's pooled state, scored against the true chunk)."""


@dataclass
class OutputOptions:
    """Where the run is written and how it shows progress."""

    out: str | None = _opt(None, shown="runs/invert-MODEL-TIME")
    """Run directory; must be new or empty."""
    progress: bool = _opt(False, shown="off a TTY: log lines")
    """Progress bars even when not on a TTY."""
    resume: str | None = None
    """Continue the stopped run in this folder with its own settings: its finished chunks are kept, the others
    searched; it ends with the report an uninterrupted run gives (only --threads, --device, --device-map and
    --progress may be given beside it)."""


SECTIONS: dict[str, type] = {"model": ModelOptions, "text": TextOptions, "positions": PositionsOptions,
                             "pooled": PooledOptions, "output": OutputOptions}
"""Section name -> its options class, in the order ``--help`` and the docs show them."""

SEARCH_SECTIONS = {"positions": ("positions",), "pooled": POOLED}
"""A search's section -> the ``--states`` it runs for (its flags are refused with any other)."""


@dataclass
class InvertOptions:
    """Every option of one ``memlab invert`` run, by section."""

    model: ModelOptions = field(default_factory=ModelOptions)
    text: TextOptions = field(default_factory=TextOptions)
    positions: PositionsOptions = field(default_factory=PositionsOptions)
    pooled: PooledOptions = field(default_factory=PooledOptions)
    output: OutputOptions = field(default_factory=OutputOptions)

    @property
    def pooled_search(self) -> bool:
        """Whether the pooled search runs (a pooled ``--states``: :data:`POOLED`), else the per-position one."""
        return self.model.states in POOLED

    def search(self):
        """The chosen search's options."""
        return self.pooled if self.pooled_search else self.positions


RESUME_MAY_CHANGE = {("model", "threads"), ("model", "device"), ("model", "device_map"), ("output", "progress"),
                     ("output", "resume")}
"""The options a resumed run may take anew (they change how fast it runs, not what it finds)."""


def from_dict(d: dict) -> "InvertOptions":
    """The options a run kept (``asdict``), typed again; an unknown section or field: KeyError or TypeError."""
    return InvertOptions(**{name: SECTIONS[name](**values) for name, values in d.items()})


def flag_name(section: str, name: str) -> str:
    """The flag of a field (``--no-X`` is the off switch of a boolean ``X`` whose default is on)."""
    f = next(f for f in fields(SECTIONS[section]) if f.name == name)
    return f.metadata.get("flag") or "--" + name.replace("_", "-")


def default_text(section: str, name: str) -> str:
    """A field's default as ``--help`` and the docs show it."""
    f = next(f for f in fields(SECTIONS[section]) if f.name == name)
    if "shown" in f.metadata:
        return f.metadata["shown"]
    d = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
    if d is None:
        return "none"
    if isinstance(d, bool):
        return "on" if d else "off"
    if isinstance(d, float):
        return f"{d:g}"
    return str(d)


def parse_value(section: str, name: str, text: str):
    """A flag's text as its field's type, range-checked; one ConfigError line for a bad one."""
    from memlab.errors import ConfigError

    f = next(f for f in fields(SECTIONS[section]) if f.name == name)
    flag, meta, kind = flag_name(section, name), f.metadata, str(f.type)
    if "choices" in meta:
        if text not in meta["choices"]:
            raise ConfigError(f"{flag} takes {', '.join(meta['choices'][:-1])} or {meta['choices'][-1]}, got {text!r}")
        return text
    if kind.startswith("int"):
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{flag} takes an integer, got {text!r}") from None
    elif kind.startswith("float"):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{flag} takes a number, got {text!r}") from None
        if math.isnan(value) or (math.isinf(value) and not meta.get("inf")):
            raise ConfigError(f"{flag} takes a finite number, got {text!r}")
    else:
        return text
    if meta.get("least") is not None and value < meta["least"]:
        raise ConfigError(f"{flag} must be >= {meta['least']:g}, got {text}")
    if meta.get("most") is not None and value > meta["most"]:
        raise ConfigError(f"{flag} must be <= {meta['most']:g}, got {text}")
    return value
