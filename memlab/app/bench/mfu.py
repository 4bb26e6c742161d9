"""Part (c): training model FLOPs utilisation of each family against a matrix multiply timed in
the same run (the training loop's ``measure_matmul_flops``).

Each family's config trains for a few steps through the ordinary loop (recipe, accelerate,
AdamW) into ``OUT/mfu/<label>``. MFU = training FLOPs per second (the recipe's
``flops_per_example``: analytic for the token LM and memory families, counted by torch for the
sentence families, whose SONAR-LLM loss also runs the frozen space decoder; conventions of
:mod:`memlab.flops`) / the matmul's FLOP/s. The
steady-state figure is the loop's last logged window (the first window holds start-up
costs); the whole-run figure is kept too. On CPU mixed precision is turned off, so the
reference matmul (float32) and the training run use the same arithmetic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memlab.paths import configs_dir

DEFAULT_CONFIGS = {
    "token_lm": "configs/token_lm/small.yaml",
    "memory": "configs/memory/ae_small.yaml",
    "memory_combined": "configs/memory/combined_small.yaml",
    "sonar_llm": "configs/sonar_llm/austen_memory_ae.yaml",
    "lcm_mse": "configs/lcm/mse_austen_memory_ae.yaml",
    "lcm_diffusion": "configs/lcm/diffusion_austen_memory_ae.yaml",
}
"""Family label -> the small config whose MFU is measured (skipped when the file is absent); a path under
``configs/`` names a shipped config, read from the installed package whatever the working folder."""

FALLBACK_CONFIGS = {
    "sonar_llm": "configs/sonar_llm/toy.yaml",
    "lcm_mse": "configs/lcm/mse_toy.yaml",
    "lcm_diffusion": "configs/lcm/diffusion_toy.yaml",
}
"""Measured instead when the small config cannot be set up here: the sentence families' small configs
read a trained memory sentence autoencoder (``runs/sentence-ae-deep``); the toy ones need nothing.
The result then names the config it measured and why (``fallback_from``, ``fallback_reason``)."""

CONFIG_OVERRIDES = {
    "memory": ["options.curriculum=null", "options.objective=blank_copy"],
    "memory_combined": ["options.curriculum=null", "options.objective=combined"],
}
"""Per-label overrides: the memory configs start with short-chunk curriculum phases, but the analytic
FLOP count (and so MFU) is that of full chunks, so their MFU is measured on the full-length objective."""


def run_mfu(out_dir: Path, configs: dict[str, str] | None = None, steps: int = 12, cpu: bool = True,
            overrides: list[str] | None = None, log=print, fallbacks: dict[str, str] | None = None) -> dict[str, Any]:
    """MFU of each labelled config; ``fallbacks`` (default: ``FALLBACK_CONFIGS`` with the default configs, none
    with given ones) maps a label to the config measured when its own cannot be set up."""
    from memlab.config import load_config
    from memlab.errors import MemlabError
    from memlab.train.metrics_log import read_metrics
    from memlab.train.experiment import run_experiment

    results: dict[str, Any] = {}
    if fallbacks is None:
        fallbacks = FALLBACK_CONFIGS if configs is None else {}
    half = max(1, steps // 2)
    for label, path in (configs or DEFAULT_CONFIGS).items():
        path = config_path(path)
        if not Path(path).is_file():
            results[label] = {"skipped": f"{path} not found"}
            continue
        ov = [f"train.max_steps={steps}", f"train.log_every={half}", f"train.eval_every={10 * steps}",
              f"train.save_every={10 * steps}", "train.eval_batches=1", "train.warmup_steps=1"]
        ov += CONFIG_OVERRIDES.get(label, [])
        if cpu:
            ov += ["train.mixed_precision='no'", "train.cpu=true"]
        ov += list(overrides or [])
        run_dir = Path(out_dir) / "mfu" / label
        fallback = {}
        try:
            try:
                summary = run_experiment(load_config(path, ov), run_dir)
            except MemlabError as e:
                if label not in fallbacks:
                    raise
                fallback = {"fallback_from": path, "fallback_reason": str(e).splitlines()[0][:200]}
                log(f"mfu {label}: {path} cannot run here ({fallback['fallback_reason']}); measuring {fallbacks[label]}")
                path = config_path(fallbacks[label])
                summary = run_experiment(load_config(path, ov), run_dir)
        except (MemlabError, RuntimeError) as e:
            results[label] = {"error": f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]}", "config": path, **fallback}
            log(f"mfu {label}: {results[label]['error']}")
            continue
        recs = read_metrics(run_dir / "metrics.jsonl")
        train = [r for r in recs if r.get("split") == "train" and "mfu" in r]
        res = {"config": path, "steps": steps, "mfu_steady": train[-1]["mfu"] if train else None,
               "mfu_run": summary.get("mfu"), "matmul_flops_per_s": summary.get("matmul_flops_per_s"),
               "tokens_per_s": summary.get("tokens_per_s"), "parameters": summary.get("parameters"),
               "device": summary.get("device"), "mixed_precision": summary.get("mixed_precision"), **fallback}
        results[label] = res
        log(f"mfu {label}: steady {res['mfu_steady']}, run {res['mfu_run']}, matmul {res['matmul_flops_per_s']}")
    return results


def config_path(path: str | Path) -> str:
    """``path`` where that file exists (absolute, or relative to the working folder); else a relative path is read
    as a shipped config (``configs/token_lm/small.yaml`` or ``token_lm/small.yaml``) in the installed package."""
    p = Path(path)
    if p.is_file() or p.is_absolute():
        return str(p)
    shipped = configs_dir().joinpath(*(p.parts[1:] if p.parts and p.parts[0] == "configs" else p.parts))
    return str(shipped) if shipped.is_file() else str(p)
