"""A probe that contains its control: started as the trained control with its embedding pathway silent
(memlab.probes.decoder.fit.contain), it computes what the control computes at step 0, for every decoder kind, and its
pathway still learns; the fit keeps the lowest held-back CE, epoch 0 (the control itself) included."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from memlab.probes.decoder.fitloop import held_back_rows, train_decoders
from memlab.probes.decoder.group import DecoderGroup
from memlab.probes.options import ProbeOptions
from memlab.probes.readings import DecoderScores
from memlab.probes.report.report import Fit
from memlab.probes.run import interval_readings
from memlab.probes.decoder.fit import _new_decoder, contain, contained_shares, fit_decoders
from memlab.probes.decoder.records import ControlStore, FitData

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = Path(__file__).resolve().parents[2] / "memlab" / "resources" / "checkpoints" / "token_lm-toy"
HAS_PEFT = importlib.util.find_spec("peft") is not None


class _Tok:
    bos_token_id = 0

    def __len__(self):
        return 60


def _data(n: int = 48, t: int = 6, d: int = 5):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, 40, (n, t), generator=g)  # (N, T)
    ids[::5, 4:] = -1  # padded chunks
    return torch.randn(n, d, generator=g), ids  # (N, D), (N, T)


def _opts(**kw) -> ProbeOptions:
    base = dict(hidden_size=16, num_heads=2, num_layers=1, seq_len=6, epochs=1, batch_size=16, patience=1,
                val_fraction=0.25, lr=5e-3, device="cpu", progress=False, select_decoder=False, ci_resamples=100)
    return replace(ProbeOptions(), **{**base, **kw})


KINDS = {
    "unrolled": {},
    "prefix": {"conditioning": "prefix", "prefix_len": 2},
    "blank": {"inputs": "blank", "bag_head": False},
    "pretrained frozen": {"decoder": f"pretrained:{TOY}", "conditioning": "prefix", "prefix_len": 2},
    "pretrained map_hidden": {"decoder": f"pretrained:{TOY}", "map_hidden": 8},
    "pretrained LoRA": {"decoder": f"pretrained:{TOY}", "conditioning": "prefix", "prefix_len": 2,
                        "lora_r": 2},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_contained_probe_starts_as_its_trained_control(kind):
    """Step 0: held-back CE (alone and in a batched group) and held-out logits are the control's, whatever the
    embedding; the silenced pathway gets a gradient at once."""
    if "LoRA" in kind and not HAS_PEFT:
        pytest.skip("peft is not installed")
    opts = _opts(**KINDS[kind])
    tok = _Tok()
    if kind.startswith("pretrained"):
        from memlab.probes.encoders.sources import load_tokenizer

        tok = load_tokenizer(str(TOY))
    z, ids = _data()
    const = z.mean(0, keepdim=True).expand_as(z)
    control = _new_decoder(opts, FitData(tok, ids, ids, const, const))
    train_decoders([control], [const], ids, opts)  # the trained control
    probe = contain(_new_decoder(opts, FitData(tok, ids, ids, z, z)), control)
    path = probe.embedding_weights()
    assert any("lora_" in k for k in probe.state_dict()) == ("LoRA" in kind)
    assert ("cond.0.weight" in path) == ("map_hidden" in kind)
    assert path and all(float(probe.get_parameter(n).detach().abs().sum()) == 0 for n in path)
    assert float(control.get_parameter(path[0]).detach().abs().sum()) > 0  # the control's own pathway was not zero
    _, rows = held_back_rows(ids.shape[0], opts.val_fraction, torch.Generator().manual_seed(opts.seed))
    alone = [float(DecoderGroup([d], [zz], ids, opts).held_back_ce(rows)[0]) for d, zz in ((control, const),
                                                                                          (probe, z))]
    assert alone[1] == pytest.approx(alone[0], rel=1e-5, abs=1e-6)
    if getattr(probe, "group_modes", False):  # one vmapped pass of both members
        both = DecoderGroup([control, probe], [const, z], ids, opts, batched=True).held_back_ce(rows).tolist()
        assert both == pytest.approx(alone, rel=1e-4, abs=1e-5)
    x = ids[:8].clamp(min=0)
    control.eval(), probe.eval()
    with torch.no_grad():
        assert torch.allclose(probe(z[:8], x), control(const[:8], x), atol=1e-5)
        assert torch.allclose(probe(z[:8] * 3 + 1, x), control(const[:8], x), atol=1e-5)  # any embedding
    probe.train()
    probe(z[:8], x).float().logsumexp(-1).mean().backward()
    for n in path:
        assert float(probe.get_parameter(n).grad.abs().sum()) > 0, n


@pytest.fixture(scope="module")
def chunks_of(tokenizer):
    g = torch.Generator().manual_seed(5)
    v = min(len(tokenizer), 200) - 5
    zipf = 1.0 / torch.arange(1, v + 1).float()  # a skewed unigram: the control learns it
    ids = 5 + torch.multinomial(zipf, 60 * 6, replacement=True, generator=g).view(60, 6)  # (N, T)
    return ids[:48], ids[48:]


def test_the_kept_probe_is_never_above_its_control(tokenizer, chunks_of):
    """Random embeddings (nothing to read): the kept probe's held-back CE is at most the control's; what was kept
    is recorded."""
    tr, ev = chunks_of
    opts = _opts(epochs=2, patience=2, select_decoder=True)
    g = torch.Generator().manual_seed(6)
    z_tr, z_ev = torch.randn(48, 5, generator=g), torch.randn(12, 5, generator=g)
    got = fit_decoders(opts, FitData(tokenizer, tr, ev, z_tr, z_ev), control=ControlStore({}, "k"))
    m, hist = got.probe.scores, got.probe.history
    hist_c = got.control.history
    best = [h["best_val_ce"] for h in hist if "best_val_ce" in h][-1]
    best_c = [h["best_val_ce"] for h in hist_c if "best_val_ce" in h][-1]
    # the contained probe's epoch 0 is the control's function summed in another order (its own width, the batched
    # group): equal up to float32 order noise, measured at 1.0e-5 of the CE on a CPU without AMX
    assert best <= best_c * (1 + 1e-4)
    start = m["start"]
    assert start["kept"] in ("control", "contained", "scratch")
    ce_c = start["control_first_run"] if start["kept"] == "scratch" else start["control"]  # its own control's
    assert ce_c == pytest.approx(best_c, rel=1e-5)
    assert best == pytest.approx(start[start["kept"]] if start["kept"] != "control" else start["contained"])
    assert m["decoder_choice"]["kept"] in ("plain", "bag_head")


def _scored(probe: DecoderScores, control: DecoderScores) -> Fit:
    """A fit of the probe's and the control's held-out scores: their numbers per chunk."""
    return Fit(probe_chunks=probe.chunks, control_chunks=control.chunks)


def test_a_probe_that_cannot_improve_keeps_epoch_0_and_reads_zero_bits(tokenizer, chunks_of):
    """No step can change the weights (learning rate 0): the probe kept is its control, bit for bit on the held-out
    chunks, reading exactly 0 bits; the cached control serves a second probe of another width."""
    tr, ev = chunks_of
    cache = {}
    fit_decoders(_opts(epochs=6, patience=6), FitData(tokenizer, tr, ev, *_data(60, d=5)[0].split([48, 12])),
                 control=ControlStore(cache, "k"))
    opts = _opts(lr=0.0, epochs=2, patience=3)
    g = torch.Generator().manual_seed(7)
    z_tr, z_ev = torch.randn(48, 9, generator=g), torch.randn(12, 9, generator=g)
    got = fit_decoders(opts, FitData(tokenizer, tr, ev, z_tr, z_ev), control=ControlStore(cache, "k"))
    m, hist = got.probe.scores, got.probe.history
    mc = got.control.scores
    assert m["start"]["scratch"] > m["start"]["control"]  # a random start, untrained: above the trained control
    assert m["start"]["kept"] == "control" and [h for h in hist if "best_step" in h][-1]["best_step"] == 0
    assert np.array_equal(m.chunks.nll, mc.chunks.nll)
    bits = interval_readings(opts, _scored(m, mc), ev, tokenizer)["bits_per_chunk"]
    assert bits.value == 0.0


def test_a_constant_embedding_of_another_width_reads_its_control(tokenizer, chunks_of):
    """A constant embedding has nothing to read: the probe is the cached control at the embedding's width, reading
    exactly 0 bits; the contained probe trained on it would run as the control's second run."""
    tr, ev = chunks_of
    cache, opts = {}, _opts(epochs=2, patience=2)
    fit_decoders(opts, FitData(tokenizer, tr, ev, *_data(60, d=5)[0].split([48, 12])), control=ControlStore(cache, "k"))
    z = torch.full((60, 7), 0.5)
    got = fit_decoders(opts, FitData(tokenizer, tr, ev, z[:48], z[48:]), control=ControlStore(cache, "k"))
    m, mc = got.probe.scores, got.control.scores
    assert m["run"].startswith("the cached control's") and got.probe.decoder.config.embed_dim == 7
    assert np.array_equal(m.chunks.nll, mc.chunks.nll)
    start = cache["k"].start  # the control's first run: where the probe starts
    probe = contain(_new_decoder(opts, FitData(tokenizer, tr, tr, z[:48], z[:48])), start)  # trained as the control's 2nd run
    (h_p,), _ = train_decoders([probe], [z[:48]], tr, opts, epoch0=True, lr_scales=[contained_shares(probe, opts)])
    assert [h["val_ce"] for h in h_p if "val_ce" in h] == [h["val_ce"] for h in got.control.history if h.get("run") == 2
                                                          and "val_ce" in h]
    assert interval_readings(opts, _scored(m, mc), ev, tokenizer)["bits_per_chunk"].value == 0.0


