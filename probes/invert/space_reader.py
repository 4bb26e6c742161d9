"""A memlab space's encoder as the pooled search reads it: ``memlab invert --model space:NAME:ARG --states space``.

A space maps a chunk to one vector (a memory model: its ``K`` memory vectors, flattened as the trained probe's
``SpaceEncoder`` flattens them). The pooled search (:class:`~memlab.probes.invert.pooled.searcher.PooledSearcher`) needs,
for the encoder, the table of its input embeddings ``(V, D_e)`` and that vector as a differentiable function of
the input embeddings; a space that offers both (``input_embeddings`` and ``encode_embeddings``, see
:mod:`memlab.space`) is read by :class:`SpaceReader`, which gives the search what it gives a transformers model's
pooled state (:class:`~memlab.probes.invert.pooled.searcher.PooledLayer`): ``embedding``, ``vocab_size``, ``device``,
``embed``, ``vectors`` and a bfloat16 copy for the screen. A space that offers neither (a fitted probe, SONAR's
port, a toy space) has no weights to search with and is refused in one line.

A space reads a chunk without special tokens (``encode_text`` adds none) and both ways: no prefix or suffix, no
causal order, no next-token head.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from memlab.errors import ModelError

WHITE_BOX = ("input_embeddings", "encode_embeddings")
"""What a space offers for its encoder to be searched (:mod:`memlab.space`)."""


def refusal(name: str) -> str:
    """The one line for a space that cannot be searched: what it lacks and the settings that apply."""
    return (f"{name}: the space gives no encoder to search with (its input embeddings and its vector as a function "
            "of them, as a memory model's does: --model space:memory_ae:PATH); for a transformers model give "
            "--model NAME --layer L --states last, mean, first or second_last")


class SpaceReader:
    """``space``'s vector ``(B, D)`` (``(B, K, D)`` flattened) as a function of its input embeddings.

    ``vocab_size``: the candidate tokens are ids ``0 .. vocab_size - 1`` (default: the rows of the table)."""

    causal = False
    """A space's encoder reads the chunk both ways (no causal order to walk, no next-token head)."""
    layer = None
    num_layers = None
    hooks: dict = {}
    """No layer: the vector is the encoder's output (the report's ``layer`` and ``hooks`` are empty)."""

    def __init__(self, space, name: str = "space", vocab_size: int | None = None):
        if not all(hasattr(space, m) for m in WHITE_BOX):
            raise ModelError(refusal(name))
        self.space, self.name = space, name
        for m in _modules(space):
            m.eval().requires_grad_(False)
        with torch.no_grad():
            table = space.input_embeddings().detach()  # (V, D_e)
        rows = table.shape[0]
        self.vocab_size = rows if vocab_size is None else min(int(vocab_size), rows)
        self.embedding = table[: self.vocab_size]  # (V, D_e)
        self.device = self.embedding.device
        self.dtype = self.embedding.dtype
        limit = getattr(space, "max_tokens", None) or getattr(space, "max_length", None)
        self.max_length = int(limit) if limit else None
        """The longest chunk the encoder reads (a memory model's ``chunk_len``), or None."""

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, t)`` ids -> ``(B, t, D_e)`` rows of the table."""
        return self.embedding[ids.to(self.device)]

    def vectors(self, embeds: torch.Tensor) -> torch.Tensor:
        """``(B, T, D_e)`` input embeddings of whole chunks (no padding) -> ``(B, D)`` float32, differentiable: the
        vector the probe reads from the space (``SpaceEncoder``: ``(B, K, D)`` flattened to ``(B, K * D)``)."""
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)  # (B, T)
        z = self.space.encode_embeddings(embeds, mask)  # (B, D) or (B, K, D)
        return z.reshape(z.shape[0], -1).float()

    def bfloat16(self) -> "SpaceReader":
        """A copy whose modules hold bfloat16 weights (the search's screen; never a verification)."""
        low = copy.copy(self.space)
        for key, value in vars(self.space).items():
            if isinstance(value, nn.Module):
                setattr(low, key, copy.deepcopy(value).to(torch.bfloat16))
        return SpaceReader(low, self.name, self.vocab_size)


def _modules(space) -> list[nn.Module]:
    if isinstance(space, nn.Module):
        return [space]
    return [v for v in vars(space).values() if isinstance(v, nn.Module)]
