"""Experiment tracking through accelerate's trackers (``train.log_with``).

``tensorboard`` (the offline choice; a dependency of memlab), ``wandb`` and
``mlflow`` (install them yourself), several at once, or none. Every record
that goes to ``metrics.jsonl`` is logged at its step, as ``SPLIT/KEY``
(``train/loss``, ``eval/token_accuracy``, ``train/phase`` ...; text fields as
text); the resolved config is stored once as hyperparameters.

TensorBoard writes into ``RUN/tensorboard/``: ``tensorboard --logdir
RUN/tensorboard`` (or ``--logdir runs`` to compare runs). A resumed run
continues the same tracker run: TensorBoard drops the events past the
checkpoint it resumes from (``purge_step``), W&B and MLflow reopen the run
whose id was kept in ``RUN/tracking.json``.

:func:`log_report` logs a finished report (a probe's) as one step.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from memlab.errors import ConfigError

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""Tracker name -> the package it needs."""
STATE_FILE = "tracking.json"
TB_DIR = "tensorboard"


def parse_log_with(value: Any) -> list[str]:
    """``None``/``none``/``[]`` -> []; a name, ``a,b`` or a list -> validated names (one-line ConfigError)."""
    if value is None:
        return []
    names = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = []
    for n in names:
        n = str(n).strip().lower()
        if n in ("", "none", "false"):
            continue
        if n not in TRACKERS:
            raise ConfigError(f"'train.log_with': unknown tracker '{n}'; use {', '.join(TRACKERS)} or none "
                              "(several: [tensorboard, wandb])")
        if n not in out:
            out.append(n)
    return out


def check_available(names: list[str]) -> None:
    """One line when a tracker's package is not installed."""
    for n in names:
        if importlib.util.find_spec(TRACKERS[n]) is None:
            raise ConfigError(f"'train.log_with={n}' needs the {TRACKERS[n]} package, which is not installed "
                              f"(pip install {TRACKERS[n]}), or leave {n} out of train.log_with")


def flatten(d: dict, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """A nested config -> ``{"a.b": value}`` with values TensorBoard's hparams accept (bool, int, float, str)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + sep, sep))
        elif isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = str(v)
    return out


def record_values(record: dict[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl record -> tracker values named ``SPLIT/KEY`` (numbers as scalars, strings as text)."""
    split = record.get("split", "train")
    out: dict[str, Any] = {}
    for k, v in record.items():
        if k in ("step", "split") or v is None:
            continue
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, (int, float, str)):
            out[f"{split}/{k}"] = v
    return out


class Tracker:
    """accelerate's trackers for one run folder (main process only)."""

    def __init__(self, names: list[str], run_dir: Path, run_name: str, config: dict | None, resume_step: int | None):
        self.names, self.run_dir = names, Path(run_dir)
        state_path = self.run_dir / STATE_FILE
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        self.trackers = []
        for n in names:
            t = self._make(n, run_name, state, resume_step)
            t.start()
            self.trackers.append(t)
        state.update({n: self._run_id(n, t) for n, t in zip(names, self.trackers) if self._run_id(n, t)})
        if state:
            from memlab.rundir import write_atomic

            write_atomic(state_path, json.dumps(state, indent=1))
        if config is not None and resume_step is None:  # hyperparameters once, when the run starts
            values = flatten(config)
            for t in self.trackers:
                t.store_init_configuration(values)

    def _make(self, name: str, run_name: str, state: dict, resume_step: int | None):
        from accelerate import tracking

        if name == "tensorboard":
            kw = {"purge_step": resume_step + 1} if resume_step is not None else {}
            return tracking.TensorBoardTracker("", str(self.run_dir / TB_DIR), **kw)
        if name == "wandb":
            kw = {"dir": str(self.run_dir)}
            if state.get("wandb"):
                kw.update(id=state["wandb"], resume="allow")
            return tracking.WandBTracker(run_name, **kw)
        return tracking.MLflowTracker(run_name, str(self.run_dir / "mlruns"), run_id=state.get("mlflow"),
                                      run_name=run_name)

    @staticmethod
    def _run_id(name: str, t) -> str | None:
        if name == "wandb":
            return getattr(getattr(t, "run", None), "id", None)
        if name == "mlflow":
            return getattr(getattr(getattr(t, "active_run", None), "info", None), "run_id", None)
        return None

    def log(self, record: dict[str, Any], step: int) -> None:
        values = record_values(record)
        for t in self.trackers:
            t.log(values, step=step)

    def finish(self) -> None:
        for t in self.trackers:
            t.finish()
        self.trackers = []


def start(log_with: Any, run_dir: Path, run_name: str, config: dict | None = None,
          resume_step: int | None = None) -> Tracker | None:
    """A :class:`Tracker` for ``train.log_with`` (None when it names no tracker)."""
    names = parse_log_with(log_with)
    if not names:
        return None
    check_available(names)
    return Tracker(names, run_dir, run_name, config, resume_step)


def log_report(report: dict[str, Any], run_dir: str | Path, log_with: Any = "tensorboard", name: str = "probe",
               step: int = 0) -> None:
    """Log a finished report's numbers (nested keys joined with '/') and its options as hyperparameters."""
    numbers = flatten({k: v for k, v in report.items() if k not in ("options", "history", "examples")}, sep="/")
    values = {k: v for k, v in numbers.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    t = start(log_with, Path(run_dir), name, config=report.get("options") if isinstance(report.get("options"), dict) else None)
    if t is None:
        return
    for tr in t.trackers:
        tr.log(values, step=step)
    t.finish()
