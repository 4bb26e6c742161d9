"""The probe's text: chunks cut once as text, then encoded in each model's tokenizer.

``chunk_by="words"`` (the default): the held-out and training text is cut into
chunks of ``seq_len`` words, the same strings for every model, so two models
of a comparison read the same text and their bits per chunk compare. Each
model's tokenizer then renders each chunk in its own tokens; the chunks of one
model are right-padded to the longest one with :data:`PAD` (a chunk is never
cut short unless the model cannot read that many tokens: the report counts
those). ``chunk_by="tokens"``: ``seq_len`` tokens of the model's own
tokenizer (the text then differs from model to model; no padding).

A chunk tensor ``(N, T)`` holds token ids with :data:`PAD` after each chunk's
last token; :func:`mask_of` gives its real positions and :func:`fill_pad` the
ids a model reads (pads replaced by a real id, masked out).
"""

from __future__ import annotations

import numpy as np
import torch

from memlab.errors import DataError

PAD = -1
"""Id of a padded position in a probe chunk tensor (chunks are right-padded)."""


def mask_of(ids: torch.Tensor) -> torch.Tensor:
    """(N, T) chunk ids -> (N, T) bool: the real (non-pad) positions."""
    return ids >= 0


def fill_pad(ids: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """(N, T) chunk ids -> (N, T) ids a model reads: each :data:`PAD` replaced by ``pad_id`` (mask it out)."""
    return ids.masked_fill(ids < 0, int(pad_id))


def rows(ids: torch.Tensor) -> list[list[int]]:
    """The real tokens of each chunk, pads dropped."""
    return [[t for t in r if t >= 0] for r in ids.tolist()]


def pick_texts(texts: list[str], need_chars: int, seed: int) -> list[str]:
    """Units of a split in a seeded order until they hold ``need_chars`` characters."""
    order = np.random.default_rng(seed).permutation(len(texts))
    chosen, n = [], 0
    for i in order:
        chosen.append(texts[i])
        n += len(texts[i])
        if n >= need_chars:
            break
    return chosen


def word_chunks(texts: list[str], words: int, n: int, seed: int, what: str, at_most: bool = False) -> list[str]:
    """``n`` chunks of ``words`` whitespace-separated words from ``texts``, drawn in a seeded order (``at_most``:
    all there are when ``texts`` hold fewer; none at all is an error either way)."""
    chunks: list[str] = []
    for text in texts:
        w = text.split()
        chunks.extend(" ".join(w[i : i + words]) for i in range(0, len(w) - words + 1, words))
    if not chunks:
        raise DataError(f"{what} holds no chunk of {words} words")
    if len(chunks) < n and not at_most:
        raise DataError(f"{what} holds only {len(chunks)} chunks of {words} words; {n} asked")
    pick = np.random.default_rng(seed + 1).permutation(len(chunks))[:n]
    return [chunks[i] for i in pick]


def cap_tokens(texts: list[str], tokenizer, max_tokens: int) -> list[str]:
    """Each chunk text with its trailing words dropped until ``tokenizer`` reads it in at most ``max_tokens`` tokens
    (no special tokens); a chunk whose first word alone is longer is an error."""
    out = []
    for text, ids in zip(texts, tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
        words = text.split()
        lo, hi = 0, len(words)  # the longest prefix of words that fits (token counts grow with the prefix)
        if len(ids) <= max_tokens:
            lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(tokenizer(" ".join(words[:mid]), add_special_tokens=False)["input_ids"]) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            raise DataError(f"the word {words[0][:40]!r} alone is longer than max_chunk_tokens={max_tokens} tokens")
        out.append(" ".join(words[:lo]))
    return out


def tokenize_chunks(texts: list[str], tokenizer, max_tokens: int | None = None) -> tuple[torch.Tensor, int]:
    """Chunk texts -> ``(N, T)`` ids in ``tokenizer`` (no special tokens), right-padded with :data:`PAD` to the
    longest chunk (at most ``max_tokens``), and how many chunks were cut at ``max_tokens``."""
    enc = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    if any(not e for e in enc):
        raise DataError("a chunk has no tokens in this tokenizer")
    longest = max(len(e) for e in enc)
    t = min(longest, max_tokens) if max_tokens else longest
    out = torch.full((len(enc), t), PAD, dtype=torch.long)  # (N, T)
    for i, e in enumerate(enc):
        out[i, : min(len(e), t)] = torch.tensor(e[:t], dtype=torch.long)
    return out, sum(len(e) > t for e in enc)


def chunk_chars(ids: torch.Tensor, tokenizer) -> list[int]:
    """Characters of each chunk as the tokenizer renders its tokens (token-cut chunks have no text of their own)."""
    return [len(s) for s in tokenizer.batch_decode(rows(ids), skip_special_tokens=True)]


def rendering(texts: list[str], ids: torch.Tensor, tokenizer) -> str:
    """How the tokenizer renders the chunks the bits are counted over: as written, lowercased or normalised."""
    back = ["".join(s.split()) for s in tokenizer.batch_decode(rows(ids), skip_special_tokens=True)]
    orig = ["".join(s.split()) for s in texts]  # spacing aside: tokenizers differ in how they join pieces
    if back == orig:
        return "as written"
    if back == [s.lower() for s in orig]:
        return "lowercased (the tokenizer drops case: the bits do not count it)"
    same = sum(a == b for a, b in zip(back, orig)) / max(len(orig), 1)
    return f"normalised by the tokenizer ({same:.0%} of the chunks decode to their text exactly)"
