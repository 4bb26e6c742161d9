"""Probe sweeps on one encoder pass: retention by layer, and the learning curve over training chunks.

* :func:`run_layer_sweep` (``memlab probe --layers all`` or ``--layers 0,3,6``):
  every listed layer is captured in the same forward pass, and a bag-of-words
  read-out (and, with ``sequence=True``, the sequence probe and its shared
  control) is fitted per layer. Writes ``layers.json``, ``layers.md`` and
  ``plots/layers.png`` (retention by depth).
* :func:`run_learning_curve` (``memlab probe --n-train 1000,4000,16000``): the
  chunks are encoded once at the largest size; each size fits the sequence
  probe, its control and the bag-of-words read-out on the first ``n`` chunks,
  scored on the same held-out chunks. Writes ``curve.json``, ``curve.md`` and
  ``plots/learning_curve.png``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from memlab.errors import ModelError
from memlab.plots import finish_axes, pyplot, save_figure
from memlab.probes.sweeps import compare
from memlab.probes.chunks.cut import ProbeText
from memlab.probes.chunks.batch import fill_pad, mask_of
from memlab.probes.chunks.targets import make_targets
from memlab.probes.options import option_values
from memlab.probes.parts import check_readouts, readout_columns, readout_context
from memlab.probes.readings import Reading
from memlab.probes.report.report import Fit, jsonable
from memlab.probes.decoder.table import with_table
from memlab.probes.run import control_key, fit_one, setup
from memlab.probes.encoders.encode import encode_data
from memlab.probes.decoder.fit import Timer
from memlab.probes.decoder.records import ControlStore, FitData
from memlab.rundir import write_atomic
from memlab.tables import markdown_table

SCORES = ("token_accuracy", "free_running_accuracy", "token_set_f1", "sentence_bleu", "exact_match", "ce",
          "control_accuracy", "control_token_set_f1", "information_gain", "control_free_running_accuracy")
"""A row's decoder scores, in its JSON's order (a row without a sequence probe has none of them)."""


@dataclass
class SweepRow:
    """One fit's row of a sweep (:func:`_row`): its readings with their intervals, the retention line, the decoders'
    scores, the read-outs' own columns and the fit's seconds; the sweep sets what leads it (``layer`` or
    ``n_train``) and, in a comparison, the ``method`` and its :class:`memlab.probes.sweeps.compare.Cells`."""

    readings: dict[str, Reading]
    retention: str
    seconds: float
    columns: dict = field(default_factory=dict)
    """The read-outs' own columns (each read-out's ``columns``)."""
    bits: Reading | None = None
    """The bits per chunk the embedding adds (None: no control)."""
    sequence: bool = False
    """Whether the fit has a sequence probe (its scores below are set)."""
    token_accuracy: float | None = None
    free_running_accuracy: float | None = None
    token_set_f1: float | None = None
    sentence_bleu: float | None = None
    exact_match: float | None = None
    ce: float | None = None
    control_accuracy: float | None = None
    control_token_set_f1: float | None = None
    control_free_running_accuracy: float | None = None
    information_gain: float | None = None
    layer: int | None = None
    n_train: int | None = None
    method: str | None = None
    cells: Any = None

    def get(self, column: str):
        """A table column's value (None: not in this row)."""
        return self.to_dict().get(column)

    def to_dict(self) -> dict:
        """The row as layers.json and curve.json hold it."""
        lead = {k: getattr(self, k) for k in ("layer", "n_train") if getattr(self, k) is not None}
        row = {**lead, **self.columns}
        if self.bits is not None:
            row.update(bits_per_chunk=self.bits.value, bits_low=self.bits.low, bits_high=self.bits.high)
        row.update(readings=jsonable(self.readings), retention=self.retention)
        if self.sequence:
            row.update({k: getattr(self, k) for k in SCORES})
        row["seconds"] = self.seconds
        if self.method is not None:
            row.update(method=self.method, **self.cells.to_dict())
        return row


def _row(fit: Fit) -> SweepRow:
    """A sweep's row: the readings (with their intervals) of one fit."""
    row = SweepRow(fit.readings, fit.retention, sum(v for v in fit.timing.values()),
                   columns={k: v for name, result in fit.readouts.items()  # each read-out's own columns
                            for k, v in readout_columns(name, result.values).items()},
                   bits=fit.readings.get("bits_per_chunk"))
    if fit.probe:
        p, c = fit.probe, fit.control
        row.sequence = True
        row.token_accuracy, row.free_running_accuracy = p["token_accuracy"], p.get("free_running_accuracy")
        row.token_set_f1, row.sentence_bleu, row.exact_match = p["token_set_f1"], p["sentence_bleu"], p["exact_match"]
        row.ce, row.information_gain = p["ce"], fit.information_gain
        if c:
            row.control_accuracy, row.control_token_set_f1 = c["token_accuracy"], c["token_set_f1"]
            row.control_free_running_accuracy = c.get("free_running_accuracy")
    return row


