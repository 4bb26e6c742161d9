"""Correction of a hypothesis with the encoder's weights in the loop: edits ranked by the gradient, each verified.

A hypothesis is a sequence of ``T`` encoder tokens (``T`` the chunk's length). Each step:

1. **Rank.** One forward and backward pass gives the first-order change of the objective for every token at
   every position ``(T, V)`` (the gradient with respect to the one-hot inputs, as GCG and HotFlip rank swaps).
2. **Edit.** A batch of edits of the current sequence, drawn from three neighbourhoods, all of length ``T``:

   * *swap*: position ``t`` takes one of its ``topk`` best-ranked tokens (the best-ranked over all positions
     first, then drawn at random among the rest);
   * *move*: the token at ``i`` is taken out and put back at ``j`` (word order; ``j = i +- 1`` is a
     transposition);
   * *insert/delete*: a best-ranked token is inserted at ``i`` and the token at ``j`` deleted (a word missing
     here, one too many there).
3. **Verify.** Every edit's objective is computed exactly, in batches; the best replaces the current sequence
   when it lowers the objective. After ``patience`` steps without a fall the search has no better neighbour it
   can find; it stops early (the budget left goes unspent).

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


def _swaps(cur: torch.Tensor, top: torch.Tensor, order: torch.Tensor, n: int, gen) -> list[torch.Tensor]:
    """``n`` swaps: the best-ranked first (``order`` indexes ``top`` flattened), then random ones."""
    T, k = top.shape
    if n <= 0:
        return []
    head = order[: n // 2]
    rest = order[n // 2:]
    pick = torch.cat([head, rest[torch.randperm(len(rest), generator=gen)[: n - len(head)]]])
    out = []
    for f in pick.tolist():
        t, j = divmod(f, k)
        c = cur.clone()
        c[t] = top[t, j]
        out.append(c)
    return out


def _moves(cur: torch.Tensor, n: int, gen) -> list[torch.Tensor]:
    T = len(cur)
    if n <= 0 or T < 2:
        return []
    pairs = [(i, j) for i in range(T) for j in range(T) if i != j and j != i - 1]  # j = i - 1 == move of i-1 to i
    sel = torch.randperm(len(pairs), generator=gen)[:n].tolist()
    out = []
    for s in sel:
        i, j = pairs[s]
        lst = cur.tolist()
        tok = lst.pop(i)
        lst.insert(j, tok)
        out.append(torch.tensor(lst))
    return out


def _insdels(cur: torch.Tensor, top: torch.Tensor, n: int, gen) -> list[torch.Tensor]:
    T, k = top.shape
    if n <= 0 or T < 2:
        return []
    out = []
    for _ in range(n):
        i, j = (int(x) for x in torch.randint(0, T, (2,), generator=gen))
        v = int(top[i, int(torch.randint(0, min(k, 8), (1,), generator=gen))])
        lst = cur.tolist()
        lst.insert(i, v)
        del lst[j if j < i else j + 1]
        out.append(torch.tensor(lst))
    return out


def correct(searcher, start: torch.Tensor, target: torch.Tensor, opt: CorrectOptions, forwards: int,
            deadline: float = math.inf, gen: torch.Generator | None = None) -> Corrected:
    """Correct ``start`` ``(T,)`` toward the pooled ``target`` ``(D,)`` with at most ``forwards`` candidate
    sequences evaluated (the start included) and until ``deadline`` (``time.perf_counter()``). ``searcher`` gives
    ``objective(ids (B, T), target) -> (objective, distance)`` and ``scores(ids (T,), target) -> (T, V)``."""
    gen = gen or torch.Generator().manual_seed(0)
    cur = start.clone().long()
    obj, d = searcher.objective(cur[None], target)
    cur_obj, cur_d = float(obj[0]), float(d[0])
    used, steps, stale, runner = 1, 0, 0, math.inf
    accepted = {"swap": 0, "move": 0, "insert_delete": 0}
    T = len(cur)
    while used < forwards and cur_d > opt.tol and stale < opt.patience and time.perf_counter() < deadline:
        b = min(opt.batch_size, forwards - used)
        scores = searcher.scores(cur, target)  # (T, V)
        scores[torch.arange(T), cur] = math.inf  # a swap changes the token
        k = min(opt.topk, scores.shape[1] - 1)
        sv, top = scores.topk(k, dim=1, largest=False)  # (T, k) each
        order = sv.flatten().argsort()  # best-ranked swaps over all positions first
        n_move = int(b * opt.move_share) if T > 1 else 0
        n_ins = int(b * opt.insert_share) if T > 1 else 0
        moves, insdels = _moves(cur, n_move, gen), _insdels(cur, top, n_ins, gen)
        swaps = _swaps(cur, top, order, b - len(moves) - len(insdels), gen)
        cands = swaps + moves + insdels
        kinds = ["swap"] * len(swaps) + ["move"] * len(moves) + ["insert_delete"] * len(insdels)
        seen, keep = {tuple(cur.tolist())}, []
        for c, kind in zip(cands, kinds):
            key = tuple(c.tolist())
            if key not in seen:
                seen.add(key)
                keep.append((c, kind))
        if not keep:
            stale += 1
            continue
        batch = torch.stack([c for c, _ in keep])  # (B, T)
        o, dist = searcher.objective(batch, target)  # (B,), (B,)
        used += len(keep)
        steps += 1
        best = int(o.argmin())
        if float(o[best]) < cur_obj:
            runner = min(runner, cur_d, float(torch.cat([dist[:best], dist[best + 1:]]).min()) if len(keep) > 1
                         else cur_d)
            cur, cur_obj, cur_d = batch[best].clone(), float(o[best]), float(dist[best])
            accepted[keep[best][1]] += 1
            stale = 0
        else:
            runner = min(runner, float(dist.min()))
            stale += 1
    return Corrected(cur.tolist(), cur_obj, cur_d, runner, used, steps, accepted)
