"""The quickstart against its budget, beside the machine's matmul rate measured in the same run.

    python benchmarks/quickstart_budget.py --out runs/qs-budget                 # every entry (the target: <= 600 s)
    python benchmarks/quickstart_budget.py --only synthetic:concat --out /tmp/q # some entries: checks the harness

Writes budget.json (quickstart seconds, per entry, float32 matmul GFLOP/s before and after, threads, the probe
decoder's training MFU against the same matmul) into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    from memlab.app.bench.probe import quickstart_budget
    from memlab.app.quiet import quiet_libraries

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--only", nargs="*", default=None, help="quickstart entries (default: all)")
    p.add_argument("--fast", action="store_true", help="the quickstart's tiny settings (checks the harness)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    a = p.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_libraries():  # the libraries' bars and warnings as memlab's lines, as the quickstart itself prints
        res = quickstart_budget(out, only=a.only, fast=a.fast, log=lambda s: print(s, file=sys.stderr))
    (out / "budget.json").write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
