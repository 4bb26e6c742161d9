"""Corpora at scale: splits decided while the corpus streams past, token ids in memory-mapped files.

:class:`CorpusStream` reads a corpus lazily (:func:`memlab.data.corpus.iter_documents`: local
files and downloaded hub datasets from their memory-mapped ``datasets`` cache, or a streamed hub
dataset), so the memory it holds does not grow with the corpus. It gives the same units and splits
as the in-memory :func:`memlab.data.views.split_corpus`, in the same order, because both use
:func:`~memlab.data.corpus.cut_size`, :func:`~memlab.data.corpus.iter_units` and
:class:`~memlab.data.splits.SplitPlan`.

It reads the corpus a few times: a few documents to decide how units are cut, one pass for the
split plan, one to train a BPE (when ``data.tokenizer: bpe``), one to tokenize. :func:`token_file`
writes a split's token ids once to ``$MEMLAB_CACHE/tokens`` (``uint16`` when the vocabulary fits, else
``uint32``), with a digest of its bytes checked whenever it is reused (:mod:`memlab.cachecheck`; about 80 ms for
150M tokens in the page cache), under a file lock so that of several processes one writes and the others wait
and read;
:meth:`CorpusStream.chunks` maps it as an ``(N, T)`` array, from which each process reads only the rows
of its own share of a batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from memlab.config import DataConfig
from memlab.data.corpus import CORPORA, Document, bundled_corpus_dir, cut_size, iter_documents, iter_units, local_files
from memlab.data.splits import SplitPlan, UnitCounts, split_line
from memlab.data.tokenizer import cache_dir
from memlab.data.views import (clean_text, corpus_tokenizer, encode_stream, padded_sentences, record_splits,
                               split_sentences)
from memlab.errors import DataError


class CorpusStream:
    """A corpus split into train/validation/test units, read lazily; ``tokenizer`` once :meth:`with_tokenizer`."""

    def __init__(self, cfg: DataConfig):
        self.cfg = cfg
        self.size = cut_size(self._docs(), cfg.split_by)
        self.plan = SplitPlan(cfg.val_fraction, cfg.test_fraction, cfg.split_seed)
        counts = UnitCounts()
        for u in self._units():
            self.plan.add(u.id)
            counts.add(u)
        if not counts.units:
            raise DataError(f"corpus '{cfg.corpus}' is empty: no document has any text")
        self.plan.finish()
        self.split_description = split_line(counts, self.plan.sizes)
        record_splits(cfg, self.split_description, self.plan.sizes)
        self.tokenizer = None

    def _docs(self) -> Iterator[Document]:
        c = self.cfg
        return iter_documents(c.corpus, c.text_field, c.hf_split, c.streaming, c.max_documents)

    def _units(self) -> Iterator[Document]:
        return iter_units(self._docs(), self.cfg.split_by, self.size)

    def units(self, split: str) -> Iterator[Document]:
        """The units of one split, in corpus order (a fresh read of the corpus)."""
        return (u for u in self._units() if self.plan.split_of(u.id) == split)

    def texts(self, split: str) -> Iterator[str]:
        """The cleaned texts of one split (:func:`memlab.data.views.clean_text`), in corpus order."""
        return (clean_text(u.text) for u in self.units(split))

    def with_tokenizer(self, tokenizer_dir: str | Path | None = None, tokenizer_spec: str | None = None) -> "CorpusStream":
        """Build (or load) the tokenizer as :func:`memlab.data.views.prepare_corpus` does, streaming the
        training texts."""
        self.tokenizer = corpus_tokenizer(self.cfg, lambda: self.texts("train"), tokenizer_dir, tokenizer_spec)
        return self

    def _stem(self, split: str, **what) -> Path:
        """Where a split's files live: named by the data settings, the split, the tokenizer and ``what``."""
        if self.tokenizer is None:
            raise DataError("CorpusStream needs a tokenizer to tokenize a split: call with_tokenizer() first")
        key = _key({"data": _data_fingerprint(self.cfg), "split": split, **what,
                    "tokenizer": tokenizer_fingerprint(self.tokenizer)})
        return cache_dir() / "tokens" / key

    def tokens(self, split: str, add_eos: bool = True) -> np.ndarray | None:
        """The split's token stream (EOS after each unit), memory-mapped read-only: ``(n,)``; None when the
        split is empty."""
        stem = self._stem(split, eos=add_eos)
        if not self.plan.sizes[split]:
            return None
        path, dtype, n = token_file(self.texts(split), self.tokenizer, stem, add_eos)
        return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype=dtype)  # (n,)

    def chunks(self, split: str, seq_len: int, add_eos: bool = True) -> np.ndarray | None:
        """The split's token stream cut into ``(N, seq_len)`` chunks, memory-mapped read-only (the last partial
        chunk dropped); None when the split is empty. Raises a DataError when it holds fewer than
        ``seq_len`` tokens."""
        if seq_len < 1:
            raise DataError(f"seq_len must be >= 1, got {seq_len}")
        flat = self.tokens(split, add_eos)  # (n,)
        if flat is None:
            return None
        rows = flat.shape[0] // seq_len
        if rows == 0:
            raise DataError(f"the text holds {flat.shape[0]} tokens, fewer than one chunk of {seq_len}")
        return flat[: rows * seq_len].reshape(rows, seq_len)  # (N, T), still mapped

    def sentences(self, split: str, max_len: int) -> tuple[np.ndarray, np.ndarray, int] | None:
        """The split's Punkt sentences of 1..``max_len`` tokens (:func:`memlab.data.views.padded_sentences`),
        written once and memory-mapped: ``(ids (N, max_len) padded, lengths (N,), sentences dropped as too
        long)``; None when the split is empty."""
        stem = self._stem(split, sentences=max_len)
        if not self.plan.sizes[split]:
            return None
        path, info = sentence_file(self.units(split), self.tokenizer, max_len, stem)
        n, dtype = info["sentences"], np.dtype(info["dtype"])
        if not info["seen"]:
            raise DataError("the corpus split holds no sentences")
        if not n:
            raise DataError(f"no sentence fits in {max_len} tokens")
        ids = np.memmap(path.with_suffix(".bin"), dtype=dtype, mode="r", shape=(n, max_len))  # (N, T)
        lengths = np.memmap(path.with_suffix(".len"), dtype=np.int32, mode="r", shape=(n,))  # (N,)
        return ids, lengths, info["seen"] - n


