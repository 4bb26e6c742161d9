"""The memory recipe reads its corpus lazily (memlab.data.stream): its chunk and sentence examples are the rows
the in-memory views build from the same split, row for row, read from memory-mapped files, with a bounded number
of documents alive at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from memlab.config import load_config
from memlab.registry import RECIPES
from test_corpus_scale import _build, generated_corpus

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "configs" / "memory" / "toy.yaml"
LOCAL = ["data.vocab_size=300", "data.max_documents=null"]
CASES = {  # overrides of configs/memory/toy.yaml; {small}, {plain}, {jsonl}: the corpora of test_corpus_scale._build
    "toy": [],
    "toy_sentences": ["options.view=sentences", "data.seq_len=16"],
    "small_offsets": ["data.corpus={small}", *LOCAL, "options.train_offsets=4", "data.val_fraction=0.1",
                      "data.test_fraction=0.1"],
    "small_offsets_max": ["data.corpus={small}", *LOCAL, "options.train_offsets=3", "options.max_examples=900",
                          "data.seq_len=32"],
    "jsonl_sentences": ["data.corpus={jsonl}", *LOCAL, "data.split_by=document", "options.view=sentences",
                        "data.seq_len=16", "options.max_examples=500", "data.val_fraction=0.1"],
    "plain_chunks": ["data.corpus={plain}", *LOCAL, "data.seq_len=32"],
}
@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    return _build(tmp_path_factory.mktemp("memory-corpora"))


def _rows(ds, key: str = "input_ids") -> torch.Tensor:
    """Every example of ``ds`` stacked: (N, C, T)."""
    return torch.stack([ds[i][key] for i in range(len(ds))])


def _setup(overrides: list[str], corpora: dict[str, str], run: Path):
    cfg = load_config(TOY, [o.format(**corpora) for o in overrides])
    return RECIPES.get("memory").setup(cfg, run)


def test_a_second_setup_reuses_the_token_files(corpora, tmp_path, monkeypatch, one_thread):
    """A resumed run (or another process) maps the files the first one wrote: the corpus is not tokenized again."""
    first = _setup(CASES["small_offsets"], corpora, tmp_path / "a")
    import memlab.data.stream as stream

    monkeypatch.setattr(stream, "encode_stream", lambda *a, **k: pytest.fail("tokenized again"))
    again = _setup(CASES["small_offsets"], corpora, tmp_path / "a")
    assert torch.equal(_rows(again.train_data), _rows(first.train_data))


@pytest.mark.parametrize("view", ["chunks", "sentences"])
def test_the_recipe_holds_a_bounded_number_of_documents(view, monkeypatch, tmp_path, one_thread):
    """A corpus of 300 generated documents: never more than a few Document objects alive at once."""
    peak = generated_corpus(monkeypatch, "generated_memory_test", 300, 30)
    extra = ["options.view=sentences", "data.seq_len=16"] if view == "sentences" else []
    s = _setup(["data.corpus=generated_memory_test", *LOCAL, "data.split_by=document", *extra], {}, tmp_path)
    assert len(s.train_data) > 100
    assert peak[0] <= 4, f"{peak[0]} documents alive at once"


@pytest.mark.parametrize("name", list(CASES))
def test_the_recipe_reads_the_rows_of_the_in_memory_views(name, corpora, tmp_path, one_thread):
    """The recipe's training and validation examples, read from memory-mapped files, are the rows chunk_view /
    sentence_view (the evaluation sets' views, in memory, from the token chunks of the split's texts) build:
    every row, in order, the training split capped at max_examples, the sentences' masks and dropped count too."""
    from memlab.data.stream import stream_corpus
    from memlab.models.memory.data import chunk_view, sentence_view

    s = _setup(CASES[name], corpora, tmp_path)
    cfg = load_config(TOY, [o.format(**corpora) for o in CASES[name]])
    corpus = stream_corpus(cfg.data, tmp_path / "tokenizer")  # the run's saved tokenizer
    seq_len, chunk_len = cfg.data.seq_len, s.model.config.chunk_len
    for split, ds in (("train", s.train_data), ("validation", s.eval_data)):
        if cfg.options.view == "chunks":
            offsets = cfg.options.train_offsets if split == "train" else 1
            ids, mask = chunk_view(list(corpus.texts(split)), corpus.tokenizer, seq_len, chunk_len, offsets), None
            assert ids.shape[1:] == (seq_len // chunk_len, chunk_len)
        else:
            ids, mask, dropped = sentence_view(list(corpus.units(split)), corpus.tokenizer, seq_len)
            if split == "train":
                assert dropped == s.summary["dropped_sentences"]
        if split == "train" and cfg.options.max_examples:
            ids, mask = ids[: cfg.options.max_examples], mask[: cfg.options.max_examples] if mask is not None else None
        assert len(ds) == ids.shape[0] > 0
        assert torch.equal(_rows(ds), ids) and _rows(ds).dtype == torch.int64
        if mask is not None:
            assert torch.equal(_rows(ds, "attention_mask"), mask)
    rows = s.train_data.ids
    backing = rows.flat if hasattr(rows, "flat") else rows.src.rows
    assert isinstance(backing, np.memmap)  # read from disk, row by row: no copy of the split in memory
