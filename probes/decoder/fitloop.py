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
member; the default on a CPU, :data:`BATCHED`): ``tests/test_probe_group.py`` checks that a batched group trains
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
from torch import nn

from memlab.devices import batched_groups, fused_adamw, probe_autocast, to_device
from memlab.errors import MemlabError
from memlab.probes.chunks.cut import fill_pad, mask_of, shift_right
from memlab.progress import progress_bar
from memlab.train.schedule import warmup_cosine

LOG_EVERY = 10
"""Steps between the host's reads of the losses (the only syncs of the training loop besides the epoch's CE)."""


def _param_groups(module: nn.Module, cfg, dims: int, lr_scale: dict[str, float] | None) -> list[dict]:
    """AdamW's param groups of one unit: weight decay on matrices only (not on biases, norms or 1-D weights), a
    parameter being a matrix by its dimensions after the ``dims`` leading ones that stack the members of a group;
    ``lr_scale``: weight name -> its share of ``cfg.lr`` (a group per share; each group's ``lr`` its peak rate)."""
    groups: dict[tuple[bool, float], list] = {(True, 1.0): [], (False, 1.0): []}
    for name, p in module.named_parameters():
        if p.requires_grad:
            key = (p.ndim - dims >= 2, float((lr_scale or {}).get(name, 1.0)))
            groups.setdefault(key, []).append(p)
    # the two full-rate groups always, first (as without shares); a group per other share where it has weights
    return [{"params": ps, "weight_decay": cfg.weight_decay if decay else 0.0, "lr": cfg.lr * share,
             "betas": (cfg.beta1, cfg.beta2)}
            for (decay, share), ps in groups.items() if ps or share == 1.0]


def optimiser(units: list, device: torch.device, state: dict | None = None) -> torch.optim.Optimizer | None:
    """One AdamW over the weights of every unit that still trains, each unit's groups at its own settings
    (``optimised()``: weights, settings with ``lr``, ``weight_decay``, ``beta1``, ``beta2``, stacking dimensions; a
    unit's ``lr_scale``, where it has one: weight name -> share of ``lr``; :func:`_param_groups`), ``base_lr`` each
    group's peak learning rate; the fused kernel where :func:`memlab.devices.fused_adamw` says; ``state``: moments
    carried over (by weight). None when no unit trains any more."""
    groups = []
    for u in units:
        if u.active:
            module, cfg, dims = u.optimised()
            groups += _param_groups(module, cfg, dims, getattr(u, "lr_scale", None))
    if not groups:  # every unit has stopped
        return None
    for grp in groups:
        grp["base_lr"] = grp["lr"]
    opt = torch.optim.AdamW(groups, fused=fused_adamw(device) or None)
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


BATCHED = "on accelerators"
"""Where the members' forward runs as one vmapped pass by default (``batched=None``): on accelerators, where one
pass instead of several small ones saves launches (:func:`memlab.devices.batched_groups` decides; ``MEMLAB_ACCEL``
forces a side). On a CPU the members run one after another within each step (measured faster on 2 cores:
docs/results/probes.md), and each member's arithmetic is then exactly what it would be alone, so a probe of a constant
embedding equals its cached control to the last bit."""

def autocast_context(device: torch.device):
    """bf16 autocast where the device multiplies bf16 natively, a CPU included; otherwise none
    (:func:`memlab.devices.probe_autocast`, which decides; ``MEMLAB_ACCEL`` forces a side)."""
    return probe_autocast(device)


def _device_rng(device: torch.device):
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device), lambda s: torch.cuda.set_rng_state(s, device)
    if device.type == "mps":
        return torch.mps.get_rng_state(), torch.mps.set_rng_state
    return None, lambda s: None


class RandomStream:
    """A member's own random stream: the global generators' state as ``torch.manual_seed(seed)`` leaves it, swapped
    in while the member draws its training noise (``with stream: ...``) and saved back after."""

    def __init__(self, seed: int, device: torch.device):
        self.device = device
        saved = torch.get_rng_state(), _device_rng(device)[0]
        torch.manual_seed(seed)
        self.state = torch.get_rng_state(), _device_rng(device)[0]
        self._set(saved)

    def _set(self, state) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            _device_rng(self.device)[1](state[1])

    def __enter__(self):
        self._outer = torch.get_rng_state(), _device_rng(self.device)[0]
        self._set(self.state)
        return self

    def __exit__(self, *exc):
        self.state = torch.get_rng_state(), _device_rng(self.device)[0]
        self._set(self._outer)


