"""The float noise of the distances a certificate reads, and where it is taken out.

The first-position pass (:meth:`memlab.probes.invert.positions.searcher.Searcher.first_positions`) compares every token's
state with every chunk's first state by ``torch.cdist``, which on the CPU (past 25 rows) computes
``|a - b|`` as ``sqrt(|a|^2 - 2 a.b + |b|^2)``: a matmul, fast, but its cancellation leaves an absolute error of about
``sqrt(eps) |a|``, a relative distance of ~3e-4 in float32 where the true token's state equals the target to ~1e-7
(and more where the state is large, as at a model's attention sink). That noise is good enough to rank the
vocabulary, not to certify: :func:`exact_pair` recomputes the distances of the best two tokens as the searched
positions do (the difference of the two states, then its norm), so a right token is certified ``match`` at the
first position as at any other, the same whichever chunks shared the pass, and two tokens whose states are equal
tie exactly (no certificate) rather than by the noise of the matmul.
"""

from __future__ import annotations

import torch


def exact_first(reader, prefix_ids: list[int], table: torch.Tensor | None, tokens: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    """The relative distance ``(n,)`` of each kept first-position token ``tokens (n,)`` to its chunk's first state
    ``targets (n, D)``, computed as a difference (from ``table`` when kept, else one batched pass of the ``n``
    tokens after the prefix)."""
    with torch.no_grad():
        h = table[tokens].float() if table is not None else reader.candidate_states(reader.start(prefix_ids),
                                                                                      tokens).cpu()  # (n, D)
        tg = targets.float()
        return (h - tg).norm(dim=-1) / tg.norm(dim=-1).clamp_min(1e-30)  # (n,)


def exact_pair(reader, prefix_ids: list[int], table: torch.Tensor | None, best: torch.Tensor, second: torch.Tensor,
               targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best two tokens ``best``, ``second`` ``(n,)`` of a noisy pass, their distances recomputed exactly
    (:func:`exact_first`, both in one batch) and put in order: ``(kept token, its distance, the runner-up's)``."""
    n = best.shape[0]
    d = exact_first(reader, prefix_ids, table, torch.cat([best, second]), torch.cat([targets, targets]))  # (2n,)
    d1, d2 = d[:n], d[n:]
    swap = d2 < d1
    return torch.where(swap, second, best), torch.minimum(d1, d2), torch.maximum(d1, d2)
