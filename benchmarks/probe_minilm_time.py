"""``memlab probe --model minilm`` at its defaults, twice with one ``--cache-dir``: what a cached control saves.

The first run encodes the chunks and trains the control (its first and second run) beside the probe; the second
reads the embeddings and the control from the cache and trains the probe's candidates alone. Each run's seconds
stand beside the float32 matmul rate measured before and after it in the same process (the machine may be shared:
compare a run's seconds with its rate, or the two runs' shares, not bare seconds across machines), the load
average, and the readings, which must be the same in both runs.

    python benchmarks/probe_minilm_time.py --out runs/probe-time          # the defaults (several minutes)
    python benchmarks/probe_minilm_time.py --out runs/probe-time --threads 1   # on a shared machine
    python benchmarks/probe_minilm_time.py --out /tmp/pt n_train=500 n_eval=100 epochs=1   # checks the harness

Writes ``probe_time.json`` into ``--out`` and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from memlab.app.bench.probe import PROBE_BUDGET_S
from memlab.app.cli import main as memlab
from memlab.devices import native_bf16
from memlab.flops import measure_matmul_flops

TIMERS = ("load_s", "encode_s", "control_s", "train_s", "bow_s", "total_s")


def _readings(rep: dict) -> dict:
    """The headline readings of a report: bits per chunk with its interval, token accuracy of probe and control."""
    bits = rep["readings"]["bits_per_chunk"]
    return {"bits_per_chunk": bits, "token_accuracy": rep["probe"]["token_accuracy"],
            "control_token_accuracy": (rep.get("control") or {}).get("token_accuracy"),
            "kept": (rep["probe"].get("start") or {}).get("kept"), "retention": rep.get("retention")}


def one_run(name: str, model: str, out: Path, cache: Path, overrides: list[str]) -> dict:
    """One ``memlab probe`` run with the matmul rate measured around it."""
    cpu = torch.device("cpu")
    load = os.getloadavg()[0]
    before = measure_matmul_flops(cpu)
    t0 = time.perf_counter()
    rc = memlab(["probe", "--model", model, "--out", str(out / name), "--cache-dir", str(cache),
                 *overrides])
    secs = time.perf_counter() - t0
    after = measure_matmul_flops(cpu)
    if rc != 0:
        raise SystemExit(f"memlab probe exited {rc}")
    rep = json.loads((out / name / "report.json").read_text())
    timing = rep.get("timing") or {}
    return {"seconds": secs, "exit": rc, "matmul_gflops_before": before / 1e9, "matmul_gflops_after": after / 1e9,
            "gflop_equivalents": secs * min(before, after) / 1e9, "load_average_before": load,
            "control_shared_with": rep.get("control_shared_with"), "encode_cached": timing.get("encode_cached"),
            "timing": {k: timing.get(k) for k in TIMERS}, "readings": _readings(rep)}


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags of a probe cost benchmark: where, which model, threads, and the probe's key=value options."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="minilm")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads of the probe and of the matmul measurement (default: torch's)")
    p.add_argument("overrides", nargs="*", help="key=value probe options (default: none, the defaults)")
    return p


def prepared(a: argparse.Namespace) -> tuple[Path, Path]:
    """Threads set (and passed to the probe), the output folder made: ``(out, out/cache)``."""
    if a.threads:
        torch.set_num_threads(a.threads)
        a.overrides = [*a.overrides, f"threads={a.threads}"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return out, out / "cache"


def main(argv: list[str] | None = None) -> dict:
    a = parser(__doc__).parse_args(argv)
    out, cache = prepared(a)
    runs = {name: one_run(name, a.model, out, cache, a.overrides) for name in ("first", "cached")}
    same = runs["first"]["readings"] == runs["cached"]["readings"]
    res = {"model": a.model, "overrides": a.overrides, "budget_s": PROBE_BUDGET_S, "runs": runs,
           "readings_identical": same, "cached_within_budget": runs["cached"]["seconds"] <= PROBE_BUDGET_S,
           "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(), "native_bf16": native_bf16("cpu"),
                       "torch": torch.__version__}}
    (out / "probe_time.json").write_text(json.dumps(res, indent=2))
    print(f"memlab probe --model {a.model} {' '.join(a.overrides)} (target {PROBE_BUDGET_S} s), "
          f"{res['machine']['threads']} threads, native bf16 {res['machine']['native_bf16']}")
    print("| run | seconds | GFLOP/s fp32 | load | encode s | control s | probe s | bits/chunk [95%] | token acc |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        b, t = r["readings"]["bits_per_chunk"], r["timing"]
        val, lo, hi = b["value"], b["low"], b["high"]
        print(f"| {name} | {r['seconds']:.0f} | {r['matmul_gflops_before']:.0f}-{r['matmul_gflops_after']:.0f} | "
              f"{r['load_average_before']:.1f} | {t['encode_s'] or 0:.0f} | {t['control_s'] or 0:.0f} | "
              f"{t['train_s'] or 0:.0f} | {val:.2f} [{lo:.2f}, {hi:.2f}] | {r['readings']['token_accuracy']:.3f} |")
    print(f"readings identical: {same}")
    return res


if __name__ == "__main__":
    main()
