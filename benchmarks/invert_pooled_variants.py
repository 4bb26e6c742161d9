"""Settings of the pooled search side by side on the same chunks, the models loaded once: each variant is a list of
``name=value`` (a :class:`~memlab.probes.invert.options.PooledOptions` field), ``base`` the defaults.

    python benchmarks/invert_pooled_variants.py --seconds 30 --n 3 base table_topk=0 screen=0 propose_share=0.5

MiniLM's mean pool at layer 6 of 16-word chunks of ``--corpus``, one thread; per chunk and variant the relative
distance reached, the token-set F1, the forwards and the accepted edits by kind, then the means. The budget is
``--seconds`` of wall time per chunk (the matmul rate is printed, for GFLOP-equivalents); no control search.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="+")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--corpus", default="/tmp/corpus/britannica-shakespeare.txt")
    p.add_argument("--model", default="minilm")
    p.add_argument("--layer", type=int, default=6)
    args = p.parse_args(argv)
    import torch

    from memlab.probes.invert.options import InvertOptions, PooledOptions
    from memlab.probes.invert.pooled.run import PooledRun
    from memlab.probes.invert.start import machine_facts, setup
    from memlab.probes.readings import set_f1

    torch.set_num_threads(1)
    o = InvertOptions()
    o.model.model, o.model.layer, o.model.states, o.model.threads = args.model, args.layer, "mean", 1
    o.text.corpus, o.text.seq_len, o.text.n = args.corpus, 16, args.n
    device, enc, reader, _, chunks, _ = setup(o)
    machine = machine_facts()
    print(f"matmul rate {machine['matmul_gflops']:.0f} GFLOP/s", flush=True)
    run = PooledRun(o, enc, reader, device, chunks)
    targets = run.targets(chunks)
    types = {f.name: type(f.default) for f in fields(PooledOptions)}
    for var in args.variants:
        kw = {} if var == "base" else dict(kv.split("=", 1) for kv in var.split(","))
        unknown = set(kw) - set(types)
        if unknown:
            raise SystemExit(f"not a PooledOptions field: {', '.join(sorted(unknown))}")
        run.opts.pooled = replace(PooledOptions(), **{k: types[k](v) for k, v in kw.items()})
        run.search_opts = replace(run.opts.pooled, init="random")
        run.prepare(targets, machine=machine)
        run.recoverer.seconds = args.seconds
        d = f = 0.0
        for i, ids in enumerate(chunks):
            got = run.recoverer.search(targets[i], len(ids), seed=i)
            f1 = set_f1(got.ids, ids)
            d, f = d + got.distance, f + f1
            print(f"  {var} chunk {i}: distance {got.distance:.3f} F1 {f1:.2f} forwards {got.forwards} "
                  f"rounds {got.rounds} {got.accepted} | {enc.tokenizer.decode(got.ids)}", flush=True)
        print(f"{var}: mean distance {d / len(chunks):.3f}, F1 {f / len(chunks):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
