"""The bag-of-words head is a member of the probe's fit loop: one optimiser with the decoders (its own param group),
the same batches, its own early stopping on its own held-back loss; alone when no sequence decoder is fitted."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from memlab.app.cli import main
from memlab.probes.readouts import bow
from memlab.probes.decoder import fitloop
from memlab.probes.options import ProbeOptions
from memlab.probes.sections import BowOptions
from memlab.probes.decoder.fit import build_decoder

from conftest import SixtyTokens

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int = 96, t: int = 7):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 40, (n, t), generator=g)  # (N, T)
    ids[::4, 5:] = -1  # padded chunks
    bag = torch.nn.functional.one_hot(ids.clamp(min=0), 60).float().sum(1)  # (N, V): the chunk's tokens
    return bag @ torch.randn(60, 12, generator=g), ids  # (N, 12): a bag code


def _opts(**kw) -> ProbeOptions:
    base = {"hidden_size": 16, "num_heads": 2, "num_layers": 1, "seq_len": 7, "epochs": 3, "batch_size": 16,
            "patience": 2, "val_fraction": 0.25, "lr": 5e-3, "device": "cpu", "progress": False}
    return replace(ProbeOptions(), **{**base, **kw})


def _decoder(opts, z, ids):
    dec = build_decoder(z.shape[1], SixtyTokens(), ids, opts)
    dec.set_normalization(z)
    return dec


def test_the_head_trains_in_the_decoders_optimiser_and_stops_on_its_own_loss(monkeypatch):
    z, ids = _data()
    opts = _opts()
    head = bow.BagHeadMember(z, ids, ids[:8], BowOptions(bow_lr=0.05), opts)
    built = []
    real = fitloop.optimiser
    monkeypatch.setattr(fitloop, "optimiser", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    dec = _decoder(opts, z, ids)
    alone = _decoder(opts, z, ids)
    (h_dec,), _ = fitloop.train_decoders([dec], [z], ids, opts, readouts=(head,))
    head_ids = {id(p) for p in head.head.parameters()}
    holders = [o for o in built if head_ids & {id(p) for g in o.param_groups for p in g["params"]}]
    assert holders, "no optimiser of the loop holds the head"
    opt = holders[0]  # the loop's (the group builds one of its own for single steps too)
    held = {id(p): g["base_lr"] for g in opt.param_groups for p in g["params"]}
    assert head_ids <= set(held)  # one optimiser holds the head and the decoders
    assert {held[id(p)] for p in head.head.parameters()} == {0.05}  # the head at its own peak learning rate
    assert opts.lr in held.values()
    val = [h["val_ce"] for h in head.history if "val_ce" in h]
    best = head.history[-1]
    assert best["best_val_ce"] == min(val) and len(val) >= 2  # its own held-back loss, its own best epoch
    _, rows = fitloop.held_back_rows(ids.shape[0], opts.val_fraction, torch.Generator().manual_seed(opts.seed))
    assert float(head.held_back_ce(rows)) == best["best_val_ce"]  # it ends with its best epoch's weights
    (h_alone,), _ = fitloop.train_decoders([alone], [z], ids, opts)
    assert h_dec == h_alone  # the head beside it changes nothing of the decoder's run


def test_a_head_that_over_fits_stops_while_the_decoder_trains_on():
    z, ids = _data()
    opts = _opts(epochs=4, patience=1)
    head = bow.BagHeadMember(z, ids, ids[:8], BowOptions(bow_lr=5.0), opts)  # far too large: worse after epoch 1
    (h_dec,), _ = fitloop.train_decoders([_decoder(opts, z, ids)], [z], ids, opts, readouts=(head,), epoch0=True)
    steps = [h["step"] for h in head.history if "val_ce" in h]
    assert head.history[-1]["best_step"] == 0  # the start (the prior) is its best: it keeps it
    assert max(steps) < max(h["step"] for h in h_dec if "val_ce" in h)  # it left the loop first
    result = head.result(z[:8], ids[:8])
    assert result["recovered"] == result["prior"]  # back at its start: the prior's scores


def test_the_read_out_alone_reads_a_bag_code(tmp_path):
    out = tmp_path / "run"
    args = ["probe", "--model", "synthetic:bag", "--out", str(out), "sequence=false", "seq_len=8", "n_train=600",
            "n_eval=32", "epochs=4", "batch_size=32", "--threads", "1"]
    assert main(args) == 0
    rep = json.loads((out / "report.json").read_text())
    b = rep["readouts"]["bow"]
    assert rep["probe"] is None and b["recovered"] > b["prior"] + 0.2  # the set is read, no decoder fitted
    assert b["best_step"] is not None and b["epochs"] >= 1
