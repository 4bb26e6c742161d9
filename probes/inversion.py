"""The inversion probe: how much of its input does a frozen model keep in one embedding?

A frozen encoder (any HF model read at one layer and pooled, or any memlab
space: a registered encoder kind, :mod:`memlab.probes.parts`) embeds chunks of
``seq_len`` words of held-out Austen text (cut once as text, the same for every
model: :mod:`memlab.probes.chunks`), once per chunk; a fresh Llama-style decoder
(:mod:`memlab.probes.decoder`) trains on that cache to rebuild the tokens in the
encoder's own tokenizer. By default
it reads the true previous tokens (``inputs="teacher"``), the embedding is
added to every position (``conditioning="unrolled"``) and a position-shared
linear read-out of it is added to every position's logits (``bag_head``);
``inputs="blank"`` blanks the token inputs, so all it knows of a chunk comes
through the embedding (see docs/probes.md for the measured choice). A tenth of the training chunks is held back for early stopping
(the best epoch's weights are kept). A *control* decoder, same size and
budget, trains on a constant embedding (the mean training embedding): it
measures what the decoder guesses without the embedding (with blank inputs:
the most likely token at each position; with teacher forcing: language).
Report (:class:`memlab.probes.result.ProbeReport`): first the bits per chunk and per character the
embedding adds over the control, every reading with its paired bootstrap interval and a retention line
(:mod:`memlab.probes.intervals`); token accuracy, CE, entropy ratio ``H_r = 1 - CE / ln V``, token-set
F1, sentence BLEU and exact match of the greedy reconstruction, the
information gain ``(CE_control - CE_probe) / CE_control``, what limits the
reading (order or content), accuracy by position, reconstructions, the
bag-of-words read-out (:mod:`memlab.probes.bow`) and the calibration status
(:mod:`memlab.probes.fit`).

Python::

    from memlab.probes import probe
    report = probe("minilm", pool="mean", n_train=2000, out="runs/probe-minilm")
    report.retention, report.readings["bits_per_chunk"], report.probe["token_accuracy"]
"""

from __future__ import annotations

import sys
import time
from functools import lru_cache
from pathlib import Path

import torch

from memlab.errors import MemlabError
from memlab.probes import train as T
from memlab.probes.report import format_summary, peak_memory_mb, write_report
from memlab.probes.result import ProbeReport
from memlab.probes.space import FittedProbe
from memlab.probes.options import ProbeOptions, load_options, train_sizes, validate  # noqa: F401  (re-exported)


def encoder_spec(opts: ProbeOptions, encoder=None) -> dict:
    spec = {"model": opts.model, "layer": opts.layer, "pool": opts.pool, "final_norm": opts.final_norm,
            "random_init": opts.random_init, "special_tokens": opts.special_tokens, "dtype": opts.encoder_dtype}
    if opts.model.startswith("synthetic:"):  # the concat code's width depends on it
        spec["max_len"] = int(getattr(encoder, "max_length", None) or opts.seq_len)
    return spec


ENCODER_SIDE = {"model", "layer", "pool", "final_norm", "random_init", "special_tokens", "encoder_dtype", "readouts",
                "device_map", "max_memory", "offload_dir",
                "align_target", "calibrate", "cache_dir", "progress", "threads", "n_examples", "device",
                "encode_batch_size",
                "ci_level", "ci_resamples", "layers", "layers_sequence"}
"""Options a control run does not depend on."""


def control_key(opts: ProbeOptions, tokenizer, train_ids: torch.Tensor, eval_ids: torch.Tensor) -> str:
    """What a control run depends on: the token data, the vocabulary size and the decoder's options. Not the
    embedding's width: the decoder draws every weight the width does not shape first, from the seed, and the
    control's standardised embedding is exactly zero, so its run is the same for any width, and a probe starts
    from the very weights (and batches, and dropout draws) of its control: they differ by the embedding alone."""
    decoder_side = {k: v for k, v in vars(opts).items() if k not in ENCODER_SIDE}
    return T.content_hash({**decoder_side, "vocab_size": len(tokenizer)}, train_ids, eval_ids)


def _load(opts: ProbeOptions, encoder):
    """``encoder``, or the one the registered encoder kind that takes ``opts.model`` builds."""
    from memlab.errors import ModelError
    from memlab.probes.parts import encoder_kind

    if encoder is not None:
        return encoder
    kind = encoder_kind(opts.model)
    if kind is None:
        raise ModelError(f"no registered encoder kind takes '{opts.model}'")
    placed = {k: getattr(opts, k) for k in ("device_map", "max_memory", "offload_dir") if getattr(opts, k) is not None}
    return kind.impl.load(opts.model, layer=opts.layer, pool=opts.pool, final_norm=opts.final_norm,
                          random_init=opts.random_init, special_tokens=opts.special_tokens, device=opts.device,
                          dtype=opts.encoder_dtype, max_len=opts.seq_len, **placed)


