"""Inversion from a pooled state: search for the token sequence whose pooled state at layer ``L`` matches.

This module holds the pooled searcher (the encoder side every pooled search uses: pooling, exact objectives,
gradient rankings) and the single-token swap search, ``memlab invert --method swap``; the default search
(propose, correct, certify) is :mod:`memlab.probes.invert.pooled.recover`.

With one vector per chunk (the probe's poolings: the last position's state, ``pool="last"``; the one before it,
``"second_last"``; the mean over positions, ``"mean"``; the first position's state, ``"first"``, a bidirectional
encoder's ``[CLS]``; or a space's vector, ``"space"``, a memory model's memory vector) the per-position search
does not apply; this module searches all positions at once, with the model itself and no training (a greedy
coordinate-gradient search, as GCG and HotFlip do it). The searcher reads the vector through a *vector reader*
(:class:`PooledLayer` for a transformers model's pooled state,
:class:`~memlab.probes.invert.space_reader.SpaceReader` for a space's vector):

1. **Start** from the model's own greedy text after the fixed prefix (a causal model whose output head can be read:
   its tied or untied output embeddings after the final norm), sampled text for later restarts, or random tokens.
2. **Rank.** One forward and backward pass of the current sequence through the first ``L`` blocks gives the
   gradient ``g`` ``(T, D_e)`` of the objective with respect to the input embeddings; the first-order change of
   the objective when position ``t`` takes token ``v`` is ``(E_v - e_t) . g_t``, so ``g @ E^T`` ``(T, V)`` ranks
   every token at every position (the gradient with respect to the one-hot inputs); the ``topk`` best are kept.
3. **Swap.** ``batch_size`` single-token swaps are drawn (a position, one of its ``topk`` tokens), all evaluated
   exactly in one batched forward pass up to layer ``L``; the best replaces the current sequence when it lowers
   the objective.
4. **Restarts**: the budget of candidate forwards (and seconds) is shared by ``restarts`` searches from different
   starts; the best sequence over all of them is kept.

The objective is the relative squared distance ``|pool(h_L) - z*|^2 / |z*|^2`` plus, with ``prior_weight > 0``
(causal models with a readable output head), that weight times the mean negative log-probability of the sequence
under the model (nats per token): the model's next-token distribution as a prior over texts. The distance reported
is the relative distance ``|pool(h_L) - z*| / |z*|`` of the best sequence.

The pooled state is read as the probe's encoder reads the chunk: the tokenizer's special tokens before and after
it (``prefix``, ``suffix``) are fixed, and pooling runs over every position of ``prefix + chunk + suffix`` (the
probe's mask), ``last`` being the last of them, ``second_last`` the one before it and ``first`` the first (as
:mod:`memlab.probes.encoders.capture`'s ``pool_*`` read an unpadded row).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from memlab.probes.catalog import POOLINGS
from memlab.probes.invert.options import PooledOptions
from memlab.probes.invert.layer import LayerReader

POOLS = tuple(POOLINGS)
"""The poolings the search reads: every built-in pooling of the trained probe (``memlab.probes.catalog.POOLINGS``)."""
INITS = ("greedy", "sample", "random")


@dataclass
class PooledResult:
    """The search of one pooled state."""

    ids: list[int]
    distance: float
    start_distance: float
    forwards: int
    seconds: float
    steps: int


def pool_rows(h: torch.Tensor, pool: str) -> torch.Tensor:
    """``(B, T', D)`` states of whole rows (no padding) -> ``(B, D)`` by ``pool`` (:data:`POOLS`): the values the
    probe's ``pool_last``, ``pool_second_last``, ``pool_mean`` and ``pool_first`` give under an all-ones mask."""
    if pool == "last":
        return h[:, -1]
    if pool == "mean":
        return h.mean(1)
    if pool == "first":
        return h[:, 0]
    if pool == "second_last":
        return h[:, max(h.shape[1] - 2, 0)]  # a one-position row: its only state, as the probe clamps it
    raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")


def blind_spot(pool: str, causal: bool, prefix: list[int], suffix: list[int]) -> str | None:
    """Why ``pool`` of a model's states at any layer cannot carry the whole chunk read between ``prefix`` and
    ``suffix`` (None: it can). Only a causal model has such poolings: its state at a position reads nothing after
    it, so the first position reads only the fixed prefix (or, without one, the chunk's first token), and the one
    before the last position, with no suffix token, never reads the chunk's last token."""
    if not causal:
        return None
    if pool == "first":
        return ("a causal model's first position reads only "
                + ("the fixed prefix before the chunk" if prefix else "the chunk's first token"))
    if pool == "second_last" and not suffix:
        return ("a causal model that puts no token after the chunk reads its last token only at the last position, "
                "so the state before it never sees that token")
    return None


class LanguageHead:
    """A causal model's next-token log-probabilities from its last block, its final norm and its output embeddings
    (tied to the input table unless the model has its own): the prior. ``None`` from :meth:`of` when the model has
    no readable head."""

    def __init__(self, reader: LayerReader, norm, weight: torch.Tensor):
        self.top = LayerReader(reader.model, reader.num_layers, vocab_size=reader.vocab_size)
        self.norm, self.weight = norm, weight  # (V, D)

    @classmethod
    def of(cls, reader: LayerReader, lm_weight: torch.Tensor | None = None) -> "LanguageHead | None":
        from memlab.probes.encoders.capture import hook_plan

        _, norm, _ = hook_plan(reader.model)
        cfg = reader.model.config
        if lm_weight is None and getattr(cfg, "tie_word_embeddings", False):
            lm_weight = reader.embedding
        if lm_weight is None:
            return None
        return cls(reader, norm, lm_weight[: reader.vocab_size])

    @torch.no_grad()
    def logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, t)`` -> next-token log-probabilities ``(B, t, V)``."""
        h = self.top.full_states(ids)  # (B, t, D)
        if self.norm is not None:
            h = self.norm(h.to(self.top.dtype)).float()
        return torch.log_softmax(h @ self.weight.float().T, -1)  # (B, t, V)

    def nll(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Mean negative log-probability per token ``(B,)`` of ``ids[:, start:]`` given what precedes each."""
        lp = self.logprobs(ids[:, :-1])  # (B, t-1, V)
        tok = lp.gather(-1, ids[:, 1:, None])[..., 0]  # (B, t-1)
        return -tok[:, max(start - 1, 0):].mean(-1)  # (B,)

    @torch.no_grad()
    def continue_text(self, prefix: list[int], n: int, gen: torch.Generator | None) -> list[int]:
        """``n`` tokens after ``prefix``: greedy (``gen`` None) or sampled."""
        ids = list(prefix)
        for _ in range(n):
            lp = self.logprobs(torch.tensor([ids or [0]]))[0, -1]  # (V,)
            nxt = int(lp.argmax()) if gen is None else int(torch.multinomial(lp.exp(), 1, generator=gen))
            ids.append(nxt)
        return ids[len(prefix):]


