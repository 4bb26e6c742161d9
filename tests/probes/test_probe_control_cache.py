"""The control cache on disk: a later probe with the same ``cache_dir`` reuses the trained control."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from memlab.devices import native_bf16, pretend
from memlab.probes.decoder import fit as train
from memlab.probes.decoder.control_cache import FOLDER, compute_side, decode, encode
from memlab.probes.run import load_options, run_probe

TINY = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=6", "n_train=64", "n_eval=16",
        "epochs=1", "n_examples=2", "ci_resamples=100"]

pytestmark = pytest.mark.usefixtures("one_thread")


class FirstTokens:
    """A toy encoder: one-hot of a chunk's first two tokens."""

    name, pool, layer, max_length = "first-tokens", "oracle", None, None

    def __init__(self, tokenizer, scale: float = 1.0):
        self.tokenizer, self.v, self.scale = tokenizer, len(tokenizer), scale
        self.dim = 2 * self.v

    def describe(self):
        return {"name": self.name, "dim": self.dim, "scale": self.scale}

    def encode(self, ids, mask):
        z = torch.zeros(ids.shape[0], 2, self.v)  # (B, 2, V)
        z.scatter_(2, ids[:, :2, None], self.scale)
        return z.flatten(1)  # (B, 2V)


@pytest.fixture
def control_runs(monkeypatch):
    """Counts the training runs of control decoders (each control is trained twice: a first and a second run)."""
    runs = {"n": 0}
    real = train.train_decoders

    def counted(*a, desc: str = "", **k):
        runs["n"] += desc.startswith("control")
        return real(*a, desc=desc, **k)

    monkeypatch.setattr(train, "train_decoders", counted)
    return runs


@pytest.fixture
def greedy_scorings(monkeypatch):
    """Counts the greedy reconstructions scored (one per decoder whose metrics are read)."""
    n = {"n": 0}
    real = train.reconstruction_scores

    def counted(*a, **k):
        n["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(train, "reconstruction_scores", counted)
    return n


def _probe(tokenizer, corpus, cache, encoder=None, **kw):
    opts = load_options(None, TINY, model="oracle", corpus=str(corpus), cache_dir=str(cache), device="cpu", **kw)
    return run_probe(opts, encoder=encoder or FirstTokens(tokenizer))


def test_a_second_probe_reuses_the_control_from_disk(tokenizer, small_corpus, tmp_path, control_runs, capsys,
                                                      greedy_scorings):
    a = _probe(tokenizer, small_corpus, tmp_path)
    # the probe's and the control's; the control's first run only when the scratch probe is kept (it is read then)
    assert greedy_scorings["n"] == (3 if a["probe"]["start"]["kept"] == "scratch" else 2)
    assert control_runs["n"] == 2 and a["control_shared_with"] is None and a["timing"]["control_s"] > 0
    entries = [p for p in (tmp_path / FOLDER).iterdir()]
    assert len(entries) == 1
    assert {p.name for p in entries[0].iterdir()} == {"control.safetensors", "start.safetensors", "entry.json"}
    json.loads((entries[0] / "entry.json").read_text())  # plain JSON, no pickle anywhere
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.rglob("*.pt"))

    b = _probe(tokenizer, small_corpus, tmp_path)  # a new process would read the same folder: no control trained
    assert control_runs["n"] == 2
    assert b["control_shared_with"] == "oracle" and b["timing"]["control_s"] == 0.0
    for k in ("probe", "control", "readings", "retention", "information_gain", "examples"):
        assert b[k] == a[k], k

    c = _probe(tokenizer, small_corpus, tmp_path, encoder=FirstTokens(tokenizer, scale=2.0))  # another encoder
    assert control_runs["n"] == 2 and c["control"] == a["control"]

    d = _probe(tokenizer, small_corpus, tmp_path, lr=1e-3)  # another decoder option: its own control
    assert control_runs["n"] == 4 and d["control_shared_with"] is None
    assert len(list((tmp_path / FOLDER).iterdir())) == 2
    side = compute_side("cpu")
    with pretend(bf16=not native_bf16("cpu")):  # the other compute dtype: a control of its own
        other = compute_side("cpu")
        e = _probe(tokenizer, small_corpus, tmp_path)
    assert other != side and control_runs["n"] == 6 and e["control_shared_with"] is None
    assert sorted(p.name.split("-", 1)[1] for p in (tmp_path / FOLDER).iterdir()) == sorted([side, side, other])
    assert "warning" not in capsys.readouterr().err


