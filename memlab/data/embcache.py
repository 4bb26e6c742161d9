"""Sentence-embedding cache: documents of sentences -> frozen-encoder vectors, computed once.

Sentence models (SONAR-LLM, the LCM baselines) train on the embeddings of a
frozen encoder and on the token ids of the same sentences. Both are computed
once per (space, corpus, split) and stored with ``datasets`` (Arrow,
``save_to_disk``) under ``CACHE_ROOT/<fingerprint>/``, so training never
re-encodes. The fingerprint hashes the space's identity (its spec, its width
and its embeddings of a fixed probe sentence, which catch a changed set of
weights behind the same spec), the documents' text, the split and the token
limit. Loading a cache checks the same identity and raises a
:class:`~memlab.errors.DataError` naming what differs.

Layout of one cache folder::

    meta.json           space spec, embedding shape, probe embedding, split, sizes
    data/               a datasets.Dataset: doc (int), embedding (list[float32] E), input_ids (list[int])

Embeddings are stored flat: an embedding of shape ``(K, D)`` (K memory
vectors) is stored as ``E = K * D`` numbers and ``meta.json`` keeps the shape.

``meta.json`` records the digest of every file under ``data/`` (of its bytes and
of the description itself: :mod:`memlab.cachecheck`) and is sealed with a digest of
its own content; both are checked before a cache is read. A damaged cache (a
truncated ``meta.json`` or Arrow file, bytes changed, a description edited, a
cache of an earlier memlab without digests) is named in one line: under its
fingerprinted folder it is rebuilt, at a folder the user named (``path``) it is
refused and left as it is.

The probe's embedding cache (``--cache-dir``: chunk embeddings, one file or
shards) is :mod:`memlab.data.chunkcache`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memlab.errors import DataError

PROBE_SENTENCES = ["It is a truth universally acknowledged.", "End of sequence."]


@dataclass
class SentenceSplit:
    """One split as flat arrays: documents are consecutive runs of sentences."""

    embeddings: torch.Tensor
    """``(N, E)`` float32: one flattened embedding per sentence."""
    input_ids: torch.Tensor
    """``(N, L)`` long: each sentence's token ids in the space's tokenizer, right-padded with 0."""
    lengths: torch.Tensor
    """``(N,)`` long: real tokens of each sentence."""
    doc_offsets: torch.Tensor
    """``(M + 1,)`` long: document ``m`` holds sentences ``doc_offsets[m] : doc_offsets[m + 1]``."""
    meta: dict[str, Any]

    @property
    def num_documents(self) -> int:
        return int(self.doc_offsets.numel() - 1)


def space_device(space) -> torch.device:
    for obj in [space, *vars(space).values()]:
        if isinstance(obj, torch.nn.Module):
            p = next(obj.parameters(), None)
            if p is not None:
                return p.device
    return torch.device("cpu")


@torch.no_grad()
def space_identity(space, spec: str) -> dict[str, Any]:
    """What identifies a space for the cache: spec, embedding shape and the probe sentences' embeddings."""
    z = space.encode_text(PROBE_SENTENCES).float().cpu()  # (2, D) or (2, K, D)
    return {"space": spec, "shape": list(z.shape[1:]), "probe": [round(x, 5) for x in z.flatten().tolist()]}


def check_identity(meta: dict[str, Any], ident: dict[str, Any], where: str, atol: float = 1e-2) -> None:
    """Raise a DataError naming the first difference between a cache's space and ``ident``."""
    if meta.get("shape") != ident["shape"]:
        raise DataError(f"embedding cache {where} was built with space '{meta.get('space')}' of embedding shape "
                        f"{meta.get('shape')}; this run's space '{ident['space']}' has shape {ident['shape']}")
    a, b = np.asarray(meta.get("probe", []), dtype=np.float64), np.asarray(ident["probe"], dtype=np.float64)
    if a.shape != b.shape or not np.allclose(a, b, atol=atol * max(1.0, float(np.abs(b).max(initial=0)))):
        raise DataError(f"embedding cache {where} was built with space '{meta.get('space')}'; this run's space "
                        f"'{ident['space']}' embeds the probe sentences differently (other weights): rebuild the cache")


def documents_hash(documents: list[list[str]]) -> str:
    h = hashlib.sha256()
    for doc in documents:
        h.update(str(len(doc)).encode())
        for s in doc:
            h.update(hashlib.sha256(s.encode()).digest())
    return h.hexdigest()


