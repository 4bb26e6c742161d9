"""The secant order: a linear map from embedding rows to states fitted to verified candidates ranks the rest."""

from __future__ import annotations

import torch

from memlab.probes.invert.positions.lockstep import Lockstep, LockstepOptions
from memlab.probes.invert.positions.rank import rank_of
from memlab.probes.invert.positions.secant import secant_scores
from memlab.probes.invert.layer import LayerReader
from test_invert import V, tiny


def _table(v=600, d=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(v, d, generator=g), g


def test_an_affine_map_is_recovered_from_pairs_without_the_answer():
    table, g = _table()
    a, b = torch.randn(24, 20, generator=g), torch.randn(20, generator=g)
    states = table @ a + b  # (V, D): every token's state under an affine map
    for true in (3, 417, 599):
        seen = torch.randperm(600, generator=g)[:80]
        seen = seen[seen != true]
        s = secant_scores(table, table[seen], states[seen], states[true], rank=20, lam=1e-6)
        assert rank_of(s, true) == 0
        assert s.shape == (600,)


def test_the_fit_leans_on_the_nearest_pairs():
    """A map linear only near the answer (saturated far from it): the weighted fit ranks the answer first among
    the untried tokens where an unweighted one does not need to."""
    table, g = _table(seed=1)
    a = torch.randn(24, 24, generator=g) / 24**0.5
    true = 11
    states = torch.tanh((table - table[true]) @ a * 3) + (table - table[true]) @ a  # (V, D)
    near = torch.topk(-(table - table[true]).norm(dim=-1), 60).indices[1:]  # the answer's neighbours ...
    far = torch.topk((table - table[true]).norm(dim=-1), 200).indices  # ... and distant tokens
    seen = torch.cat([near, far])
    s = secant_scores(table, table[seen], states[seen], states[true], rank=24, lam=1e-4, width=1.0)
    s[seen] = float("inf")
    assert rank_of(s, true) == 0


def test_lockstep_with_the_secant_order_recovers_chunks_and_reports_its_rank():
    model = tiny("llama", 0)
    model.config.tie_word_embeddings = True
    reader = LayerReader(model, 2)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(1, V, (6,), generator=g).tolist() for _ in range(2)]
    # rounds of 1, 2, 4, 8, ... candidates: a position still open after 3 fits the secant order
    opts = LockstepOptions(first_batch=1, batch_size=32, budget=64, exhaustive_batch=64, accept_gap=float("inf"),
                           secant_after=3, prior=False)
    states = [reader.full_states(torch.tensor([[0] + s]))[0, 1:] for s in seqs]
    got = Lockstep(reader, opts).group(states, [0], seqs)
    assert [[p.token for p in ps] for ps in got] == seqs
    reached = [p for ps in got for p in ps if p.tried > opts.secant_after]
    assert reached and all(p.secant_rank is not None for p in reached)
    off = LockstepOptions(**{**opts.__dict__, "secant": False})
    got_off = Lockstep(reader, off).group(states[:1], [0], seqs[:1])
    assert [p.token for p in got_off[0]] == seqs[0]
    assert all(p.secant_rank is None for ps in got_off for p in ps)


def test_rows_that_do_not_vary_give_no_order():
    table, _ = _table()
    xs = table[[5] * 40]  # one row, forty times: no map can be fitted
    assert secant_scores(table, xs, torch.randn(40, 20), torch.randn(20)) is None
