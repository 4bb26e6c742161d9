"""Exact inversion from per-position states: recover a causal model's input one position at a time.

``memlab invert --states positions`` runs the lockstep search (:mod:`memlab.probes.invert.positions.lockstep`: many chunks
together, ranked by the model's next-token distribution and the first-order score); this module holds the
certificate's bookkeeping, the first-position table every chunk reads after an empty prefix
(:meth:`Searcher.first_positions`), and the search of one chunk alone by the first-order score described here.

At position ``t`` the state at layer ``L`` depends only on the tokens up to ``t`` (the model is causal), so given
the recovered prefix the token at ``t`` is the one whose state matches the observed one. Each position:

1. **Rank** every token of the vocabulary by the first-order change of the squared distance
   ``d(e) = |h_L(prefix, e) - h*|^2 / |h*|^2`` when the input embedding moves from a point ``e0`` to the token's
   row ``E_v``: ``score_v = (E_v - e0) . grad d(e0)`` (one forward and backward pass through the first ``L``
   blocks, one product with the embedding table). ``e0`` starts at the mean embedding row.
2. **Verify** the best ``batch_size`` untried candidates exactly: one batched pass through the first ``L``
   blocks against the prefix's key-value cache gives each candidate's relative distance
   ``|h_L - h*| / |h*|``.
3. **Re-rank** from the best token verified so far (``e0 = E_best``: the first-order score is most accurate
   near the answer) and verify the next batch, until a certificate is found or ``budget`` ranked candidates
   were tried.
4. **Exhaustive fallback**: every untried token of the vocabulary, in batches of ``exhaustive_batch``, in the
   order of the last ranking, until a ``match`` or ``separated`` certificate stops it (else to the end).

The certificate of a position is its best relative distance ``d1``, the runner-up's ``d2`` among all the
candidates verified, and their ratio ``gap = d2 / d1``:

* ``match``: ``d1 <= tol`` and ``gap >= min_gap``; accepted as soon as it is seen (a float32 recomputation of
  the true token lies near 1e-6, a wrong token typically 0.1 or more away);
* ``separated``: no candidate within ``tol`` (noisy states, other weights), but the best verified one is
  ``accept_gap`` times nearer than every other verified one; accepted as soon as it is seen, without the
  exhaustive search (a wrong token that near, with the true one untried, would be a collision);
* ``nearest``: after the exhaustive search of the whole vocabulary, the best token is ``min_gap`` times nearer
  than any other;
* ``ambiguous``: the states were read at a lower precision (``--states-dtype``,
  :mod:`memlab.probes.invert.positions.precision`) and the best and the runner-up both lie within its noise floor
  ``noise`` of the observed state (the best within ``tol + noise``, the runner-up within ``noise`` of the best):
  those states cannot tell the two apart, so the position is never ``match`` (nor any certificate). At float32
  the floor is 0 and no position is ambiguous;
* ``none``: neither; the position keeps its best token, and the report says it had no certificate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from memlab.probes.invert.options import PositionsOptions
from memlab.probes.invert.layer import LayerReader, Prefix


EXACT_FEW = 8
"""Candidates of the first-position pass whose distances are recomputed exactly when the states were read at a lower
precision (at float32 the best two, as before): the runner-up the noise floor is weighed against is then exact."""


@dataclass
class Position:
    """The search of one position: the token kept and its certificate."""

    token: int
    distance: float
    """Relative distance of the kept token's state to the observed one."""
    runner_up: float
    """Least relative distance of any other verified token (inf when only one was tried)."""
    certificate: str
    """``match``, ``separated``, ``nearest``, ``ambiguous`` or ``none`` (see the module doc)."""
    tried: int
    """Candidates verified (ranked and exhaustive)."""
    exhaustive: bool
    """Whether the exhaustive search ran."""
    seconds: float
    true_rank: int | None = None
    """Rank of the true token in the first ranking (0 = first), when the true token is known."""
    prior_rank: int | None = None
    """Rank of the true token in the model's next-token distribution (lockstep search with a prior)."""
    grad_rank: int | None = None
    """Rank of the true token in the first first-order ranking (lockstep search)."""
    secant_rank: int | None = None
    """Rank of the true token in the first secant order (lockstep search; positions that reached it)."""
    found_at: int | None = None
    """Candidates verified when the kept token was first verified (lockstep search)."""
    from_table: bool = False
    """Read off the shared table of every token's first-position state (:meth:`Searcher.first_positions`)."""
    noise: float = 0.0
    """The noise floor of the observed state as read: the relative distance within which its true state lies
    (:func:`memlab.probes.invert.positions.precision.noise_floor`; 0 at float32)."""

    @property
    def gap(self) -> float:
        return math.inf if self.distance == 0 else self.runner_up / self.distance


def ambiguous(d1: float, d2: float, noise: float, tol: float) -> bool:
    """Whether the best (``d1``) and the runner-up (``d2``) both lie within the noise floor ``noise`` of the observed
    state: the best within ``tol + noise``, the runner-up within ``noise`` of the best (never at a floor of 0)."""
    return noise > 0 and d1 <= tol + noise and d2 - d1 <= noise


