"""Building blocks of the memory model: pre-norm attention blocks (bidirectional or causal, with an
optional boolean mask) and masked Mixer blocks (token mixing by a learned position x position map)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """Llama MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, d: int, inner: int):
        super().__init__()
        self.gate = nn.Linear(d, inner, bias=False)
        self.up = nn.Linear(d, inner, bias=False)
        self.down = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Attention(nn.Module):
    """Multi-head attention through ``scaled_dot_product_attention``; self- or cross-attention."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None) -> torch.Tensor:
        n, s, d = x.shape
        ctx = x if context is None else context
        h = self.heads
        q = self.q(x).view(n, s, h, d // h).transpose(1, 2)  # (N, H, S, d/H)
        k, v = self.kv(ctx).view(n, ctx.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4)  # 2 x (N, H, S', d/H)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)  # (N, H, S, d/H)
        return self.o(out.transpose(1, 2).reshape(n, s, d))


class Block(nn.Module):
    """Pre-norm Transformer block (RMSNorm, attention, SwiGLU)."""

    def __init__(self, d: int, heads: int, inner: int, eps: float):
        super().__init__()
        self.norm1 = nn.RMSNorm(d, eps=eps)
        self.attn = Attention(d, heads)
        self.norm2 = nn.RMSNorm(d, eps=eps)
        self.mlp = SwiGLU(d, inner)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                pad: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask=mask, causal=causal)
        return x + self.mlp(self.norm2(x))

    def forward_with_slots(self, x: torch.Tensor, slots: torch.Tensor,
                           groups: list[tuple[int, int, int, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One block over chunk tokens that read shared memory slots, slots computed once per chunk.

        ``x`` ``(B, C, L, d)`` chunk tokens; ``slots`` ``(B, S, d)`` the slot states of the whole sequence
        (``S = C*K``), each attending only to itself. ``groups`` splits the chunk rows: ``(c0, c1, s, mask)``
        — rows ``c0:c1`` read keys ``[slots[:s] ; own tokens]`` under a float or bool ``mask``
        ``(c1 - c0, H, L, s + L)`` (visibility, causality, distance bias), shared by the batch. Every token
        row shares the same slot keys/values: the slot work grows as ``C``, not ``C^2``; grouping only
        skips slot keys no row of the group can see.
        """
        b, c, length, d = x.shape
        h, dh = self.attn.heads, d // self.attn.heads
        n = slots.shape[1]
        hs = self.norm1(slots)  # (B, S, d)
        ks, vs = self.attn.kv(hs).view(b, n, 2, h, dh).permute(2, 0, 3, 1, 4)  # 2 x (B, H, S, d/H)
        # a slot attends only to itself: softmax over one key is 1, so its attention output is its value
        slots = slots + self.attn.o(vs.transpose(1, 2).reshape(b, n, d))  # (B, S, d)
        slots = slots + self.mlp(self.norm2(slots))  # (B, S, d)
        ht = self.norm1(x)  # (B, C, L, d)
        q = self.attn.q(ht).view(b, c, length, h, dh).transpose(2, 3)  # (B, C, H, L, d/H)
        kt, vt = self.attn.kv(ht).view(b, c, length, 2, h, dh).permute(3, 0, 1, 4, 2, 5)  # 2 x (B, C, H, L, d/H)
        outs = []
        for c0, c1, s, mask in groups:
            g = c1 - c0
            k = torch.cat([ks[:, None, :, :s].expand(b, g, h, s, dh), kt[:, c0:c1]], 3)  # (B, G, H, s + L, d/H)
            v = torch.cat([vs[:, None, :, :s].expand(b, g, h, s, dh), vt[:, c0:c1]], 3)  # (B, G, H, s + L, d/H)
            m = mask[None].expand(b, *mask.shape).reshape(b * g, *mask.shape[1:])  # (BG, H, L, s + L)
            # 4-D (B*G, H, ., .) inputs so SDPA takes its fused (flash) kernel instead of the math path
            out = F.scaled_dot_product_attention(q[:, c0:c1].reshape(b * g, h, length, dh),
                                                 k.reshape(b * g, h, s + length, dh),
                                                 v.reshape(b * g, h, s + length, dh), attn_mask=m)  # (BG, H, L, d/H)
            outs.append(out.view(b, g, h, length, dh))
        out = torch.cat(outs, 1) if len(outs) > 1 else outs[0]  # (B, C, H, L, d/H)
        x = x + self.attn.o(out.transpose(2, 3).reshape(b, c, length, d))  # (B, C, L, d)
        return x + self.mlp(self.norm2(x)), slots


class MixerBlock(nn.Module):
    """Masked Mixer block: token mixing by a learned ``(heads, T, T)`` map over positions (each head
    mixes its own channel group), then a SwiGLU channel MLP.

    Padding is zeroed before mixing and the map is cut to the batch's length, so a sentence mixes the
    same alone or inside a padded batch. ``causal`` masks the map to its lower triangle.
    """

    def __init__(self, d: int, heads: int, inner: int, max_len: int, eps: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.RMSNorm(d, eps=eps)
        self.mix = nn.Parameter(torch.zeros(heads, max_len, max_len))
        self.norm2 = nn.RMSNorm(d, eps=eps)
        self.mlp = SwiGLU(d, inner)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                pad: torch.Tensor | None = None) -> torch.Tensor:
        n, s, d = x.shape
        h = self.norm1(x)
        if pad is not None:
            h = h * pad[..., None].to(h.dtype)  # (N, S, D) padding zeroed
        w = self.mix[:, :s, :s]  # (H, S, S)
        if causal:
            w = w.tril()
        h = h.view(n, s, self.heads, d // self.heads).permute(0, 2, 1, 3)  # (N, H, S, D/H)
        mixed = torch.matmul(w.to(h.dtype), h)  # (N, H, S, D/H)
        x = x + mixed.permute(0, 2, 1, 3).reshape(n, s, d)
        return x + self.mlp(self.norm2(x))
