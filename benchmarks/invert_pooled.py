"""What each stage of the pooled inversion adds: ``memlab invert --states mean|last`` with ``--method`` propose,
correct, propose-correct and swap (the earlier single-token swap search) on the same chunks and budget, one table.

    python benchmarks/invert_pooled.py --corpus /tmp/corpus/britannica-shakespeare.txt --out runs/pooled-ablation \\
        --model minilm --states mean --seq-len 16 --n 4 --seconds 60 --threads 1

Each method runs as its own ``memlab invert`` (its report.json kept under ``--out/METHOD``); the table is printed
and written to ``--out/table.md`` with the machine's matmul rate. The control is off here (``--no-control``): the
default runs measure it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

METHODS = ("propose", "correct", "propose-correct", "swap")


def row(method: str, rep: dict) -> str:
    t = rep["totals"]

    def cell(k, d=2):
        r = t[k]
        return f"{r['value']:.{d}f} [{r['low']:.{d}f}, {r['high']:.{d}f}]"

    rate = rep["machine"]["matmul_gflops"]
    return (f"| {method} | {cell('exact_match')} | {t['certified']['value']:.2f} | {cell('token_accuracy')} | "
            f"{cell('token_f1')} | {cell('bleu', 1)} | {cell('distance', 3)} | "
            f"{t['seconds_per_chunk']['value'] * rate:.0f} |")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--methods", default=",".join(METHODS))
    args, rest = p.parse_known_args(argv)
    from memlab.app.cli import main as cli

    out = Path(args.out)
    lines = ["| method | exact match | certified | token accuracy | token-set F1 | BLEU | relative distance | "
             "GFLOP-eq per chunk |", "|---|---|---|---|---|---|---|---|"]
    rate = None
    for method in args.methods.split(","):
        run = out / method
        if not (run / "report.json").is_file():
            code = cli(["invert", *rest, "--method", method, "--no-control", "--out", str(run)])
            if code:
                return code
        rep = json.loads((run / "report.json").read_text())
        rate = rep["machine"]["matmul_gflops"]
        lines.append(row(method, rep))
        print(lines[-1], flush=True)
    lines.append(f"\n`{' '.join(rest)}`; matmul rate {rate:.0f} GFLOP/s measured in the runs (fp32, shared cores)")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
