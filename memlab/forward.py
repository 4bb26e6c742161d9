"""The one calling convention between losses and models: everything that computes goes through ``forward``.

Under data parallelism (DDP) or sharding (FSDP) the training loop hands a loss
a *wrapper* around the model. A wrapper has none of the model's own methods
(``encode_chunks``, ``decode_features``, ``sample``), and its gradient
synchronisation is prepared inside its ``forward`` alone: calling the inner
module's methods directly (``model.module.encode_chunks``) would compute, but
silently train each process on its own gradients. So losses, evaluation and
generation call a model only as ``model(...)``:

* a family's own forward arguments (a mode argument where one model does several things, e.g.
  ``LCMDiffusionModel(..., mode="sample")``), or
* :data:`RUN`: ``model(mode="run", fn=fn, args=(...))`` runs ``fn(bare_model, *args)`` *inside* the
  forward, so a loss that needs several of the model's methods (an encoder pass, then two decoder
  passes) runs them all in one forward of the wrapper, on the bare module. :func:`run_in_forward`
  is the caller's side, :func:`run_mode` the model's.

The contract is the :class:`RunsInForward` protocol; objectives check it with
:func:`check_runs_in_forward` before their first step. Reading a model's
configuration (no compute) goes through :func:`bare`.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import torch

from memlab.errors import ModelError

RUN = "run"
"""The forward mode that runs a function of the bare model inside the (wrapped) model's forward."""


@runtime_checkable
class RunsInForward(Protocol):
    """What a model must do for a loss to drive it through any wrapper.

    * ``forward_modes``: the ``mode=`` values its ``forward`` accepts, including :data:`RUN`;
    * ``forward(..., mode=RUN, fn=fn, args=(...))`` returns ``fn(self, *args)`` (:func:`run_mode`), and
      does nothing else: no other argument is read, no output is wrapped;
    * every other call of ``forward`` keeps its transformers meaning.

    Everything ``fn`` computes happens inside the wrapper's forward, so DDP's reducer sees all of it;
    parameters that ``fn`` does not use in a step get no gradient (frozen ones are skipped, others are
    declared with ``TrainSetup.unused_parameters``).
    """

    forward_modes: ClassVar[tuple[str, ...]]

    def forward(self, *args: Any, **kwargs: Any) -> Any: ...


def bare(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside any wrappers (DDP / FSDP ``.module``, ``torch.compile``'s ``_orig_mod``): for reading its
    configuration and attributes, never for computing a loss (use :func:`run_in_forward`)."""
    seen = 0
    while seen < 8:
        inner = getattr(model, "module", None) if isinstance(getattr(model, "module", None), torch.nn.Module) else None
        inner = inner if inner is not None else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model, seen = inner, seen + 1
    return model


def run_mode(model: torch.nn.Module, fn: Callable | None, args: tuple = (), kwargs: dict | None = None) -> Any:
    """The model's side of :data:`RUN` (call it first thing in ``forward`` when ``mode == RUN``)."""
    if fn is None:
        raise ModelError(f"{type(model).__name__}.forward(mode='run') needs fn=")
    return fn(model, *args, **(kwargs or {}))


def run_in_forward(model: torch.nn.Module, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(bare_model, *args, **kwargs)``, computed inside ``model``'s forward (bare or wrapped alike)."""
    return model(mode=RUN, fn=fn, args=args, kwargs=kwargs)


def check_runs_in_forward(model: torch.nn.Module, who: str, needs: tuple[str, ...] = ()) -> None:
    """A :class:`~memlab.errors.ModelError` naming what is missing when ``model`` (bare or wrapped) does not
    follow :class:`RunsInForward` or lacks one of the methods in ``needs`` that ``who`` calls inside it."""
    inner = bare(model)
    name = type(inner).__name__
    modes = getattr(inner, "forward_modes", None)
    if not isinstance(inner, RunsInForward) or RUN not in (modes or ()):
        raise ModelError(f"{who} drives a model through forward(mode='run'); {name} does not declare it in "
                         f"forward_modes (see memlab.forward.RunsInForward)")
    missing = [n for n in needs if not callable(getattr(inner, n, None))]
    if missing:
        raise ModelError(f"{who} needs {', '.join(missing)} of the model; {name} has none")