def picked_texts(stream: CorpusStream, split: str, need_chars: int, seed: int, lengths=None) -> list[str]:
    """The cleaned texts of ``split``'s units in a seeded order until they hold ``need_chars`` characters: what
    ``memlab.probes.chunks.cut.pick_texts`` gives of the split's whole list of texts, with only the chosen texts held
    (one pass for the texts' lengths, unless ``lengths`` gives them, one to collect the chosen)."""
    if lengths is None:
        lengths = split_lengths(stream, split)
    order = np.random.default_rng(seed).permutation(len(lengths))  # (n,)
    total = np.cumsum(lengths[order])  # (n,)
    k = min(int(np.searchsorted(total, need_chars)) + 1, len(order))  # the first k reach need_chars (or all)
    place = {int(i): r for r, i in enumerate(order[:k])}
    out: list[str] = [""] * k
    for i, text in enumerate(stream.texts(split)):
        if i in place:
            out[place[i]] = text
    return out


def split_lengths(stream: CorpusStream, split: str) -> np.ndarray:
    """Characters of each cleaned text of ``split``, in corpus order: ``(n,)``."""
    return np.fromiter((len(t) for t in stream.texts(split)), dtype=np.int64)


def stream_corpus(cfg: DataConfig, tokenizer_dir: str | Path | None = None,
                  tokenizer_spec: str | None = None) -> CorpusStream:
    """:func:`memlab.data.views.prepare_corpus` for corpora of any size: the same splits and tokenizer,
    nothing held in memory (see :class:`CorpusStream`)."""
    return CorpusStream(cfg).with_tokenizer(tokenizer_dir, tokenizer_spec)


def token_dtype(tokenizer) -> np.dtype:
    return np.dtype(np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.uint32)


def written_once(stem: Path, suffixes: tuple[str, ...], write) -> dict:
    """Files ``stem<suffix>`` written once by ``write({suffix: temporary path}) -> info`` (a JSON-able dict).

    A finished set is named by ``stem.json`` (written last, sealed with a digest of its content, with each file's
    size and the digest of its bytes and of ``info``: :mod:`memlab.cachecheck`); a process that finds it, with
    every file present at its size and matching its digest, reuses the files and gets the same ``info``. A set
    that does not match is named in one warning line and written again. Several processes asking at once take
    turns on ``stem.lock`` (removed when released): one writes, the others then reuse. A full disk is one line
    naming the cache, and nothing of it is left."""
    from memlab.cachecheck import file_digest, file_matches, locked, seal, sealed

    meta, lock = stem.with_suffix(".json"), stem.with_suffix(".lock")
    stem.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock):
        info = _finished(meta)
        if info:
            problem = _files_problem(stem, suffixes, info, sealed, file_matches)
            if problem is None:
                return info
            import sys

            print(f"memlab: warning: token cache {meta} is damaged ({problem}); rebuilding it", file=sys.stderr)
        from memlab.rundir import guarded

        tmp = {x: stem.with_name(f"{stem.name}{x}.tmp{os.getpid()}") for x in suffixes}
        meta_tmp = meta.with_name(f"{meta.name}.tmp{os.getpid()}")
        with guarded(f"the token cache in {stem.parent}", *tmp.values(), meta_tmp):  # a failed write leaves nothing
            with contextlib.suppress(FileNotFoundError):
                meta.unlink()  # no description names files half replaced
            info = write(tmp)
            made = {k: v for k, v in info.items() if k not in ("bytes", "digests")}
            info["bytes"] = {x: tmp[x].stat().st_size for x in suffixes}
            info["digests"] = {x: file_digest(tmp[x], {**made, "file": stem.name + x}) for x in suffixes}
            info = seal(info)
            for x in suffixes:
                os.replace(tmp[x], stem.with_suffix(x))
            meta_tmp.write_text(json.dumps(info))
            os.replace(meta_tmp, meta)
    return info


