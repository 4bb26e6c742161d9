"""Bag-of-words read-out: which tokens does one embedding hold, order aside?

A linear multi-label head (logistic regression over the token ids seen in
training, on embeddings standardised with training statistics) reads the set
of tokens of a chunk from its cached embedding. It is scored on held-out
chunks by its **recovered share**: for each chunk with ``k`` distinct tokens,
the share of those tokens among the head's ``k`` highest-scoring ids,
averaged over chunks. Its control, the **prior**, predicts the ``k`` tokens
found in the most training chunks for every chunk: what knowing the language's
word frequencies gives. Cheap (seconds on cached embeddings) and
data-efficient: it reads content where a sequence decoder cannot yet read
order.
"""

from __future__ import annotations

import torch


def multi_hot(ids: torch.Tensor, to_compact: torch.Tensor, n: int) -> torch.Tensor:
    """(N, T) token ids -> (N, n) 0/1 float: which compact ids occur in each chunk (unseen ids dropped)."""
    c = torch.where(ids >= 0, to_compact[ids.clamp(min=0)], n)  # (N, T), n for unseen ids and PAD
    out = torch.zeros(ids.shape[0], n + 1)  # (N, n+1)
    out.scatter_(1, c, 1.0)
    return out[:, :n]  # (N, n)


def recovered_per_chunk(scores: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor) -> list[float]:
    """Each chunk's |top-k ids of ``scores`` (N, n) ∩ distinct ids of ``ids`` (N, T), PAD skipped| / k."""
    out = []
    for s, row in zip(scores, ids.tolist()):
        true = {t for t in row if t >= 0}
        k = len(true)
        top = kept[s.topk(min(k, s.shape[0])).indices].tolist()
        out.append(len(true & set(top)) / k)
    return out


def recovered_share(scores: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor) -> float:
    """Mean over chunks of :func:`recovered_per_chunk`."""
    per = recovered_per_chunk(scores, ids, kept)
    return sum(per) / max(len(per), 1)


def fit_bow(z_train: torch.Tensor, ids_train: torch.Tensor, z_eval: torch.Tensor, ids_eval: torch.Tensor,
            epochs: int = 60, lr: float = 1e-2, weight_decay: float = 1e-4, batch_size: int = 256,
            val_fraction: float = 0.1, patience: int = 5, seed: int = 0) -> dict:
    """Fit the read-out on (N, D) embeddings of (N, T) chunks; score it and its prior on the held-out chunks."""
    gen = torch.Generator().manual_seed(seed)
    kept = torch.unique(ids_train[ids_train >= 0])  # (n,) compact vocabulary: ids seen in training
    vmax = int(max(int(ids_train.max()), int(ids_eval.max()))) + 1
    to_compact = torch.full((vmax,), kept.numel(), dtype=torch.long)
    to_compact[kept] = torch.arange(kept.numel())
    y = multi_hot(ids_train, to_compact, kept.numel())  # (N, n)
    mean, std = z_train.mean(0), z_train.std(0).clamp(min=1e-6)  # (D,)
    x = (z_train - mean) / std  # (N, D)
    prior = y.mean(0)  # (n,): share of training chunks holding each token
    torch.manual_seed(seed)
    head = torch.nn.Linear(x.shape[1], kept.numel())
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.logit(prior.clamp(1e-4, 1 - 1e-4)))  # starts as the prior
    order = torch.randperm(x.shape[0], generator=gen)
    n_val = int(round(val_fraction * x.shape[0])) if x.shape[0] > 20 else 0
    val, tr = order[:n_val], order[n_val:]
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    best, best_state, bad, ep = float("inf"), None, 0, 0
    for ep in range(1, epochs + 1):
        perm = tr[torch.randperm(tr.numel(), generator=gen)]
        for i in range(0, perm.numel(), batch_size):
            b = perm[i : i + batch_size]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(head(x[b]), y[b])  # (b, n) -> ()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if n_val:
            with torch.no_grad():
                v = float(torch.nn.functional.binary_cross_entropy_with_logits(head(x[val]), y[val]))
            if v < best:
                best, bad, best_state = v, 0, {k: t.clone() for k, t in head.state_dict().items()}
            else:
                bad += 1
                if bad >= patience:
                    break
    if best_state is not None:
        head.load_state_dict(best_state)
    with torch.no_grad():
        scores = head((z_eval - mean) / std)  # (M, n)
    got = recovered_per_chunk(scores, ids_eval, kept)
    base = recovered_per_chunk(prior.expand(ids_eval.shape[0], -1), ids_eval, kept)
    got_m, base_m = sum(got) / max(len(got), 1), sum(base) / max(len(base), 1)
    return {"recovered": got_m, "prior": base_m, "gain": got_m - base_m, "_per_chunk": {"recovered": got, "prior": base}, "epochs": ep, "kept_vocab": int(kept.numel()),
            "definition": "share of each held-out chunk's k distinct tokens among the read-out's top k (prior: the k "
                          "tokens in most training chunks), averaged over chunks"}
