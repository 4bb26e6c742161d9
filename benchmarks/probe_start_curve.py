"""Where the probe starts, against the number of training chunks: from a random start, or as its trained control.

For each model and each number of training chunks (the first N of one draw, one encoder pass per model), on the
quickstart's chunks and decoder settings (``memlab.app.quickstart.FULL``, the bag-head decoder alone):

* the control, trained from its random start (its first run);
* the probe from a random start (``scratch``), read against that first run;
* for each share ``s`` of the learning rate: the control trained a second time from its first run with its weights at
  ``s`` (``contained_lr=s``), and the probe started as the control (:func:`memlab.probes.decoder.fit.contain`), its
  embedding pathway at the full rate and the control's weights at ``s``, read against that second run.

Each candidate's bits per chunk over the held-out chunks, with its 95 % paired bootstrap interval, its token accuracy
and its best epoch; the fit keeps whichever candidate lies furthest below its own control on held-back chunks, so this
shows what each start contributes at each size (docs/results/probes.md).

    python benchmarks/probe_start_curve.py --out runs/start-curve                       # minilm, memory_ae, concat
    python benchmarks/probe_start_curve.py --out /tmp/sc --models minilm --n-train 200 --shares 1,0.1 epochs=1

Writes ``start_curve.json`` and ``start_curve.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from memlab.app.quickstart import FULL
from memlab.config import apply_overrides
from memlab.devices import native_bf16
from memlab.errors import MemlabError
from memlab.flops import measure_matmul_flops
from memlab.probes import run as probe_run
from memlab.probes.chunks.cut import chunk_chars
from memlab.probes.decoder.fitloop import train_decoders
from memlab.probes.options import load_options
from memlab.probes.readings import readings
from memlab.probes.decoder.fit import _held_back_ce, _new_decoder, contain, contained_shares, evaluate
from memlab.probes.decoder.records import FitData
from memlab.tables import markdown_table

MODELS = {"minilm": {"pool": "mean"}, "space:memory_ae": {}, "synthetic:concat": {}}


def _read(dec, z_eval, eval_ids, control, chars, opts, hist) -> dict:
    """A candidate's held-out reading against ``control``'s numbers per chunk."""
    got = evaluate(dec, z_eval, eval_ids)
    r = readings(got.chunks, control, chars, n_resamples=opts.ci_resamples, level=opts.ci_level, seed=opts.seed)
    best = next((h for h in reversed(hist) if "best_step" in h), {})
    return {"bits_per_chunk": r["bits_per_chunk"].to_dict(), "token_accuracy": got.metrics["token_accuracy"],
            "held_back_ce": _held_back_ce(hist), "best_step": best.get("best_step"), "steps": best.get("step")}


def one_size(opts, tok, train_ids, eval_ids, z_train, z_eval, shares: list[float], chars) -> dict:
    """Every candidate at one number of training chunks."""
    t0 = time.perf_counter()
    const, const_eval = (z_train.mean(0, keepdim=True).expand_as(z) for z in (z_train, z_eval))
    start = _new_decoder(opts, FitData(tok, train_ids, train_ids, const, const))
    (h1,), _ = train_decoders([start], [const], train_ids, opts, desc="control (first run)")
    first = evaluate(start, const_eval, eval_ids)
    scratch = _new_decoder(opts, FitData(tok, train_ids, train_ids, z_train, z_train))
    (hs,), _ = train_decoders([scratch], [z_train], train_ids, opts, desc="probe from a random start")
    out = {"n_train": int(train_ids.shape[0]), "control_token_accuracy": first.metrics["token_accuracy"],
           "scratch": _read(scratch, z_eval, eval_ids, first.chunks, chars, opts, hs)}
    for s in shares:
        o = replace(opts, contained_lr=s)
        second = contain(_new_decoder(o, FitData(tok, train_ids, train_ids, const, const)), start)
        (h2,), _ = train_decoders([second], [const], train_ids, o, epoch0=True, desc=f"control (second run, {s})",
                                  lr_scales=[contained_shares(second, o)])
        probe = contain(_new_decoder(o, FitData(tok, train_ids, train_ids, z_train, z_train)), start)
        (hp,), _ = train_decoders([probe], [z_train], train_ids, o, epoch0=True, desc=f"contained probe ({s})",
                                  lr_scales=[contained_shares(probe, o)])
        out[f"contained_{s:g}"] = _read(probe, z_eval, eval_ids, evaluate(second, const_eval, eval_ids).chunks,
                                        chars, o, hp)
    out["seconds"] = time.perf_counter() - t0
    return out


def one_model(model: str, sizes: list[int], shares: list[float], overrides: list[str], threads: int | None) -> dict:
    kw = apply_overrides({**FULL, **MODELS.get(model, {}), "progress": False}, overrides)  # the user's win
    kw["n_train"] = max(sizes)
    if threads:
        kw["threads"] = threads
    opts = load_options(model=model, **kw)
    opts, encoder, train_ids, eval_ids, text, _, targets = probe_run.setup(opts, None)
    z_train, z_eval, _ = probe_run.encode_data(opts, encoder, train_ids, eval_ids)
    tok = targets.tokenizer
    chars = chunk_chars(targets.eval_ids, tok)
    rows = []
    for n in sizes:
        tg = targets.first(n)
        rows.append(one_size(opts, tok, tg.train_ids, tg.eval_ids, z_train[:n], z_eval, shares, chars))
        print(json.dumps({"model": model, **rows[-1]}), flush=True)
    return {"model": model, "options": {k: str(v) for k, v in kw.items()}, "rows": rows}


def _cell(r: dict) -> str:
    b = r["bits_per_chunk"]
    return f"{b['value']:.1f} [{b['low']:.1f}, {b['high']:.1f}], acc {r['token_accuracy']:.3f}"


def table(results: list[dict], shares: list[float]) -> str:
    head = ["model", "training chunks", "from a random start"] + [f"contained, control's weights at {s:g} lr"
                                                                   for s in shares]
    lines = []
    for res in results:
        for row in res["rows"]:
            cells = [res["model"], f"{row['n_train']:,}", _cell(row["scratch"])]
            cells += [_cell(row[f"contained_{s:g}"]) for s in shares]
            lines.append(cells)
    return markdown_table(head, lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--n-train", default="1000,2000,4000")
    p.add_argument("--shares", default="1,0.1", help="shares of the learning rate of the contained probe's weights")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("overrides", nargs="*", help="key=value probe options on top of the quickstart's")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    sizes = [int(x) for x in a.n_train.split(",")]
    shares = [float(x) for x in a.shares.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rate = measure_matmul_flops(torch.device("cpu")) / 1e9
    results = [one_model(m, sizes, shares, a.overrides, a.threads) for m in a.models.split(",")]
    res = {"results": results, "shares": shares,
           "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(), "native_bf16": native_bf16("cpu"),
                       "matmul_gflops": rate, "load_average": os.getloadavg()[0]}}
    (out / "start_curve.json").write_text(json.dumps(res, indent=2))
    (out / "start_curve.md").write_text(table(results, shares) + "\n")
    print(table(results, shares))
    return res


if __name__ == "__main__":
    try:
        main()
    except MemlabError as e:  # bad input: one line, exit 2
        print(f"probe_start_curve: {e}", file=sys.stderr)
        raise SystemExit(2) from None
