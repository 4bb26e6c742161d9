"""The relaxation search: every position a distribution over the vocabulary, the frozen model run on their
mixture of embedding rows, descended with the weights' own gradients; projected to tokens and verified each step.

A pooled target (a last-token, mean or first state, a space's vector, or a causal model's next-token distribution,
``--states logits``) fixes one vector; a discrete search that edits a token or two sees almost no change in the
distance until about half the chunk is right (``docs/results/invert-pooled.md``). A continuous relaxation moves
every position at once. The recipe is SODA's (Skapars et al. 2025, "GPT, But Backwards"), written for every
vector reader memlab has and batched over chunks and restarts:

1. **Relax.** A row is ``T`` logit vectors ``theta`` ``(T, V)``; its input is ``softmax(theta / temp) @ E``, the
   mixture of the embedding rows ``E`` ``(V, D_e)`` (between the fixed special tokens the encoder reads), run
   through the frozen model to the pooled vector.
2. **Loss.** A state target: the logarithm of the relative squared distance ``|z - z*|^2 / |z*|^2`` (in the
   whitened metric when the search descends one). ``--states logits``: SODA's Huber loss between the logits, read
   from the log-probabilities centred on their mean (which fixes the logits up to the constant a softmax drops);
   or, with ``--relax-loss log``, the logarithm of ``KL(p* || p)``, which weighs only the likely next tokens.
3. **Step.** Adam without bias correction (the first steps move every logit by about the learning rate), then
   every logit multiplied by ``decay`` (the mixture cannot saturate: a logit stays within ``lr / (1 - decay)``, so
   a token that stops being pushed fades); the optimiser's moments reset every ``reset`` steps and a row is drawn
   again from small noise every ``reinit`` steps (periodic restarts).
4. **Project and verify.** Every step each row's argmax tokens are run exactly, all rows in one batched forward
   pass (a row whose projection is the one it ran the step before is not run again); the nearest sequence of each
   target is kept. A target whose projection matches within ``tol`` is
   certified and leaves the batch (its rows stop costing).

What the relaxation cannot certify within its share of the budget is handed on: its nearest projection starts the
discrete correction (:mod:`memlab.probes.invert.pooled.correct`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from memlab.probes.invert.options import PooledOptions
from memlab.probes.invert.pooled.searcher import LOGITS


@dataclass
class RelaxOptions:
    """The relaxation's schedule (the pooled search's ``relax_*`` options hand these on)."""

    steps: int = PooledOptions.relax_steps
    """Most steps per target (each one forward and backward pass of its rows)."""
    rows: int = PooledOptions.relax_rows
    """Relaxed sequences per target, optimised side by side from different draws."""
    lr: float = PooledOptions.relax_lr
    """Adam's learning rate on the logits."""
    temp: float = PooledOptions.relax_temp
    """Softmax temperature of the mixture."""
    decay: float = PooledOptions.relax_decay
    """Every logit multiplied by this after each step."""
    beta1: float = 0.9
    beta2: float = 0.995
    reset: int = PooledOptions.relax_reset
    """Steps between resets of the optimiser's moments (0: never)."""
    reinit: int = PooledOptions.relax_reinit
    """Steps between fresh draws of a row (0: never)."""
    init_std: float = 0.1
    """Spread of the logits a row is drawn from (normal); the first draw of row 0 is all zeros, as SODA starts."""
    tol: float = PooledOptions.tol
    """A projection within this relative distance is certified and its target leaves the batch."""
    loss: str = PooledOptions.relax_loss
    """huber (the next-token distribution only: the Huber loss between the centred log-probabilities), log (the
    logarithm of the divergence) or auto (huber for the next-token distribution, log for a state)."""

    @classmethod
    def of(cls, pooled) -> "RelaxOptions":
        """The relaxation's share of :class:`~memlab.probes.invert.options.PooledOptions`."""
        return cls(steps=pooled.relax_steps, rows=pooled.relax_rows, lr=pooled.relax_lr, temp=pooled.relax_temp,
                   decay=pooled.relax_decay, reset=pooled.relax_reset, reinit=pooled.relax_reinit, tol=pooled.tol,
                   loss=pooled.relax_loss)


@dataclass
class RelaxJob:
    """One target to relax: its vector ``(D,)``, the chunk length and a seed for its draws."""

    target: torch.Tensor
    length: int
    seed: int


