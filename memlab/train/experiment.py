"""Run an experiment end to end into a run directory.

``RUN/config.yaml`` (resolved), ``metrics.jsonl``, ``summary.json``,
``checkpoints/step-N/`` and ``plots/*.png``. A run directory that already
holds a run is never overwritten: resume it, or pick another directory.
A command that refuses or fails leaves a run's record (metrics, summary,
config, checkpoints) as it was; training a run again from step 0 is asked for
explicitly (``restart``), never a fallback.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memlab.config import ExperimentConfig, config_text, to_dict
from memlab.errors import MemlabError
from memlab.loading import check_saved_class
from memlab.outdir import cut_back
from memlab.registry import trainable_recipe
from memlab.train import checkpoint as ckpt


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_run_dir(cfg: ExperimentConfig) -> Path:
    """``runs/NAME-TIMESTAMP``, the name cleaned (:func:`memlab.rundir.safe_name`) so it stays inside ``runs/``."""
    from memlab.rundir import safe_name

    return Path("runs") / f"{safe_name(cfg.name)}-{time.strftime('%Y%m%d-%H%M%S')}"


# Fields that a resumed run may change: they alter neither the data order nor the model.
RESUMABLE_OVERRIDES = ("train.max_steps", "train.eval_every", "train.eval_batches", "train.save_every",
                       "train.log_every", "train.keep_checkpoints", "train.progress", "train.log_with")


def check_resume_overrides(overrides: list[str]) -> None:
    for ov in overrides:
        key = ov.split("=", 1)[0].strip()
        if key not in RESUMABLE_OVERRIDES and not known_key(key):
            raise MemlabError(f"unknown config key '{key}'; a resumed run may change: {', '.join(RESUMABLE_OVERRIDES)}")
        if key not in RESUMABLE_OVERRIDES:
            raise MemlabError(
                f"'{key}' cannot change when a run resumes (it would not continue the same run); "
                f"resumable: {', '.join(RESUMABLE_OVERRIDES)}"
            )


def known_key(key: str) -> bool:
    """Whether ``key`` (``section.field``) names a field of the experiment config; the free-form mappings
    (``model.overrides``, ``options``) take any key under them."""
    import dataclasses

    from memlab.config import ExperimentConfig

    cls, parts = ExperimentConfig, key.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None
        if fields is None:
            return True  # inside a mapping: any key
        if part not in fields:
            return False
        tp = fields[part].type
        cls = _dataclass_named(cls, part)
        if cls is None:
            return i == len(parts) - 1 or "dict" in str(tp).lower() or "any" in str(tp).lower()
    return True


def _dataclass_named(owner, name: str):
    import dataclasses
    import typing

    tp = typing.get_type_hints(owner).get(name)
    return tp if dataclasses.is_dataclass(tp) else None


def check_resumable(run_dir: Path) -> None:
    """A one-line MemlabError when ``run_dir`` is not a run that can be resumed (checked before its config is read)."""
    from memlab.rundir import in_use_by

    if not run_dir.exists():
        raise MemlabError(f"cannot resume {run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise MemlabError(f"cannot resume {run_dir}: it is a file, not a run directory")
    if not (run_dir / "config.yaml").is_file():
        who = in_use_by(run_dir)
        if who:  # a fresh run into it is still setting up (it writes config.yaml when its setup succeeds)
            raise MemlabError(f"{run_dir} is in use by {who} (a memlab run writing into it); wait for it to end")
        raise MemlabError(f"cannot resume {run_dir}: it holds no config.yaml (not a run directory)")


def _record(run_dir: Path) -> list[str]:
    """What a run folder holds of its record besides checkpoints (what starting it over would replace)."""
    from memlab.train.metrics_log import read_metrics

    held = []
    n = len(read_metrics(run_dir / "metrics.jsonl", warn=False)) if (run_dir / "metrics.jsonl").is_file() else 0
    if n:
        held.append(f"metrics.jsonl ({n} records)")
    if (run_dir / "summary.json").is_file():
        held.append("summary.json")
    return held


def prepare_run_dir(run_dir: Path, resume: bool, max_steps: int | None = None, restart: bool = False):
    """Check and lock the run directory (:func:`memlab.rundir.claim`), and find the checkpoint to resume.

    Returns ``(checkpoint to resume or None, the claim)``. On resume, a damaged
    newer checkpoint is named in one line and set aside (``step-N.damaged``,
    never deleted); the run continues from the newest intact one. A run that
    already reached ``max_steps`` is refused here, before anything is written.
    A run without a checkpoint is started over only with ``restart`` (or when
    it recorded nothing yet); otherwise it is refused, its record untouched.
    """
    from memlab.rundir import claim

    if not resume:
        if restart:
            raise MemlabError("--restart applies to --resume RUN (a run to train again from step 0)")
        return None, claim(run_dir, fresh=True)
    check_resumable(run_dir)
    lock = claim(run_dir, fresh=False)
    try:
        ckpt.remove_partial_checkpoints(run_dir)  # temporary folders of a save that was cut short
        start = ckpt.newest_intact_checkpoint(
            run_dir, warn=lambda m: print(f"memlab: warning: {m}; resuming from it", file=sys.stderr))
        if start is not None:
            step = ckpt.load_trainer_state(start)["step"]
            if restart:
                raise MemlabError(f"{run_dir} has checkpoint {start.name}: resume it without --restart "
                                  "(--restart trains again only a run that has no checkpoint)")
            if max_steps is not None and step >= max_steps:
                raise MemlabError(f"the run already finished at step {step}; resume with train.max_steps=N "
                                  f"(N > {step}) to extend it")
        elif not restart and (held := _record(run_dir)):
            gone = "is missing" if not (run_dir / "checkpoints").is_dir() else "holds none"
            raise MemlabError(f"cannot resume {run_dir}: it has no checkpoint to continue from (checkpoints/ {gone}); "
                              f"starting over would replace its {' and '.join(held)}: add --restart to train it "
                              "again from step 0, or train into a new --out")
    except BaseException:
        lock.release()
        raise
    return start, lock  # None: start over inside the same run dir (nothing recorded yet, or --restart)


def _write(run_dir: Path, name: str, text: str) -> None:
    """Write one file of the run through the guarded path (a failure is one line naming what the run keeps)."""
    from memlab.rundir import write_atomic

    write_atomic(run_dir / name, text, then=lambda why: ckpt.still_kept(run_dir, why))


class ResumeRecord:
    """What a resume changes in a run's record, held back until a checkpoint holds it, so that a resume that fails
    leaves ``config.yaml``, ``metrics.jsonl`` and ``summary.json`` describing the run's last checkpoint.

    The new ``config.yaml`` (a changed ``train.max_steps``, ...) is written at the resumed run's first checkpoint.
    A run started over (``--restart``) moves its old ``metrics.jsonl`` and ``summary.json`` aside
    (``NAME.replaced``) and drops them at that checkpoint. :meth:`undo` (the resume failed): the records logged
    past the last checkpoint are cut off, and before the first checkpoint the files set aside come back."""

    KEPT = ("metrics.jsonl", "summary.json")

    def __init__(self, run_dir: Path, config: str, restart: bool):
        self.run_dir, self.config, self.restart = run_dir, config, restart
        self.aside: list[tuple[Path, Path]] = []
        self.started_over = self.committed = False

    def set_aside(self) -> None:
        self.started_over = True
        for name in self.KEPT:
            src = self.run_dir / name
            if src.is_file():
                os.replace(src, src.with_name(name + ".replaced"))
                self.aside.append((src.with_name(name + ".replaced"), src))

    def commit(self, _checkpoint: Path | None = None) -> None:
        """A checkpoint holds the resumed run: its config and record are now the run's."""
        if self.committed:
            return
        self.committed = True
        old = self.run_dir / "config.yaml"
        if not old.is_file() or old.read_text() != self.config:
            _write(self.run_dir, "config.yaml", self.config)
        for kept, _ in self.aside:
            kept.unlink(missing_ok=True)

    def undo(self, trainer) -> None:
        if trainer is not None and trainer.metrics_mark is not None:
            cut_back(trainer.metrics_path, trainer.metrics_mark)
        if self.committed:
            return
        if self.started_over:
            for name in self.KEPT:
                (self.run_dir / name).unlink(missing_ok=True)  # what the failed start-over wrote
        for kept, src in self.aside:
            os.replace(kept, src)


