"""Recipe ``memory``: train a memory model on chunks (or padded sentences) with an objective or a curriculum.

Chunk view: an example is ``data.seq_len`` tokens cut into ``C = seq_len / model.chunk_len`` chunks
``(C, T)``. Sentence view: an example is one sentence, padded to ``data.seq_len <= model.chunk_len``.
The corpus is read lazily and the examples are rows of memory-mapped files (:mod:`memlab.models.memory.data`),
so memory does not grow with the corpus. With ``options.encoder_from`` the encoder comes from a trained model
and is frozen; its memories are computed once and held with the data (in memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from memlab.data.stream import stream_corpus
from memlab.errors import ConfigError, ModelError
from memlab.flops import transformer_train_flops
from memlab.loading import check_fits_tokenizer, config_for_tokenizer
from memlab.models.memory.data import CachedDataset, OffsetRows, PaddedRows, rows_batch
from memlab.registry import CURRICULA, FAMILIES, RECIPES
from memlab.train.setup import TrainSetup


@dataclass
class MemoryOptions:
    """Options of the ``memory`` recipe."""

    view: str = "chunks"
    """``chunks`` (``data.seq_len`` tokens = C chunks of ``model.chunk_len``) or ``sentences`` (one padded sentence)."""
    objective: str = "blank_copy"
    """Objective trained when no curriculum is named: blank_copy, copy, next_token, causal_lm, combined."""
    copy_weight: float = 1.0
    """lambda of the combined objective ``L = L_ntp + lambda * L_copy``."""
    copy_objective: str = "blank_copy"
    """Copy term of the combined objective: ``blank_copy`` or ``copy``."""
    curriculum: str | None = None
    """Registered curriculum (``phases``, ``blank_copy_then_next_token``); overrides ``objective``."""
    phases: list = field(default_factory=list)
    """Phases of the ``phases`` curriculum: mappings with objective, steps, metric, threshold, patience, mode, options."""
    switch_threshold: float = 0.9
    """``blank_copy_then_next_token``: blank-copy accuracy that ends the first phase."""
    switch_max_steps: int | None = None
    """``blank_copy_then_next_token``: the first phase ends after at most this many steps."""
    encoder_from: str | None = None
    """Run directory or saved model whose encoder is loaded (the frozen-encoder strategy)."""
    freeze_encoder: bool = True
    """With ``encoder_from``: freeze the loaded encoder (and cache its memories)."""
    eval_objectives: list = field(default_factory=lambda: ["blank_copy", "copy", "next_token"])
    """Objectives whose loss and accuracy every evaluation reports (``<name>_accuracy``)."""
    max_examples: int | None = None
    """Keep at most this many training examples (quick runs)."""
    train_offsets: int = 1
    """Chunk view: cut the training token stream this many times, each copy shifted by a further
    ``chunk_len / train_offsets`` tokens, so chunk boundaries fall at new places (more distinct
    training chunks from the same text; 1 = one cut). Evaluation splits are always cut once."""


@torch.no_grad()
def cache_memories(model, ids, mask, batch: int = 256, env=None) -> torch.Tensor:
    """Run the (frozen) encoder once over every example: ``(N, C, T)`` -> ``(N, C, K, M)`` float32 on the CPU
    (``ids``, ``mask``: a tensor or rows read one example at a time, as :class:`CachedDataset` takes).

    ``env`` (:class:`memlab.train.processes.SetupEnv`): on its device (bf16 multiplies where native), each
    process encoding its contiguous share of the examples; every process gets the merged result."""
    from memlab.train.processes import SetupEnv

    env = env or SetupEnv()
    model.to(env.device)
    n, r, w = len(ids), env.process_index, env.num_processes
    lo, hi = n * r // w, n * (r + 1) // w  # this process's share
    dev = env.device
    with env.frozen_autocast():
        out = [model.encode_chunks(rows_batch(ids, i, min(i + batch, hi)).to(dev),
                                   None if mask is None else rows_batch(mask, i, min(i + batch, hi)).to(dev)).float().cpu()
               for i in range(lo, hi, batch)]  # (b, C, K, M) each
    parts = env.gather(torch.cat(out) if out else None)
    return torch.cat([p for p in parts if p is not None])  # (N, C, K, M)


def load_frozen_encoder(model, path: str, freeze: bool):
    """Copy a trained model's encoder into ``model``; the encoder configs must agree."""
    from memlab.loading import load_pretrained
    from memlab.models.memory.configuration_memory import ENCODER_KEYS

    src = load_pretrained(path)
    if not hasattr(src, "encoder") or not hasattr(src.config, "space_dim"):
        raise ModelError(f"{path}: not a memory model, it has no memory encoder")
    if src.config.space_dim != model.config.space_dim:
        raise ModelError(f"the frozen encoder's memory width {src.config.space_dim} does not match this model's "
                         f"{model.config.space_dim} (model.memory_dim / encoder_hidden_size)")
    for k in ENCODER_KEYS:
        if getattr(src.config, k) != getattr(model.config, k):
            raise ModelError(f"the frozen encoder has {k}={getattr(src.config, k)}, this model {getattr(model.config, k)}; "
                             "set model.overrides to match it")
    model.encoder.load_state_dict(src.encoder.state_dict())
    if freeze:
        model.encoder.requires_grad_(False)
    return model


