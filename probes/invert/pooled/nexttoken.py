"""A causal model's next-token distribution at the last position as the pooled target (``--states logits``).

The vector is the log-probabilities ``log_softmax(W norm(h_T))`` ``(V,)``: the last block's state at the chunk's
last position, the model's final norm, its output embeddings ``W`` (tied to the input table, or the checkpoint's
own head). It is what an API that returns next-token log-probabilities exposes, SODA's setting; it holds no more
than the last-token state at the last block (``--states last --layer -1``), which fixes it.
"""

from __future__ import annotations

import torch

from memlab.probes.invert.layer import LayerReader


class NextTokenVector:
    """A vector reader (as :class:`~memlab.probes.invert.pooled.PooledLayer`) whose vector is the next-token
    log-probabilities at the last position: ``head`` a
    :class:`~memlab.probes.invert.pooled.searcher.LanguageHead` (or anything with its ``norm``, the final norm,
    and ``weight``, the output embeddings ``(V, D)``) over ``reader``, a :class:`LayerReader` at the last layer."""

    def __init__(self, reader: LayerReader, head):
        if reader.layer != reader.num_layers:
            raise ValueError(f"the next-token distribution is read after the last block (layer {reader.num_layers}), "
                             f"not at layer {reader.layer}")
        self.reader, self.head = reader, head
        self.embedding, self.vocab_size, self.device = reader.embedding, reader.vocab_size, reader.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, t)`` ids -> ``(B, t, D_e)`` the embedding module's outputs."""
        return self.reader.embed(ids)

    def vectors(self, embeds: torch.Tensor) -> torch.Tensor:
        """``(B, T', D_e)`` input embeddings of whole rows -> ``(B, V)`` next-token log-probabilities after the last
        position (float32, differentiable)."""
        h = self.reader._run(embeds, None)[:, -1]  # (B, D)
        if self.head.norm is not None:
            h = self.head.norm(h)
        logits = h.float() @ self.head.weight.float().T  # (B, V_head)
        return torch.log_softmax(logits[:, : self.vocab_size], -1)

    def bfloat16(self) -> "NextTokenVector":
        """The same distribution read through a bfloat16 copy of the model (a screen, never a verification)."""
        import copy

        low = copy.deepcopy(self.reader.model).to(torch.bfloat16)
        low_reader = LayerReader(low, self.reader.layer, vocab_size=self.reader.vocab_size)
        from types import SimpleNamespace

        from memlab.probes.encoders.capture import hook_plan

        _, norm, _ = hook_plan(low)
        return NextTokenVector(low_reader, SimpleNamespace(norm=norm, weight=self.head.weight))
