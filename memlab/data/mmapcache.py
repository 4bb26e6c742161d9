"""Chunk embeddings cached in pieces to a memory-mapped file: written as they are computed, resumed after a kill,
read without loading them whole.

A cache named by its stem ``DIR/emb-<hash>`` (the caller's key) and a storage dtype is two files::

    emb-<hash>.float32.bin     the (N, D) embeddings, row-major, in the storage dtype (bfloat16 as its raw 16 bits)
    emb-<hash>.float32.json    {"format": ..., "chunks": sha256 of the chunks' ids, "n": N, "dim": D,
                                "dtype": "float32", "done": N}

While it is written they are ``.part`` and ``.part.json``: the embeddings are computed a piece of rows at a time
(:data:`PIECE_BYTES` of them), each piece written into the mapped file and flushed, and only then is ``done`` in
``.part.json`` moved past it (a temporary file and a rename). A process killed at any point (``kill -9`` included)
leaves every piece before ``done`` usable; the next run with the same chunks resumes from there. When the last
piece is in, ``.part`` is renamed to ``.bin`` and the ``.json`` written last: a ``.json`` names a finished cache.

:func:`cached_embeddings` reads a finished cache as a tensor over the mapped file (``float32`` storage: no copy, pages
read as rows are used; ``float16``/``bfloat16``, which halve the file: converted to float32 as they are read). The
first run reads its embeddings back from the file too, so a cached run and a first run read the same numbers.
Several processes asking at once take turns on ``emb-<hash>.<dtype>.lock``: one writes, the others then read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from memlab.errors import ConfigError

FORMAT = "memlab-chunk-embeddings-mmap"
PIECE_BYTES = 64 << 20
"""Embedding bytes computed and written between two progress marks (a kill loses at most one piece)."""
STORAGE = {"float32": (np.float32, torch.float32), "float16": (np.float16, torch.float16),
           "bfloat16": (np.uint16, torch.bfloat16)}
"""Storage dtype -> (numpy dtype of the file's items, torch dtype they hold)."""


def check_storage(dtype: str, flag: str = "cache_dtype") -> str:
    if dtype not in STORAGE:
        raise ConfigError(f"{flag} must be one of {', '.join(STORAGE)}, got '{dtype}'")
    return dtype


def chunks_fingerprint(ids: torch.Tensor) -> str:
    """sha256 of chunk ids ``(N, T)`` (a piece at a time: no second copy of a large tensor)."""
    h = hashlib.sha256(f"{tuple(ids.shape)}{ids.dtype}".encode())
    for i in range(0, ids.shape[0], 65536):
        h.update(ids[i : i + 65536].contiguous().numpy().tobytes())
    return h.hexdigest()


class PieceCache:
    """The files of one cache: ``stem`` (``DIR/emb-<hash>``) in storage ``dtype``."""

    def __init__(self, stem: str | Path, dtype: str = "float32"):
        self.dtype = check_storage(dtype)
        base = Path(stem)
        self.bin, self.meta = (base.with_name(f"{base.name}.{dtype}{x}") for x in (".bin", ".json"))
        self.part, self.part_meta = (base.with_name(f"{base.name}.{dtype}{x}") for x in (".part", ".part.json"))
        self.lock = base.with_name(f"{base.name}.{dtype}.lock")
        self.np_dtype, self.torch_dtype = STORAGE[dtype]

    def _read_meta(self, path: Path, fp: str, n: int) -> tuple[dict | None, str | None]:
        """The meta of ``path`` when it describes these chunks, else (None, why it is not used; None: absent)."""
        if not path.is_file():
            return None, None
        try:
            meta = json.loads(path.read_text())
            dim, done = int(meta["dim"]), int(meta["done"])
            if meta.get("format") != FORMAT or meta.get("dtype") != self.dtype or dim < 1 or not 0 <= done <= n:
                raise ValueError("not a chunk-embedding cache of this storage dtype")
        except (OSError, ValueError, KeyError, TypeError) as e:
            return None, f"is damaged ({' '.join(str(e).split())[:100]})"
        if meta.get("chunks") != fp or meta.get("n") != n:
            return None, f"holds other chunks ({meta.get('n')} rows, these are {n})"
        return meta, None

    def _size_ok(self, path: Path, n: int, dim: int) -> bool:
        return path.is_file() and path.stat().st_size == n * dim * np.dtype(self.np_dtype).itemsize

    def finished(self, fp: str, n: int) -> tuple[int | None, str | None]:
        """The width of a finished cache of these chunks (None: none), and why one present is not used."""
        meta, why = self._read_meta(self.meta, fp, n)
        if meta is None:
            return None, why
        if meta["done"] != n or not self._size_ok(self.bin, n, meta["dim"]):
            return None, f"is damaged (its file does not hold {n} rows of {meta['dim']})"
        return int(meta["dim"]), None

    def resumable(self, fp: str, n: int) -> tuple[int, int | None, str | None]:
        """Rows already written by an interrupted run of these chunks, its width, and why a partial one is not used."""
        meta, why = self._read_meta(self.part_meta, fp, n)
        if meta is None:
            return 0, None, why
        if not self._size_ok(self.part, n, meta["dim"]):
            return 0, None, "is damaged (its partial file has the wrong size)"
        return int(meta["done"]), int(meta["dim"]), None

    def read(self, n: int, dim: int) -> torch.Tensor:
        """The finished cache as ``(n, dim)`` float32: over the mapped file itself for float32 storage."""
        if n == 0:
            return torch.zeros(0, dim)
        mm = np.memmap(self.bin, dtype=self.np_dtype, mode="c", shape=(n, dim))  # copy-on-write: never writes back
        z = torch.from_numpy(mm)  # (n, dim), still mapped
        if self.torch_dtype is torch.bfloat16:
            z = z.view(torch.bfloat16)
        return z if z.dtype == torch.float32 else z.float()

    def _mark(self, fp: str, n: int, dim: int, done: int, path: Path) -> None:
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"format": FORMAT, "chunks": fp, "n": n, "dim": dim, "dtype": self.dtype,
                                   "done": done}))
        os.replace(tmp, path)

    def write(self, ids: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor], fp: str,
              start: int = 0, dim: int | None = None, piece_rows: int | None = None,
              on_piece: Callable[[int], None] | None = None, width: int | None = None,
              rows_of: Callable[[int, int], torch.Tensor] | None = None) -> int:
        """Compute and write the rows from ``start`` a piece at a time (``encode``: ids (b, T) -> (b, D); or
        ``rows_of(lo, hi)``: rows already computed); returns the width. ``piece_rows`` (default :data:`PIECE_BYTES`
        of rows of ``width``, the expected width, else of the first piece's); ``on_piece(rows_done)`` after each."""
        n = int(ids.shape[0])
        mm = None
        if start:
            mm = np.memmap(self.part, dtype=self.np_dtype, mode="r+", shape=(n, dim))
        lo = start
        while lo < n:
            per = dim or width
            rows = piece_rows or (max(1, PIECE_BYTES // (per * np.dtype(self.np_dtype).itemsize)) if per else 1024)
            hi = min(n, lo + rows)
            z = rows_of(lo, hi) if rows_of is not None else encode(ids[lo:hi])  # (b, D)
            if mm is None:  # the first piece gives the width: the whole file is laid out (sparse) at once
                dim = int(z.shape[1])
                with contextlib.suppress(FileNotFoundError):
                    self.part.unlink()  # a new file: a tensor still mapped over an old one keeps its pages
                mm = np.memmap(self.part, dtype=self.np_dtype, mode="w+", shape=(n, dim))
            piece = z.detach().to("cpu", self.torch_dtype).contiguous()  # (b, D) in the storage dtype
            mm[lo:hi] = (piece.view(torch.uint16) if self.torch_dtype is torch.bfloat16 else piece).numpy()
            mm.flush()
            self._mark(fp, n, dim, hi, self.part_meta)  # only now does the piece count
            lo = hi
            if on_piece is not None:
                on_piece(hi)
        if mm is None:  # no rows at all
            dim = dim or 0
        del mm
        if n:
            os.replace(self.part, self.bin)
        self._mark(fp, n, dim, n, self.meta)
        with contextlib.suppress(FileNotFoundError):
            self.part_meta.unlink()
        return int(dim)


def cached_embeddings(stem: str | Path, ids: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor] | None,
                      dtype: str = "float32", piece_rows: int | None = None, width: int | None = None,
                      rows_of: Callable[[int, int], torch.Tensor] | None = None) -> tuple[torch.Tensor, bool]:
    """``(z (N, D) float32, whether it was read whole from the cache)`` of chunks ``ids (N, T)``: a finished cache
    is read (mapped), an interrupted one resumed from its last finished piece, else the rows are computed with
    ``encode`` (ids (b, T) -> (b, D)) and written a piece at a time (see the module doc). A cache that is damaged or
    holds other chunks is named in one warning line and rebuilt. ``width``: the expected embedding width (the first
    piece is then as large as the others: an encoder pass of fewer than a piece's rows is one call, as uncached);
    ``rows_of(lo, hi)``: rows computed already (a gathered encoder pass), written instead of calling ``encode``."""
    from memlab.data.stream import _lock

    cache = PieceCache(stem, dtype)
    n = int(ids.shape[0])
    fp = chunks_fingerprint(ids)
    cache.bin.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.lock, "w") as held:
        _lock(held)
        dim, why = cache.finished(fp, n)
        if dim is not None:
            return cache.read(n, dim), True
        start, width_done, why_part = cache.resumable(fp, n)
        for what, problem in ((cache.meta, why), (cache.part_meta, why_part)):
            if problem is not None:
                print(f"memlab: warning: embedding cache {what} {problem}; rebuilding it", file=sys.stderr)
        if start:
            print(f"memlab: note: embedding cache {cache.part}: resuming at row {start} of {n}", file=sys.stderr)
        dim = cache.write(ids, encode, fp, start=start, dim=width_done, piece_rows=piece_rows, width=width,
                          rows_of=rows_of)
        return cache.read(n, dim), False
