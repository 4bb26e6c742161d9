"""Two views of a corpus: fixed token chunks, and documents as sentence lists.

:func:`split_corpus` loads, cuts into units and splits; :func:`prepare_corpus` adds the
tokenizer; :func:`token_chunks` and :func:`sentence_documents` turn a
split into the view a model family trains on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from memlab.config import DataConfig
from memlab.data.corpus import Document, describe_splits, load_corpus, make_splits, units
from memlab.data.sentences import paragraphs, split_sentences
from memlab.data.tokenizer import build_tokenizer
from memlab.errors import DataError


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
    permutation: ``{"train", "validation", "test"} -> units``. Every view of a corpus starts here."""
    import sys

    docs = load_corpus(cfg.corpus, cfg.text_field, cfg.hf_split, cfg.streaming, cfg.max_documents)
    splits = make_splits(units(docs, cfg.split_by), cfg.val_fraction, cfg.test_fraction, cfg.split_seed)
    if cfg.val_fraction > 0 and not splits["validation"]:
        print(f"memlab: warning: the validation split of corpus '{cfg.corpus}' is empty "
              f"({describe_splits(splits)}); no validation data", file=sys.stderr)
    if not splits["train"]:
        from memlab.data.corpus import require_split

        require_split(splits, "train", cfg.corpus)
    SPLIT_DESCRIPTIONS[_data_key(cfg)] = describe_splits(splits)
    return splits


def prepare_corpus(cfg: DataConfig, tokenizer_dir: str | Path | None = None,
                   tokenizer_spec: str | None = None) -> PreparedCorpus:
    """Load, cut and split the corpus, then build the tokenizer on the training split.

    ``tokenizer_spec`` replaces ``cfg.tokenizer`` (a model started from saved
    weights must keep the tokenizer it was trained with).
    """
    splits = split_corpus(cfg)
    train_texts = [clean_text(d.text) for d in splits["train"]]
    if tokenizer_dir is not None and (Path(tokenizer_dir) / "tokenizer_config.json").is_file():
        from memlab.data.tokenizer import load_tokenizer

        tok = load_tokenizer(str(tokenizer_dir))  # a resumed run keeps the tokenizer it saved
    else:
        tok = build_tokenizer(tokenizer_spec or cfg.tokenizer, train_texts, cfg.vocab_size, tokenizer_dir)
    return PreparedCorpus(splits=splits, tokenizer=tok, split_description=SPLIT_DESCRIPTIONS[_data_key(cfg)])


SPLIT_DESCRIPTIONS: dict[tuple, str] = {}
"""Data config -> how :func:`split_corpus` split it in this process (read into a run's summary)."""


def _data_key(cfg: DataConfig) -> tuple:
    return (cfg.corpus, cfg.text_field, cfg.hf_split, cfg.max_documents, cfg.split_by, cfg.val_fraction,
            cfg.test_fraction, cfg.split_seed)


def split_description(cfg: DataConfig) -> str | None:
    """How this process's :func:`split_corpus` split the corpus of ``cfg``; None if it did not."""
    return SPLIT_DESCRIPTIONS.get(_data_key(cfg))


def token_chunks(texts: list[str], tokenizer, seq_len: int, add_eos: bool = True) -> torch.Tensor:
    """Tokenize texts, join them (EOS between documents) and cut into ``(N, seq_len)`` chunks.

    The last partial chunk is dropped. Raises a DataError when the texts hold
    fewer than ``seq_len`` tokens.
    """
    if seq_len < 1:
        raise DataError(f"seq_len must be >= 1, got {seq_len}")
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    for piece in enc:
        ids.extend(piece)
        if add_eos and eos is not None:
            ids.append(eos)
    n = len(ids) // seq_len
    if n == 0:
        raise DataError(f"the text holds {len(ids)} tokens, fewer than one chunk of {seq_len}")
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)  # (N, T)


def sentence_documents(docs: list[Document], min_sentences: int = 1) -> list[list[str]]:
    """Documents as lists of Punkt sentences; documents with fewer than ``min_sentences`` are dropped."""
    out = [split_sentences(d.text) for d in docs]
    return [s for s in out if len(s) >= min_sentences]


class ChunkDataset(torch.utils.data.Dataset):
    """Rows of a ``(N, T)`` token tensor, as ``{"input_ids": (T,)}`` examples."""

    def __init__(self, chunks: torch.Tensor):
        self.chunks = chunks

    def __len__(self) -> int:
        return self.chunks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.chunks[i]}
