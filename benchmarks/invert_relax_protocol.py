"""SODA's protocol on memlab's causal models: inputs of a few lengths, natural text and random tokens, inverted from
the next-token distribution (``--states logits``) and from the last-token state at the last block (``--states last
--layer -1``) by the pooled search's relaxation, with the recovery rate and the false positives (certified answers
that are not the input).

    python benchmarks/invert_relax_protocol.py --model smollm2 --lengths 4 8 --n 8 --kinds text random \
        --targets logits last --method relax-correct --gflops 20000 --threads 1 --out docs/results/relax

Natural text: the first ``n`` held-out chunks of ``--corpus`` cut by the model's tokens (the probe's chunks);
random: ``n`` sequences of tokens drawn uniformly from the vocabulary (no special tokens), SODA's
out-of-distribution inputs. Each cell runs the search of ``memlab invert`` (:class:`PooledRun`) on those chunks
with its defaults unless given, and writes one row: exact, certified, false positives, token accuracy, GFLOP-
equivalents per chunk (seconds x the fp32 matmul rate measured in the same process). The table goes to
``OUT/relax_protocol.md`` and the rows to ``OUT/relax_protocol.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def cell(model: str, length: int, kind: str, states: str, n: int, args) -> dict:
    from memlab.probes.invert.options import InvertOptions
    from memlab.probes.invert.pooled.run import PooledRun
    from memlab.probes.invert.start import chunk_ids, load, machine_facts

    opts = InvertOptions()
    opts.model.model, opts.model.layer, opts.model.states = model, -1, states
    opts.text.seq_len, opts.text.chunk_by, opts.text.n, opts.text.corpus = length, "tokens", n, args.corpus
    opts.pooled.method, opts.pooled.gflops, opts.pooled.control = args.method, args.gflops, False
    opts.pooled.relax_steps = args.relax_steps
    enc, reader = load(model, -1, "cpu")
    if kind == "text":
        texts, chunks = chunk_ids(opts.text, enc.tokenizer)
    else:
        special = set(enc.tokenizer.all_special_ids or [])
        gen = torch.Generator().manual_seed(1000 + length)
        chunks = []
        while len(chunks) < n:
            ids = torch.randint(0, reader.vocab_size, (length,), generator=gen).tolist()
            if not special & set(ids):
                chunks.append(ids)
        texts = [enc.tokenizer.decode(c) for c in chunks]
    run = PooledRun(opts, enc, reader, "cpu", chunks)
    machine = machine_facts()
    targets = run.targets(chunks)
    run.prepare(targets, list(range(len(chunks))), machine)
    run.note = lambda m: print(f"  {m}", flush=True)
    began = time.perf_counter()
    res = list(run.results(list(range(len(chunks))), texts, chunks, targets, lambda *a: None))
    seconds = time.perf_counter() - began
    exact = sum(c.exact for c in res)
    certified = sum(c.certified for c in res)
    false_pos = sum(c.certified and not c.exact for c in res)
    acc = sum(c.token_accuracy * len(c.true_ids) for c in res) / max(sum(len(c.true_ids) for c in res), 1)
    rate = machine["matmul_gflops"]
    return {"model": model, "length": length, "kind": kind, "states": states, "n": len(res), "exact": exact,
            "certified": certified, "false_positives": false_pos, "token_accuracy": acc,
            "gflop_eq_per_chunk": seconds * rate / max(len(res), 1), "matmul_gflops": rate,
            "cpu_bf16_flags": machine["cpu_bf16_flags"], "threads": machine["threads"], "method": args.method,
            "chunks": [{"true": c.text, "recovered": c.recovered_text, "exact": c.exact,
                        "certified": c.certified, "distance": c.distance} for c in res]}


def table(rows: list[dict]) -> str:
    head = ("| model | input | tokens | target | exact | certified | false positives | token accuracy | "
            "GFLOP-eq per chunk |\n|---|---|---|---|---|---|---|---|---|")
    body = [f"| {r['model']} | {r['kind']} | {r['length']} | {r['states']} | {r['exact']}/{r['n']} | "
            f"{r['certified']}/{r['n']} | {r['false_positives']} | {r['token_accuracy']:.2f} | "
            f"{r['gflop_eq_per_chunk']:,.0f} |" for r in rows]
    return "\n".join([head, *body])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["smollm2"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--kinds", nargs="+", default=["text", "random"], choices=["text", "random"])
    ap.add_argument("--targets", nargs="+", default=["logits", "last"], choices=["logits", "last"])
    ap.add_argument("--method", default="relax-correct", choices=["relax-correct", "relax", "propose-correct"])
    ap.add_argument("--gflops", type=float, default=20000.0)
    ap.add_argument("--relax-steps", type=int, default=3000)
    ap.add_argument("--corpus", default="austen")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/relax-protocol")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.model:
        for length in args.lengths:
            for kind in args.kinds:
                for states in args.targets:
                    print(f"{model}: {kind}, {length} tokens, --states {states}", flush=True)
                    rows.append(cell(model, length, kind, states, args.n, args))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
                    (out / "relax_protocol.json").write_text(json.dumps(rows, indent=1))
    (out / "relax_protocol.md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
