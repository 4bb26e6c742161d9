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

The head is trained by the probe's fit loop (:func:`memlab.probes.decoder.fitloop.train_members`) as a member of its own
(:class:`BagHeadMember`): beside the decoders when a sequence probe is fitted, alone otherwise; the loop's optimiser,
schedule, batches and held-back chunks, its own learning rate and weight decay (:class:`~memlab.probes.sections.
BowOptions`), its own early stopping on its held-back binary cross-entropy, counted from its start (the prior).

Labels stay sparse: each batch's multi-hot targets (b, n) are built on the
fly from its token ids on the probe's device, so memory is O(N * T) for the
chunks plus O(batch * n) for one batch, never the N x n label matrix; the
held-out scores are computed a batch at a time too.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from memlab.probes.decoder.fitloop import train_readouts
from memlab.probes.sections import BowOptions, FitSection


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


class BagHeadMember:
    """The read-out as a unit of the fit loop (:func:`memlab.probes.decoder.fitloop.train_members`): one member, the linear
    head on (N, D) embeddings ``z_train`` standardised with their own statistics, labels the compact vocabulary of
    ``ids_train`` (N, T), started as the prior (zero weights, the prior's logits as bias). ``options``: its own
    (:class:`BowOptions`); ``fit``: the loop's settings (betas, clipping, batch size of the held-back pass)."""

    def __init__(self, z_train: torch.Tensor, ids_train: torch.Tensor, ids_eval: torch.Tensor, options: BowOptions,
                 fit, device: str | torch.device = "cpu"):
        self.device = device = torch.device(device)
        self.options, self.fit = options, fit
        self.labels = _Labels(ids_train, ids_eval, device)
        self.ids = ids_train.to(device)  # (N, T)
        z = z_train.to(device, torch.float32)  # (N, D)
        self.mean, self.std = z.mean(0), z.std(0).clamp(min=1e-6)  # (D,)
        self.x = (z - self.mean) / self.std  # (N, D)
        self.prior = self.labels.prior(self.ids, fit.batch_size)  # (n,): share of training chunks holding each token
        self.head = torch.nn.Linear(self.x.shape[1], self.labels.n, device=device)
        with torch.no_grad():  # no random draw: the start is the prior, whatever the seed
            self.head.weight.zero_()
            self.head.bias.copy_(torch.logit(self.prior.clamp(1e-4, 1 - 1e-4)))
        self.decs, self.active = [self.head], [0]
        self.history: list[dict] = []  # its curve, once the fit loop has trained it
        self.seconds = 0.0

    def optimised(self):
        """The head's weights, at its own learning rate and weight decay (the fit's betas), unstacked."""
        return self.head, SimpleNamespace(lr=self.options.bow_lr, weight_decay=self.options.bow_weight_decay,
                                          beta1=self.fit.beta1, beta2=self.fit.beta2), 0

    def loss(self, rows: torch.Tensor) -> torch.Tensor:
        """(1,) mean binary cross-entropy over (chunk, token) pairs of chunks ``rows`` (b,)."""
        r = rows.to(self.device)
        return F.binary_cross_entropy_with_logits(self.head(self.x[r]), self.labels(self.ids[r])).view(1)  # (1,)

    def before_step(self) -> None:
        if self.fit.clip_grad:
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.fit.clip_grad)

    @torch.no_grad()
    def held_back_ce(self, rows: torch.Tensor) -> torch.Tensor:
        """(1,) mean binary cross-entropy over all (chunk, token) pairs of chunks ``rows``, a batch at a time."""
        total = torch.zeros((), device=self.device)  # () summed on the device: one read back at the end
        r, bs = rows.to(self.device), self.fit.batch_size
        for i in range(0, r.shape[0], bs):
            b = r[i : i + bs]
            total += F.binary_cross_entropy_with_logits(self.head(self.x[b]), self.labels(self.ids[b]),
                                                        reduction="sum")  # (b, n) -> ()
        return (total / (r.shape[0] * self.labels.n)).view(1)  # (1,)

    def drop(self, gone: list[int], state=None) -> None:
        self.active = [m for m in self.active if m not in gone]

    def weights(self, g: int) -> dict:
        return {k: t.clone() for k, t in self.head.state_dict().items()}

    def load_into(self, m: int, state: dict) -> None:
        self.head.load_state_dict(state)

    def result(self, z_eval: torch.Tensor, ids_eval: torch.Tensor) -> dict:
        """The fitted head and the prior scored on (M, D) held-out embeddings of chunks ``ids_eval`` (M, T)."""
        z_ev = (z_eval.to(self.device, torch.float32) - self.mean) / self.std  # (M, D)
        got, base = _score(self.head, z_ev, ids_eval, self.labels.kept, self.prior.cpu(), self.fit.batch_size)
        got_m, base_m = sum(got) / max(len(got), 1), sum(base) / max(len(base), 1)
        steps = [h for h in self.history if "best_val_ce" in h]
        return {"recovered": got_m, "prior": base_m, "gain": got_m - base_m,
                "_per_chunk": {"recovered": got, "prior": base},
                "epochs": sum(1 for h in self.history if "val_ce" in h and h["step"] > 0),
                "best_step": steps[-1]["best_step"] if steps else None, "kept_vocab": self.labels.n,
                "device": str(self.device), "seconds": self.seconds,
                "definition": "share of each held-out chunk's k distinct tokens among the read-out's top k (prior: "
                              "the k tokens in most training chunks), averaged over chunks"}


def fit_bow(z_train: torch.Tensor, ids_train: torch.Tensor, z_eval: torch.Tensor, ids_eval: torch.Tensor,
            options: BowOptions | None = None, fit=None, seed: int | None = None,
            device: str | torch.device = "cpu") -> dict:
    """Fit the read-out alone on (N, D) embeddings of (N, T) chunks on ``device``, in the fit loop (``fit``: its
    settings, a :class:`~memlab.probes.options.ProbeOptions` or :class:`~memlab.probes.sections.FitSection`;
    default the fit's defaults; ``seed`` replaces its seed); score it and its prior on the held-out chunks."""
    fit = fit if fit is not None else FitSection()
    loop = SimpleNamespace(**{k: getattr(fit, k) for k in ("epochs", "val_fraction", "patience", "batch_size",
                                                           "warmup_fraction", "min_lr_ratio", "clip_grad", "beta1",
                                                           "beta2", "seed")}, device=str(device))
    if seed is not None:
        loop.seed = seed
    member = BagHeadMember(z_train, ids_train, ids_eval, options or BowOptions(), loop, device)
    train_readouts([member], z_train.shape[0], loop, progress=getattr(fit, "progress", None))
    return member.result(z_eval, ids_eval)


# the bow read-out part's code (registered in memlab.probes.catalog)

def bow_readout(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu", context=None,
         options: BowOptions = BowOptions()) -> dict:
    fit = context.opts if context is not None else None  # the probe's fit settings (None: the defaults)
    return fit_bow(z_train, train_ids, z_eval, eval_ids, options=options, fit=fit, seed=seed, device=device)


def bow_member(z_train, train_ids, eval_ids, options: BowOptions, fit, device: str = "cpu"):
    return BagHeadMember(z_train, train_ids, eval_ids, options, fit, device)


def bow_summary(b: dict) -> str:
    return (f"bag-of-words read-out: recovered {b['recovered']:.3f} of each chunk's distinct tokens "
            f"(frequency prior {b['prior']:.3f})")


def bow_columns(b: dict) -> dict:
    return {"bow_recovered": b["recovered"], "bow_prior": b["prior"]}
