"""The probe's options, by section, and the options of its built-in parts: every default lives here, once.

A probe's config is a few sections (:data:`SECTIONS`: encoder, text, fit, decoder, read-outs, run) and the options
of the parts it chooses. Each part declares its own options dataclass (:attr:`memlab.probes.parts.Part.
options_class`); the built-in parts' are below (:data:`PART_OPTIONS`). :class:`memlab.probes.options.ProbeOptions`,
the typed object the code reads, is made of these classes: its flat names (``epochs``, ``lora_r``) are the names
written in YAML, ``key=value`` and the CLI flags, and ``memlab probe --help`` reads its defaults from here.

The optimiser settings of the fit section are the core's (:class:`memlab.config.TrainConfig`): the same names and
meanings, the core's defaults where the probe uses the same value, the probe's own (``lr``, ``beta2``) where not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from memlab.config import TrainConfig


@dataclass
class EncoderSection:
    """The frozen encoder: what is read, where and how it is placed."""

    model: str = "minilm"
    """Model to probe: a shortcut (minilm, smollm2, memlab-lm), ``space:NAME[:PATH]``, a local folder or run, a GGUF
    file, or a hub name (a registered encoder kind: ``memlab list probe_encoders``)."""
    layer: int = -1
    """Hidden state to read: 0 = embeddings, k = output of block k-1; negative counts from the end."""
    pool: str | None = None
    """A registered pooling (last, second_last, mean, first); default: the shortcut's own (mean for MiniLM) or
    last."""
    final_norm: bool = False
    """Read the last layer after the model's final norm (HF's hidden_states[-1])."""
    random_init: bool = False
    """Probe the same architecture with random weights (the floor)."""
    special_tokens: bool = True
    """Wrap each chunk in the tokenizer's special tokens ([CLS] ... [SEP]) before encoding."""
    encoder_dtype: str = "auto"
    """Weights of the frozen encoder: auto (bf16 where the device multiplies it natively, else float32), float32,
    bfloat16 or float16; embeddings are float32."""
    device_map: str | None = None
    """Placement of a transformers encoder: auto (accelerate's big-model inference: its blocks over the GPUs, then
    host memory, then disk in offload_dir), none (whole on the device); default: auto only when its weights do not
    fit the device's free memory (memlab.probes.encoders.placement)."""
    max_memory: str | dict | None = None
    """device_map=auto: the memory budget per device, e.g. cpu:200MB,0:20GiB (or a mapping); the disk takes the
    rest. Default: each device's free memory (the CPU alone when device=cpu)."""
    offload_dir: str | None = None
    """device_map=auto: the folder of the weights offloaded to disk (default: a temporary folder removed at exit)."""
    encode_batch_size: int = 32
    """Chunks per encoder call."""
    cache_dir: str | None = None
    """Cache embeddings (memory-mapped files written in pieces, resumed after a kill) and trained controls
    (safetensors, JSON) on disk here and reuse them; default: in memory only."""
    cache_dtype: str = "float32"
    """How ``cache_dir`` stores embeddings: float32, or float16/bfloat16 (half the disk; the fit reads them as float32,
    a first run as a cached one)."""


