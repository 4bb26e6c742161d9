"""How fast the CLI says no: ``memlab --help``, ``memlab VERB --help`` and malformed flags, beside a bare Python.

    python benchmarks/cli_answer_time.py --runs 7

Each command runs ``--runs`` times in a fresh interpreter (``python -m memlab.app.cli ...``); the table gives the
median and the slowest wall time, and whether torch was imported. The machine line gives the CPU's bf16 flags and
an fp32 matmul rate (2048 x 2048) measured in the same run, so that the times can be read as GFLOP-equivalents.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = [
    [],  # bare interpreter: python -c pass
    ["--help"],
    ["train", "--help"],
    ["eval", "--help"],
    ["bench", "--help"],
    ["generate", "--help"],
    ["probe", "--help"],
    ["invert", "--help"],
    ["bench", "--mfu-steps", "0"],
    ["bench", "--prefill-lengths=-64"],
    ["eval", "--run", "r", "--task", "needle", "--needle-lengths", "0"],
    ["generate", "--run", "r", "--prompt", "x", "--top-p", "2"],
    ["quickstart", "--threads", "0"],
    ["probe", "--model", "m", "--seq-len", "8,8"],
    ["probe", "--model", "m", "--epochs", "0"],
    ["probe", "--model", "m", "--lr", "nan"],
    ["probe", "--model", "./no-such-model"],
    ["probe", "--model", "m", "--corpus", "/no/such/corpus.txt"],
    ["probe", "--model", "m", "--out", "README.md"],
    ["invert", "--model", "m", "--seq-len", "0"],
    ["invert", "--model", "m", "--layer", "1", "--seed", "-1"],
    ["invert", "--model", "m", "--layer", "1", "--cache-dir", "/proc/no-such-cache"],
]

_CHILD = ("import sys\nfrom memlab.app.cli import main\nrc = main(sys.argv[1:])\n"
          "sys.stderr.write('@@torch=%d\\n' % ('torch' in sys.modules))\nsys.exit(rc)\n")


def machine() -> str:
    import torch

    from memlab.devices import cpu_flags

    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    torch.set_num_threads(1)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t, n = time.perf_counter(), 5
    for _ in range(n):
        a @ b
    rate = n * 2 * 2048**3 / (time.perf_counter() - t) / 1e9
    return f"bf16 flags: {', '.join(flags) or 'none'}; fp32 matmul 2048x2048 on 1 thread: {rate:.1f} GFLOP/s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args(argv)
    print(machine())
    print("| command | median s | slowest s | exit | torch imported |")
    print("|---|---|---|---|---|")
    for cmd in COMMANDS:
        argv_ = [sys.executable, "-c", "pass"] if not cmd else [sys.executable, "-c", _CHILD, *cmd]
        times, rc, torch_loaded = [], 0, False
        for _ in range(args.runs):
            t = time.perf_counter()
            r = subprocess.run(argv_, capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            rc, torch_loaded = r.returncode, "@@torch=1" in r.stderr
        name = "python -c pass" if not cmd else "memlab " + " ".join(cmd)
        print(f"| `{name}` | {statistics.median(times):.3f} | {max(times):.3f} | {rc} | {'yes' if torch_loaded else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
