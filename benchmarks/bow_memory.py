"""Memory of fitting the bag-of-words read-out against the number of chunks: flat in N x K.

    python benchmarks/bow_memory.py [--n 2000 8000 32000] [--vocab 32000] [--epochs 2]

Fits :func:`memlab.probes.readouts.bow.fit_bow` on random chunks (``--seq-len`` ids from a ``--vocab``-token
vocabulary, every id seen in training, so the kept vocabulary K is the whole of it) with 64-dim
embeddings, for each ``--n`` chunks in a fresh process, and prints one JSON line each: the peak resident memory above the
start of the fit (:class:`memlab.app.bench.measure.PeakMemory`, RSS sampled every millisecond) and what
the former dense N x K float32 label matrix alone took. The machine may be shared: seconds are noisy,
memory is not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch


def measure(n: int, args) -> dict:
    """One fit of ``n`` chunks in this process: its peak memory above the start of the fit."""
    from memlab.app.bench.measure import PeakMemory
    from memlab.probes.readouts.bow import fit_bow
    from memlab.probes.sections import FitSection

    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, args.vocab, (n + args.n_eval, args.seq_len), generator=g)  # (N + M, T)
    rows = -(-args.vocab // args.seq_len)
    ids[:rows] = torch.arange(rows * args.seq_len).view(rows, args.seq_len) % args.vocab  # every id seen: K = vocab
    z = torch.randn(n + args.n_eval, 64, generator=g)  # (N + M, 64)
    t0 = time.perf_counter()
    with PeakMemory(args.device) as mem:
        out = fit_bow(z[:n], ids[:n], z[n:], ids[n:], fit=FitSection(epochs=args.epochs, patience=args.epochs),
                      device=args.device)
    return {"n_train": n, "kept_vocab": out["kept_vocab"], "peak_above_start_mb": round(mem.peak_bytes / 2**20, 1),
            "dense_labels_mb": round(n * out["kept_vocab"] * 4 / 2**20, 1),
            "seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[2000, 8000, 32000], help="training chunks per fit")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--n-eval", type=int, default=500)
    p.add_argument("--device", default="cpu")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.n[0], args)))
        return []
    rows = []
    for n in args.n:
        cmd = [sys.executable, __file__, "--child", "--n", str(n), "--vocab", str(args.vocab), "--seq-len",
               str(args.seq_len), "--epochs", str(args.epochs), "--n-eval", str(args.n_eval), "--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(out.stderr.strip()[-2000:])
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
