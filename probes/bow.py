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

Labels stay sparse: each batch's multi-hot targets (b, n) are built on the
fly from its token ids on the probe's device, so memory is O(N * T) for the
chunks plus O(batch * n) for one batch, never the N x n label matrix; the
held-out scores are computed a batch at a time too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memlab.probes.sections import BowOptions


def multi_hot(ids: torch.Tensor, to_compact: torch.Tensor, n: int) -> torch.Tensor:
    """(N, T) token ids -> (N, n) 0/1 float on ``ids``' device: which compact ids occur in each chunk (unseen
    ids dropped)."""
    c = torch.where(ids >= 0, to_compact[ids.clamp(min=0)], n)  # (N, T), n for unseen ids and PAD
    out = torch.zeros(ids.shape[0], n + 1, device=ids.device)  # (N, n+1)
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


class _Labels:
    """The compact vocabulary of the training chunks and each batch's multi-hot over it, on ``device``."""

    def __init__(self, ids_train: torch.Tensor, ids_eval: torch.Tensor, device: torch.device):
        self.kept = torch.unique(ids_train[ids_train >= 0])  # (n,) compact vocabulary: ids seen in training
        self.n = self.kept.numel()
        vmax = int(max(int(ids_train.max()), int(ids_eval.max()))) + 1
        to_compact = torch.full((vmax,), self.n, dtype=torch.long)  # (V,)
        to_compact[self.kept] = torch.arange(self.n)
        self.to_compact = to_compact.to(device)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return multi_hot(ids, self.to_compact, self.n)  # (b, T) on the device -> (b, n)

    def prior(self, ids: torch.Tensor, batch_size: int) -> torch.Tensor:
        """(n,) share of the chunks ``ids`` (N, T) holding each token, counted a batch at a time."""
        count = torch.zeros(self.n, device=ids.device)  # (n,) whole counts: exact in float32 below 2**24
        for i in range(0, ids.shape[0], batch_size):
            count += self(ids[i : i + batch_size]).sum(0)
        return count / ids.shape[0]


def _loss(head, x: torch.Tensor, ids: torch.Tensor, labels: _Labels, batch_size: int) -> float:
    """Mean binary cross-entropy of ``head`` over all (chunk, token) pairs of (N, D) ``x``, a batch at a time."""
    total = torch.zeros((), device=x.device)  # () summed on the device: one read back at the end
    for i in range(0, x.shape[0], batch_size):
        b = slice(i, i + batch_size)
        total += F.binary_cross_entropy_with_logits(head(x[b]), labels(ids[b]), reduction="sum")  # (b, n) -> ()
    return float(total) / (x.shape[0] * labels.n)


def _score(head, z: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor, prior: torch.Tensor,
           batch_size: int) -> tuple[list[float], list[float]]:
    """Per-chunk recovered shares of the head's scores and of the prior on (M, D) ``z``, a batch at a time."""
    got, base = [], []
    for i in range(0, z.shape[0], batch_size):
        with torch.no_grad():
            s = head(z[i : i + batch_size]).cpu()  # (b, n)
        b_ids = ids[i : i + batch_size]
        got += recovered_per_chunk(s, b_ids, kept)
        base += recovered_per_chunk(prior.expand(b_ids.shape[0], -1), b_ids, kept)
    return got, base


def fit_bow(z_train: torch.Tensor, ids_train: torch.Tensor, z_eval: torch.Tensor, ids_eval: torch.Tensor,
            epochs: int = BowOptions.bow_epochs, lr: float = BowOptions.bow_lr,
            weight_decay: float = BowOptions.bow_weight_decay, batch_size: int = BowOptions.bow_batch_size,
            val_fraction: float = BowOptions.bow_val_fraction, patience: int = BowOptions.bow_patience, seed: int = 0,
            device: str | torch.device = "cpu") -> dict:
    """Fit the read-out on (N, D) embeddings of (N, T) chunks on ``device``; score it and its prior on the
    held-out chunks (the training settings: the read-out's options, :class:`memlab.probes.sections.BowOptions`)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    labels = _Labels(ids_train, ids_eval, device)
    ids = ids_train.to(device)  # (N, T)
    z = z_train.to(device, torch.float32)  # (N, D)
    mean, std = z.mean(0), z.std(0).clamp(min=1e-6)  # (D,)
    x = (z - mean) / std  # (N, D)
    prior = labels.prior(ids, batch_size)  # (n,): share of training chunks holding each token
    torch.manual_seed(seed)
    head = torch.nn.Linear(x.shape[1], labels.n)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.logit(prior.clamp(1e-4, 1 - 1e-4)))  # starts as the prior
    head.to(device)
    order = torch.randperm(x.shape[0], generator=gen)
    n_val = int(round(val_fraction * x.shape[0])) if x.shape[0] > 20 else 0
    val, tr = order[:n_val].to(device), order[n_val:]
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    best, best_state, bad, ep = float("inf"), None, 0, 0
    for ep in range(1, epochs + 1):
        perm = tr[torch.randperm(tr.numel(), generator=gen)]
        for i in range(0, perm.numel(), batch_size):
            b = perm[i : i + batch_size].to(device)
            loss = F.binary_cross_entropy_with_logits(head(x[b]), labels(ids[b]))  # (b, n) -> ()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if n_val:
            with torch.no_grad():
                v = _loss(head, x[val], ids[val], labels, batch_size)
            if v < best:
                best, bad, best_state = v, 0, {k: t.clone() for k, t in head.state_dict().items()}
            else:
                bad += 1
                if bad >= patience:
                    break
    if best_state is not None:
        head.load_state_dict(best_state)
    z_ev = (z_eval.to(device, torch.float32) - mean) / std  # (M, D)
    got, base = _score(head, z_ev, ids_eval, labels.kept, prior.cpu(), batch_size)
    got_m, base_m = sum(got) / max(len(got), 1), sum(base) / max(len(base), 1)
    return {"recovered": got_m, "prior": base_m, "gain": got_m - base_m, "_per_chunk": {"recovered": got, "prior": base},
            "epochs": ep, "kept_vocab": labels.n, "device": str(device),
            "definition": "share of each held-out chunk's k distinct tokens among the read-out's top k (prior: the k "
                          "tokens in most training chunks), averaged over chunks"}