def apply_init_from_overrides(config, overrides: dict, source: str) -> None:
    """``model.init_from`` keeps the saved architecture: only keys that change no weight (``INIT_FROM_KEYS``)
    may change; any other override must equal the saved value."""
    from memlab.models.memory.configuration_memory import INIT_FROM_KEYS

    for key, value in overrides.items():
        if key in INIT_FROM_KEYS:
            setattr(config, key, value)
        elif getattr(config, key, None) != value:
            raise ConfigError(f"model.overrides.{key}={value!r} differs from the model in {source} "
                              f"({getattr(config, key, None)!r}); with model.init_from only {', '.join(INIT_FROM_KEYS)} may change")
    config.validate_memory()


def memory_flops(model, objective_passes: float, prefix: int, length: int, chunks: int, encoder_trained: bool) -> float:
    """Training FLOPs per example (conventions of memlab.flops): encoder over C chunks + decoder passes.

    Per-token matrices (blocks, output head) cost ``2 N`` per position; per-chunk matrices (pooling,
    memory projections, the unrolled projection) cost ``2 N`` once per chunk; x3 for training.
    """
    c = model.config

    def mats(module, names) -> int:
        return sum(p.numel() for n, p in module.named_parameters() if p.ndim == 2 and n.split(".")[0] in names)

    enc_tok = mats(model.encoder, ("layers",))
    enc_chunk = mats(model.encoder, ("flat", "expand", "bottleneck", "pool_attn"))
    mix = 2 if c.encoder_type == "mixer" else 4
    enc = 2.0 * enc_tok * c.chunk_len + c.encoder_layers * c.chunk_len ** 2 * c.encoder_hidden_size * mix + 2.0 * enc_chunk
    enc *= 3.0 if encoder_trained else 0.0
    dec_tok = mats(model.decoder, ("layers",)) + c.vocab_size * c.hidden_size
    dec_chunk = mats(model.decoder, ("mem_proj", "unroll")) if prefix else 0
    dec = transformer_train_flops(dec_tok, c.num_hidden_layers, c.hidden_size, prefix + length) + 3.0 * 2.0 * dec_chunk
    return chunks * (enc + objective_passes * dec)


@dataclass
class Shape:
    """How an example is cut: ``chunks`` of ``chunk_len`` tokens, ``seq_len`` tokens (or the longest sentence)."""

    chunk_len: int
    seq_len: int
    chunks: int


@dataclass
class MemoryData:
    """The training and validation examples (token ids, masks, cached frozen-encoder memories)."""

    train: CachedDataset
    val: CachedDataset | None
    dropped_sentences: int


