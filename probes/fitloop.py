"""The probe's fit loop: members of several kinds trained on the same batches with one optimiser and one schedule.

:func:`train_members` trains *units*: a group of decoders (:class:`memlab.probes.group.DecoderGroup`: probe, plain
decoder, control, stacked) and read-outs trained by gradient (the bag-of-words head,
:class:`memlab.probes.bow.BagHeadMember`). One AdamW (:func:`optimiser`) holds every unit's weights, each unit's
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
from memlab.train.loop import make_optimizer
from memlab.train.schedule import warmup_cosine

LOG_EVERY = 10
"""Steps between the host's reads of the losses (the only syncs of the training loop besides the epoch's CE)."""


def optimiser(units: list, device: torch.device, state: dict | None = None) -> torch.optim.Optimizer:
    """One AdamW (:func:`memlab.train.loop.make_optimizer`: weight decay on matrices) over the weights of every unit
    that still trains, each unit's groups at its own settings (``optimised()``: weights, settings with ``lr``,
    ``weight_decay``, ``beta1``, ``beta2``, stacking dimensions; a unit's ``lr_scale``, where it has one: weight name
    -> share of ``lr``), ``base_lr`` each group's peak learning rate; ``state``: moments carried over (by weight)."""
    opt = None
    for u in units:
        if not u.active:
            continue
        module, cfg, dims = u.optimised()
        own = make_optimizer(module, cfg, device, batch_dims=dims, lr_scale=getattr(u, "lr_scale", None))
        for grp in own.param_groups:
            grp["base_lr"] = grp["lr"]
            if opt is not None:
                opt.add_param_group(grp)
        if opt is None:
            opt = own
    for p, st in (state or {}).items():
        opt.state[p] = st
    return opt


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
    weights of its best epoch. memlab's optimiser (:func:`memlab.train.loop.make_optimizer`: AdamW,
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
    gen = torch.Generator().manual_seed(opts.seed)
    rows_tr, rows_val = held_back_rows(n_rows, opts.val_fraction, gen)
    device = torch.device(opts.device)
    first = [sum(len(u.decs) for u in units[:k]) for k in range(len(units))]  # each unit's first member
    opt = optimiser(units, device)
    n, bs = rows_tr.shape[0], min(opts.batch_size, rows_tr.shape[0])
    total = max(1, int(round(opts.epochs * math.ceil(n / bs))))
    warm = max(1, int(opts.warmup_fraction * total))
    g_all = first[-1] + len(units[-1].decs)
    hist, best, bad, best_w = [[] for _ in range(g_all)], [float("inf")] * g_all, [0] * g_all, [None] * g_all
    ran, best_step = [0] * g_all, [0] * g_all
    refs = list(race) if race is not None and getattr(opts, "race", False) else [None] * g_all

    def live():  # (unit, its first member) of the units still training
        return [(u, f) for u, f in zip(units, first) if u.active]

    if epoch0 and rows_val is not None:  # the starting weights are epoch 0
        for u, f in live():
            for g, (m, ce) in enumerate(zip(u.active, u.held_back_ce(rows_val).tolist())):
                hist[f + m].append({"step": 0, "val_ce": ce})
                best[f + m], best_w[f + m] = ce, u.weights(g)
    before = list(best)  # each member's best before the last epoch
    step, bar = 0, progress_bar(total, desc, progress)
    while step < total and live():
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, bs):
            if step >= total:
                break
            rows = rows_tr[perm[i : i + bs]]
            losses = [(u, f, u.loss(rows)) for u, f in live()]  # each (G_u,)
            opt.zero_grad(set_to_none=True)
            sum(loss.sum() for _, _, loss in losses).backward()  # the members share no weight
            for u, _, _ in losses:
                u.before_step()
            factor = warmup_cosine(step, warm, total, min_ratio=opts.min_lr_ratio)
            for grp in opt.param_groups:
                grp["lr"] = grp["base_lr"] * factor
            opt.step()
            step += 1
            if step % LOG_EVERY == 0 or step == total:  # the host reads the losses here only
                for k, (u, f, loss) in enumerate(losses):
                    values = loss.detach().tolist()
                    for m, value in zip(u.active, values):
                        if not math.isfinite(value):
                            raise MemlabError(f"the probe's loss became {value} by step {step}; lower the learning "
                                              "rate")
                        hist[f + m].append({"step": step, "loss": value})
                    if k == 0:
                        bar.set_postfix(loss=f"{values[0]:.3f}")
            bar.update(1)
        for u, f in live():
            for m in u.active:
                ran[f + m] = step
        if rows_val is None:
            continue
        dropped = False
        stops = {}
        for u, f in live():
            gone = stops.setdefault(id(u), [])
            for g, (m, ce) in enumerate(zip(u.active, u.held_back_ce(rows_val).tolist())):  # one read an epoch
                hist[f + m].append({"step": step, "val_ce": ce})
                if ce < best[f + m]:
                    best[f + m], bad[f + m], best_w[f + m], best_step[f + m] = ce, 0, u.weights(g), step
                else:
                    bad[f + m] += 1
                if bad[f + m] >= opts.patience:
                    gone.append(m)
        for u, f, m, leader in race_losers(live(), rows_val, refs, best, before, opts.patience, stops):
            stops[id(u)].append(m)
            hist[f + m].append({"step": step, "raced": leader})
        before = list(best)
        for u, f in live():
            gone = stops[id(u)]
            if gone:
                u.drop(gone, opt.state)
                dropped = True
        if dropped:  # the weights still training, with their moments
            opt = optimiser(units, device, {p: st for u, _ in live() for p, st in _states(u, opt).items()})
    bar.close()
    for u, f in zip(units, first):
        for g, m in enumerate(u.active):  # still training when the steps ran out: the last weights
            if best_w[f + m] is None:
                best_w[f + m], best_step[f + m] = u.weights(g), step
        for m in range(len(u.decs)):
            u.load_into(m, best_w[f + m])
            if math.isfinite(best[f + m]):
                hist[f + m].append({"step": ran[f + m], "best_val_ce": best[f + m], "best_step": best_step[f + m]})
            u.decs[m].eval()
    secs = time.perf_counter() - t0
    return hist, [secs * r / max(sum(ran), 1) for r in ran]


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
