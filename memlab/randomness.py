"""Randomness drawn per example, so that a loss does not depend on how a batch is split.

A loss that draws noise (diffusion timesteps and noise, memory noise, memory
mixtures) from the global RNG gets other numbers when the same global batch is
shared out over 2 processes instead of 1, or over accumulation steps. Here every
example carries a seed (``batch["example_seed"]``, set by the training loop from
the run's seed, the step and the example's index in its dataset), and the draws
are a counter-based hash of ``(seed, stream, element)`` computed on the device:
the same numbers wherever the example lands, nothing read back, no generator
state to checkpoint.

Without seeds (a batch built outside the loop) the functions fall back to the
global RNG, as before.
"""

from __future__ import annotations

import math

import torch

SEED_KEY = "example_seed"
"""Batch key of the per-example seeds ``(B,)`` int64."""

_MASK = 0xFFFFFFFF
_C1, _C2 = 0x7FEB352D, 0x68E31DA5  # odd 31-bit multipliers: a 32-bit value times one fits in int64


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) of int64 tensors holding values in ``[0, 2^32)``."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _MASK
    x = x ^ (x >> 15)
    x = (x * _C2) & _MASK
    return x ^ (x >> 16)


def example_seeds(seed: int, step: int, indices: torch.Tensor) -> torch.Tensor:
    """``(B,)`` seeds in ``[0, 2^32)`` of the examples at dataset ``indices`` in optimizer step ``step``."""
    base = _mix(torch.tensor([(seed * 1000003 + step) & _MASK], dtype=torch.long))
    return _mix(((indices.long() * 0x1E3779B1) & _MASK) ^ base)  # (B,)


def uniform(seeds: torch.Tensor | None, shape: tuple[int, ...], stream: int, device=None) -> torch.Tensor:
    """``(B, *shape)`` float32 uniforms in ``(0, 1)``: example ``b``'s numbers depend on ``seeds[b]`` and ``stream``
    only. ``seeds=None``: the global RNG (``B`` is then ``shape[0]``)."""
    if seeds is None:
        return torch.rand(shape, device=device).clamp(min=2.0**-32)
    n = math.prod(shape)
    counter = torch.arange(n, device=seeds.device, dtype=torch.long)  # (n,)
    # every product is a 32-bit value times a 31-bit constant, masked before the sum: no int64 overflow
    s = (seeds.long()[:, None] * 0x1E3779B1) & _MASK  # (B, 1)
    c = (counter[None] * 0x05EBCA77) & _MASK  # (1, n)
    x = (s + c + ((stream * 0x42B2AE3D) & _MASK)) & _MASK  # (B, n)
    x = _mix(_mix(x) ^ (seeds.long()[:, None] & _MASK))
    u = (x.double() + 0.5) / 2.0**32  # (B, n) in (0, 1)
    return u.float().view(seeds.shape[0], *shape)


def normal(seeds: torch.Tensor | None, shape: tuple[int, ...], stream: int, device=None) -> torch.Tensor:
    """``(B, *shape)`` standard normals (Box-Muller on two streams of :func:`uniform`)."""
    if seeds is None:
        return torch.randn(shape, device=device)
    u1, u2 = uniform(seeds, shape, 2 * stream + 101), uniform(seeds, shape, 2 * stream + 102)
    return (-2.0 * u1.log()).sqrt() * torch.cos(2.0 * math.pi * u2)


def randint(seeds: torch.Tensor | None, high: int, shape: tuple[int, ...], stream: int, device=None) -> torch.Tensor:
    """``(B, *shape)`` int64 in ``[0, high)``."""
    if seeds is None:
        return torch.randint(0, high, shape, device=device)
    return (uniform(seeds, shape, stream) * high).long().clamp(max=high - 1)
