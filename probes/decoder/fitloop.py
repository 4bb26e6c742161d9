"""The probe's fit: decoders trained as one batched group, and the loop that trains them beside other members.

A probe, its control (the same decoder on a constant embedding) and, with ``select_decoder``, the plain decoder
(no bag head, its own input dropout) have the same architecture, start from the same weights and see the same
batches in the same order. :func:`train_decoders` trains them together: their weights are stacked
(member g at index g of every tensor), one forward runs all of them (``torch.func.functional_call`` under
``torch.func.vmap``: batched matrix multiplies instead of one small pass per member), one backward and one AdamW
step update them. What each member would have on its own, it keeps:

* its optimiser state (AdamW's moments are element-wise, so a stacked tensor holds each member's own), its
  gradient clipping (each member's own norm) and the one learning-rate schedule they share;
* its training noise: each member draws from its own random stream, seeded as a decoder trained alone is, so the
  draws are the ones it would make alone;
* a member without a bag head (the plain decoder beside a bag-head probe) carries a zero bag head whose gradient
  is zeroed before every step: it stays exactly zero and adds exactly nothing;
* its early stopping: the held-back CE of every member is computed on the device and read once per epoch; a
  member that stops leaves the group with the weights of its best epoch, the others train on.

Other trainable members join the same loop (:func:`train_members`): a read-out trained by
gradient (the bag-of-words head, :class:`memlab.probes.readouts.bow.BagHeadMember`) is a unit of its own kind beside the
decoders' group. Its weights are a param group of the same optimiser (its own learning rate and weight decay where its
part's options say), it takes the same batches under the same schedule, and it stops on its own held-back loss and
keeps its own best epoch. With no sequence decoder the loop trains the read-out alone.

A decoder kind without the ``prepare``/``read`` modes (``group_modes`` false: e.g. another registered decoder)
still trains in a group, member by member, each through its own whole ``forward`` (its noise drawn there, from
its own stream); only trained weights are stacked (frozen ones stay the base decoder's own).

``batched=False`` runs the members' forward one after another within each step (the same arithmetic, member by
member; the default on a CPU, :data:`BATCHED`): ``tests/probes/test_probe_group.py`` checks that a batched group trains
as its members trained alone. The host reads the
device only at log points (every 10 steps) and once per epoch (the held-back CE).


The loop: :func:`train_members` trains *units*: a group of decoders (:class:`DecoderGroup`: probe, plain
decoder, control, stacked) and read-outs trained by gradient (the bag-of-words head,
:class:`memlab.probes.readouts.bow.BagHeadMember`). One AdamW (:func:`optimiser`) holds every unit's weights, each unit's
param groups at its own peak learning rate and weight decay; one warmup-cosine schedule scales them all; every
member stops on its own held-back loss and ends with its best epoch's weights. :func:`train_readouts` is the loop
with read-outs alone (no sequence decoder fitted).
"""

from __future__ import annotations

import math
import time

import torch

from memlab.errors import MemlabError
from memlab.progress import progress_bar
from memlab.train.schedule import warmup_cosine
from memlab.probes.decoder.group import DecoderGroup, optimiser

LOG_EVERY = 10
"""Steps between the host's reads of the losses (the only syncs of the training loop besides the epoch's CE)."""