@dataclass
class Relaxed:
    """What the relaxation found for one target."""

    ids: list[int]
    """The nearest projection (argmax tokens of one row at one step)."""
    distance: float
    """Its relative distance to the target (exact: one forward pass of the tokens)."""
    certified: bool
    steps: int
    """Steps this target took part in."""
    forwards: int
    """Sequences run for it (each row once a step relaxed, with its gradient; its projection only when it differs
    from the one the row ran the step before)."""
    seconds: float
    """Its share of the batch's wall time (the batch's time split over the targets it held)."""


class Relaxer:
    """The relaxation over a :class:`~memlab.probes.invert.pooled.PooledSearcher`'s vector reader (any pooled
    target it reads: ``searcher.vec.vectors(embeds)`` is differentiable in the input embeddings).

    ``banned``: token ids never given weight (the tokenizer's special tokens, which a chunk never holds)."""

    def __init__(self, searcher, opt: RelaxOptions, banned: list[int] = ()):
        self.s, self.opt = searcher, opt
        self.vec = searcher.vec
        v = self.vec.vocab_size
        self.mask = torch.zeros(v)
        ids = [b for b in banned if 0 <= b < v]
        if ids:
            self.mask[ids] = -math.inf
        self.kl = searcher.pool == LOGITS
        self.loss = ("huber" if self.kl else "log") if opt.loss == "auto" else opt.loss  # what it descends
        if self.loss not in ("huber", "log") or (self.loss == "huber" and not self.kl):
            raise ValueError(f"relaxation loss {opt.loss!r}: huber (next-token log-probabilities only), log or auto")

    # the loss and the exact distance, per row
    def _loss(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Per-row loss ``(B,)`` of vectors ``z`` ``(B, D)`` against targets ``t`` ``(B, D)``. huber: the mean Huber
        loss (threshold 1) between the centred log-probabilities, every logit weighed alike. log: the logarithm of
        the divergence, so its gradient keeps its scale as the divergence falls (Adam's moments, filled far from the
        target, would otherwise shrink the steps until the decay wins and the mixture spreads out again)."""
        if self.loss == "huber":
            zc, tc = z - z.mean(-1, keepdim=True), t - t.mean(-1, keepdim=True)
            return torch.nn.functional.huber_loss(zc, tc, reduction="none", delta=1.0).mean(-1)
        return self._divergence(z, t).clamp_min(1e-12).log()

    def _divergence(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.kl:  # log-probabilities: KL(p* || p)
            return (t.exp() * (t - z)).sum(-1)
        w, c = self.s.metric, self.s.center
        if w is None:
            return (z - t).pow(2).sum(-1) / t.pow(2).sum(-1).clamp_min(1e-30)
        w = w.to(z.device)
        return ((z - t) @ w).pow(2).sum(-1) / ((t - c.to(z.device)) @ w).pow(2).sum(-1).clamp_min(1e-30)

    @staticmethod
    def _distance(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The plain relative distance ``(B,)`` the certificate reads."""
        return (z - t).norm(dim=-1) / t.norm(dim=-1).clamp_min(1e-30)

    def _embeds(self, mix: torch.Tensor) -> torch.Tensor:
        """``(B, T, D_e)`` chunk embeddings -> whole rows with the fixed special tokens ``(B, p + T + s, D_e)``."""
        b, dev = mix.shape[0], mix.device
        parts = []
        if self.s.prefix:
            parts.append(self.vec.embed(torch.tensor([self.s.prefix], device=dev)).float().expand(b, -1, -1))
        parts.append(mix)
        if self.s.suffix:
            parts.append(self.vec.embed(torch.tensor([self.s.suffix], device=dev)).float().expand(b, -1, -1))
        return torch.cat(parts, 1).to(self.vec.embedding.dtype)

    def _draw(self, rows: int, length: int, gen: torch.Generator, first: bool) -> torch.Tensor:
        th = torch.randn(rows, length, self.vec.vocab_size, generator=gen) * self.opt.init_std
        if first:
            th[0] = 0.0
        return th

    def run(self, jobs: list[RelaxJob], seconds_each: float, note=None, forwards_each: int | None = None
            ) -> list[Relaxed]:
        """Relax every job (all of one chunk length) side by side within ``seconds_each`` per job (the batch stops
        when its jobs' time is spent, every job is certified, or at ``steps``); a job leaves the batch once it has
        run ``forwards_each`` sequences; ``note(text)``: progress lines."""
        if not jobs:
            return []
        lengths = {j.length for j in jobs}
        if len(lengths) != 1:
            raise ValueError(f"a relaxation batch holds chunks of one length, got {sorted(lengths)}")
        o, n, T = self.opt, len(jobs), jobs[0].length
        E = self.vec.embedding.float()  # (V, D_e)
        dev = E.device
        gens = [torch.Generator().manual_seed(j.seed) for j in jobs]
        theta = torch.cat([self._draw(o.rows, T, g, True) for g in gens]).to(dev)  # (n R, T, V)
        m, v = torch.zeros_like(theta), torch.zeros_like(theta)
        owner = torch.arange(n, device=dev).repeat_interleave(o.rows)  # (n R,): the job of each row
        targets = torch.stack([j.target.float() for j in jobs]).to(dev)  # (n, D)
        mask = self.mask.to(dev)
        best_ids = [None] * n
        best_d = [math.inf] * n
        done = [False] * n
        steps_of, fw_of, secs_of = [0] * n, [0] * n, [0.0] * n
        began = time.perf_counter()
        budget = seconds_each * n
        age = 0
        seen = torch.full((len(theta), T), -1, dtype=torch.long, device=dev)  # each row's last verified projection
        seen_d = torch.full((len(theta),), math.inf, device=dev)  # and its distance
        for step in range(o.steps):
            if all(done) or time.perf_counter() - began >= budget:
                break
            t0 = time.perf_counter()
            tgt = targets[owner]  # (B, D)
            th = theta.detach().requires_grad_(True)
            with torch.enable_grad():
                p = torch.softmax(th / o.temp + mask, -1)  # (B, T, V)
                z = self.vec.vectors(self._embeds(p @ E))  # (B, D)
                loss = self._loss(z.float(), tgt)
                (g,) = torch.autograd.grad(loss.sum(), th)
            with torch.no_grad():
                m.mul_(o.beta1).add_(g, alpha=1 - o.beta1)
                v.mul_(o.beta2).addcmul_(g, g, value=1 - o.beta2)
                theta = theta - o.lr * m / (v.sqrt() + 1e-8)
                theta.mul_(o.decay)
                age += 1
                if o.reset and age % o.reset == 0:
                    m.zero_()
                    v.zero_()
                if o.reinit and age % o.reinit == 0:
                    theta = torch.cat([self._draw(o.rows, T, gens[int(owner[r * o.rows])], False)
                                       for r in range(len(theta) // o.rows)]).to(dev)
                ids = p.argmax(-1)  # (B, T): the projection of the mixture this step ran
                new = (ids != seen).any(-1)  # a projection run before has the same distance: only new ones are run
                d = seen_d.clone()
                if bool(new.any()):
                    zd = self.vec.vectors(self.vec.embed(self.s.wrap(ids[new]).to(dev))).float()
                    d[new] = self._distance(zd, tgt[new])
                seen, seen_d = ids, d
            spent = time.perf_counter() - t0
            live_jobs = owner[:: o.rows].tolist()  # each live job holds o.rows contiguous rows
            near, which = d.view(-1, o.rows).min(1)  # (live,): each job's nearest projection this step
            runs = new.view(-1, o.rows).sum(1).tolist()  # (live,): projections each job ran this step
            for j, k in enumerate(live_jobs):
                steps_of[k] += 1
                fw_of[k] += o.rows + int(runs[j])
                secs_of[k] += spent / len(live_jobs)
                if float(near[j]) < best_d[k]:
                    best_d[k], best_ids[k] = float(near[j]), ids[j * o.rows + int(which[j])].tolist()
                if best_d[k] <= o.tol or (forwards_each is not None and fw_of[k] + 2 * o.rows > forwards_each):
                    done[k] = True
            if any(done[k] for k in live_jobs):  # certified targets leave the batch
                keep = torch.tensor([not done[int(k)] for k in owner], device=dev)
                theta, m, v, owner, seen, seen_d = theta[keep], m[keep], v[keep], owner[keep], seen[keep], seen_d[keep]
            if note is not None and (step + 1) % 100 == 0:
                left = [best_d[k] for k in range(n) if not done[k]]
                note(f"relax: step {step + 1}, {sum(d <= o.tol for d in best_d)} of {n} certified"
                     + (f", nearest of the rest {min(left):.3g}" if left else ""))
        return [Relaxed(best_ids[k] or [0] * T, best_d[k], best_d[k] <= o.tol, steps_of[k], fw_of[k], secs_of[k])
                for k in range(n)]
