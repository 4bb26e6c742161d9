"""Run an experiment end to end into a run directory.

``RUN/config.yaml`` (resolved), ``metrics.jsonl``, ``summary.json``,
``checkpoints/step-N/`` and ``plots/*.png``. A run directory that already
holds a run is never overwritten: resume it, or pick another directory.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memlab.config import ExperimentConfig, save_config
from memlab.errors import MemlabError
from memlab.registry import RECIPES
from memlab.train import checkpoint as ckpt


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_run_dir(cfg: ExperimentConfig) -> Path:
    return Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(run_dir: Path, resume: bool) -> Path | None:
    """Create the run directory, or find the checkpoint to resume. Returns that checkpoint."""
    if resume:
        if not (run_dir / "config.yaml").is_file():
            raise MemlabError(f"cannot resume {run_dir}: it holds no config.yaml")
        return ckpt.latest_checkpoint(run_dir)  # None: start over inside the same run dir
    if run_dir.exists() and any(run_dir.iterdir()):
        raise MemlabError(f"run directory {run_dir} already holds files; resume it with --resume or choose --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    return None


def run_experiment(cfg: ExperimentConfig, run_dir: Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir``; with ``resume``, continue from its latest checkpoint."""
    from accelerate import PartialState

    from memlab.train.loop import Trainer, use_cpu

    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    state = PartialState(cpu=use_cpu(cfg.train))
    start = None
    if state.is_main_process:
        start = prepare_run_dir(run_dir, resume)
        save_config(cfg, run_dir / "config.yaml")
    state.wait_for_everyone()
    if not state.is_main_process:
        start = ckpt.latest_checkpoint(run_dir) if resume else None
    seed_everything(cfg.train.seed)
    recipe = RECIPES.get(cfg.recipe)
    setup = recipe.setup(cfg, run_dir)
    seed_everything(cfg.train.seed + 7919 * state.process_index)  # dropout / sampling streams per process
    trainer = Trainer(setup, cfg.train, run_dir)
    if start is not None:
        trainer.resume(start)
    summary = trainer.train()
    summary.update({"name": cfg.name, "recipe": cfg.recipe, "family": cfg.model.family, "run_dir": str(run_dir)})
    if trainer.acc.is_main_process:
        tmp = run_dir / f"summary.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, run_dir / "summary.json")
        from memlab.plots import plot_metrics

        plot_metrics(run_dir / "metrics.jsonl", run_dir / "plots")
    return summary
