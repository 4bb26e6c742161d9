"""The probe's embedding cache (``--cache-dir``): chunk embeddings ``z (N, D)`` beside the chunks' ``ids (N, T)``.

A cache is named by its caller (``emb-<hash>.safetensors``, :func:`memlab.probes.encoders.encode.cached_encode`). One of
at most :data:`SHARD_BYTES` (embeddings and ids together) is that one safetensors file. A larger one is
written as shards of at most :data:`SHARD_BYTES` each, ``emb-<hash>-00001-of-00004.safetensors`` and so on
(each holding its rows of ``z`` and ``ids``), named by a small index written last,
``emb-<hash>.index.json``::

    {"format": "memlab-chunk-embeddings", "chunks": sha256 of the ids, "ids_shape": [N, T], "ids_dtype": "int64",
     "z_shape": [N, D], "z_dtype": "float32", "shards": [{"file": ..., "rows": [lo, hi]}, ...]}

:func:`read_chunk_embeddings` reads the shards one at a time into the one ``(N, D)`` tensor it returns (no
second full copy) and takes the cache only when it is whole and holds the same chunks: an index or shard that
is missing, truncated or of other chunks is named in one warning line and the cache rebuilt. Each file records in
its safetensors metadata a digest (:mod:`memlab.cachecheck`) of its bytes and of what made them (the format, its
name, its shapes and dtype), and the index is sealed with one of its own: rows swapped, scaled or flipped are found
as a file cut short is, and a file without a digest (an earlier memlab's) is rebuilt too. A cache found damaged or
of other chunks is removed, so the warning is said once.
:func:`write_chunk_embeddings` writes through temporary files and renames; :func:`check_cache_dir` refuses an
unusable folder before any compute.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from memlab.cachecheck import digest, matches, seal, sealed
from memlab.errors import DataError

SHARD_BYTES = 1 << 30
"""Largest cache written as one file, and largest shard of a larger one (embeddings and ids, in bytes)."""
FORMAT = "memlab-chunk-embeddings"


def check_cache_dir(path: str | Path, flag: str = "--cache-dir") -> None:
    """A one-line DataError, before any compute, when ``path`` cannot hold a cache (a file, or not writable)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise DataError(f"{flag} {p} is a file, not a folder")
    base = next((q for q in [p, *p.parents] if q.exists()), Path("."))
    if not base.is_dir():
        raise DataError(f"{flag} {p} cannot be created: {base} is a file")
    if not os.access(base, os.W_OK | os.X_OK):
        raise DataError(f"{flag} {p}: cannot write into {base} (permission denied)")


def index_path(path: str | Path) -> Path:
    """The index of a sharded cache named ``path``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.index.json")


def chunks_fingerprint(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.contiguous().numpy().tobytes()).hexdigest()


def read_chunk_embeddings(path: str | Path, ids: torch.Tensor) -> torch.Tensor | None:
    """The cached ``z (N, D)`` of chunks ``ids (N, T)`` named ``path`` (one file, or the shards of its index);
    None when there is none, or when it is damaged or holds other chunks (named in one warning line: it is then
    rebuilt)."""
    path = Path(path)
    index = index_path(path)
    if index.is_file():
        where, (z, problem) = index, _read_sharded(index, ids)
    elif path.is_file():
        where, (z, problem) = path, _read_file(path, ids)
    else:
        return None
    if problem is None:
        return z
    print(f"memlab: warning: embedding cache {where} {problem}; rebuilding it", file=sys.stderr)
    _remove(index)  # gone: the cache is rebuilt in its memory-mapped form, read next time (one warning, once)
    _remove(path)
    _remove_shards(path, ())
    return None


def _made(name: str, z: torch.Tensor, ids: torch.Tensor) -> dict:
    """What made one file's bytes (hashed with them into its digest)."""
    return {"format": FORMAT, "file": name, "z_shape": list(z.shape), "z_dtype": str(z.dtype),
            "ids_shape": list(ids.shape), "ids_dtype": str(ids.dtype)}


def _bytes(t: torch.Tensor):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


def _file_digest(name: str, z: torch.Tensor, ids: torch.Tensor) -> dict[str, str]:
    """The safetensors metadata of one file: the digest of its tensors' bytes and what made them."""
    return {"digest": digest(_made(name, z, ids), _bytes(z), _bytes(ids))}


