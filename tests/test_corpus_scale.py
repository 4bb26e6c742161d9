"""Corpora at scale: the streamed corpus (memlab.data.stream) gives exactly the splits and token chunks of
the in-memory path, holds a bounded number of documents, and writes each split's tokens once."""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from memlab.config import DataConfig
from memlab.data.corpus import Document
from memlab.data.stream import CorpusStream, stream_corpus, token_file
from memlab.data.views import ChunkDataset, prepare_corpus, token_chunks

# Digests of the splits and token chunks that memlab produced before corpora were streamed
# (memlab.data.views.prepare_corpus + token_chunks at commit 25e7106), on the corpora that
# `_build` writes: [units, sha of unit ids, chunk shape, sha of the int64 chunk bytes] per split.
PINNED = {
    "austen": {"train": [242, "9837fa1c4c9aac78", [6779, 128], "09f20c7a9a2c8f31"],
               "validation": [17, "ce082e144268ca57", [529, 128], "02e8cd30b718263d"],
               "test": [11, "f6059df5ea05c28a", [306, 128], "8eec5bbaa8f00caf"]},
    "small": {"train": [10, "f973f5f888178b14", [1286, 32], "76fc609a05e4f395"],
              "validation": [1, "4e6e1540e812a953", [124, 32], "5b8eeea37e92fd07"],
              "test": [1, "639a901e6a6bbe70", [131, 32], "99437b975466fcc1"]},
    "plain": {"train": [74, "4feb12a0b8c30caa", [4022, 32], "a4f49c54c88010bd"],
              "validation": [1, "142480b97f8979fd", [47, 32], "9771c108359cf6ea"],
              "test": [5, "8c16ac8e24ff2ed9", [230, 32], "5d43481d32f6c82c"]},
    "jsonl": {"train": [40, "4f8275cbda9846ea", [3021, 32], "6d5e450ca8d27862"],
              "validation": [4, "b04ddfbeb88427f5", [416, 32], "2df18d1f96021e41"],
              "test": [6, "ccdf840720233196", [584, 32], "05cad86b773a4e44"]},
    "jsonl_max": {"train": [25, "4b0d7c225d820fa3", [4337, 16], "95858effabd55f3e"],
                  "validation": [5, "c1b58a64f6a240b8", [649, 16], "512003b7d479b4c5"],
                  "test": [0, "e3b0c44298fc1c14", None, None]},
}


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


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]


def _row(units, chunks) -> list:
    ids = "\n".join(d.id for d in units)
    if chunks is None:
        return [len(units), _sha(ids.encode()), None, None]
    return [len(units), _sha(ids.encode()), list(chunks.shape), _sha(np.asarray(chunks, dtype=np.int64).tobytes())]


@pytest.mark.parametrize("name", list(PINNED))
def test_streamed_and_in_memory_splits_match_the_pinned_ones(cases, name):
    cfg = cases[name]
    eager = prepare_corpus(cfg)
    stream = stream_corpus(cfg)
    assert stream.split_description == eager.split_description
    for split, want in PINNED[name].items():
        texts = eager.texts(split)
        assert _row(eager.splits[split], token_chunks(texts, eager.tokenizer, cfg.seq_len) if texts else None) == want
        assert _row(list(stream.units(split)), stream.chunks(split, cfg.seq_len)) == want


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
