"""Exact inversion from per-position states read at a lower precision: float32, bfloat16, float16, int8, int4.

Prompts: ``--natural`` held-out chunks of ``--tokens`` tokens (the probe's chunks, cut in the model's tokens) and
``--random`` prompts of uniformly drawn token ids (``invert_protocol.prompts``). Per layer the true states are
computed once, in float32, and the first-position table once (a model that reads no BOS); then, for each precision
of ``--dtypes``, the states are read as a copy at that precision gives them back
(:func:`memlab.probes.invert.positions.precision.read_as`, ``memlab invert --states-dtype``) and every prompt is
searched from them by the lockstep search with the run's float32 candidates. Per layer, precision and text kind:
the exact share, the certificates (match / separated / nearest / ambiguous / none), the noise floor and the
measured error of the copy, the positions whose kept token is wrong (``wrong``) and among them those certified
(``wrong_certified``: a collision of two prompts' states as read; ``wrong_match`` must be 0), seconds and
GFLOP-equivalents (seconds x the fp32 matmul rate measured in the same run).

    python benchmarks/invert_precision.py --model smollm2 --layers 15,-1 --tokens 8 --natural 3 --random 3 \\
        --budget 1024 --no-exhaustive --threads 1 --out runs/invert-precision.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

DTYPES = "float32,bfloat16,float16,int8,int4"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--layers", default="mid,-1", help="comma-separated layers (the probe's numbering) or 'mid'")
    p.add_argument("--dtypes", default=DTYPES)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--natural", type=int, default=3)
    p.add_argument("--random", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget", type=int, default=1024)
    p.add_argument("--no-exhaustive", action="store_true", help="keep the best ranked token past --budget")
    p.add_argument("--cache-dir", default=None, help="keep each layer's first-position table here")
    p.add_argument("--out", default=None, help="JSON file of the results")
    args = p.parse_args(argv)
    from memlab.probes.invert.positions.precision import DTYPES as known

    bad = [d for d in args.dtypes.split(",") if d not in known]
    if bad:
        p.error(f"--dtypes takes {', '.join(known)}; got {bad[0]!r}")
    return args


def figures(got, seqs, kinds, kind: str, errors, gflops: float) -> dict:
    """One text kind's figures from the searched positions ``got`` (one list per prompt)."""
    from memlab.probes.invert.report import CERTIFICATES, CERTIFIED

    idx = [i for i, k in enumerate(kinds) if k == kind]
    pos = [(i, t, p) for i in idx for t, p in enumerate(got[i])]
    wrong = [(i, t, p) for i, t, p in pos if p.token != seqs[i][t]]
    secs = sum(p.seconds for _, _, p in pos)
    return {"prompts": len(idx), "tokens": len(pos),
            "exact": float(np.mean([[p.token for p in got[i]] == seqs[i] for i in idx])),
            "token_accuracy": 1 - len(wrong) / len(pos),
            "certificates": {c: sum(p.certificate == c for _, _, p in pos) for c in CERTIFICATES},
            "ambiguous_at": [[i, t] for i, t, p in pos if p.certificate == "ambiguous"],
            "wrong": len(wrong), "wrong_certified": sum(p.certificate in CERTIFIED for _, _, p in wrong),
            "wrong_match": sum(p.certificate == "match" for _, _, p in wrong),
            "noise_floor_median": float(np.median([p.noise for _, _, p in pos])),
            "measured_error_median": float(np.median([float(errors[i][t]) for i, t, _ in pos])),
            "measured_over_floor_max": max((float(errors[i][t]) / p.noise for i, t, p in pos if p.noise > 0),
                                           default=0.0),
            "candidates_per_token": float(np.mean([p.tried for _, t, p in pos if t > 0])),
            "seconds": secs, "gflop_eq": secs * gflops}


def one_layer(enc, layer: int, seqs, kinds, dtypes, args, gflops: float) -> dict:
    from memlab.probes.invert.head import own_head
    from memlab.probes.invert.layer import LayerReader
    from memlab.probes.invert.positions.lockstep import Lockstep, LockstepOptions
    from memlab.probes.invert.positions.precision import measured_error, noise_floor, read_as
    from memlab.probes.invert.positions.run import check_applies, first_table, observed_states

    reader = LayerReader(enc.model, layer, vocab_size=len(enc.tokenizer))
    check_applies(reader, enc.prefix + seqs[0], args.model)
    opts = LockstepOptions(budget=args.budget, exhaustive=not args.no_exhaustive, chunk_batch=len(seqs))
    search = Lockstep(reader, opts, head_weight=own_head(args.model, reader))
    with torch.no_grad():
        true = [observed_states(reader, enc.prefix, s, 0.0, torch.Generator()) for s in seqs]
    began = time.perf_counter()
    table = None
    if not enc.prefix:  # every precision reads its first positions off the same table
        table = first_table(search.first, enc.prefix, args.cache_dir, False)
        if table is None:
            table = search.first.first_table(enc.prefix)
    out = {"layer": reader.layer, "num_layers": reader.num_layers, "table_seconds": time.perf_counter() - began,
           "dtypes": {}}
    for dtype in dtypes:
        read = [read_as(t, dtype) for t in true]
        floors = [noise_floor(t, dtype) for t in read]
        errors = [measured_error(a, b) for a, b in zip(true, read)]
        firsts = None
        if not enc.prefix:
            firsts = search.first.first_positions(enc.prefix, torch.stack([t[0] for t in read]), table=table,
                                                  floors=torch.stack([f[0] for f in floors]))
        got = search.group(read, enc.prefix, seqs, firsts, floors=floors)
        res = {k: figures(got, seqs, kinds, k, errors, gflops) for k in sorted(set(kinds))}
        out["dtypes"][dtype] = res
        for k, r in res.items():
            c = r["certificates"]
            print(f"layer {reader.layer}/{reader.num_layers} {dtype:8s} {k:7s}: exact {r['exact']:.2f}, "
                  f"tokens {r['token_accuracy']:.3f}, match/separated/nearest/ambiguous/none {c['match']}/"
                  f"{c['separated']}/{c['nearest']}/{c['ambiguous']}/{c['none']}, wrong {r['wrong']} "
                  f"(certified {r['wrong_certified']}, match {r['wrong_match']}), floor {r['noise_floor_median']:.2g}"
                  f" (measured {r['measured_error_median']:.2g}), {r['seconds']:.1f} s = {r['gflop_eq']:.0f} "
                  f"GFLOP-eq; ambiguous at {r['ambiguous_at']}", flush=True)
    return out


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    from invert_protocol import prompts

    from memlab.probes.encoders.capture import hook_plan
    from memlab.probes.encoders.sources import load_transformers
    from memlab.probes.invert.start import machine_facts

    machine = machine_facts()
    enc = load_transformers(args.model, layer=-1, device="cpu")
    seqs, kinds = prompts(enc, args)
    n_blocks = len(hook_plan(enc.model)[0])
    layers = [n_blocks // 2 if x.strip() == "mid" else int(x) for x in args.layers.split(",")]
    res = {"model": args.model, "machine": machine, "args": vars(args), "layers": []}
    for layer in layers:
        res["layers"].append(one_layer(enc, layer, seqs, kinds, args.dtypes.split(","), args,
                                       machine["matmul_gflops"]))
    res["matmul_gflops_after"] = machine_facts()["matmul_gflops"]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"fp32 matmul {machine['matmul_gflops']:.0f} GFLOP/s at the start, {res['matmul_gflops_after']:.0f} at the "
          f"end; CPU bf16 flags {machine['cpu_bf16_flags']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
