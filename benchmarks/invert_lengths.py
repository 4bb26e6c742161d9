"""The bottleneck figure: what per-position states keep against length (white-box inversion), beside what the
trained probe reads from one pooled state at the same lengths.

    python benchmarks/invert_lengths.py --model smollm2 --layer -1 --lengths 8,16,32,64 --n 2 \\
        --cache-dir runs/invert-cache --probe-table "docs/results/probes.md:SmolLM2-135M, last token" \\
        --out runs/invert-lengths

The chunks are the probe's length sweep's (``chunk_by=tokens``, ``n_eval`` 200, seed 0, the test split): for
each length the first ``--n`` of them are inverted from their per-position states at ``--layer``, one model load
and one first-position table for all lengths. ``--probe-table`` names a markdown file and the line above a table
of the probe's length sweep (columns ``seq_len (tokens)``, ``token accuracy``, ``free-running accuracy``,
``control``): its measured readings are drawn beside the inversion's (read from the file, not retrained).
Writes lengths.json and lengths.png into --out and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path


def probe_rows(spec: str) -> dict[int, dict[str, float]]:
    """``FILE:LINE`` -> {length: {column: value}} from the first markdown table after the line that starts with
    ``LINE`` (each cell's leading number; "no evidence" cells are skipped)."""
    path, _, head = spec.partition(":")
    lines = Path(path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    first = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    table = lines[first:end]
    cols = [c.strip() for c in table[0].strip("|").split("|")]
    out = {}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        nums = {c: float(m.group()) for c, v in zip(cols, cells) if (m := re.match(r"-?\d+(\.\d+)?", v))}
        out[int(nums[cols[0]])] = nums
    return out


def write(res: dict, probe: dict, out: Path, model: str) -> None:
    """lengths.json and lengths.png from the lengths measured so far (rewritten after each length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res["probe"] = {str(k): v for k, v in probe.items()}
    (out / "lengths.json").write_text(json.dumps(res, indent=2))

    fig, ax = plt.subplots(figsize=(6.4, 4))
    xs = [r["seq_len"] for r in res["lengths"]]
    ax.plot(xs, [r["totals"]["token_accuracy"]["value"] for r in res["lengths"]], marker="o",
            label=f"per-position states, inversion (layer {res['layer']}): token accuracy")
    ax.plot(xs, [r["totals"]["exact_match"]["value"] for r in res["lengths"]], marker="s", ls="--",
            label="per-position states, inversion: exact match")
    if probe:
        px = sorted(probe)
        for col, style in (("token accuracy", "-"), ("free-running accuracy", ":")):
            ax.plot(px, [probe[k].get(col, float("nan")) for k in px], marker="^", ls=style,
                    label=f"last token, trained probe: {col}")
        ax.plot(px, [probe[k].get("control", float("nan")) for k in px], marker="x", ls="-", color="grey",
                label="trained probe's control: token accuracy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunk length (tokens)")
    ax.set_ylabel("share of tokens / chunks")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title(f"{model}: what the states keep against length")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "lengths.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--layer", type=int, default=-1)
    ap.add_argument("--lengths", default="8,16,32,64")
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--probe-table", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from memlab.probes.invert.positions import SearchOptions, Searcher
    from memlab.probes.invert.report import chunk_result, totals
    from memlab.probes.invert.run import chunk_ids, first_table, load, machine_facts, observed_states

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    enc, reader = load(args.model, args.layer, "cpu")
    searcher = Searcher(reader, SearchOptions())
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    table = first_table(searcher, enc.prefix, args.cache_dir, None)
    res = {"command": " ".join(["python", "benchmarks/invert_lengths.py", *sys.argv[1:]]), "model": args.model,
           "layer": reader.layer, "machine": machine_facts(), "table_seconds": time.perf_counter() - t0,
           "lengths": []}
    probe = probe_rows(args.probe_table) if args.probe_table else {}
    for length in [int(x) for x in args.lengths.split(",")]:
        vals = {"n": args.n, "n_eval": 200, "eval_split": "test", "corpus": "austen", "seed": 0,
                "chunk_by": "tokens", "seq_len": length}
        texts, chunks = chunk_ids(vals, enc.tokenizer)
        states = [observed_states(reader, enc.prefix, c, 0.0, gen) for c in chunks]
        firsts = searcher.first_positions(enc.prefix, torch.stack([s[0] for s in states]), table=table)
        results = []
        for i, (text, ids, s, f) in enumerate(zip(texts, chunks, states, firsts)):
            start = time.perf_counter()
            got = searcher.chunk(s, enc.prefix, ids, first=f)
            results.append(chunk_result(i, text, ids, got, enc.tokenizer.decode, time.perf_counter() - start))
        t = {k: v.to_dict() for k, v in totals(results).items()}
        res["lengths"].append({"seq_len": length, "chunks": len(chunks), "totals": t,
                               "certificates": [x for c in results for x in c.certificates]})
        print(f"{length} tokens: exact {t['exact_match']['value']:.2f} token accuracy "
              f"{t['token_accuracy']['value']:.3f} s/token {t['seconds_per_token']['value']:.2f}", flush=True)
        write(res, probe, out, args.model)
    print(f"wrote {out / 'lengths.json'} and {out / 'lengths.png'} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
