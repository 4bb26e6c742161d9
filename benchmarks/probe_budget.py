"""``memlab probe --model minilm`` at its defaults against its 5-minute target, beside the machine's matmul rate
measured in the same run.

    python benchmarks/probe_budget.py --out runs/probe-budget                     # the defaults (the target: <= 300 s)
    python benchmarks/probe_budget.py --out /tmp/p n_train=256 epochs=1 n_eval=32  # a short run: checks the harness

Writes budget.json (seconds end to end, the report's timers: load, encode, decoders, read-outs; float32 matmul
GFLOP/s before and after; threads) into --out; the probe's own run directory is --out/probe.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    from memlab.app.bench.probe import probe_budget

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="minilm")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("overrides", nargs="*", help="key=value probe options (default: none, the probe's defaults)")
    a = p.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = probe_budget(out, a.model, a.overrides, log=lambda s: print(s, file=sys.stderr))
    (out / "budget.json").write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
