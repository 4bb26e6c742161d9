"""The whitened distance the pooled correction descends: its metric, what it leaves unchanged (the reported
distance, the certificate, the target's own text at zero) and the command's use of it."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel

from memlab.probes.invert.pooled.correct import CorrectOptions
from memlab.probes.invert.pooled.searcher import PooledOptions, PooledSearcher
from memlab.probes.invert.pooled.recover import Recoverer
from memlab.probes.invert.layer import LayerReader

V, T = 40, 5


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    bert = AutoModel.from_config(AutoConfig.for_model("bert", vocab_size=V, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=4)).eval()
    return PooledSearcher(LayerReader(bert, 2), "mean", PooledOptions())


def chunks(n: int, seed: int) -> list[list[int]]:
    return torch.randint(2, V, (n, T), generator=torch.Generator().manual_seed(seed)).tolist()


def test_whitening_gives_the_chunks_unit_covariance_and_shrinks_toward_the_plain_distance(encoder):
    train = chunks(400, 0)
    z = encoder.pooled(torch.tensor(train)).double()  # (N, D)
    cov = torch.cov(z.T)
    w, mean = encoder.whitening(train, keep=1.0)
    assert torch.allclose(mean.double(), z.mean(0), atol=1e-5)
    lam, vec = torch.linalg.eigh(cov)
    used = vec[:, lam > 1e-3 * lam.max()]  # the directions the states vary along (a normalised state has fewer)
    white = used.T @ w.double() @ cov @ w.double() @ used  # W S W with W = S^{-1/2}: the identity there
    assert torch.allclose(white, torch.eye(used.shape[1], dtype=torch.float64), atol=1e-3)
    w0, _ = encoder.whitening(train, keep=0.0)  # every eigenvalue at their mean: a multiple of the identity
    scale = w0.diagonal().mean()
    assert torch.allclose(w0, scale * torch.eye(len(w0)), atol=1e-5 * float(scale))
    w9, _ = encoder.whitening(train, keep=0.9)  # in between: it stretches the states' narrow directions, less

    def spread(m):  # the largest over the smallest variance of the whitened states, along the directions used
        e = torch.linalg.eigvalsh(used.T @ m.double() @ cov @ m.double() @ used)
        return float(e.max() / e.min())

    keep_all = lam[lam > 1e-3 * lam.max()]
    assert spread(w) < 1.01 < spread(w9) < spread(w0) == pytest.approx(float(keep_all.max() / keep_all.min()), rel=1e-3)


def test_the_metric_changes_what_the_search_descends_not_what_it_reports(encoder):
    train, test = chunks(400, 0), torch.tensor(chunks(6, 1))
    target = encoder.pooled(test[:1])[0]
    plain_obj, plain_d = encoder.objective(test, target)
    encoder.set_metric(*encoder.whitening(train, keep=1.0))
    try:
        obj, d = encoder.objective(test, target)
        assert torch.allclose(d, plain_d) and float(d[0]) < 1e-5  # the reported distance is the plain one
        assert float(obj[0]) < 1e-10 and not torch.allclose(obj, plain_obj)  # the target's own text stays at zero
        assert obj[1:].argsort().tolist() != plain_obj[1:].argsort().tolist() or not torch.allclose(
            obj[1:] / obj[1:].sum(), plain_obj[1:] / plain_obj[1:].sum())
        # the gradient ranking and the bfloat16 screen read the same metric
        s = encoder.scores(test[1], target)  # (T, V)
        assert s.shape == (T, V) and torch.isfinite(s).all()
        # a chunk recovered under the metric is certified on the plain distance
        rec = Recoverer(encoder, CorrectOptions(batch_size=64, topk=16), method="correct", forwards=6000, pad_id=1)
        got = rec.search(target, T, seed=0)
        z = encoder.pooled(torch.tensor([got.ids]))[0]
        assert got.distance == pytest.approx(float((z - target).norm() / target.norm()), abs=1e-6)
    finally:
        encoder.set_metric(None)
    assert torch.allclose(encoder.objective(test, target)[0], plain_obj)


def test_command_whitens_by_default_and_reports_it(tmp_path, capsys):
    from memlab.app.cli import main

    base = ["invert", "--model", "memlab-lm", "--layer", "2", "--states", "last", "--seq-len", "4", "--n", "2",
            "--forwards", "40", "--batch-size", "10", "--threads", "1", "--no-control"]
    assert main(base + ["--whiten-chunks", "64", "--out", str(tmp_path / "w")]) == 0
    rep = json.loads((tmp_path / "w" / "report.json").read_text())
    assert rep["search"]["whiten"] == 0.9 and rep["search"]["whitening_chunks"] == 64
    summary = (tmp_path / "w" / "summary.txt").read_text()
    assert "distance whitened (0.9, 64 training chunks)" in summary and "whitening (64 training chunks'" in summary
    assert main(base + ["--whiten", "0", "--out", str(tmp_path / "p")]) == 0
    rep = json.loads((tmp_path / "p" / "report.json").read_text())
    assert rep["search"]["whitening_chunks"] == 0 and "whitened" not in (tmp_path / "p" / "summary.txt").read_text()
    assert main(base + ["--whiten", "1.5", "--out", str(tmp_path / "bad")]) == 2
    assert "--whiten must be <= 1" in capsys.readouterr().err and not (tmp_path / "bad").exists()
