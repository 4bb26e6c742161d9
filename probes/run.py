"""One probe run, top-down: how much of its input does a frozen model keep in one embedding?

:func:`run_probe` reads as the steps of a probe, each one call into the module that owns it:

1. load the encoder (:func:`load_encoder`: the registered encoder kind that takes ``opts.model``,
   :mod:`memlab.probes.parts`);
2. cut the text (:func:`memlab.probes.chunks.cut.probe_data`: chunks of ``seq_len`` words of held-out Austen text, cut
   once as text, the same for every model, and the decoder's targets, :func:`memlab.probes.chunks.targets.make_targets`);
3. encode once (:func:`encode_data`, disk-cached with ``cache_dir``);
4. fit the decoders, read out, score and put intervals on the readings (:func:`fit_one`: the probe decoder and its
   control trained as one group, :mod:`memlab.probes.decoder.fit`; the read-outs, :func:`memlab.probes.parts.fit_readout`;
   the paired bootstrap intervals, :mod:`memlab.probes.readings`; the calibration,
   :func:`memlab.probes.encoders.synthetic.calibration`);
5. build and write the report (:class:`memlab.probes.report.report.ProbeReport`, :mod:`memlab.probes.report.report`).

The sweeps (layers, learning curve, comparison: :mod:`memlab.probes.sweeps.layers`; lengths: :mod:`memlab.probes.sweeps.lengths`)
loop over the same :func:`fit_one`.

By default the decoder reads the true previous tokens (``inputs="teacher"``), the embedding is added to every
position (``conditioning="unrolled"``) and a position-shared linear read-out of it is added to every position's
logits (``bag_head``); ``inputs="blank"`` blanks the token inputs, so all it knows of a chunk comes through the
embedding. A tenth of the training chunks is held back for early stopping (the best epoch's weights are kept). A
*control* decoder, same size and budget, trains on a constant embedding (the mean training embedding): it measures
what the decoder guesses without the embedding. The report leads with the bits per chunk and per character the
embedding adds over the control, every reading with its paired bootstrap interval and a retention line.

Python::

    from memlab.probes import probe
    report = probe("minilm", pool="mean", n_train=2000, out="runs/probe-minilm")
    report.retention, report.readings["bits_per_chunk"], report.probe["token_accuracy"]
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch

from memlab.devices import launched, resolve_device
from memlab.errors import ConfigError, ModelError
from memlab.probes.chunks import cut as chunks
from memlab.probes.encoders import shards
from memlab.probes.chunks.cut import ProbeText
from memlab.probes.chunks.targets import make_targets
from memlab.probes.decoder.control_cache import ControlCache, compute_side
from memlab.probes.decoder.fitted import FittedProbe
from memlab.probes.decoder.fitloop import train_readouts
from memlab.probes.options import EXPERIMENTS, ProbeOptions, experiment, load_options, option_values, resolved, train_sizes
from memlab.probes.parts import (
    check_readouts,
    encoder_kind,
    fit_readout,
    get_part,
    part_options,
    readout_context,
    readout_gains,
    takes,
    takes_context,
)
from memlab.probes.readouts.online_code import readings_of as online_readings
from memlab.probes.readouts.pointwise import pointwise
from memlab.probes.readings import Reading, limit_line, readings, retention
from memlab.probes.report.report import Fit, ProbeReport, ReadoutResult, format_summary, peak_memory_mb, write_report
from memlab.probes.encoders.synthetic import calibration
from memlab.probes.decoder.fit import Timer, build_decoder, fit_decoders, information_gain
from memlab.probes.decoder.records import ControlStore, FitData
from memlab.probes.decoder.table import table_key, with_table
from memlab.probes.readouts.saturation import learning_curve, limit_note
from memlab.rundir import claim
from memlab.probes.encoders.encode import ENCODER_SIDE, content_hash, encode_data, encoder_spec


def control_key(opts: ProbeOptions, tokenizer, train_ids: torch.Tensor, eval_ids: torch.Tensor,
                table: torch.Tensor | None = None) -> str:
    """What a control run depends on: the token data, the vocabulary size and the decoder's options. Not the
    embedding's width: the decoder draws every weight the width does not shape first, from the seed, and the
    control's standardised embedding is exactly zero, so its run is the same for any width, and a probe starts
    from the very weights (and batches, and dropout draws) of its control: they differ by the embedding alone.
    ``table``: the token table the decoder's output layer maps (an encoder's fact the control reads too)."""
    decoder_side = {k: v for k, v in option_values(opts).items() if k not in ENCODER_SIDE}
    tab = {"token_table": table_key(table)} if table is not None else {}
    return content_hash({**decoder_side, "vocab_size": len(tokenizer), **tab}, train_ids, eval_ids)


def rebuild_decoder(opts: ProbeOptions, tokenizer, train_ids: torch.Tensor, embed_dim: int,
                    table: torch.Tensor | None = None):
    """A fresh decoder of ``opts`` for embeddings of width ``embed_dim`` on the probe's device: what a control kept on
    disk is loaded into (:class:`~memlab.probes.decoder.control_cache.ControlCache`)."""
    dec = build_decoder(embed_dim, tokenizer, train_ids, opts, compact=opts.compact_vocab, table=table)
    return dec.to(resolve_device(opts.device))


def load_encoder(opts: ProbeOptions, encoder=None):
    """``encoder``, or the one the registered encoder kind that takes ``opts.model`` builds."""
    if encoder is not None:
        return encoder
    kind = encoder_kind(opts.model)
    if kind is None:
        raise ModelError(f"no registered encoder kind takes '{opts.model}'")
    placed = {k: getattr(opts, k) for k in ("device_map", "max_memory", "offload_dir") if getattr(opts, k) is not None}
    if kind.options is not None and takes(kind.impl.load, "options"):  # the kind's own options
        placed["options"] = part_options(opts, kind)
    encoder = kind.impl.load(opts.model, layer=opts.layer, pool=opts.pool, final_norm=opts.final_norm,
                             random_init=opts.random_init, special_tokens=opts.special_tokens, device=opts.device,
                             dtype=opts.encoder_dtype, max_len=opts.seq_len, **placed)
    if opts.pool is not None and hasattr(encoder, "pool_options"):  # the chosen pooling's own options
        encoder.pool_options = part_options(opts, get_part("pool", opts.pool))
    return encoder


def fit_length(encoder, ids: torch.Tensor):
    """A resizable encoder (a synthetic one) rebuilt for chunks of ``ids.shape[1]`` tokens when it is shorter."""
    if getattr(encoder, "resizable", False) and encoder.max_length < ids.shape[1]:
        return encoder.resized(ids.shape[1])
    return encoder


def interval_readings(opts, fit: Fit, eval_ids, tok, chars=None) -> dict[str, Reading]:
    """:func:`memlab.probes.readings.readings` of a fit's numbers per held-out chunk (its decoders' and its
    read-outs')."""
    chars = chars if chars is not None else chunks.chunk_chars(eval_ids, tok)
    per = {k: v.chunks for k, v in fit.readouts.items() if v.chunks is not None}
    return readings(fit.probe_chunks, fit.control_chunks, chars, n_resamples=opts.ci_resamples, level=opts.ci_level,
                    seed=opts.seed, readouts=per)


