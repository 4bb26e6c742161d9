"""The bag-of-words read-out with sparse labels: the same readings as the dense N x n multi-hot fit, with labels
built a batch at a time on the probe's device."""

from __future__ import annotations

import pytest
import torch

from memlab.probes import bow


def _dense_reference(z_train, ids_train, z_eval, ids_eval, epochs=60, lr=1e-2, weight_decay=1e-4, batch_size=256,
                     val_fraction=0.1, patience=5, seed=0) -> dict:
    """The read-out as first written: the whole (N, n) multi-hot label matrix held at once."""
    gen = torch.Generator().manual_seed(seed)
    kept = torch.unique(ids_train[ids_train >= 0])  # (n,)
    to_compact = torch.full((int(max(ids_train.max(), ids_eval.max())) + 1,), kept.numel(), dtype=torch.long)
    to_compact[kept] = torch.arange(kept.numel())
    y = bow.multi_hot(ids_train, to_compact, kept.numel())  # (N, n): every label at once
    mean, std = z_train.mean(0), z_train.std(0).clamp(min=1e-6)
    x = (z_train - mean) / std  # (N, D)
    prior = y.mean(0)  # (n,)
    torch.manual_seed(seed)
    head = torch.nn.Linear(x.shape[1], kept.numel())
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.logit(prior.clamp(1e-4, 1 - 1e-4)))
    order = torch.randperm(x.shape[0], generator=gen)
    n_val = int(round(val_fraction * x.shape[0])) if x.shape[0] > 20 else 0
    val, tr = order[:n_val], order[n_val:]
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    best, state, bad, ep = float("inf"), None, 0, 0
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for ep in range(1, epochs + 1):
        perm = tr[torch.randperm(tr.numel(), generator=gen)]
        for i in range(0, perm.numel(), batch_size):
            b = perm[i : i + batch_size]
            opt.zero_grad(set_to_none=True)
            bce(head(x[b]), y[b]).backward()
            opt.step()
        with torch.no_grad():
            v = float(bce(head(x[val]), y[val]))
        if v < best:
            best, bad, state = v, 0, {k: t.clone() for k, t in head.state_dict().items()}
        elif (bad := bad + 1) >= patience:
            break
    head.load_state_dict(state)
    with torch.no_grad():
        scores = head((z_eval - mean) / std)  # (M, n)
    return {"recovered": bow.recovered_per_chunk(scores, ids_eval, kept),
            "prior": bow.recovered_per_chunk(prior.expand(ids_eval.shape[0], -1), ids_eval, kept), "epochs": ep}


def _chunks(n: int, vocab: int = 60, t: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, t), generator=g)  # (n, T)
    ids[::4, 5:] = -1  # padded chunks
    z = torch.nn.functional.one_hot(ids.clamp(min=0), vocab).float().sum(1)  # (n, V): a bag of the tokens
    z = z @ torch.randn(vocab, 24, generator=g) + 0.3 * torch.randn(n, 24, generator=g)  # (n, 24), noisy
    return z, ids


def test_sparse_labels_give_the_dense_readings(monkeypatch):
    z, ids = _chunks(300)
    ids[-20:, 0] = 61  # an id seen only in held-out chunks: it counts in k but is never predicted
    kw = dict(epochs=12, batch_size=32, patience=3)
    ref = _dense_reference(z[:240], ids[:240], z[240:], ids[240:], **kw)
    rows = []
    real = bow.multi_hot
    monkeypatch.setattr(bow, "multi_hot", lambda i, c, n: rows.append(i.shape[0]) or real(i, c, n))
    out = bow.fit_bow(z[:240], ids[:240], z[240:], ids[240:], device="cpu", **kw)
    assert out["epochs"] == ref["epochs"] and out["device"] == "cpu"
    assert out["_per_chunk"]["prior"] == ref["prior"]  # the same counts, exactly
    assert out["_per_chunk"]["recovered"] == pytest.approx(ref["recovered"], abs=1e-6)
    assert out["recovered"] > out["prior"] + 0.1  # the bag is read, not just the prior
    assert max(rows) <= 32  # labels exist one batch at a time, never for all 240 chunks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_the_read_out_fits_on_the_gpu():
    z, ids = _chunks(200)
    cpu = bow.fit_bow(z[:160], ids[:160], z[160:], ids[160:], epochs=5, batch_size=32)
    gpu = bow.fit_bow(z[:160], ids[:160], z[160:], ids[160:], epochs=5, batch_size=32, device="cuda")
    assert gpu["device"].startswith("cuda") and gpu["prior"] == cpu["prior"]
    assert gpu["recovered"] == pytest.approx(cpu["recovered"], abs=0.05)