@pytest.mark.parametrize("share", [1.0, 0.1])
def test_the_control_s_weights_train_at_their_share_of_the_learning_rate(share):
    """A contained probe's optimiser holds the control's weights at ``contained_lr`` of the peak rate and the pathway
    at the full rate; each weight's first AdamW step (about its group's rate, as Adam's first step is sign-like)
    shows it: at a tenth the control's weights move a tenth as far as at the full rate, the pathway as far."""
    opts = _opts(contained_lr=share, epochs=1, warmup_fraction=0.0, min_lr_ratio=1.0, weight_decay=0.0,
                 clip_grad=0.0)
    z, ids = _data()
    const = z.mean(0, keepdim=True).expand_as(z)
    control = _new_decoder(opts, FitData(_Tok(), ids, ids, const, const))
    train_decoders([control], [const], ids, opts)
    probe = contain(_new_decoder(opts, FitData(_Tok(), ids, ids, z, z)), control)
    shares = contained_shares(probe, opts)
    path = set(probe.embedding_weights())
    assert (shares is None) == (share == 1.0)
    assert shares is None or (set(shares) == {n for n, p in probe.named_parameters() if p.requires_grad} - path
                              and set(shares.values()) == {share})
    group = DecoderGroup([probe], [z], ids, opts, lr_scale=shares)
    before = [p.detach().clone() for p in group.params]
    group.train_step(torch.arange(16), opts.lr)
    moved = {n: float((p.detach() - b).abs().max()) for n, p, b in zip(group.names, group.params, before)}
    body = [m for n, m in moved.items() if n not in path]
    assert max(moved[n] for n in path) == pytest.approx(opts.lr, rel=0.05)
    assert max(body) == pytest.approx(opts.lr * share, rel=0.05)