def _own_columns(fit: Fit) -> list[str]:
    """The columns the read-outs of ``fit`` add to a sweep's table (each read-out's own)."""
    return [k for name, result in fit.readouts.items() for k in readout_columns(name, result.values)]


def _table(rows: list[SweepRow], first: str, own: list[str]) -> str:
    """The sweep's markdown table: ``first``, the bits, the read-outs' own columns ``own``, the decoder's."""
    cols = [first, "bits_per_chunk", "bits_low", "bits_high", *own, "token_accuracy", "control_accuracy",
            "free_running_accuracy", "control_free_running_accuracy", "token_set_f1", "control_token_set_f1",
            "sentence_bleu", "information_gain", "seconds"]
    dicts = [r.to_dict() for r in rows]
    cols = [c for c in cols if any(r.get(c) is not None for r in dicts)]
    return markdown_table(cols, ([f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
                                 for r in dicts))


def _plot(rows: list[SweepRow], x: str, path: Path, title: str, own: list[str], logx: bool = False) -> Path:
    """Shares against ``x``: the read-outs' own columns ``own`` (their recovered shares and priors) and the
    decoder's."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [getattr(r, x) for r in rows]
    series = [(k, ":" if k.endswith("_prior") else "-o", k.replace("_", " ")) for k in own
              if k.endswith(("_recovered", "_prior"))]
    series += [("token_set_f1", "-s", "probe TF1"), ("control_token_set_f1", "--", "control TF1"),
              ("token_accuracy", "-^", "probe token accuracy"),
              ("free_running_accuracy", "-v", "probe free-running accuracy"),
              ("information_gain", "-d", "information gain")]
    for key, style, label in series:
        if all(r.get(key) is not None for r in rows):
            ax.plot(xs, [r.get(key) for r in rows], style, ms=4, label=label)
    if logx:
        ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    finish_axes(ax, x.replace("_", " "), "share", legend_fontsize=8)
    return save_figure(fig, path)


def _write(run_dir, stem: str, payload: dict, table: str, plot_fn) -> None:
    if run_dir is None:
        return
    out = Path(run_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{stem}.json", json.dumps(payload, indent=2))
    write_atomic(out / f"{stem}.md", table + "\n")
    payload["plot"] = str(plot_fn(out / "plots"))


def encode_layers(encoder, ids: torch.Tensor, layers: list[int], batch_size: int) -> torch.Tensor:
    """(N, T) chunks -> (N, L, D) pooled states of each layer, one forward pass per batch."""
    pad_id = getattr(encoder.tokenizer, "pad_token_id", None) or 0
    out = [encoder.encode_layers(fill_pad(b, pad_id), mask_of(b).long(), layers)
           for b in ids.split(batch_size)]
    return torch.cat(out)  # (N, L, D)


def run_layer_sweep(opts, layers: str, run_dir=None, sequence: bool = False, log=print, encoder=None) -> dict:
    """Retention by depth: one read-out per layer of ``opts.model`` (see the module doc); ``encoder``: one already
    loaded."""
    t0 = time.perf_counter()
    opts, encoder, train_ids, eval_ids, text, _, tg = setup(opts, run_dir, encoder)
    if not hasattr(encoder, "encode_layers"):
        raise ModelError(f"--layers needs a transformers model; {opts.model} has no layers")
    idx = encoder.layer_index(layers)
    with Timer() as t_enc:
        z_tr = encode_layers(encoder, train_ids, idx, opts.encode_batch_size)  # (N, L, D)
        z_ev = encode_layers(encoder, eval_ids, idx, opts.encode_batch_size)  # (M, L, D)
    if not opts.readouts and not sequence:
        raise ModelError("a layer sweep without read-outs and without the sequence probe has nothing to fit")
    log(f"encoded {len(idx)} layers of {train_ids.shape[0] + eval_ids.shape[0]} chunks in {t_enc.seconds:.0f}s")
    rows, cache, own = [], {}, {}
    key = control_key(opts, tg.tokenizer, tg.train_ids, tg.eval_ids, tg.table)
    for j, layer in enumerate(idx):
        o = replace(opts, layer=layer, calibrate=False)
        fit = fit_one(o, FitData(tg.tokenizer, tg.train_ids, tg.eval_ids, z_tr[:, j], z_ev[:, j], tg.table),
                      ControlStore(cache, key, o.model), text, sequence=sequence, fit_readouts=bool(opts.readouts))
        rows.append(replace(_row(fit), layer=layer))
        own.update(dict.fromkeys(_own_columns(fit)))
        log(f"layer {layer}: {fit.retention}")
    payload = {"model": opts.model, "pool": encoder.pool, "layers": idx, "rows": [r.to_dict() for r in rows],
               "n_train": opts.n_train,
               "text": text.accounting.to_dict(),
               "n_eval": opts.n_eval, "seq_len": opts.seq_len, "encode_s": t_enc.seconds,
               "total_s": time.perf_counter() - t0}
    table = _table(rows, "layer", list(own))
    _write(run_dir, "layers", payload, table, lambda d: _plot(rows, "layer", d / "layers.png",
                                                               f"{opts.model} ({encoder.pool}): retention by layer",
                                                               list(own)))
    log(table)
    return payload


def _compared(opts, encoder, train_ids, eval_ids, text: ProbeText, targets) -> list[tuple]:
    """(method spec or None, its options, its targets) of every method a curve fits: ``opts`` itself, or each
    method of ``opts.compare`` as validation resolved it (``opts.methods``, at the curve's largest size), its
    read-out checked before anything is encoded."""
    if opts.compare is None:
        return [(None, opts, targets)]
    out = []
    for m, o in opts.methods:
        o = replace(o, n_train=opts.n_train)
        if o.readouts:
            check_readouts(o, readout_context(o, encoder.tokenizer, text.texts, encoder.dim))
        out.append((m.spec, o, with_table(o, encoder, make_targets(o, encoder, train_ids, eval_ids, *text.texts))))
    return out


def run_learning_curve(opts, sizes: list[int], run_dir=None, log=print, encoder=None) -> dict:
    """Probe readings against the number of training chunks, on one encoder pass (see the module doc); with
    ``opts.compare``, every compared method at every size (:mod:`memlab.probes.sweeps.compare`); ``encoder``: one
    already loaded."""
    opts = replace(opts, n_train=max(sizes))
    t0 = time.perf_counter()
    # chunks come in a seeded random order: a prefix is a sample
    opts, encoder, train_ids, eval_ids, text, _, tg = setup(opts, run_dir, encoder)
    methods = _compared(opts, encoder, train_ids, eval_ids, text, tg)
    with Timer() as t_enc:
        z_tr, z_ev, _ = encode_data(opts, encoder, train_ids, eval_ids)
    rows, own = [], {}
    for n in sizes:
        for spec, m, tgm in methods:
            o = replace(m, n_train=n, calibrate=False)
            t = tgm.first(n)
            key = control_key(o, t.tokenizer, t.train_ids, t.eval_ids, t.table)
            fit = fit_one(o, FitData(t.tokenizer, t.train_ids, t.eval_ids, z_tr[:n], z_ev, t.table),
                          ControlStore(None, key, o.model), replace(text, train_texts=text.train_texts[:n]),
                          sequence=o.sequence, fit_readouts=bool(o.readouts))
            rows.append(replace(_row(fit), n_train=n))
            own.update(dict.fromkeys(_own_columns(fit)))
            r = rows[-1]
            if spec is not None:
                r.method, r.cells = spec, compare.cells(fit, o, t)
                log(f"{spec}, n_train {n}: {fit.retention}, {r.seconds:.0f}s")
                continue
            seq = (f"; token accuracy {r.token_accuracy:.3f} (free-running {r.free_running_accuracy:.3f}), "
                   f"TF1 {r.token_set_f1:.3f} (control {r.control_token_set_f1 or 0:.3f})" if fit.probe
                   else "; read-outs alone")
            log(f"n_train {n}: {fit.retention}{seq}, {r.seconds:.0f}s")
    payload = {"model": opts.model, "sizes": sizes, "rows": [r.to_dict() for r in rows], "n_eval": opts.n_eval,
               "seq_len": opts.seq_len,
               "text": text.accounting.to_dict(),
               "encode_s": t_enc.seconds, "total_s": time.perf_counter() - t0}
    if opts.compare is None:
        table = _table(rows, "n_train", list(own))
        plot = lambda d: _plot(rows, "n_train", d / "learning_curve.png", f"{opts.model}: learning curve",  # noqa: E731
                               list(own), logx=True)
    else:
        payload["methods"] = [{"method": spec, "targets": tgm.name, "options": {
            k: v for k, v in option_values(m).items() if v != getattr(opts, k)}} for spec, m, tgm in methods]
        table = compare.table(rows)
        title = f"{opts.model}: {len(methods)} method{'s' * (len(methods) > 1)}, one encoder pass"
        plot = lambda d: compare.plot(payload["rows"], d / "compare.png", title)  # noqa: E731
    _write(run_dir, "curve", payload, table, plot)
    log(table)
    return payload