def _check_room(run_dir: Path, trainer, start: Path | None, state, env) -> None:
    """The main process checks that the run folder can take a checkpoint (:func:`ckpt.check_room_for_checkpoint`);
    every process raises its verdict."""
    err = None
    if state.is_main_process:
        try:
            ckpt.check_room_for_checkpoint(run_dir, trainer.acc.unwrap_model(trainer.model), start)
        except MemlabError as e:
            err = str(e)
    _raise_everywhere(err, state, env)


def _raise_everywhere(err: str | None, state, env) -> None:
    """The main process's verdict ``err`` (None: no error) raised on every process; the main one prints it."""
    err = env.broadcast(err)
    if err is not None:
        e = MemlabError(err)
        e.quiet = not state.is_main_process
        raise e


def run_experiment(cfg: ExperimentConfig, run_dir: Path | None = None, resume: bool = False,
                   restart: bool = False) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir``; with ``resume``, continue from its newest intact checkpoint
    (``restart``: train a resumed run that has no checkpoint again from step 0, replacing its record).

    On a fresh start the directory is created and locked here, before any
    compute, and removed again if the setup fails before training (so a
    corrected command can reuse it); the resolved config is written once the
    setup has succeeded. The lock is held until the run ends.
    """
    from accelerate import PartialState

    from memlab import tracking
    from memlab.train.processes import SetupEnv, check_batch_split, check_engine, set_rank_threads, use_cpu
    from memlab.train.loop import Trainer

    trackers = tracking.parse_log_with(cfg.train.log_with)
    tracking.check_available(trackers)
    check_engine()  # before the process group starts: a sharded engine's set-up would fail in it
    state = PartialState(cpu=use_cpu(cfg.train))
    set_rank_threads(cfg.train, state)  # before the set-up's precompute: N processes share the host's cores
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
            start, lock = prepare_run_dir(run_dir, resume, cfg.train.max_steps, restart)
        except MemlabError as e:
            err = str(e)
    _raise_everywhere(err, state, env)
    if state.num_processes > 1:  # every process resumes from the checkpoint the main process verified
        name = env.broadcast(str(start) if start is not None else "")
        start = Path(name) if name else None
    tracker, record, trainer = None, None, None
    try:
        seed_everything(cfg.train.seed)
        recipe = trainable_recipe(cfg.recipe)
        setup = recipe.setup(cfg, run_dir, env=env)
        seed_everything(cfg.train.seed + 7919 * state.process_index)  # dropout / sampling streams per process
        trainer = Trainer(setup, cfg.train, run_dir)
        _check_room(run_dir, trainer, start, state, env)  # before the resume touches anything, before any step
        if resume and state.is_main_process:
            record = ResumeRecord(run_dir, config_text(cfg), restart=start is None)
        if start is not None:
            check_saved_class(start, type(trainer.acc.unwrap_model(trainer.model)),
                              asked=f"model.family: {cfg.model.family} in {run_dir / 'config.yaml'}")
            trainer.resume(start)
        elif record is not None:  # asked for (--restart) or nothing recorded: start over cleanly
            record.set_aside()
        if record is not None:  # the new config, and the old record's removal, wait for a checkpoint
            trainer.mark_metrics()
            trainer.on_checkpoint.append(record.commit)
        elif state.is_main_process:
            _write(run_dir, "config.yaml", config_text(cfg))
        if state.is_main_process:
            if trackers:
                tracker = tracking.start(trackers, run_dir, cfg.name, config=to_dict(cfg),
                                         resume_step=trainer.step if resume else None)
                trainer.tracker = tracker
    except BaseException:
        if record is not None:
            record.undo(trainer)
        if lock is not None:
            if resume:
                lock.release()
            else:  # a fresh run: remove what the claim made (a pre-existing empty folder stays, empty)
                lock.abandon()
        raise
    try:
        summary = trainer.train()
        summary.update({"name": cfg.name, "recipe": cfg.recipe, "family": cfg.model.family, "run_dir": str(run_dir)})
        from memlab.data.views import split_description

        if split := split_description(cfg.data):
            summary["data_split"] = split
        if trainer.acc.is_main_process:
            _write(run_dir, "summary.json", json.dumps(summary, indent=2))
            from memlab.plots import plot_metrics

            plot_metrics(run_dir / "metrics.jsonl", run_dir / "plots")
    except BaseException as e:
        if record is not None:  # a resume that fails leaves the record of its last checkpoint
            record.undo(trainer)
        if lock is not None and not resume and not isinstance(e, KeyboardInterrupt) and not ckpt.checkpoint_dirs(run_dir):
            if tracker is not None:
                tracker.finish()
                tracker = None
            lock.abandon()  # a fresh run that failed before its first checkpoint keeps nothing: no half-made folder
        raise
    finally:
        if tracker is not None:
            tracker.finish()
        if lock is not None:
            lock.release()
    return summary