def held_back_rows(n: int, fraction: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows to train on and rows held back (``fraction`` of ``n``; None when none) for early stopping."""
    n_val = int(round(fraction * n))
    if not n_val or n - n_val < 1:
        return torch.arange(n), None
    order = torch.randperm(n, generator=gen)
    return order[n_val:], order[:n_val]


def train_readouts(readouts: list, n_rows: int, opts, progress: bool | None = None) -> None:
    """Train read-out members ``readouts`` (of ``n_rows`` training chunks) in the fit loop with no decoder beside
    them, each from its start (epoch 0); each keeps its curve (``history``) and its share of the seconds."""
    hist, secs = train_members(readouts, n_rows, opts, progress=progress, desc="read-outs", epoch0=True)
    for r, h, t in zip(readouts, hist, secs):
        r.history, r.seconds = h, t


def train_members(units: list, n_rows: int, opts, progress: bool | None = None, desc: str = "train",
                  epoch0: bool = False, race: list | None = None) -> tuple[list[list[dict]], list[float]]:
    """The fit loop: train ``units`` (a :class:`DecoderGroup`, read-out members) on the same batches of ``n_rows``
    chunks for up to ``opts.epochs`` epochs, with one optimiser (:func:`optimiser`) and one schedule; returns each
    member's curve and its share of the seconds (by the steps it ran), the members in unit order.

    A unit has ``active`` (its members still training), ``optimised()``, ``loss(rows) -> (G,)``, ``before_step()``,
    ``held_back_ce(rows) -> (G,)``, ``drop(gone, state)``, ``weights(g)``, ``load_into(m, weights)`` and ``decs``
    (its members, each put in eval mode at the end).

    Early stopping (``opts.val_fraction > 0``): that share of the chunks is held back, every member's loss on them is
    measured after every epoch, a member stops after ``opts.patience`` epochs without a new best and ends with the
    weights of its best epoch. One AdamW (:func:`optimiser`,
    ``opts.beta1``/``beta2``, weight decay on matrices) and schedule (:func:`memlab.train.schedule.warmup_cosine`:
    ``opts.warmup_fraction`` warmup, cosine to ``opts.min_lr_ratio``, each param group at its own peak), gradients
    clipped at ``opts.clip_grad`` (each member on its own norm); bf16 autocast where the hardware has it
    (:func:`memlab.devices.probe_autocast`).

    ``epoch0``: the held-back loss of the starting weights is measured before the first step and counts as an epoch
    (step 0: a best, its weights, patience counted from it), so a member that starts as a trained control (or as its
    prior) never ends above it. The curve's last row holds ``best_val_ce`` and ``best_step`` (the kept epoch's step;
    0: the start).

    ``race`` (with ``opts.race``): per member in unit order, the held-back CE of the control it is read against, or
    None for a member that does not race; after every epoch a racing candidate that cannot catch the leader stops
    as early stopping stops it (:func:`race`; its curve's row ``raced`` says against whom).
    """
    t0 = time.perf_counter()
    loop = _Loop(units, n_rows, opts, race)
    if epoch0 and loop.rows_val is not None:  # the starting weights are epoch 0
        loop.start()
    loop.before = list(loop.best)
    bar = progress_bar(loop.total, desc, progress)
    while loop.step < loop.total and loop.live():
        loop.epoch(bar)
        if loop.rows_val is not None:
            loop.stop_members()
    bar.close()
    loop.finish()
    secs = time.perf_counter() - t0
    return loop.hist, [secs * r / max(sum(loop.ran), 1) for r in loop.ran]


class _Loop:
    """One run of the fit loop (:func:`train_members`): its batches, its optimiser and schedule, and each member's
    record by its place in unit order (a unit's members after those of the units before it): its curve, best
    held-back CE, epochs without a new best, best weights and their step, and the steps it ran."""

    def __init__(self, units: list, n_rows: int, opts, race: list | None):
        self.units, self.opts = units, opts
        self.gen = torch.Generator().manual_seed(opts.seed)
        self.rows_tr, self.rows_val = held_back_rows(n_rows, opts.val_fraction, self.gen)
        self.device = torch.device(opts.device)
        self.first = [sum(len(u.decs) for u in units[:k]) for k in range(len(units))]  # each unit's first member
        self.opt = optimiser(units, self.device)
        self.n, self.bs = self.rows_tr.shape[0], min(opts.batch_size, self.rows_tr.shape[0])
        self.total = max(1, int(round(opts.epochs * math.ceil(self.n / self.bs))))
        self.warm = max(1, int(opts.warmup_fraction * self.total))
        g_all = self.first[-1] + len(units[-1].decs)
        self.hist, self.best = [[] for _ in range(g_all)], [float("inf")] * g_all
        self.bad, self.best_w = [0] * g_all, [None] * g_all
        self.ran, self.best_step = [0] * g_all, [0] * g_all
        self.refs = list(race) if race is not None and getattr(opts, "race", False) else [None] * g_all
        self.before = list(self.best)  # each member's best before the last epoch
        self.step = 0

    def live(self) -> list:
        """(unit, its first member) of the units still training."""
        return [(u, f) for u, f in zip(self.units, self.first) if u.active]

    def start(self) -> None:
        """The held-back loss of the starting weights, as epoch 0 (step 0)."""
        for u, f in self.live():
            for g, (m, ce) in enumerate(zip(u.active, u.held_back_ce(self.rows_val).tolist())):
                self.hist[f + m].append({"step": 0, "val_ce": ce})
                self.best[f + m], self.best_w[f + m] = ce, u.weights(g)

    def epoch(self, bar) -> None:
        """One pass over the training rows in a fresh order (or what is left of the steps)."""
        perm = torch.randperm(self.n, generator=self.gen)
        for i in range(0, self.n, self.bs):
            if self.step >= self.total:
                break
            self.train_step(self.rows_tr[perm[i : i + self.bs]], bar)
            bar.update(1)
        for u, f in self.live():
            for m in u.active:
                self.ran[f + m] = self.step

    def train_step(self, rows: torch.Tensor, bar) -> None:
        """One step of every unit still training on the batch ``rows``, at the schedule's learning rate."""
        losses = [(u, f, u.loss(rows)) for u, f in self.live()]  # each (G_u,)
        self.opt.zero_grad(set_to_none=True)
        sum(loss.sum() for _, _, loss in losses).backward()  # the members share no weight
        for u, _, _ in losses:
            u.before_step()
        factor = warmup_cosine(self.step, self.warm, self.total, min_ratio=self.opts.min_lr_ratio)
        for grp in self.opt.param_groups:
            grp["lr"] = grp["base_lr"] * factor
        self.opt.step()
        self.step += 1
        if self.step % LOG_EVERY == 0 or self.step == self.total:  # the host reads the losses here only
            self.log(losses, bar)

    def log(self, losses: list, bar) -> None:
        """The members' training losses into their curves (a loss that is not finite stops the fit)."""
        for k, (u, f, loss) in enumerate(losses):
            values = loss.detach().tolist()
            for m, value in zip(u.active, values):
                if not math.isfinite(value):
                    raise MemlabError(f"the probe's loss became {value} by step {self.step}; lower the learning "
                                      "rate")
                self.hist[f + m].append({"step": self.step, "loss": value})
            if k == 0:
                bar.set_postfix(loss=f"{values[0]:.3f}")

    def held_back(self) -> dict:
        """Every member's held-back CE after an epoch (one read a unit): its best kept, and unit id -> the members
        out of patience."""
        stops = {}
        for u, f in self.live():
            gone = stops.setdefault(id(u), [])
            for g, (m, ce) in enumerate(zip(u.active, u.held_back_ce(self.rows_val).tolist())):  # one read an epoch
                self.hist[f + m].append({"step": self.step, "val_ce": ce})
                if ce < self.best[f + m]:
                    self.best[f + m], self.bad[f + m], self.best_w[f + m] = ce, 0, u.weights(g)
                    self.best_step[f + m] = self.step
                else:
                    self.bad[f + m] += 1
                if self.bad[f + m] >= self.opts.patience:
                    gone.append(m)
        return stops

    def stop_members(self) -> None:
        """After an epoch: the members out of patience and the racing candidates that cannot catch the leader leave
        their units; the optimiser is rebuilt over the weights still training, with their moments."""
        stops = self.held_back()
        for u, f, m, leader in race_losers(self.live(), self.rows_val, self.refs, self.best, self.before,
                                           self.opts.patience, stops):
            stops[id(u)].append(m)
            self.hist[f + m].append({"step": self.step, "raced": leader})
        self.before = list(self.best)
        dropped = False
        for u, f in self.live():
            gone = stops[id(u)]
            if gone:
                u.drop(gone, self.opt.state)
                dropped = True
        if dropped:  # the weights still training, with their moments
            self.opt = optimiser(self.units, self.device,
                                 {p: st for u, _ in self.live() for p, st in _states(u, self.opt).items()})

    def finish(self) -> None:
        """Every member loaded with its best epoch's weights (its last ones if it trained to the end without a
        held-back set), its curve closed by its best, and put in eval mode."""
        for u, f in zip(self.units, self.first):
            for g, m in enumerate(u.active):  # still training when the steps ran out: the last weights
                if self.best_w[f + m] is None:
                    self.best_w[f + m], self.best_step[f + m] = u.weights(g), self.step
            for m in range(len(u.decs)):
                u.load_into(m, self.best_w[f + m])
                if math.isfinite(self.best[f + m]):
                    self.hist[f + m].append({"step": self.ran[f + m], "best_val_ce": self.best[f + m],
                                             "best_step": self.best_step[f + m]})
                u.decs[m].eval()


RACE_Z = 2.0
"""How many paired standard errors a racing candidate must trail the leader by (beyond what it could still gain)
before it stops."""


def race_losers(live: list, rows_val: torch.Tensor, refs: list, best: list, before: list, horizon: int,
                stopping: dict) -> list[tuple]:
    """The racing candidates that cannot catch the leader after an epoch: ``(unit, its first member, member,
    leader's member index)`` each.

    A candidate's *gain* is the held-back CE of the control it is read against (``refs``) minus its best held-back
    CE: the quantity the fit keeps the best of. The leader has the largest gain. A candidate stops when it trails the
    leader by more than it could still gain and than the noise of the comparison:

        gap > horizon * max(0, its last epoch's improvement) + RACE_Z * SE

    ``horizon`` is the patience (early stopping's own look-ahead): a candidate still improving fast (a random start
    in its first epochs) is never stopped for being behind, one that has levelled off is. ``SE`` is the paired
    standard error of the two candidates' held-back CE (per-token, a ratio estimate over the held-back chunks, at
    their current weights), read only for a candidate the first test would stop. A candidate already stopping this
    epoch (``stopping``: unit id -> members) is not raced; units without per-chunk losses do not race."""
    racing = [(u, f, g, m) for u, f in live for g, m in enumerate(u.active)
              if refs[f + m] is not None and m not in stopping.get(id(u), ()) and math.isfinite(best[f + m])]
    if len(racing) < 2:
        return []
    gain = {(id(u), m): refs[f + m] - best[f + m] for u, f, _, m in racing}
    lu, lf, lg, lm = max(racing, key=lambda r: gain[(id(r[0]), r[3])])
    per_chunk: dict = {}

    def chunks(u):
        if id(u) not in per_chunk:
            got = u.held_back_chunk_nll(rows_val) if hasattr(u, "held_back_chunk_nll") else None
            per_chunk[id(u)] = got
        return per_chunk[id(u)]

    out = []
    for u, f, g, m in racing:
        if (u, m) == (lu, lm):
            continue
        gap = gain[(id(lu), lm)] - gain[(id(u), m)]
        still = horizon * max(0.0, before[f + m] - best[f + m]) if math.isfinite(before[f + m]) else math.inf
        if gap <= still:
            continue
        a, b = chunks(u), chunks(lu)
        if a is None or b is None:
            continue
        se = paired_se(a[0][g], b[0][lg], a[1])
        if gap > still + RACE_Z * se:
            out.append((u, f, m, lf + lm))
    return out


def paired_se(nll_a: torch.Tensor, nll_b: torch.Tensor, tokens: torch.Tensor) -> float:
    """Standard error of the difference of two per-token CEs over the same chunks: ``nll_a``, ``nll_b`` (n,) summed
    nats per chunk, ``tokens`` (n,) target tokens per chunk (the ratio estimator's linearised variance)."""
    n = int(tokens.numel())
    if n < 2:
        return math.inf
    d, t = (nll_a - nll_b).double(), tokens.double()  # (n,)
    mean = d.sum() / t.sum()
    resid = d - mean * t  # (n,)
    return float(torch.sqrt(resid.pow(2).sum() * n / (n - 1)) / t.sum())


def _states(unit, opt: torch.optim.Optimizer) -> dict:
    """The optimiser state of ``unit``'s weights: the loop's, or (rebuilt by a drop) the unit's own."""
    module = unit.optimised()[0]
    own = getattr(unit, "opt", None)
    return {p: (opt.state[p] if p in opt.state else own.state[p]) for p in module.parameters()
            if p in opt.state or (own is not None and p in own.state)}


def train_decoders(decs: list, zs: list[torch.Tensor], ids: torch.Tensor, opts, progress: bool | None = None,
                   desc: str = "train", batched: bool | None = None, epoch0: bool = False, readouts: tuple = (),
                   lr_scales: list | None = None, race: list | None = None) -> tuple[list[list[dict]], list[float]]:
    """Train decoders ``decs`` in the fit loop (:func:`train_members`, which says how), decoder
    m on embeddings ``zs[m]`` (N, D) of chunks ``ids`` (N, T), beside the read-out members ``readouts`` (each a unit
    of its own); returns each decoder's curve and its share of the seconds (by the steps it ran). The read-outs keep
    theirs (``history``, ``seconds``).

    ``lr_scales``: per decoder, None or {weight name: its share of the learning rate} (the rest at the full rate).
    Decoders with the same shares train as one group; each other set of shares is a group of its own in the same
    loop (the same batches, optimiser and schedule). ``race``: per decoder, the held-back CE of the control it is
    read against, or None (not raced): the candidates race (:func:`memlab.probes.decoder.fitloop.race`)."""
    scales = list(lr_scales or [None] * len(decs))
    kinds = []  # the distinct sets of shares, in order of first use
    for sc in scales:
        if sc not in kinds:
            kinds.append(sc)
    members = [[i for i, sc in enumerate(scales) if sc == k] for k in kinds]
    groups = [DecoderGroup([decs[i] for i in idx], [zs[i] for i in idx], ids, opts, batched, lr_scale=k)
              for k, idx in zip(kinds, members)]
    refs = [race[i] for idx in members for i in idx] + [None] * len(readouts) if race else None  # the loop's order
    hist, secs = train_members([*groups, *readouts], ids.shape[0], opts, progress=progress, desc=desc, epoch0=epoch0,
                               race=refs)
    n = len(decs)
    for r, h, t in zip(readouts, hist[n:], secs[n:]):
        r.history, r.seconds = h, t
    at = {i: j for j, i in enumerate(i for idx in members for i in idx)}  # decoder -> its place in the loop's order
    return [hist[at[i]] for i in range(n)], [secs[at[i]] for i in range(n)]


def train_decoder(dec, z: torch.Tensor, ids: torch.Tensor, opts, progress: bool | None = None,
                  desc: str = "train") -> list[dict]:
    """Train ``dec`` to rebuild ``ids`` (N, T) from ``z`` (N, D): a group of one (:func:`train_decoders`, which says
    how); returns the curve."""
    return train_decoders([dec], [z], ids, opts, progress=progress, desc=desc)[0][0]