@dataclass
class _Best:
    d1: float = math.inf
    d2: float = math.inf
    token: int = -1
    seen: int = 0
    noise: float = 0.0
    """The noise floor of the observed state as read (0 at float32)."""

    def add(self, tokens: torch.Tensor, dist: torch.Tensor) -> None:
        """Fold verified ``tokens`` (B,) with distances ``dist`` (B,) into the best two."""
        self.seen += int(dist.numel())
        vals, idx = torch.sort(dist)
        for v, t in zip(vals[:2].tolist(), tokens[idx[:2]].tolist()):
            if v < self.d1:
                self.d1, self.d2, self.token = v, self.d1, int(t)
            elif v < self.d2:
                self.d2 = v

    def matched(self, opts: PositionsOptions) -> bool:
        return self.d1 <= opts.tol and self.apart(opts) and not self.ambiguous(opts)

    def ambiguous(self, opts) -> bool:
        return ambiguous(self.d1, self.d2, self.noise, opts.tol)

    def settled(self, opts) -> bool:
        """The search of the position can stop: a ``match`` or ``separated`` certificate, or an ambiguity no later
        candidate can lift (the runner-up within ``tol + noise`` of the observed state)."""
        return (self.matched(opts) or self.separated(opts)
                or (self.ambiguous(opts) and self.d2 <= opts.tol + self.noise))

    def certificate(self, opts, whole: bool) -> str:
        """The position's certificate once its search ended (``whole``: every token of the vocabulary verified)."""
        if self.ambiguous(opts):
            return "ambiguous"
        return ("match" if self.matched(opts) else "nearest" if whole and self.apart(opts)
                else "separated" if self.separated(opts) else "none")

    def apart(self, opts) -> bool:
        """The runner-up is ``min_gap`` times farther than the best, and farther at all: two tokens whose states
        are equal (identical embedding rows) tie at any distance, zero included, and neither is certified."""
        return self.d2 >= opts.min_gap * self.d1 and self.d2 > self.d1

    def separated(self, opts: PositionsOptions) -> bool:
        return (self.d1 > opts.tol and self.d2 >= opts.accept_gap * self.d1 and self.seen >= opts.separation_min
                and not self.ambiguous(opts))


