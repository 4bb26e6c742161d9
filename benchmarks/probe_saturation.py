"""One probe run's learning curve, saturation verdict and online code, with its cost in GFLOP-equivalents.

    python benchmarks/probe_saturation.py --out DIR --threads 1 -- --model minilm n_train=2000

Everything after ``--`` is ``memlab probe``'s arguments. Writes DIR/run (the probe's run directory) and
DIR/saturation.json: the verdict, the online code, the seconds, the float32 matmul rate measured just before and
just after (GFLOP/s) and the run's GFLOP-equivalents (seconds x the mean of the two rates), and the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from memlab.flops import measure_matmul_flops


def machine() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    have = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{torch.get_num_threads()} threads, CPU flags: {', '.join(have) or 'no native bf16'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("probe", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    args = [x for x in a.probe if x != "--"]
    before = measure_matmul_flops(torch.device("cpu")) / 1e9
    t0 = time.perf_counter()
    rc = subprocess.call([sys.executable, "-m", "memlab.app.cli", "probe", "--out", str(out / "run"), "--threads",
                          str(a.threads), *args])
    secs = time.perf_counter() - t0
    after = measure_matmul_flops(torch.device("cpu")) / 1e9
    rep = json.loads((out / "run" / "report.json").read_text()) if rc == 0 else {}
    payload = {"command": "memlab probe " + " ".join(args), "rc": rc, "seconds": secs, "matmul_gflops_before": before,
               "matmul_gflops_after": after, "gflop_equivalents": secs * (before + after) / 2, "machine": machine(),
               "readings": {k: rep.get("readings", {}).get(k) for k in ("bits_per_chunk", "token_accuracy",
                                                                         "online_bits_per_chunk",
                                                                         "online_compression")},
               "saturation": rep.get("saturation"), "online_code": rep.get("online_code"),
               "limited_by": rep.get("limited_by"), "timing": rep.get("timing")}
    (out / "saturation.json").write_text(json.dumps(payload, indent=2))
    print(json.dumps({k: payload[k] for k in ("seconds", "gflop_equivalents", "readings", "limited_by")}, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
