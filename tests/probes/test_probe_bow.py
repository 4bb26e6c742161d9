"""The bag-of-words read-out with sparse labels: the multi-hot labels built a batch at a time on the probe's device,
never the N x n matrix, with the dense matrix's counts."""

from __future__ import annotations

import pytest
import torch

from memlab.probes.readouts import bow
from memlab.probes.sections import FitSection


def _chunks(n: int, vocab: int = 60, t: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, t), generator=g)  # (n, T)
    ids[::4, 5:] = -1  # padded chunks
    z = torch.nn.functional.one_hot(ids.clamp(min=0), vocab).float().sum(1)  # (n, V): a bag of the tokens
    z = z @ torch.randn(vocab, 24, generator=g) + 0.3 * torch.randn(n, 24, generator=g)  # (n, 24), noisy
    return z, ids


def test_sparse_labels_are_the_dense_multi_hot_a_batch_at_a_time(monkeypatch):
    z, ids = _chunks(300)
    ids[-20:, 0] = 61  # an id seen only in held-out chunks: it counts in k but is never predicted
    kept = torch.unique(ids[:240][ids[:240] >= 0])  # (n,)
    to_compact = torch.full((62,), kept.numel(), dtype=torch.long)
    to_compact[kept] = torch.arange(kept.numel())
    dense = bow.multi_hot(ids[:240], to_compact, kept.numel())  # (N, n): every label at once
    rows = []
    real = bow.multi_hot
    monkeypatch.setattr(bow, "multi_hot", lambda i, c, n: rows.append(i.shape[0]) or real(i, c, n))
    fit = FitSection(epochs=4, batch_size=32)
    out = bow.fit_bow(z[:240], ids[:240], z[240:], ids[240:], fit=fit, device="cpu")
    fitted = list(rows)
    labels = bow._Labels(ids[:240], ids[240:], torch.device("cpu"))
    assert torch.equal(labels(ids[:240]), dense) and torch.equal(labels.prior(ids[:240], 32), dense.mean(0))
    prior = bow.recovered_per_chunk(dense.mean(0).expand(60, -1), ids[240:], kept)
    assert out["_per_chunk"]["prior"] == prior and out["device"] == "cpu"  # the same counts, exactly
    assert out["recovered"] > out["prior"] + 0.1  # the bag is read, not just the prior
    assert 0 < max(fitted) <= 32  # labels exist one batch at a time, never for all 240 chunks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_the_read_out_fits_on_the_gpu():
    z, ids = _chunks(200)
    cpu = bow.fit_bow(z[:160], ids[:160], z[160:], ids[160:], fit=FitSection(epochs=5))
    gpu = bow.fit_bow(z[:160], ids[:160], z[160:], ids[160:], fit=FitSection(epochs=5), device="cuda")
    assert gpu["device"].startswith("cuda") and gpu["prior"] == cpu["prior"]
    assert gpu["recovered"] == pytest.approx(cpu["recovered"], abs=0.05)
