"""Exact recovery from per-position states against noise on the states and against quantised weights.

    python benchmarks/invert_robustness.py --model memlab-lm --layer 2 --seq-len 8 --n 8 --out runs/invert-robust

For each relative noise level (Gaussian noise whose expected norm is that share of each state's norm) the chunks'
states are inverted with the same weights; for each GGUF quantisation type the states made by the model are
inverted with a copy of it quantised to that type and back (and the reverse: states of the quantised copy,
inverted with the model). Writes robustness.json and robustness.png into --out, and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="memlab-lm")
    ap.add_argument("--layer", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--noise", default="0,0.001,0.003,0.01,0.03,0.1,0.3")
    ap.add_argument("--qtypes", default="Q8_0,Q5_0,Q4_0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None, help="keep the model's first-position table here (memlab invert's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from memlab.probes.invert.options import PositionsOptions, TextOptions
    from memlab.probes.invert.positions.searcher import Searcher
    from memlab.probes.invert.positions.robust import quantized_copy, recovery, relative_error
    from memlab.probes.invert.positions.run import first_table, observed_states
    from memlab.probes.invert.start import chunk_ids, load, machine_facts
    from memlab.probes.invert.layer import LayerReader

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    enc, reader = load(args.model, args.layer, "cpu")
    _, chunks = chunk_ids(TextOptions(n=args.n, n_eval=256, seq_len=args.seq_len), enc.tokenizer)
    prefix, opts = enc.prefix, PositionsOptions()
    gen = torch.Generator().manual_seed(0)
    rows = {"machine": machine_facts(), "command": " ".join(["python", "benchmarks/invert_robustness.py", *sys.argv[1:]]),
            "model": args.model, "layer": reader.layer, "chunks": len(chunks),
            "positions": sum(len(c) for c in chunks), "noise": [], "weights": []}
    t0 = time.perf_counter()
    table = first_table(Searcher(reader, opts), prefix, args.cache_dir, None)
    for level in [float(x) for x in args.noise.split(",")]:
        states = [observed_states(reader, prefix, c, level, gen) for c in chunks]
        r = recovery(Searcher(reader, opts), prefix, chunks, states, table) | {"noise": level}
        rows["noise"].append(r)
        print(f"noise {level:g}: exact {r['exact_match']:.2f} tokens {r['token_accuracy']:.3f} match {r['match']} "
              f"separated {r['separated']} nearest {r['nearest']} none {r['none']} "
              f"median d {r['median_distance']:.3g}", flush=True)
    clean = [observed_states(reader, prefix, c, 0.0, gen) for c in chunks]
    for qt in [q for q in args.qtypes.split(",") if q]:
        qmodel = quantized_copy(enc.model, qt)
        qreader = LayerReader(qmodel, args.layer, vocab_size=reader.vocab_size)
        err = relative_error(enc.model, qmodel)
        for direction, (src, dst) in {"float states, quantised search": (clean, qreader),
                                      "quantised states, float search": (None, reader)}.items():
            states = src or [observed_states(qreader, prefix, c, 0.0, gen) for c in chunks]
            r = recovery(Searcher(dst, opts), prefix, chunks, states) | {"qtype": qt, "direction": direction,
                                                                            "weight_error": err}
            rows["weights"].append(r)
            print(f"{qt} ({direction}, weight error {err:.3g}): exact {r['exact_match']:.2f} tokens "
                  f"{r['token_accuracy']:.3f} match {r['match']} separated {r['separated']} nearest {r['nearest']} "
                  f"none {r['none']} "
                  f"median d {r['median_distance']:.3g}", flush=True)
    rows["seconds"] = time.perf_counter() - t0
    (out / "robustness.json").write_text(json.dumps(rows, indent=2))

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    xs = [max(r["noise"], 1e-4) for r in rows["noise"]]
    for key, label in (("exact_match", "exact match (chunks)"), ("token_accuracy", "token accuracy"),
                       ("certified", "certified positions")):
        axes[0].plot(xs, [r[key] for r in rows["noise"]], marker="o", label=label)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("noise norm / state norm (0 drawn at 1e-4)")
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].set_title(f"{args.model} layer {reader.layer}: noise on the states")
    axes[0].legend(fontsize=8)
    labels = [f"{r['qtype']}\n{'q->f' if r['direction'].startswith('quantised') else 'f->q'}" for r in rows["weights"]]
    x = range(len(labels))
    axes[1].bar([i - 0.2 for i in x], [r["exact_match"] for r in rows["weights"]], 0.4, label="exact match")
    axes[1].bar([i + 0.2 for i in x], [r["certified"] for r in rows["weights"]], 0.4, label="certified positions")
    axes[1].set_xticks(list(x), labels, fontsize=8)
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("other weights (states -> search)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "robustness.png", dpi=120)
    print(f"wrote {out / 'robustness.json'} and {out / 'robustness.png'} in {rows['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
