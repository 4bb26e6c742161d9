"""The pooled search that gives the text back (propose, correct, certify) on tiny random models: a bidirectional
BERT as the encoder (mean pool), a causal llama as the proposer, each with its own word-level tokenizer over the
same words (different ids), so the proposal works in text and is re-tokenised for the encoder."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoConfig, AutoModel

from memlab.probes.invert.correct import CorrectOptions, correct
from memlab.probes.invert.pooled import LanguageHead, PooledOptions, PooledSearcher
from memlab.probes.invert.propose import ProposeOptions, Proposer
from memlab.probes.invert.recover import Recoverer
from memlab.probes.invert.states import LayerReader

WORDS = [f"w{i}" for i in range(38)]  # + [UNK], [PAD]: 40 tokens
V, T = 40, 5
LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             tie_word_embeddings=True)
BERT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def word_tokenizer(shuffle: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(WORDS)
    random.Random(shuffle).shuffle(words)
    vocab = {"[UNK]": 0, "[PAD]": 1} | {w: i + 2 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def tiny(model_type: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return AutoModel.from_config(AutoConfig.for_model(model_type, vocab_size=V, **kw)).eval()


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    return PooledSearcher(LayerReader(tiny("bert", **BERT), 2), "mean", PooledOptions())


def chunks(n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, V, (n, T), generator=torch.Generator().manual_seed(seed))  # (n, T): no UNK, no PAD


def test_correction_recovers_a_tiny_chunk_exactly_and_certifies_it(encoder):
    """From a blank start, the corrected chunk's pooled state matches to float noise, the runner-up does not."""
    seqs = chunks(3, 1)
    rec = Recoverer(encoder, CorrectOptions(batch_size=64, topk=16), method="correct", forwards=6000, pad_id=1)
    exact = 0
    for i, true in enumerate(seqs):
        z = encoder.pooled(true[None])[0]  # (D,)
        got = rec.search(z, T, seed=i)
        assert got.forwards <= 6000 and got.start_distance > 0.05
        zz = encoder.pooled(torch.tensor([got.ids]))[0]
        assert abs(float((zz - z).norm() / z.norm()) - got.distance) < 1e-5  # the distance is the returned one's
        if got.ids == true.tolist():
            exact += 1
            assert got.distance < 1e-5 and got.runner_up > 100 * max(got.distance, 1e-7)  # certified, with a gap
    assert exact >= 2, exact


def test_correction_moves_fix_order(encoder):
    """A chunk given with two words swapped is put back in order by the moves alone (no swaps, no insertions)."""
    true = chunks(1, 7)[0]
    z = encoder.pooled(true[None])[0]
    start = true.clone()
    start[[0, 3]] = start[[3, 0]]
    opt = CorrectOptions(batch_size=32, move_share=1.0, insert_share=0.0, patience=20)
    got = correct(encoder, start, z, opt, forwards=2000)
    assert got.ids == true.tolist() and got.distance < 1e-5 and got.accepted["swap"] == 0


def test_budget_and_method_are_honoured(encoder):
    z = encoder.pooled(chunks(1, 3))[0]
    for f in (1, 10, 77):
        assert Recoverer(encoder, CorrectOptions(batch_size=16), method="correct", forwards=f,
                         pad_id=1).search(z, T).forwards <= f
    got = Recoverer(encoder, CorrectOptions(), method="correct", seconds=0.2, pad_id=1).search(z, T)
    assert got.seconds < 0.2 + 1.0
    with pytest.raises(ValueError, match="method must be one of"):
        Recoverer(encoder, CorrectOptions(), method="beam")


def test_proposer_works_in_text_and_retokenises_for_the_encoder(encoder):
    """The proposer's language model has its own tokenizer; the proposal is encoder ids of the chunk's length whose
    distance is the encoder's, and ``propose`` alone spends nothing on correction."""
    lm_tok, enc_tok = word_tokenizer(1), word_tokenizer(2)
    head = LanguageHead.of(LayerReader(tiny("llama", **LLAMA), 2))
    prop = Proposer(head, lm_tok, [], enc_tok, ProposeOptions(beams=4, branch=8))
    true = chunks(1, 4)
    z = encoder.pooled(true)[0]
    p = prop.propose(encoder, z, T)
    assert len(p.ids) == T and all(0 <= i < V for i in p.ids)
    assert enc_tok(p.text, add_special_tokens=False)["input_ids"][:T] == p.ids  # re-tokenised, not copied
    zz = encoder.pooled(torch.tensor([p.ids]))[0]
    assert abs(float((zz - z).norm() / z.norm()) - p.distance) < 1e-5
    rec = Recoverer(encoder, CorrectOptions(), prop, method="propose", pad_id=1)
    got = rec.search(z, T)
    assert got.ids == p.ids and got.steps == 0 and got.proposal == p.text
    both = Recoverer(encoder, CorrectOptions(batch_size=32), prop, forwards=3000, pad_id=1).search(z, T)
    assert both.distance <= p.distance and both.steps > 0
