"""Retention against length: the same text cut at several lengths, each length fitted and scored, on one model load.

:func:`run_length_sweep` (``memlab probe --seq-len 8,16,32,64,128``, ``seq_len: [8, 16, 32]`` in a probe config,
``seq_len=8,16`` as ``key=value``, ``memlab.probes.probe("minilm", seq_len=[8, 16])``):

1. the encoder is loaded once, for the longest length; a length it cannot read (longer than its positions) is
   refused, naming its limit, before any text is cut;
2. the text is cut at every length before anything is encoded (a length whose chunks do not fit is refused before
   any compute): at each length the chunks come from the same corpus splits (training chunks from the train split,
   held-out chunks from ``eval_split``), its units read in the same seeded order, and every length has the same
   number of training chunks (``n_train``) and of held-out chunks (``n_eval``, or, when the held-out split holds
   fewer chunks of the longest length, that number at every length). ``chunk_by=words``: lengths are words, every
   model reads the same chunk texts at each length; ``chunk_by=tokens``: lengths are tokens of the model's own
   tokenizer. ``max_chunk_tokens`` (a cap for one length) is refused in a length sweep;
3. each length is encoded and fitted by :func:`memlab.probes.run.fit_one`: its probe decoder and its own control
   (controls are not shared across lengths: the chunks differ), the read-outs and the intervals.

Each row of ``curve.json`` is one length's report: the sweep row of :mod:`memlab.probes.sweeps.layers` (every reading with
its paired bootstrap interval under ``readings``, the retention line, the decoders' scores) and the length's own
columns: target tokens per held-out chunk (``tokens_per_chunk``, what bits per token divide by), the encoder's
(``encoder_tokens_per_chunk``), bits per token, and ``text`` (how that length was cut). The decoders are not saved.
``curve.md`` is the table and ``plots/length_curve.png`` the curve: bits per chunk and per token with their interval
bands, and token accuracy, teacher-forced and free-running, of the probe (with bands) and of its control.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from memlab.errors import ModelError
from memlab.plots import finish_axes, pyplot, save_figure
from memlab.probes.chunks import cut as chunks
from memlab.probes.options import seq_lens
from memlab.probes.readings import cell
from memlab.probes.run import claim_out, control_key, cut_text, fit_length, fit_one, load_encoder, resolved
from memlab.probes.encoders.encode import encode_data
from memlab.probes.sweeps.layers import _row
from memlab.probes.decoder.fit import Timer
from memlab.probes.decoder.records import ControlStore, FitData
from memlab.progress import WorkLine
from memlab.rundir import write_atomic
from memlab.tables import markdown_table

SAME_TEXT = ("each length cut from the same corpus splits (training chunks from the train split, held-out chunks "
             "from {split}), the units read in the same seeded order, with the same number of training and held-out "
             "chunks at every length")
"""How the sweep's text is the same at every length (curve.json's ``same_text``)."""


def check_limit(encoder, lengths: list[int], chunk_by: str) -> None:
    """Refuse a length the encoder cannot read: longer than its positions (less its special tokens). A chunk of
    ``n`` words holds at least ``n`` tokens; a word length within the limit whose chunks hold more tokens is refused
    when the text is cut."""
    limit = None if getattr(encoder, "resizable", False) else getattr(encoder, "max_length", None)
    too_long = [n for n in lengths if limit is not None and n > limit]
    if not too_long:
        return
    special = len(getattr(encoder, "prefix", [])) + len(getattr(encoder, "suffix", []))
    unit = "tokens" if chunk_by == "tokens" else "words (each at least one token)"
    positions = f"its {limit + special} positions less {special} special tokens" if special else "its positions"
    raise ModelError(f"seq_len {too_long[0]} {unit} is longer than {encoder.name} reads: {limit} tokens "
                     f"({positions}); keep every length at most {limit}")


def cut_lengths(opts, encoder, lengths: list[int]) -> dict[int, tuple]:
    """Every length's (options, training ids, held-out ids, text, targets), cut before anything is encoded, with the
    same number of held-out chunks at every length (the fewest any length's split holds, at most ``n_eval``)."""
    n_eval = opts.n_eval
    while True:
        data = {}
        for n in reversed(lengths):  # the longest first: its held-out split holds the fewest chunks
            o = replace(opts, seq_len=n, n_eval=n_eval, calibrate=False)
            data[n] = (o, *cut_text(o, encoder))
            n_eval = min(n_eval, int(data[n][2].shape[0]))
        if all(d[2].shape[0] == n_eval for d in data.values()):
            return {n: data[n] for n in lengths}


def length_row(n: int, o, text, tg, fit) -> dict:
    """One length's row: the sweep row of ``fit``, its tokens per chunk, bits per token and how it was cut."""
    r = fit.readings
    mean_tokens = float(chunks.mask_of(tg.eval_ids).sum(1).float().mean())  # target tokens per held-out chunk
    row = {"seq_len": n, "chunk_by": o.chunk_by, "tokens_per_chunk": mean_tokens,
           "encoder_tokens_per_chunk": text.accounting.mean_tokens, "n_train": int(tg.train_ids.shape[0]),
           "n_eval": int(tg.eval_ids.shape[0]), **_row(fit).to_dict()}
    if "bits_per_token" in r:
        row["bits_per_token"] = r["bits_per_token"]["value"]
    row["text"] = text.accounting.to_dict()
    return row


def _cells(row: dict) -> list[str]:
    """A row's cells: each reading with its interval (a gain without evidence reads ``no evidence``)."""
    def c(key: str, gain: bool) -> str:  # the reading with its interval, else the row's bare value
        return cell(row["readings"].get(key), gain, 2 if "bits" in key else 3) or _num(row.get(key))

    return [str(row["seq_len"]), f"{row['tokens_per_chunk']:.1f}", c("bits_per_chunk", True),
            c("bits_per_token", True), c("token_accuracy", False), _num(row.get("control_accuracy")),
            c("free_running_accuracy", False), _num(row.get("control_free_running_accuracy")),
            f"{row['seconds'] + row.get('encode_s', 0.0):.0f}"]


def _num(v) -> str:
    return "" if v is None else f"{v:.3f}"


def table(rows: list[dict], chunk_by: str) -> str:
    """curve.md's table: one line per length."""
    head = [f"seq_len ({chunk_by})", "tokens per chunk", "bits per chunk", "bits per token", "token accuracy",
            "control", "free-running accuracy", "control free-running", "seconds"]
    return markdown_table(head, (_cells(r) for r in rows))


def _band(ax, xs, rows, key: str, style: str, label: str, color: str) -> None:
    """``key``'s reading against length, with its interval as a band (rows without it are left out)."""
    got = [(x, r["readings"][key]) for x, r in zip(xs, rows) if key in r["readings"]]
    if not got:
        return
    x = [g[0] for g in got]
    ax.plot(x, [g[1]["value"] for g in got], style, ms=4, label=label, color=color)
    ax.fill_between(x, [g[1]["low"] for g in got], [g[1]["high"] for g in got], color=color, alpha=0.2)


def plot(rows: list[dict], path: Path, title: str, chunk_by: str) -> Path:
    """Retention against length: bits per chunk and per token (left), token accuracy teacher-forced and
    free-running, probe and control (right); bands are the readings' intervals."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["seq_len"] for r in rows]
    _band(left, xs, rows, "bits_per_chunk", "-o", "bits per chunk", "C0")
    twin = left.twinx()  # bits per token on its own scale
    _band(twin, xs, rows, "bits_per_token", "-s", "bits per token", "C1")
    twin.set_ylabel("bits per token")
    for ax in (left, twin):  # both bit scales from zero (or below it, with a line at zero)
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0.0), max(hi, 0.0))
        if lo < 0:
            ax.axhline(0, color="grey", lw=0.8)
    for key, style, label, color in (("token_accuracy", "-^", "probe, teacher-forced", "C0"),
                                     ("free_running_accuracy", "-v", "probe, free-running", "C1")):
        _band(right, xs, rows, key, style, label, color)
    for key, style, label, color in (("control_accuracy", "--", "control, teacher-forced", "C0"),
                                     ("control_free_running_accuracy", ":", "control, free-running", "C1")):
        if all(r.get(key) is not None for r in rows):
            right.plot(xs, [r[key] for r in rows], style, label=label, color=color)
    right.set_ylim(0, 1)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
    finish_axes(left, f"seq_len ({chunk_by})", "bits per chunk")
    if left.get_legend() is not None:  # both axes' lines in one legend, drawn above both
        left.get_legend().remove()
    handles = [h for a in (left, twin) for h in a.get_legend_handles_labels()[0]]
    if handles:
        twin.legend(handles, [h.get_label() for h in handles], fontsize=8)
    finish_axes(right, f"seq_len ({chunk_by})", "token accuracy", legend_fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)


def _write(run_dir, payload: dict, text: str) -> None:
    out = Path(run_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    title = f"{payload['model']} ({payload['pool']}): retention against length"
    payload["plot"] = str(plot(payload["rows"], out / "plots" / "length_curve.png", title, payload["chunk_by"]))
    write_atomic(out / "curve.json", json.dumps(payload, indent=2))
    write_atomic(out / "curve.md", text + "\n")


def run_length_sweep(opts, run_dir=None, encoder=None) -> dict:
    """Retention against length on one model load (see the module doc); returns curve.json's content."""
    t0 = time.perf_counter()
    opts = resolved(opts)
    lengths = seq_lens(opts)
    claim_out(run_dir)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    with Timer() as t_load:  # once, for the longest length
        encoder = load_encoder(replace(opts, seq_len=lengths[-1]), encoder)
    check_limit(encoder, lengths, opts.chunk_by)
    data = cut_lengths(opts, encoder, lengths)
    encoder = fit_length(encoder, max((d[1] for d in data.values()), key=lambda x: x.shape[1]))
    rows, encode_s = [], 0.0
    for n, (o, train_ids, eval_ids, text, tg) in data.items():
        line = WorkLine(f"[seq_len {n}]", f"encoding and fitting {train_ids.shape[0]} + {eval_ids.shape[0]} chunks...")
        try:
            with Timer() as t_enc:
                z_tr, z_ev, _ = encode_data(o, encoder, train_ids, eval_ids)  # (N, D), (M, D)
            encode_s += t_enc.seconds
            fit = fit_one(o, FitData(tg.tokenizer, tg.train_ids, tg.eval_ids, z_tr, z_ev, tg.table),
                          ControlStore(None, control_key(o, tg.tokenizer, tg.train_ids, tg.eval_ids, tg.table), o.model), text,
                          sequence=o.sequence, fit_readouts=bool(o.readouts))
        except BaseException:
            line.close()  # the length's line stays: the error printed next is about it
            raise
        rows.append({**length_row(n, o, text, tg, fit), "encode_s": t_enc.seconds})
        r = rows[-1]
        seq = (f"; token accuracy {r['token_accuracy']:.3f}" + (f" (free-running {r['free_running_accuracy']:.3f})"
               if r.get("free_running_accuracy") is not None else "") if fit.probe else "")
        line.done(f"{r['tokens_per_chunk']:.1f} tokens per chunk: {fit.retention}{seq}, "
                  f"{r['seconds'] + r['encode_s']:.0f}s")
    first = data[lengths[0]][0]
    payload = {"model": opts.model, "pool": getattr(encoder, "pool", None), "chunk_by": opts.chunk_by,
               "lengths": lengths, "rows": rows, "n_train": first.n_train, "n_eval": first.n_eval,
               "same_text": SAME_TEXT.format(split=opts.eval_split), "load_s": t_load.seconds,
               "encode_s": encode_s, "total_s": time.perf_counter() - t0}
    text = table(rows, opts.chunk_by)
    if run_dir is not None:
        _write(run_dir, payload, text)
        payload["run_dir"] = str(run_dir)
    print(text)
    return payload
