"""The pooled search that gives the text back: propose, then correct with the weights in the loop, then certify.

1. **Propose** (:mod:`memlab.probes.invert.pooled.propose`): a causal language model's beams kept by the encoder's own
   pooled distance to the target (for a causal encoder, its greedy text when no proposer is loaded).
2. **Correct** (:mod:`memlab.probes.invert.pooled.correct`): gradient-ranked swaps, moves and insert/deletes, each
   verified exactly, until no edit lowers the objective; then the best is perturbed (a few random edits) and
   corrected again while the budget lasts (iterated local search), the best over all rounds kept.
3. **Certify**: a sequence whose pooled state matches the target within ``certify`` (relative distance; float
   noise is about 1e-6) *is* a text with the target's state; the runner-up (the nearest other sequence evaluated)
   says how near the next candidate came.

The budget is GFLOP-equivalents per chunk (seconds times the matmul rate measured in the run), and at most
``forwards`` encoder forwards; the proposal's language-model passes are counted in the seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from memlab.probes.invert.pooled.correct import CorrectOptions, correct
from memlab.probes.invert.pooled.searcher import PooledResult

METHODS = ("propose-correct", "propose", "correct", "swap")
"""The methods a :class:`Recoverer` runs itself (the relaxation's, ``relax`` and ``relax-correct``, are the run's:
it relaxes a batch of chunks and hands each one's nearest projection here as ``start``)."""


@dataclass
class RecoverResult(PooledResult):
    """The search of one pooled state: :class:`~memlab.probes.invert.pooled.searcher.PooledResult`'s fields and what the
    stages reached."""

    runner_up: float = math.inf
    """Relative distance of the nearest evaluated sequence other than ``ids``."""
    proposal: str = ""
    """The proposal's text (empty without a proposer)."""
    rounds: int = 0
    accepted: dict = field(default_factory=dict)


def perturb(ids: torch.Tensor, n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """``ids`` ``(T,)`` with ``n`` random edits: a move of one token (half the time) or a random token."""
    out = ids.clone()
    T = len(out)
    for _ in range(n):
        if T > 1 and float(torch.rand((), generator=gen)) < 0.5:
            i, j = (int(x) for x in torch.randint(0, T, (2,), generator=gen))
            lst = out.tolist()
            lst.insert(j, lst.pop(i))
            out = torch.tensor(lst)
        else:
            out[int(torch.randint(0, T, (1,), generator=gen))] = int(torch.randint(0, vocab, (1,), generator=gen))
    return out


class Recoverer:
    """Propose-then-correct over a :class:`~memlab.probes.invert.pooled.searcher.PooledSearcher` (the encoder side)."""

    def __init__(self, searcher, correct_opt: CorrectOptions, proposer=None, method: str = "propose-correct",
                 seconds: float = math.inf, forwards: int = 10**9, perturb_edits: int = 3,
                 pad_id: int | None = None, propose_share: float = 0.25):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.s, self.copt, self.proposer, self.method = searcher, correct_opt, proposer, method
        self.seconds, self.forwards, self.perturb_edits, self.pad_id = seconds, forwards, perturb_edits, pad_id
        self.propose_share = propose_share

    def _start(self, target: torch.Tensor, length: int, gen: torch.Generator,
                deadline: float) -> tuple[torch.Tensor, int, str]:
        """The first hypothesis ``(T,)``, the forwards it cost, the proposal's text."""
        if self.proposer is not None and self.method != "correct":
            bow = None
            if self.proposer.opt.bow_weight:
                blank = torch.full((length,), self.pad_id if self.pad_id is not None else 0)
                bow = self.s.scores(blank, target).min(0).values  # (V,)
            p = self.proposer.propose(self.s, target, length, bow, forwards=self.forwards - 1, deadline=deadline)
            if p is not None:
                return torch.tensor(p.ids), p.forwards, p.text
        if self.s.head is not None:  # a causal encoder without a proposer: its own greedy text
            return torch.tensor(self.s.head.continue_text(self.s.prefix or [0], length, None)), 0, ""
        fill = self.pad_id if self.pad_id is not None else int(torch.randint(0, self.s.reader.vocab_size, (1,),
                                                                             generator=gen))
        return torch.full((length,), fill), 0, ""

    def search(self, target: torch.Tensor, length: int, seed: int = 0, start: list[int] | None = None,
               seconds: float | None = None, forwards: int | None = None) -> RecoverResult:
        """The best sequence of ``length`` encoder tokens for the pooled ``target`` ``(D,)`` within the budget
        (``seconds``, ``forwards``: this search's, else the Recoverer's); ``start``: the hypothesis the correction
        starts from (e.g. the relaxation's nearest projection) instead of a proposal."""
        cap = self.forwards if forwards is None else forwards
        gen = torch.Generator().manual_seed(seed)
        target = target.float().cpu()
        began = time.perf_counter()
        seconds = self.seconds if seconds is None else seconds
        deadline = began + seconds
        # the proposal may take the whole budget alone, else at most this share of the time
        share = 1.0 if self.method == "propose" else self.propose_share
        if start is not None:
            cur, used, text = torch.tensor(start), 0, ""
        else:
            cur, used, text = self._start(target, length, gen, began + share * seconds)
        obj, d = self.s.objective(cur[None], target)
        used += 1
        best, best_obj, best_d, start_d = cur, float(obj[0]), float(d[0]), float(d[0])
        runner, steps, rounds, accepted, fails = math.inf, 0, 0, {}, 0
        if self.method != "propose":
            while used < cap and best_d > self.copt.tol and time.perf_counter() < deadline:
                r = correct(self.s, cur, target, self.copt, cap - used, deadline, gen)
                used, steps, rounds = used + r.forwards, steps + r.steps, rounds + 1
                for k, v in r.accepted.items():
                    accepted[k] = accepted.get(k, 0) + v
                if r.objective < best_obj:
                    runner = min(runner, best_d if rounds > 1 else math.inf, r.runner_up)
                    best, best_obj, best_d = torch.tensor(r.ids), r.objective, r.distance
                    fails = 0
                else:
                    runner = min(runner, r.distance if r.ids != best.tolist() else r.runner_up)
                    fails += 1
                # a round that found nothing nearer: the next kick is twice as large (up to 8 times, half the chunk)
                n = min(self.perturb_edits * 2 ** min(fails, 3), max(length // 2, self.perturb_edits))
                cur = perturb(best, n, self.s.reader.vocab_size, gen)
        return RecoverResult(best.tolist(), best_d, start_d, used, time.perf_counter() - began, steps, runner,
                             text, rounds, accepted)
