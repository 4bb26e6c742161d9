"""The first position after an empty prefix searched in a ranked order, its candidates shared by every chunk.

A model that reads no BOS starts every chunk at its attention sink, where the gradient ranks poorly and the recovered
prefix gives no next-token distribution. The full table (:mod:`memlab.probes.invert.positions.firsttable`) is one
pass of every token through the first ``L`` blocks: the costliest part of a run on a large vocabulary (45 minutes for
a 1.5B model with 151,936 tokens at its middle layer on a 2-core CPU). Yet a first-position state depends on its
token alone, so every candidate's state serves every chunk at once, and most chunks settle early in a good order:

1. **The order.** A prior over first tokens from the model itself (:func:`first_prior`): its next-token
   distribution after its end-of-text token (the start of a document) and averaged over a continuation it samples
   from there (running text), each token also given the probability of its space-prefixed twin (a chunk's text
   starts without the space its words carry inside a text). Taken in turn with the secant order of each chunk (a
   linear map from embedding rows to first states fitted to the verified states, nearest the chunk's own state first,
   :mod:`memlab.probes.invert.positions.secant`), refitted as the verified states grow by half, and the product of
   the two rankings' ranks.
2. **Shared rounds.** Each round every open chunk names its next untried candidates; the states of those no chunk
   named before are computed (once, and kept for the pass), and each chunk compares its own with its state (as a
   difference, as the other positions do). Rounds grow from ``first_batch`` per chunk, twice as many each
   round, to ``exhaustive_batch``.
3. **Stop** each chunk at its certificate, as at any other position (``match`` or ``separated``); past ``budget``
   candidates it goes on in the same order to the end of the vocabulary unless ``exhaustive`` is off. Where every
   token was verified the chunk's certificate is the full table's (``nearest`` possible).

The positions are counted apart from the ranked ones (``from_table``, as the table's are): their candidates were
shared by the chunks of the pass.
"""

from __future__ import annotations

import time

import torch

from memlab.probes.invert.positions.lockstep import SECANT_KEEP, SECANT_REFIT
from memlab.probes.invert.positions.rank import fused, interleave, best_untried
from memlab.probes.invert.positions.searcher import Position, _Best
from memlab.probes.invert.positions.secant import secant_scores
CONTINUATION = 96
"""Tokens of the continuation the model samples from its end-of-text token for the running-text prior."""


