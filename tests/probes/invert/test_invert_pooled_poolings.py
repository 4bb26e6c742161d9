"""The pooled search reads every pooling the trained probe has (last, mean, first, second_last): the state it reads
is the probe's encoder's pooling of the same chunk, a bidirectional encoder's first ([CLS]) state gives a short
chunk back, a pooling that cannot carry the chunk on a causal model is refused before any search, and a probe run's
pooling chooses the --states that reads it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel

from memlab.probes.encoders.capture import HiddenStateEncoder
from memlab.probes.invert.pooled.correct import CorrectOptions
from memlab.probes.invert.options import POOLED, PooledOptions
from memlab.probes.invert.pooled.searcher import POOLS, PooledSearcher, blind_spot
from memlab.probes.invert.beside.probe_run import POOL_TO_STATES
from memlab.probes.invert.pooled.recover import Recoverer
from memlab.probes.invert.layer import LayerReader

WORDS = [f"w{i}" for i in range(36)]  # + [UNK], [PAD], [CLS], [SEP]: 40 tokens
V, T = 40, 4
BERT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def cls_tokenizer():
    """A word-level tokenizer that wraps a text in [CLS] ... [SEP], as BERT's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3} | {w: i + 4 for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                               ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]")


def tiny(model_type: str, **kw):
    torch.manual_seed(0)
    return AutoModel.from_config(AutoConfig.for_model(model_type, vocab_size=V, **kw)).eval()


@pytest.fixture(scope="module")
def bert():
    torch.set_num_threads(1)
    return tiny("bert", **BERT)


def chunks(n: int, seed: int) -> torch.Tensor:
    return torch.randint(4, V, (n, T), generator=torch.Generator().manual_seed(seed))  # (n, T): no special token


def test_every_probe_pooling_is_a_pooled_search():
    from memlab.probes.catalog import POOLINGS
    from memlab.probes.encoders import pooling
    from memlab.probes.parts import PARTS

    assert set(POOLINGS) == {"last", "second_last", "mean", "first"}  # the one list; the others are read from it
    assert POOLS == tuple(POOLINGS) == POOLED[:len(POOLINGS)] and set(POOLED) - set(POOLINGS) == {"logits", "space"}
    assert set(POOL_TO_STATES) == set(POOLINGS) and set(PARTS["pool"].names()) >= set(POOLINGS)

    built_in = {n.removeprefix("pool_") for n in dir(pooling) if n.startswith("pool_") and n != "pool_states"}
    assert built_in == set(POOL_TO_STATES)  # every pooling the probe ships (pooling.pool_*)
    assert all(POOL_TO_STATES[p] == p for p in POOLS)


@pytest.mark.parametrize("pool", ["first", "second_last", "last", "mean"])
@pytest.mark.parametrize("model_type", ["bert", "llama"])
def test_the_searched_state_is_the_probes_pooling_of_the_chunk(pool, model_type, bert):
    """The probe's encoder path (special tokens, hooks, ``pool_*``) and the search's reader give the same vector."""
    model = bert if model_type == "bert" else tiny("llama", **LLAMA)
    enc = HiddenStateEncoder(model, cls_tokenizer(), layer=2, pool=pool)
    assert (enc.prefix, enc.suffix) == ([2], [3])
    s = PooledSearcher(LayerReader(model, 2), pool, PooledOptions(), None, enc.prefix, enc.suffix)
    ids = chunks(3, 0)
    want = enc.encode(ids, torch.ones_like(ids))  # (3, D)
    got = s.pooled(ids)  # (3, D)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    # the vector the gradient is taken through is the same one
    e = s.reader.embed(s.wrap(ids))
    assert torch.allclose(s.vec.vectors(e).cpu(), want, rtol=1e-5, atol=1e-6)


def test_a_one_position_row_pools_as_the_probe_clamps_it():
    from memlab.probes.encoders.pooling import pool_second_last
    from memlab.probes.invert.pooled.searcher import pool_rows

    h = torch.randn(2, 1, 3)
    assert torch.equal(pool_rows(h, "second_last"), pool_second_last(h, torch.ones(2, 1)))
    with pytest.raises(ValueError, match="pool must be one of"):
        pool_rows(h, "max")


def test_first_state_of_a_bidirectional_encoder_gives_short_chunks_back(bert):
    """From a blank chunk, the correction finds chunks whose [CLS] state matches the target to float noise: each
    certified one is the true chunk, and most of them are certified."""
    s = PooledSearcher(LayerReader(bert, 2), "first", PooledOptions(), None, [2], [3])
    rec = Recoverer(s, CorrectOptions(batch_size=64, topk=16), method="correct", forwards=6000, pad_id=1)
    certified = 0
    for i, true in enumerate(chunks(4, 1)):
        z = s.pooled(true[None])[0]  # (D,)
        got = rec.search(z, T, seed=i)
        if got.distance <= rec.copt.tol:
            certified += 1
            assert got.ids == true.tolist() and got.runner_up > 10 * max(got.distance, 1e-7)
    assert certified >= 3, certified


def test_poolings_that_cannot_carry_the_chunk():
    assert "prefix" in blind_spot("first", True, [1], [])
    assert "first token" in blind_spot("first", True, [], [])
    assert "last token" in blind_spot("second_last", True, [1], [])
    assert blind_spot("second_last", True, [1], [2]) is None  # a suffix token reads the whole chunk
    for pool in POOLS:
        assert blind_spot(pool, False, [1], []) is None  # a bidirectional encoder's states read the whole chunk
    assert blind_spot("last", True, [], []) is None and blind_spot("mean", True, [], []) is None


@pytest.mark.parametrize("states, says", [("first", "first position reads only the chunk's first token"),
                                          ("second_last", "never sees that token")])
def test_a_causal_model_refuses_them_in_one_line_before_any_search(states, says, capsys, tmp_path):
    from memlab.app.cli import main

    out = tmp_path / "run"
    code = main(["invert", "--model", "memlab-lm", "--layer", "2", "--states", states, "--seq-len", "4", "--n", "1",
                 "--threads", "1", "--out", str(out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error:"), err
    assert f"--states {states} cannot carry the chunk on memlab-lm" in lines[0] and says in lines[0]
    assert "use --states last or mean" in lines[0] and not out.exists()