def phase_flops(model, shape: Shape, sentences: bool, frozen: bool):
    """``objective -> float``: training FLOPs per example while ``objective`` trains (:func:`memory_flops`); a
    ``combined`` objective runs the decoder twice, a causal one reads no memory. The recipe hands the loop
    this function of the curriculum's current objective, so MFU is right in every phase."""

    counted: dict[tuple, float] = {}

    def flops(obj) -> float:
        # slot states are computed once per chunk in both memory modes (the "previous" mode's rows share them);
        # the attention of tokens to earlier chunks' slots is not counted
        prefix = model.config.num_memories if obj.mode in ("previous", "own") else 0
        key = (obj.decoder_passes, prefix, not frozen and obj.uses_memory)
        if key not in counted:  # read every step: count each kind of phase once
            length = shape.chunk_len + (1 if sentences else 0)
            counted[key] = memory_flops(model, key[0], prefix, length, shape.chunks, key[2])
        return counted[key]

    return flops


class MemoryRecipe:
    """Memory model: autoencoder (blank copy), memory LM (next token), combined, or a curriculum."""

    name = "memory"
    options_class = MemoryOptions

    def build_loss(self, opts: MemoryOptions):
        """The objective schedule: the named curriculum, else one phase of ``options.objective``."""
        from memlab.curricula.schedules import CurriculumSpec, PhaseSchedule

        objective_options = {"combined": {"weight": opts.copy_weight, "copy": opts.copy_objective}}
        if not opts.curriculum:
            return PhaseSchedule([{"objective": opts.objective}], objective_options)
        spec = CurriculumSpec(phases=list(opts.phases), switch_threshold=opts.switch_threshold,
                              switch_max_steps=opts.switch_max_steps, objective_options=objective_options)
        return CURRICULA.get(opts.curriculum)(spec)

    def setup(self, cfg, run_dir: Path, env=None) -> TrainSetup:
        from memlab.curricula.objectives import ObjectiveEvaluation, make_objective

        opts: MemoryOptions = cfg.options or MemoryOptions()
        if opts.view not in ("chunks", "sentences"):
            raise ConfigError(f"options.view must be 'chunks' or 'sentences', got {opts.view!r}")
        schedule = self.build_loss(opts)  # validates objectives before any data work
        evals = [make_objective(n).name for n in opts.eval_objectives]
        loaded = self.load_init_from(cfg)
        shape = self.example_shape(cfg, opts, loaded.config if loaded is not None else
                                   FAMILIES.get(cfg.model.family).make_config(cfg.model.preset, **cfg.model.overrides))
        corpus = self.corpus(cfg, opts, run_dir)
        tok = corpus.tokenizer
        model = loaded if loaded is not None else self.new_model(cfg, tok)
        check_fits_tokenizer(model.config, tok)
        frozen = bool(opts.encoder_from) and opts.freeze_encoder
        if opts.encoder_from:
            load_frozen_encoder(model, opts.encoder_from, opts.freeze_encoder)
        data = self.datasets(model, corpus, opts, shape, frozen, env)
        flops = phase_flops(model, shape, opts.view == "sentences", frozen)
        return TrainSetup(
            model=model,
            train_data=data.train,
            eval_data=data.val,
            loss_fn=schedule,
            eval_step_fn=ObjectiveEvaluation(lambda: schedule.objective, evals),
            callbacks=[schedule],
            tokenizer=tok,
            tokens_per_example=shape.chunks * shape.chunk_len,
            flops_per_example=lambda: flops(schedule.objective),
            unused_parameters=True,  # own-mode phases leave dist_bias unused, previous-mode ones dist (DDP finds them)
            summary={"train_examples": len(data.train), "eval_examples": len(data.val) if data.val is not None else 0,
                     "chunks_per_example": shape.chunks, "chunk_len": shape.chunk_len,
                     "dropped_sentences": data.dropped_sentences,
                     "encoder_parameters": sum(p.numel() for p in model.encoder.parameters()),
                     "decoder_parameters": sum(p.numel() for p in model.decoder.parameters()),
                     "frozen_encoder": frozen, "vocab_size": len(tok)},
        )

    @staticmethod
    def load_init_from(cfg):
        """``model.init_from``: the saved model, with the training-time keys of ``model.overrides`` applied."""
        if not cfg.model.init_from:
            return None
        from memlab.loading import load_pretrained

        family = FAMILIES.get(cfg.model.family)
        loaded = load_pretrained(cfg.model.init_from)
        if not isinstance(loaded, family.model_class):
            raise ConfigError(f"model.init_from={cfg.model.init_from} holds a {type(loaded).__name__}, "
                              f"not a {family.model_class.__name__}")
        apply_init_from_overrides(loaded.config, cfg.model.overrides, cfg.model.init_from)
        return loaded

    @staticmethod
    def example_shape(cfg, opts: MemoryOptions, config) -> Shape:
        """Check ``data.seq_len`` against the model's chunk length and chunk count (before any data work)."""
        t, seq = config.chunk_len, cfg.data.seq_len
        if opts.view == "chunks" and seq % t:
            raise ConfigError(f"data.seq_len={seq} is not a whole number of model chunks (chunk_len={t})")
        if opts.view == "sentences" and seq > t:
            raise ConfigError(f"data.seq_len={seq} (longest sentence) does not fit the model's chunk_len={t}")
        chunks = seq // t if opts.view == "chunks" else 1
        if chunks > config.max_chunks:
            raise ConfigError(f"{chunks} chunks per example exceed model.max_chunks={config.max_chunks}")
        config.validate_memory()
        return Shape(chunk_len=t, seq_len=seq, chunks=chunks)

    @staticmethod
    def corpus(cfg, opts: MemoryOptions, run_dir: Path):
        """The split corpus, read lazily (:class:`memlab.data.stream.CorpusStream`), and its tokenizer (a trained
        model's tokenizer is kept, not rebuilt)."""
        from memlab.loading import resolve_model_dir

        trained = cfg.model.init_from or opts.encoder_from
        return stream_corpus(cfg.data, Path(run_dir) / "tokenizer",
                             tokenizer_spec=str(resolve_model_dir(trained)) if trained else None)

    @staticmethod
    def new_model(cfg, tok):
        """A fresh model sized to the tokenizer; the blank token is its mask token (else padding)."""
        family = FAMILIES.get(cfg.model.family)
        blank = tok.mask_token_id if tok.mask_token_id is not None else tok.pad_token_id
        return family.model_class(config_for_tokenizer(family, cfg.model.preset, cfg.model.overrides, tok,
                                                       blank_token_id=blank))

    @staticmethod
    def datasets(model, corpus, opts: MemoryOptions, shape: Shape, frozen: bool, env=None) -> MemoryData:
        """The chunk or sentence view of the train and validation splits; with a frozen encoder, its memories
        computed once."""

        def view(split: str):  # rows read from memory-mapped files, None for an empty split
            if opts.view == "chunks":
                flat = corpus.tokens(split)  # (n,)
                cuts = opts.train_offsets if split == "train" else 1
                return (OffsetRows(flat, shape.seq_len, shape.chunk_len, cuts), None, 0) if flat is not None else (None, None, 0)
            if opts.train_offsets != 1:
                raise ConfigError("options.train_offsets applies to the chunk view only")
            sents = corpus.sentences(split, shape.seq_len)  # ((N, T), (N,), dropped)
            if sents is None:
                return None, None, 0
            rows = PaddedRows(sents[0], sents[1])
            return rows.ids, rows.mask, sents[2]

        train_ids, train_mask, dropped = view("train")
        if opts.max_examples:
            train_ids = train_ids.limit(opts.max_examples)
            train_mask = train_mask.limit(opts.max_examples) if train_mask is not None else None
        val_ids, val_mask, _ = view("validation")
        train_mem = val_mem = None
        if frozen:
            model.eval()
            train_mem = cache_memories(model, train_ids, train_mask, env=env)  # (N, C, K, M)
            val_mem = cache_memories(model, val_ids, val_mask, env=env) if val_ids is not None else None
            model.train()
        val = CachedDataset(val_ids, val_mask, val_mem) if val_ids is not None else None
        return MemoryData(train=CachedDataset(train_ids, train_mask, train_mem), val=val, dropped_sentences=dropped)


RECIPES.register("memory", MemoryRecipe(), description=MemoryRecipe.__doc__)