@dataclass
class TextSection:
    """The text: corpus, how it is cut, how many chunks."""

    corpus: str = "austen"
    """Corpus (memlab data pipeline): bundled name, local file or folder (.txt, .jsonl, .parquet, .arrow, or a folder
    saved with datasets' save_to_disk) or hf:NAME."""
    text_field: str = "text"
    """The field that holds the text in a corpus of records (.jsonl, .parquet, .arrow, a saved dataset, hf:NAME)."""
    eval_split: str = "test"
    """Held-out split scored: test or validation."""
    chunk_by: str = "words"
    """How the text is cut: words (chunks of seq_len words, the same text for every model; each model reads them in
    its own tokens, padded to its longest chunk) or tokens (seq_len tokens of the model's own tokenizer)."""
    seq_len: int | list[int] = 32
    """Words per chunk (chunk_by=words) or tokens per chunk in the probed model's tokenizer (chunk_by=tokens); a list
    (e.g. [8, 16, 32]) fits each length on one model load and writes the retention-against-length curve
    (memlab.probes.sweeps.lengths). ``memlab invert``'s default is 16 on purpose (its searches cost more the longer
    the chunk); ``memlab invert --probe RUN`` reads a probe run's own, so both read the same chunks."""
    max_chunk_tokens: int | None = None
    """chunk_by=words: a chunk's trailing words are dropped until it holds at most this many tokens of
    ``chunk_tokenizer`` (every model still reads the same text; an encoder of fixed length reads it whole)."""
    chunk_tokenizer: str | None = None
    """The tokenizer that counts max_chunk_tokens: a shortcut, folder, run directory or GGUF file (default: the probed
    model's own, which makes the text differ between models)."""
    n_train: int | list[int] = 8000
    """Training chunks (from the corpus's train split); a list (e.g. [1000, 4000, 16000]) fits each size on one
    encoder pass and writes the learning curve. Chosen from the learning curve (docs/results/probes.md); fewer is
    marked in the report."""
    n_eval: int = 256
    """Held-out chunks (from ``eval_split``); a split that holds fewer is scored whole, with a warning and a note."""


@dataclass
class FitSection:
    """The fit loop of the decoders: budget, early stopping, optimiser (the core's AdamW settings), seed."""

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
    """Peak learning rate (AdamW, memlab.probes.decoder.group.optimiser; warmup then cosine to min_lr_ratio)."""
    beta1: float = TrainConfig.beta1
    """AdamW beta1."""
    beta2: float = 0.98
    """AdamW beta2."""
    weight_decay: float = TrainConfig.weight_decay
    """AdamW weight decay (matrices only)."""
    warmup_fraction: float = 0.05
    """Share of the decoder's steps spent warming the learning rate up."""
    min_lr_ratio: float = TrainConfig.min_lr_ratio
    """The cosine schedule ends at lr * min_lr_ratio."""
    clip_grad: float = TrainConfig.clip_grad
    """Gradient norm clipping (0: none)."""
    seed: int = TrainConfig.seed
    """Seed of data sampling and decoder initialisation."""
    sequence: bool = True
    """Fit the sequence decoder (and its control); false: the read-outs alone, in seconds (needs readouts)."""
    control: bool = True
    """Also train the control decoder on a constant embedding."""
    race: bool = True
    """Race the probe's candidates (the contained probe, the plain decoder, the random start): after each epoch a
    candidate whose held-back gain over its control trails the leader's by more than it could still gain (its last
    epoch's improvement times the patience) and than two paired standard errors stops, as early stopping stops it
    (memlab.probes.decoder.fitloop.race_losers)."""
    contained_lr: float = 0.1
    """The probe started as its trained control: the share of ``lr`` at which the weights it takes from the control
    train (its embedding pathway, which starts at zero, trains at ``lr``); the control's second run trains at the same
    share. Lower keeps the control's language model while the pathway learns: it reads more of a pooled embedding
    than 1.0 (docs/results/probes.md); the probe trained from a random start, beside it, is unaffected."""