class PooledLayer:
    """A transformers model's pooled state at the reader's layer as a function of its input embeddings: the vector
    a chunk gives. The search reads any *vector reader* through the same members: ``embedding`` ``(V, D_e)``,
    ``vocab_size``, ``device``, ``embed(ids)``, ``vectors(embeds)`` (differentiable) and ``bfloat16()`` (a copy
    that screens); a space's encoder is the other one
    (:class:`~memlab.probes.invert.space_reader.SpaceReader`)."""

    def __init__(self, reader: LayerReader, pool: str):
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        self.reader, self.pool = reader, pool
        self.embedding, self.vocab_size, self.device = reader.embedding, reader.vocab_size, reader.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, t)`` ids -> ``(B, t, D_e)`` the embedding module's outputs."""
        return self.reader.embed(ids)

    def vectors(self, embeds: torch.Tensor) -> torch.Tensor:
        """``(B, T', D_e)`` input embeddings of whole rows -> ``(B, D)`` their pooled states at the layer (float32)."""
        return pool_rows(self.reader._run(embeds, None).float(), self.pool)

    def bfloat16(self) -> "PooledLayer":
        """The same pooled state read through a bfloat16 copy of the model."""
        import copy

        low = copy.deepcopy(self.reader.model).to(torch.bfloat16)
        return PooledLayer(LayerReader(low, self.reader.layer, vocab_size=self.reader.vocab_size), self.pool)


