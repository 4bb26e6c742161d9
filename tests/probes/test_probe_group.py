"""Decoders trained as one batched group (memlab.probes.decoder.fitloop) train as they would one by one; the decoder's
incremental greedy decoding gives the reconstruction a full pass per token gives."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from memlab.probes.decoder.fitloop import train_decoders
from memlab.probes.options import ProbeOptions
from memlab.probes.decoder.fit import build_decoder

from conftest import SixtyTokens

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int = 96, t: int = 7):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 40, (n, t), generator=g)  # (N, T)
    ids[::4, 5:] = -1  # padded chunks
    z = torch.randn(n, 6, generator=g)  # (N, D)
    return z, ids


def _opts(**kw) -> ProbeOptions:
    base = dict(hidden_size=16, num_heads=2, num_layers=1, seq_len=7, epochs=4, batch_size=8, patience=1,
                val_fraction=0.25, lr=5e-3, device="cpu", progress=False)
    return replace(ProbeOptions(), **{**base, **kw})


def _members(opts, z, ids):
    """Probe (bag head), plain (no bag head, input dropout) and control (constant embedding), as fit_decoders builds."""
    plain = replace(opts, bag_head=False, input_dropout=0.3)
    const = z.mean(0, keepdim=True).expand_as(z)
    out = []
    for o, zz in ((opts, z), (plain, z), (opts, const)):
        dec = build_decoder(z.shape[1], SixtyTokens(), ids, o)
        dec.set_normalization(zz)
        out.append((dec, zz))
    return out


def _curve(h: list[dict], key: str) -> list[float]:
    return [r[key] for r in h if key in r]


@pytest.mark.parametrize("epochs,patience,batched", [(4, 1, True), (3, 5, True), (4, 1, False)])
def test_a_group_trains_as_its_members_one_by_one(epochs, patience, batched):
    """Batched (vmap) or member by member within each step (a CPU's default): to float tolerance; the control (a
    constant embedding) member by member to the last bit, so a constant encoder's probe equals its cached control."""
    z, ids = _data()
    opts = _opts(epochs=epochs, patience=patience)
    alone = []
    for dec, zz in _members(opts, z, ids):
        hist, _ = train_decoders([dec], [zz], ids, opts)
        alone.append((dec, hist[0]))
    group = _members(opts, z, ids)
    hists, secs = train_decoders([d for d, _ in group], [zz for _, zz in group], ids, opts, batched=batched)
    assert len(secs) == 3 and all(s > 0 for s in secs)
    for i, ((a, ha), (b, _), hb) in enumerate(zip(alone, group, hists)):
        for key in ("loss", "val_ce", "best_val_ce"):
            want, got = _curve(ha, key), _curve(hb, key)
            assert len(want) == len(got) and want
            assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
        assert [r["step"] for r in ha] == [r["step"] for r in hb]  # the same stops
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:  # the kept weights are the same
            assert torch.allclose(sa[k], sb[k], atol=1e-5), k
            if i == 2 and not batched:
                assert torch.equal(sa[k], sb[k]), k
    plain = group[1][0]
    assert plain.bag is None and plain.config.input_dropout == 0.3
    if patience == 1:  # the members stop at different epochs and each keeps its best one
        stops = [_curve(h, "val_ce") for h in hists]
        assert len({len(s) for s in stops}) > 1 or all(len(s) < epochs for s in stops)


def test_a_plain_member_keeps_a_zero_bag_head_and_its_own_noise():
    z, ids = _data()
    opts = _opts(epochs=2, patience=3)
    (probe, _), (plain, _), _ = _members(opts, z, ids)
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    from memlab.probes.decoder.group import DecoderGroup

    g = DecoderGroup([probe, plain], [z, z], ids, opts)
    bag = g.names.index("bag.weight")
    for _ in range(3):
        g.train_step(torch.arange(8), lr=1e-2)
    assert g.params[bag][1].abs().max() == 0 and g.params[bag][0].abs().max() > 0  # the plain member's stays zero
    moved = [n for n, p in zip(g.names, g.params) if n in before and not torch.equal(p[1], before[n])]
    assert moved  # the plain member trains