def _files_problem(stem: Path, suffixes, info: dict, sealed, file_matches) -> str | None:
    """Why the files a finished set's ``info`` names are not usable (None: they are)."""
    if not sealed(info) or not isinstance(info.get("digests"), dict):
        return "its description records no digest, or was changed"
    made = {k: v for k, v in info.items() if k not in ("bytes", "digests", "digest")}
    for x in suffixes:
        f = stem.with_suffix(x)
        if not f.is_file() or f.stat().st_size != info.get("bytes", {}).get(x):
            return f"{f.name} is missing or of the wrong size"
        if not file_matches(f, info["digests"].get(x), {**made, "file": stem.name + x}):
            return f"{f.name} does not match its digest"
    return None


def _finished(meta: Path) -> dict:
    """What ``meta`` says of a finished set of files; empty when there is none (or it is damaged: rewritten)."""
    try:
        info = json.loads(meta.read_text()) if meta.is_file() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def token_file(texts, tokenizer, stem: Path, add_eos: bool = True) -> tuple[Path, np.dtype, int]:
    """Write the token ids of ``texts`` (EOS after each) to ``stem.bin`` once (:func:`written_once`):
    ``(path, dtype, token count)``."""
    dtype = token_dtype(tokenizer)

    def write(tmp: dict) -> dict:
        n = 0
        with open(tmp[".bin"], "wb") as f:
            for ids in encode_stream(texts, tokenizer, add_eos):
                f.write(ids.astype(dtype).tobytes())
                n += ids.size
        return {"tokens": n, "dtype": dtype.name}

    info = written_once(stem, (".bin",), write)
    return stem.with_suffix(".bin"), dtype, int(info["tokens"])


def sentence_file(units, tokenizer, max_len: int, stem: Path) -> tuple[Path, dict]:
    """Write the padded sentences of ``units`` (:func:`memlab.data.views.padded_sentences`) once: ids to
    ``stem.bin`` (``(N, max_len)`` rows), lengths to ``stem.len`` (int32); ``info`` counts the sentences kept
    (``sentences``) and read (``seen``)."""
    dtype = token_dtype(tokenizer)

    def write(tmp: dict) -> dict:
        kept = seen = 0
        with open(tmp[".bin"], "wb") as ids_f, open(tmp[".len"], "wb") as len_f:
            for ids, lengths, n_seen in padded_sentences((split_sentences(u.text) for u in units), tokenizer, max_len):
                ids_f.write(ids.astype(dtype).tobytes())  # (b, T)
                len_f.write(lengths.astype(np.int32).tobytes())  # (b,)
                kept, seen = kept + len(lengths), seen + n_seen
        return {"sentences": kept, "seen": seen, "dtype": dtype.name}

    return stem, written_once(stem, (".bin", ".len"), write)


def _key(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:24]


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of a tokenizer's vocabulary and rules (its ``tokenizer.json`` for fast tokenizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _data_fingerprint(cfg: DataConfig) -> dict:
    """What a corpus's token files depend on: the data settings and, for files, their names, sizes and times
    (a hub dataset is named, not hashed: a new revision under the same name needs a new MEMLAB_CACHE)."""
    keys = ("corpus", "text_field", "hf_split", "max_documents", "split_by", "val_fraction", "test_fraction", "split_seed")
    out: dict = {k: getattr(cfg, k) for k in keys}
    if cfg.corpus.startswith("hf:"):
        return out
    if cfg.corpus in CORPORA:
        root = bundled_corpus_dir(cfg.corpus)
        files = sorted(root.glob("*")) if root.is_dir() else []
    else:
        files, _ = local_files(cfg.corpus)
    out["files"] = [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    return out
