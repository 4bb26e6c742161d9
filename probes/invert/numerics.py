"""The float noise of the distances a certificate reads, and where it is taken out.

The first-position pass (:meth:`memlab.probes.invert.positions.searcher.Searcher.first_positions`) compares every token's
state with every chunk's first state by ``torch.cdist``, which on the CPU (past 25 rows) computes
``|a - b|`` as ``sqrt(|a|^2 - 2 a.b + |b|^2)``: a matmul, fast, but its cancellation leaves an absolute error of about
``sqrt(eps) |a|``, a relative distance of ~3e-4 in float32 where the true token's state equals the target to ~1e-7
(and more where the state is large, as at a model's attention sink). That noise is good enough to rank the
vocabulary, not to certify: :func:`exact_best` recomputes the distances of the best two tokens as the searched
positions do (the difference of the two states, then its norm), so a right token is certified ``match`` at the
first position as at any other, the same whichever chunks shared the pass, and two tokens whose states are equal
tie exactly (no certificate) rather than by the noise of the matmul.

States read at a lower precision (``--states-dtype``, :mod:`memlab.probes.invert.positions.precision`) are read
the same way: the first position compares the table's states with the same copy of the target the searched positions
compare their candidates with, and the best few tokens of the pass (not two) are recomputed, so the runner-up whose
distance is weighed against the noise floor (``ambiguous``) is the exact one, whichever the matmul's noise put second.
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


def exact_best(reader, prefix_ids: list[int], table: torch.Tensor | None, cands: torch.Tensor,
               targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best ``k`` tokens ``cands`` ``(k, n)`` of a noisy pass for each of ``n`` targets, their distances recomputed
    exactly (:func:`exact_first`, all in one batch): ``(kept token, its distance, the runner-up's)``, each ``(n,)``.
    With ``k = 2`` the two are put in order; with more (the states read at a lower precision, whose noise floor is
    weighed against the runner-up's distance) the runner-up is the nearest other of the ``k``."""
    k, n = cands.shape
    d = exact_first(reader, prefix_ids, table, cands.reshape(-1), targets.repeat(k, 1)).view(k, n)  # (k, n)
    vals, idx = torch.sort(d, dim=0, stable=True)  # (k, n); a tie keeps the noisy pass's order
    return cands.gather(0, idx[:1])[0], vals[0], vals[1]
