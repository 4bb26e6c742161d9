"""Learning-rate schedules: one implementation, used by the training loop, the probes and the toy spaces."""

from __future__ import annotations

import math


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based).

    Linear warmup from ``1 / warmup_steps`` to 1 over the first ``warmup_steps`` steps, then a
    half cosine from 1 down to ``min_ratio`` at ``total_steps`` (held there afterwards).
    ``warmup_steps = 0`` starts the cosine at step 0.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))
