"""Token cross-entropy through an output head: the plain computation (``F.linear`` -> ``F.cross_entropy`` ->
``argmax`` for the accuracy) against the block-wise ``memlab.losses.linear_cross_entropy``, forward and
backward, timed in the same run on the same inputs (median of ``--reps``), with the largest gap between
their losses and gradients.

    OMP_NUM_THREADS=1 python benchmarks/linear_ce.py [--rows 6912] [--width 128] [--vocab 4096] [--frozen]

The defaults are a SONAR-LLM step's space-decoder head on this project's small configs (about 7k target
tokens, width 128, a 4,096-word vocabulary). ``--frozen``: no gradient to the head's weight (a frozen decoder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from memlab.losses import linear_cross_entropy


def _plain(h, w, y):
    logits = F.linear(h, w)
    total = F.cross_entropy(logits.float(), y, ignore_index=-100, reduction="sum")
    return total, ((logits.argmax(-1) == y) & (y != -100)).sum()


def _run(fn, h0, w0, y, frozen: bool):
    h = h0.clone().requires_grad_()
    w = w0.clone().requires_grad_(not frozen)
    total, correct = fn(h, w, y)[:2]
    total.backward()
    return total.detach(), int(correct), h.grad, w.grad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=6912)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--frozen", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    g = torch.Generator().manual_seed(a.seed)
    h = torch.randn(a.rows, a.width, generator=g)
    w = torch.randn(a.vocab, a.width, generator=g) / a.width ** 0.5
    y = torch.randint(0, a.vocab, (a.rows,), generator=g)
    y[:: 10] = -100  # padding
    ref, new = _run(_plain, h, w, y, a.frozen), _run(linear_cross_entropy, h, w, y, a.frozen)
    gaps = {"loss_rel": float((new[0] - ref[0]).abs() / ref[0].abs()), "correct_equal": new[1] == ref[1],
            "grad_hidden_max": float((new[2] - ref[2]).abs().max())}
    if not a.frozen:
        gaps["grad_weight_max"] = float((new[3] - ref[3]).abs().max())
    times = {}
    for name, fn in (("plain", _plain), ("blockwise", linear_cross_entropy)):
        runs = []
        for _ in range(a.reps + 1):
            t = time.perf_counter()
            _run(fn, h, w, y, a.frozen)
            runs.append(time.perf_counter() - t)
        times[name] = statistics.median(runs[1:])  # the first call warms up
    out = {"rows": a.rows, "width": a.width, "vocab": a.vocab, "frozen_head": a.frozen, "threads": torch.get_num_threads(),
           "seconds": times, "speedup": times["plain"] / times["blockwise"], "agreement": gaps}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
