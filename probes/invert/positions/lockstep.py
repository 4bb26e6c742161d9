"""Many chunks searched together, position by position: every chunk of a group is at the same position at once, so
their candidates are verified in one batched pass (large matmuls) against one batched key-value cache.

Each position of each chunk of the group (chunks of one group advance in lockstep, so every prefix has the same
length and their caches stack along the batch):

1. **Rank** by two orders of the vocabulary (:mod:`memlab.probes.invert.positions.rank`): the model's next-token
   distribution from the recovered prefix (the prior; none for a model whose head cannot be read, or with
   ``prior=False``) and the first-order score twice: linearised at the mean embedding row (once per position) and
   at the best verified token (re-linearised whenever it changes; near the answer it is the sharper of the two,
   at a wrong token far away the blunter), once ``secant_after`` candidates were verified the secant order (a
   linear map from embedding rows to states fitted to the verified candidates, :mod:`memlab.probes.invert.positions.secant`,
   refitted as they grow by half), and the product of all these rankings' ranks. They are taken in turn. With a
   prior the first round is the prior's alone (natural text is mostly settled there, and the gradient passes are
   saved).
2. **Verify** the next untried candidates of every unsettled chunk in one batched pass through the first ``L``
   blocks: ``first_batch`` in the first round, twice as many each round after, at most ``batch_size``; past
   ``budget`` ranked candidates the position is *exhaustive* and rounds of ``exhaustive_batch`` continue the same
   ranking to the end of the vocabulary. A chunk stops at its certificate (``match`` or ``separated``; see
   :mod:`memlab.probes.invert.positions.searcher`), at an ``ambiguous`` pair no later candidate can lift (states
   read at a lower precision), or when the vocabulary is spent (``nearest`` or ``none``).
3. **Extend** every chunk by its kept token in one pass through all the blocks: the cache grows by one position,
   and the last block's output gives the prior of the next position.

The first position after an empty prefix (a model that reads no BOS) has no prior and is the model's attention
sink, where the gradient ranks poorly: it is searched before, in rounds shared by all chunks
(:mod:`memlab.probes.invert.positions.firstranked`), or read off one table of every token's first state
(:meth:`memlab.probes.invert.positions.searcher.Searcher.first_positions`). After a BOS it is searched as any other.

A chunk's result does not depend on which other chunks share its group (each row's ranking and certificate read
only its own states), so a resumed run that groups the remaining chunks differently finds the same tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from memlab.probes.invert.options import PositionsOptions
from memlab.probes.invert.positions.searcher import Position, Searcher, _Best
from memlab.probes.invert.positions.rank import NextTokenHead, best_untried, fused, interleave, rank_of
from memlab.probes.invert.positions.secant import secant_scores
from memlab.probes.invert.layer import LayerReader, row_bytes, select_rows


PASS_ROWS = 4096
"""Most candidate rows in one verification pass."""

SECANT_REFIT = 1.5
"""The secant order is refitted when a position's verified candidates have grown by this factor since its last
fit (so a position fits it a logarithmic number of times)."""

SECANT_KEEP = 4096
"""Most verified pairs a position keeps for the secant fit (the nearest ones)."""

LockstepOptions = PositionsOptions
"""The per-position search's options (:class:`memlab.probes.invert.options.PositionsOptions`): ``first_batch``,
``prior``, ``chunk_batch`` and ``pass_memory_mb`` are the lockstep search's own."""


@dataclass
class _Row:
    """One chunk's search of its current position."""

    target: torch.Tensor  # (D,)
    prior: torch.Tensor | None  # (V,) lower is likelier (negated logits)
    tried: torch.Tensor  # (V,) bool
    true: int | None
    mean_scores: torch.Tensor | None = None  # (V,) the first-order scores at the mean embedding row
    d_mean: float = float("inf")  # the relative distance at the mean row
    best_scores: torch.Tensor | None = None  # (V,) the scores at the best verified token ...
    lin_token: int | None = None  # ... this one
    secant_scores: torch.Tensor | None = None  # (V,) the secant order's predicted distances ...
    secant_n: int = 0  # ... fitted on this many verified pairs
    xs: list = field(default_factory=list)  # verified tokens, one (b,) tensor per round
    hs: list = field(default_factory=list)  # their states, (b, D) float32 each
    ds: list = field(default_factory=list)  # their relative distances, (b,) each
    best: _Best = field(default_factory=_Best)
    rounds: int = 0
    seconds: float = 0.0
    exhaustive: bool = False
    done: bool = False
    prior_rank: int | None = None
    grad_rank: int | None = None
    secant_rank: int | None = None
    found_at: int | None = None
    """Candidates verified when the kept token was first verified."""

    @property
    def n_tried(self) -> int:
        return int(self.tried.sum())

    def remember(self, tokens: torch.Tensor, states: torch.Tensor, dist: torch.Tensor) -> None:
        """Keep verified pairs for the secant fit: past twice ``SECANT_KEEP`` only the nearest ``SECANT_KEEP``."""
        self.xs.append(tokens)
        self.hs.append(states)
        self.ds.append(dist)
        if sum(x.numel() for x in self.xs) > 2 * SECANT_KEEP:
            self.trim()

    def trim(self) -> None:
        xs, hs, ds = torch.cat(self.xs), torch.cat(self.hs), torch.cat(self.ds)
        if xs.numel() > SECANT_KEEP:
            keep = torch.topk(ds, SECANT_KEEP, largest=False).indices
            xs, hs, ds = xs[keep], hs[keep], ds[keep]
        self.xs, self.hs, self.ds = [xs], [hs], [ds]


