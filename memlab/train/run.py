"""Run an experiment end to end into a run directory.

``RUN/config.yaml`` (resolved), ``metrics.jsonl``, ``summary.json``,
``checkpoints/step-N/`` and ``plots/*.png``. A run directory that already
holds a run is never overwritten: resume it, or pick another directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memlab.config import ExperimentConfig, save_config
from memlab.errors import MemlabError
from memlab.registry import trainable_recipe
from memlab.train import checkpoint as ckpt


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_run_dir(cfg: ExperimentConfig) -> Path:
    return Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


# Fields that a resumed run may change: they alter neither the data order nor the model.
RESUMABLE_OVERRIDES = ("train.max_steps", "train.eval_every", "train.eval_batches", "train.save_every",
                       "train.log_every", "train.keep_checkpoints", "train.progress")


def check_resume_overrides(overrides: list[str]) -> None:
    for ov in overrides:
        key = ov.split("=", 1)[0].strip()
        if key not in RESUMABLE_OVERRIDES:
            raise MemlabError(
                f"'{key}' cannot change when a run resumes (it would not continue the same run); "
                f"resumable: {', '.join(RESUMABLE_OVERRIDES)}"
            )


def prepare_run_dir(run_dir: Path, resume: bool) -> tuple[Path | None, bool]:
    """Create the run directory, or find the checkpoint to resume.

    Returns ``(checkpoint to resume or None, whether this call created the directory)``.
    """
    if resume:
        if not (run_dir / "config.yaml").is_file():
            raise MemlabError(f"cannot resume {run_dir}: it holds no config.yaml")
        return ckpt.latest_checkpoint(run_dir), False  # None: start over inside the same run dir
    if run_dir.exists() and not run_dir.is_dir():
        raise MemlabError(f"--out {run_dir} is a file, not a directory")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise MemlabError(f"run directory {run_dir} already holds files; resume it with --resume or choose --out")
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MemlabError(f"cannot create run directory {run_dir}: {e.strerror}") from None
    return None, created


def _broadcast(state, obj: Any) -> Any:
    if state.num_processes == 1:
        return obj
    from accelerate.utils import broadcast_object_list

    box = [obj]
    broadcast_object_list(box, from_process=0)
    return box[0]


def run_experiment(cfg: ExperimentConfig, run_dir: Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir``; with ``resume``, continue from its latest checkpoint.

    On a fresh start the directory is created here and removed again if the
    setup fails before training (so a corrected command can reuse it); the
    resolved config is written once the setup has succeeded.
    """
    from accelerate import PartialState

    from memlab.train.loop import Trainer, use_cpu

    state = PartialState(cpu=use_cpu(cfg.train))
    run_dir = Path(_broadcast(state, str(run_dir if run_dir is not None else default_run_dir(cfg))))
    err, start, created = None, None, False
    if state.is_main_process:
        try:
            start, created = prepare_run_dir(run_dir, resume)
        except MemlabError as e:
            err = str(e)
    err = _broadcast(state, err)
    if err is not None:
        raise MemlabError(err)
    if not state.is_main_process:
        start = ckpt.latest_checkpoint(run_dir) if resume else None
    try:
        seed_everything(cfg.train.seed)
        recipe = trainable_recipe(cfg.recipe)
        setup = recipe.setup(cfg, run_dir)
        seed_everything(cfg.train.seed + 7919 * state.process_index)  # dropout / sampling streams per process
        trainer = Trainer(setup, cfg.train, run_dir)
        if start is not None:
            trainer.resume(start)
        elif resume and state.is_main_process:  # killed before its first checkpoint: start over cleanly
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    except BaseException:
        if created and state.is_main_process:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if state.is_main_process:
        save_config(cfg, run_dir / "config.yaml")
    summary = trainer.train()
    summary.update({"name": cfg.name, "recipe": cfg.recipe, "family": cfg.model.family, "run_dir": str(run_dir)})
    if trainer.acc.is_main_process:
        tmp = run_dir / f"summary.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, run_dir / "summary.json")
        from memlab.plots import plot_metrics

        plot_metrics(run_dir / "metrics.jsonl", run_dir / "plots")
    return summary
