"""The inversion probe: how much of its input does a frozen model keep in one embedding?

A frozen encoder (any HF model read at one layer and pooled, or any memlab
space) embeds chunks of ``seq_len`` tokens of held-out Austen text, once per
chunk; a fresh Llama-style decoder (:mod:`memlab.probes.decoder`) trains on
that cache to rebuild the tokens in the encoder's own tokenizer. By default
it reads the true previous tokens (``inputs="teacher"``), the embedding is
added to every position (``conditioning="unrolled"``) and a position-shared
linear read-out of it is added to every position's logits (``bag_head``);
``inputs="blank"`` blanks the token inputs, so all it knows of a chunk comes
through the embedding (see docs/probes.md for the measured choice). A tenth of the training chunks is held back for early stopping
(the best epoch's weights are kept). A *control* decoder, same size and
budget, trains on a constant embedding (the mean training embedding): it
measures what the decoder guesses without the embedding (with blank inputs:
the most likely token at each position; with teacher forcing: language).
Report: token accuracy, CE, entropy ratio ``H_r = 1 - CE / ln V``, token-set
F1, sentence BLEU and exact match of the greedy reconstruction, the
information gain ``(CE_control - CE_probe) / CE_control``, what limits the
reading (order or content), accuracy by position, reconstructions, the
bag-of-words read-out (:mod:`memlab.probes.bow`) and the calibration status
(:mod:`memlab.probes.fit`).

Python::

    from memlab.probes import probe
    report = probe("minilm", pool="mean", n_train=2000, out="runs/probe-minilm")
    report["probe"]["token_accuracy"], report["information_gain"]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from memlab.errors import ConfigError, MemlabError
from memlab.probes import train as T
from memlab.probes.capture import POOLS
from memlab.probes.report import format_summary, peak_memory_mb, write_report
from memlab.probes.space import FittedProbe


@dataclass
class ProbeOptions:
    """One probe run (YAML: configs/probes/*.yaml; CLI flags of ``memlab probe``)."""

    model: str = "minilm"
    """Model to probe: a shortcut (minilm, smollm2), ``space:NAME[:PATH]``, a local folder or run, a GGUF file, or a
    hub name."""
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
    seq_len: int = 32
    """Tokens per chunk, in the probed model's tokenizer."""
    n_train: int = 8000
    """Training chunks (from the corpus's train split). 8,000 from the learning curve (docs/probes.md): MiniLM's
    readings still rise from 4,000 to 8,000, and concat calibration needs that many; fewer is marked in the report."""
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
    chunks; it slows the read-out of embeddings that keep every position (docs/probes.md). Costs one more decoder."""
    cond_dropout: float = 0.0
    """Dropout on the standardised embedding while the decoder trains (regularises the embedding-to-decoder map)."""
    epochs: float = 30.0
    """Most passes of the decoder over the cached training embeddings; early stopping usually ends sooner (real
    encoders over-fit within 3-6 epochs), while a decoder that still improves keeps going (concat needs ~30)."""
    val_fraction: float = 0.1
    """Share of the training chunks held back for early stopping and decoder selection (0: train all epochs, keep
    the last weights, no selection)."""
    patience: int = 3
    """Early stopping: epochs without a better held-back CE before training stops (best weights are kept)."""
    batch_size: int = 32
    """Decoder batch size."""
    lr: float = 2e-3
    """Peak learning rate (AdamW, warmup then cosine to 10 %)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    control: bool = True
    """Also train the control decoder on a constant embedding."""
    bow: bool = True
    """Also fit the bag-of-words read-out (linear multi-label head) and its frequency prior."""
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
    device: str = "cpu"
    """Device of the encoder and decoder (cpu, cuda)."""
    encoder_dtype: str = "float32"
    """Weights of the frozen encoder: float32, bfloat16, float16 or auto (bf16 where native); embeddings are float32."""
    progress: bool | None = None
    """Progress bars (default: on a TTY)."""
    threads: int | None = None
    """torch CPU threads (default: torch's own); 1 is fastest for small decoders on a busy machine."""


def validate(opts: ProbeOptions) -> ProbeOptions:
    if opts.pool is not None and opts.pool not in POOLS:
        raise ConfigError(f"'pool' must be one of {', '.join(POOLS)}, got {opts.pool!r}")
    if opts.conditioning not in ("prefix", "unrolled"):
        raise ConfigError(f"'conditioning' must be prefix or unrolled, got {opts.conditioning!r}")
    if opts.inputs not in ("teacher", "blank"):
        raise ConfigError(f"'inputs' must be teacher or blank, got {opts.inputs!r}")
    if opts.eval_split not in ("test", "validation"):
        raise ConfigError(f"'eval_split' must be test or validation, got {opts.eval_split!r}")
    for k in ("input_dropout", "cond_dropout"):
        if not 0.0 <= getattr(opts, k) < 1.0:
            raise ConfigError(f"'{k}' must be in [0, 1), got {getattr(opts, k)}")
    if opts.repeat_penalty < 0:
        raise ConfigError(f"'repeat_penalty' must be >= 0, got {opts.repeat_penalty}")
    if not 0.0 <= opts.val_fraction < 1.0:
        raise ConfigError(f"'val_fraction' must be in [0, 1), got {opts.val_fraction}")
    for k in ("seq_len", "n_train", "n_eval", "hidden_size", "num_layers", "num_heads", "batch_size", "prefix_len",
              "patience"):
        if getattr(opts, k) < 1:
            raise ConfigError(f"'{k}' must be >= 1")
    if opts.hidden_size % opts.num_heads:
        raise ConfigError("'hidden_size' must be a multiple of 'num_heads'")
    if opts.seq_len < 2:
        raise ConfigError("'seq_len' must be >= 2")
    return opts


def load_options(path: str | Path | None = None, overrides: list[str] | None = None, **kw) -> ProbeOptions:
    """ProbeOptions from a YAML file (strict keys), dotted ``key=value`` overrides, then keyword values."""
    from memlab.config import apply_overrides, from_dict, read_yaml, to_dict

    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"probe config not found: {p}")
        data = read_yaml(p) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: a probe config must be a YAML mapping")
        if "recipe" in data:  # an experiment file (recipe: probe): the options section holds the probe
            from memlab.config import load_config

            over = [o if o.split("=", 1)[0].startswith(("options.", "name")) else f"options.{o}" for o in overrides or []]
            cfg = load_config(p, over)
            if cfg.recipe != "probe":
                raise ConfigError(f"{p}: recipe '{cfg.recipe}' is not a probe (recipe: probe)")
            data, overrides = to_dict(cfg.options), []
    apply_overrides(data, overrides or [])
    data.update({k: v for k, v in kw.items() if v is not None})
    return validate(from_dict(ProbeOptions, data))


class ProbeRecipe:
    """Inversion probe of a frozen model (run it with ``memlab probe --config``; options: ProbeOptions)."""

    name = "probe"
    options_class = ProbeOptions

    def setup(self, cfg, run_dir):
        raise ConfigError("probe configs run with `memlab probe --config PATH` (they train a decoder and a control "
                          "on cached embeddings and write a report), not with `memlab train`")


def encoder_spec(opts: ProbeOptions) -> dict:
    spec = {"model": opts.model, "layer": opts.layer, "pool": opts.pool, "final_norm": opts.final_norm,
            "random_init": opts.random_init, "special_tokens": opts.special_tokens, "dtype": opts.encoder_dtype}
    if opts.model.startswith("synthetic:"):
        spec["max_len"] = opts.seq_len  # the concat code's width depends on it
    return spec


def control_key(opts: ProbeOptions, tokenizer, train_ids: torch.Tensor, eval_ids: torch.Tensor) -> str:
    """What a control run depends on: the token data, the vocabulary size and the decoder's options."""
    encoder_side = set(encoder_spec(opts)) | {"max_len", "bow", "calibrate", "encoder_dtype", "cache_dir", "progress", "threads", "n_examples",
                                              "device", "encode_batch_size"}
    decoder_side = {k: v for k, v in vars(opts).items() if k not in encoder_side}
    return T.content_hash({**decoder_side, "vocab_size": len(tokenizer)}, train_ids, eval_ids)


def _load(opts: ProbeOptions, encoder):
    from memlab.probes.loading import load_encoder

    if encoder is not None:
        return encoder
    return load_encoder(opts.model, layer=opts.layer, pool=opts.pool, final_norm=opts.final_norm,
                        random_init=opts.random_init, special_tokens=opts.special_tokens, device=opts.device,
                        dtype=opts.encoder_dtype, max_len=opts.seq_len)


def probe_data(opts: ProbeOptions, encoder) -> tuple[torch.Tensor, torch.Tensor]:
    """Training (N, T) and held-out (M, T) chunks in the encoder's tokenizer."""
    if encoder.max_length is not None and opts.seq_len > encoder.max_length:
        raise MemlabError(f"seq_len={opts.seq_len} is longer than {encoder.name} allows ({encoder.max_length} tokens "
                          "besides its special tokens)")
    train_ids = T.probe_chunks(encoder.tokenizer, opts.seq_len, opts.n_train, "train", opts.corpus, opts.seed)
    eval_ids = T.probe_chunks(encoder.tokenizer, opts.seq_len, opts.n_eval, opts.eval_split, opts.corpus, opts.seed,
                              at_most=True)
    note = eval_note(opts, eval_ids)  # fewer held-out chunks than asked: all are scored, and the report says so
    if note:
        print(f"memlab: warning: {note}", file=sys.stderr)
    return train_ids, eval_ids  # (N, T), (M, T)


def eval_note(opts: ProbeOptions, eval_ids: torch.Tensor) -> str | None:
    """What the report says when the held-out split holds fewer chunks than ``n_eval`` (None when it does not)."""
    m = int(eval_ids.shape[0])
    if m >= opts.n_eval:
        return None
    return (f"n_eval={opts.n_eval} asked, but the {opts.eval_split} split of '{opts.corpus}' holds {m} chunks of "
            f"{opts.seq_len} tokens: all {m} are scored")


def encode_data(opts: ProbeOptions, encoder, train_ids, eval_ids):
    """Embeddings (N, D), (M, D) of the chunks (disk-cached under ``opts.cache_dir``) and whether both were cached."""
    key = {**encoder_spec(opts), "enc": encoder.describe()}
    kw = dict(batch_size=opts.encode_batch_size, progress=opts.progress)
    z_train, hit1 = T.cached_encode(encoder, train_ids, key, opts.cache_dir, desc="encode train", **kw)  # (N, D)
    z_eval, hit2 = T.cached_encode(encoder, eval_ids, key, opts.cache_dir, desc="encode held-out", **kw)  # (M, D)
    return z_train, z_eval, bool(hit1 and hit2)


SATURATION_HINT = 8000
"""Training chunks below which the measured learning curves (docs/probes.md) still rise."""

DEFINITIONS = {
    "token_accuracy": "share of held-out target tokens where the decoder's argmax equals the true token",
    "ce": "mean cross-entropy per target token, nats, over the full vocabulary",
    "entropy_ratio": "H_r = 1 - CE / ln V",
    "information_gain": "(CE_control - CE_probe) / CE_control; control = same decoder on a constant embedding",
    "token_set_f1": "F1 between the sets of token ids of the greedy reconstruction and of the chunk, mean over chunks",
    "sentence_bleu": "NLTK sentence BLEU (whitespace tokens, smoothing 4, 0-1) of the decoded greedy reconstruction",
    "exact_match": "share of chunks rebuilt token for token",
}


def build_report(opts: ProbeOptions, encoder, train_ids, eval_ids, z_eval, fit: dict) -> dict:
    """report.json's content from the fitted read-outs ``fit`` (:func:`memlab.probes.fit.fit_readings`)."""
    tok, dec = encoder.tokenizer, fit["_decoder"]
    k = min(opts.n_examples, eval_ids.shape[0]) if dec is not None else 0
    recon = FittedProbe(encoder, dec).generate(z_eval[:k], max_new_tokens=opts.seq_len) if k else []
    inputs = tok.batch_decode(eval_ids[:k].tolist(), skip_special_tokens=True)
    return {
        "model": opts.model if not opts.random_init else f"{opts.model} (random init)",
        "encoder": encoder.describe(), "options": dict(vars(opts)), "vocab_size": len(tok), "seq_len": opts.seq_len,
        "n_train": int(train_ids.shape[0]), "n_eval": int(eval_ids.shape[0]),
        "decoder": None if dec is None else {"parameters": sum(p.numel() for p in dec.parameters()),
                                             "kept_vocab": dec.num_kept, "conditioning": opts.conditioning,
                                             "inputs": opts.inputs, "bag_head": bool(dec.config.bag_head),
                                             "input_dropout": float(dec.config.input_dropout),
                                             "repeat_penalty": float(dec.config.repeat_penalty)},
        **{k_: fit[k_] for k_ in ("probe", "control", "control_shared_with", "information_gain", "limited_by", "bow",
                                  "calibration", "history")},
        "examples": [{"input": a, "reconstruction": b} for a, b in zip(inputs, recon)],
        "timing": dict(fit["timing"]), "memory": peak_memory_mb(), "definitions": DEFINITIONS,
    }


def claim_out(run_dir: str | Path | None) -> None:
    """A used or unwritable output folder is refused before any compute; it stays locked until the process ends."""
    if run_dir is not None:
        from memlab.rundir import claim

        claim(run_dir, fresh=True, what="probe")


def run_probe(opts: ProbeOptions, run_dir: str | Path | None = None, encoder=None, verbose: bool = False,
              control_cache: dict | None = None) -> dict:
    """Probe ``opts.model`` (or a ready ``encoder``); writes report.json, plots and the decoder into ``run_dir``.

    ``control_cache``: a dict shared by several probes; a control run already made on the same chunks with the
    same decoder options is reused from it (the report names the probe that trained it).
    """
    from memlab.probes.fit import fit_readings

    validate(opts)
    claim_out(run_dir)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    t_start = time.perf_counter()
    with T.Timer() as t_load:
        encoder = _load(opts, encoder)
    train_ids, eval_ids = probe_data(opts, encoder)
    with T.Timer() as t_enc:
        z_train, z_eval, cached = encode_data(opts, encoder, train_ids, eval_ids)
    ckey = control_key(opts, encoder.tokenizer, train_ids, eval_ids)
    fit = fit_readings(opts, encoder.tokenizer, train_ids, eval_ids, z_train, z_eval, control_cache, ckey,
                       bow=opts.bow)
    report = build_report(opts, encoder, train_ids, eval_ids, z_eval, fit)
    if not opts.model.startswith("synthetic:"):
        report["data_split"] = T.split_description(opts.corpus)
    report["timing"].update(load_s=t_load.seconds, encode_s=t_enc.seconds, encode_cached=cached,
                            total_s=time.perf_counter() - t_start)
    if note := eval_note(opts, eval_ids):
        report["eval_note"] = note  # and report["n_eval"] is the number scored
    if opts.n_train < SATURATION_HINT:
        report["budget_note"] = (f"n_train={opts.n_train} is below {SATURATION_HINT}: on the measured learning curves "
                                 "(docs/probes.md) readings still rise with more chunks; read this as a lower bound")
    fitted = FittedProbe(encoder, fit["_decoder"])
    if run_dir is not None:
        out = Path(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        fitted.save(out, encoder_spec(opts))
        write_report(report, out)
        report["run_dir"] = str(out)
    if verbose:
        print(format_summary(report))
    report["_fitted"] = fitted
    return report


def probe(model: str = "minilm", out: str | Path | None = None, config: str | Path | None = None, encoder=None,
          **options) -> dict:
    """Python API: probe ``model`` with ProbeOptions fields as keywords; returns the report dict.

    ``report["_fitted"]`` is the fitted probe (an EmbeddingSpace).
    """
    opts = load_options(config, model=model, **options)
    return run_probe(opts, out, encoder=encoder)

