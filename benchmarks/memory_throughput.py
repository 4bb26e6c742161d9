"""Training throughput (tokens/s) and model FLOPs utilisation of the memory model, side by side.

    python benchmarks/memory_throughput.py [--preset small] [--steps 5] [--chunks 32]

For each setting (fp32, bf16 autocast; blank copy and combined objectives) it times optimizer
steps of the ``small`` memory model (the ae_small.yaml shape) on random chunks and divides the
analytic training FLOPs (memlab.models.memory.recipe.memory_flops, conventions of memlab.flops)
by a square matmul measured in the same run and the same dtype. The machine is shared, so the
ratios between rows mean more than the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    import torch

    from memlab.curricula import make_objective
    from memlab.models.memory.recipe import memory_flops
    from memlab.registry import FAMILIES
    from memlab.train.loop import measure_matmul_flops

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--chunks", type=int, default=32, help="chunks per step (4 per example)")
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers (ae_small.yaml uses 2)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    over = dict(chunk_len=32, encoder_layers=args.layers, num_hidden_layers=args.layers)
    model = FAMILIES.get("memory").make_model(args.preset, **over)
    cfg = model.config
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, cfg.vocab_size, (args.chunks // 4, 4, cfg.chunk_len))
    rows = []
    for dtype in ("fp32", "bf16"):
        mm = measure_matmul_flops(torch.device("cpu"), torch.float32 if dtype == "fp32" else torch.bfloat16)
        for name in ("blank_copy", "combined"):
            obj = make_objective(name)
            flops = memory_flops(model, obj.decoder_passes, 4 * cfg.num_memories if name == "combined" else cfg.num_memories,
                                 cfg.chunk_len, 4, True) * ids.shape[0]
            times = []
            for i in range(args.steps + 1):
                t0 = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                    loss = obj(model, {"input_ids": ids}).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if i:
                    times.append(time.perf_counter() - t0)
            dt = sorted(times)[len(times) // 2]
            rows.append({"dtype": dtype, "objective": name, "step_s": dt, "tokens_per_s": ids.numel() / dt,
                         "model_flops_per_s": flops / dt, "matmul_flops_per_s": mm, "mfu": flops / dt / mm})
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
