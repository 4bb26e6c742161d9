"""memlab invert --model space:memory_ae:PATH (--states space): a memory model's memory vector searched with its
encoder's own weights, on a tiny random memory model saved with save_pretrained: the vector the search reads is
``MemoryModel.encode`` (and the trained probe's reading of the space), short chunks come back certified through the
command, and a space with no encoder to search, or a setting that does not apply to a space, is one line."""

from __future__ import annotations

import json

import pytest
import torch

from memlab.models.memory import MemoryConfig, MemoryModel
from memlab.probes.invert.options import PooledOptions
from memlab.probes.invert.pooled.searcher import PooledSearcher
from memlab.probes.invert.space_reader import SpaceReader


def tiny_memory(tok, k: int = 1, pooling: str = "mean", encoder_type: str = "transformer") -> MemoryModel:
    torch.manual_seed(0)
    cfg = MemoryConfig(vocab_size=len(tok), chunk_len=8, encoder_hidden_size=32, hidden_size=32,
                       encoder_intermediate_size=64, intermediate_size=64, encoder_heads=2, num_attention_heads=2,
                       max_chunks=4, num_memories=k, pooling=pooling, encoder_type=encoder_type,
                       pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return MemoryModel(cfg).eval()


@pytest.fixture(scope="module")
def saved(tokenizer, tmp_path_factory):
    """A tiny random memory autoencoder (one memory vector, mean pooled) and its tokenizer, saved as a folder."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("memory")
    tiny_memory(tokenizer).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def _main(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("k, pooling, encoder_type", [(1, "mean", "transformer"), (2, "query", "transformer"),
                                                      (3, "last", "mixer")])
def test_the_searched_vector_is_the_memory_models_encoding(tokenizer, k, pooling, encoder_type):
    from memlab.models.memory.space import MemorySpace
    from memlab.probes.encoders.capture import SpaceEncoder

    model = tiny_memory(tokenizer, k, pooling, encoder_type)
    space = MemorySpace(model, tokenizer)
    s = PooledSearcher(SpaceReader(space, vocab_size=len(tokenizer)), "space", PooledOptions())
    ids = torch.randint(5, len(tokenizer), (3, 6), generator=torch.Generator().manual_seed(0))  # (3, T)
    got = s.pooled(ids)  # (3, K * D)
    with torch.no_grad():
        want = model.encode(ids, torch.ones_like(ids)).reshape(3, -1)  # (3, K * D)
    assert got.shape == (3, k * space.dim) and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    probe = SpaceEncoder(space, name="space:memory_ae")  # the vector the trained probe reads from the space
    assert torch.allclose(got, probe.encode(ids, torch.ones_like(ids)), rtol=1e-5, atol=1e-6)
    scores = s.scores(ids[0], got[1])  # (T, V): the gradient reaches every position through the encoder
    assert scores.shape == (6, len(tokenizer)) and torch.isfinite(scores).all() and scores.abs().sum() > 0
    low = s.vec.bfloat16()  # the screen's copy: near, never exact
    rough = low.vectors(low.embed(ids)).cpu()
    assert float((rough - got).norm() / got.norm()) < 0.05


def test_memory_vector_recovered_through_the_command(saved, small_corpus, tmp_path, capsys):
    """Two 3-token chunks of the corpus, corrected from a blank chunk: each certified chunk is the true one."""
    out = tmp_path / "run"
    code, cap = _main("--model", f"space:memory_ae:{saved}", "--seq-len", "3", "--chunk-by", "tokens", "--n", "2",
                      "--corpus", str(small_corpus), "--method", "correct", "--forwards", "20000", "--no-control",
                      "--threads", "1", "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    assert rep["states"] == "space" and rep["layer"] is None and rep["search"]["causal"] is False
    assert rep["prior"] is False and rep["text"]["prefix"] == [] and rep["text"]["suffix"] == []
    certified = [c for c in rep["chunks"] if c["certified"]]
    assert len(certified) == 2 and all(c["recovered_ids"] == c["true_ids"] and c["distance"] <= 1e-5 for c in certified)
    assert "the space's vector, states space" in cap.out


def test_a_default_proposer_that_cannot_load_leaves_a_note(saved, small_corpus, tmp_path, capsys, monkeypatch):
    """--proposer auto for a space is SmolLM2; where it cannot be loaded, the correction starts from a blank chunk
    and the report says so in one line."""
    from memlab.errors import ModelError
    from memlab.probes.invert import start as setup

    real = setup.load

    def load(spec, *a, **k):
        if spec == "smollm2":
            raise ModelError("smollm2: not installed")
        return real(spec, *a, **k)

    monkeypatch.setattr(setup, "load", load)
    out = tmp_path / "run"
    code, cap = _main("--model", f"space:memory_ae:{saved}", "--seq-len", "3", "--chunk-by", "tokens", "--n", "1",
                      "--corpus", str(small_corpus), "--forwards", "200", "--threads", "1", "--out", str(out),
                      capsys=capsys)
    assert code == 0, cap.err
    s = json.loads((out / "report.json").read_text())["search"]
    assert s["proposer"] is None and "smollm2" in s["proposer_note"] and "blank chunk" in s["proposer_note"]
    assert "note: no proposer" in cap.out


@pytest.mark.parametrize("argv, says", [
    (["--model", "space:toy_ae"], "space:toy_ae: the space gives no encoder to search with"),
    (["--model", "SAVED", "--states", "mean"], "--states mean reads a transformers model's states at a layer"),
    (["--model", "SAVED", "--layer", "2"], "--layer does not apply to space:memory_ae:"),
    (["--model", "SAVED", "--states-from", "memlab-lm"], "--states-from does not apply to space:memory_ae:"),
    (["--model", "memlab-lm", "--layer", "2", "--states", "space"], "--states space reads a memlab space's vector"),
    (["--model", "SAVED", "--seq-len", "12"], "reads chunks of at most 8 tokens, and a chunk here has 12: give "
                                              "--chunk-by tokens --seq-len 8 or less"),
    (["--model", "SAVED", "--seq-len", "3", "--proposer", "space:toy_ae"], "--proposer space:toy_ae: a space"),
])
def test_what_does_not_apply_is_one_line(argv, says, saved, small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [f"space:memory_ae:{saved}" if a == "SAVED" else a for a in argv]
    code, cap = _main(*argv, "--chunk-by", "tokens", "--n", "1", "--corpus", str(small_corpus), "--threads", "1",
                      "--out", str(out), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error:") and says in lines[0], cap.err
    assert not out.exists()
    if "toy_ae: the space" in says:  # it names the settings that apply
        assert "space:memory_ae:PATH" in lines[0] and "--states last, mean, first or second_last" in lines[0]


def test_the_python_entry_reads_a_space(saved, small_corpus, tmp_path):
    import memlab.probes

    rep = memlab.probes.invert(f"space:memory_ae:{saved}", None, out=tmp_path / "py", seq_len=3, chunk_by="tokens",
                               n=1, corpus=str(small_corpus), method="correct", forwards=50, control=False, threads=1)
    assert rep.states == "space" and rep.layer is None and len(rep.chunks) == 1
