"""The memory recipe reads its corpus lazily (memlab.data.stream): its chunk and sentence examples are the
ones it built in memory before, byte for byte, from memory-mapped files, with a bounded number of documents
alive at once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from memlab.config import load_config
from memlab.registry import RECIPES
from test_corpus_scale import _build, generated_corpus

ROOT = Path(__file__).resolve().parents[1]
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
# Digests of the examples the memory recipe built in memory before it read its corpus lazily (MemoryRecipe.setup
# at commit 23f1a75, prepare_corpus + chunk_view / sentence_view): per split, the example count and, per key,
# [shape, dtype, sha of the stacked examples' bytes]; "dropped": training sentences longer than data.seq_len.
PINNED = {
    "toy": {"train": {"n": 2705, "input_ids": [[2705, 4, 16], "torch.int64", "87894ecd8a45fb8e"]},
            "val": {"n": 456, "input_ids": [[456, 4, 16], "torch.int64", "fb25f15b79aeb07b"]}, "dropped": 0},
    "toy_sentences": {
        "train": {"n": 2648, "input_ids": [[2648, 1, 16], "torch.int64", "5e238e8906d1608f"],
                  "attention_mask": [[2648, 1, 16], "torch.int64", "d4ef6828ebf9387f"]},
        "val": {"n": 488, "input_ids": [[488, 1, 16], "torch.int64", "44585b9c9dfe1162"],
                "attention_mask": [[488, 1, 16], "torch.int64", "5e4b35e87adb2ba0"]}, "dropped": 3531},
    "small_offsets": {"train": {"n": 2569, "input_ids": [[2569, 4, 16], "torch.int64", "ed4a15149ddb4d01"]},
                      "val": {"n": 62, "input_ids": [[62, 4, 16], "torch.int64", "5b8eeea37e92fd07"]}, "dropped": 0},
    "small_offsets_max": {"train": {"n": 900, "input_ids": [[900, 2, 16], "torch.int64", "48f4ede8de166c83"]},
                          "val": {"n": 131, "input_ids": [[131, 2, 16], "torch.int64", "99437b975466fcc1"]},
                          "dropped": 0},
    "jsonl_sentences": {
        "train": {"n": 94, "input_ids": [[94, 1, 16], "torch.int64", "3c646bfb54602b0b"],
                  "attention_mask": [[94, 1, 16], "torch.int64", "c6a65fbd63347d43"]},
        "val": {"n": 4, "input_ids": [[4, 1, 16], "torch.int64", "3803421603328d2e"],
                "attention_mask": [[4, 1, 16], "torch.int64", "54488bf4a95eae02"]}, "dropped": 998},
    "plain_chunks": {"train": {"n": 4022, "input_ids": [[4022, 2, 16], "torch.int64", "a4f49c54c88010bd"]},
                     "val": {"n": 47, "input_ids": [[47, 2, 16], "torch.int64", "9771c108359cf6ea"]}, "dropped": 0},
}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    return _build(tmp_path_factory.mktemp("memory-corpora"))


def _digest(ds) -> dict | None:
    if ds is None:
        return None
    items = [ds[i] for i in range(len(ds))]
    out: dict = {"n": len(items)}
    for k in items[0]:
        t = torch.stack([it[k] for it in items])
        out[k] = [list(t.shape), str(t.dtype), hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]]
    return out


def _setup(overrides: list[str], corpora: dict[str, str], run: Path):
    cfg = load_config(TOY, [o.format(**corpora) for o in overrides])
    return RECIPES.get("memory").setup(cfg, run)


@pytest.mark.parametrize("name", list(CASES))
def test_the_recipe_reads_the_examples_it_built_in_memory(name, corpora, tmp_path, one_thread):
    s = _setup(CASES[name], corpora, tmp_path)
    got = {"train": _digest(s.train_data), "val": _digest(s.eval_data), "dropped": s.summary["dropped_sentences"]}
    assert got == PINNED[name]
    rows = s.train_data.ids
    backing = rows.flat if hasattr(rows, "flat") else rows.src.rows
    assert isinstance(backing, np.memmap)  # read from disk, row by row: no copy of the split in memory


def test_a_second_setup_reuses_the_token_files(corpora, tmp_path, monkeypatch, one_thread):
    """A resumed run (or another process) maps the files the first one wrote: the corpus is not tokenized again."""
    first = _setup(CASES["small_offsets"], corpora, tmp_path / "a")
    import memlab.data.stream as stream

    monkeypatch.setattr(stream, "encode_stream", lambda *a, **k: pytest.fail("tokenized again"))
    again = _setup(CASES["small_offsets"], corpora, tmp_path / "a")
    assert _digest(again.train_data) == _digest(first.train_data)


@pytest.mark.parametrize("view", ["chunks", "sentences"])
def test_the_recipe_holds_a_bounded_number_of_documents(view, monkeypatch, tmp_path, one_thread):
    """A corpus of 300 generated documents: never more than a few Document objects alive at once."""
    peak = generated_corpus(monkeypatch, "generated_memory_test", 300, 30)
    extra = ["options.view=sentences", "data.seq_len=16"] if view == "sentences" else []
    s = _setup(["data.corpus=generated_memory_test", *LOCAL, "data.split_by=document", *extra], {}, tmp_path)
    assert len(s.train_data) > 100
    assert peak[0] <= 4, f"{peak[0]} documents alive at once"


@pytest.mark.parametrize("name", ["small_offsets", "jsonl_sentences"])
def test_the_in_memory_views_give_the_same_rows(name, corpora, tmp_path, one_thread):
    """chunk_view / sentence_view (the evaluation sets' views, in memory) build the rows the recipe reads."""
    from memlab.data.stream import stream_corpus
    from memlab.models.memory.data import chunk_view, sentence_view

    s = _setup(CASES[name], corpora, tmp_path)
    cfg = load_config(TOY, [o.format(**corpora) for o in CASES[name]])
    corpus = stream_corpus(cfg.data, tmp_path / "tokenizer")  # the run's saved tokenizer
    ds = s.train_data
    if cfg.options.view == "chunks":
        ids, mask = chunk_view(list(corpus.texts("train")), corpus.tokenizer, 64, 16, cfg.options.train_offsets), None
    else:
        ids, mask, dropped = sentence_view(list(corpus.units("train")), corpus.tokenizer, 16)
        assert dropped == s.summary["dropped_sentences"]
    n = len(ds)
    assert torch.equal(ids[:n], torch.stack([ds[i]["input_ids"] for i in range(n)]))
    if mask is not None:
        assert torch.equal(mask[:n], torch.stack([ds[i]["attention_mask"] for i in range(n)]))
