"""Racing the probe's candidates (memlab.probes.decoder.fitloop.race_losers): a candidate that cannot catch the leader stops
early, and the fit keeps what it keeps without racing, with the same reading."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from memlab.probes.decoder.fitloop import RACE_Z, paired_se, race_losers
from memlab.probes.options import ProbeOptions
from memlab.probes.decoder.fit import fit_decoders
from memlab.probes.decoder.records import ControlStore, FitData

pytestmark = pytest.mark.usefixtures("one_thread")


def test_paired_se_is_the_standard_error_of_the_per_token_difference():
    g = torch.Generator().manual_seed(0)
    tokens = torch.full((400,), 8.0)
    a = 8 * 4.0 + torch.randn(400, generator=g)
    b = a - 8 * 0.1 + 0.5 * torch.randn(400, generator=g)  # b is better by 0.1 nats a token, noisily
    se = paired_se(a, b, tokens)
    d = (a - b) / 8  # per-token differences, equal token counts: the plain standard error of their mean
    assert se == pytest.approx(float(d.std() / math.sqrt(400)), rel=1e-6)
    assert paired_se(a, a, tokens) == 0.0 and paired_se(a[:1], b[:1], tokens[:1]) == math.inf


class Unit:
    """A stand-in unit: its members' per-chunk losses on the held-back chunks."""

    def __init__(self, nll: torch.Tensor, tokens: torch.Tensor):
        self.nll, self.tokens, self.active = nll, tokens, list(range(nll.shape[0]))

    def held_back_chunk_nll(self, rows):
        return self.nll, self.tokens


def _race(best, before, nll, refs=None, horizon=3):
    u = Unit(nll, torch.full((nll.shape[1],), 10.0))
    refs = refs or [5.0] * len(best)
    return [m for _, _, m, _ in race_losers([(u, 0)], torch.arange(nll.shape[1]), refs, best, before, horizon, {})]


def test_a_levelled_off_candidate_far_behind_stops_a_fast_improving_or_noisy_one_does_not():
    g = torch.Generator().manual_seed(1)
    base = 40 + torch.randn(200, generator=g)  # (n,) summed nats over 10 tokens
    quiet = torch.stack([base, base + 3.0 + 0.1 * torch.randn(200, generator=g)])  # member 1: 0.3 nats/token worse
    # best CEs 4.0 vs 4.3: member 1 improved 0.01 in its last epoch (3 x 0.01 << 0.3): it stops
    assert _race([4.0, 4.3], [4.05, 4.31], quiet) == [1]
    # the same gap while it still improves 0.2 an epoch: it could catch up within the patience
    assert _race([4.0, 4.3], [4.05, 4.5], quiet) == []
    # the same gap within the noise: per-chunk differences of sd 60 nats (6 a token) over 200 chunks
    noisy = torch.stack([base, base + 3.0 + 60 * torch.randn(200, generator=g)])
    se = paired_se(noisy[1], noisy[0], torch.full((200,), 10.0))
    assert 0.3 < RACE_Z * se and _race([4.0, 4.3], [4.05, 4.31], noisy) == []
    # gains are read against each candidate's own control: 0.3 behind in CE but its control 0.5 harder: it leads
    assert _race([4.0, 4.3], [4.05, 4.31], quiet, refs=[5.0, 5.5]) == [0]


def _opts(**kw) -> ProbeOptions:
    base = dict(hidden_size=16, num_heads=2, num_layers=1, seq_len=6, epochs=12, batch_size=16, patience=2,
                val_fraction=0.25, lr=5e-3, device="cpu", progress=False, select_decoder=True, ci_resamples=100)
    return replace(ProbeOptions(), **{**base, **kw})


def test_racing_keeps_the_same_probe_with_the_same_reading_in_fewer_steps(tokenizer, monkeypatch):
    """An embedding that keeps every token (one-hot codes of each position): the random start reads it and the
    contained candidates trail it; raced, they stop early, and the kept probe is the one kept without racing,
    read to the last bit the same (on a CPU each member's arithmetic is its own)."""
    g = torch.Generator().manual_seed(5)
    ids = 5 + torch.randint(0, 40, (240, 6), generator=g)  # (N, T)
    tr, ev = ids[:192], ids[192:]
    code = lambda x: torch.nn.functional.one_hot(x - 5, 40).float().flatten(1)  # noqa: E731  (N, 6 * 40)
    import memlab.probes.decoder.fitloop as fitloop

    stopped, real = [], fitloop.race_losers
    monkeypatch.setattr(fitloop, "race_losers", lambda *a: stopped.extend(out := real(*a)) or out)
    got = {}
    for race in (False, True):
        out = fit_decoders(_opts(race=race), FitData(tokenizer, tr, ev, code(tr), code(ev)),
                           control=ControlStore({}, "k"))
        got[race] = out.probe.scores
    off, on = got[False], got[True]
    assert on.metrics["start"]["kept"] == off.metrics["start"]["kept"] == "scratch"
    assert on.metrics["ce"] == off.metrics["ce"]
    assert len(stopped) == 2  # both contained candidates stopped, raced by the random start
    assert set(on.metrics["start"]["raced"]) == {"probe", "plain"} and "raced" not in off.metrics["start"]
    assert on.metrics["start"]["contained"] > off.metrics["start"]["contained"]  # stopped before their own best
