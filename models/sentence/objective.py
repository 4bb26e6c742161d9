"""Next-sentence targets and the token cross-entropy of a space's decoder reading predicted embeddings:
the SONAR-LLM objective, and the shared yardstick the LCM baselines report.

For a document of sentences ``s_0 .. s_{n-1}`` (the last is the end sentence)
with embeddings ``e_0 .. e_{n-1}``, the model reads ``e_0 .. e_{n-2}`` and
predicts ``p_0 .. p_{n-2}``; each ``p_i`` goes to the space's (frozen)
decoder, teacher forced with the true tokens of ``s_{i+1}``, and the loss is
the mean cross-entropy over all non-padding target tokens of the batch::

    L = - (1 / #tokens) * sum_i sum_t log P_dec(s_{i+1, t} | p_i, s_{i+1, <t})
"""

from __future__ import annotations

import torch

from memlab.space import decoder_token_stats


def next_sentence_targets(batch: dict, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sentences to predict in a collated batch: ``valid (B, S-1)`` and their ``ids, mask (N, L)``."""
    smask = batch["sentence_mask"]
    return select_targets(batch["input_ids"][:, 1:], batch["token_mask"][:, 1:] * smask[:, 1:, None], pad_id)


def decoder_cross_entropy(space, shape: list[int], z: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                          chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed token cross-entropy, correct-token count and target-token count of ``space``'s decoder
    rebuilding ``ids (N, L)`` from flattened embeddings ``z (N, E)`` (reshaped to ``(N, *shape)``),
    in chunks of ``chunk`` sentences."""
    total = z.new_zeros((), dtype=torch.float32)
    correct = z.new_zeros((), dtype=torch.float32)
    count = z.new_zeros((), dtype=torch.float32)  # kept on the device: nothing is read back per batch
    for a in range(0, z.shape[0], chunk):
        dec_in, labels = space.decoder_inputs(ids[a : a + chunk], mask[a : a + chunk])  # (n, T'), (n, T')
        zz = z[a : a + chunk]
        t, c, n = decoder_token_stats(space, zz.reshape(zz.shape[0], *shape), dec_in, labels)
        total, correct, count = total + t, correct + c, count + n.to(count.device)
    return total, correct, count


def select_targets(next_input_ids: torch.Tensor, next_token_mask: torch.Tensor, pad_id: int,
                   attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(B, S, L)`` next-sentence tokens -> ``valid (B, S)`` and the valid rows' ``ids, mask (N, L')``."""
    valid = next_token_mask.sum(-1) > 0  # (B, S)
    if attention_mask is not None:
        valid &= attention_mask.bool()
    ids, mask = next_input_ids[valid], next_token_mask[valid]  # (N, L)
    L = max(int(mask.sum(1).max()) if mask.numel() else 1, 1)
    ids, mask = ids[:, :L], mask[:, :L]
    return valid, torch.where(mask.bool(), ids, torch.full_like(ids, pad_id)), mask
