"""Chunk embeddings cached in pieces to a memory-mapped file: written as they are computed, resumed after a kill,
read without loading them whole.

A cache named by its stem ``DIR/emb-<hash>`` (the caller's key) and a storage dtype is two files::

    emb-<hash>.float32.bin     the (N, D) embeddings, row-major, in the storage dtype (bfloat16 as its raw 16 bits)
    emb-<hash>.float32.json    {"format": ..., "key": "emb-<hash>", "chunks": sha256 of the chunks' ids, "n": N,
                                "dim": D, "dtype": "float32", "done": N, "pieces": [[lo, hi, digest], ...]}

While it is written they are ``.part`` and ``.part.json``: the embeddings are computed a piece of rows at a time
(:data:`PIECE_BYTES` of them), each piece written into the mapped file and flushed, and only then is ``done`` in
``.part.json`` moved past it, with the piece's digest (a temporary file and a rename). A process killed at any point
(``kill -9`` included) leaves every piece before ``done`` usable; the next run with the same chunks checks them and
resumes from there. When the last piece is in, ``.part`` is renamed to ``.bin`` and the ``.json`` written last: a
``.json`` names a finished cache.

Each piece's digest (:mod:`memlab.cachecheck`: XXH3-128, tens of GB/s) covers its rows' bytes and what made them
(the cache's key, its chunks, dtype, shape and the piece's rows), and every piece is checked before a cache is read
or resumed: rows swapped, scaled or flipped, a file cut short, or the bytes of another dtype under this one's name
are one warning line naming the cache, which is rebuilt. The check reads the file once: for 100k rows of 768
float32 (307 MB) in the page cache, 37 ms, as long as one pass summing the rows (about 2 ms per 100k rows of 16
float32 each more); writing that cache takes about 2 s, of which hashing is 15 ms.

:func:`cached_embeddings` reads a finished cache as a tensor over the mapped file (``float32`` storage: no copy, pages
read as rows are used; ``float16``/``bfloat16``, which halve the file: converted to float32 as they are read). The
first run reads its embeddings back from the file too, so a cached run and a first run read the same numbers.
Several processes asking at once take turns on ``emb-<hash>.<dtype>.lock`` (removed when released): one writes, the
others then read. The file's whole size is reserved on the disk before it is mapped, so a full disk is one line
naming the cache's folder, with its ``.part`` files removed, never a bus error.
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

from memlab.cachecheck import digest, locked, matches, reserve
from memlab.errors import ConfigError, MemlabError

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
        self.key = base.name
        self.bin, self.meta = (base.with_name(f"{base.name}.{dtype}{x}") for x in (".bin", ".json"))
        self.part, self.part_meta = (base.with_name(f"{base.name}.{dtype}{x}") for x in (".part", ".part.json"))
        self.lock = base.with_name(f"{base.name}.{dtype}.lock")
        self.np_dtype, self.torch_dtype = STORAGE[dtype]

    def made(self, fp: str, n: int, dim: int, lo: int, hi: int) -> dict:
        """What made rows ``lo:hi`` (hashed with their bytes into the piece's digest)."""
        return {"format": FORMAT, "key": self.key, "chunks": fp, "n": n, "dim": dim, "dtype": self.dtype,
                "rows": [lo, hi]}

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
        pieces = meta.get("pieces")
        try:
            bounds = [(int(lo), int(hi)) for lo, hi, _ in pieces]
        except (TypeError, ValueError):
            return None, "is damaged (it records no digest of its rows: written by an earlier memlab)"
        if [lo for lo, _ in bounds] != [0] + [hi for _, hi in bounds[:-1]] or (bounds[-1][1] if bounds else 0) != done:
            return None, "is damaged (its pieces do not cover its rows)"
        return meta, None

    def _size_ok(self, path: Path, n: int, dim: int) -> bool:
        return path.is_file() and path.stat().st_size == n * dim * np.dtype(self.np_dtype).itemsize

    def _digests_problem(self, path: Path, meta: dict, fp: str, n: int) -> str | None:
        """Why the rows of ``path`` that ``meta``'s pieces cover do not match their digests (None: they do)."""
        if not meta["pieces"]:
            return None
        dim = int(meta["dim"])
        mm = np.memmap(path, dtype=self.np_dtype, mode="r", shape=(n, dim))  # (n, dim), read-only
        try:
            for lo, hi, d in meta["pieces"]:
                if not matches(d, self.made(fp, n, dim, lo, hi), mm[lo:hi]):
                    return f"is damaged (rows {lo}-{hi} do not match their digest)"
        finally:
            del mm
        return None

    def finished(self, fp: str, n: int) -> tuple[int | None, str | None]:
        """The width of a finished cache of these chunks whose rows match their digests (None: none), and why one
        present is not used."""
        meta, why = self._read_meta(self.meta, fp, n)
        if meta is None:
            return None, why
        if meta["done"] != n or not self._size_ok(self.bin, n, meta["dim"]) and n:
            return None, f"is damaged (its file does not hold {n} rows of {meta['dim']})"
        why = self._digests_problem(self.bin, meta, fp, n)
        return (None, why) if why else (int(meta["dim"]), None)

    def resumable(self, fp: str, n: int) -> tuple[int, int | None, list, str | None]:
        """Rows already written by an interrupted run of these chunks, its width, their pieces, and why a partial
        one is not used."""
        meta, why = self._read_meta(self.part_meta, fp, n)
        if meta is None:
            return 0, None, [], why
        if not self._size_ok(self.part, n, meta["dim"]):
            return 0, None, [], "is damaged (its partial file has the wrong size)"
        why = self._digests_problem(self.part, meta, fp, n)
        if why:
            return 0, None, [], why
        return int(meta["done"]), int(meta["dim"]), list(meta["pieces"]), None

    def read(self, n: int, dim: int) -> torch.Tensor:
        """The finished cache as ``(n, dim)`` float32: over the mapped file itself for float32 storage."""
        if n == 0:
            return torch.zeros(0, dim)
        mm = np.memmap(self.bin, dtype=self.np_dtype, mode="c", shape=(n, dim))  # copy-on-write: never writes back
        z = torch.from_numpy(mm)  # (n, dim), still mapped
        if self.torch_dtype is torch.bfloat16:
            z = z.view(torch.bfloat16)
        return z if z.dtype == torch.float32 else z.float()

    def _mark(self, fp: str, n: int, dim: int, done: int, path: Path, pieces: list) -> None:
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"format": FORMAT, "key": self.key, "chunks": fp, "n": n, "dim": dim,
                                   "dtype": self.dtype, "done": done, "pieces": pieces}))
        os.replace(tmp, path)

    def _temporaries(self) -> list[Path]:
        return [self.part, self.part_meta, *(p.with_name(f"{p.name}.tmp{os.getpid()}")
                                             for p in (self.part_meta, self.meta))]

    def write(self, ids: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor], fp: str,
              start: int = 0, dim: int | None = None, piece_rows: int | None = None,
              on_piece: Callable[[int], None] | None = None, width: int | None = None,
              rows_of: Callable[[int, int], torch.Tensor] | None = None, pieces: list | None = None) -> int:
        """Compute and write the rows from ``start`` a piece at a time (``encode``: ids (b, T) -> (b, D); or
        ``rows_of(lo, hi)``: rows already computed); returns the width. ``piece_rows`` (default :data:`PIECE_BYTES`
        of rows of ``width``, the expected width, else of the first piece's); ``on_piece(rows_done)`` after each;
        ``pieces``: the pieces before ``start`` (their digests). A storage failure (a full disk) is one line naming
        the cache's folder, and the partial files are removed."""
        from memlab.rundir import storage_failure

        try:
            return self._write(ids, encode, fp, start, dim, piece_rows, on_piece, width, rows_of, list(pieces or []))
        except BaseException as e:
            reason = storage_failure(e, writes_only=True)
            if reason is None:
                raise  # a kill or a failed encoder pass: the pieces written so far are resumed
            for t in self._temporaries():
                with contextlib.suppress(OSError):
                    t.unlink()
            raise MemlabError(f"could not write the embedding cache in {self.bin.parent} ({reason}); nothing of it "
                              "was kept") from None

    def _write(self, ids, encode, fp, start, dim, piece_rows, on_piece, width, rows_of, pieces) -> int:
        n = int(ids.shape[0])
        item = np.dtype(self.np_dtype).itemsize
        mm = None
        if start:
            with open(self.part, "r+b") as f:
                reserve(f.fileno(), n * dim * item)  # a partial file of an earlier memlab may be sparse
            mm = np.memmap(self.part, dtype=self.np_dtype, mode="r+", shape=(n, dim))
        lo = start
        while lo < n:
            per = dim or width
            rows = piece_rows or (max(1, PIECE_BYTES // (per * item)) if per else 1024)
            hi = min(n, lo + rows)
            z = rows_of(lo, hi) if rows_of is not None else encode(ids[lo:hi])  # (b, D)
            if mm is None:  # the first piece gives the width: the whole file is laid out at once
                dim = int(z.shape[1])
                with contextlib.suppress(FileNotFoundError):
                    self.part.unlink()  # a new file: a tensor still mapped over an old one keeps its pages
                with open(self.part, "wb") as f:
                    reserve(f.fileno(), n * dim * item)  # a full disk fails here, not as a bus error below
                mm = np.memmap(self.part, dtype=self.np_dtype, mode="r+", shape=(n, dim))
            piece = z.detach().to("cpu", self.torch_dtype).contiguous()  # (b, D) in the storage dtype
            rows_np = (piece.view(torch.uint16) if self.torch_dtype is torch.bfloat16 else piece).numpy()  # (b, D)
            pieces.append([lo, hi, digest(self.made(fp, n, dim, lo, hi), rows_np)])
            mm[lo:hi] = rows_np
            mm.flush()
            self._mark(fp, n, dim, hi, self.part_meta, pieces)  # only now does the piece count
            lo = hi
            if on_piece is not None:
                on_piece(hi)
        if mm is None:  # no rows at all
            dim = dim or 0
        del mm
        if n:
            os.replace(self.part, self.bin)
        self._mark(fp, n, dim, n, self.meta, pieces)
        with contextlib.suppress(FileNotFoundError):
            self.part_meta.unlink()
        return int(dim)


def cached_embeddings(stem: str | Path, ids: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor] | None,
                      dtype: str = "float32", piece_rows: int | None = None, width: int | None = None,
                      rows_of: Callable[[int, int], torch.Tensor] | None = None) -> tuple[torch.Tensor, bool]:
    """``(z (N, D) float32, whether it was read whole from the cache)`` of chunks ``ids (N, T)``: a finished cache
    whose rows match their digests is read (mapped), an interrupted one resumed from its last finished piece, else
    the rows are computed with ``encode`` (ids (b, T) -> (b, D)) and written a piece at a time (see the module doc).
    A cache that is damaged or holds other chunks is named in one warning line and rebuilt. ``width``: the expected
    embedding width (the first piece is then as large as the others: an encoder pass of fewer than a piece's rows
    is one call, as uncached); ``rows_of(lo, hi)``: rows computed already (a gathered encoder pass), written instead
    of calling ``encode``."""
    cache = PieceCache(stem, dtype)
    n = int(ids.shape[0])
    fp = chunks_fingerprint(ids)
    cache.bin.parent.mkdir(parents=True, exist_ok=True)
    with locked(cache.lock):
        dim, why = cache.finished(fp, n)
        if dim is not None:
            return cache.read(n, dim), True
        start, width_done, pieces, why_part = cache.resumable(fp, n)
        for what, problem in ((cache.meta, why), (cache.part_meta, why_part)):
            if problem is not None:
                print(f"memlab: warning: embedding cache {what} {problem}; rebuilding it", file=sys.stderr)
        if why is not None:
            with contextlib.suppress(FileNotFoundError):
                cache.meta.unlink()  # no longer names a finished cache, should the rebuild stop half-way
        if start:
            print(f"memlab: note: embedding cache {cache.part}: resuming at row {start} of {n}", file=sys.stderr)
        dim = cache.write(ids, encode, fp, start=start, dim=width_done, piece_rows=piece_rows, width=width,
                          rows_of=rows_of, pieces=pieces)
        return cache.read(n, dim), False
