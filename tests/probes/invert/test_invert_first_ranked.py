"""The first position after an empty prefix searched in shared ranked rounds: the table's tokens and certificates,
a result that does not depend on the chunks sharing the pass, fewer states than the table where the prior knows the
token, and the prior of first tokens."""

from __future__ import annotations

import torch

from memlab.probes.invert.layer import LayerReader
from memlab.probes.invert.positions.firstranked import first_prior, first_ranked
from memlab.probes.invert.positions.lockstep import LockstepOptions
from memlab.probes.invert.positions.rank import NextTokenHead
from memlab.probes.invert.positions.searcher import Searcher
from test_invert import V, tiny

OPTS = LockstepOptions(first_batch=4, batch_size=32, budget=96, exhaustive_batch=64, accept_gap=float("inf"),
                       secant_after=24)


def _reader(family: str = "llama", seed: int = 0) -> LayerReader:
    model = tiny(family, seed)
    model.config.tie_word_embeddings = True
    return LayerReader(model, 2)


def _firsts(reader: LayerReader, tokens: list[int]) -> torch.Tensor:
    return torch.stack([reader.full_states(torch.tensor([[t]]))[0, 0] for t in tokens])  # (n, D)


def test_ranked_first_positions_match_the_table():
    reader = _reader()
    s = Searcher(reader, OPTS)
    tokens = [3, 150, 77, 210, 4]
    targets = _firsts(reader, tokens)
    got = first_ranked(s, [], targets)
    table = s.first_positions([], targets)
    assert [p.token for p in got] == tokens == [p.token for p in table]
    assert [p.certificate for p in got] == [p.certificate for p in table] == ["match"] * len(tokens)
    assert all(p.from_table and 0 < p.tried <= V for p in got)
    assert all(abs(p.distance - q.distance) <= 1e-6 for p, q in zip(got, table))


def test_a_chunk_reads_the_same_alone_and_in_a_pass():
    reader = _reader("qwen2", seed=1)
    s = Searcher(reader, OPTS)
    tokens = [9, 180, 40, 41]
    targets = _firsts(reader, tokens)
    prior = torch.randn(V, generator=torch.Generator().manual_seed(0))
    together = first_ranked(s, [], targets, prior)
    for j in range(len(tokens)):
        alone = first_ranked(s, [], targets[j : j + 1], prior)[0]
        p = together[j]
        assert (alone.token, alone.tried, alone.runner_up, alone.certificate, alone.found_at) == (
            p.token, p.tried, p.runner_up, p.certificate, p.found_at)


def test_a_prior_that_knows_the_token_verifies_a_few_states():
    reader = _reader()
    s = Searcher(reader, OPTS)
    tokens = [17, 201]
    prior = torch.zeros(V)
    prior[tokens] = -1.0  # the two tokens first
    got = first_ranked(s, [], _firsts(reader, tokens), prior)
    assert [p.token for p in got] == tokens
    assert all(p.certificate == "match" and p.tried == OPTS.first_batch for p in got)
    # the prior puts them last: alone it verifies every state; the secant order finds them sooner
    plain = Searcher(reader, LockstepOptions(**{**OPTS.__dict__, "secant": False}))
    blind = first_ranked(plain, [], _firsts(reader, tokens), -prior)
    assert [p.tried for p in blind] == [V, V] and [p.token for p in blind] == tokens
    secant = first_ranked(s, [], _firsts(reader, tokens), -prior)
    assert [p.token for p in secant] == tokens and all(p.tried < V for p in secant)


def test_noisy_states_go_to_the_end_of_the_vocabulary_as_the_table_does():
    reader = _reader()
    s = Searcher(reader, OPTS)
    targets = _firsts(reader, [5, 99])
    noisy = targets + 0.05 * targets.norm(dim=-1, keepdim=True) * torch.randn(targets.shape,
                                                                             generator=torch.Generator().manual_seed(2)) / targets.shape[-1] ** 0.5
    got, table = first_ranked(s, [], noisy), s.first_positions([], noisy)
    assert [p.token for p in got] == [p.token for p in table]
    assert [p.certificate for p in got] == [p.certificate for p in table]
    assert all(p.tried == V for p in got if p.certificate == "nearest")


class _Tok:
    def __init__(self, names, eos):
        self.names, self.eos_token_id = names, eos

    def convert_ids_to_tokens(self, ids):
        return [self.names[i] for i in ids]


def test_the_prior_of_first_tokens_lends_a_word_its_space_prefixed_twin():
    reader = _reader()
    head = NextTokenHead.of(reader)
    names = [f"t{i}" for i in range(V)]
    names[10], names[11] = "Ġword", "word"
    prior = first_prior(head, _Tok(names, eos=2), V)
    assert prior.shape == (V,) and bool(torch.isfinite(prior).all())
    assert float(prior[11]) <= float(prior[10])  # "word" at least as likely as " word"
    assert torch.equal(prior, first_prior(head, _Tok(names, eos=2), V))  # the same sample each time
    assert first_prior(head, _Tok(names, eos=None), V) is None and first_prior(None, _Tok(names, 2), V) is None


def test_a_near_twin_within_int4s_noise_is_ambiguous_in_the_ranked_pass_too():
    from memlab.probes.invert.positions.precision import noise_floor, read_as
    from test_invert_precision import _near_twin

    reader, seq, states = _near_twin()
    s = Searcher(reader, OPTS)
    for dtype, want in (("float32", "match"), ("int4", "ambiguous")):
        read = read_as(states, dtype)
        floors = noise_floor(read, dtype)
        got = first_ranked(s, [], read[:1], floors=floors[:1])[0]
        table = s.first_positions([], read[:1], floors=floors[:1])[0]
        assert got.token in (7, 8) and got.certificate == table.certificate == want, (dtype, got)
