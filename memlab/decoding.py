"""Beam search over any autoregressive decoder, and nucleus (top-p) filtering for sampling, shared by the spaces that
decode embeddings to text (and the probe's fitted decoder).

The decoder is reached through two callables, so one search serves a decoder with a key/value cache
(native SONAR: the caches are reordered) and one that recomputes its whole prefix (the memory
sentence space): ``first`` gives the log-probabilities of the first new token and ``advance(order,
tokens, t)`` keeps the rows ``order`` of the running beams, appends ``tokens`` and gives the next
log-probabilities.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memlab.errors import ModelError


def beam_search(first: torch.Tensor, advance: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor], batch: int,
                beams: int, eos_id: int, max_new_tokens: int, length_penalty: float = 1.0) -> list[list[int]]:
    """Best hypothesis of each of ``batch`` rows, without the final ``eos_id``.

    ``first``: ``(batch * beams, V)`` log-probabilities, the ``beams`` rows of an example identical.
    ``advance(order (batch * beams,), tokens (batch * beams,), t) -> (batch * beams, V)``: keep the running
    rows ``order`` (in this order), feed them ``tokens`` as new token ``t`` and return the next
    log-probabilities. A hypothesis ends at ``eos_id`` or after ``max_new_tokens`` tokens; finished ones
    score ``sum log p / (length + 1) ** length_penalty`` (the end token counts in the length), and the
    search of a row stops once it holds ``beams`` finished hypotheses.
    """
    if beams < 1:
        raise ModelError(f"num_beams must be >= 1, got {beams}")
    if max_new_tokens < 1:
        raise ModelError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    B, K, dev = batch, beams, first.device
    logp = first.float()
    V = logp.shape[-1]
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    seqs: list[list[list[int]]] = [[[] for _ in range(K)] for _ in range(B)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for t in range(max_new_tokens):
        cand = (scores[..., None] + logp.view(B, K, V)).view(B, K * V)  # (B, K*V)
        top_s, top_i = cand.topk(min(2 * K, K * V), dim=-1)  # (B, 2K)
        new_scores = torch.full((B, K), float("-inf"), device=dev)
        src = torch.zeros(B, K, dtype=torch.long, device=dev)
        toks = torch.full((B, K), eos_id, dtype=torch.long, device=dev)
        new_seqs: list[list[list[int]]] = [[[] for _ in range(K)] for _ in range(B)]
        last = t == max_new_tokens - 1
        for b in range(B):
            if len(finished[b]) >= K:
                continue
            j = 0
            for s, i in zip(top_s[b].tolist(), top_i[b].tolist()):
                if s == float("-inf"):
                    break
                beam, tok = divmod(i, V)
                hyp = seqs[b][beam]
                if tok == eos_id or last:
                    body = hyp if tok == eos_id else hyp + [tok]
                    if len(finished[b]) < K:
                        finished[b].append((s / (len(body) + 1) ** length_penalty, body))
                    continue
                if j < K:
                    new_scores[b, j], src[b, j], toks[b, j] = s, beam, tok
                    new_seqs[b][j] = hyp + [tok]
                    j += 1
        scores, seqs = new_scores, new_seqs
        if last or all(len(f) >= K for f in finished):
            break
        order = (torch.arange(B, device=dev)[:, None] * K + src).view(-1)  # (B*K,)
        logp = advance(order, toks.view(-1), t).float()
    return [max(f, key=lambda x: x[0])[1] if f else [] for f in finished]


def beam_search_recompute(decode_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], z: torch.Tensor,
                          bos_id: int, eos_id: int, max_new_tokens: int, beams: int,
                          length_penalty: float = 1.0, log_probs: bool = False) -> list[list[int]]:
    """:func:`beam_search` for a decoder without a cache: ``decode_logits(z, ids) -> (N, t, V)`` reads the
    embeddings ``z`` (one row per example, repeated per beam here) and the whole prefix ``ids`` (N, t),
    which starts with ``bos_id``. ``log_probs``: ``decode_logits`` gives log-probabilities already (they are not
    normalised again). An ``eos_id`` no token has (``-1``) searches hypotheses of ``max_new_tokens`` tokens each."""
    b = z.shape[0]
    zk = z.repeat_interleave(beams, 0)  # (B*K, ...)
    state = {"ids": torch.full((b * beams, 1), bos_id, dtype=torch.long, device=z.device)}  # (B*K, 1)

    def last(ids: torch.Tensor) -> torch.Tensor:
        out = decode_logits(zk, ids)[:, -1].float()  # (B*K, V)
        return out if log_probs else torch.log_softmax(out, -1)

    def advance(order: torch.Tensor, toks: torch.Tensor, t: int) -> torch.Tensor:
        state["ids"] = torch.cat([state["ids"][order], toks[:, None].to(z.device)], 1)  # (B*K, t + 2)
        return last(state["ids"])

    return beam_search(last(state["ids"]), advance, b, beams, eos_id, max_new_tokens, length_penalty)


def top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens nucleus sampling keeps, ``(..., V)`` bool beside ``probs`` ``(..., V)``: the most probable ones, each
    kept while the probability of those before it is below ``top_p`` (the smallest set whose mass reaches it)."""
    sp, order = probs.sort(-1, descending=True)
    keep = sp.cumsum(-1) - sp < top_p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` ``(..., V)`` with the tokens outside the nucleus (:func:`top_p_mask`) set to zero, not renormalised
    (``torch.multinomial`` takes weights); ``top_p >= 1``: ``probs`` itself."""
    if top_p >= 1.0:
        return probs
    return probs * top_p_mask(probs, top_p)