@dataclass
class Searcher:
    """Searches each position of a chunk against ``reader`` (a :class:`LayerReader`)."""

    reader: LayerReader
    opts: PositionsOptions = field(default_factory=PositionsOptions)

    def __post_init__(self):
        self.mean_row = self.reader.embedding.float().mean(0)  # (D_e,)
        self.table = self.reader.embedding.float()  # (V, D_e)

    def distances(self, prefix: Prefix, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Relative distances ``(B,)`` of candidate ``tokens`` ``(B,)`` at the next position."""
        h = self.reader.candidate_states(prefix, tokens)  # (B, D)
        t = target.to(h.device)
        return ((h - t).norm(dim=-1) / t.norm().clamp_min(1e-30)).cpu()  # (B,)

    def rank(self, prefix: Prefix, e0: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """First-order scores ``(V,)`` of every token from ``e0`` (lower: nearer)."""
        _, g = self.reader.distance_grad(prefix, e0, target)  # (D_e,)
        return ((self.table - e0.to(self.table)) @ g.to(self.table)).cpu()  # (V,)

    def position(self, prefix: Prefix, target: torch.Tensor, true: int | None = None, noise: float = 0.0) -> Position:
        """Search the next position after ``prefix`` for the token whose state is ``target`` ``(D,)`` (``noise``: its
        noise floor as read)."""
        o, start = self.opts, time.perf_counter()
        v = self.reader.vocab_size
        tried = torch.zeros(v, dtype=torch.bool)  # (V,)
        best, true_rank, e0 = _Best(noise=noise), None, self.mean_row
        budget = min(o.budget, v)
        while int(tried.sum()) < budget:
            score = self.rank(prefix, e0, target)  # (V,)
            if true is not None and true_rank is None:
                true_rank = int((score < score[true]).sum())
            score[tried] = math.inf
            k = min(o.batch_size, budget - int(tried.sum()))
            cand = torch.topk(score, k, largest=False).indices  # (k,)
            best.add(cand, self.distances(prefix, cand, target))
            tried[cand] = True
            if best.settled(o):
                break
            if o.relinearize:
                e0 = self.table[best.token]
        exhaustive = not best.settled(o) and o.exhaustive and int(tried.sum()) < v
        if exhaustive:  # the last ranking continued to the end of the vocabulary, stopped by a certificate
            score = self.rank(prefix, e0, target)  # (V,)
            score[tried] = math.inf
            rest = torch.argsort(score)[: v - int(tried.sum())]  # (R,)
            for i in range(0, rest.numel(), o.exhaustive_batch):
                chunk = rest[i : i + o.exhaustive_batch]
                best.add(chunk, self.distances(prefix, chunk, target))
                tried[chunk] = True
                if best.settled(o):
                    break
        return Position(best.token, best.d1, best.d2, best.certificate(o, bool(tried.all())), int(tried.sum()),
                        exhaustive, time.perf_counter() - start, true_rank, noise=noise)

    def first_table(self, prefix_ids: list[int], on_batch=None) -> torch.Tensor:
        """The state ``(V, D)`` of every token of the vocabulary at the first position after ``prefix_ids``: what
        :meth:`first_positions` compares each chunk's first state with (kept, it serves later runs too)."""
        return torch.cat([h for _, h in self._first_batches(prefix_ids, None, on_batch)])  # (V, D)

    def _first_batches(self, prefix_ids: list[int], table: torch.Tensor | None, on_batch):
        """(candidate ids (B,), their first-position states (B, D)) over the vocabulary: from ``table`` or
        computed."""
        prefix = None if table is not None else self.reader.start(prefix_ids)
        for i in range(0, self.reader.vocab_size, self.opts.exhaustive_batch):
            cand = torch.arange(i, min(i + self.opts.exhaustive_batch, self.reader.vocab_size))  # (B,)
            h = table[cand] if table is not None else self.reader.candidate_states(prefix, cand).cpu()  # (B, D)
            if on_batch is not None:
                on_batch(cand.numel())
            yield cand, h.float()

    def first_positions(self, prefix_ids: list[int], targets: torch.Tensor, on_batch=None,
                        table: torch.Tensor | None = None, floors: torch.Tensor | None = None) -> list[Position]:
        """The first position of many chunks at once, by one exhaustive pass over the vocabulary: ``targets``
        ``(n, D)``, each chunk's state at its first position after the shared ``prefix_ids``.

        The first position reads nothing but the fixed prefix, so every chunk's candidates are the same
        states: one pass serves all chunks, and each gets the full certificate. (Ranking by the gradient is
        weakest there: without a BOS token the first position is the model's attention sink, whose state is
        large and barely depends on the token.) Each chunk is charged its share of the pass's time; no true rank
        is recorded there (nothing was ranked). ``table``: the states of :meth:`first_table`, when kept;
        ``floors`` ``(n,)``: the targets' noise floors as read (``--states-dtype``; None: 0), against which the
        best few of the pass are recomputed exactly, as the searched positions read them
        (:mod:`memlab.probes.invert.numerics`)."""
        o, start = self.opts, time.perf_counter()
        v, n = self.reader.vocab_size, targets.shape[0]
        floors = torch.zeros(n) if floors is None else floors.float()
        k = 2 if not bool(floors.any()) else min(EXACT_FEW, v)  # float32: the best two, as always
        tg = targets.float()  # (n, D)
        norms = tg.norm(dim=-1).clamp_min(1e-30)  # (n,)
        dk = torch.full((k, n), math.inf)  # the best k so far, nearest first
        tk = torch.zeros(k, n, dtype=torch.long)
        for cand, h in self._first_batches(prefix_ids, table, on_batch):
            d = torch.cdist(h, tg) / norms  # (B, n)
            both = torch.cat([dk, d], 0)  # (k + B, n) the best k so far, then the batch
            ids = torch.cat([tk, cand[:, None].expand(-1, n)], 0)  # (k + B, n)
            dk, idx = torch.topk(both, k, dim=0, largest=False)  # (k, n)
            tk = ids.gather(0, idx)
        from memlab.probes.invert.numerics import exact_best

        tok, d1, d2 = exact_best(self.reader, prefix_ids, table, tk, tg)  # cdist's noise out of the certificate
        share = (time.perf_counter() - start) / n
        out = []
        for j in range(n):
            ok = bool(d2[j] >= o.min_gap * d1[j] and d2[j] > d1[j])  # a tie (equal states) is no certificate
            cert = ("match" if d1[j] <= o.tol else "nearest") if ok else "none"
            if ambiguous(float(d1[j]), float(d2[j]), float(floors[j]), o.tol):
                cert = "ambiguous"
            out.append(Position(int(tok[j]), float(d1[j]), float(d2[j]), cert, v, True, share, from_table=True,
                                noise=float(floors[j])))
        return out

    def chunk(self, targets: torch.Tensor, prefix_ids: list[int], true: list[int] | None = None,
              on_position=None, first: Position | None = None, floors: torch.Tensor | None = None) -> list[Position]:
        """Recover a chunk from its states ``targets`` ``(T, D)`` (the positions after ``prefix_ids``, e.g. a BOS
        token the model always reads first), one position at a time; ``true``: the true tokens, to record their
        ranks only (the search never reads them); ``first``: its first position, already searched
        (:meth:`first_positions`); ``floors`` ``(T,)``: the states' noise floors as read (None: 0)."""
        prefix = self.reader.start(prefix_ids)
        out = []
        if first is not None:
            self.reader.extend(prefix, first.token)
            out.append(first)
            if on_position is not None:
                on_position(first)
        for t in range(len(out), targets.shape[0]):
            p = self.position(prefix, targets[t], None if true is None else true[t],
                              0.0 if floors is None else float(floors[t]))
            self.reader.extend(prefix, p.token)
            out.append(p)
            if on_position is not None:
                on_position(p)
        return out