def _decoded(opts, tok, train_ids, eval_ids, fit_readouts: bool):
    """(training, held-out) texts as the chunks' tokens decode, when a chosen read-out reads text; else None."""
    if not (fit_readouts and any(takes_context(get_part("readout", n).impl) for n in opts.readouts)):
        return None
    return tuple(tok.batch_decode(chunks.rows(x), skip_special_tokens=True) for x in (train_ids, eval_ids))


def fit_one(opts, data: FitData, control: ControlStore | None = None, text: ProbeText | None = None,
            sequence: bool = True, fit_readouts: bool = True) -> Fit:
    """Fit one set of cached embeddings (``data``): the sequence decoder and its control (``sequence``; the control
    with ``opts.control``, looked up and kept in ``control``), the read-outs (``fit_readouts``: ``opts.readouts``),
    the intervals, the calibration and the limit line. A probe run, every layer of a layer sweep and every size (and
    method) of a learning curve is one call.

    ``text``: the chunks' texts and the characters of each held-out chunk (default: as their tokens decode).
    """
    out = Fit()
    tok, train_ids, eval_ids, z_train, z_eval = data.tok, data.train_ids, data.eval_ids, data.z_train, data.z_eval
    chars, texts = (text.chars, text.texts) if text is not None else (None, None)
    names = list(opts.readouts) if fit_readouts else []
    # read-outs trained by gradient are members of the fit loop: beside the probe decoders, else alone
    members = {n: part.member(z_train, train_ids, eval_ids, part_options(opts, part), opts, opts.device)
               for n in names if (part := get_part("readout", n)).member is not None}
    if sequence:
        got = fit_decoders(opts, data, control=(control or ControlStore(owner=opts.model)) if opts.control else None,
                           readouts=tuple(members.values()))
        out.decoder, out.history["probe"], out.timing["train_s"] = got.probe.decoder, got.probe.history, \
            got.probe.seconds
        probe = got.probe.scores
        out.probe, out.probe_chunks, out.reconstruction = probe.metrics, probe.chunks, probe.reconstruction
        if opts.control:
            c = got.control
            out.history["control"], out.timing["control_s"], out.control_shared_with = c.history, c.seconds, \
                c.shared_with
            out.control, out.control_chunks = dict(c.scores.metrics), c.scores.chunks  # a cached control's: a copy
            out.information_gain = information_gain(out.probe["ce"], out.control["ce"])
        out.limited_by = limit_line(out.probe, out.control)
    context = readout_context(opts, tok, texts or _decoded(opts, tok, train_ids, eval_ids, fit_readouts),
                              int(z_train.shape[1]))
    if untrained := [m for m in members.values() if not m.history]:
        train_readouts(untrained, int(train_ids.shape[0]), opts, progress=opts.progress)
    for name in names:  # each read-out's result dict typed as it comes in
        out.readouts[name] = ReadoutResult.split(name, members[name].result(z_eval, eval_ids) if name in members else
                                                 fit_readout(train_ids, eval_ids, z_train, z_eval, seed=opts.seed,
                                                             name=name, context=context, device=opts.device))
        out.timing["bow_s"] += out.readouts[name].values["seconds"]
    out.readings = interval_readings(opts, out, eval_ids, tok, chars)
    out.retention = retention(out.readings, opts.ci_level, readout_gains(out.readouts))
    out.calibration = calibration(opts, tok, train_ids, eval_ids, out)
    return out