@dataclass
class DecoderSection:
    """The sequence decoder: its part, how it reads the embedding and its tokens, and how it is scored."""

    decoder: str = "llama"
    """The decoder (a registered part: ``memlab list probe_decoders``): llama (a small Llama trained from scratch,
    in the encoder's tokenizer) or pretrained:NAME (a pretrained causal LM: shortcut, folder, run, GGUF file or hub
    name, reading the embedding through a trained map; targets in its own tokenizer; memlab.probes.decoder.pretrained)."""
    conditioning: str = "unrolled"
    """How the decoder reads the embedding (a registered part): unrolled (projected and added per position) or
    prefix (memory prefix)."""
    inputs: str = "teacher"
    """Decoder token inputs (a registered part): teacher (true previous tokens, greedy generation is
    autoregressive: the decoder's language knowledge helps, as the control shows) or blank (start token
    everywhere: all it knows comes from the embedding; it cannot spread an order-free set over positions)."""
    bag_head: bool = True
    """Add a position-shared linear read-out of the embedding to every position's logits (see the decoder)."""
    select_decoder: bool = True
    """With bag_head: also fit the plain decoder (no bag head, input dropout plain_input_dropout) and keep the one
    with the lower held-back CE (needs val_fraction > 0). The bag head reads content a positional read-out cannot
    learn from few chunks; it slows the read-out of embeddings that keep every position (docs/results/probes.md).
    Costs one more decoder."""
    plain_input_dropout: float = 0.3
    """select_decoder=true: input dropout of the plain decoder fitted beside the bag-head one: with it, teacher
    inputs read synthetic concat whole instead of over-fitting their own language model (docs/results/probes.md)."""
    cond_dropout: float = 0.0
    """Dropout on the standardised embedding while the decoder trains (regularises the embedding-to-decoder map)."""
    compact_vocab: bool = True
    """Output layer over tokens seen in training plus one 'other' class (exact over V; much faster for large V)."""
    scorers: list[str] = field(default_factory=partial(list, ("token_set_f1", "sentence_bleu", "exact_match")))
    """Scores of the greedy reconstruction (registered parts: ``memlab list probe_scorers``)."""


@dataclass
class ReadoutSection:
    """The read-outs fitted beside the decoder, the intervals on the readings, the calibration and the examples."""

    readouts: list[str] = field(default_factory=partial(list, ("bow",)))
    """Read-outs fitted beside the decoder (registered parts: bow, the bag-of-words read-out, a linear multi-label
    head, and its frequency prior; align, a ridge map into the space of align_target, read by its decoder); []
    for none."""
    ci_level: float = 0.95
    """Level of the paired bootstrap intervals over held-out chunks (memlab.probes.readings)."""
    ci_resamples: int = 2000
    """Bootstrap resamples of the held-out chunks."""
    curve_shares: list[float] = field(default_factory=partial(list, (0.0625, 0.125, 0.25, 0.5)))
    """Shares of the training chunks the probe is also fitted on: the learning curve, its verdict (saturation) and
    the online code (memlab.probes.readouts.saturation, memlab.probes.readouts.online_code); a share under 64
    chunks is left out; [] for none (the run then costs about half)."""
    calibrate: bool = False
    """Also fit the positive controls (synthetic concat and bag codes of the same chunks, same tokenizer) and
    report whether the probe reads them; a synthetic model is always checked against what it must give."""
    n_examples: int = 5
    """Reconstructions shown beside their inputs."""


@dataclass
class RunSection:
    """The run: its name, the sweeps, the device, threads and progress."""

    name: str | None = None
    """The run's name: the default output folder is runs/NAME-TIMESTAMP (default: probe-MODEL)."""
    compare: str | list[str] | None = None
    """Methods read from one encoder pass, as a comparison (memlab.probes.sweeps.compare): decoders (llama,
    pretrained:NAME) and read-outs (align, bow), each with options of its own in brackets (e.g. [llama,
    "pretrained:memlab-lm[conditioning=prefix]", align], or that comma string); every method at every n_train size,
    one table (curve.md/json) and one plot (plots/compare.png). Each row names the target tokens its bits are over."""
    layers: str | list[int] | None = None
    """'all' or a list of layers: capture them in one pass and fit the read-outs per layer (retention by depth)."""
    layers_sequence: bool = False
    """With layers: also fit the sequence probe (and its shared control) per layer."""
    device: str = "auto"
    """Device of the encoder, the decoders and the read-outs: auto (the best one present: a CUDA GPU, else MPS,
    else the CPU), cpu, cuda, cuda:N or mps; a device this machine lacks is refused before anything loads."""
    progress: bool | None = None
    """Progress bars (default: on a TTY)."""
    threads: int | None = None
    """torch CPU threads (default: torch's own); 1 is fastest for small decoders on a busy machine."""


