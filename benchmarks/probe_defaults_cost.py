"""What ``memlab probe`` costs with its control cached, racing the candidates and not, side by side in one run.

A first run (racing, the default) encodes the chunks and trains the control into ``--out``/cache; then the probe
runs again with the control cached, once with ``race=false`` and once with ``race=true``, in that order. Each run
prints its seconds, the float32 matmul rate (2048 x 2048) measured before and after it in the same process,
GFLOP-equivalents (seconds x the lower of the two rates) and its reading (bits per chunk with the 95 % interval);
the last line gives the racing's ratio of GFLOP-equivalents (on / off).

    python benchmarks/probe_defaults_cost.py --out runs/cost --threads 1                 # minilm at its defaults
    python benchmarks/probe_defaults_cost.py --out runs/cost --threads 1 n_train=2000    # a reduced budget

Writes ``probe_defaults_cost.json`` into ``--out``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from memlab.devices import cpu_flags

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_minilm_time import one_run, parser, prepared  # noqa: E402  (the run, its flags and set-up, shared)


def bf16_flags() -> str:
    """The CPU's native bf16 flags (``amx_bf16``, ``avx512_bf16``), or ``none``."""
    return " ".join(sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})) or "none"


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--skip-first", action="store_true", help="the control is already cached in --out/cache")
    a = p.parse_args(argv)
    out, cache = prepared(a)
    runs = {}
    if not a.skip_first:
        runs["first"] = one_run("first", a.model, out, cache, a.overrides)
    for race in ("false", "true"):
        runs[f"race={race}"] = one_run(f"race-{race}", a.model, out, cache, [*a.overrides, f"race={race}"])
    off, on = runs["race=false"], runs["race=true"]
    res = {"model": a.model, "overrides": a.overrides, "runs": runs, "cpu_bf16": bf16_flags(),
           "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
           "race_ratio": on["gflop_equivalents"] / off["gflop_equivalents"]}
    (out / "probe_defaults_cost.json").write_text(json.dumps(res, indent=2))
    print(f"memlab probe --model {a.model} {' '.join(a.overrides)}; CPU bf16: {res['cpu_bf16']}, "
          f"{res['threads']} threads of {res['cpus']}")
    print("| run | control cached | seconds | fp32 matmul GFLOP/s | GFLOP-equivalents | bits/chunk [95%] | kept |")
    print("|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        b = r["readings"]["bits_per_chunk"]
        print(f"| {name} | {r['control_shared_with'] is not None or (r['timing']['control_s'] or 0) == 0} | "
              f"{r['seconds']:.0f} | {r['matmul_gflops_before']:.0f}-{r['matmul_gflops_after']:.0f} | "
              f"{r['gflop_equivalents']:,.0f} | {b['value']:.2f} [{b['low']:.2f}, {b['high']:.2f}] | "
              f"{r['readings']['kept']} |")
    print(f"racing on / off: {res['race_ratio']:.2f} of the GFLOP-equivalents")
    return res


if __name__ == "__main__":
    main()