def build_report(opts: ProbeOptions, encoder, train_ids, eval_ids, fit: Fit, text: ProbeText, targets) -> ProbeReport:
    """The typed report from one :func:`fit_one` of ``targets``; its options say the token cap the text was cut to
    (``max_chunk_tokens``)."""
    tok, dec = encoder.tokenizer, fit.decoder
    k = min(opts.n_examples, eval_ids.shape[0]) if dec is not None else 0
    recon = (fit.reconstruction or [])[:k]
    inputs = tok.batch_decode(chunks.rows(eval_ids[:k]), skip_special_tokens=True)
    return ProbeReport(
        model=opts.model if not opts.random_init else f"{opts.model} (random init)",
        encoder=encoder.describe(), options={**option_values(opts), "max_chunk_tokens": text.cap},
        vocab_size=len(targets.tokenizer), seq_len=opts.seq_len, n_train=int(train_ids.shape[0]),
        n_eval=int(eval_ids.shape[0]), text=text.accounting,
        decoder=None if dec is None else {"kind": opts.decoder, "targets_in": targets.name,
                                          "parameters": sum(p.numel() for p in dec.parameters()),
                                          "trained_parameters": sum(p.numel() for p in dec.parameters()
                                                                    if p.requires_grad),
                                          "kept_vocab": dec.num_kept, "conditioning": opts.conditioning,
                                          "inputs": opts.inputs, "bag_head": bool(dec.config.bag_head),
                                          "input_dropout": float(dec.config.input_dropout),
                                          "repeat_penalty": float(dec.config.repeat_penalty),
                                          "token_table_dim": int(getattr(dec.config, "token_table_dim", 0))},
        **{k_: getattr(fit, k_) for k_ in ("probe", "control", "control_shared_with", "information_gain", "limited_by",
                                  "readouts", "readings", "retention", "calibration", "history")},
        examples=[{"input": a, "reconstruction": b} for a, b in zip(inputs, recon)],
        timing=dict(fit.timing), memory=peak_memory_mb())


