"""Corpora at scale: the streamed corpus (memlab.data.stream) gives exactly the splits and token chunks of
the in-memory path, holds a bounded number of documents, and writes each split's tokens once."""

from __future__ import annotations

import json
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from memlab.config import DataConfig
from memlab.data.corpus import Document, load_corpus, units
from memlab.data.stream import CorpusStream, stream_corpus, token_file
from memlab.data.views import ChunkDataset, prepare_corpus, token_chunks

CASES = ("austen", "small", "plain", "jsonl", "jsonl_max")
"""The corpora of :func:`cases`: the bundled one, chapters of local files, one plain file, jsonl records (whole,
and capped at a number of documents with no test split)."""
SPLITS = ("train", "validation", "test")


def _build(out: Path) -> dict[str, str]:
    """Small local corpora cut from the bundled novels: chapters, one plain file (paragraph blocks), jsonl."""
    from memlab.data.corpus import load_corpus, split_chapters

    docs = load_corpus("austen")
    small = out / "small"
    small.mkdir(parents=True)
    for doc in docs[:2]:
        chapters = split_chapters(doc)[:6]
        text = "".join(f"\n\nCHAPTER {i + 1}\n\n{c.text[:6000]}" for i, c in enumerate(chapters))
        (small / f"{doc.id}.txt").write_text(f"{doc.id.upper()}\n{text}")
    plain = out / "plain.txt"
    body = "\n".join(line for line in docs[2].text.splitlines() if not line.strip().upper().startswith("CHAPTER"))
    plain.write_text(body[:200_000])
    recs = [p for p in docs[3].text.split("\n\n") if p.strip()][:400]
    (out / "notes.jsonl").write_text("".join(json.dumps({"text": "\n\n".join(recs[i:i + 8])}) + "\n"
                                             for i in range(0, len(recs), 8)))
    return {"small": str(small), "plain": str(plain), "jsonl": str(out / "notes.jsonl")}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, DataConfig]:
    paths = _build(tmp_path_factory.mktemp("scale-corpora"))
    return {
        "austen": DataConfig(),
        "small": DataConfig(corpus=paths["small"], vocab_size=300, seq_len=32, val_fraction=0.1, test_fraction=0.1),
        "plain": DataConfig(corpus=paths["plain"], vocab_size=300, seq_len=32),
        "jsonl": DataConfig(corpus=paths["jsonl"], vocab_size=300, seq_len=32, split_by="document",
                            val_fraction=0.1, test_fraction=0.1),
        "jsonl_max": DataConfig(corpus=paths["jsonl"], vocab_size=300, seq_len=16, split_by="document",
                                max_documents=30, val_fraction=0.2, test_fraction=0.0, split_seed=3),
    }


def _tokens(texts: list[str], tokenizer, seq_len: int) -> np.ndarray:
    """What the chunks of ``texts`` must be, from the tokenizer alone: each text's ids (no special tokens) then
    EOS, joined, cut into rows of ``seq_len``, the last partial row dropped."""
    flat = [i for t in texts for i in tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]]
    n = len(flat) // seq_len
    return np.asarray(flat[: n * seq_len], dtype=np.int64).reshape(n, seq_len)


@pytest.mark.parametrize("name", CASES)
def test_streamed_and_in_memory_splits_are_a_partition_cut_into_the_tokenizers_chunks(cases, name):
    cfg = cases[name]
    eager = prepare_corpus(cfg)
    stream = stream_corpus(cfg)
    assert stream.split_description == eager.split_description
    # every unit of the corpus is in exactly one split; a held-out split exists exactly when its share is > 0
    docs = load_corpus(cfg.corpus, cfg.text_field, cfg.hf_split, cfg.streaming, cfg.max_documents)
    every = [d.id for d in units(docs, cfg.split_by)]
    held = {s: [d.id for d in eager.splits[s]] for s in SPLITS}
    assert sorted(i for s in SPLITS for i in held[s]) == sorted(every) and len(set(every)) == len(every)
    assert len(docs) <= (cfg.max_documents or len(docs))
    for split, share in (("validation", cfg.val_fraction), ("test", cfg.test_fraction)):
        assert bool(held[split]) == (share > 0), split
    assert len(held["train"]) > max(len(held["validation"]), len(held["test"]))
    for split in SPLITS:
        assert [d.id for d in stream.units(split)] == held[split]  # the streamed split holds the same units
        texts = eager.texts(split)
        if not texts:
            assert stream.chunks(split, cfg.seq_len) is None
            continue
        want = _tokens(texts, eager.tokenizer, cfg.seq_len)  # (N, T)
        assert want.shape[0] > 0 and want.max() < len(eager.tokenizer)
        assert np.array_equal(token_chunks(texts, eager.tokenizer, cfg.seq_len).numpy(), want)
        assert np.array_equal(np.asarray(stream.chunks(split, cfg.seq_len), dtype=np.int64),
                              _tokens(list(stream.texts(split)), stream.tokenizer, cfg.seq_len))
        assert np.array_equal(np.asarray(stream.chunks(split, cfg.seq_len), dtype=np.int64), want)


