"""Metrics of the training loop: sums kept on the device, the ln V watch, and ``metrics.jsonl``.

``metrics.jsonl`` holds one JSON record a line, appended by the loop. A crash in the middle of a write leaves a torn last line: it is dropped with
a warning (the record is logged again when the run resumes). A damaged line
elsewhere is an error that names it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from memlab.errors import MemlabError
from memlab.rundir import read_metrics  # noqa: F401  (the loop's reader of its own file, kept with the run folder's)
from memlab.train.setup import StepOutput


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records up to ``step`` (a resumed run writes the later ones again), atomically."""
    path = Path(path)
    if not path.is_file():
        return
    from memlab.rundir import write_atomic

    keep = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))


class MetricWindow:
    """Weighted metric sums of one logging interval, kept on the device.

    Nothing here reads a value back to the host: :meth:`read` does, once, at a
    logging step (one transfer, reduced over processes). The first non-finite
    loss is remembered with its step, so it is reported within one interval.
    """

    def __init__(self, acc):
        self.acc = acc
        # float64 sums where the device has them (MPS has none)
        self.dtype = torch.float32 if acc.device.type == "mps" else torch.float64
        self.reset()

    def reset(self) -> None:
        dev = self.acc.device
        # python numbers stay on the host and tensors on the device: no copy either way until read()
        self.sums: dict[str, Any] = {}
        self.weight: Any = 0.0
        self.bad_step = torch.full((), -1, dtype=torch.long, device=dev)
        self.bad_value = torch.zeros((), dtype=self.dtype, device=dev)

    def _value(self, v: Any) -> Any:
        return v.detach().to(dtype=self.dtype) if torch.is_tensor(v) else float(v)

    def add(self, out: StepOutput, step: int) -> None:
        w = self._value(out.weight)
        for k, v in {"loss": out.loss, **out.metrics}.items():
            t = self._value(v) * w
            self.sums[k] = self.sums[k] + t if k in self.sums else t
        self.weight = self.weight + w
        if torch.is_tensor(out.loss):
            loss = self._value(out.loss)
            first = ~torch.isfinite(loss) & (self.bad_step < 0)
            self.bad_step = torch.where(first, torch.full_like(self.bad_step, step), self.bad_step)
            self.bad_value = torch.where(first, loss.to(self.bad_value.device), self.bad_value)

    def first_nonfinite(self) -> tuple[int, float] | None:
        """(step, loss) of the first non-finite loss of the window on any process, or None (one sync)."""
        t = torch.stack([self.bad_step.to(self.dtype), self.bad_value])  # (2,)
        if self.acc.num_processes > 1:
            t = self.acc.gather(t[None]).view(-1, 2)  # (P, 2)
            bad = [r for r in t.tolist() if r[0] >= 0]
            return (int(min(bad)[0]), min(bad)[1]) if bad else None
        step, value = t.tolist()
        return (int(step), value) if step >= 0 else None

    def read(self) -> dict[str, float]:
        """Weighted means over the window and all processes (one transfer)."""
        keys = sorted(self.sums)
        dev = self.acc.device
        t = torch.stack([v.to(dev) if torch.is_tensor(v) else torch.tensor(v, dtype=self.dtype, device=dev)
                         for v in [self.sums[k] for k in keys] + [self.weight]])  # (K + 1,)
        t = self.acc.reduce(t, reduction="sum") if self.acc.num_processes > 1 else t
        vals = t.tolist()
        w = vals[-1] or 1.0
        return {k: vals[i] / w for i, k in enumerate(keys)}


def read_groups(windows: dict[str, MetricWindow]) -> dict[str, float]:
    """The metrics of an evaluation's windows (``TrainSetup.eval_step_fn`` groups): all of group ``loss``, then
    every other group's metrics but its loss, in order, replacing same-named ones."""
    metrics: dict[str, float] = {}
    for name, window in windows.items():
        m = window.read()
        metrics.update(m if name == "loss" else {k: v for k, v in m.items() if k != "loss"})
    return metrics


class UniformWatch:
    """Warns once when the training loss sits at ln V, a uniform prediction over the vocabulary.

    A fresh model starts there, so it counts only after warmup or once the loss
    has been lower; ``streak`` logging records in a row within 1 % of ln V warn.
    """

    def __init__(self, vocab_size: int | None, warmup_steps: int, streak: int = 3, tol: float = 0.01):
        self.ln_v = math.log(vocab_size) if vocab_size and vocab_size > 1 else None
        self.warmup, self.streak, self.tol = warmup_steps, streak, tol
        self.count, self.learned, self.warned = 0, False, False

    def update(self, step: int, loss: float) -> str | None:
        if self.ln_v is None or self.warned or not math.isfinite(loss):
            return None
        at = abs(loss - self.ln_v) <= self.tol * self.ln_v
        if loss < (1 - 10 * self.tol) * self.ln_v:
            self.learned = True
        self.count = self.count + 1 if at and (self.learned or step > self.warmup) else 0
        if self.count >= self.streak:
            self.warned = True
            return (f"the training loss has sat at ln V = {self.ln_v:.3f} (a uniform guess over the vocabulary) for "
                    f"{self.count} logging steps up to step {step}: the model has stopped learning (train.lr too high?)")
        return None
