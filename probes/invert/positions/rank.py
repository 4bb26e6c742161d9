"""What ranks the candidates of a position: the model's own next-token distribution and the first-order score.

Two rankings of the whole vocabulary are at hand at every position after the first:

* **the prior**: the model's next-token distribution from the recovered prefix, read through all its blocks, its
  final norm and its output embeddings (the input table where they are tied, else the model's own, read from its
  checkpoint by :mod:`memlab.probes.invert.head`). Natural text is mostly likely text, so the true token of a
  natural-text position is usually among the prior's first few; random tokens get no help from it. A model whose
  head cannot be read (own output embeddings in no local file) has no prior, and the gradient ranks alone.
* **the first-order score**: the change of the squared distance to the observed state when the input embedding
  moves from a point ``e0`` to a token's row, ``(E_v - e0) . grad d(e0)``; re-linearised at the best token
  verified so far (where it is most accurate).

:func:`interleave` merges orders by taking the best untried token of each in turn: the true token is reached after
at most k times its best rank in any of the k orders, so each ranking covers the positions where another is weak;
:func:`fused` adds one order from all of them (the product of a token's ranks). All are only orders: a logit
soft-cap or a temperature does not change them.
"""

from __future__ import annotations

import torch

from memlab.probes.invert.layer import LayerReader


class NextTokenHead:
    """A causal model's next-token logits from its last block's output: its final norm, then the output embeddings
    (the input table where they are tied, else the model's own, read from its checkpoint). :meth:`of` gives None
    when the model's head cannot be read."""

    def __init__(self, top: LayerReader, norm, weight: torch.Tensor):
        self.top = top  # the model read after its last block (all blocks run)
        self.norm = norm
        self.weight = weight  # (V, D)

    @staticmethod
    def tied(reader: LayerReader) -> bool:
        """Whether the model's output embeddings are its input table."""
        cfg = reader.model.config
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return bool(getattr(text, "tie_word_embeddings", False) or getattr(cfg, "tie_word_embeddings", False))

    @classmethod
    def of(cls, reader: LayerReader, weight: torch.Tensor | None = None) -> "NextTokenHead | None":
        """``weight``: the model's own output embeddings ``(V, D)`` where they are not tied to the input table
        (:func:`memlab.probes.invert.head.output_embeddings` reads them from the checkpoint)."""
        from memlab.probes.encoders.capture import hook_plan

        tied = cls.tied(reader)
        if not tied and weight is None:
            return None
        _, norm, _ = hook_plan(reader.model)
        top = reader if reader.layer == reader.num_layers else LayerReader(
            reader.model, reader.num_layers, vocab_size=reader.vocab_size)
        if not tied:
            if weight.shape[0] < reader.vocab_size or weight.shape[1] != top.embedding.shape[1]:
                return None  # not this model's head
            return cls(top, norm, weight[: reader.vocab_size].to(reader.device))
        # the embedding module's output (a scaled table stays scaled): a uniform scale leaves the order as it is
        return cls(top, norm, reader.embedding[: reader.vocab_size])

    @torch.no_grad()
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Last-block outputs ``(B, D)`` -> next-token logits ``(B, V)`` (float32, on the CPU)."""
        if self.norm is not None:
            h = self.norm(h.to(self.top.dtype))
        return (h.float().to(self.weight.device) @ self.weight.float().T).cpu()  # (B, V)


def interleave(orders: list[torch.Tensor], tried: torch.Tensor, k: int) -> torch.Tensor:
    """The next ``k`` untried tokens ``(k',)`` of several rankings taken in turn (best of the first, best of the
    second, ...), each skipping what ``tried`` ``(V,)`` marks and what an earlier one already gave. ``orders``:
    each ranking's best tokens first, ``(k_i,)`` (at least ``k`` untried ones each, or all of them)."""
    out: list[int] = []
    seen: set[int] = set()
    lists = [[t for t in o.tolist() if not tried[t]] for o in orders]
    pos = [0] * len(lists)
    while len(out) < k and any(p < len(lst) for p, lst in zip(pos, lists)):
        for j, lst in enumerate(lists):
            while pos[j] < len(lst) and lst[pos[j]] in seen:
                pos[j] += 1
            if pos[j] < len(lst) and len(out) < k:
                t = lst[pos[j]]
                pos[j] += 1
                seen.add(t)
                out.append(t)
    return torch.tensor(out, dtype=torch.long)


def best_untried(score: torch.Tensor, tried: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` untried tokens ``(k',)`` of lowest ``score`` ``(V,)``, best first."""
    s = score.masked_fill(tried, float("inf"))  # (V,)
    k = min(k, int((~tried).sum()))
    return torch.topk(s, k, largest=False).indices  # (k,)


def rank_of(score: torch.Tensor, token: int) -> int:
    """Rank ``(0 = first)`` of ``token`` in the order of ascending ``score`` ``(V,)``."""
    return int((score < score[token]).sum())


def fused(scores: list[torch.Tensor]) -> torch.Tensor:
    """One order from several: each token scored by the sum of the logs of its ranks ``(V,)`` (the product of its
    ranks), so a token that every ranking places fairly well comes before one that a single ranking places first
    and the others last."""
    total = torch.zeros_like(scores[0])
    for s in scores:
        rank = torch.empty_like(s)
        rank[torch.argsort(s)] = torch.arange(1, s.numel() + 1, dtype=s.dtype)  # 1 = best
        total += rank.log()
    return total  # (V,)