def _cut(seq_len: int, n_train: int, n_eval: int, eval_split: str, corpus: str, seed: int,
         max_chunk_tokens: int | None, counter) -> tuple[list[str], list[str]]:
    """The training and held-out chunk texts, each capped at ``max_chunk_tokens`` of ``counter`` when given."""
    texts_tr = T.probe_texts(seq_len, n_train, "train", corpus, seed)
    texts_ev = T.probe_texts(seq_len, n_eval, eval_split, corpus, seed, at_most=True)
    if max_chunk_tokens is not None:  # every chunk fits max_chunk_tokens of the counting tokenizer
        from memlab.probes.chunks import cap_tokens

        texts_tr, texts_ev = (cap_tokens(x, counter, max_chunk_tokens) for x in (texts_tr, texts_ev))
    return texts_tr, texts_ev


@lru_cache(maxsize=4)
def _cut_by_name(seq_len: int, n_train: int, n_eval: int, eval_split: str, corpus: str, seed: int,
                 max_chunk_tokens: int | None, chunk_tokenizer: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """:func:`_cut` with the counting tokenizer named (``chunk_tokenizer``), once per process: the entries of a
    comparison (``memlab quickstart``) read the same chunk texts, so they are cut once."""
    from memlab.probes.loading import load_tokenizer

    counter = load_tokenizer(chunk_tokenizer) if max_chunk_tokens is not None else None
    tr, ev = _cut(seq_len, n_train, n_eval, eval_split, corpus, seed, max_chunk_tokens, counter)
    return tuple(tr), tuple(ev)


def _words_data(opts: ProbeOptions, encoder):
    from memlab.probes.chunks import PAD, tokenize_chunks

    args = (opts.seq_len, max(train_sizes(opts)), opts.n_eval, opts.eval_split, opts.corpus, opts.seed,
            opts.max_chunk_tokens)
    if opts.max_chunk_tokens is None or opts.chunk_tokenizer:
        texts_tr, texts_ev = (list(x) for x in _cut_by_name(*args, opts.chunk_tokenizer))
    else:  # capped in the encoder's own tokenizer
        texts_tr, texts_ev = _cut(*args, encoder.tokenizer)
    limit = None if getattr(encoder, "resizable", False) else encoder.max_length
    tr, cut_tr = tokenize_chunks(texts_tr, encoder.tokenizer, limit)
    ev, cut_ev = tokenize_chunks(texts_ev, encoder.tokenizer, limit)
    default_len = opts.seq_len == ProbeOptions.seq_len  # a length the user chose is refused below, never cut
    if cut_tr + cut_ev and opts.max_chunk_tokens is None and limit and default_len:  # the encoder's cap, as a note
        print(f"memlab: note: {cut_tr + cut_ev} chunks of {opts.seq_len} words are longer than {encoder.name} allows "
              f"({limit} tokens); each keeps the words that fit (max_chunk_tokens={limit}; lower seq_len to keep "
              "whole chunks)", file=sys.stderr)
        opts.max_chunk_tokens = limit  # the report's options and text say how the chunks were cut
        return _words_data(opts, encoder)
    if cut_tr + cut_ev:
        raise MemlabError(f"{cut_tr + cut_ev} chunks of {opts.seq_len} words are longer than {encoder.name} allows "
                          f"({encoder.max_length} tokens besides its special tokens); lower seq_len")
    t = max(tr.shape[1], ev.shape[1])
    pad = lambda x: torch.nn.functional.pad(x, (0, t - x.shape[1]), value=PAD)  # noqa: E731
    return pad(tr), pad(ev), texts_tr, texts_ev, cut_tr + cut_ev


def probe_data(opts: ProbeOptions, encoder):
    """Training (N, T) and held-out (M, T) chunks in the encoder's tokenizer (PAD after each chunk's tokens), how
    the text was cut (``report.text``; ``chars``: characters of each held-out chunk) and the decoder's targets
    (:class:`memlab.probes.targets.Targets`: the same chunks, or their texts in the decoder's own tokenizer)."""
    from memlab.probes.targets import make_targets

    from memlab.probes.chunks import chunk_chars, mask_of, rendering, rows

    tok = encoder.tokenizer
    if opts.chunk_by == "tokens":
        if encoder.max_length is not None and opts.seq_len > encoder.max_length:
            raise MemlabError(f"seq_len={opts.seq_len} is longer than {encoder.name} allows ({encoder.max_length} "
                              "tokens besides its special tokens)")
        train_ids = T.probe_chunks(tok, opts.seq_len, max(train_sizes(opts)), "train", opts.corpus, opts.seed)
        eval_ids = T.probe_chunks(tok, opts.seq_len, opts.n_eval, opts.eval_split, opts.corpus, opts.seed,
                                  at_most=True)
        texts, cut = tok.batch_decode(rows(eval_ids), skip_special_tokens=True), 0
        texts_tr = tok.batch_decode(rows(train_ids), skip_special_tokens=True)
        chars = chunk_chars(eval_ids, tok)
        render = "the model's own tokens (chunk_by=tokens: each model reads other text)"
    else:
        train_ids, eval_ids, texts_tr, texts, cut = _words_data(opts, encoder)
        chars, render = [len(x) for x in texts], rendering(texts, eval_ids, tok)
    note = eval_note(opts, eval_ids)  # fewer held-out chunks than asked: all are scored, and the report says so
    if note:
        print(f"memlab: warning: {note}", file=sys.stderr)
    n_tok = mask_of(eval_ids).sum(1).float()  # (M,)
    per_chunk = f"{opts.seq_len} {opts.chunk_by}"
    if opts.max_chunk_tokens is not None:
        per_chunk += (f", trailing words dropped to fit {opts.max_chunk_tokens} tokens of "
                      f"{opts.chunk_tokenizer or 'its own tokenizer'}")
    text = {"chunk_by": opts.chunk_by, "per_chunk": per_chunk,
            "mean_chars": sum(chars) / len(chars), "mean_tokens": float(n_tok.mean()),
            "max_tokens": int(eval_ids.shape[1]), "truncated_chunks": int(cut), "rendering": render, "chars": chars,
            "_texts": (texts_tr, texts)}
    targets = make_targets(opts, encoder, train_ids, eval_ids, texts_tr, texts)
    text["targets"] = targets.describe(texts)
    return train_ids, eval_ids, text, targets  # (N, T), (M, T)


PRIVATE_TEXT = ("chars", "_texts")
"""Keys of probe_data's ``text`` that the report leaves out (per-chunk characters, the chunk texts)."""


def public_text(text: dict) -> dict:
    """``text`` as the report holds it (without :data:`PRIVATE_TEXT`)."""
    return {k: v for k, v in text.items() if k not in PRIVATE_TEXT}


def eval_note(opts: ProbeOptions, eval_ids: torch.Tensor) -> str | None:
    """What the report says when the held-out split holds fewer chunks than ``n_eval`` (None when it does not)."""
    m = int(eval_ids.shape[0])
    if m >= opts.n_eval:
        return None
    return (f"n_eval={opts.n_eval} asked, but the {opts.eval_split} split of '{opts.corpus}' holds {m} chunks of "
            f"{opts.seq_len} {opts.chunk_by}: all {m} are scored")


def encode_data(opts: ProbeOptions, encoder, train_ids, eval_ids):
    """Embeddings (N, D), (M, D) of the chunks (disk-cached under ``opts.cache_dir``) and whether both were cached."""
    key = {**encoder_spec(opts, encoder), "enc": encoder.describe()}
    kw = dict(batch_size=opts.encode_batch_size, progress=opts.progress)
    z_train, hit1 = T.cached_encode(encoder, train_ids, key, opts.cache_dir, desc="encode train", **kw)  # (N, D)
    z_eval, hit2 = T.cached_encode(encoder, eval_ids, key, opts.cache_dir, desc="encode held-out", **kw)  # (M, D)
    return z_train, z_eval, bool(hit1 and hit2)


def fit_length(encoder, ids: torch.Tensor):
    """A resizable encoder (a synthetic one) rebuilt for chunks of ``ids.shape[1]`` tokens when it is shorter."""
    if getattr(encoder, "resizable", False) and encoder.max_length < ids.shape[1]:
        return encoder.resized(ids.shape[1])
    return encoder


def build_report(opts: ProbeOptions, encoder, train_ids, eval_ids, fit: dict, text: dict, targets) -> ProbeReport:
    """The typed report from the fitted read-outs ``fit`` (:func:`memlab.probes.fit.fit_readings`) of ``targets``."""
    from memlab.probes.chunks import rows

    tok, dec = encoder.tokenizer, fit["_decoder"]
    k = min(opts.n_examples, eval_ids.shape[0]) if dec is not None else 0
    recon = (fit.get("_reconstruction") or [])[:k]
    inputs = tok.batch_decode(rows(eval_ids[:k]), skip_special_tokens=True)
    return ProbeReport(
        model=opts.model if not opts.random_init else f"{opts.model} (random init)",
        encoder=encoder.describe(), options=dict(vars(opts)), vocab_size=len(targets.tokenizer), seq_len=opts.seq_len,
        n_train=int(train_ids.shape[0]), n_eval=int(eval_ids.shape[0]),
        text=public_text(text),
        decoder=None if dec is None else {"kind": opts.decoder, "targets_in": targets.name,
                                          "parameters": sum(p.numel() for p in dec.parameters()),
                                          "trained_parameters": sum(p.numel() for p in dec.parameters()
                                                                    if p.requires_grad),
                                          "kept_vocab": dec.num_kept, "conditioning": opts.conditioning,
                                          "inputs": opts.inputs, "bag_head": bool(dec.config.bag_head),
                                          "input_dropout": float(dec.config.input_dropout),
                                          "repeat_penalty": float(dec.config.repeat_penalty)},
        **{k_: fit[k_] for k_ in ("probe", "control", "control_shared_with", "information_gain", "limited_by", "bow",
                                  "readouts", "readings", "retention", "calibration", "history")},
        examples=[{"input": a, "reconstruction": b} for a, b in zip(inputs, recon)],
        timing=dict(fit["timing"]), memory=peak_memory_mb())


def claim_out(run_dir: str | Path | None) -> None:
    """A used or unwritable output folder is refused before any compute; it stays locked until the process ends."""
    if run_dir is not None:
        from memlab.rundir import claim

        claim(run_dir, fresh=True, what="probe")


def setup(opts: ProbeOptions, run_dir, encoder=None):
    """Checks, the output folder's claim, threads, the encoder and the chunks: what every probe run starts with."""
    validate(opts)
    claim_out(run_dir)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    with T.Timer() as t_load:
        encoder = _load(opts, encoder)
    train_ids, eval_ids, text, targets = probe_data(opts, encoder)
    encoder = fit_length(encoder, train_ids)
    if opts.readouts:  # a read-out that cannot read these chunks is refused before anything is encoded
        from memlab.probes.fit import readout_context
        from memlab.probes.parts import check_readouts

        check_readouts(opts, readout_context(opts, encoder.tokenizer, text["_texts"], encoder.dim))
    return encoder, train_ids, eval_ids, text, t_load.seconds, targets


def run_probe(opts: ProbeOptions, run_dir: str | Path | None = None, encoder=None, verbose: bool = False,
              control_cache: dict | None = None) -> ProbeReport:
    """Probe ``opts.model`` (or a ready ``encoder``); writes report.json, plots and the decoder into ``run_dir``.

    ``control_cache``: a dict shared by several probes; a control run already made on the same chunks with the
    same decoder options is reused from it (the report names the probe that trained it).
    """
    from memlab.probes.fit import fit_readings

    t_start = time.perf_counter()
    encoder, train_ids, eval_ids, text, load_s, tg = setup(opts, run_dir, encoder)
    with T.Timer() as t_enc:
        z_train, z_eval, cached = encode_data(opts, encoder, train_ids, eval_ids)
    ckey = control_key(opts, tg.tokenizer, tg.train_ids, tg.eval_ids)
    fit = fit_readings(opts, tg.tokenizer, tg.train_ids, tg.eval_ids, z_train, z_eval, control_cache, ckey,
                       sequence=opts.sequence, bow=bool(opts.readouts), chars=text["chars"], texts=text["_texts"])
    report = build_report(opts, encoder, train_ids, eval_ids, fit, text, tg)
    if not opts.model.startswith("synthetic:"):
        report.data_split = T.split_description(opts.corpus)
    report.timing.update(load_s=load_s, encode_s=t_enc.seconds, encode_cached=cached,
                         total_s=time.perf_counter() - t_start)
    if note := eval_note(opts, eval_ids):
        report.eval_note = note  # and report.n_eval is the number scored
    default_n = ProbeOptions.n_train
    if (n := max(train_sizes(opts))) < default_n:
        report.budget_note = (f"n_train={n} is below the default {default_n}: on the measured learning curves "
                              "(docs/probes.md) readings still rise with more chunks; read this as a lower bound")
    fitted = FittedProbe(encoder, fit["_decoder"], tg.tokenizer) if fit["_decoder"] is not None else None
    if run_dir is not None:
        out = Path(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        if fitted is not None:
            # a scratch decoder's targets in a named tokenizer: the reloaded probe decodes in it too
            fitted.save(out, {**encoder_spec(opts, encoder), "target_tokenizer": opts.target_tokenizer})
        report.run_dir = str(out)
        write_report(report, out)
    if verbose:
        print(format_summary(report))
    report.fitted = fitted
    return report


def probe(model: str = "minilm", out: str | Path | None = None, config: str | Path | None = None, encoder=None,
          **options) -> ProbeReport:
    """Python API: probe ``model`` with ProbeOptions fields as keywords; returns the typed report.

    ``report.fitted`` is the fitted probe (an EmbeddingSpace).
    """
    opts = load_options(config, model=model, **options)
    return run_probe(opts, out, encoder=encoder)
