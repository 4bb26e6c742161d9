"""Inversion from a pooled state (memlab invert --states last|mean): the gradient-guided swap search on tiny random
models (a causal llama with tied embeddings, a bidirectional BERT), its budgets, its control, and the command."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModel

from memlab.probes.invert.options import PooledOptions
from memlab.probes.invert.pooled.searcher import LanguageHead, PooledSearcher
from memlab.probes.invert.layer import LayerReader
from memlab.probes.readings import set_f1

V, T = 40, 5
LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             tie_word_embeddings=True)
BERT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def tiny(model_type: str, **kw):
    torch.manual_seed(0)
    return AutoModel.from_config(AutoConfig.for_model(model_type, vocab_size=V, **kw)).eval()


def _hits(got, true):
    return sum(a == b for a, b in zip(got, true))


@pytest.mark.parametrize("pool, model_type, cfg", [("last", "llama", LLAMA), ("mean", "bert", BERT)])
def test_search_closes_the_distance_and_beats_its_control(pool, model_type, cfg):
    torch.set_num_threads(1)
    reader = LayerReader(tiny(model_type, **cfg), 2)
    head = LanguageHead.of(reader) if model_type == "llama" else None
    opts = PooledOptions(forwards=1200, batch_size=32, topk=12, restarts=2, init="random")
    s = PooledSearcher(reader, pool, opts, head)
    seqs = torch.randint(0, V, (4, T), generator=torch.Generator().manual_seed(5))  # (4, T)
    targets = s.pooled(seqs)  # (4, D)
    hits = ctrl_hits = 0
    for i in range(len(seqs)):
        got = s.search(targets[i], T, seed=i)
        assert len(got.ids) == T and got.forwards <= opts.forwards
        assert got.distance < 0.5 * got.start_distance  # a much nearer sequence than the start
        # the distance reported is the one of the sequence returned
        z = s.pooled(torch.tensor([got.ids]))[0]
        assert abs(float((z - targets[i]).norm() / targets[i].norm()) - got.distance) < 1e-4
        ctrl = s.search(targets[(i + 1) % len(seqs)], T, seed=i)
        hits += _hits(got.ids, seqs[i].tolist())
        ctrl_hits += _hits(ctrl.ids, seqs[i].tolist())
    assert hits >= ctrl_hits + 4, (hits, ctrl_hits)  # 20 tokens; the control recovers about 20 / V by chance


def test_forward_and_seconds_budgets_are_honoured():
    reader = LayerReader(tiny("llama", **LLAMA), 2)
    target = torch.randn(32)
    for forwards in (1, 7, 100):
        got = PooledSearcher(reader, "last", PooledOptions(forwards=forwards, batch_size=16, restarts=3,
                                                           init="random")).search(target, T)
        assert got.forwards <= forwards
    got = PooledSearcher(reader, "last", PooledOptions(forwards=10**9, seconds=0.3, batch_size=8,
                                                       init="random")).search(target, T)
    assert got.seconds < 0.3 + 0.5 and got.forwards < 10**9


def test_prior_starts_from_the_models_greedy_text_and_stops_at_an_exact_match():
    reader = LayerReader(tiny("llama", **LLAMA), 2)
    head = LanguageHead.of(reader)
    assert head is not None
    greedy = head.continue_text([3], T, None)
    # the greedy text is what the model's own head prefers, step by step
    lp = head.logprobs(torch.tensor([[3] + greedy]))  # (1, T + 1, V)
    assert greedy == lp[0, :-1].argmax(-1).tolist()
    s = PooledSearcher(reader, "last", PooledOptions(forwards=500, prior_weight=0.01), head, prefix=[3])
    got = s.search(s.pooled(torch.tensor([greedy]))[0], T)
    assert got.ids == greedy and got.distance < 1e-4 and got.forwards == 1  # found at the start, nothing spent
    assert LanguageHead.of(LayerReader(tiny("llama", **dict(LLAMA, tie_word_embeddings=False)), 2)) is None


def test_token_set_f1():
    assert set_f1([1, 2, 3], [3, 2, 1]) == 1.0
    assert set_f1([1, 1], [2, 2]) == 0.0
    assert math.isclose(set_f1([1, 2], [2, 3]), 0.5)


def _cli(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv, says", [
    (["--states", "pooled"], "--states takes positions, last, mean, first, second_last, logits or space"),
    (["--states", "last", "--budget", "5"], "--budget applies to --states positions"),
    (["--states", "positions", "--forwards", "5"],
     "--forwards applies to --states last, mean, first, second_last, logits or space"),
    (["--states", "mean", "--init", "beam"], "--init takes greedy, sample or random"),
    (["--states", "last", "--forwards", "0"], "--forwards must be >= 1"),
    (["--states", "last", "--seconds", "x"], "--seconds takes a number"),
])
def test_cli_bad_input_one_line(argv, says, capsys, tmp_path):
    out = tmp_path / "run"
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", *argv, "--out", str(out), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error:") and says in lines[0], cap.err
    assert not out.exists()


def test_cli_pooled_run_reports_search_and_control(capsys, tmp_path):
    out = tmp_path / "run"
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--states", "last", "--seq-len", "4", "--n", "2",
                     "--forwards", "40", "--batch-size", "16", "--threads", "1", "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    assert rep["states"] == "last" and len(rep["chunks"]) == 2
    for c in rep["chunks"]:
        assert c["forwards"] <= 40 and len(c["recovered_ids"]) == len(c["true_ids"])
        assert c["control_of"] == (c["index"] + 1) % 2 and len(c["control_ids"]) == len(c["true_ids"])
    for key in ("exact_match", "token_accuracy", "token_f1", "distance", "control_token_accuracy"):
        r = rep["totals"][key]
        assert r["low"] <= r["value"] <= r["high"]
    assert "control" in cap.out and "token-set F1" in cap.out
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--states", "last", "--out", str(out), capsys=capsys)
    assert code == 2 and (out / "report.json").is_file()  # a used folder is refused and left as it was


def test_cli_mean_on_a_bidirectional_encoder(capsys, tmp_path):
    from memlab import assets

    if not assets.is_installed("minilm"):
        pytest.skip("the minilm asset is not installed")
    code, cap = _cli("--model", "minilm", "--layer", "2", "--states", "mean", "--seq-len", "4", "--n", "2",
                     "--forwards", "20", "--batch-size", "10", "--threads", "1", "--out", str(tmp_path / "r"),
                     capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["search"]["causal"] is False and rep["prior"] is False and rep["text"]["suffix"]
    code, cap = _cli("--model", "minilm", "--layer", "2", "--states", "mean", "--prior-weight", "1", "--n", "1",
                     "--out", str(tmp_path / "p"), capsys=capsys)
    assert code == 2 and "bidirectional" in cap.err and not (tmp_path / "p").exists()
