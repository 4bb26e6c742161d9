"""Run the benchmark parts into one run directory: ``bench.json``, ``plots/*.png`` and ``README.md``
(a table of the results with the command that made them)."""

from __future__ import annotations

import platform
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from memlab.errors import MemlabError
from memlab.outdir import OutputFolder

from memlab.app.bench import PARTS  # noqa: F401  (known parts, in run order)

QUICK = {"prefill_lengths": [128, 256], "generation_contexts": [64, 128], "mfu_steps": 2,
         "width": 32, "layers": 2, "heads": 2, "ff": 64, "sentence_len": 8, "new_tokens": 2}
"""Tiny sizes for the harness test (no timing meaning)."""


def run_bench(out_dir: str | Path, parts: list[str], device: str | None = None, quick: bool = False,
              prefill_lengths: list[int] | None = None, generation_contexts: list[int] | None = None,
              mfu_steps: int = 12, mfu_configs: dict[str, str] | None = None, command: str = "",
              prefill_logits: str = "last", log=print) -> dict[str, Any]:
    """``prefill_logits``: ``"last"`` (both prefill models return the last position's logits only,
    ``logits_to_keep=1``) or ``"all"`` (every position); see ``memlab.app.bench.prefill``."""
    from memlab.app.bench.measure import device_of
    from memlab.app.bench.prefill import LOGITS

    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise MemlabError(f"unknown bench part '{unknown[0]}'; known: {', '.join(PARTS)}")
    if prefill_logits not in LOGITS:
        raise MemlabError(f"unknown prefill logits {prefill_logits!r}; choose one of {', '.join(LOGITS)}")
    if mfu_steps < 1:
        raise MemlabError(f"mfu_steps must be a positive integer, got {mfu_steps}")
    for name, values in (("prefill_lengths", prefill_lengths), ("generation_contexts", generation_contexts)):
        bad = [v for v in values or [] if v < 1] + [v for i, v in enumerate(values or []) if v in values[:i]]
        if bad:
            raise MemlabError(f"{name}: each value must be a positive integer, given once; got {values}")
    dev = device_of(device)
    with OutputFolder.new(out_dir, "bench") as folder:  # new or empty, locked; a bench that fails leaves none
        return _run_parts(folder, parts, dev, quick, prefill_lengths, generation_contexts, mfu_steps, mfu_configs,
                          command, prefill_logits, log)


def _run_parts(folder: OutputFolder, parts: list[str], dev, quick: bool, prefill_lengths, generation_contexts,
               mfu_steps: int, mfu_configs, command: str, prefill_logits: str, log) -> dict[str, Any]:
    """The parts in run order, into ``folder``: bench.json rewritten whole after each part, then README.md."""
    out = folder.path
    folder.subdir("plots")
    warnings.filterwarnings("ignore", category=FutureWarning)
    q = QUICK if quick else {}
    res: dict[str, Any] = {"command": command, "device": str(dev), "device_name": device_name(dev),
                           "torch": torch.__version__,
                           "threads": torch.get_num_threads(), "machine": platform.platform(),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "parts": {}}
    for part in [p for p in PARTS if p in parts]:
        t0 = time.perf_counter()
        if part == "flops":
            from memlab.analysis import flops_model as fm

            r = fm.sonar_vs_token_lm()
            fm.plot_flops({"token LM (1.2B)": (r["tokens"], r["token_lm"]),
                           "SONAR-LLM (1B + SONAR enc/dec)": (r["tokens"], r["sonar_llm"])},
                          out / "plots" / "flops.png", crossover_at=r["crossover_tokens"])
        elif part == "prefill":
            from memlab.app.bench.prefill import plot_prefill, run_prefill

            lengths = prefill_lengths or q.get("prefill_lengths") or [1024, 2048, 4096, 8192, 16384, 32768]
            r = run_prefill(lengths, dev, chunk_len=32 if quick else 64, repeats=1 if quick else 2,
                            logits=prefill_logits, log=log)
            plot_prefill(r, out / "plots" / "prefill.png")
        elif part == "generation":
            from memlab.app.bench.generation_speed import plot_generation, run_generation

            ctx = generation_contexts or q.get("generation_contexts") or [256, 1024, 2048, 4096, 8192, 16384]
            shape = {k: q[k] for k in ("width", "layers", "heads", "ff", "sentence_len", "new_tokens")} if quick else {}
            r = run_generation(ctx, dev, log=log, **shape)
            plot_generation(r, out / "plots" / "generation.png")
        elif part == "mfu":
            from memlab.app.bench.mfu import run_mfu

            r = run_mfu(out, mfu_configs, steps=q.get("mfu_steps", mfu_steps), cpu=dev.type == "cpu",
                        overrides=["data.seq_len=32", "train.batch_size=4", "model.preset=toy"] if quick else None, log=log)
        else:  # probe
            from memlab.app.bench.probe import probe_decoder_mfu, run_probe_split

            r = run_probe_split(dev, quick=quick, log=log)
            r["decoder_mfu"] = probe_decoder_mfu(dev, quick=quick, log=log)
        r["seconds"] = round(time.perf_counter() - t0, 1)
        res["parts"][part] = r
        folder.write_json("bench.json", res)
    from memlab.app.bench.report import write_readme

    write_readme(res, out / "README.md")
    return res


def device_name(dev: torch.device) -> str:
    """What the parts ran on, as the hardware names it: the GPU's name, else the device type."""
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
