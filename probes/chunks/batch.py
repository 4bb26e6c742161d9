"""Token-id batches: padding (``PAD``), masks, rows, the right shift of teacher forcing.
"""

from __future__ import annotations

import torch


PAD = -1
"""Id of a padded position in a probe chunk tensor (chunks are right-padded)."""


def mask_of(ids: torch.Tensor) -> torch.Tensor:
    """(N, T) chunk ids -> (N, T) bool: the real (non-pad) positions."""
    return ids >= 0


def fill_pad(ids: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """(N, T) chunk ids -> (N, T) ids a model reads: each :data:`PAD` replaced by ``pad_id`` (mask it out)."""
    return ids.masked_fill(ids < 0, int(pad_id))


def rows(ids: torch.Tensor) -> list[list[int]]:
    """The real tokens of each chunk, pads dropped."""
    return [[t for t in r if t >= 0] for r in ids.tolist()]


def shift_right(ids: torch.Tensor, start_id: int) -> torch.Tensor:
    """(B, T) -> (B, T): the start id, then the tokens up to T-1 (teacher forcing)."""
    start = torch.full_like(ids[:, :1], start_id)  # (B, 1)
    return torch.cat([start, ids[:, :-1]], dim=1)  # (B, T)


def trim(ids: torch.Tensor) -> torch.Tensor:
    """(b, T) chunk ids -> (b, T_b): without the columns that are padding in every row (a host tensor: no sync)."""
    n = int(mask_of(ids).sum(1).max()) if ids.numel() else 0
    return ids[:, : max(n, 1)]
