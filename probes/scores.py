"""Reconstruction scores of a probe beside token accuracy and H_r, and what limits the reading.

Definitions (held-out chunks, the reconstruction against the true chunk; the reconstruction is greedy, with a
repetition penalty for autoregressive decoders, see :func:`reconstruct_ids`):

* **Token-set F1** (TF1, order-free, as vec2text's): F1 between the set of
  token ids of the reconstruction and the set of the true chunk, per chunk,
  averaged over chunks.
* **Sentence BLEU**: :func:`memlab.metrics.sentence_bleu` (NLTK, whitespace
  tokens, smoothing method 4, 0-1) of the decoded reconstruction against the
  decoded chunk, averaged over chunks.
* **Exact match**: share of chunks rebuilt token for token.
* **Free-running accuracy**: share of the held-out target tokens where the reconstruction's token at position i
  equals the true token at i (positional, as token accuracy is, but the decoder reads its own previous outputs,
  never the true tokens); per chunk, so it gets a paired bootstrap interval against the control's.
* **Information gain**: ``(CE_control - CE_probe) / CE_control``.
"""

from __future__ import annotations

import torch

from memlab.probes.chunks import mask_of, rows
from memlab.probes.parts import get_part, own_options, reads_tokens
from memlab.probes.result import Reconstructed


@torch.no_grad()
def reconstruct_ids(dec, z: torch.Tensor, seq_len: int, batch_size: int = 128,
                    repeat_penalty: float | None = None) -> torch.Tensor:
    """The reconstruction ``(N, T)`` token ids from embeddings ``z`` (N, D).

    Blank inputs: every position's argmax at once. Teacher inputs: greedy, token by token, where each token
    already in the reconstruction has its log-probability lowered by ``repeat_penalty`` nats (default: the
    decoder's ``config.repeat_penalty``; 0 is plain greedy), so a weak decoder does not loop on one phrase.
    """
    dec.eval()
    device = next(dec.parameters()).device
    start = int(dec.config.start_id)
    penalty = float(getattr(dec.config, "repeat_penalty", 0.0) if repeat_penalty is None else repeat_penalty)
    incremental = getattr(dec, "incremental_decoding", False)  # else every step reruns the whole prefix
    out = []
    for i in range(0, z.shape[0], batch_size):
        zb = z[i : i + batch_size].to(device)  # (b, D)
        if not reads_tokens(dec.config):  # every position at once: the inputs never hold a true token
            seq = dec.predict_full(dec(zb, torch.full((zb.shape[0], seq_len), start, device=device)))  # (b, T)
        else:
            seq = torch.full((zb.shape[0], 1), start, dtype=torch.long, device=device)  # (b, 1)
            state, pen = {}, None
            for _ in range(seq_len):
                logits = (dec(zb, seq, mode="next", state=state) if incremental else dec(zb, seq)[:, -1:]).float()
                if pen is not None:  # the same shift of a class's logit shifts its log-probability alike
                    logits = logits - pen.unsqueeze(1)  # (b, 1, C)
                nxt = dec.predict_full(logits)  # (b, 1)
                if penalty:  # each class already written loses ``penalty`` nats from now on
                    pen = torch.zeros(logits.shape[0], logits.shape[-1], device=device) if pen is None else pen
                    pen.scatter_(1, dec.to_compact[nxt], penalty)  # (b, C)
                seq = torch.cat([seq, nxt], dim=1)  # (b, t + 2)
            seq = seq[:, 1:]  # (b, T)
        out.append(seq)
    return torch.cat(out).cpu()  # (N, T)


def _cut(pred: torch.Tensor, true: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    """Each chunk's real tokens and as many of its reconstruction (a padded chunk is rebuilt to its own length; a
    reconstruction shorter than its chunk, PAD after it, keeps its own tokens only)."""
    t = rows(true)
    return [[x for x in p[: len(r)] if x >= 0] for p, r in zip(pred.tolist(), t)], t


def token_set_f1_per_chunk(pred: torch.Tensor, true: torch.Tensor) -> list[float]:
    """Each chunk's F1 between the sets of token ids of ``pred`` and ``true`` (both (N, T); PAD skipped)."""
    scores = []
    for p, t in zip(*_cut(pred, true)):
        ps, ts = set(p), set(t)
        hit = len(ps & ts)
        scores.append(0.0 if not hit else 2 * hit / (len(ps) + len(ts)))
    return scores


def token_set_f1(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Mean over chunks of :func:`token_set_f1_per_chunk`."""
    scores = token_set_f1_per_chunk(pred, true)
    return sum(scores) / max(len(scores), 1)


def free_running_hits(pred: torch.Tensor, true: torch.Tensor) -> list[int]:
    """Each chunk's count of real (non-PAD) positions where ``pred`` holds the true token (both (N, T))."""
    real = mask_of(true)  # (N, T)
    return ((pred[:, : true.shape[1]] == true) & real).sum(1).tolist()


def free_running_accuracy(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Share of the real tokens of ``true`` (N, T) that ``pred`` (N, T) holds at the same position."""
    return sum(free_running_hits(pred, true)) / max(int(mask_of(true).sum()), 1)


def exact_match(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Share of chunks whose reconstruction equals the chunk token for token."""
    p, t = _cut(pred, true)
    return sum(a == b for a, b in zip(p, t)) / len(t) if len(t) else 0.0


def reconstruction_scores(dec, z: torch.Tensor, ids: torch.Tensor, tokenizer, scorers: list[str],
                          opts=None) -> Reconstructed:
    """Each registered scorer in ``scorers`` on the greedy reconstruction of ``ids`` (N, T) from ``z`` (N, D) and its
    free-running accuracy; the per-chunk TF1 and free-running hits, for their intervals, and the decoded
    reconstructions."""
    pred = reconstruct_ids(dec, z, ids.shape[1])  # (N, T)
    cut, true = _cut(pred, ids)
    hyps = tokenizer.batch_decode(cut, skip_special_tokens=True)
    refs = tokenizer.batch_decode(true, skip_special_tokens=True)
    parts = {name: get_part("scorer", name) for name in scorers}  # each given its own options, when it has any
    out = {n: float(p.impl(pred, ids, hyps, refs, **own_options(p, opts))) for n, p in parts.items()}
    free = free_running_hits(pred, ids)
    out["free_running_accuracy"] = sum(free) / max(int(mask_of(ids).sum()), 1)
    return Reconstructed(out, token_set_f1_per_chunk(pred, ids), free, hyps)


def limit_line(probe: dict, control: dict | None) -> str:
    """Which of order and content limits the reading, in one sentence."""
    if "token_set_f1" not in probe:
        return None
    f1, acc = probe["token_set_f1"], probe["token_accuracy"]
    c_f1 = control["token_set_f1"] if control else 0.0
    c_acc = control["token_accuracy"] if control else 0.0
    if f1 >= 0.95 and acc >= 0.95:
        return "not limited: the chunks come back whole"
    if f1 - c_f1 < 0.05 and acc - c_acc < 0.05:
        return (f"content-limited: no more of the token set (TF1 {f1:.2f} vs control {c_f1:.2f}) or of the "
                "positions than the control; the embedding gives the probe nothing it can read")
    if f1 - acc >= 0.2:
        return (f"order-limited: the probe reads which tokens occur (TF1 {f1:.2f}, control {c_f1:.2f}) far better "
                f"than where (token accuracy {acc:.2f}, control {c_acc:.2f})")
    return (f"content-limited: the token set comes back only in part (TF1 {f1:.2f}, control {c_f1:.2f}), "
            f"and where it does, mostly in place (token accuracy {acc:.2f})")
