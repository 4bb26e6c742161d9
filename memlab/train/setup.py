"""What a recipe hands the training loop.

A *recipe* (registered in ``memlab.registry.RECIPES``) turns an
:class:`~memlab.config.ExperimentConfig` into a :class:`TrainSetup`: the
model, map-style datasets, a loss function and optional callbacks (for
example a curriculum that switches objectives). The loop knows nothing else
about the model family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import torch


@dataclass
class StepOutput:
    """A loss to minimise and scalar metrics to log (tensors or floats)."""

    loss: torch.Tensor
    metrics: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    """Weight of this batch when metrics are averaged (e.g. its number of target tokens)."""


class Callback:
    """Hooks into the loop. State returned by :meth:`state_dict` is checkpointed and restored on resume."""

    def on_step_start(self, step: int) -> None:
        """Called before every optimizer step."""

    def on_eval(self, step: int, metrics: dict[str, float]) -> dict[str, Any]:
        """Called after every evaluation; returns extra fields to log."""
        return {}

    def log_fields(self) -> dict[str, Any]:
        """Extra fields added to every metrics.jsonl record (e.g. the curriculum phase)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class TrainSetup:
    model: torch.nn.Module
    """A transformers ``PreTrainedModel`` (saved with ``save_pretrained``)."""
    train_data: torch.utils.data.Dataset
    eval_data: torch.utils.data.Dataset | None
    loss_fn: Callable[[torch.nn.Module, dict], StepOutput]
    """``loss_fn(model, batch) -> StepOutput``; used for training and (under no_grad) for evaluation."""
    collate_fn: Callable | None = None
    eval_fn: Callable[[torch.nn.Module, Any], dict[str, float]] | None = None
    """Optional extra evaluation ``eval_fn(model, eval_batches) -> metrics`` (e.g. generation metrics), run after
    the loss pass over the same batches; its metrics replace loss metrics of the same name."""
    eval_step_fn: Callable[[torch.nn.Module, dict], dict[str, StepOutput]] | None = None
    """Optional evaluation of one batch that replaces the loop's own loss pass, for a recipe whose evaluation
    metrics share work with its loss (a memory model's objectives share one encoder pass):
    ``eval_step_fn(model, batch) -> {group: StepOutput}``. Group ``"loss"`` is required and is logged as
    ``loss_fn``'s output would be (``loss`` and its metrics); every other group's metrics (not its loss) are
    averaged over the batches with that group's own weights and, in the order given, replace same-named
    metrics. Called under no_grad and autocast with the model as the loop holds it (wrapped under DDP: compute
    through its forward, :mod:`memlab.forward`); nothing in it should read a device value back (the loop reads
    every sum once per evaluation)."""
    callbacks: list[Callback] = field(default_factory=list)
    tokenizer: Any = None
    """Saved beside the model in every checkpoint."""
    tokens_per_example: int = 0
    """For throughput: tokens the model processes per example."""
    flops_per_example: float | Callable[[], float] = 0.0
    """For model FLOPs utilisation: training FLOPs (forward + backward) per example, 0 if unknown; a callable
    when they change during training (a curriculum's phases), read at every optimizer step."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Extra facts recorded in summary.json (data sizes, parameter counts)."""
    unused_parameters: bool = False
    """Some trainable parameters get no gradient in some steps by design (a memory model's curriculum phases use
    different decoder parts): under DDP the engine then finds them after every forward (``find_unused_parameters``).
    Parameters that are never used must be frozen instead. The loss must then run in one forward of the model
    (:func:`memlab.forward.run_in_forward`)."""

    def step_flops_per_example(self) -> float:
        """Training FLOPs per example of the coming optimizer step."""
        f = self.flops_per_example
        return float(f() if callable(f) else f)


class Recipe(Protocol):
    name: str
    options_class: type | None

    def setup(self, cfg: Any, run_dir: Path, env: Any = None) -> TrainSetup:
        """``env``: a :class:`memlab.train.processes.SetupEnv` (the accelerator's device and the launch's processes;
        None: one process on the CPU). Frozen-model precompute (embedding caches, frozen-encoder memories,
        measured FLOPs) runs on ``env.device``, once across processes, and every process reads the same result."""
