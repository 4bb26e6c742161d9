"""The memory recipe's examples: chunk and sentence views of a corpus split, read lazily.

A split's tokens come from :class:`memlab.data.stream.CorpusStream` (memory-mapped files written once), so
every process holds only the rows it reads. Chunk view: an example is ``seq_len`` tokens of the split's
stream cut into ``C = seq_len / chunk_len`` chunks ``(C, T)``; ``offsets > 1`` adds copies of the stream
cut at shifted boundaries (:class:`OffsetRows`). Sentence view: an example is one Punkt sentence padded to
``max_len`` tokens, with its mask (:class:`PaddedRows`). The in-memory :func:`chunk_view` and
:func:`sentence_view` (evaluation sets) build the same rows from texts or documents.
"""

from __future__ import annotations

import numpy as np
import torch

from memlab.data.views import padded_sentences, split_sentences, token_chunks
from memlab.errors import ConfigError, DataError


class OffsetRows:
    """Examples ``(C, T)`` int64 of a flat token stream ``(n,)`` (an array, memory-mapped or not), read one
    at a time: the stream is first cut to whole examples of ``seq_len`` tokens (the last partial one dropped),
    then cut ``offsets`` times, copy ``j`` starting ``j * chunk_len // offsets`` tokens later."""

    def __init__(self, flat, seq_len: int, chunk_len: int, offsets: int = 1, limit: int | None = None):
        if offsets < 1 or offsets > chunk_len:
            raise ConfigError(f"options.train_offsets must be in 1..chunk_len={chunk_len}, got {offsets}")
        self.flat, self.seq_len, self.chunk_len, self.offsets = flat, seq_len, chunk_len, offsets
        total = (len(flat) // seq_len) * seq_len  # whole examples only
        if total == 0:
            raise DataError(f"the text holds {len(flat)} tokens, fewer than one chunk of {seq_len}")
        self.cuts = [(j * chunk_len // offsets, (total - j * chunk_len // offsets) // seq_len) for j in range(offsets)]
        self.cuts = [(shift, n) for shift, n in self.cuts if n]  # (first token, examples) per copy
        self.n = sum(n for _, n in self.cuts) if limit is None else min(limit, sum(n for _, n in self.cuts))

    def __len__(self) -> int:
        return self.n

    def limit(self, n: int) -> "OffsetRows":
        return OffsetRows(self.flat, self.seq_len, self.chunk_len, self.offsets, min(n, self.n))

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(i)
        for shift, n in self.cuts:
            if i < n:
                at = shift + i * self.seq_len
                row = np.asarray(self.flat[at: at + self.seq_len], dtype=np.int64)
                return torch.from_numpy(row).view(self.seq_len // self.chunk_len, self.chunk_len)  # (C, T)
            i -= n
        raise IndexError(i)

    def materialize(self) -> torch.Tensor:
        """Every example at once: ``(N, C, T)``."""
        flat = torch.as_tensor(np.asarray(self.flat, dtype=np.int64))
        c = self.seq_len // self.chunk_len
        parts = [flat[shift: shift + n * self.seq_len].view(n, c, self.chunk_len) for shift, n in self.cuts]  # (n, C, T)
        return torch.cat(parts)[: self.n]  # (N, C, T)


class PaddedRows:
    """Sentence examples of padded rows ``(N, T)`` and their lengths ``(N,)`` (arrays, memory-mapped or not):
    ``ids[i]`` is ``(1, T)`` int64, ``mask[i]`` its ``(1, T)`` attention mask."""

    def __init__(self, ids, lengths, limit: int | None = None):
        self.rows, self.lengths = ids, lengths
        self.n = len(lengths) if limit is None else min(limit, len(lengths))
        self.ids, self.mask = _Column(self, False), _Column(self, True)

    def limit(self, n: int) -> "PaddedRows":
        return PaddedRows(self.rows, self.lengths, min(n, self.n))


class _Column:
    def __init__(self, src: PaddedRows, mask: bool):
        self.src, self.is_mask = src, mask

    def __len__(self) -> int:
        return self.src.n

    def limit(self, n: int) -> "_Column":
        return getattr(self.src.limit(n), "mask" if self.is_mask else "ids")

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.src.n:
            raise IndexError(i)
        row = np.asarray(self.src.rows[i], dtype=np.int64)  # (T,)
        if self.is_mask:
            row = (np.arange(row.shape[0]) < int(self.src.lengths[i])).astype(np.int64)
        return torch.from_numpy(row)[None]  # (1, T)


class CachedDataset(torch.utils.data.Dataset):
    """Examples ``{"input_ids": (C, T)[, "attention_mask": (C, T)][, "memories": (C, K, M)]}`` from rows that
    index one example each (tensors, :class:`OffsetRows`, :class:`PaddedRows` columns)."""

    def __init__(self, ids, mask=None, memories: torch.Tensor | None = None):
        self.ids, self.mask, self.memories = ids, mask, memories

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        out = {"input_ids": self.ids[i]}
        if self.mask is not None:
            out["attention_mask"] = self.mask[i]
        if self.memories is not None:
            out["memories"] = self.memories[i]
        return out


def rows_batch(rows, lo: int, hi: int) -> torch.Tensor:
    """Examples ``lo..hi`` of ``rows`` stacked: ``(b, C, T)``."""
    return rows[lo:hi] if torch.is_tensor(rows) else torch.stack([rows[i] for i in range(lo, hi)])


def chunk_view(texts: list[str], tok, seq_len: int, chunk_len: int, offsets: int = 1) -> torch.Tensor:
    """Texts -> ``(N, C, T)`` token chunks in memory (the rows :class:`OffsetRows` reads from a stream)."""
    flat = token_chunks(texts, tok, seq_len).flatten().numpy()  # (N*S,) the whole stream, last partial example dropped
    return OffsetRows(flat, seq_len, chunk_len, offsets).materialize()  # (N', C, T)


def sentence_view(docs, tok, max_len: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Documents -> padded sentences ``(N, 1, T)`` and masks in memory (the rows
    :meth:`memlab.data.stream.CorpusStream.sentences` writes); sentences longer than ``max_len`` are dropped."""
    parts = list(padded_sentences((split_sentences(d.text) for d in docs), tok, max_len))
    seen = sum(p[2] for p in parts)
    if not seen:
        raise DataError("the corpus split holds no sentences")
    ids = np.concatenate([p[0] for p in parts])  # (N, T)
    lengths = np.concatenate([p[1] for p in parts])  # (N,)
    if not len(lengths):
        raise DataError(f"no sentence fits in {max_len} tokens")
    mask = np.arange(max_len)[None] < lengths[:, None]  # (N, T), as PaddedRows reads it
    return torch.from_numpy(ids)[:, None], torch.from_numpy(mask.astype(np.int64))[:, None], seen - len(lengths)