def _read_file(path: Path, ids: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """``z`` of one file (the cache, or one shard of it) holding ``ids``, or what is wrong with it:
    ``is damaged (why)`` or ``holds other chunks (why)``."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            got = f.get_tensor("ids")  # (n, T)
            if tuple(got.shape) != tuple(ids.shape) or not torch.equal(got, ids):
                return None, f"holds other chunks ({tuple(got.shape)} token ids, these are {tuple(ids.shape)})"
            z = f.get_tensor("z")  # (n, D)
            recorded = (f.metadata() or {}).get("digest")
    except Exception as e:  # SafetensorError (truncated, bad header, no such tensor), OSError
        from memlab.errors import is_read_error

        if not (is_read_error(e) or isinstance(e, KeyError)):
            raise
        return None, f"is damaged ({' '.join(str(e).split())[:100]})"
    if z.ndim < 2 or z.shape[0] != ids.shape[0] or not torch.isfinite(z).all():
        return None, f"is damaged (embeddings of shape {tuple(z.shape)} for {ids.shape[0]} chunks)"
    if recorded is None:
        return None, "is damaged (it records no digest of its bytes: written by an earlier memlab)"
    if not matches(recorded, _made(path.name, z, got), _bytes(z), _bytes(got)):
        return None, "is damaged (its bytes do not match their digest)"
    return z, None


def _read_sharded(index: Path, ids: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """``z`` of the shards that ``index`` names, read one at a time into one ``(N, D)`` tensor, or a problem."""
    try:
        info = json.loads(index.read_text())
        shards = [(s["file"], int(s["rows"][0]), int(s["rows"][1])) for s in info["shards"]]
        z_shape, z_dtype = [int(x) for x in info["z_shape"]], getattr(torch, info["z_dtype"])
        if info.get("format") != FORMAT or not isinstance(z_dtype, torch.dtype) or len(z_shape) < 2:
            raise ValueError("not the index of a chunk-embedding cache")
        if not sealed(info):
            raise ValueError("its content does not match its digest")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return None, f"is damaged ({' '.join(str(e).split())[:100]})"
    if info.get("ids_shape") != list(ids.shape) or info.get("chunks") != chunks_fingerprint(ids):
        return None, f"holds other chunks ({tuple(info.get('ids_shape') or ())} token ids, these are {tuple(ids.shape)})"
    starts, ends = [lo for _, lo, _ in shards], [hi for _, _, hi in shards]
    if not shards or z_shape[0] != ids.shape[0] or starts != [0] + ends[:-1] or ends[-1] != ids.shape[0]:
        return None, f"is damaged (its shards do not cover the {ids.shape[0]} chunks)"
    z = torch.empty(z_shape, dtype=z_dtype)  # (N, D), filled one shard at a time
    for name, lo, hi in shards:
        f = index.parent / name
        part, problem = _read_file(f, ids[lo:hi]) if f.is_file() else (None, "is damaged (missing)")
        if problem is None and (list(part.shape[1:]) != z_shape[1:] or part.dtype != z_dtype):
            problem = f"is damaged (embeddings of shape {tuple(part.shape)}, {part.dtype})"
        if problem is not None:  # "is damaged (shard NAME: why)"
            kind, why = problem.split(" (", 1)
            return None, f"{kind} (shard {name}: {why}"
        z[lo:hi] = part
    return z, None


def write_chunk_embeddings(path: str | Path, z: torch.Tensor, ids: torch.Tensor) -> None:
    """Save ``z (N, D)`` beside ``ids (N, T)`` as the cache named ``path``: one file when both fit in
    :data:`SHARD_BYTES`, else shards of at most that size and their index (temporary files and renames; the index
    last; a failure is one line)."""
    from safetensors.torch import save_file

    from memlab.rundir import guarded

    path = Path(path)
    index = index_path(path)
    n = int(z.shape[0])
    row = z[0].numel() * z.element_size() + ids[0].numel() * ids.element_size() if n else 0
    per = max(1, SHARD_BYTES // max(row, 1))
    pid = os.getpid()
    if n <= per:  # one file, as a small cache always was
        tmp = path.with_name(f"{path.stem}.tmp{pid}{path.suffix}")
        with guarded(f"the embedding cache in {path.parent}", tmp):
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file({"z": z.contiguous(), "ids": ids.contiguous()}, str(tmp), _file_digest(path.name, z, ids))
            _remove(index)  # an earlier sharded cache of this name would be read first
            os.replace(tmp, path)
            _remove_shards(path, ())
        return
    k = -(-n // per)
    names = [f"{path.stem}-{i + 1:05d}-of-{k:05d}{path.suffix}" for i in range(k)]
    tmps = [path.with_name(f"{name}.tmp{pid}") for name in names] + [index.with_name(f"{index.name}.tmp{pid}")]
    with guarded(f"the embedding cache in {path.parent}", *tmps):
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(index)  # no index names a half-written set of shards
        shards = []
        for i, name in enumerate(names):
            lo, hi = i * per, min(n, (i + 1) * per)
            save_file({"z": z[lo:hi].contiguous(), "ids": ids[lo:hi].contiguous()}, str(tmps[i]),  # (b, D), (b, T)
                      _file_digest(name, z[lo:hi], ids[lo:hi]))
            os.replace(tmps[i], path.with_name(name))
            shards.append({"file": name, "rows": [lo, hi]})
        info = {"format": FORMAT, "chunks": chunks_fingerprint(ids), "ids_shape": list(ids.shape),
                "ids_dtype": str(ids.dtype).removeprefix("torch."), "z_shape": list(z.shape),
                "z_dtype": str(z.dtype).removeprefix("torch."), "shards": shards}
        tmps[-1].write_text(json.dumps(seal(info), indent=1))
        os.replace(tmps[-1], index)
        _remove(path)  # a single file of this name from a smaller shard size
        _remove_shards(path, names)


def _remove_shards(path: Path, keep) -> None:
    """Shards of the cache ``path`` from an earlier write (another shard count), except ``keep``."""
    for old in path.parent.glob(f"{path.stem}-*-of-*{path.suffix}"):
        if old.name not in keep:
            _remove(old)


def _remove(p: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        p.unlink()
