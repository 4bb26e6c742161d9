"""What bounds the relaxation on a causal model's short inputs: a long run of the relaxation alone on SODA's
out-of-distribution inputs (tokens drawn uniformly from the vocabulary), its certified count against the steps,
and, for every chunk it does not certify, what the positions it gets wrong look like from the search's side.

    python benchmarks/invert_relax_bound.py --model smollm2 --length 4 --n 8 --steps 6000 --states logits \
        --threads 1 --out runs/relax-bound

The chunks are the ones ``benchmarks/invert_relax_protocol.py --kinds random`` draws (seed ``1000 + length``), all
relaxed in one batch with memlab's relaxation (:class:`~memlab.probes.invert.pooled.relax.Relaxer`, the
``memlab invert`` defaults but ``--relax-steps``; no time limit). Then, per chunk and position:

* **landscape**: the median relative distance to the target when that one position of the *true* chunk takes
  128 tokens drawn at random (how far one wrong token moves the vector);
* **gradient rank**: the rank, among the vocabulary, of the true token in the first-order score of the distance
  when it is the only wrong position (the ranking GCG-style swaps and memlab's correction draw from);
* **neighbour rank**: for a position the relaxation got wrong, the rank of the true token among the input
  embeddings nearest (cosine) to the token it returned.

Writes ``OUT/relax_bound.json`` (the curve, every chunk, the machine) and prints a summary. Costs are
GFLOP-equivalents: seconds x the fp32 matmul rate measured in the same process (the mean of before and after).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def _chunks(reader, tokenizer, length: int, n: int) -> list[list[int]]:
    special = set(tokenizer.all_special_ids or [])
    gen = torch.Generator().manual_seed(1000 + length)  # as invert_relax_protocol.py --kinds random
    out = []
    while len(out) < n:
        ids = torch.randint(0, reader.vocab_size, (length,), generator=gen).tolist()
        if not special & set(ids):
            out.append(ids)
    return out


def _distance(s, ids: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        z = s.vec.vectors(s.vec.embed(s.wrap(ids))).float()
    return (z - t).norm(dim=-1) / t.norm()


def _grad_rank(s, ids: list[int], p: int, wrong: int, t: torch.Tensor) -> int:
    """Rank of ``ids[p]`` in the first-order score of the squared distance at the chunk with ``wrong`` at p."""
    E = s.vec.embedding.float()
    seq = list(ids)
    seq[p] = wrong
    oh = torch.nn.functional.one_hot(torch.tensor(seq), E.shape[0]).float().requires_grad_(True)
    k, T = len(s.prefix), len(ids)
    with torch.enable_grad():
        full = s.vec.embed(s.wrap(torch.tensor([seq]))).float()
        full = torch.cat([full[:, :k], (oh @ E)[None], full[:, k + T:]], 1).to(s.vec.embedding.dtype)
        loss = (s.vec.vectors(full).float() - t).pow(2).sum()
        (g,) = torch.autograd.grad(loss, oh)
    return int((g[p] < g[p, ids[p]]).sum())


def diagnose(s, table: torch.Tensor, ids: list[int], got: list[int], t: torch.Tensor, gen) -> list[dict]:
    V = table.shape[0]
    rows = []
    for p, (a, b) in enumerate(zip(ids, got)):
        batch = torch.tensor([ids]).repeat(128, 1)
        batch[:, p] = torch.randint(0, V, (128,), generator=gen)
        row = {"position": p, "right": a == b,
               "one_wrong_median_distance": float(_distance(s, batch, t).median()),
               "grad_rank": _grad_rank(s, ids, p, int(torch.randint(0, V, (1,), generator=gen)), t)}
        if a != b:
            sims = table @ table[b]
            row["neighbour_rank"] = int((sims > sims[a]).sum())
        rows.append(row)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--states", default="logits", choices=["logits", "last"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/relax-bound")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from memlab.probes.invert.options import InvertOptions
    from memlab.probes.invert.pooled.relax import RelaxJob, Relaxer, RelaxOptions
    from memlab.probes.invert.pooled.run import PooledRun
    from memlab.probes.invert.start import load, machine_facts

    opts = InvertOptions()
    opts.model.model, opts.model.layer, opts.model.states = args.model, -1, args.states
    opts.text.seq_len, opts.text.chunk_by = args.length, "tokens"
    opts.pooled.method, opts.pooled.control = "relax", False
    enc, reader = load(args.model, -1, "cpu")
    chunks = _chunks(reader, enc.tokenizer, args.length, args.n)
    run = PooledRun(opts, enc, reader, "cpu", chunks)
    targets = [t.float() for t in run.targets(chunks)]
    before = machine_facts()
    ro = RelaxOptions.of(opts.pooled)
    ro.steps = args.steps
    relaxer = Relaxer(run.searcher, ro, banned=sorted(set(enc.tokenizer.all_special_ids or [])))
    curve, began = [], time.perf_counter()

    def note(line: str) -> None:
        print(f"  {line} ({time.perf_counter() - began:.0f} s)", flush=True)
        curve.append({"line": line, "seconds": time.perf_counter() - began})

    res = relaxer.run([RelaxJob(t, args.length, 17 + i) for i, t in enumerate(targets)], float("inf"), note=note)
    seconds = time.perf_counter() - began
    rate = (before["matmul_gflops"] + machine_facts()["matmul_gflops"]) / 2
    table = reader.embedding.float()
    table = table / table.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    gen = torch.Generator().manual_seed(5)
    rows = []
    for ids, r, t in zip(chunks, res, targets):
        rows.append({"true": enc.tokenizer.decode(ids), "recovered": enc.tokenizer.decode(r.ids),
                     "certified": r.certified, "exact": r.ids == ids, "steps": r.steps, "distance": r.distance,
                     "forwards": r.forwards, "gflop_eq": r.seconds * rate,
                     "positions": [] if r.ids == ids else diagnose(run.searcher, table, ids, r.ids, t, gen)})
    out = {"model": args.model, "length": args.length, "states": args.states, "steps": args.steps, "n": len(rows),
           "certified": sum(r["certified"] for r in rows), "exact": sum(r["exact"] for r in rows),
           "seconds": seconds, "matmul_gflops": rate, "gflop_eq_per_chunk": seconds * rate / len(rows),
           "cpu_bf16_flags": before["cpu_bf16_flags"], "threads": before["threads"], "curve": curve, "chunks": rows}
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "relax_bound.json").write_text(json.dumps(out, indent=1))
    print(f"{out['certified']}/{out['n']} certified ({out['exact']} exact) in at most {args.steps} steps, "
          f"{out['gflop_eq_per_chunk']:,.0f} GFLOP-eq per chunk ({rate:.0f} GFLOP/s)")
    for r in rows:
        marks = ", ".join(f"p{q['position']} {'right' if q['right'] else 'wrong'}: one-wrong "
                          f"{q['one_wrong_median_distance']:.3f}, grad rank {q['grad_rank']}"
                          + (f", neighbour rank {q['neighbour_rank']}" if "neighbour_rank" in q else "")
                          for q in r["positions"])
        print(f"{r['true']!r} -> {r['recovered']!r} ({r['distance']:.4f}, {r['steps']} steps) {marks}")


if __name__ == "__main__":
    main()
