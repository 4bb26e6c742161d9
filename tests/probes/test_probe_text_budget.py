"""Word chunks capped by a counting tokenizer (max_chunk_tokens, chunk_tokenizer) and read-outs alone (sequence=false)."""

from __future__ import annotations

import json

import pytest

from memlab.app.cli import main
from memlab.probes.chunks.cut import cap_tokens, tokenize_chunks
from memlab.probes.chunks.batch import mask_of

TINY = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=16", "n_train=64", "epochs=1",
        "n_examples=2", "select_decoder=false", "--no-control"]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cap_keeps_the_longest_word_prefix_that_fits(tokenizer):
    texts = ["It is a truth universally acknowledged, that a single man in possession of a good fortune",
             "Emma Woodhouse, handsome, clever, and rich", "short"]
    n_tok = lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    for cap in (4, 7, 12):
        for text, got in zip(texts, cap_tokens(texts, tokenizer, cap)):
            words, kept = text.split(), got.split()
            assert kept == words[: len(kept)] and kept  # a prefix of whole words
            assert n_tok(got) <= cap
            if len(kept) < len(words):  # one more word would not fit
                assert n_tok(" ".join(words[: len(kept) + 1])) > cap
            else:
                assert n_tok(text) <= cap


def test_a_word_longer_than_the_cap_is_refused(tokenizer):
    from memlab.errors import DataError

    with pytest.raises(DataError, match="alone is longer than max_chunk_tokens=1"):
        cap_tokens(["Incomprehensibilities abound"], tokenizer, 1)


def test_probe_chunks_fit_the_counting_tokenizer(tiny_llama, tokenizer, small_corpus, tmp_path):
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
                 "--n-eval", "8", *TINY, "max_chunk_tokens=10", f"chunk_tokenizer={tiny_llama}"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["text"]["max_tokens"] <= 10 and "fit 10 tokens of" in rep["text"]["per_chunk"]
    # without the cap the same 16-word chunks are longer than 10 tokens
    from memlab.probes.chunks import cut as T

    texts = T.probe_texts(16, 8, "test", str(small_corpus), 0, at_most=True)
    ids, _ = tokenize_chunks(texts, tokenizer)
    assert int(mask_of(ids).sum(1).max()) > 10


def test_read_outs_alone(tiny_llama, small_corpus, tmp_path):
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
                 "--n-eval", "8", *TINY, "sequence=false", "max_chunk_tokens=40"]) == 0  # counted in its own tokens
    rep = json.loads((out / "report.json").read_text())
    assert rep["probe"] is None and rep["control"] is None and rep["decoder"] is None
    assert 0.0 <= rep["bow"]["recovered"] <= 1.0 and "bow_recovered" in rep["readings"]
    assert not (out / "decoder").exists() and rep["text"]["max_tokens"] <= 40


@pytest.mark.parametrize("extra, needle", [
    (["sequence=false", "--no-bow"], "nothing to fit"),
    (["max_chunk_tokens=10", "chunk_by=tokens"], "applies to chunk_by=words"),
    (["max_chunk_tokens=0"], "'max_chunk_tokens' must be >= 1"),
    (["chunk_tokenizer=minilm"], "set max_chunk_tokens too"),
])
def test_bad_text_budget_is_one_line(tiny_llama, small_corpus, tmp_path, capsys, extra, needle):
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
                 *TINY, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memlab: error:") and needle in err[0], err
    assert not out.exists()


def test_chunks_encoded_by_length_give_each_chunk_its_own_embedding(tiny_llama, tokenizer):
    """encode_all reads chunks of like length together, each batch cut to its longest: the embeddings, in the chunks'
    order, are each chunk's own (as encoded alone)."""
    import torch

    from memlab.probes.encoders.sources import load_encoder
    from memlab.probes.encoders.encode import encode_all

    enc = load_encoder(str(tiny_llama), pool="mean")
    texts = ["Emma", "It is a truth universally acknowledged", "short one", "a single man in possession of a good",
             "fortune", "must be in want of a wife, however little known"]
    ids, _ = tokenize_chunks(texts, tokenizer)
    z = encode_all(enc, ids, batch_size=2)  # (6, D)
    for i in range(len(texts)):
        alone = encode_all(enc, ids[i : i + 1, : int(mask_of(ids[i : i + 1]).sum())])  # (1, D)
        assert torch.allclose(z[i], alone[0], atol=1e-5)
