"""Token cross-entropy through an output head without materialising the logits of every position.

``linear_cross_entropy(hidden, weight, labels)`` equals::

    logits = hidden @ weight.T (+ bias)                      # (N, V)
    F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")

plus the number of correct argmax predictions and of scored targets, but works through the rows in
blocks: each block's logits are made, turned into the loss, the argmax and, when gradients are
wanted, the gradients of that block (``softmax - onehot``) while they are still in cache, then
dropped. The backward pass only scales the stored gradients. The matrix products are the same three
as the plain computation (logits, gradient to the hidden states, gradient to the weight; the last is
skipped for a frozen head), so model FLOPs are unchanged; what goes away is the ``(N, V)`` logits
tensor, its log-softmax, the copies the backward pass makes of it and a second pass for the accuracy.
At small widths and vocabularies of thousands of tokens those took a quarter of a training step.

Under autocast the products run in the autocast dtype and the softmax in float32, as with the plain
computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


_TINY = 1e-30


def default_block_rows(vocab: int) -> int:
    """Rows per block: about 4 MB of float32 logits (cache-sized), at least 256 rows (each block re-reads the head)."""
    return max(256, (4 << 20) // (4 * max(vocab, 1)))


def _argmax_hits(p: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``p.argmax(-1) == y`` for probabilities ``p (r, V)`` through vectorised ``amax``/``amin`` (a fraction of
    ``argmax``'s cost; a tied maximum goes to its first index, as with ``argmax``), with no value read back
    to the host. Also returns the maximum ``(r,)`` and its first index ``(r,)``."""
    top = p.amax(-1)  # (r,)
    cols = torch.arange(p.shape[-1], device=p.device, dtype=torch.int32)  # (V,)
    first = torch.where(p == top[:, None], cols, p.shape[-1]).amin(-1)  # (r,) first index of the maximum
    return first == y, top, first.clamp(max=p.shape[-1] - 1)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index, block, dtype, grad_h, grad_w, grad_b):
        n = hidden.shape[0]
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        gh = torch.empty_like(hidden) if grad_h else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grad_w else None
        gb = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if grad_b else None
        for s in range(0, n, block):
            h = hidden[s : s + block].to(dtype)  # (r, d)
            y = labels[s : s + block]  # (r,)
            logits = (torch.addmm(b, h, w.t()) if b is not None else h @ w.t()).float()  # (r, V)
            keep = y != ignore_index
            yk = torch.where(keep, y, torch.zeros_like(y))
            p = torch.softmax(logits, -1)  # (r, V) one fused pass (max, exp, sum)
            py = p.gather(1, yk[:, None])[:, 0]  # (r,)
            hit, top, first = _argmax_hits(p, y)
            # where the target's probability underflowed, the exact value from the logits: the log-sum-exp is
            # the top logit minus the log of its probability (>= 1/V, never underflows); no branch, no sync
            lse = logits.gather(1, first[:, None].long())[:, 0] - top.log()  # (r,)
            ce = torch.where(py < _TINY, lse - logits.gather(1, yk[:, None])[:, 0], -py.clamp(min=_TINY).log())
            total += (ce * keep).sum()
            correct += (hit & keep).sum()
            if gh is None and gw is None and gb is None:
                continue
            p[torch.arange(p.shape[0], device=p.device), yk] -= 1.0
            p.mul_(keep[:, None])  # (r, V) d(sum CE)/d(logits)
            if gb is not None:
                gb += p.sum(0)
            pc = p.to(dtype)
            if gh is not None:
                gh[s : s + block] = (pc @ w).to(hidden.dtype)
            if gw is not None:
                if dtype == torch.float32:
                    gw.addmm_(pc.t(), h)
                else:
                    gw.add_((pc.t() @ h).float())
        ctx.save_for_backward(gh, gw, gb)
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(correct)
        return total, correct

    @staticmethod
    def backward(ctx, g_total, g_correct):
        gh, gw, gb = ctx.saved_tensors
        wdt, bdt = ctx.dtypes
        return (gh * g_total.to(gh.dtype) if gh is not None else None,
                (gw * g_total).to(wdt) if gw is not None else None,
                (gb * g_total).to(bdt) if gb is not None else None,
                None, None, None, None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         bias: torch.Tensor | None = None, ignore_index: int = -100,
                         block_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed token cross-entropy of ``hidden (..., d) @ weight (V, d).T (+ bias)`` against ``labels (...)``,
    with the number of correct argmax predictions and of targets ``!= ignore_index``.

    Returns ``(sum_ce, correct, count)``: ``sum_ce`` is a float32 scalar with gradients to ``hidden``,
    ``weight`` and ``bias`` (those that require them); ``correct`` and ``count`` are integer scalars.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} do not match")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight {tuple(weight.shape)} does not map width {hidden.shape[-1]} to a vocabulary")
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1).to(h.device)
    dev = h.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    grad = torch.is_grad_enabled()
    flags = (grad and h.requires_grad, grad and weight.requires_grad, grad and bias is not None and bias.requires_grad)
    block = block_rows or default_block_rows(weight.shape[0])
    with torch.autocast(dev, enabled=False):
        total, correct = _LinearCrossEntropy.apply(h, weight, bias, y, ignore_index, block, dtype, *flags)
    return total, correct, (y != ignore_index).sum()


def logits_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                         ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`linear_cross_entropy`'s ``(sum_ce, correct, count)`` from logits already made, ``(..., V)`` against
    ``labels (...)`` (for models and spaces that do not expose their head)."""
    flat = logits.float().reshape(-1, logits.shape[-1])  # (N, V): contiguous rows, no transposed copy
    y = labels.reshape(-1).to(flat.device)
    keep = y != ignore_index
    total = F.cross_entropy(flat, y, ignore_index=ignore_index, reduction="sum")
    return total, ((flat.argmax(-1) == y) & keep).sum(), keep.sum()
