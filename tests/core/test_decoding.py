"""Beam search (memlab.decoding) against exhaustive search, and the memory sentence space's beams."""

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from memlab.decoding import beam_search
from memlab.errors import ModelError

V, EOS = 5, 0


def _table(seed: int) -> torch.Tensor:
    """Log-probabilities of the next token given the last one (row V is the start state): a Markov chain."""
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(V + 1, V, generator=g) * 2.0, -1)  # (V+1, V)


def _exhaustive(table: torch.Tensor, max_new: int, alpha: float) -> list[int]:
    best, best_s = None, -math.inf
    for n in range(1, max_new + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS in seq[:-1]:
                continue
            prev, s = V, 0.0
            for tok in seq:
                s += float(table[prev, tok])
                prev = tok
            body = list(seq[:-1]) if seq[-1] == EOS else list(seq)
            if seq[-1] != EOS and n < max_new:
                continue  # unfinished before the limit
            score = s / (len(body) + 1) ** alpha
            if score > best_s:
                best, best_s = body, score
    return best


def _run(table: torch.Tensor, batch: int, beams: int, max_new: int, alpha: float) -> list[list[int]]:
    state = {"last": torch.full((batch * beams,), V)}

    def advance(order, toks, t):
        state["last"] = toks.clone()
        return table[state["last"]]

    return beam_search(table[state["last"]], advance, batch, beams, EOS, max_new, alpha)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_wide_beam_equals_exhaustive_search(seed, alpha):
    table = _table(seed)
    want = _exhaustive(table, 4, alpha)
    assert _run(table, 2, 200, 4, alpha) == [want, want]


def test_narrow_beam_can_miss_and_errors():
    found = [_run(_table(s), 1, 1, 4, 1.0)[0] == _exhaustive(_table(s), 4, 1.0) for s in range(30)]
    assert not all(found)  # one beam is a heuristic: some chains hide their best sentence behind a worse first token
    with pytest.raises(ModelError, match="num_beams"):
        _run(_table(0), 1, 0, 4, 1.0)
    with pytest.raises(ModelError, match="max_new_tokens"):
        _run(_table(0), 1, 2, 0, 1.0)


def test_memory_space_beams_feed_the_kept_prefixes():
    """The memory space's beam search re-feeds the kept rows' prefixes: on a decoder whose next-token law
    is the Markov table above (through ``decode_logits``), a wide beam finds the exhaustive optimum."""
    from memlab.models.memory.space import MemorySpace

    table = _table(5)
    space = MemorySpace.__new__(MemorySpace)
    space.config = SimpleNamespace(bos_token_id=V, eos_token_id=EOS, copy_inputs="shifted", blank_id=1)
    space.max_tokens = 3
    space.model = torch.nn.Linear(1, 1)  # only its device is read
    space.decode_logits = lambda z, ids: table[ids]  # (N, t, V): the law of each next token
    space.tokenizer = SimpleNamespace(decode=lambda row, skip_special_tokens=True: " ".join(map(str, row)))
    want = _exhaustive(table, 4, 1.0)
    assert space.generate(torch.zeros(3, 2), num_beams=100) == [" ".join(map(str, want))] * 3
    with pytest.raises(ModelError, match="not both"):
        space.generate(torch.zeros(1, 2), num_beams=2, do_sample=True)
    space.config.copy_inputs = "blank"
    with pytest.raises(ModelError, match="autoregressive"):
        space.generate(torch.zeros(1, 2), num_beams=2)


def test_toy_space_beams_equal_a_direct_search():
    """``toy_ae`` decodes with beams through the same search; its result is the search run on its own logits."""
    from memlab.decoding import beam_search_recompute
    from tests.toy_spaces import random_space

    space = random_space()
    z = space.encode_text(["It was a fine day.", "She said nothing."])
    tok = space.tokenizer
    rows = beam_search_recompute(space.decode_logits, z, tok.bos_token_id, tok.eos_token_id, 6, 3)
    assert space.generate(z, max_new_tokens=6, num_beams=3) == [tok.decode(r, skip_special_tokens=True) for r in rows]
    with pytest.raises(ModelError, match="not both"):
        space.generate(z, num_beams=2, do_sample=True)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    from memlab.decoding import top_p_filter, top_p_mask

    probs = torch.tensor([[0.1, 0.5, 0.15, 0.25], [0.7, 0.1, 0.1, 0.1]])  # (2, 4)
    assert top_p_mask(probs, 0.6).tolist() == [[False, True, False, True], [True, False, False, False]]
    assert torch.equal(top_p_filter(probs, 0.6), probs * torch.tensor([[0, 1, 0, 1], [1, 0, 0, 0]]))
    assert top_p_filter(probs, 1.0) is probs
