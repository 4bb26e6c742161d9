"""The sentence-embedding cache: built once, reused without encoding, keyed by space and documents,
and a clear error when a cache built with another space is loaded."""

from __future__ import annotations

import pytest
import torch
from toy_spaces import SENTENCES, random_space

from memlab.data import embcache
from memlab.errors import DataError

DOCS = [SENTENCES[:4] + ["End of sequence."], SENTENCES[4:] + ["End of sequence."]]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_build_then_reuse_without_encoding(tmp_path, monkeypatch):
    space = random_space()
    split = embcache.build_or_load(space, "toy_ae", DOCS, "train", tmp_path, max_tokens=20)
    assert split.num_documents == 2 and split.embeddings.shape == (sum(map(len, DOCS)), 32)
    assert split.doc_offsets.tolist() == [0, len(DOCS[0]), len(DOCS[0]) + len(DOCS[1])]
    # rows are the encoder's embeddings of the (truncated) sentences, in document order
    direct = space.encode_text([s for d in DOCS for s in d]).detach()
    long = [i for i, s in enumerate(s for d in DOCS for s in d) if len(space.tokenizer(s)["input_ids"]) > 20]
    short = [i for i in range(direct.shape[0]) if i not in long]
    assert torch.allclose(split.embeddings[short], direct[short], atol=1e-5)
    assert split.meta["truncated_sentences"] == len({s for d in DOCS for s in d if len(space.tokenizer(s)["input_ids"]) > 20})
    assert int(split.lengths.max()) <= 20
    ids = split.input_ids[2, : split.lengths[2]].tolist()
    assert space.tokenizer.decode(ids) == DOCS[0][2]  # "Elizabeth laughed." fits in 20 byte tokens
    assert space.tokenizer.decode(split.input_ids[1, : split.lengths[1]].tolist()) == DOCS[0][1][:20]
    # a second call reads the cache: encoding again would fail
    monkeypatch.setattr(embcache, "encode_sentences", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-encoded")))
    again = embcache.build_or_load(space, "toy_ae", DOCS, "train", tmp_path, max_tokens=20)
    assert torch.equal(again.embeddings, split.embeddings)
    assert len(list(tmp_path.iterdir())) == 1


def test_key_changes_with_space_documents_and_split(tmp_path):
    a, b = random_space(seed=0), random_space(seed=1)
    ia, ib = embcache.space_identity(a, "toy_ae"), embcache.space_identity(b, "toy_ae")
    k = embcache.cache_key(ia, DOCS, "train", 20)
    assert k != embcache.cache_key(ib, DOCS, "train", 20)  # same spec, other weights
    assert k != embcache.cache_key(ia, DOCS[:1], "train", 20)
    assert k != embcache.cache_key(ia, DOCS, "validation", 20)
    assert k != embcache.cache_key(ia, DOCS, "train", 30)


def test_a_cache_built_with_another_space_is_refused(tmp_path):
    folder = tmp_path / "mine"
    embcache.build_or_load(random_space(seed=0), "toy_ae", DOCS, "train", tmp_path, path=folder)
    with pytest.raises(DataError, match="other weights"):
        embcache.build_or_load(random_space(seed=1), "toy_ae:other", DOCS, "train", tmp_path, path=folder)
    with pytest.raises(DataError, match=r"shape \[32\].*shape \[16\]"):
        embcache.load_split(folder, embcache.space_identity(random_space(dim=16), "toy_ae:narrow"))
    with pytest.raises(DataError, match="other documents"):
        embcache.build_or_load(random_space(seed=0), "toy_ae", DOCS[:1], "train", tmp_path, path=folder)
    with pytest.raises(DataError, match="not an embedding cache"):
        embcache.load_split(tmp_path / "nothing")
    with pytest.raises(DataError, match="no documents"):
        embcache.build_or_load(random_space(), "toy_ae", [], "train", tmp_path)
