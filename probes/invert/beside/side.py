"""The trained probe beside the inversion: the same held-out chunks read by a probe run's saved decoder (and its
control, where the run kept one), per chunk, for the one table of :mod:`memlab.probes.invert.beside.table`.

:func:`read_probe_side` reloads the run (:func:`memlab.probes.decoder.fitted.load_probe`), cuts its text again with its own
options (:func:`memlab.probes.run.cut_text`: the very chunks it held out, checked against the examples its report
shows), and reads the first ``n`` of them as the probe defines its readings:

* teacher-forced hits and the summed NLL (nats) of each chunk (:func:`memlab.probes.decoder.fit.evaluate`);
* the greedy reconstruction (:func:`memlab.probes.readings.reconstruct_ids`, the decoder's repetition penalty
  included): free-running hits, token-set F1 and exact match.

The control (the same decoder trained on a constant embedding) is the one the run kept in its ``cache_dir``
(:class:`memlab.probes.decoder.control_cache.ControlCache`, keyed as the run keyed it): its numbers per chunk are read
back, not recomputed. A run without one gives no control row and no bits per chunk, and the table says why.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from memlab.errors import ConfigError, DataError, ModelError
from memlab.probes.chunks.batch import rows
from memlab.probes.decoder.fitted import load_probe
from memlab.probes.options import ProbeOptions, load_options
from memlab.probes.parts import GENERIC, encoder_kind, get_part
from memlab.probes.readings import free_running_hits, reconstruct_ids, token_set_f1_per_chunk
from memlab.probes.run import control_key, cut_text, disk_controls
from memlab.probes.encoders.encode import encode_all
from memlab.probes.decoder.fit import evaluate


@dataclass
class DecoderReads:
    """One decoder's numbers on each of the chunks (arrays over chunks)."""

    nll: np.ndarray
    """Summed NLL of each chunk's tokens, nats."""
    hits: np.ndarray
    """Teacher-forced argmax hits."""
    free_hits: np.ndarray
    """Positions where the greedy reconstruction holds the true token."""
    tf1: np.ndarray
    """Token-set F1 of the greedy reconstruction."""
    exact: np.ndarray
    """Whether the greedy reconstruction is the chunk, token for token."""
    ids: list[list[int]] | None = None
    """The greedy reconstructions' ids (None: not kept, a control read back from its cache)."""


@dataclass
class ProbeSide:
    """A probe run's held-out chunks (the first ``n``) and its decoder's and control's reading of them."""

    run: str
    texts: list[str]
    ids: list[list[int]]
    probe: DecoderReads
    control: DecoderReads | None
    control_note: str
    """Where the control's numbers come from, or why there are none."""
    facts: dict
    """The probe's setting: model, layer, pooling, encoder dtype, decoder kind, training chunks."""


def run_options(report: dict, run: str = "the probe run"):
    """The run's options as :func:`memlab.probes.options.load_options` gives them: the values its report records
    that differ from the defaults (a part's options at their defaults are what an unchosen part has). A generic
    setting that the run's decoder or encoder part does not honour is left out: the probe switched it off itself
    (:func:`memlab.probes.parts.unhonoured`), and given back it would read as set by the user and be refused."""
    saved = dict(report["options"])
    saved.update(saved.pop("part_options", None) or {})
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else
                (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                for f in dataclasses.fields(ProbeOptions)}
    keep = {k: v for k, v in saved.items() if k not in defaults or v != defaults[k] or k in ("model", "seq_len")}
    try:
        parts = [("decoder", get_part("decoder", str(saved.get("decoder", defaults["decoder"]))))]
    except ConfigError:
        raise ModelError(f"--probe {run}: its decoder part '{saved.get('decoder')}' is not registered: install (or "
                         "import) the package that registers it") from None
    kind = encoder_kind(str(saved.get("model", defaults["model"])))
    parts += [("encoder", kind)] if kind is not None else []
    off = {k for what, part in parts for k in set(GENERIC[what]) - set(part.honoured(what))}
    return load_options(None, **{k: v for k, v in keep.items() if k not in off})