LOGITS = "logits"
"""The ``pool`` of a causal model's next-token log-probabilities at the last position
(:class:`~memlab.probes.invert.pooled.nexttoken.NextTokenVector`)."""

SPACE = "space"
"""The ``pool`` of a space's vector: the reader is a :class:`~memlab.probes.invert.space_reader.SpaceReader`."""


class PooledSearcher:
    """Searches token sequences of a given length whose pooled state at the reader's layer matches a target.

    ``reader``: a :class:`~memlab.probes.invert.layer.LayerReader` whose states ``pool`` pools (:data:`POOLS`), or,
    with ``pool="space"``, a :class:`~memlab.probes.invert.space_reader.SpaceReader` (a space's vector)."""

    def __init__(self, reader, pool: str, options: PooledOptions, head: LanguageHead | None = None,
                 prefix: list[int] = (), suffix: list[int] = ()):
        if pool == SPACE and not hasattr(reader, "vectors"):
            raise ValueError("pool 'space' reads a space's vector: give a SpaceReader")
        if pool == LOGITS:  # the next-token distribution after the last position
            from memlab.probes.invert.pooled.nexttoken import NextTokenVector

            if head is None:
                raise ValueError("pool 'logits' reads a causal model's next-token head: give its LanguageHead")
            self.vec = NextTokenVector(reader, head)
        else:
            self.vec = reader if pool == SPACE else PooledLayer(reader, pool)  # the vector a chunk gives
        self.reader, self.pool, self.opt, self.head = reader, pool, options, head
        self.prefix, self.suffix = list(prefix), list(suffix)
        self._low = None  # the bfloat16 copy that screens candidates (made when first asked)
        self._table: torch.Tensor | None = None  # every token's pooled state alone (made when first asked)
        self.metric: torch.Tensor | None = None  # (D, D): the search descends |(z - z*) W| (None: W = I)
        self.center: torch.Tensor | None = None  # (D,): the pooled states' mean, the origin |z*| is measured from
        self._table_w: torch.Tensor | None = None

    def set_metric(self, weight: torch.Tensor | None, center: torch.Tensor | None = None) -> None:
        """Descend the distance ``|(z - z*) W| / |(z* - c) W|`` instead of ``|z - z*| / |z*|`` (``weight`` ``W``
        ``(D, D)``, e.g. :func:`whitening`; None: the plain distance). Only the search's objective changes: the
        reported distance and the certificate stay the plain relative distance, and ``W`` invertible keeps the
        target's own text at zero."""
        self.metric = None if weight is None else weight.float().cpu()
        self.center = None if weight is None else (torch.zeros(weight.shape[0]) if center is None
                                                   else center.float().cpu())
        self._table_w = None

    def _rel2(self, z: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The objective's squared relative distance ``(B,)`` of pooled states ``z`` ``(B, D)`` to ``target``."""
        if self.metric is None:
            return (z - target).pow(2).sum(-1) / target.pow(2).sum().clamp_min(1e-30)
        w = self.metric.to(z.device)
        norm = ((target - self.center.to(z.device)) @ w).pow(2).sum().clamp_min(1e-30)
        return ((z - target) @ w).pow(2).sum(-1) / norm

    def wrap(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` chunk ids -> ``(B, p + T + s)`` with the fixed special tokens."""
        b = ids.shape[0]
        pre = torch.tensor([self.prefix] * b, dtype=torch.long).view(b, -1)  # (B, p)
        suf = torch.tensor([self.suffix] * b, dtype=torch.long).view(b, -1)  # (B, s)
        return torch.cat([pre, ids.cpu(), suf], 1)

    @torch.no_grad()
    def pooled(self, ids: torch.Tensor) -> torch.Tensor:
        """The pooled states ``(B, D)`` of chunks ``(B, T)``."""
        return self.vec.vectors(self.vec.embed(self.wrap(ids))).cpu()

    def _objective(self, ids: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(objective, relative distance), each ``(B,)``, of chunks ``(B, T)``."""
        z = self.pooled(ids)  # (B, D)
        d2 = (z - target).pow(2).sum(-1) / target.pow(2).sum().clamp_min(1e-30)  # (B,)
        obj = d2 if self.metric is None else self._rel2(z, target)
        if self.opt.prior_weight and self.head is not None:
            obj = obj + self.opt.prior_weight * self.head.nll(self.wrap(ids).to(self.reader.device),
                                                              len(self.prefix)).cpu()
        return obj, d2.sqrt()

    def _scores(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """First-order change of the distance ``(T, V)`` for every token at every position of ``ids`` ``(T,)``."""
        r = self.vec
        full = self.wrap(ids[None])[0]  # (T',)
        e = r.embed(full[None]).detach().requires_grad_(True)  # (1, T', D_e)
        with torch.enable_grad():
            z = r.vectors(e)  # (1, D)
            loss = self._rel2(z, target.to(z.device))[0]
            (g,) = torch.autograd.grad(loss, e)
        p = len(self.prefix)
        g = g[0, p : p + len(ids)].float()  # (T, D_e)
        cur = r.embedding[ids.to(r.device)].float()  # (T, D_e)
        return (g @ r.embedding.float().T - (g * cur).sum(-1, keepdim=True)).cpu()  # (T, V)

    @property
    def screens(self) -> bool:
        """Whether :meth:`rough` pays: the device multiplies bfloat16 natively (:func:`memlab.devices.native_bf16`;
        emulated bf16 is slower than the float32 it would screen for)."""
        from memlab.devices import native_bf16

        return native_bf16(self.reader.device)

    @torch.no_grad()
    def rough(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The relative squared distance ``(B,)`` of chunks ``(B, T)`` read through a bfloat16 copy of the model
        (about half the time of float32 on CPUs with native bf16; about 1 % error on the pooled state): a screen
        that ranks candidates, never a verification."""
        if self._low is None:
            self._low = self.vec.bfloat16()
        z = self._low.vectors(self._low.embed(self.wrap(ids))).cpu()  # (B, D)
        return self._rel2(z, target)  # (B,)

    @torch.no_grad()
    def token_table(self, batch: int = 512) -> torch.Tensor:
        """The pooled state of every token alone (``prefix + [v] + suffix``) ``(V, D)``, computed once (``V`` short
        sequences through the blocks; a cost of the run, shared by its chunks)."""
        if self._table is None:
            v = self.reader.vocab_size
            self._table = torch.cat([self.pooled(torch.arange(i, min(v, i + batch))[:, None])
                                     for i in range(0, v, batch)])  # (V, D)
        return self._table

    @torch.no_grad()
    def table_scores(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """A swap's change of the pooled state estimated from the token table ``U``: at position ``t``, token ``v``
        moves the state by ``c (U_v - U_{ids_t})``, ``c >= 0`` the best scale for the residual ``r = target -
        pool(ids)``; the score ``(T, V)`` is ``|r - c delta|^2`` (lower is better; ``|r|^2`` for no change).
        Unlike the gradient (a linearisation through every block), this ranks a missing content word near the
        top wherever it goes."""
        u = self.token_table()  # (V, D)
        r = target.float().cpu() - self.pooled(ids[None])[0]  # (D,)
        if self.metric is not None:  # the same estimate, measured in the objective's coordinates
            if self._table_w is None:
                self._table_w = u @ self.metric
            u, r = self._table_w, r @ self.metric
        ru = u @ r  # (V,)
        uu = u.pow(2).sum(-1)  # (V,)
        cur = ids.cpu()
        cross = u @ u[cur].T  # (V, T)
        rd = ru[:, None] - ru[cur][None]  # (V, T): r . delta
        dd = (uu[:, None] - 2 * cross + uu[cur][None]).clamp_min(1e-12)  # (V, T): |delta|^2
        c = (rd / dd).clamp_min(0)
        return (r.pow(2).sum() - 2 * c * rd + c.pow(2) * dd).T  # (T, V)

    @torch.no_grad()
    def whitening(self, chunks: list[list[int]], keep: float, batch: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W, mean)`` from the pooled states of ``chunks`` (text like the targets', e.g. the corpus's training
        chunks): ``W = S^{-1/2}`` for their covariance ``S`` with its eigenvalues ``l`` taken as ``keep * l + (1 -
        keep) * mean(l)`` (``keep`` 1: full whitening, 0: ``W`` a multiple of the identity). In a sentence
        encoder's pooled space a few directions (the topic) hold most of the variance, so the plain distance ranks
        texts by topic; whitened, the directions in which one word or its place moves the state count as much."""
        by_len: dict[int, list[list[int]]] = {}
        for c in chunks:
            by_len.setdefault(len(c), []).append(c)
        z = torch.cat([self.pooled(torch.tensor(cs[i:i + batch])) for cs in by_len.values()
                       for i in range(0, len(cs), batch)]).double()  # (N, D)
        if len(z) < 2:
            raise ValueError("whitening needs the pooled states of at least two chunks")
        mean = z.mean(0)
        lam, vec = torch.linalg.eigh(torch.cov(z.T))
        lam = lam.clamp_min(0)
        lam = keep * lam + (1 - keep) * lam.mean()  # a direction the chunks never move along (a normalised
        w = vec @ torch.diag(lam.clamp_min(lam.mean() * 1e-6).rsqrt()) @ vec.T  # state's) is not stretched unbounded
        return w.float(), mean.float()

    def objective(self, ids: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(objective, relative distance), each ``(B,)``, of chunks ``(B, T)`` (every candidate verified exactly)."""
        return self._objective(ids, target)

    def scores(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """First-order change of the objective's distance ``(T, V)`` for every token at every position."""
        return self._scores(ids, target)

    def _start(self, k: int, length: int, gen: torch.Generator) -> torch.Tensor:
        init = self.opt.init if k == 0 else ("sample" if self.opt.init != "random" else "random")
        if init != "random" and self.head is not None:
            return torch.tensor(self.head.continue_text(self.prefix, length, None if init == "greedy" else gen))
        return torch.randint(0, self.reader.vocab_size, (length,), generator=gen)

    def search(self, target: torch.Tensor, length: int, seed: int = 0) -> PooledResult:
        """The best sequence of ``length`` tokens for the pooled ``target`` ``(D,)`` within the budget."""
        o, gen = self.opt, torch.Generator().manual_seed(seed)
        target = target.float().cpu()
        began = time.perf_counter()
        forwards, steps, best, best_obj, best_d, start_d = 0, 0, None, math.inf, math.inf, math.nan
        for k in range(o.restarts):
            share = (o.forwards * (k + 1)) // o.restarts  # this restart may use the budget up to here
            if forwards >= share:  # more restarts than the budget allows
                continue
            cur = self._start(k, length, gen)  # (T,)
            obj, d = self._objective(cur[None], target)
            forwards += 1
            cur_obj, cur_d = float(obj[0]), float(d[0])
            if math.isnan(start_d):
                start_d = cur_d
            while forwards + 1 <= share and time.perf_counter() - began < o.seconds and cur_d > o.tol:
                b = min(o.batch_size, share - forwards)
                scores = self._scores(cur, target)  # (T, V)
                scores[torch.arange(length), cur] = math.inf  # a swap changes the token
                top = scores.topk(min(o.topk, scores.shape[1] - 1), dim=1, largest=False).indices  # (T, k)
                pos = torch.randint(0, length, (b,), generator=gen)  # (B,)
                tok = top[pos, torch.randint(0, top.shape[1], (b,), generator=gen)]  # (B,)
                cand = cur.repeat(b, 1)  # (B, T)
                cand[torch.arange(b), pos] = tok
                obj, d = self._objective(cand, target)
                forwards += b
                steps += 1
                i = int(obj.argmin())
                if float(obj[i]) < cur_obj:
                    cur, cur_obj, cur_d = cand[i], float(obj[i]), float(d[i])
            if cur_obj < best_obj:
                best, best_obj, best_d = cur.clone(), cur_obj, cur_d
            if best_d <= o.tol or time.perf_counter() - began >= o.seconds:
                break
        return PooledResult(best.tolist(), best_d, start_d, forwards, time.perf_counter() - began, steps)
