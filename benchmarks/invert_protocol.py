"""The published protocol of exact inversion from per-position states, on memlab's causal models.

Prompts: ``--natural`` held-out chunks of ``--tokens`` tokens of natural text (the probe's held-out chunks, cut in
the model's tokens) and ``--random`` prompts of as many uniformly drawn token ids; each inverted from its states
at every layer of ``--layers`` by the lockstep search (:mod:`memlab.probes.invert.positions.lockstep`), all prompts of a
layer advancing together. Per model, layer and text kind: the exact rate (prompts recovered token for token), the
certified share, candidates verified per token (and as a share of the vocabulary; the first position's shared
table counted apart), where the true token stood in each ranking, seconds and GFLOP-equivalents per token
(seconds x the fp32 matmul rate measured in the same run).

    python benchmarks/invert_protocol.py --model smollm2 --layers -1,15 --threads 1 --out runs/protocol-smollm2.json

``--layers``: the probe's numbering (``-1``: the last block's output, before the final norm; ``mid``: the middle
layer). ``--cache-dir`` keeps each layer's first-position table for later runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--layers", default="-1,mid", help="comma-separated layers (the probe's numbering) or 'mid'")
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--natural", type=int, default=18)
    p.add_argument("--random", type=int, default=2)
    p.add_argument("--max-positions", type=int, default=0, help="search only the first N positions of each prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--first-batch", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--no-prior", action="store_true")
    p.add_argument("--no-secant", action="store_true")
    p.add_argument("--secant-after", type=int, default=120)
    p.add_argument("--chunk-batch", type=int, default=20)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="JSON file of the results")
    return p.parse_args(argv)


def prompts(enc, args) -> tuple[list[list[int]], list[str]]:
    """``natural`` held-out chunks of ``tokens`` tokens and ``random`` prompts of random ids; their kinds."""
    from memlab.probes.invert.options import TextOptions
    from memlab.probes.invert.start import chunk_ids

    text = TextOptions(seq_len=args.tokens, chunk_by="tokens", n=args.natural, n_eval=max(256, args.natural),
                       seed=args.seed)
    _, natural = chunk_ids(text, enc.tokenizer) if args.natural else ([], [])
    gen = torch.Generator().manual_seed(args.seed + 1)
    special = set(getattr(enc.tokenizer, "all_special_ids", []) or [])
    rnd = []
    for _ in range(args.random):
        ids = torch.randint(0, len(enc.tokenizer), (4 * args.tokens,), generator=gen).tolist()
        rnd.append([t for t in ids if t not in special][: args.tokens])
    return natural + rnd, ["natural"] * len(natural) + ["random"] * len(rnd)


def spread(values) -> dict:
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if not a.size:
        return {}
    return {"median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)), "max": float(a.max()),
            "within_1": float((a < 1).mean()), "within_64": float((a < 64).mean()),
            "within_1000": float((a < 1000).mean())}


def one_layer(enc, layer: int, seqs, kinds, args, gflops: float) -> dict:
    from memlab.probes.invert.positions.lockstep import Lockstep, LockstepOptions
    from memlab.probes.invert.positions.run import check_applies, first_table, observed_states
    from memlab.probes.invert.layer import LayerReader

    reader = LayerReader(enc.model, layer, vocab_size=len(enc.tokenizer))
    check_applies(reader, enc.prefix + seqs[0], args.model)
    opts = LockstepOptions(first_batch=args.first_batch, batch_size=args.batch_size, budget=args.budget,
                           prior=not args.no_prior, chunk_batch=args.chunk_batch, exhaustive_batch=512,
                           secant=not args.no_secant, secant_after=args.secant_after)
    from memlab.probes.invert.head import own_head

    own = None if args.no_prior else own_head(args.model, reader)
    search = Lockstep(reader, opts, head_weight=own)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        targets = [observed_states(reader, enc.prefix, s, 0.0, gen) for s in seqs]
    if args.max_positions:
        targets = [t[: args.max_positions] for t in targets]
    began = time.perf_counter()
    firsts, table_s = None, 0.0
    if not enc.prefix:
        table = first_table(search.first, enc.prefix, args.cache_dir, False)
        firsts = search.first.first_positions(enc.prefix, torch.stack([t[0] for t in targets]), table=table)
        table_s = time.perf_counter() - began
    got = []
    for g in range(0, len(seqs), opts.chunk_batch):
        sl = slice(g, g + opts.chunk_batch)
        got += search.group(targets[sl], enc.prefix, seqs[sl], firsts[sl] if firsts else None)
    secs = time.perf_counter() - began
    v = reader.vocab_size
    out = {"layer": reader.layer, "num_layers": reader.num_layers, "vocab": v, "prior": search.head is not None,
           "seconds": secs, "first_table_seconds": table_s, "kinds": {}}
    for kind in sorted(set(kinds)):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        pos = [(i, t, p) for i in idx for t, p in enumerate(got[i])]
        after = [(i, t, p) for i, t, p in pos if t > 0 or enc.prefix]  # the shared table's first positions apart
        n_tok = len(pos)
        tried = [p.tried for _, _, p in after]
        out["kinds"][kind] = {
            "prompts": len(idx), "tokens": n_tok,
            "exact": float(np.mean([[p.token for p in got[i]] == seqs[i][: len(got[i])] for i in idx])),
            "token_accuracy": float(np.mean([p.token == seqs[i][t] for i, t, p in pos])),
            "certified": float(np.mean([p.certificate != "none" for _, _, p in pos])),
            "certificates": {c: sum(p.certificate == c for _, _, p in pos)
                             for c in ("match", "separated", "nearest", "none")},
            "candidates_per_token": float(np.mean(tried)) if tried else 0.0,
            "share_of_vocab": float(np.mean(tried)) / v if tried else 0.0,
            "exhaustive_positions": sum(p.exhaustive for _, _, p in after),
            "tried": spread(tried), "found_at": spread([p.found_at for _, _, p in after]),
            "prior_rank": spread([p.prior_rank for _, _, p in after]),
            "grad_rank": spread([p.grad_rank for _, _, p in after]),
            "secant_rank": spread([p.secant_rank for _, _, p in after]),
            "secant_positions": sum(p.secant_rank is not None for _, _, p in after),
            "seconds_per_token": sum(p.seconds for _, _, p in pos) / n_tok,
        }
        out["kinds"][kind]["gflop_eq_per_token"] = out["kinds"][kind]["seconds_per_token"] * gflops
    all_tried = [p.tried for i, g_ in enumerate(got) for t, p in enumerate(g_) if t > 0 or enc.prefix]
    out["share_of_vocab_all"] = float(np.mean(all_tried)) / v
    out["seconds_per_token_all"] = secs / sum(len(g_) for g_ in got)
    return out


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    from memlab.probes.encoders.sources import load_transformers
    from memlab.probes.invert.start import machine_facts

    machine = machine_facts()
    enc = load_transformers(args.model, layer=-1, device=args.device)
    seqs, kinds = prompts(enc, args)
    n_blocks = len(__import__("memlab.probes.encoders.capture", fromlist=["hook_plan"]).hook_plan(enc.model)[0])
    layers = [n_blocks // 2 if x.strip() == "mid" else int(x) for x in args.layers.split(",")]
    res = {"model": args.model, "prefix": list(enc.prefix), "machine": machine, "args": vars(args), "layers": []}
    for layer in layers:
        r = one_layer(enc, layer, seqs, kinds, args, machine["matmul_gflops"])
        res["layers"].append(r)
        for kind, k in r["kinds"].items():
            print(f"{args.model} layer {r['layer']}/{r['num_layers']} {kind}: exact {k['exact']:.2f}, tokens "
                  f"{k['token_accuracy']:.3f}, certified {k['certified']:.3f}, candidates/token "
                  f"{k['candidates_per_token']:.1f} ({100 * k['share_of_vocab']:.3f} % of {r['vocab']}), "
                  f"found_at median {k['found_at'].get('median')}, p90 {k['found_at'].get('p90')}, max "
                  f"{k['found_at'].get('max')}; prior rank median {k['prior_rank'].get('median')}, grad rank "
                  f"median {k['grad_rank'].get('median')}; {k['seconds_per_token']:.2f} s/token = "
                  f"{k['gflop_eq_per_token']:.0f} GFLOP-eq ({machine['matmul_gflops']:.0f} GFLOP/s)", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