def cache_key(ident: dict[str, Any], documents: list[list[str]], split: str, max_tokens: int) -> str:
    probe = [round(x, 3) for x in ident["probe"]]
    blob = json.dumps({"space": ident["space"], "shape": ident["shape"], "probe": probe, "split": split,
                       "max_tokens": max_tokens, "docs": documents_hash(documents)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@torch.no_grad()
def encode_sentences(space, sentences: list[str], max_tokens: int, batch_size: int = 64) -> tuple[np.ndarray, list[list[int]], int]:
    """Tokenize (truncating at ``max_tokens``) and encode unique sentences, longest first in batches.

    Returns ``(embeddings (N, E) float32, token ids per sentence, number truncated)``.
    """
    tok = space.tokenizer
    ids_all = tok(list(sentences), add_special_tokens=False)["input_ids"]
    truncated = sum(len(x) > max_tokens for x in ids_all)
    ids_all = [x[:max_tokens] for x in ids_all]
    empty = [i for i, x in enumerate(ids_all) if not x]
    if empty:
        raise DataError(f"sentence {empty[0]} has no tokens in the space's tokenizer: {sentences[empty[0]]!r}")
    order = sorted(range(len(ids_all)), key=lambda i: -len(ids_all[i]))
    dev = space_device(space)
    out: np.ndarray | None = None
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        L = max(len(ids_all[i]) for i in idx)
        ids = torch.full((len(idx), L), pad, dtype=torch.long)
        mask = torch.zeros(len(idx), L, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(ids_all[i])] = torch.tensor(ids_all[i])
            mask[r, : len(ids_all[i])] = 1
        z = space.encode(ids.to(dev), mask.to(dev)).float().flatten(1).cpu().numpy()  # (b, E)
        if out is None:
            out = np.zeros((len(ids_all), z.shape[1]), dtype=np.float32)
        out[idx] = z
    assert out is not None
    return out, ids_all, truncated


def build_or_load(space, spec: str, documents: list[list[str]], split: str, cache_root: str | Path,
                  max_tokens: int = 64, batch_size: int = 64, path: str | Path | None = None, env=None) -> SentenceSplit:
    """The cached split of ``documents`` under ``space``: loaded when present, else encoded and saved.

    ``path`` names the cache folder explicitly (default ``cache_root/<fingerprint>``); an
    existing folder built with another space raises a DataError. ``env`` (a
    :class:`memlab.train.processes.SetupEnv`, for a launch of several processes): the main process decides
    whether the cache exists; if not, every process encodes its share of the sentences (each sentence once
    in all), the main process saves the merged cache, and every process loads that same folder.
    """
    if not documents:
        raise DataError(f"split '{split}' holds no documents to embed")
    ident = space_identity(space, spec)
    folder = Path(path) if path else Path(cache_root) / f"{split}-{cache_key(ident, documents, split, max_tokens)}"
    world = env.num_processes if env is not None else 1
    exists = (folder / "meta.json").is_file()
    if world > 1:
        exists = env.broadcast(exists)  # one answer: a process that saw the folder appear would skip its share
    if exists:
        try:
            got = load_split(folder, ident)
        except CacheDamaged as e:
            if path:  # a folder the user named is not deleted
                raise DataError(f"{e}; delete it to rebuild it") from None
            if env is None or env.is_main:
                print(f"memlab: warning: {e}; rebuilding it", file=sys.stderr)
                shutil.rmtree(folder, ignore_errors=True)
            if world > 1:
                env.barrier()  # the damaged folder is gone before any process rebuilds it
        else:
            if path and got.meta.get("docs") != documents_hash(documents):
                raise DataError(f"embedding cache {folder} holds other documents than this run's '{split}' split")
            return got
    unique = sorted({s for d in documents for s in d})
    if world == 1:
        with env.frozen_autocast() if env is not None else contextlib.nullcontext():
            emb, ids, truncated = encode_sentences(space, unique, max_tokens, batch_size)
        return _save_split(folder, ident, documents, split, max_tokens, unique, emb, ids, truncated)
    rank = env.process_index
    with env.frozen_autocast():
        mine = encode_sentences(space, unique[rank::world], max_tokens, batch_size) if unique[rank::world] else None
    parts = env.gather(mine)  # every process's (embeddings, ids, truncated), in process order
    if env.is_main:
        width = next(p[0].shape[1] for p in parts if p is not None)
        emb = np.zeros((len(unique), width), dtype=np.float32)
        ids: list[list[int]] = [[] for _ in unique]
        for r, part in enumerate(parts):
            if part is not None:
                emb[r::world] = part[0]
                ids[r::world] = part[1]
        _save_split(folder, ident, documents, split, max_tokens, unique, emb, ids,
                    sum(p[2] for p in parts if p is not None))
    env.barrier()  # the main process has saved it
    return load_split(folder, ident)


def _save_split(folder: Path, ident: dict[str, Any], documents: list[list[str]], split: str, max_tokens: int,
                unique: list[str], emb: np.ndarray, ids: list[list[int]], truncated: int) -> SentenceSplit:
    """Write the cache folder of ``documents`` from the embeddings and ids of their ``unique`` sentences."""
    where = {s: i for i, s in enumerate(unique)}
    rows = [where[s] for d in documents for s in d]
    doc_col = [m for m, d in enumerate(documents) for _ in d]
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict({"doc": doc_col, "embedding": emb[rows], "input_ids": [ids[r] for r in rows]})
    meta = dict(ident, split=split, max_tokens=max_tokens, docs=documents_hash(documents), documents=len(documents),
                sentences=len(rows), unique_sentences=len(unique), truncated_sentences=truncated)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    from memlab.cachecheck import files_digests, seal
    from memlab.rundir import guarded

    with guarded(f"the embedding cache in {folder.parent}", tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        ds.save_to_disk(str(tmp / "data"))
        meta["files"] = files_digests(tmp / "data", _made(meta))
        (tmp / "meta.json").write_text(json.dumps(seal(meta)))
        folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return load_split(folder, ident)


class CacheDamaged(DataError):
    """An embedding cache whose files cannot be read back (truncated, or not what a cache holds)."""


def _made(meta: dict) -> dict:
    """What made a cache's files (hashed with each file's bytes): its description, less the digests."""
    return {"format": "memlab-sentence-embeddings", **{k: v for k, v in meta.items() if k not in ("files", "digest")}}


def load_split(folder: str | Path, ident: dict[str, Any] | None = None) -> SentenceSplit:
    """Load a cache folder; with ``ident`` (see :func:`space_identity`) check that the same space built it."""
    import datasets

    folder = Path(folder)
    if not (folder / "meta.json").is_file():
        raise DataError(f"{folder} is not an embedding cache (no meta.json)")
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if not isinstance(meta, dict) or not isinstance(meta.get("documents"), int):
            raise ValueError("meta.json is not a cache's description")
    except (OSError, ValueError) as e:
        raise CacheDamaged(f"embedding cache {folder} is damaged ({' '.join(str(e).split())[:100]})") from None
    from memlab.cachecheck import files_problem, sealed

    problem = files_problem(folder / "data", meta.get("files"), _made(meta))
    if problem is None and not sealed(meta):
        problem = "its meta.json does not match its digest"
    if problem is not None:
        raise CacheDamaged(f"embedding cache {folder} is damaged ({problem})")
    if ident is not None:
        check_identity(meta, ident, str(folder))
    try:
        ds = datasets.load_from_disk(str(folder / "data"))
        emb = torch.from_numpy(np.asarray(ds.with_format("numpy")["embedding"], dtype=np.float32))  # (N, E)
        ids, doc_ids = ds["input_ids"], ds["doc"]
    except Exception as e:  # a truncated Arrow file (pyarrow's ArrowInvalid), missing files, missing columns
        if not isinstance(e, (OSError, ValueError, KeyError)) and "arrow" not in type(e).__module__.lower():
            raise
        raise CacheDamaged(f"embedding cache {folder} is damaged ({' '.join(str(e).split())[:100]})") from None
    if len(ids) != meta.get("sentences", len(ids)) or emb.shape[0] != len(ids):
        raise CacheDamaged(f"embedding cache {folder} is damaged (it holds {emb.shape[0]} sentences, "
                           f"{meta.get('sentences')} were saved)")
    lengths = torch.tensor([len(x) for x in ids], dtype=torch.long)  # (N,)
    L = int(lengths.max()) if len(ids) else 0
    padded = torch.zeros(len(ids), L, dtype=torch.long)  # (N, L)
    for i, x in enumerate(ids):
        padded[i, : len(x)] = torch.tensor(x, dtype=torch.long)
    doc = torch.tensor(doc_ids, dtype=torch.long)
    counts = torch.bincount(doc, minlength=meta["documents"])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    return SentenceSplit(embeddings=emb, input_ids=padded, lengths=lengths, doc_offsets=offsets, meta=meta)