def claim_out(run_dir: str | Path | None) -> None:
    """A used or unwritable output folder is refused before any compute; it stays locked until the process ends."""
    if run_dir is not None:
        claim(run_dir, fresh=True, what="probe")


def setup(opts: ProbeOptions, run_dir, encoder=None):
    """Checks, the output folder's claim, threads, the encoder and the chunks: what every probe run starts with.
    Returns (the resolved options, the encoder, training ids, held-out ids, the text (:class:`ProbeText`, its
    targets described), the encoder's load seconds, the decoder's targets)."""
    opts = resolved(opts)  # checked once: options from load_options are not checked again
    if isinstance(opts.seq_len, list):
        raise ConfigError("a list of 'seq_len' lengths is a length sweep: run it with memlab.probes.probe, "
                          "memlab.probes.sweeps.lengths.run_length_sweep or memlab probe --seq-len")
    claim_out(run_dir)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    with Timer() as t_load:
        encoder = load_encoder(opts, encoder)
    # a length the user chose is refused when the encoder cannot read its chunks whole; the default one is cut to fit
    train_ids, eval_ids, text, targets = cut_text(opts, encoder, cap_to_fit="seq_len" not in opts.explicit)
    return opts, fit_length(encoder, train_ids), train_ids, eval_ids, text, t_load.seconds, targets


def cut_text(opts: ProbeOptions, encoder, cap_to_fit: bool = False):
    """The chunks in the encoder's tokens (training (N, T), held-out (M, T)), their text (:class:`ProbeText`, its
    targets described) and the decoder's targets; a chosen read-out that cannot read these chunks is refused here,
    before anything is encoded."""
    train_ids, eval_ids, text = chunks.probe_data(opts, encoder, cap_to_fit=cap_to_fit)
    targets = with_table(opts, encoder, make_targets(opts, encoder, train_ids, eval_ids, *text.texts))
    text.accounting.targets = targets.describe(text.eval_texts)
    if opts.readouts:  # the width the read-outs see: the encoder's at this length
        dim = fit_length(encoder, train_ids).dim
        check_readouts(opts, readout_context(opts, encoder.tokenizer, text.texts, dim))
    return train_ids, eval_ids, text, targets


def _notes(report: ProbeReport, opts: ProbeOptions, eval_ids) -> None:
    """The report's notes: how the corpus was split, fewer held-out chunks than asked, a small training budget."""
    kind = encoder_kind(opts.model)
    if kind is None or kind.impl.known_content is None:  # an encoder of known content reads no corpus split
        report.data_split = chunks.split_description(opts.corpus, opts.text_field)
    if note := chunks.eval_note(opts, eval_ids):
        report.eval_note = note  # and report.n_eval is the number scored
    default_n = ProbeOptions.n_train
    if (n := max(train_sizes(opts))) < default_n:
        report.budget_note = (f"n_train={n} is below the default {default_n}: on the measured learning curves "
                              "(docs/results/probes.md) readings still rise with more chunks; read this as a lower "
                              "bound")


def _write(report: ProbeReport, opts: ProbeOptions, encoder, run_dir) -> None:
    """The fitted probe (when there is a decoder), report.json and the plots into ``run_dir``."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    if report.fitted is not None:
        # a scratch decoder's targets in a named tokenizer: the reloaded probe decodes in it too
        report.fitted.save(out, {**encoder_spec(opts, encoder), "target_tokenizer": opts.target_tokenizer})
    report.run_dir = str(out)
    write_report(report, out)


def disk_controls(opts: ProbeOptions, tg, memory: dict | None = None) -> ControlCache:
    """The control runs kept in ``opts.cache_dir`` for the decoder targets ``tg`` (``memory``: the dict shared by
    the probes of this process, in front of the disk), each rebuilt with these options' decoder."""
    return ControlCache(opts.cache_dir, partial(rebuild_decoder, opts, tg.tokenizer, tg.train_ids, table=tg.table), memory,
                        side=compute_side(resolve_device(opts.device)))


def curve_of(opts: ProbeOptions, data: FitData, fit: Fit, control_cache, text: ProbeText):
    """The run's learning curve with its verdict and its online code (:func:`memlab.probes.readouts.saturation.learning_curve`),
    or (None, None) without a sequence probe and its control."""
    if not (opts.sequence and opts.control and fit.probe_chunks is not None and fit.control_chunks is not None):
        return None, None
    kept = ((fit.probe or {}).get("start") or {}).get("kept")
    return learning_curve(opts, data, fit.probe_chunks, fit.control_chunks, kept, control_key, control_cache,
                          opts.model, text.chars, fit.timing.get("train_s", 0.0) + fit.timing.get("control_s", 0.0))


