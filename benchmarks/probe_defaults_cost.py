"""What ``memlab probe`` costs with its control cached, racing the candidates and not, side by side in one run.

A first run (racing, the default) encodes the chunks and trains the control into ``--out``/cache; then the probe
runs again with the control cached, once with ``race=false`` and once with ``race=true``, in that order. Each run
prints its seconds, the float32 matmul rate (2048 x 2048) measured before and after it in the same process,
GFLOP-equivalents (seconds x the lower of the two rates) and its reading (bits per chunk with the 95 % interval);
the last line gives the racing's ratio of GFLOP-equivalents (on / off).

    python benchmarks/probe_defaults_cost.py --out runs/cost --threads 1                 # minilm at its defaults
    python benchmarks/probe_defaults_cost.py --out runs/cost --threads 1 n_train=2000    # a reduced budget
    python benchmarks/probe_defaults_cost.py --out runs/cost --threads 1 --runs race-true    # the default, cached

``--runs`` names the runs to make, in their order (``first`` fills the cache; the others need it filled, by this
call or an earlier one into the same ``--out``); the ratio line needs both ``race-false`` and ``race-true``.

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


RUNS = ("first", "race-false", "race-true")
"""The runs, in the order they are made: the first fills the cache, the other two read it."""


def bf16_flags() -> str:
    """The CPU's native bf16 flags (``amx_bf16``, ``avx512_bf16``), or ``none``."""
    return " ".join(sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})) or "none"


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--skip-first", action="store_true", help="the control is already cached in --out/cache")
    p.add_argument("--runs", default=",".join(RUNS),
                   help=f"the runs to make, a comma list of {', '.join(RUNS)}, made in that order (default: all; "
                        "--skip-first leaves out first)")
    a = p.parse_args(argv)
    asked = [r.strip() for r in a.runs.split(",") if r.strip()]
    if unknown := [r for r in asked if r not in RUNS]:
        p.error(f"--runs: unknown run {unknown[0]!r}; choose from {', '.join(RUNS)}")
    chosen = [r for r in RUNS if r in asked and not (a.skip_first and r == "first")]
    if not chosen:
        p.error("--runs: no run left to make")
    out, cache = prepared(a)
    runs = {}
    for name in chosen:
        race = [] if name == "first" else [f"race={name.removeprefix('race-')}"]
        runs[name.replace("race-", "race=")] = one_run(name, a.model, out, cache, [*a.overrides, *race])
    off, on = runs.get("race=false"), runs.get("race=true")
    res = {"model": a.model, "overrides": a.overrides, "runs": runs, "cpu_bf16": bf16_flags(),
           "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
           "race_ratio": on["gflop_equivalents"] / off["gflop_equivalents"] if on and off else None}
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
    if res["race_ratio"] is not None:
        print(f"racing on / off: {res['race_ratio']:.2f} of the GFLOP-equivalents")
    return res


if __name__ == "__main__":
    main()
