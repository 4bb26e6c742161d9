"""The relaxation search (memlab invert --method relax | relax-correct) and the next-token target (--states
logits) on tiny random models: chunks recovered and certified from a last-token state, a mean pool and a
next-token distribution; the batch's bookkeeping; the command end to end; a refusal for each bad value."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModel

from memlab.probes.invert.options import PooledOptions
from memlab.probes.invert.pooled.searcher import LanguageHead, PooledSearcher
from memlab.probes.invert.pooled.relax import RelaxJob, Relaxer, RelaxOptions
from memlab.probes.invert.pooled.relaxed import groups
from memlab.probes.invert.layer import LayerReader

V, T = 48, 4
LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             tie_word_embeddings=True)


def tiny_llama():
    torch.manual_seed(0)
    return AutoModel.from_config(AutoConfig.for_model("llama", vocab_size=V, **LLAMA)).eval()


def _searcher(pool: str):
    reader = LayerReader(tiny_llama(), 2)
    return PooledSearcher(reader, pool, PooledOptions(), LanguageHead.of(reader))


@pytest.mark.parametrize("pool, loss", [("last", "log"), ("logits", "log"), ("mean", "log")])
def test_relaxation_recovers_and_certifies_chunks(pool, loss):
    torch.set_num_threads(1)
    s = _searcher(pool)
    seqs = torch.randint(0, V, (4, T), generator=torch.Generator().manual_seed(5))  # (4, T)
    targets = s.pooled(seqs)  # (4, D)
    out = Relaxer(s, RelaxOptions(steps=400, rows=4, loss=loss)).run([RelaxJob(targets[i], T, i) for i in range(4)],
                                                                     120)
    assert len(out) == 4
    certified = 0
    for i, r in enumerate(out):
        assert len(r.ids) == T and r.steps >= 1 and 4 * r.steps < r.forwards <= 8 * r.steps  # 4 rows, each run once
        z = s.pooled(torch.tensor([r.ids]))[0]  # the distance reported is the one of the sequence returned
        d = float((z - targets[i]).norm() / targets[i].norm())
        assert abs(d - r.distance) < 1e-4
        assert r.certified == (r.distance <= 1e-5)
        if r.certified:
            certified += 1
            assert r.ids == seqs[i].tolist()  # on these chunks a certified answer is the chunk itself
            assert r.steps < 400  # a certified target leaves the batch
    assert certified >= 2, [(r.certified, round(r.distance, 4)) for r in out]


def test_the_logits_vector_is_the_models_next_token_distribution():
    s = _searcher("logits")
    ids = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))
    got = s.pooled(ids)  # (3, V)
    head = s.head
    want = head.logprobs(ids)[:, -1]  # the head's own next-token log-probabilities
    assert got.shape == (3, V) and torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(got.exp().sum(-1), torch.ones(3), atol=1e-4)


def test_banned_tokens_get_no_weight_and_a_relaxation_that_cannot_certify_keeps_its_nearest():
    s = _searcher("last")
    seqs = torch.randint(1, V, (2, T), generator=torch.Generator().manual_seed(2))
    targets = s.pooled(seqs)
    banned = [int(seqs[0, 0])]  # the first chunk's first token cannot be used: never certified exactly
    out = Relaxer(s, RelaxOptions(steps=60, rows=2), banned=banned).run(
        [RelaxJob(targets[i], T, i) for i in range(2)], 30)
    assert banned[0] not in out[0].ids
    assert not out[0].certified and math.isfinite(out[0].distance) and out[0].steps == 60


def test_a_projection_run_before_is_not_run_again():
    """A row whose argmax tokens are the ones it ran the step before costs its relaxed pass only: with the logits
    held still (no learning rate, no decay) the one projection is run once, and the nearest is still the one it
    gives."""
    s = _searcher("last")
    seqs = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(4))
    t = s.pooled(seqs)[0]
    out = Relaxer(s, RelaxOptions(steps=7, rows=1, lr=0.0, decay=1.0, reinit=0)).run([RelaxJob(t, T, 0)], 30)[0]
    assert out.steps == 7 and out.forwards == 7 + 1
    z = s.pooled(torch.tensor([out.ids]))[0]
    assert abs(float((z - t).norm() / t.norm()) - out.distance) < 1e-4
    moving = Relaxer(s, RelaxOptions(steps=7, rows=1)).run([RelaxJob(t, T, 0)], 30)[0]
    assert moving.forwards > 7 + 1  # a moving mixture changes its projection, and each new one is run


def test_the_huber_loss_reads_the_logits_whatever_their_constant():
    """huber compares the log-probabilities centred on their mean: a constant added to either side changes nothing,
    and a state target refuses it."""
    s = _searcher("logits")
    r = Relaxer(s, RelaxOptions(loss="huber"))
    z, t = torch.randn(2, V), torch.randn(2, V)
    assert torch.allclose(r._loss(z + 3.0, t - 1.5), r._loss(z, t), atol=1e-6)
    assert float(r._loss(t, t).abs().max()) == 0.0 and bool((r._loss(z, t) > 0).all())
    with pytest.raises(ValueError, match="huber"):
        Relaxer(_searcher("last"), RelaxOptions(loss="huber"))


def test_budget_stops_the_batch_and_lengths_must_agree():
    s = _searcher("last")
    targets = s.pooled(torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(3)))
    out = Relaxer(s, RelaxOptions(steps=10**6, rows=1)).run([RelaxJob(targets[0], T, 0)], 0.3)
    assert out[0].seconds < 5 and out[0].steps < 10**6
    with pytest.raises(ValueError, match="one length"):
        Relaxer(s, RelaxOptions()).run([RelaxJob(targets[0], T, 0), RelaxJob(targets[1], T + 1, 1)], 1)


def test_groups_keep_order_and_one_length():
    chunks = [[0] * n for n in (4, 4, 5, 4, 5, 4, 4)]
    assert groups([0, 1, 2, 3, 4, 5, 6], chunks, 2) == [[0, 1], [2, 4], [3, 5], [6]]
    assert groups([6, 2], chunks, 4) == [[6], [2]]


def _cli(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("states", ["logits"])
def test_cli_relax_correct_reports_the_relaxation(states, capsys, tmp_path):
    out = tmp_path / "run"
    layer = [] if states == "logits" else ["--layer", "-1"]
    code, cap = _cli("--model", "memlab-lm", *layer, "--states", states, "--method", "relax-correct",
                     "--chunk-by", "tokens", "--seq-len", "3", "--n", "2", "--relax-steps", "60",
                     "--relax-group", "2", "--gflops", "inf", "--seconds", "1.5", "--forwards", "100",
                     "--threads", "1", "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    assert rep["states"] == states and rep["search"]["method"] == "relax-correct" and len(rep["chunks"]) == 2
    assert rep["search"]["relax_loss"] == "huber"  # auto, resolved for the next-token distribution
    for c in rep["chunks"]:
        assert 1 <= c["relax_steps"] <= 60 and c["distance"] <= c["relax_distance"] + 1e-9
        assert c["forwards"] <= 100  # the relaxation and the correction share --forwards
        assert c["certified"] == (c["distance"] <= rep["search"]["tol"])
        assert c["control_of"] == (c["index"] + 1) % 2
    assert "relaxation:" in cap.out and "relax-correct" in cap.out
    lines = (out / "chunks.jsonl").read_text().strip().splitlines()
    assert len(lines) == 2  # each chunk kept as its batch ended


@pytest.mark.parametrize("argv, says", [
    (["--states", "logits", "--layer", "1"], "--states logits reads the next-token distribution after the last block"),
    (["--states", "last", "--layer", "2", "--method", "relaxx"], "--method takes propose-correct, relax-correct"),
    (["--states", "last", "--layer", "2", "--relax-lr", "-1"], "--relax-lr must be >= 0"),
    (["--states", "last", "--layer", "2", "--relax-decay", "1.5"], "--relax-decay must be <= 1"),
    (["--states", "last", "--layer", "2", "--relax-share", "2"], "--relax-share must be <= 1"),
    (["--states", "last", "--layer", "2", "--relax-rows", "0"], "--relax-rows must be >= 1"),
    (["--states", "last", "--layer", "2", "--relax-temp", "0"], "--relax-temp must be >= 1e-06"),
    (["--states", "positions", "--layer", "2", "--relax-steps", "5"], "--relax-steps applies to --states last"),
    (["--states", "last", "--layer", "2", "--method", "relax", "--relax-loss", "huber"],
     "--relax-loss huber compares next-token log-probabilities: it needs --states logits"),
    (["--states", "last", "--layer", "2", "--relax-loss", "kl"], "--relax-loss takes auto, huber or log"),
])
def test_cli_bad_relax_values_one_line(argv, says, capsys, tmp_path):
    out = tmp_path / "run"
    code, cap = _cli("--model", "memlab-lm", *argv, "--out", str(out), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error:") and says in lines[0], cap.err
    assert not out.exists()


def test_cli_logits_on_a_bidirectional_encoder_is_refused(capsys, tmp_path):
    from memlab import assets

    if not assets.is_installed("minilm"):
        pytest.skip("the minilm asset is not installed")
    code, cap = _cli("--model", "minilm", "--states", "logits", "--n", "1", "--out", str(tmp_path / "r"),
                     capsys=capsys)
    assert code == 2 and "next-token distribution" in cap.err and "bidirectional" in cap.err
    assert not (tmp_path / "r").exists()