def run_probe(opts: ProbeOptions, run_dir: str | Path | None = None, encoder=None, verbose: bool = False,
              control_cache: dict | None = None) -> ProbeReport | None:
    """Probe ``opts.model`` (or a ready ``encoder``); writes report.json, plots and the decoder into ``run_dir``.

    ``control_cache``: a dict shared by several probes; a control run already made on the same chunks with the
    same decoder options is reused from it (the report names the probe that trained it). With ``opts.cache_dir``
    control runs are also kept on disk there and reused by later runs (:mod:`memlab.probes.decoder.control_cache`).
    In a launch of several processes (:mod:`memlab.probes.encoders.shards`) the encoder pass is shared out and the main
    process fits and reports; the others return None.
    """
    t_start = time.perf_counter()
    env = None  # one process of a launch of several (None: the only one)
    if launched():
        env, opts = shards.start(opts)
    # load the encoder and cut the text
    main = env is None or env.is_main
    opts, encoder, train_ids, eval_ids, text, load_s, tg = setup(opts, run_dir if main else None, encoder)
    # encode once
    with Timer() as t_enc:
        z_train, z_eval, cached = encode_data(opts, encoder, train_ids, eval_ids, env)
    if env is not None:  # the main process fits and reports; the others' share is done
        processes = shards.describe(env)
        if not env.is_main:
            return None
    if opts.cache_dir and opts.sequence and opts.control:  # control runs kept on disk too
        control_cache = disk_controls(opts, tg, control_cache)
    # fit the decoders, read out, score, put intervals on the readings
    data = FitData(tg.tokenizer, tg.train_ids, tg.eval_ids, z_train, z_eval, tg.table)
    fit = fit_one(opts, data, ControlStore(control_cache, control_key(opts, tg.tokenizer, tg.train_ids, tg.eval_ids,
                                                                      tg.table), opts.model),
                  text, sequence=opts.sequence, fit_readouts=bool(opts.readouts))
    # the learning curve and its verdict, and the online code, from fits on prefixes of the training chunks
    sat, code = curve_of(opts, data, fit, control_cache, text)
    # the report
    report = build_report(opts, encoder, train_ids, eval_ids, fit, text, tg)
    report.saturation, report.online_code, report.limited_by = sat, code, limit_note(report.limited_by, sat)
    report.readings.update(online_readings(code))
    report.pointwise = pointwise(fit.probe_chunks, fit.control_chunks, text.eval_texts)
    if sat:
        report.timing["curve_s"] = sat["seconds"]
    _notes(report, opts, eval_ids)
    report.timing.update(load_s=load_s, encode_s=t_enc.seconds, encode_cached=cached,
                         total_s=time.perf_counter() - t_start)
    if env is not None:
        report.timing["processes"] = processes
    if fit.decoder is not None:
        report.fitted = FittedProbe(encoder, fit.decoder, tg.tokenizer)
    if run_dir is not None:
        _write(report, opts, encoder, run_dir)
    if verbose:
        print(format_summary(report))
    return report


def probe(model: str = "minilm", out: str | Path | None = None, config: str | Path | None = None, encoder=None,
          **options) -> ProbeReport:
    """Python API: probe ``model`` with ProbeOptions fields as keywords; returns the typed report.

    ``report.fitted`` is the fitted probe (an EmbeddingSpace). One probe only: options that ask for a sweep (a layer
    sweep, a length sweep, a learning curve, a comparison) are refused here; :func:`memlab.probes.probe` runs them
    (:mod:`memlab.probes.experiment`, the one dispatch, as ``memlab probe`` does).
    """
    opts = load_options(config, model=model, **options)
    if (kind := experiment(opts)) != "probe":
        raise ConfigError(f"these options ask for a {EXPERIMENTS[kind]}: run it with memlab.probes.probe or memlab "
                          "probe (memlab.probes.run.probe runs one probe)")
    return run_probe(opts, out, encoder=encoder)