class Lockstep:
    """Searches groups of chunks position by position against ``reader`` (a :class:`LayerReader`)."""

    def __init__(self, reader: LayerReader, opts: LockstepOptions | None = None, head_weight: torch.Tensor | None = None):
        """``head_weight``: the model's own output embeddings ``(V, D)`` where they are not tied to its input table
        (:func:`memlab.probes.invert.head.output_embeddings`), for the prior."""
        self.reader, self.opts = reader, opts or LockstepOptions()
        self.table = reader.embedding.float()  # (V, D_e)
        self.mean_row = self.table.mean(0)  # (D_e,)
        self.head = NextTokenHead.of(reader, head_weight) if self.opts.prior else None
        self.walker = self.head.top if self.head is not None else reader  # the reader that extends the prefixes
        self.first = Searcher(reader, self.opts)

    # passes over a group's batched cache
    @torch.no_grad()
    def _start(self, prefix_ids: list[int], n: int):
        """The group's cache of ``n`` rows of ``prefix_ids`` and the prior of the first position ``(n, V)`` (None
        without a prefix or a head)."""
        cache = self.reader._new_cache()
        if not prefix_ids:
            return cache, None
        ids = torch.tensor([prefix_ids] * n)  # (n, p)
        h = self.walker._run(self.walker.embed(ids), cache)[:, -1]  # (n, D)
        return cache, (-self.head.logits(h) if self.head is not None else None)

    @torch.no_grad()
    def _extend(self, cache, tokens: torch.Tensor) -> torch.Tensor | None:
        """Append ``tokens`` ``(n,)`` (one per row) to the cache in place; the next position's prior ``(n, V)``."""
        h = self.walker._run(self.walker.embed(tokens.view(-1, 1)), cache)[:, 0]  # (n, D)
        return -self.head.logits(h) if self.head is not None else None

    def _pass_rows(self, cache) -> int:
        per = row_bytes(cache, self.reader.layer)
        cap = int(self.opts.pass_memory_mb * 2**20 // per) if per else PASS_ROWS
        return max(1, min(PASS_ROWS, cap))

    @torch.no_grad()
    def _verify(self, cache, rows: torch.Tensor, tokens: torch.Tensor, targets: torch.Tensor):
        """Relative distances ``(R,)`` of candidate ``tokens`` ``(R,)`` at the next position of the group's ``rows``
        ``(R,)``, whose observed states are ``targets`` ``(R, D)``, and the candidates' states ``(R, D)`` (float32,
        on the CPU)."""
        r, out, states, step = self.reader, [], [], self._pass_rows(cache)
        for s in range(0, tokens.numel(), step):
            sub = select_rows(cache, rows[s : s + step], r.layer)
            h = r._run(r.embed(tokens[s : s + step].view(-1, 1)), sub)[:, 0].float()  # (b, D)
            t = targets[s : s + step].to(h.device)  # (b, D)
            out.append(((h - t).norm(dim=-1) / t.norm(dim=-1).clamp_min(1e-30)).cpu())
            states.append(h.cpu())
        return torch.cat(out), torch.cat(states)  # (R,), (R, D)

    def _secant(self, state: list, open_: list[int]) -> None:
        """Fit or refit the secant order of each open row that has verified enough candidates
        (:mod:`memlab.probes.invert.positions.secant`)."""
        o = self.opts
        for i in open_:
            s = state[i]
            n = s.n_tried
            if not o.secant or n < o.secant_after or (s.secant_scores is not None and n < SECANT_REFIT * s.secant_n):
                continue
            s.trim()  # the nearest SECANT_KEEP pairs, kept for later fits too
            fit = secant_scores(self.table, self.table[s.xs[0].to(self.table.device)], s.hs[0], s.target)
            s.secant_n = n
            if fit is None:  # no map to fit (rows that do not vary): the other orders go on alone
                continue
            s.secant_scores = fit
            if s.true is not None and s.secant_rank is None:
                s.secant_rank = rank_of(s.secant_scores, s.true)

    def _scores(self, cache, rows: torch.Tensor, e0: torch.Tensor, targets: torch.Tensor):
        """First-order scores ``(m, V)`` of every token for the group's ``rows`` ``(m,)`` (a row may come twice),
        linearised at ``e0`` ``(m, D_e)``, and the relative distance ``(m,)`` at ``e0``: one forward and backward
        pass of the m rows."""
        r = self.reader
        x = e0.to(r.device, r.dtype).view(-1, 1, e0.shape[-1]).requires_grad_(True)  # (m, 1, D_e)
        with torch.enable_grad():
            h = r._run(x, select_rows(cache, rows, r.layer))[:, 0].float()  # (m, D)
            t = targets.to(h.device)  # (m, D)
            loss = (h - t).pow(2).sum(-1) / t.pow(2).sum(-1).clamp_min(1e-30)  # (m,)
            (g,) = torch.autograd.grad(loss.sum(), x)
        g = g[:, 0].float().cpu()  # (m, D_e)
        return g @ self.table.T - (g * e0).sum(-1, keepdim=True), loss.detach().sqrt().cpu()  # (m, V), (m,)

    def _gradients(self, cache, rows: list[int], state: list, open_: list[int]) -> int:
        """Bring each open row's first-order rankings up to date (one batched pass): at the mean embedding row once
        per position, and at the best verified token whenever that changed. Returns the rows of the pass."""
        want = []  # (state index, "mean" or "best")
        for i in open_:
            s = state[i]
            if s.mean_scores is None:
                want.append((i, "mean"))
            if self.opts.relinearize and s.best.token >= 0 and s.lin_token != s.best.token:
                want.append((i, "best"))
        if not want:
            return 0
        e0 = torch.stack([self.mean_row if kind == "mean" else self.table[state[i].best.token] for i, kind in want])
        idx = torch.tensor([rows[i] for i, _ in want])
        scores, dist = self._scores(cache, idx, e0, torch.stack([state[i].target for i, _ in want]))  # (w, V), (w,)
        for (i, kind), sc, d in zip(want, scores, dist):
            s = state[i]
            if kind == "mean":
                s.mean_scores, s.d_mean = sc, float(d)
            else:
                s.best_scores, s.lin_token = sc, s.best.token
        return len(want)

    def _size(self, row: _Row) -> int:
        o, v = self.opts, self.reader.vocab_size
        if row.n_tried >= min(o.budget, v) or row.exhaustive:
            return o.exhaustive_batch
        return min(o.first_batch * 2**row.rounds, o.batch_size, min(o.budget, v) - row.n_tried)

    def position(self, cache, rows: list[int], targets: torch.Tensor, priors: torch.Tensor | None,
                 trues: list[int | None], floors: list[float] | None = None) -> list[Position]:
        """Search the next position of the group's ``rows`` (their observed states ``targets`` ``(m, D)``, priors
        ``(m, V)`` or None, noise floors as read or None: 0) together; one :class:`Position` per row."""
        o, v = self.opts, self.reader.vocab_size
        state = []
        for i in range(len(rows)):
            p = priors[i] if priors is not None else None
            state.append(_Row(targets[i].float(), p, torch.zeros(v, dtype=torch.bool), trues[i],
                              best=_Best(noise=floors[i] if floors is not None else 0.0)))
        while True:
            open_ = [i for i, s in enumerate(state) if not s.done]
            if not open_:
                break
            began = time.perf_counter()
            idx = torch.tensor([rows[i] for i in open_])
            prior_only = all(state[i].prior is not None and state[i].rounds == 0 for i in open_)
            n_grad = 0 if prior_only else self._gradients(cache, rows, state, open_)
            self._secant(state, open_)
            cand, owner = [], []
            for j, i in enumerate(open_):
                s = state[i]
                if s.true is not None and s.rounds == 0 and s.prior is not None:
                    s.prior_rank = rank_of(s.prior, s.true)
                if s.true is not None and s.mean_scores is not None and s.grad_rank is None:
                    s.grad_rank = rank_of(s.mean_scores, s.true)
                k = self._size(s)
                rankings = [s.prior] + ([] if prior_only else [s.mean_scores, s.best_scores, s.secant_scores])
                rankings = [x for x in rankings if x is not None]
                if len(rankings) > 1:  # and all of them at once: the product of the ranks
                    rankings.append(fused(rankings))
                orders = [best_untried(x, s.tried, k) for x in rankings]
                c = interleave(orders, s.tried, k)  # (k,)
                cand.append(c)
                owner.append(torch.full((c.numel(),), j))
            tokens, own = torch.cat(cand), torch.cat(owner)  # (R,), (R,)
            dist, hs = self._verify(cache, idx[own], tokens, torch.stack([state[i].target for i in open_])[own])
            spent = time.perf_counter() - began
            grad = 4 * n_grad / len(open_)  # a gradient row costs about 4 candidate rows
            total = tokens.numel() + grad * len(open_)
            for j, i in enumerate(open_):
                s, mine = state[i], own == j
                before = s.best.token
                s.best.add(tokens[mine], dist[mine])
                if s.best.token != before:
                    s.found_at = s.n_tried + int(mine.sum())
                s.tried[tokens[mine]] = True
                if o.secant:
                    s.remember(tokens[mine], hs[mine], dist[mine])
                s.rounds += 1
                s.seconds += spent * (int(mine.sum()) + grad) / total
                if s.best.settled(o) or s.n_tried >= v:
                    s.done = True
                elif s.n_tried >= min(o.budget, v):  # the ranked budget is spent: on to the end, or stop
                    s.exhaustive, s.done = o.exhaustive, not o.exhaustive
        out = []
        for s in state:
            b = s.best
            ranks = [r for r in (s.prior_rank, s.grad_rank) if r is not None]
            out.append(Position(b.token, b.d1, b.d2, b.certificate(o, bool(s.tried.all())), s.n_tried, s.exhaustive,
                                s.seconds, min(ranks) if ranks else None, prior_rank=s.prior_rank,
                                grad_rank=s.grad_rank, secant_rank=s.secant_rank, found_at=s.found_at, noise=b.noise))
        return out

    def group(self, targets: list[torch.Tensor], prefix_ids: list[int], trues: list[list[int]] | None = None,
              firsts: list[Position] | None = None, on_chunk=None, on_position=None,
              floors: list[torch.Tensor] | None = None) -> list[list[Position]]:
        """Recover a group of chunks from their states (``targets``: each ``(T_i, D)``, the positions after
        ``prefix_ids``) together; ``trues``: the true tokens, to record their ranks only; ``firsts``: their first
        positions already searched (required after an empty prefix). ``on_chunk(j, positions)`` is called as each
        chunk finishes, ``on_position(position)`` after each position of each chunk; ``floors``: each chunk's noise
        floors ``(T_i,)`` as read (``--states-dtype``; None: 0)."""
        out: list[list[Position]] = [[] for _ in targets]
        for j, ps in self.finished(targets, prefix_ids, trues, firsts, on_position, floors):
            out[j] = ps
            if on_chunk is not None:
                on_chunk(j, ps)
        return out

    def finished(self, targets: list[torch.Tensor], prefix_ids: list[int], trues: list[list[int]] | None = None,
                 firsts: list[Position] | None = None, on_position=None, floors: list[torch.Tensor] | None = None):
        """As :meth:`group`, yielding ``(j, positions)`` as each chunk ``j`` finishes (the shortest first)."""
        n = len(targets)
        lengths = [t.shape[0] for t in targets]
        if not prefix_ids and firsts is None:
            raise ValueError("after an empty prefix the first positions are searched apart (shared by the chunks): pass firsts")
        cache, priors = self._start(prefix_ids, n)
        live = list(range(n))  # the group row of each live chunk is its index in `live`
        out: list[list[Position]] = [[] for _ in range(n)]
        for t in range(max(lengths)):
            if t == 0 and firsts is not None:
                got = [firsts[j] for j in live]
            else:
                tg = torch.stack([targets[j][t] for j in live])  # (m, D)
                tr = [trues[j][t] if trues is not None else None for j in live]
                fl = [float(floors[j][t]) for j in live] if floors is not None else None
                got = self.position(cache, list(range(len(live))), tg, priors, tr, fl)
            for j, p in zip(live, got):
                out[j].append(p)
                if on_position is not None:
                    on_position(p)
            keep = [r for r, j in enumerate(live) if lengths[j] > t + 1]
            if keep:  # the chunks that go on read their kept tokens; the finished ones are done
                began = time.perf_counter()
                rows = torch.tensor(keep)
                if len(keep) < len(live):
                    cache = select_rows(cache, rows)
                priors = self._extend(cache, torch.tensor([got[r].token for r in keep]))
                share = (time.perf_counter() - began) / len(keep)
                for r in keep:
                    got[r].seconds += share
            for j in live:
                if lengths[j] == t + 1:
                    yield j, out[j]
            live = [live[r] for r in keep]
            if not live:
                break