def test_memory_mapped_chunks_read_as_int64_rows(cases):
    cfg = cases["small"]
    stream = stream_corpus(cfg)
    mapped = stream.chunks("train", cfg.seq_len)
    assert isinstance(mapped, np.memmap) and mapped.dtype == np.uint16  # a 300-token vocabulary fits 16 bits
    eager = token_chunks(list(stream.texts("train")), stream.tokenizer, cfg.seq_len)  # (N, T)
    ds = ChunkDataset(mapped)
    assert len(ds) == eager.shape[0]
    for i in (0, len(ds) // 2, len(ds) - 1):
        row = ds[i]["input_ids"]
        assert row.dtype.is_floating_point is False and str(row.dtype) == "torch.int64"
        assert row.tolist() == eager[i].tolist()


def test_a_written_token_file_is_reused_without_reading_the_corpus(tmp_path, tokenizer):
    def texts():
        yield "It is a truth universally acknowledged."
        yield "She was the youngest of the two daughters."

    path, dtype, n = token_file(texts(), tokenizer, tmp_path / "t")
    assert n == len(np.fromfile(path, dtype=dtype)) and n > 4

    def unread():
        raise AssertionError("the corpus was read again")
        yield ""

    assert token_file(unread(), tokenizer, tmp_path / "t") == (path, dtype, n)


def test_a_truncated_token_file_or_damaged_description_is_written_again(tmp_path, tokenizer):
    texts = ["It is a truth universally acknowledged.", "She was the youngest of the two daughters."]
    path, dtype, n = token_file(iter(texts), tokenizer, tmp_path / "t")
    want = np.fromfile(path, dtype=dtype)
    path.write_bytes(path.read_bytes()[:-2])  # truncated: its size no longer matches the description
    assert token_file(iter(texts), tokenizer, tmp_path / "t") == (path, dtype, n)
    assert np.array_equal(np.fromfile(path, dtype=dtype), want)
    (tmp_path / "t.json").write_text('{"tokens": ')  # a description cut short
    assert token_file(iter(texts), tokenizer, tmp_path / "t") == (path, dtype, n)
    assert json.loads((tmp_path / "t.json").read_text())["tokens"] == n
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_processes_asking_at_once_write_the_file_once(tmp_path, tokenizer):
    reads = []

    def texts():
        reads.append(1)
        yield from ["A sentence of text. " * 50] * 40

    out = []
    threads = [threading.Thread(target=lambda: out.append(token_file(texts(), tokenizer, tmp_path / "shared")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reads) == 1 and len(set(out)) == 1  # one writer; the others waited and reused its file


def generated_corpus(monkeypatch, name: str, n: int, repeat: int) -> list[int]:
    """Register corpus ``name``: ``n`` generated documents of ``repeat`` sentences and a paragraph, yielded one at
    a time; returns a list whose one number is the most Document objects alive at once so far."""
    from memlab.data.corpus import CORPORA

    refs: list[weakref.ref] = []
    peak = [0]

    def generated(**_):
        for i in range(n):
            d = Document(id=f"g/{i}", text=f"Document {i} says hello. " * repeat + "\n\nA second paragraph here.")
            refs.append(weakref.ref(d))
            peak[0] = max(peak[0], sum(r() is not None for r in refs))
            yield d

    monkeypatch.setitem(CORPORA._items, name, generated)
    return peak


def test_a_stream_holds_a_bounded_number_of_documents(monkeypatch, tmp_path):
    """A corpus of 400 generated documents: never more than a few Document objects are alive at once."""
    peak = generated_corpus(monkeypatch, "generated_test", 400, 40)
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    cfg = DataConfig(corpus="generated_test", vocab_size=300, seq_len=32, split_by="document")
    stream = stream_corpus(cfg)
    chunks = stream.chunks("train", 32)
    assert stream.plan.n == 400 and chunks.shape[0] > 100
    assert peak[0] <= 4, f"{peak[0]} documents alive at once"


def test_hub_dataset_streamed_through_datasets_matches_the_downloaded_one(tmp_path):
    """A local folder read as a hub dataset (``hf:FOLDER``): streamed (no max_documents needed) and
    downloaded-and-mapped give the same splits and chunks."""
    folder = tmp_path / "hubdata"
    folder.mkdir()
    rows = [{"text": f"Record {i}: " + "the quick brown fox jumps over the lazy dog. " * (3 + i % 5)} for i in range(60)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = dict(corpus=f"hf:{folder}", vocab_size=300, seq_len=16, split_by="document", val_fraction=0.1,
                test_fraction=0.1)
    streamed = stream_corpus(DataConfig(**base, streaming=True))
    mapped = stream_corpus(DataConfig(**base, streaming=False))
    assert streamed.plan.sizes == mapped.plan.sizes and streamed.plan.n == 60
    for split in ("train", "validation", "test"):
        assert [u.id for u in streamed.units(split)] == [u.id for u in mapped.units(split)]
        a, b = streamed.chunks(split, 16), mapped.chunks(split, 16)
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_an_empty_streamed_corpus_is_one_clear_error(tmp_path):
    from memlab.errors import DataError

    (tmp_path / "blank.jsonl").write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(DataError, match="is empty: no document has any text"):
        CorpusStream(DataConfig(corpus=str(tmp_path / "blank.jsonl"), split_by="document"))
