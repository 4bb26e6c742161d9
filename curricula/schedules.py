"""Curricula: schedules of objectives, run as a training-loop Callback.

A curriculum is a list of :class:`Phase`s. A phase trains one objective and ends
after a number of steps, when an evaluation metric crosses a threshold, or when
it stops improving (plateau); the last phase runs to the end of training. The
current phase and its start step are logged in every ``metrics.jsonl`` record
(``phase``, ``objective``) and checkpointed through the Callback state, so a
run resumed in the middle of a phase continues that phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memlab.config import from_dict
from memlab.errors import ConfigError, MemlabError
from memlab.registry import CURRICULA, OBJECTIVES
from memlab.train.setup import Callback, StepOutput


@dataclass
class Phase:
    """One phase of a curriculum."""

    objective: str = "blank_copy"
    """Registered objective (``memlab list``) trained in this phase."""
    steps: int | None = None
    """End the phase after this many optimizer steps in it."""
    metric: str | None = None
    """Evaluation metric watched by ``threshold`` / ``patience`` (e.g. ``blank_copy_accuracy``)."""
    threshold: float | None = None
    """End the phase at the first evaluation where ``metric`` reaches this value (>= for mode max, <= for min)."""
    patience: int | None = None
    """End the phase after this many evaluations without an improvement of ``metric`` by ``min_delta`` (plateau)."""
    min_delta: float = 0.0
    """Smallest change of ``metric`` that counts as an improvement."""
    mode: str = "max"
    """``max`` if a larger ``metric`` is better (accuracies), ``min`` for losses."""
    options: dict | None = None
    """Keyword options of the objective (e.g. ``{weight: 0.5}`` for ``combined``)."""


def make_phase(spec: dict | Phase) -> Phase:
    p = spec if isinstance(spec, Phase) else from_dict(Phase, spec, prefix="phase.")
    if p.objective not in OBJECTIVES:
        raise MemlabError(f"curriculum phase names unknown objective '{p.objective}'; known: {', '.join(OBJECTIVES.names())}")
    if p.mode not in ("max", "min"):
        raise ConfigError(f"phase mode must be 'max' or 'min', got {p.mode!r}")
    if (p.threshold is not None or p.patience is not None) and not p.metric:
        raise ConfigError(f"phase '{p.objective}': threshold/patience need a 'metric'")
    if p.steps is not None and p.steps < 1:
        raise ConfigError(f"phase '{p.objective}': steps must be >= 1")
    return p


class PhaseSchedule(Callback):
    """Switches objectives by step count, metric threshold or plateau; usable as ``loss_fn``."""

    def __init__(self, phases: list[dict | Phase], objective_options: dict[str, dict] | None = None):
        from memlab.curricula.objectives import make_objective

        if not phases:
            raise ConfigError("a curriculum needs at least one phase")
        self.phases = [make_phase(p) for p in phases]
        base = objective_options or {}
        self.objectives = [make_objective(p.objective, **{**base.get(p.objective, {}), **(p.options or {})})
                           for p in self.phases]
        self.index, self.start, self.best, self.bad = 0, 0, None, 0
        self.step = 0
        self.switches: list[dict[str, Any]] = []

    @property
    def phase(self) -> Phase:
        return self.phases[self.index]

    @property
    def objective(self):
        return self.objectives[self.index]

    def __call__(self, model, batch: dict) -> StepOutput:
        return self.objective(model, batch)

    def _advance(self, step: int, reason: str) -> dict[str, Any]:
        rec = {"phase_end": self.index, "phase_end_reason": reason, "phase_end_step": step}
        self.switches.append(rec)
        self.index += 1
        self.start, self.best, self.bad = step, None, 0
        return rec

    def on_step_start(self, step: int) -> None:
        self.step = step
        p = self.phase
        if self.index < len(self.phases) - 1 and p.steps is not None and step - self.start >= p.steps:
            self._advance(step, "steps")

    def on_eval(self, step: int, metrics: dict[str, float]) -> dict[str, Any]:
        p = self.phase
        if self.index >= len(self.phases) - 1 or not p.metric:
            return {}
        if p.metric not in metrics:
            raise MemlabError(f"curriculum metric '{p.metric}' is not among the evaluation metrics: {', '.join(sorted(metrics))}")
        v = float(metrics[p.metric])
        sign = 1.0 if p.mode == "max" else -1.0
        if p.threshold is not None and sign * (v - p.threshold) >= 0:
            return self._advance(step, f"{p.metric}={v:.4f} reached {p.threshold}")
        if p.patience is not None:
            if self.best is None or sign * (v - self.best) > p.min_delta:
                self.best, self.bad = v, 0
            else:
                self.bad += 1
                if self.bad >= p.patience:
                    return self._advance(step, f"{p.metric} plateaued at {self.best:.4f}")
        return {}

    def log_fields(self) -> dict[str, Any]:
        return {"phase": self.index, "objective": self.phase.objective, "phase_start": self.start}

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index, "start": self.start, "best": self.best, "bad": self.bad, "switches": self.switches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index, self.start = int(state["index"]), int(state["start"])
        self.best, self.bad = state.get("best"), int(state.get("bad", 0))
        self.switches = list(state.get("switches", []))


@dataclass
class CurriculumSpec:
    """What every registered curriculum is built from (a recipe's options); each reads the fields it uses."""

    phases: list = field(default_factory=list)
    """Phases in full (mappings of :class:`Phase` fields): the ``phases`` curriculum."""
    switch_threshold: float = 0.9
    """``blank_copy_then_next_token``: blank-copy accuracy that ends the first phase."""
    switch_max_steps: int | None = None
    """``blank_copy_then_next_token``: the first phase ends after at most this many steps."""
    objective_options: dict = field(default_factory=dict)
    """Keyword options per objective name (e.g. ``{"combined": {"weight": 0.3}}``); a phase's own win."""


def phases_curriculum(spec: CurriculumSpec) -> PhaseSchedule:
    """Phases given in full in the config (``options.phases``)."""
    if not spec.phases:
        raise ConfigError("curriculum 'phases' needs options.phases")
    return PhaseSchedule(spec.phases, spec.objective_options)


def blank_copy_then_next_token(spec: CurriculumSpec) -> PhaseSchedule:
    """Blank copy until blank-copy accuracy >= ``switch_threshold`` (or ``switch_max_steps``), then next token."""
    first = {"objective": "blank_copy", "metric": "blank_copy_accuracy", "threshold": spec.switch_threshold,
             "steps": spec.switch_max_steps}
    return PhaseSchedule([first, {"objective": "next_token"}], spec.objective_options)


CURRICULA.register("phases", phases_curriculum, description=phases_curriculum.__doc__)
CURRICULA.register("blank_copy_then_next_token", blank_copy_then_next_token, description=blank_copy_then_next_token.__doc__)