def _reads(dec, z: torch.Tensor, ids: torch.Tensor) -> DecoderReads:
    scores = evaluate(dec, z, ids).chunks
    pred = reconstruct_ids(dec, z, ids.shape[1])  # (n, T)
    free = np.asarray(free_running_hits(pred, ids), dtype=np.float64)
    tokens = np.asarray(scores.tokens, dtype=np.float64)
    got = [p[: len(t)] for p, t in zip(pred.tolist(), rows(ids))]
    return DecoderReads(np.asarray(scores.nll, dtype=np.float64), np.asarray(scores.hits, dtype=np.float64), free,
                        np.asarray(token_set_f1_per_chunk(pred, ids)), free == tokens, got)


def _kept_control(opts, tg, n: int) -> tuple[DecoderReads | None, str]:
    """The control the run kept in its cache_dir, its numbers on the first ``n`` held-out chunks; or None and why."""
    if not opts.control:
        return None, "the run trained no control (control=false)"
    if not opts.cache_dir or not Path(opts.cache_dir).is_dir():
        return None, ("the run kept no control on disk (memlab probe --cache-dir keeps it): no control row and no "
                      "bits per chunk")
    cache = disk_controls(opts, tg)
    key = control_key(opts, tg.tokenizer, tg.train_ids, tg.eval_ids, tg.table)
    if key not in cache:
        return None, (f"no control of this run in {opts.cache_dir} (removed, or kept on another compute side): no "
                      "control row and no bits per chunk")
    ch = cache[key].scores.chunks
    if ch is None or ch.free_hits is None or ch.tf1 is None:
        return None, f"the control kept in {opts.cache_dir} has no per-chunk reconstruction scores"
    tokens = np.asarray(ch.tokens[:n], dtype=np.float64)
    free = np.asarray(ch.free_hits[:n], dtype=np.float64)
    return (DecoderReads(np.asarray(ch.nll[:n], dtype=np.float64), np.asarray(ch.hits[:n], dtype=np.float64), free,
                         np.asarray(ch.tf1[:n], dtype=np.float64), free == tokens),
            f"the control the run kept in {opts.cache_dir} (its numbers on these chunks, read back)")


def read_probe_side(run: str, n: int, device: str = "cpu") -> ProbeSide:
    """The first ``n`` held-out chunks of the probe run in ``run`` and the probe's (and its control's) reading of
    them; one ModelError/DataError line when the run cannot be read beside an inversion."""
    report = json.loads((Path(run) / "report.json").read_text())
    opts = run_options(report, run)
    fitted = load_probe(run)
    _, eval_ids, text, tg = cut_text(opts, fitted.encoder)
    shown = [e.get("input") for e in report.get("examples") or []]
    again = fitted.tokenizer.batch_decode(rows(eval_ids[: len(shown)]), skip_special_tokens=True)
    if shown != again:
        raise DataError(f"--probe {run}: its held-out chunks cut again differ from those its report shows (another "
                        "corpus or memlab version?); the table needs the very chunks the probe read")
    if tg.eval_ids.shape != eval_ids.shape or not torch.equal(tg.eval_ids, eval_ids):
        raise ModelError(f"--probe {run}: its decoder rebuilds the text in other tokens ({tg.name}) than the model "
                         "reads; the table needs both instruments on the same tokens")
    ids = eval_ids[:n]  # (n, T)
    dec = fitted.decoder.to(device)
    z = encode_all(fitted.encoder, ids)  # (n, D)
    probe = _reads(dec, z, ids)
    control, note = _kept_control(opts, tg, n)
    enc = fitted.encoder.describe()
    weights = next(fitted.encoder.model.parameters(), None) if hasattr(fitted.encoder, "model") else None
    facts = {"model": opts.model, "layer": enc.get("layer"), "pool": enc.get("pool"),
             "encoder_dtype": str(weights.dtype).removeprefix("torch.") if weights is not None else opts.encoder_dtype,
             "decoder": report.get("decoder"), "n_train": report.get("n_train"), "n_eval": report.get("n_eval"),
             "epochs": opts.epochs}
    return ProbeSide(str(run), list(text.eval_texts[:n]), rows(ids), probe, control, note, facts)
