"""The built-in conditionings (``unrolled``, ``prefix``) and token inputs (``teacher``, ``blank``) of the probe's decoder
(:mod:`memlab.probes.decoder.model` describes them).
"""

from __future__ import annotations

import torch

from memlab.probes.kinds import Conditioning, InputMode


def _unrolled_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return x + cond[:, : x.shape[1]]  # (B, T, d): the t-th slice added to the t-th token


def _prefix_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return torch.cat([cond, x], dim=1)  # (B, P + T, d)


UNROLLED = Conditioning(lambda c: c.max_len, _unrolled_join)


PREFIX = Conditioning(lambda c: c.prefix_len, _prefix_join, lambda c: c.prefix_len)


def _teacher(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    if training and config.input_dropout:
        drop = torch.rand(ids.shape, device=ids.device) < config.input_dropout  # (B, T)
        ids = ids.masked_fill(drop, config.start_id)  # (B, T)
    return ids


def _blank(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    return torch.full_like(ids, config.start_id)  # (B, T): all the decoder knows comes through the embedding


TEACHER = InputMode(_teacher)


BLANK = InputMode(_blank, reads_tokens=False)
