"""Output embeddings that are a model's own (not tied to its input table) are read from its checkpoint, a folder
of safetensors or a GGUF file, and give the per-position search its prior."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from memlab.probes.invert.head import output_embeddings
from memlab.probes.invert.positions.lockstep import Lockstep, LockstepOptions
from memlab.probes.invert.positions.rank import NextTokenHead
from memlab.probes.invert.start import load

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def untied(tokenizer):
    torch.manual_seed(2)
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=96,
                         tie_word_embeddings=False)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a head far from the input table, so that reading the wrong one shows
        model.lm_head.weight.normal_(0, 1)
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory, untied, tokenizer):
    path = tmp_path_factory.mktemp("untied")
    untied.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _greedy(model, n, start=0):
    ids = [start]
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


def test_the_folder_head_is_read_and_gives_the_prior(folder, untied):
    w = output_embeddings(str(folder))
    assert torch.equal(w, untied.lm_head.weight.float())
    enc, reader = load(str(folder), 2, "cpu")
    assert not NextTokenHead.tied(reader) and NextTokenHead.of(reader) is None
    # the model's own greedy text: with its head read, the prior ranks every token of it first
    ids = _greedy(untied, 6)
    states = [reader.full_states(torch.tensor([ids]))[0, 1:]]
    search = Lockstep(reader, LockstepOptions(first_batch=1, accept_gap=float("inf")), head_weight=w)
    got = search.group(states, ids[:1], [ids[1:]])
    assert [p.token for p in got[0]] == ids[1:]
    assert all(p.prior_rank == 0 and p.found_at == 1 for p in got[0])


def test_a_head_of_another_shape_is_not_used(folder):
    _, reader = load(str(folder), 2, "cpu")
    assert NextTokenHead.of(reader, torch.zeros(reader.vocab_size, 7)) is None
    assert NextTokenHead.of(reader, torch.zeros(reader.vocab_size - 1, 32)) is None


def test_a_tied_folder_has_no_head_of_its_own(tmp_path, tokenizer):
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), tie_word_embeddings=True)
    tf.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    assert output_embeddings(str(tmp_path)) is None


def test_the_gguf_head_is_read(tmp_path, untied, tokenizer):
    gguf = pytest.importorskip("gguf")  # noqa: F841
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parents[1])  # tests/probes, where the GGUF writer lives
    if here not in sys.path:  # on the path when tests/probes is collected too, not when this file runs alone
        sys.path.insert(0, here)
    from test_probe_gguf import write_llama_gguf

    path = write_llama_gguf(untied, tokenizer, tmp_path / "untied.F32.gguf")
    w = output_embeddings(str(path))
    assert w is not None and torch.allclose(w, untied.lm_head.weight.float())