def test_a_damaged_or_partial_entry_is_trained_again(tokenizer, small_corpus, tmp_path, control_runs, capsys):
    a = _probe(tokenizer, small_corpus, tmp_path)
    (entry,) = (tmp_path / FOLDER).iterdir()
    w = entry / "control.safetensors"
    w.write_bytes(w.read_bytes()[:100])  # truncated weights
    capsys.readouterr()
    b = _probe(tokenizer, small_corpus, tmp_path)
    assert control_runs["n"] == 4 and b["control_shared_with"] is None  # retrained, not crashed
    err = capsys.readouterr().err
    assert err.count("control cache") == 1 and "damaged" in err and "Traceback" not in err  # named once
    assert b["readings"] == a["readings"]
    (entry / "entry.json").unlink()  # a partial entry
    c = _probe(tokenizer, small_corpus, tmp_path)
    assert control_runs["n"] == 6 and c["control_shared_with"] is None
    d = _probe(tokenizer, small_corpus, tmp_path)  # the entry was replaced by a whole one
    assert control_runs["n"] == 6 and d["control_shared_with"] == "oracle"
    info = json.loads((entry / "entry.json").read_text())
    (entry / "entry.json").write_text(json.dumps({**info, "format": "memlab-probe-control-0"}))  # an older layout
    capsys.readouterr()
    e = _probe(tokenizer, small_corpus, tmp_path)
    assert control_runs["n"] == 8 and e["control_shared_with"] is None
    assert "another layout" in capsys.readouterr().err


def test_a_kept_scratch_probe_scores_the_first_run_once(tokenizer, small_corpus, tmp_path, monkeypatch,
                                                       greedy_scorings):
    real = train.train_decoders

    def first_run_loses(*a, desc: str = "", **k):
        hists, secs = real(*a, desc=desc, **k)
        if desc == "control decoder":  # the control's first run: a held-back CE that any probe beats
            hists = [h + [{"best_val_ce": 1e9}] for h in hists]
        return hists, secs

    monkeypatch.setattr(train, "train_decoders", first_run_loses)
    a = _probe(tokenizer, small_corpus, tmp_path)
    assert a["probe"]["start"]["kept"] == "scratch" and greedy_scorings["n"] == 3
    b = _probe(tokenizer, small_corpus, tmp_path)
    assert greedy_scorings["n"] == 4  # the probe alone: the first run's scores were kept with the control
    assert b["control_shared_with"] == "oracle" and b["control"] == a["control"] and b["readings"] == a["readings"]


def test_entry_values_round_trip_exactly():
    x = {"ce": 0.1 + 0.2, "nan": float("nan"), "per": {"nll": np.array([1 / 3, 2.5e-300]), "hits": np.arange(3)},
         "pair": (1, "a"), "by_k": {1: 0.5, 5: 0.25}, "n": np.int64(7), "none": None}
    back = decode(json.loads(json.dumps(encode(x))))
    assert back["per"]["nll"].dtype == np.float64 and back["per"]["hits"].dtype == x["per"]["hits"].dtype
    assert np.array_equal(back["per"]["nll"], x["per"]["nll"]) and back["ce"] == x["ce"]
    assert back["pair"] == (1, "a") and back["by_k"] == {1: 0.5, 5: 0.25} and back["n"] == 7
    assert np.isnan(back["nan"]) and back["none"] is None
    with pytest.raises(TypeError):
        encode({"t": torch.zeros(1)})