@torch.no_grad()
def first_prior(head, tokenizer, vocab_size: int, seed: int = 0) -> torch.Tensor | None:
    """Scores ``(V,)`` of every token as a chunk's first token (lower: likelier), from the model's next-token
    distribution (``head``: :class:`memlab.probes.invert.positions.rank.NextTokenHead`); None without a head or an
    end-of-text token to start from."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if head is None or eos is None:
        return None

    def probs(h: torch.Tensor) -> torch.Tensor:  # (T, D) -> (T, V)
        return torch.softmax(head.logits(h).float()[:, :vocab_size], -1)

    top = head.top  # the reader of every block, its cache grown one token at a time
    gen, prefix = torch.Generator().manual_seed(seed), top.start([])
    h = [top.extend(prefix, int(eos))]  # each (D,)
    for _ in range(CONTINUATION):
        h.append(top.extend(prefix, int(torch.multinomial(probs(h[-1][None])[0], 1, generator=gen))))
    p = probs(torch.stack(h))  # (T, V)
    prior = torch.maximum(p[0], p[1:].mean(0))  # (V,) a document's start, running text
    names = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    index = {t: i for i, t in enumerate(names) if isinstance(t, str)}
    twin = prior.clone()
    for i, t in enumerate(names):  # "Ġword" / "▁word" lends its probability to "word"
        if isinstance(t, str) and len(t) > 1 and t[0] in "Ġ▁":
            j = index.get(t[1:])
            if j is not None and prior[i] > twin[j]:
                twin[j] = prior[i]
    return -twin


class _Chunk:
    def __init__(self, target: torch.Tensor, noise: float, v: int):
        self.target, self.best = target.float(), _Best(noise=noise)
        self.tried = torch.zeros(v, dtype=torch.bool)  # (V,)
        self.xs, self.hs = torch.zeros(0, dtype=torch.long), torch.zeros(0, target.shape[-1])  # its verified pairs
        self.secant, self.secant_n, self.done = None, 0, False
        self.found_at, self.seconds, self.rounds = None, 0.0, 0

    @property
    def n_tried(self) -> int:
        return int(self.tried.sum())

    def add(self, tokens: torch.Tensor, states: torch.Tensor) -> None:
        """Fold its verified ``tokens`` ``(b,)`` (their states ``(b, D)``) in; keep the nearest pairs for the secant."""
        d = (states - self.target).norm(dim=-1) / self.target.norm().clamp_min(1e-30)  # (b,)
        before = self.best.token
        self.best.add(tokens, d)
        if self.best.token != before:  # verified in this round (a round's states are computed together)
            self.found_at = self.n_tried + tokens.numel()
        self.tried[tokens] = True
        self.xs, self.hs = torch.cat([self.xs, tokens]), torch.cat([self.hs, states])
        if self.xs.numel() > 2 * SECANT_KEEP:
            keep = torch.topk((self.hs - self.target).norm(dim=-1), SECANT_KEEP, largest=False).indices
            self.xs, self.hs = self.xs[keep], self.hs[keep]

    def refit(self, table: torch.Tensor, o) -> None:
        """Fit (or refit, once its verified candidates grew by half) its secant order."""
        seen = self.n_tried
        if not o.secant or seen < o.secant_after or (self.secant is not None and seen < SECANT_REFIT * self.secant_n):
            return
        keep = torch.topk((self.hs - self.target).norm(dim=-1), min(SECANT_KEEP, self.xs.numel()), largest=False).indices
        fit = secant_scores(table, table[self.xs[keep]], self.hs[keep], self.target)
        self.secant_n = seen
        if fit is not None:
            self.secant = fit


@torch.no_grad()
def first_ranked(searcher, prefix_ids: list[int], targets: torch.Tensor, prior: torch.Tensor | None = None,
                 floors: torch.Tensor | None = None, on_batch=None) -> list[Position]:
    """The first position of ``n`` chunks (their states ``targets`` ``(n, D)`` after ``prefix_ids``) by shared
    rounds in a ranked order (the module doc); ``prior`` ``(V,)``: :func:`first_prior` (None: the secant order
    alone, from a spread sample of the vocabulary); ``floors`` ``(n,)``: the noise floors as read (None: 0);
    ``on_batch(k)`` after each round of ``k`` states computed (at most ``V`` in all).

    Each chunk reads only the candidates it named itself (the states of a round are computed once for all), so its
    result is the one it gets searched alone, whichever chunks share the pass."""
    o, r = searcher.opts, searcher.reader
    v, n = r.vocab_size, targets.shape[0]
    floors = torch.zeros(n) if floors is None else floors.float()
    chunks = [_Chunk(targets[j], float(floors[j]), v) for j in range(n)]
    prefix, table = r.start(prefix_ids), searcher.table  # table: (V, D_e) the embedding rows
    spread = torch.randperm(v, generator=torch.Generator().manual_seed(0))  # (V,) no prior: a spread start
    base = prior if prior is not None else torch.empty(v).scatter_(0, spread, torch.arange(v, dtype=torch.float))
    known = torch.zeros(v, dtype=torch.bool)  # tokens whose first states were computed, kept in `store`
    store = torch.empty(v, targets.shape[1])  # (V, D) pages only where written
    while True:
        open_ = [c for c in chunks if not c.done]
        if not open_:
            break
        began = time.perf_counter()
        cand = []
        for c in open_:
            k = min(o.first_batch * 2**c.rounds, o.exhaustive_batch)
            c.refit(table, o)
            ranks = [base] + ([c.secant, fused([base, c.secant])] if c.secant is not None else [])
            cand.append(interleave([best_untried(x, c.tried, k) for x in ranks], c.tried, k))
        new = torch.unique(torch.cat(cand))
        new = new[~known[new]]  # (B,) what no chunk named before
        for i in range(0, new.numel(), o.exhaustive_batch):
            part = new[i : i + o.exhaustive_batch]
            store[part] = r.candidate_states(prefix, part).float().cpu()
        known[new] = True
        spent = (time.perf_counter() - began) / len(open_)
        for c, mine in zip(open_, cand):
            c.add(mine, store[mine])
            c.rounds, c.seconds = c.rounds + 1, c.seconds + spent
            c.done = (c.best.settled(o) or c.n_tried >= v
                      or (c.n_tried >= min(o.budget, v) and not o.exhaustive))
        if on_batch is not None:
            on_batch(new.numel())
    return [Position(c.best.token, c.best.d1, c.best.d2, c.best.certificate(o, c.n_tried >= v), c.n_tried,
                     c.n_tried >= min(o.budget, v), c.seconds, found_at=c.found_at, from_table=True,
                     noise=c.best.noise) for c in chunks]