def member_nll(base: nn.Module, params: dict, zn: torch.Tensor, ids: torch.Tensor, tc: torch.Tensor,
               mode: str | None = "read") -> torch.Tensor:
    """Summed CE (nats, compact classes) of one member with weights ``params``: prepared embeddings (b, D) and ids
    (b, T) (``mode="prepare"``), compact targets (b, T) (-100 at pads) -> a scalar."""
    logits = torch.func.functional_call(base, params, (zn, ids), {"mode": mode} if mode else {})  # (b, T, C)
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tc.reshape(-1), reduction="sum")


def chunk_nll(base: nn.Module, params: dict, zn: torch.Tensor, ids: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
    """:func:`member_nll` per chunk: (b,) summed CE (nats, compact classes) of each chunk."""
    logits = torch.func.functional_call(base, params, (zn, ids), {"mode": "read"})  # (b, T, C)
    ce = nn.functional.cross_entropy(logits.float().transpose(1, 2), tc, reduction="none")  # (b, T), 0 at pads
    return ce.sum(1).double()  # (b,)


def clip_per_member(grads: list[torch.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_`` for each member of stacked gradients (G, ...) on its own norm."""
    # each member's norms on its own slices (as clip_grad_norm_ computes them): the same bits as training alone
    total = torch.stack([torch.linalg.vector_norm(torch.stack(torch._foreach_norm([g[i] for g in grads])))
                         for i in range(grads[0].shape[0])])  # (G,)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)  # (G,)
    torch._foreach_mul_(grads, [coef.view(-1, *[1] * (g.ndim - 1)) for g in grads])


class DecoderGroup:
    """The stacked weights, optimiser, noise streams and data of decoders ``decs`` (one architecture, the same kept
    ids), member m reading embeddings ``zs[m]`` (N, D) of chunks ``ids`` (N, T): everything a step needs lives on
    the device, indexed by row."""

    def __init__(self, decs: list, zs: list[torch.Tensor], ids: torch.Tensor, opts, batched: bool | None = None,
                 lr_scale: dict[str, float] | None = None):
        for d, z in zip(decs, zs):
            if z.shape[1] != d.config.embed_dim:
                raise MemlabError(f"embeddings of width {z.shape[1]} do not fit a decoder built for width "
                                  f"{d.config.embed_dim}")
        self.device = device = torch.device(opts.device)
        self.decs, self.opts = [d.to(device) for d in decs], opts
        # a decoder without the prepare/read modes (another registered kind) is run whole, member by member
        self.modes = all(getattr(d, "group_modes", False) for d in self.decs)
        self.batched = self.modes and (batched_groups(device) if batched is None else batched)  # see BATCHED
        # the widest member (one with a bag head) runs them all
        self.base = next((d for d in self.decs if getattr(d, "bag", None) is not None), self.decs[0])
        # the trained weights are stacked; frozen ones (requires_grad False) stay the base's own, shared by all
        self.names = [n for n, q in self.base.named_parameters() if q.requires_grad]
        # the fit loop's optimiser reads it: a stacked weight (named by its index) at its share of the learning rate
        self.lr_scale = {str(i): lr_scale[n] for i, n in enumerate(self.names) if n in (lr_scale or {})} or None
        for d in self.decs:
            if not torch.equal(d.to_full, self.base.to_full):
                raise MemlabError("decoders of one group must share their kept vocabulary")
        self.zs = [z.to(device) for z in zs]  # each (N, D)
        self.lens = mask_of(ids).sum(1)  # (N,) on the host: each batch is cut to its longest chunk without a sync
        self.inputs = shift_right(fill_pad(ids), int(self.base.config.start_id)).to(device)  # (N, T) teacher inputs
        self.targets = self.base.compact_targets(ids.to(device))  # (N, T) compact classes, -100 at pads
        self.penalty, self.other = self.base.other_penalty(), self.base.num_kept  # the *other* class and its nats
        self.amp = autocast_context(device)
        self.active = list(range(len(self.decs)))  # members still training, in group order
        self.streams = [RandomStream(opts.seed, device) for _ in self.decs]
        own = [{n: q for n, q in d.named_parameters() if q.requires_grad} for d in self.decs]
        self.lacks = {n: [n not in o for o in own] for n in self.names}  # on the host: members without the weight
        stacked = [torch.stack([o[n].detach() if n in o else torch.zeros_like(self.base.get_parameter(n))
                                for o in own]) for n in self.names]  # each (G, ...)
        self._build(stacked, None)

    def _build(self, stacked: list[torch.Tensor], old_state: list[dict] | None) -> None:
        self.params = nn.ParameterList([nn.Parameter(t.clone()) for t in stacked])
        self.opt = optimiser([self], self.device)  # its own, for train_step; the fit loop builds one for all
        if old_state is not None:  # each member keeps its own moments
            for p, st in zip(self.params, old_state):
                self.opt.state[p] = st

    def optimised(self) -> tuple[nn.Module, object, int]:
        """What the optimiser trains: the stacked weights, their settings (the fit's), one stacking dimension."""
        return self.params, self.opts, 1

    def member_params(self, g: int) -> dict[str, torch.Tensor]:
        """Active member ``g``'s weights (views into the stack)."""
        return {n: p[g] for n, p in zip(self.names, self.params)}

    def all_member_params(self) -> list[dict[str, torch.Tensor]]:
        """Every active member's weights (views into the stack), in group order. Taken apart by one ``unbind`` per
        weight: its backward stacks the members' gradients in one copy, where indexing each member alone would
        zero-fill the whole stack once per member and add the copies up (the same values, several times the
        memory traffic)."""
        views = [p.unbind(0) for p in self.params]  # each G views (...)
        return [{n: v[g] for n, v in zip(self.names, views)} for g in range(len(self.active))]

    def _batch(self, rows: torch.Tensor, noise: bool):
        """Rows (b,) -> prepared embeddings (G, b, D), ids (G, b, T_b), targets (b, T_b), the batch's CE terms."""
        t_b = max(int(self.lens[rows].max()), 1)  # a host tensor: no sync
        r = to_device(rows, self.device)  # pinned, without waiting, where the device has it
        inputs, tc = self.inputs[r, :t_b], self.targets[r, :t_b]  # (b, T_b)
        zn, ids, self._noise = [], [], noise
        for m in self.active:
            dec = self.decs[m]
            dec.train(noise)
            if not self.modes:  # the embeddings and full ids as they are: forward draws the noise itself
                zn.append(self.zs[m][r])
                ids.append(inputs)
                continue
            with self.streams[m]:
                a, b = dec(self.zs[m][r], inputs, mode="prepare")  # (b, D), (b, T_b): its own noise
            zn.append(a)
            ids.append(b)
        other = self.penalty * (tc == self.other).sum() if self.penalty else 0.0  # nats of *other* targets
        return torch.stack(zn), torch.stack(ids), tc, other, (tc != -100).sum()

    def nll(self, zn: torch.Tensor, ids: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
        """(G,) summed CE of every active member: prepared embeddings (G, b, D), ids (G, b, T), targets (b, T)."""
        with self.amp:
            if self.batched and len(self.active) > 1:
                p = dict(zip(self.names, self.params))
                return torch.func.vmap(lambda q, a, b: member_nll(self.base, q, a, b, tc))(p, zn, ids)  # (G,)
            params = self.all_member_params()
            if self.modes:
                return torch.stack([member_nll(self.base, params[g], zn[g], ids[g], tc)
                                    for g in range(len(self.active))])  # (G,)
            out = []
            for g, m in enumerate(self.active):  # each member's own module, its noise from its own stream
                own = {n: p for n, p in params[g].items() if not self.lacks[n][m]}
                with self.streams[m]:
                    out.append(member_nll(self.decs[m], own, zn[g], ids[g], tc, mode=None))
            return torch.stack(out)  # (G,)

    def loss(self, rows: torch.Tensor) -> torch.Tensor:
        """(G,) training loss of every active member on chunks ``rows`` (b,), with its training noise (full-vocabulary
        CE per target token: the units of :func:`memlab.probes.decoder.fit.evaluate`)."""
        zn, ids, tc, other, n_real = self._batch(rows, noise=True)
        return (self.nll(zn, ids, tc) + other) / n_real.clamp(min=1)  # (G,)

    def train_step(self, rows: torch.Tensor, lr: float) -> torch.Tensor:
        """One step of the group trained alone (its own optimiser, learning rate ``lr``, each weight at its share
        of it: ``lr_scale``) on chunks ``rows`` (b,); the losses (G,) stay on the device."""
        loss = self.loss(rows)  # (G,)
        self.opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # the members share no weight: each gets its own loss's gradient
        self.before_step()
        for grp in self.opt.param_groups:
            grp["lr"] = lr * grp["base_lr"] / self.opts.lr
        self.opt.step()
        return loss.detach()

    def before_step(self) -> None:
        """The gradients as each member would have them alone: a weight it lacks held at zero, its own clipping."""
        for p in self.params:  # a weight only members that lack it still train (a plain member left alone)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params]
        for n, g in zip(self.names, grads):
            has = [not self.lacks[n][m] for m in self.active]
            if not all(has):  # a member without this weight (the plain decoder's bag head) keeps it at zero
                g.mul_(torch.tensor(has, dtype=g.dtype, device=g.device).view(-1, *[1] * (g.ndim - 1)))
        if self.opts.clip_grad:
            clip_per_member(grads, self.opts.clip_grad)

    @torch.no_grad()
    def held_back_ce(self, rows: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
        """(G,) full-vocabulary CE (nats per target token) of every active member on chunks ``rows``, on the
        device (the caller reads it once)."""
        nll, other, n_real = 0.0, 0.0, 0
        for i in range(0, rows.shape[0], batch_size):
            zn, ids, tc, o, n = self._batch(rows[i : i + batch_size], noise=False)
            nll, other, n_real = nll + self.nll(zn, ids, tc), other + o, n_real + n
        return (nll + other) / n_real.clamp(min=1)  # (G,)

    @torch.no_grad()
    def held_back_chunk_nll(self, rows: torch.Tensor, batch_size: int = 128) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per chunk: (G, n) summed CE (nats, the *other* class's nats included) of every active member and (n,)
        target tokens, on the host: the paired noise of the held-back CE (:func:`memlab.probes.decoder.fitloop.race`).
        None for decoders without the prepare/read modes."""
        if not self.modes:
            return None
        nll, tokens = [], []
        for i in range(0, rows.shape[0], batch_size):
            zn, ids, tc, _, _ = self._batch(rows[i : i + batch_size], noise=False)
            with self.amp:
                per = torch.stack([chunk_nll(self.base, self.member_params(g), zn[g], ids[g], tc)
                                   for g in range(len(self.active))])  # (G, b)
            other = (tc == self.other).sum(1) * self.penalty if self.penalty else 0.0  # (b,)
            nll.append((per + other).cpu())
            tokens.append((tc != -100).sum(1).cpu())
        return torch.cat(nll, 1), torch.cat(tokens)  # (G, n), (n,)

    def drop(self, gone: list[int], state: dict | None = None) -> None:
        """Members ``gone`` (decoder indices) leave the group; the others keep their weights and moments (from
        ``state``, the optimiser state of the loop that trains the group, default its own; the new weights' states
        are then in :attr:`opt`)."""
        keep = [i for i, m in enumerate(self.active) if m not in gone]
        self.active = [self.active[i] for i in keep]
        if not self.active:
            return
        state = self.opt.state if state is None else state
        k = torch.tensor(keep, device=self.device)
        old = [{key: v if key == "step" else v[k] for key, v in state[p].items()} for p in self.params]
        self._build([p.detach()[k] for p in self.params], old)

    def weights(self, g: int) -> list[torch.Tensor]:
        """A copy of active member ``g``'s weights (one tensor per stacked name)."""
        return [p[g].detach().clone() for p in self.params]

    def load_into(self, m: int, state: list[torch.Tensor]) -> None:
        """Copy weights ``state`` (:meth:`weights`) into decoder ``m`` (a weight it lacks is skipped)."""
        own = dict(self.decs[m].named_parameters())
        with torch.no_grad():
            for n, t in zip(self.names, state):
                if n in own:
                    own[n].copy_(t)


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
