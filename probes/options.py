"""The probe's options: every default in one place (ProbeOptions), their checks, and how configs are read.

Options that belong to one part (``prefix_len`` to ``conditioning=prefix``, ``input_dropout`` and
``repeat_penalty`` to ``inputs=teacher``, ``lora_r`` and ``lora_alpha`` to ``decoder=pretrained:NAME``) are refused
by name when given with another part
(:func:`memlab.probes.parts.check_parts`). A ``recipe: probe`` experiment file holds its probe in ``options:``;
any other section is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from memlab.errors import ConfigError
from memlab.probes import placement
from memlab.probes.chunks import train_sizes

CHUNK_BY = ("words", "tokens")
EXPERIMENT_KEYS = ("name", "recipe", "options")
"""The sections a ``recipe: probe`` experiment file may hold."""


@dataclass
class ProbeOptions:
    """One probe run (YAML: configs/probes/*.yaml; CLI flags of ``memlab probe``)."""

    model: str = "minilm"
    """Model to probe: a shortcut (minilm, smollm2, memlab-lm), ``space:NAME[:PATH]``, a local folder or run, a GGUF
    file, or a hub name."""
    layer: int = -1
    """Hidden state to read: 0 = embeddings, k = output of block k-1; negative counts from the end."""
    pool: str | None = None
    """last, second_last, mean or first; default: the shortcut's own (mean for MiniLM) or last."""
    final_norm: bool = False
    """Read the last layer after the model's final norm (HF's hidden_states[-1])."""
    random_init: bool = False
    """Probe the same architecture with random weights (the floor)."""
    special_tokens: bool = True
    """Wrap each chunk in the tokenizer's special tokens ([CLS] ... [SEP]) before encoding."""
    chunk_by: str = "words"
    """How the text is cut: words (chunks of seq_len words, the same text for every model; each model reads them in
    its own tokens, padded to its longest chunk) or tokens (seq_len tokens of the model's own tokenizer)."""
    seq_len: int = 32
    """Words per chunk (chunk_by=words) or tokens per chunk in the probed model's tokenizer (chunk_by=tokens)."""
    max_chunk_tokens: int | None = None
    """chunk_by=words: a chunk's trailing words are dropped until it holds at most this many tokens of
    ``chunk_tokenizer`` (every model still reads the same text; an encoder of fixed length reads it whole)."""
    chunk_tokenizer: str | None = None
    """The tokenizer that counts max_chunk_tokens: a shortcut, folder, run directory or GGUF file (default: the probed
    model's own, which makes the text differ between models)."""
    n_train: int | list[int] = 8000
    """Training chunks (from the corpus's train split); a list (e.g. [1000, 4000, 16000]) fits each size on one
    encoder pass and writes the learning curve. 8,000 from the learning curve (docs/results/probes.md); fewer is marked
    in the report."""
    n_eval: int = 256
    """Held-out chunks (from ``eval_split``); a split that holds fewer is scored whole, with a warning and a note."""
    corpus: str = "austen"
    """Corpus (memlab data pipeline): bundled name or local path."""
    eval_split: str = "test"
    """Held-out split scored: test (default) or validation."""
    conditioning: str = "unrolled"
    """How the decoder reads the embedding: unrolled (projected and added per position) or prefix (memory prefix)."""
    prefix_len: int = 4
    """Memory prefix vectors (prefix conditioning)."""
    inputs: str = "teacher"
    """Decoder token inputs: teacher (true previous tokens, greedy generation is autoregressive: the decoder's
    language knowledge helps, as the control shows) or blank (start token everywhere: all it knows comes from the
    embedding; it cannot spread an order-free set over positions)."""
    input_dropout: float = 0.0
    """Teacher inputs only: share of the true previous tokens replaced by the start token while training (word
    dropout: the decoder must read the embedding rather than lean on its language model)."""
    repeat_penalty: float = 1.5
    """Teacher inputs only: nats taken off the log-probability of each token already in the greedy reconstruction
    (0: plain greedy). A weak decoder otherwise loops on one phrase, which hides the tokens it does read (TF1, BLEU
    and exact match score the reconstruction; token accuracy and CE are teacher forced and do not use it)."""
    decoder: str = "llama"
    """The decoder (a registered probe part: memlab.probes.parts): llama (a small Llama trained from scratch, in
    the encoder's tokenizer) or pretrained:NAME (a pretrained causal LM: shortcut, folder, run, GGUF file or hub
    name, reading the embedding through a trained map; targets in its own tokenizer; memlab.probes.pretrained)."""
    target_tokenizer: str | None = None
    """decoder=llama: rebuild the chunk texts in this tokenizer (a shortcut, folder, run directory or GGUF file)
    instead of the encoder's own (chunk_by=words): every model of a comparison is then scored over the same target
    tokens, and probes of the same chunks share one control."""
    lora_r: int = 0
    """decoder=pretrained: rank of the LoRA adapters trained in the LM (peft); 0 keeps the LM frozen."""
    lora_alpha: float = 16.0
    """decoder=pretrained with lora_r > 0: LoRA scale (the adapters' output is multiplied by lora_alpha / lora_r)."""
    finetune: bool = False
    """decoder=pretrained: train every weight of the LM with the map (saved whole with the probe); false: the LM
    frozen, or adapted by LoRA (lora_r)."""
    map_hidden: int = 0
    """decoder=pretrained: width of the hidden layer of the map from the embedding to the LM's input vectors
    (Linear -> GELU -> Linear, as vec2text's embedding transform); 0: one linear layer."""
    hidden_size: int = 128
    """Decoder width."""
    num_layers: int = 2
    """Decoder blocks."""
    num_heads: int = 4
    """Decoder attention heads."""
    bag_head: bool = True
    """Add a position-shared linear read-out of the embedding to every position's logits (see the decoder)."""
    select_decoder: bool = True
    """With bag_head: also fit the plain decoder (no bag head, input dropout 0.3) and keep the one with the lower
    held-back CE (needs val_fraction > 0). The bag head reads content a positional read-out cannot learn from few
    chunks; it slows the read-out of embeddings that keep every position (docs/results/probes.md). Costs one more decoder."""
    cond_dropout: float = 0.0
    """Dropout on the standardised embedding while the decoder trains (regularises the embedding-to-decoder map)."""
    epochs: float = 30.0
    """Most passes of the decoder over the cached training embeddings; early stopping usually ends sooner (real
    encoders over-fit within a few epochs), while a decoder that still improves keeps going (docs/results/probes.md)."""
    val_fraction: float = 0.1
    """Share of the training chunks held back for early stopping and decoder selection (0: train all epochs, keep
    the last weights, no selection)."""
    patience: int = 3
    """Early stopping: epochs without a better held-back CE before training stops (best weights are kept)."""
    batch_size: int = 32
    """Decoder batch size."""
    lr: float = 2e-3
    """Peak learning rate (memlab's AdamW, memlab.train.loop.make_optimizer; warmup then cosine to min_lr_ratio)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.98
    """AdamW beta2."""
    warmup_fraction: float = 0.05
    """Share of the decoder's steps spent warming the learning rate up."""
    min_lr_ratio: float = 0.1
    """The cosine schedule ends at lr * min_lr_ratio."""
    clip_grad: float = 1.0
    """Gradient norm clipping (0: none)."""
    plain_input_dropout: float = 0.3
    """Input dropout of the plain decoder fitted beside the bag-head one (select_decoder): with it, teacher inputs
    read synthetic concat whole instead of over-fitting their own language model (docs/results/probes.md)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    sequence: bool = True
    """Fit the sequence decoder (and its control); false: the read-outs alone, in seconds (needs readouts)."""
    control: bool = True
    """Also train the control decoder on a constant embedding."""
    readouts: list[str] = field(default_factory=lambda: ["bow"])
    """Read-outs fitted beside the decoder (registered parts; bow: the bag-of-words read-out, a linear multi-label
    head, and its frequency prior; align: a ridge map into the space of align_target, read by its decoder); [] for
    none."""
    align_target: str = "space:memory_ae"
    """readouts=[..., align]: the space the embedding is mapped into and read by its own decoder (space:NAME[:PATH];
    space:memory_ae alone is the shipped memory autoencoder). memlab.probes.align."""
    scorers: list[str] = field(default_factory=lambda: ["token_set_f1", "sentence_bleu", "exact_match"])
    """Scores of the greedy reconstruction (registered parts)."""
    ci_level: float = 0.95
    """Level of the paired bootstrap intervals over held-out chunks (memlab.probes.intervals)."""
    ci_resamples: int = 2000
    """Bootstrap resamples of the held-out chunks."""
    compare: str | list[str] | None = None
    """Methods read from one encoder pass, as a comparison (memlab.probes.compare): decoders (llama,
    pretrained:NAME) and read-outs (align, bow), each with options of its own in brackets (e.g. [llama,
    "pretrained:memlab-lm[conditioning=prefix]", align], or that comma string); every method at every n_train size,
    one table (curve.md/json) and one plot (plots/compare.png). Each row names the target tokens its bits are over."""
    layers: str | list[int] | None = None
    """'all' or a list of layers: capture them in one pass and fit the read-outs per layer (retention by depth)."""
    layers_sequence: bool = False
    """With layers: also fit the sequence probe (and its shared control) per layer."""
    calibrate: bool = False
    """Also fit the positive controls (synthetic concat and bag codes of the same chunks, same tokenizer) and
    report whether the probe reads them; a synthetic model is always checked against what it must give."""
    compact_vocab: bool = True
    """Output layer over tokens seen in training plus one 'other' class (exact over V; much faster for large V)."""
    encode_batch_size: int = 32
    """Chunks per encoder call."""
    cache_dir: str | None = None
    """Cache embeddings on disk (safetensors) here and reuse them; default: in memory only."""
    n_examples: int = 5
    """Reconstructions shown beside their inputs."""
    seed: int = 0
    """Seed of data sampling and decoder initialisation."""
    device: str = "auto"
    """Device of the encoder, the decoders and the read-outs: auto (the best one present: a CUDA GPU, else MPS,
    else the CPU), cpu, cuda, cuda:N or mps; a device this machine lacks is refused before anything loads."""
    encoder_dtype: str = "auto"
    """Weights of the frozen encoder: auto (bf16 where the device multiplies it natively, else float32), float32,
    bfloat16 or float16; embeddings are float32."""
    device_map: str | None = None
    """Placement of a transformers encoder: auto (accelerate's big-model inference: its blocks over the GPUs, then
    host memory, then disk in offload_dir), none (whole on the device); default: auto only when its weights do not
    fit the device's free memory (memlab.probes.placement)."""
    max_memory: str | dict | None = None
    """device_map=auto: the memory budget per device, e.g. cpu:200MB,0:20GiB (or a mapping); the disk takes the
    rest. Default: each device's free memory (the CPU alone when device=cpu)."""
    offload_dir: str | None = None
    """device_map=auto: the folder of the weights offloaded to disk (default: a temporary folder removed at exit)."""
    progress: bool | None = None
    """Progress bars (default: on a TTY)."""
    threads: int | None = None
    """torch CPU threads (default: torch's own); 1 is fastest for small decoders on a busy machine."""


def compared(opts: ProbeOptions, explicit: set[str] = frozenset()) -> list[tuple]:
    """(method, its options) of every method of ``opts.compare`` (:mod:`memlab.probes.compare`), each checked as a
    probe of that method alone would be (one ConfigError naming the method)."""
    from memlab.probes.compare import methods

    out = []
    for m, mine, given in methods(opts, explicit):
        try:
            out.append((m, validate(mine, given)))
        except ConfigError as e:
            raise ConfigError(f"'compare': method {m.spec!r}: {e}") from None
    return out


def validate(opts: ProbeOptions, explicit: set[str] = frozenset()) -> ProbeOptions:
    """Check every option (one ConfigError naming it); ``explicit``: the options the user set (their parts must
    be chosen)."""
    from memlab.devices import resolve_device
    from memlab.probes.parts import check_parts

    opts.device = str(resolve_device(opts.device))  # auto -> the best device present; a missing one is refused

    if opts.pool is not None:
        from memlab.probes.parts import get_part

        get_part("pool", opts.pool)
    if opts.compare is not None:  # each method checked as a probe of it alone; their part options are theirs
        from memlab.probes.compare import owners

        if opts.layers is not None:
            raise ConfigError("'compare' and 'layers' are separate sweeps; run them one at a time")
        compared(opts, explicit)
        explicit = {k for k in explicit if not owners(k)}
    check_parts(opts, explicit)
    placement.check(placement.Placement(opts.device_map, opts.max_memory, opts.offload_dir), opts.model)
    if opts.chunk_by not in CHUNK_BY:
        raise ConfigError(f"'chunk_by' must be one of {', '.join(CHUNK_BY)}, got {opts.chunk_by!r}")
    if opts.eval_split not in ("test", "validation"):
        raise ConfigError(f"'eval_split' must be test or validation, got {opts.eval_split!r}")
    for k in ("input_dropout", "cond_dropout", "plain_input_dropout"):
        if not 0.0 <= getattr(opts, k) < 1.0:
            raise ConfigError(f"'{k}' must be in [0, 1), got {getattr(opts, k)}")
    for k in ("epochs", "lr"):
        v = getattr(opts, k)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ConfigError(f"'{k}' must be a finite number > 0, got {v}")
    for k in ("beta1", "beta2", "warmup_fraction"):
        if not 0.0 <= getattr(opts, k) < 1.0:
            raise ConfigError(f"'{k}' must be in [0, 1), got {getattr(opts, k)}")
    if not 0.0 <= opts.min_lr_ratio <= 1.0:
        raise ConfigError(f"'min_lr_ratio' must be in [0, 1], got {opts.min_lr_ratio}")
    for k in ("weight_decay", "repeat_penalty", "clip_grad"):
        v = getattr(opts, k)
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"'{k}' must be a finite number >= 0, got {v}")
    if not 0.0 <= opts.val_fraction < 1.0:
        raise ConfigError(f"'val_fraction' must be in [0, 1), got {opts.val_fraction}")
    if not 0.5 <= opts.ci_level < 1.0:
        raise ConfigError(f"'ci_level' must be in [0.5, 1), got {opts.ci_level}")
    for k in ("seq_len", "n_eval", "hidden_size", "num_layers", "num_heads", "batch_size", "prefix_len",
              "patience", "ci_resamples", "encode_batch_size"):
        if getattr(opts, k) < 1:
            raise ConfigError(f"'{k}' must be >= 1, got {getattr(opts, k)}")
    if opts.threads is not None and opts.threads < 1:
        raise ConfigError(f"'threads' must be >= 1 (torch CPU threads; unset: torch's own), got {opts.threads}")
    if not train_sizes(opts) or min(train_sizes(opts)) < 1:
        raise ConfigError(f"'n_train' sizes must be >= 1, got {opts.n_train}")
    if opts.hidden_size % opts.num_heads:
        raise ConfigError("'hidden_size' must be a multiple of 'num_heads'")
    if opts.seq_len < 2:
        raise ConfigError("'seq_len' must be >= 2")
    if opts.max_chunk_tokens is not None and (opts.chunk_by != "words" or opts.max_chunk_tokens < 1):
        raise ConfigError("'max_chunk_tokens' must be >= 1 and applies to chunk_by=words")
    if opts.chunk_tokenizer is not None and opts.max_chunk_tokens is None:
        raise ConfigError("'chunk_tokenizer' counts max_chunk_tokens; set max_chunk_tokens too")
    if opts.target_tokenizer is not None and opts.chunk_by != "words":
        raise ConfigError("'target_tokenizer' rebuilds the chunk texts: it needs chunk_by=words")
    if not opts.sequence and not opts.readouts:
        raise ConfigError("'sequence=false' leaves only the read-outs, and 'readouts' is empty: nothing to fit")
    if opts.layers is not None and len(train_sizes(opts)) > 1:
        raise ConfigError("'layers' and a list of 'n_train' sizes are separate sweeps; run them one at a time")
    return opts


def _read_experiment(p: Path, data: dict, overrides: list[str]) -> tuple[dict, list[str]]:
    """An experiment file (recipe: probe): its options section, with overrides (``options.`` optional)."""
    extra = [k for k in data if k not in EXPERIMENT_KEYS]
    if extra:
        raise ConfigError(f"{p}: section{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} "
                          f"{'are' if len(extra) > 1 else 'is'} not used by recipe: probe (it reads "
                          f"{', '.join(EXPERIMENT_KEYS)}; data and training options go in options:)")
    if data.get("recipe") != "probe":
        raise ConfigError(f"{p}: recipe '{data.get('recipe')}' is not a probe (recipe: probe)")
    opts = data.get("options") or {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{p}: 'options' must be a mapping")
    over = [o.split("=", 1)[0].removeprefix("options.") + "=" + o.split("=", 1)[1] if "=" in o else o
            for o in overrides if not o.startswith("name=")]
    return dict(opts), over


def load_options(path: str | Path | None = None, overrides: list[str] | None = None, **kw) -> ProbeOptions:
    """ProbeOptions from a YAML file (strict keys), ``key=value`` overrides, then keyword values (None: unset)."""
    from memlab.config import apply_overrides, from_dict, read_yaml

    data: dict = {}
    overrides, prefix = list(overrides or []), ""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"probe config not found: {p}")
        data = read_yaml(p) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: a probe config must be a YAML mapping")
        if "recipe" in data:
            (data, overrides), prefix = _read_experiment(p, data, overrides), "options."
    apply_overrides(data, overrides)
    data.update({k: v for k, v in kw.items() if v is not None})
    opts = from_dict(ProbeOptions, data, prefix=prefix)
    return validate(opts, explicit={k for k in data if k != "model"})
