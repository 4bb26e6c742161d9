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
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memlab.config import ExperimentConfig, save_config, to_dict
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
                       "train.log_every", "train.keep_checkpoints", "train.progress", "train.log_with")


def check_resume_overrides(overrides: list[str]) -> None:
    for ov in overrides:
        key = ov.split("=", 1)[0].strip()
        if key not in RESUMABLE_OVERRIDES:
            raise MemlabError(
                f"'{key}' cannot change when a run resumes (it would not continue the same run); "
                f"resumable: {', '.join(RESUMABLE_OVERRIDES)}"
            )


def prepare_run_dir(run_dir: Path, resume: bool):
    """Check and lock the run directory (:func:`memlab.rundir.claim`), and find the checkpoint to resume.

    Returns ``(checkpoint to resume or None, the claim)``. On resume, a damaged
    newer checkpoint is named in one line and set aside (``step-N.damaged``,
    never deleted); the run continues from the newest intact one.
    """
    from memlab.rundir import claim

    if resume:
        if not (run_dir / "config.yaml").is_file():
            raise MemlabError(f"cannot resume {run_dir}: it holds no config.yaml")
        lock = claim(run_dir, fresh=False)
        try:
            start = ckpt.newest_intact_checkpoint(
                run_dir, warn=lambda m: print(f"memlab: warning: {m}; resuming from it", file=sys.stderr))
            if start is not None:
                ckpt.set_aside_newer(run_dir, start)
        except BaseException:
            lock.release()
            raise
        return start, lock  # None: start over inside the same run dir
    return None, claim(run_dir, fresh=True)


def _write_summary(run_dir: Path, summary: dict) -> None:
    tmp = run_dir / f"summary.json.tmp{os.getpid()}"
    try:
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, run_dir / "summary.json")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise MemlabError(ckpt.save_failure(run_dir, "summary.json", e)) from None


def run_experiment(cfg: ExperimentConfig, run_dir: Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir``; with ``resume``, continue from its newest intact checkpoint.

    On a fresh start the directory is created and locked here, before any
    compute, and removed again if the setup fails before training (so a
    corrected command can reuse it); the resolved config is written once the
    setup has succeeded. The lock is held until the run ends.
    """
    from accelerate import PartialState

    from memlab import tracking
    from memlab.train.devices import SetupEnv, check_batch_split, check_engine, use_cpu
    from memlab.train.loop import Trainer

    trackers = tracking.parse_log_with(cfg.train.log_with)
    tracking.check_available(trackers)
    check_engine()  # before the process group starts: a sharded engine's set-up would fail in it
    state = PartialState(cpu=use_cpu(cfg.train))
    try:  # the launch itself, before any compute and before the run directory is touched
        check_engine(state)
        check_batch_split(cfg.train, state.num_processes)
    except MemlabError as e:
        e.quiet = not state.is_main_process  # every process finds it: one of them prints it
        raise
    env = SetupEnv.from_state(state)
    run_dir = Path(env.broadcast(str(run_dir if run_dir is not None else default_run_dir(cfg))))
    err, start, lock = None, None, None
    if state.is_main_process:
        try:
            start, lock = prepare_run_dir(run_dir, resume)
        except MemlabError as e:
            err = str(e)
    err = env.broadcast(err)
    if err is not None:
        e = MemlabError(err)
        e.quiet = not state.is_main_process
        raise e
    if state.num_processes > 1:  # every process resumes from the checkpoint the main process verified
        name = env.broadcast(str(start) if start is not None else "")
        start = Path(name) if name else None
    created = lock is not None and lock.created
    tracker = None
    try:
        seed_everything(cfg.train.seed)
        recipe = trainable_recipe(cfg.recipe)
        setup = recipe.setup(cfg, run_dir, env=env)
        seed_everything(cfg.train.seed + 7919 * state.process_index)  # dropout / sampling streams per process
        trainer = Trainer(setup, cfg.train, run_dir)
        if start is not None:
            trainer.resume(start)
        elif resume and state.is_main_process:  # killed before its first checkpoint: start over cleanly
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        if state.is_main_process:
            try:
                save_config(cfg, run_dir / "config.yaml")
            except OSError as e:
                raise MemlabError(f"cannot write {run_dir / 'config.yaml'}: {e.strerror}") from None
            if trackers:
                tracker = tracking.start(trackers, run_dir, cfg.name, config=to_dict(cfg),
                                         resume_step=trainer.step if resume else None)
                trainer.tracker = tracker
    except BaseException:
        if lock is not None:
            lock.release()
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            elif not resume:  # a pre-existing empty folder: leave it empty
                from memlab.rundir import LOCK_NAME

                (run_dir / LOCK_NAME).unlink(missing_ok=True)
        raise
    try:
        summary = trainer.train()
        summary.update({"name": cfg.name, "recipe": cfg.recipe, "family": cfg.model.family, "run_dir": str(run_dir)})
        from memlab.data.views import split_description

        if split := split_description(cfg.data):
            summary["data_split"] = split
        if trainer.acc.is_main_process:
            _write_summary(run_dir, summary)
            from memlab.plots import plot_metrics

            plot_metrics(run_dir / "metrics.jsonl", run_dir / "plots")
    finally:
        if tracker is not None:
            tracker.finish()
        if lock is not None:
            lock.release()
    return summary
