"""Decoding SONAR embeddings to token ids: greedy, sampling and beam search,
with a key/value cache (the cross-attention keys of the sentence vector are
computed once)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memlab.decoding import beam_search, top_p_mask
from memlab.errors import ModelError


def _step(model, ids: torch.Tensor, mkv: list, caches: list[dict], start: int) -> torch.Tensor:
    """Feed ``ids`` (N, t) at position ``start``; return the last position's log-probs (N, V)."""
    logits = model.decoder(ids, mkv, caches, start)  # (N, t, V)
    return F.log_softmax(logits[:, -1].float(), dim=-1)  # (N, V)


def _filter(logp: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    logits = logp / max(temperature, 1e-6)  # (N, V)
    if top_k and top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:  # keep the smallest set of most probable tokens reaching top_p
        logits = logits.masked_fill(~top_p_mask(logits.softmax(-1), top_p), float("-inf"))
    return logits


@torch.no_grad()
def generate_ids(model, z: torch.Tensor, prefix: list[int], eos_id: int, max_new_tokens: int = 64, num_beams: int = 1,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 length_penalty: float = 1.0) -> list[list[int]]:
    """Decode ``z`` ((B, D) or (B, S, D)) after the forced ``prefix`` (e.g. ``[</s>, lang]``).

    Returns the new token ids of each row, without the prefix and the final ``</s>``.
    """
    if max_new_tokens < 1:
        raise ModelError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if num_beams < 1:
        raise ModelError(f"num_beams must be >= 1, got {num_beams}")
    if num_beams > 1 and do_sample:
        raise ModelError("choose beam search (num_beams > 1) or sampling (do_sample=True), not both")
    memory = (z[:, None] if z.dim() == 2 else z).to(model.decoder.embed_tokens.weight)  # (B, S, D)
    if num_beams > 1:
        return _beam(model, memory, prefix, eos_id, max_new_tokens, num_beams, length_penalty)
    B = memory.shape[0]
    mkv = model.decoder.memory_kv(memory)
    caches: list[dict] = [{} for _ in model.decoder.layers]
    ids = torch.tensor([prefix], device=memory.device).expand(B, -1)  # (B, P)
    logp = _step(model, ids, mkv, caches, 0)  # (B, V)
    out = torch.empty(B, 0, dtype=torch.long, device=memory.device)
    done = torch.zeros(B, dtype=torch.bool, device=memory.device)
    for t in range(max_new_tokens):
        if do_sample:
            nxt = torch.multinomial(_filter(logp, temperature, top_k, top_p).softmax(-1), 1)[:, 0]  # (B,)
        else:
            nxt = logp.argmax(-1)  # (B,)
        nxt = nxt.masked_fill(done, eos_id)
        out = torch.cat([out, nxt[:, None]], 1)  # (B, t + 1)
        done = done | (nxt == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        logp = _step(model, nxt[:, None], mkv, caches, len(prefix) + t)
    return [_strip(row, eos_id) for row in out.tolist()]


def _strip(row: list[int], eos_id: int) -> list[int]:
    return row[: row.index(eos_id)] if eos_id in row else row


def _beam(model, memory: torch.Tensor, prefix: list[int], eos_id: int, max_new: int, K: int, alpha: float) -> list[list[int]]:
    """Beam search (:func:`memlab.decoding.beam_search`, fairseq's length rule) with the caches reordered per step."""
    B = memory.shape[0]
    memory = memory.repeat_interleave(K, 0)  # (B*K, S, D)
    mkv = model.decoder.memory_kv(memory)
    caches: list[dict] = [{} for _ in model.decoder.layers]
    ids = torch.tensor([prefix], device=memory.device).expand(B * K, -1)  # (B*K, P)

    def advance(order: torch.Tensor, toks: torch.Tensor, t: int) -> torch.Tensor:
        for c in caches:
            c["k"], c["v"] = c["k"][order], c["v"][order]
        return _step(model, toks[:, None], mkv, caches, len(prefix) + t)

    return beam_search(_step(model, ids, mkv, caches, 0), advance, B, K, eos_id, max_new, alpha)
