"""The poolings of the states a probe reads (registered parts: ``last``, ``second_last``, ``mean``, ``first``).
"""

from __future__ import annotations

import torch

from memlab.probes.parts import get_part


def pool_states(h: torch.Tensor, mask: torch.Tensor, pool: str, options=None) -> torch.Tensor:
    """Pool right-padded states ``(B, T, D)`` with mask ``(B, T)`` to ``(B, D)`` by the registered pooling ``pool``
    (:mod:`memlab.probes.parts`; the built-in ones registered in :mod:`memlab.probes.catalog`, their code below), given ``options``, its
    own options, when it has any."""
    kw = {"options": options} if options is not None else {}
    return get_part("pool", pool).impl(h, mask, **kw)  # (B, D)


def pool_last(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(h.shape[0], device=h.device)
    return h[rows, (mask.sum(1).long() - 1).clamp(min=0)]  # (B, D)


def pool_second_last(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(h.shape[0], device=h.device)
    return h[rows, (mask.sum(1).long() - 2).clamp(min=0)]  # (B, D)


def pool_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(h.dtype).unsqueeze(-1)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, D)


def pool_first(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return h[:, 0]  # (B, D)