SECTIONS: dict[str, type] = {"encoder": EncoderSection, "text": TextSection, "fit": FitSection,
                             "decoder": DecoderSection, "readouts": ReadoutSection, "run": RunSection}
"""The probe config's sections, in the order the reference lists them."""


# the built-in parts' own options (each part names its class: memlab.probes.parts.Part.options_class)

@dataclass
class PrefixOptions:
    """conditioning=prefix."""

    prefix_len: int = 4
    """Memory prefix vectors."""


@dataclass
class TeacherOptions:
    """inputs=teacher."""

    input_dropout: float = 0.0
    """Share of the true previous tokens replaced by the start token while training (word dropout: the decoder
    must read the embedding rather than lean on its language model)."""
    repeat_penalty: float = 1.5
    """Nats taken off the log-probability of each token already in the greedy reconstruction (0: plain greedy). A
    weak decoder otherwise loops on one phrase, which hides the tokens it does read (TF1, BLEU and exact match
    score the reconstruction; token accuracy and CE are teacher forced and do not use it)."""


TOKEN_TABLES = ("auto", "encoder", "none")
"""``token_table``'s values (:class:`LlamaOptions`)."""


@dataclass
class LlamaOptions:
    """decoder=llama."""

    hidden_size: int = 128
    """Decoder width."""
    num_layers: int = 2
    """Decoder blocks."""
    num_heads: int = 4
    """Decoder attention heads."""
    token_table: str = "none"
    """The output layer: none (one vector per token learned from scratch), auto (a learned map of the encoder's own
    token embeddings when it has them and the targets are in its tokenizer, plus each token's own vector: it learns
    faster in the first epochs, not further: docs/results/probes.md), encoder (as auto, refused without a table).
    memlab.probes.decoder.table."""
    target_tokenizer: str | None = None
    """Rebuild the chunk texts in this tokenizer (a shortcut, folder, run directory or GGUF file) instead of the
    encoder's own (chunk_by=words): every model of a comparison is then scored over the same target tokens, and
    probes of the same chunks share one control."""


@dataclass
class PretrainedOptions:
    """decoder=pretrained:NAME."""

    lora_r: int = 0
    """Rank of the LoRA adapters trained in the LM (peft); 0 keeps the LM frozen."""
    lora_alpha: float = 16.0
    """lora_r > 0: LoRA scale (the adapters' output is multiplied by lora_alpha / lora_r)."""
    finetune: bool = False
    """Train every weight of the LM with the map (saved whole with the probe); false: the LM frozen, or adapted by
    LoRA (lora_r)."""
    map_hidden: int = 0
    """Width of the hidden layer of the map from the embedding to the LM's input vectors (Linear -> GELU -> Linear,
    as vec2text's embedding transform); 0: one linear layer."""


@dataclass
class BowOptions:
    """readouts=[bow]: the bag-of-words head's own param group in the fit loop (which gives it its batches, schedule,
    epochs and held-back chunks; it stops on its own held-back loss)."""

    bow_lr: float = 1e-2
    """Its peak learning rate (the fit's schedule): a linear head started at the prior takes larger steps than the
    decoders."""
    bow_weight_decay: float = 1e-4
    """Its weight decay."""


@dataclass
class AlignOptions:
    """readouts=[align]."""

    align_target: str = "space:memory_ae"
    """The space the embedding is mapped into and read by its own decoder (space:NAME[:PATH]; space:memory_ae alone
    is the shipped memory autoencoder). memlab.probes.readouts.align."""


PART_OPTIONS: dict[tuple[str, str], type] = {
    ("conditioning", "prefix"): PrefixOptions, ("inputs", "teacher"): TeacherOptions,
    ("decoder", "llama"): LlamaOptions, ("decoder", "pretrained"): PretrainedOptions,
    ("readout", "bow"): BowOptions, ("readout", "align"): AlignOptions}
"""(kind, part) -> the options class of each built-in part that has options."""
