"""The decoders of one architecture as one batched group (:class:`DecoderGroup`): their parameters stacked and trained
by one vmapped step, each member's loss and gradient its own.
"""

from __future__ import annotations

import torch
from torch import nn

from memlab.devices import batched_groups, fused_adamw, probe_autocast, to_device
from memlab.errors import MemlabError
from memlab.probes.chunks.batch import fill_pad, mask_of, shift_right

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
