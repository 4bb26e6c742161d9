"""Correction of a hypothesis with the encoder's weights in the loop: edits ranked by the gradient, each verified.

A hypothesis is a sequence of ``T`` encoder tokens (``T`` the chunk's length). Each step:

1. **Rank.** One forward and backward pass gives the first-order change of the objective for every token at
   every position ``(T, V)`` (the gradient with respect to the one-hot inputs, as GCG and HotFlip rank swaps).
2. **Edit.** A batch of edits of the current sequence (:func:`apply`), drawn from three neighbourhoods, all of
   length ``T``:

   * *swap*: position ``t`` takes one of its ``topk`` best-ranked tokens (the best-ranked over all positions
     first, then drawn at random among the rest);
   * *word order*: a block of 1-3 tokens is taken out and put back anywhere else (a move; a one-token move to a
     neighbour is a transposition), two tokens anywhere change places (an exchange), or a span of 3-4 is
     reversed;
   * *insert/delete*: a best-ranked token is inserted at ``i`` and the token at ``j`` deleted (a word missing
     here, one too many there).
3. **Verify.** Every edit's objective is computed exactly, in batches; the best replaces the current sequence
   when it lowers the objective. When none does, the ``pair_top`` best single edits are verified two at a time
   (the right words in the wrong order often need a move and a swap together: neither alone is nearer). After
   ``patience`` steps without a fall the search has no better neighbour it can find; it stops early (the budget
   left goes unspent).

The search stops at a relative distance within ``tol`` (float noise: the sequence's pooled state *is* the
target's) and keeps the runner-up (the nearest evaluated sequence that differs from the best): the **gap** that
certifies the answer when the best is at float noise and the runner-up is not.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields

import torch

from memlab.probes.invert.options import PooledOptions


@dataclass
class CorrectOptions:
    """How a hypothesis is corrected (the pooled search's correction step); the defaults are the pooled search's
    (:class:`~memlab.probes.invert.options.PooledOptions`, whose fields of the same names the command hands on)."""

    batch_size: int = PooledOptions.batch_size
    """Edits verified per step (one batched forward pass of that many sequences)."""
    topk: int = PooledOptions.topk
    """Tokens kept per position from the gradient ranking, for swaps and insertions."""
    move_share: float = PooledOptions.move_share
    """Share of each batch spent on moves of a token to another position."""
    insert_share: float = PooledOptions.insert_share
    """Share of each batch spent on an insertion at one position and a deletion at another."""
    merge: int = PooledOptions.merge
    """After a step, up to this many of its improving swaps at different positions are verified together too (the
    best 2, 3, ...; 0 or 1: off)."""
    table_topk: int = PooledOptions.table_topk
    """Tokens kept per position from the token table's ranking; half the swaps come from it (0: off)."""
    screen: int = PooledOptions.screen
    """Verify only the nearest this many edits of a batch, ranked through a bfloat16 copy of the model (0: verify
    every edit)."""
    pair_top: int = PooledOptions.pair_top
    """After a step whose single edits all fail, the best this many of them are verified two at a time (0 or 1:
    off)."""
    patience: int = PooledOptions.patience
    """Steps without a fall of the objective after which the correction stops."""
    tol: float = PooledOptions.tol
    """Stop once the relative distance is within this (the pooled state matches to float noise)."""

    @classmethod
    def of(cls, pooled: PooledOptions) -> "CorrectOptions":
        """The correction's share of the pooled search's options."""
        return cls(**{f.name: getattr(pooled, f.name) for f in fields(cls)})


@dataclass
class Corrected:
    """The correction of one hypothesis."""

    ids: list[int]
    objective: float
    distance: float
    runner_up: float
    """Relative distance of the nearest evaluated sequence other than ``ids`` (inf: none evaluated)."""
    forwards: int
    steps: int
    accepted: dict
    """How many accepted edits were swaps, moves and insert/deletes."""


def apply(ids: list[int], op: tuple) -> list[int]:
    """``ids`` with one edit ``op`` applied (every edit keeps the length):

    * ``("swap", t, v)``: position ``t`` takes token ``v``;
    * ``("move", i, n, j)``: the block of ``n`` tokens at ``i`` is taken out and put back at ``j`` of what is left;
    * ``("exchange", i, j)``: the tokens at ``i`` and ``j`` change places;
    * ``("reverse", i, n)``: the ``n`` tokens from ``i`` are reversed;
    * ``("insert_delete", i, v, j)``: ``v`` is inserted at ``i`` and the token at ``j`` of the result deleted."""
    kind, out = op[0], list(ids)
    if kind == "swap":
        out[op[1]] = op[2]
    elif kind == "move":
        _, i, n, j = op
        block = out[i:i + n]
        del out[i:i + n]
        out[j:j] = block
    elif kind == "exchange":
        _, i, j = op
        out[i], out[j] = out[j], out[i]
    elif kind == "reverse":
        _, i, n = op
        out[i:i + n] = out[i:i + n][::-1]
    elif kind == "insert_delete":
        _, i, v, j = op
        out.insert(i, v)
        del out[j]
    else:
        raise ValueError(f"unknown edit {op!r}")
    return out


def _pick(pool: list, n: int, gen) -> list:
    if n <= 0 or not pool:
        return []
    return [pool[i] for i in torch.randperm(len(pool), generator=gen)[:n].tolist()]


def _swaps(top: torch.Tensor, order: torch.Tensor, n: int, gen) -> list[tuple]:
    """``n`` swaps: the best-ranked first (``order`` indexes ``top`` flattened), then random ones."""
    T, k = top.shape
    if n <= 0:
        return []
    head = order[: n // 2]
    rest = order[n // 2:]
    pick = torch.cat([head, rest[torch.randperm(len(rest), generator=gen)[: n - len(head)]]])
    return [("swap", t, int(top[t, j])) for t, j in (divmod(f, k) for f in pick.tolist())]


def order_edits(T: int, max_block: int = 3) -> dict[str, list[tuple]]:
    """Every edit of word order of a length-``T`` sequence, by kind, each order reached once: moves of blocks of 1 to
    ``max_block`` tokens to every other place, exchanges of two tokens anywhere, reversals of spans of 3 or 4."""
    every = {"move": [("move", i, n, j) for n in range(1, max_block + 1) for i in range(T - n + 1)
                      for j in range(T - n + 1) if j != i],
             "exchange": [("exchange", i, j) for i in range(T) for j in range(i + 1, T)],
             "reverse": [("reverse", i, n) for n in (3, 4) for i in range(T - n + 1)]}
    seen, out = {tuple(range(T))}, {}
    for kind, ops in every.items():
        out[kind] = []
        for op in ops:
            key = tuple(apply(list(range(T)), op))
            if key not in seen:
                seen.add(key)
                out[kind].append(op)
    return out


def _orders(T: int, n: int, gen, table: dict) -> list[tuple]:
    """``n`` edits of word order: half block moves, a third exchanges, the rest reversals."""
    if n <= 0 or T < 2:
        return []
    if T not in table:
        table[T] = order_edits(T)
    e = table[T]
    n_ex = n // 3 if e["exchange"] else 0
    n_rev = min(len(e["reverse"]), n // 6)
    return _pick(e["move"], n - n_ex - n_rev, gen) + _pick(e["exchange"], n_ex, gen) + _pick(e["reverse"], n_rev,
                                                                                              gen)


def _insdels(T: int, top: torch.Tensor, n: int, gen) -> list[tuple]:
    k = top.shape[1]
    if n <= 0 or T < 2:
        return []
    out = []
    for _ in range(n):
        i, j = (int(x) for x in torch.randint(0, T, (2,), generator=gen))
        v = int(top[i, int(torch.randint(0, min(k, 8), (1,), generator=gen))])
        out.append(("insert_delete", i, v, j if j < i else j + 1))
    return out


def _pairs(ops: list[tuple], n: int) -> list[tuple]:
    """Up to ``n`` pairs of the edits ``ops`` (best first), each ``("pair", edit, edit)``: applied in turn."""
    out = []
    for a in range(len(ops)):
        for b in range(a + 1, len(ops)):
            if len(out) >= n:
                return out
            out.append(("pair", ops[a], ops[b]))
    return out


def _kind(op: tuple) -> str:
    return op[0]


def _apply_all(ids: list[int], op: tuple) -> list[int]:
    """``ids`` with one edit, or with the edits of a ``("pair" | "merged", edit, edit, ...)`` applied in turn."""
    if op[0] not in ("pair", "merged"):
        return apply(ids, op)
    for o in op[1:]:
        ids = apply(ids, o)
    return ids


def correct(searcher, start: torch.Tensor, target: torch.Tensor, opt: CorrectOptions, forwards: int,
            deadline: float = math.inf, gen: torch.Generator | None = None) -> Corrected:
    """Correct ``start`` ``(T,)`` toward the pooled ``target`` ``(D,)`` with at most ``forwards`` candidate
    sequences evaluated (the start included) and until ``deadline`` (``time.perf_counter()``). ``searcher`` gives
    ``objective(ids (B, T), target) -> (objective, distance)`` and ``scores(ids (T,), target) -> (T, V)``."""
    run = _Correction(searcher, start, target, opt, forwards, gen or torch.Generator().manual_seed(0))
    while run.used < forwards and run.d > opt.tol and run.stale < opt.patience and time.perf_counter() < deadline:
        run.step(deadline)
    return Corrected(run.cur.tolist(), run.obj, run.d, run.runner, run.used, run.steps, run.accepted)


class _Correction:
    """One correction under way (:func:`correct`): the current sequence, its objective and distance, the forwards
    used, the steps taken and those without a fall, the runner-up's distance and the accepted edits by kind."""

    def __init__(self, searcher, start: torch.Tensor, target: torch.Tensor, opt: CorrectOptions, forwards: int,
                 gen: torch.Generator):
        self.searcher, self.target, self.opt, self.forwards, self.gen = searcher, target, opt, forwards, gen
        self.cur = start.clone().long()
        obj, d = searcher.objective(self.cur[None], target)
        self.obj, self.d = float(obj[0]), float(d[0])
        self.used, self.steps, self.stale, self.runner = 1, 0, 0, math.inf
        self.accepted = {"swap": 0, "move": 0, "exchange": 0, "reverse": 0, "insert_delete": 0, "pair": 0,
                         "merged": 0}
        self.T, self.table = len(self.cur), {}

    def step(self, deadline: float) -> None:
        """Rank, edit, verify (the improving swaps merged, or the best edits paired when none improves), and keep
        the best when it lowers the objective."""
        b = min(self.opt.batch_size, self.forwards - self.used)
        got = self.verify(self.edits(b))
        if got is None:
            self.stale += 1
            return
        self.steps += 1
        got = self.merged(got)
        got = self.paired(got, b, deadline)
        self.settle(*got)

    def edits(self, b: int) -> list[tuple]:
        """A batch of ``b`` edits of the current sequence: swaps ranked by the gradient (and half of them by the
        token table where the searcher has one), word-order edits and insert/deletes."""
        opt, cur, T = self.opt, self.cur, self.T
        scores = self.searcher.scores(cur, self.target)  # (T, V)
        scores[torch.arange(T), cur] = math.inf  # a swap changes the token
        k = min(opt.topk, scores.shape[1] - 1)
        sv, top = scores.topk(k, dim=1, largest=False)  # (T, k) each
        order = sv.flatten().argsort()  # best-ranked swaps over all positions first
        n_table = 0
        if opt.table_topk and hasattr(self.searcher, "table_scores"):
            # half the swaps ranked by the token table instead: missing content words, wherever they go
            ts = self.searcher.table_scores(cur, self.target)  # (T, V)
            ts[torch.arange(T), cur] = math.inf
            tv, ttop = ts.topk(min(opt.table_topk, ts.shape[1] - 1), dim=1, largest=False)
            n_table = (b - int(b * opt.move_share) - int(b * opt.insert_share)) // 2
        n_move = int(b * opt.move_share) if T > 1 else 0
        n_ins = int(b * opt.insert_share) if T > 1 else 0
        orders, insdels = _orders(T, n_move, self.gen, self.table), _insdels(T, top, n_ins, self.gen)
        ops = _swaps(top, order, b - len(orders) - len(insdels) - n_table, self.gen) + orders + insdels
        if n_table:
            ops += _swaps(ttop, tv.flatten().argsort(), n_table, self.gen)
        return ops

    def verify(self, ops: list[tuple]):
        """The edits' distinct new sequences, verified: (ops, (B, T) ids, objectives, distances) or None."""
        opt, target = self.opt, self.target
        base = self.cur.tolist()
        seen, keep, seqs = {tuple(base)}, [], []
        for op in ops:
            c = _apply_all(base, op)
            key = tuple(c)
            if key not in seen:
                seen.add(key)
                keep.append(op), seqs.append(c)
        keep, seqs = keep[: self.forwards - self.used], seqs[: self.forwards - self.used]
        if not keep:
            return None
        batch = torch.tensor(seqs)  # (B, T)
        if opt.screen and len(keep) > 2 * opt.screen and getattr(self.searcher, "screens", False):
            # ranked in bfloat16, the nearest verified in float32: only verified ones are kept below
            rough = self.searcher.rough(batch, target)  # (B,)
            near = rough.argsort()[: opt.screen]
            keep, batch = [keep[i] for i in near.tolist()], batch[near]
            self.used += len(rough) - len(keep)  # the screen's forwards; the verified ones are counted below
        o, dist = self.searcher.objective(batch, target)  # (B,), (B,)
        self.used += len(keep)
        return keep, batch, o, dist

    def merged(self, got: tuple) -> tuple:
        """``got`` and, when it improves, its improving swaps at different positions, the best 2, 3, ... of them at
        once (each verified)."""
        keep, batch, o, dist = got
        if not (self.opt.merge > 1 and float(o.min()) < self.obj and self.used < self.forwards):
            return got
        better = [keep[i] for i in o.argsort().tolist() if float(o[i]) < self.obj and keep[i][0] == "swap"]
        chosen, at = [], set()
        for op in better:
            if op[1] not in at:
                chosen.append(op), at.add(op[1])
        more = self.verify([("merged", *chosen[:m]) for m in range(2, min(len(chosen), self.opt.merge) + 1)])
        if more is None:
            return got
        return keep + more[0], torch.cat([batch, more[1]]), torch.cat([o, more[2]]), torch.cat([dist, more[3]])

    def paired(self, got: tuple, b: int, deadline: float) -> tuple:
        """``got``, or where no single edit lowers the objective, the best single edits two at a time (word order and
        a word together), verified."""
        keep, _, o, dist = got
        if not (float(o.min()) >= self.obj and self.opt.pair_top > 1 and self.used < self.forwards
                and time.perf_counter() < deadline):
            return got
        self.runner = min(self.runner, float(dist.min()))
        ranked = [keep[i] for i in o.argsort()[: self.opt.pair_top].tolist()]
        paired = self.verify(_pairs(ranked, b))
        return got if paired is None else paired

    def settle(self, keep: list, batch: torch.Tensor, o: torch.Tensor, dist: torch.Tensor) -> None:
        """The best verified edit replaces the current sequence if it lowers the objective (a step without a fall
        otherwise); the runner-up is the nearest other sequence seen."""
        best = int(o.argmin())
        if float(o[best]) < self.obj:
            self.runner = min(self.runner, self.d, float(torch.cat([dist[:best], dist[best + 1:]]).min())
                              if len(keep) > 1 else self.d)
            self.cur, self.obj, self.d = batch[best].clone(), float(o[best]), float(dist[best])
            self.accepted[_kind(keep[best])] += 1
            self.stale = 0
        else:
            self.runner = min(self.runner, float(dist.min()))
            self.stale += 1