def test_incremental_greedy_decoding_matches_the_full_pass():
    from memlab.probes.readings import reconstruct_ids

    z, ids = _data()
    for cond in ("unrolled", "prefix"):
        dec = build_decoder(z.shape[1], SixtyTokens(), ids, _opts(conditioning=cond, bag_head=True))
        torch.nn.init.normal_(dec.bag.weight, std=0.5)  # a live bag head too
        dec.set_normalization(z)
        dec.eval()
        seq = torch.cat([torch.zeros(5, 1, dtype=torch.long), ids[:5, :4].clamp(min=0)], 1)  # (5, 5)
        state: dict = {}
        for t in range(1, seq.shape[1] + 1):  # one position at a time, on cached keys and values
            step = dec(z[:5], seq[:, :t], mode="next", state=state)  # (5, 1, C)
            assert torch.allclose(step, dec(z[:5], seq[:, :t])[:, -1:], atol=1e-5)
        fast = reconstruct_ids(dec, z[:9], 7)
        dec.incremental_decoding = False
        assert torch.equal(fast, reconstruct_ids(dec, z[:9], 7))


def test_a_decoder_without_the_group_modes_trains_whole_member_by_member():
    from memlab.probes.decoder.model import ProbeDecoder

    class Whole(ProbeDecoder):  # another decoder kind: forward(z, ids) only
        group_modes = False

    z, ids = _data()
    opts = _opts(epochs=2, patience=3)
    want, _ = train_decoders([d for d, _ in _members(opts, z, ids)], [zz for _, zz in _members(opts, z, ids)], ids,
                             opts, batched=False)
    members = _members(opts, z, ids)
    for d, _ in members:
        d.__class__ = Whole
    got, _ = train_decoders([d for d, _ in members], [zz for _, zz in members], ids, opts)
    for a, b in zip(want, got):  # the same noise draws (its own stream, inside forward) and the same numbers
        assert _curve(a, "val_ce") == pytest.approx(_curve(b, "val_ce"), rel=1e-6) and _curve(a, "val_ce")


def test_a_plain_member_left_alone_still_trains_without_the_bag_head():
    from memlab.probes.decoder.model import ProbeDecoder
    from memlab.probes.decoder.group import DecoderGroup

    class Whole(ProbeDecoder):  # the pretrained decoder's kind: each member's own forward, own weights only
        group_modes = False

    z, ids = _data()
    opts = _opts(epochs=2, patience=3)
    (probe, _), (plain, _), _ = _members(opts, z, ids)
    probe.__class__ = plain.__class__ = Whole
    g = DecoderGroup([probe, plain], [z, z], ids, opts)
    g.drop([0])  # the bag-head member stops first: no member left uses the bag head
    before = g.weights(0)
    g.train_step(torch.arange(8), lr=1e-2)
    bag = g.names.index("bag.weight")
    assert g.params[bag][0].abs().max() == 0  # the absent weight stays zero
    assert any(not torch.equal(a, b) for a, b in zip(before, g.weights(0)))  # the plain member trains


def test_a_constant_embedding_reuses_the_cached_control_run():
    """A probe of a constant embedding, with the control of the same chunks cached, is that control's run: the same
    decoder and metrics, without training again; its control trained anew gives the same CE to the last bit."""
    from memlab.probes.decoder.fit import fit_decoders
    from memlab.probes.decoder.records import ControlStore, FitData

    class Tok(SixtyTokens):
        def batch_decode(self, rows, skip_special_tokens=True):
            return [" ".join(map(str, r)) for r in rows]

    z, ids = _data()
    ev = ids[:16]
    tok, opts = Tok(), _opts(select_decoder=False, n_examples=0, scorers=["token_set_f1"])
    cache: dict = {}
    first = fit_decoders(opts, FitData(tok, ids, ev, z, z[:16]), control=ControlStore(cache, "k", "first"))
    const = torch.full_like(z, 0.5)  # (N, D): one vector for every chunk
    again = fit_decoders(opts, FitData(tok, ids, ev, const, const[:16]), control=ControlStore(cache, "k", "const"))
    dec, m, hist, secs = again.probe.decoder, again.probe.scores, again.probe.history, again.probe.seconds
    assert secs == 0.0 and m["run"].startswith("the cached control's") and again.control.shared_with == "first"
    assert m["ce"] == first.control.scores["ce"]
    alone = fit_decoders(opts, FitData(tok, ids, ev, const, const[:16]), control=ControlStore({}, "k")).probe  # trained
    assert alone.scores["ce"] == m["ce"] and alone.scores["token_accuracy"] == m["token_accuracy"]
    assert all(torch.equal(a, b) for a, b in zip(alone.decoder.state_dict().values(), dec.state_dict().values()))
