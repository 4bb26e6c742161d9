"""Large Concept Model baselines over the embeddings of any space (the shared sentence-LM backbone).

* :class:`LCMMSEModel` regresses the next embedding in normalised units (MSE).
* :class:`LCMDiffusionModel` is the two-tower diffusion LCM: the backbone encodes the
  context causally; a denoiser reads a noisy next embedding, is modulated by the
  timestep through AdaLN (shift, scale and a zero-initialised gate per sub-layer),
  cross-attends to the context up to its own position (plus a learned null slot,
  which is all it sees when the context is dropped for classifier-free guidance),
  and predicts the clean embedding. Sampling is DDIM (eta = 0) with guidance.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from memlab import randomness
from memlab.errors import ModelError
from memlab.models.lcm.configuration_lcm import LCMDiffusionConfig, LCMMSEConfig
from memlab.models.sentence.modeling_sentence import (SentenceBackbone, SentenceModelOutput, SentencePreTrainedModel,
                                                      last_positions)


class LCMMSEModel(SentencePreTrainedModel):
    """LCM-MSE: next-embedding regression; ``predictions`` in the space's scale, ``normalized`` for the loss."""

    config_class = LCMMSEConfig

    def __init__(self, config: LCMMSEConfig):
        super().__init__(config)
        self.backbone = SentenceBackbone(config)
        self.out_proj = nn.Linear(config.hidden_size, config.embed_dim)
        self.post_init()

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None,
                targets: torch.Tensor | None = None, target_mask: torch.Tensor | None = None, **_) -> SentenceModelOutput:
        """``embeddings (B, S, E)``; with ``targets (B, S, E)`` (the next embeddings, raw) also the MSE loss
        in normalised units over the positions of ``target_mask (B, S)`` (default: ``attention_mask``)."""
        h = self.backbone(embeddings, attention_mask)  # (B, S, H)
        norm = self.out_proj(h)  # (B, S, E) normalised units
        loss = None
        if targets is not None:
            loss = masked_mse(norm, self.backbone.normalizer.normalize(targets.float()), target_mask, attention_mask)
        return SentenceModelOutput(loss=loss, predictions=self.backbone.normalizer.denormalize(norm), last_hidden_state=h,
                                   normalized=norm)

    @torch.no_grad()
    def predict_next(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> torch.Tensor:
        return last_positions(self(embeddings, attention_mask).predictions, attention_mask)  # (B, E)


def masked_mse(pred: torch.Tensor, target: torch.Tensor, target_mask: torch.Tensor | None,
               attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error over the positions where the mask (``target_mask``, else ``attention_mask``) is set."""
    m = target_mask if target_mask is not None else attention_mask
    if m is None:
        return F.mse_loss(pred.float(), target)
    m = m.bool()
    return F.mse_loss(pred[m].float(), target[m])


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of integer timesteps ``t (...)`` -> ``(..., dim)``."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[..., None] * freqs  # (..., half)
    return torch.cat([args.cos(), args.sin()], -1)


def cosine_alphas_cumprod(T: int, s: float = 0.008) -> torch.Tensor:
    """``alpha_bar_t`` for ``t = 0 .. T-1`` (Nichol & Dhariwal cosine schedule), clipped away from 0."""
    x = torch.arange(T + 1, dtype=torch.float64) / T
    f = torch.cos((x + s) / (1 + s) * math.pi / 2) ** 2
    ab = (f / f[0])[1:]
    return ab.clamp(min=1e-4, max=0.9999).float()  # (T,)


class AdaLNBlock(nn.Module):
    """Cross-attention + MLP, each pre-normed with timestep-modulated shift/scale and a gated residual."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False)
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.o = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.mod = nn.Linear(width, 6 * width)
        self.mod._zero_init = True  # AdaLN-Zero: every block starts as the identity

    def forward(self, x: torch.Tensor, c: torch.Tensor, mem: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x (B, S, H)`` queries, ``c (B, S, H)`` timestep conditioning, ``mem (B, M, H)``, ``mask (B, S, M)`` bool."""
        B, S, H = x.shape
        sh1, sc1, g1, sh2, sc2, g2 = self.mod(F.silu(c)).chunk(6, -1)  # 6x (B, S, H)
        h = self.norm1(x) * (1 + sc1) + sh1
        q = self.q(h).view(B, S, self.heads, -1).transpose(1, 2)  # (B, h, S, d)
        k, v = self.kv(mem).view(B, mem.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)  # 2x (B, h, M, d)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])  # (B, h, S, d)
        x = x + g1 * self.o(a.transpose(1, 2).reshape(B, S, H))
        return x + g2 * self.mlp(self.norm2(x) * (1 + sc2) + sh2)


class Denoiser(nn.Module):
    """Noisy normalised embedding + timestep + context -> clean normalised embedding."""

    def __init__(self, config: LCMDiffusionConfig):
        super().__init__()
        H, E = config.hidden_size, config.embed_dim
        self.in_proj = nn.Linear(E, H)
        self.time_mlp = nn.Sequential(nn.Linear(H, H), nn.SiLU(), nn.Linear(H, H))
        self.null = nn.Parameter(torch.zeros(1, 1, H))
        self.blocks = nn.ModuleList(AdaLNBlock(H, config.num_attention_heads) for _ in range(config.denoiser_layers))
        self.norm_out = nn.LayerNorm(H, elementwise_affine=False)
        self.mod_out = nn.Linear(H, 2 * H)
        self.mod_out._zero_init = True
        self.out = nn.Linear(H, E)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, ctx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x_t (B, S, E)``, ``t (B, S)`` long, ``ctx (B, M, H)``, ``mask (B, S, M)`` -> ``(B, S, E)``."""
        B = x_t.shape[0]
        h = self.in_proj(x_t.to(self.in_proj.weight.dtype))  # (B, S, H)
        c = self.time_mlp(timestep_embedding(t, h.shape[-1]).to(h.dtype))  # (B, S, H)
        mem = torch.cat([self.null.expand(B, 1, -1).to(ctx.dtype), ctx], 1)  # (B, 1+M, H)
        mask = torch.cat([torch.ones_like(mask[..., :1]), mask], -1)  # (B, S, 1+M): the null slot is always seen
        for blk in self.blocks:
            h = blk(h, c, mem, mask)
        shift, scale = self.mod_out(F.silu(c)).chunk(2, -1)
        return self.out(self.norm_out(h) * (1 + scale) + shift)  # (B, S, E)


class LCMDiffusionModel(SentencePreTrainedModel):
    """Two-tower diffusion LCM (context encoder + AdaLN denoiser), DDIM sampling with classifier-free guidance."""

    config_class = LCMDiffusionConfig

    def __init__(self, config: LCMDiffusionConfig):
        super().__init__(config)
        self.backbone = SentenceBackbone(config)
        self.denoiser = Denoiser(config)
        self.post_init()

    def alphas_cumprod(self, device) -> torch.Tensor:
        """``(T,)`` noise schedule, computed (not a buffer: from_pretrained leaves non-persistent buffers unset)."""
        return cosine_alphas_cumprod(self.config.num_timesteps).to(device)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if getattr(module, "_zero_init", False):
            with torch.no_grad():
                module.weight.zero_()
                module.bias.zero_()

    def context(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.backbone(embeddings, attention_mask)  # (B, S, H)

    @staticmethod
    def causal_mask(S: int, keep: torch.Tensor) -> torch.Tensor:
        """``(B, S, S)`` bool: query ``i`` sees context ``j <= i`` where ``keep[b, i]`` (else only the null slot)."""
        tri = torch.ones(S, S, dtype=torch.bool, device=keep.device).tril()  # (S, S)
        return tri[None] & keep[:, :, None]  # (B, S, S)

    forward_modes = ("loss", "sample")

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None,
                targets: torch.Tensor | None = None, target_mask: torch.Tensor | None = None,
                seeds: torch.Tensor | None = None, mode: str | None = None, **_) -> SentenceModelOutput:
        """Training pass: ``targets (B, S, E)`` raw next embeddings are noised at a random timestep and
        the loss is the MSE of the predicted clean ones (``normalized``) over ``target_mask`` (default
        ``attention_mask``); without targets, or with ``mode="sample"``, samples every position (slow):
        ``predictions``. ``seeds (B,)`` (:mod:`memlab.randomness`): each example's timesteps, noise and
        context dropout (or starting noise) from its own seed, so they do not depend on the batch."""
        if mode not in (None, *self.forward_modes):
            raise ModelError(f"unknown forward mode {mode!r}; LCMDiffusionModel accepts {', '.join(self.forward_modes)}")
        if targets is None or mode == "sample":
            return SentenceModelOutput(predictions=self.sample(embeddings, attention_mask, all_positions=True,
                                                               seeds=seeds))
        ctx = self.context(embeddings, attention_mask)  # (B, S, H)
        B, S, _ = ctx.shape
        x0 = self.backbone.normalizer.normalize(targets.float())  # (B, S, E)
        dev = x0.device
        t = randomness.randint(seeds, self.config.num_timesteps, (S,) if seeds is not None else (B, S), 1, dev)  # (B, S)
        ab = self.alphas_cumprod(x0.device)[t][..., None]  # (B, S, 1)
        noise = randomness.normal(seeds, tuple(x0.shape[1:]) if seeds is not None else x0.shape, 2, dev)  # (B, S, E)
        x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise  # (B, S, E)
        keep = randomness.uniform(seeds, (S,) if seeds is not None else (B, S), 3, dev) >= self.config.cfg_dropout \
            if self.training else torch.ones(B, S, dtype=torch.bool, device=x0.device)
        pred = self.denoiser(x_t, t, ctx, self.causal_mask(S, keep))  # (B, S, E)
        return SentenceModelOutput(loss=masked_mse(pred, x0, target_mask, attention_mask), last_hidden_state=ctx,
                                   predictions=self.backbone.normalizer.denormalize(pred.float()), normalized=pred)

    @torch.no_grad()
    def sample(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None, all_positions: bool = False,
               guidance_scale: float | None = None, steps: int | None = None,
               generator: torch.Generator | None = None, seeds: torch.Tensor | None = None) -> torch.Tensor:
        """DDIM with classifier-free guidance: next embedding at the last position ``(B, E)`` (or every one).
        The starting noise comes from ``seeds (B,)`` per example when given, else from ``generator``."""
        cfg = self.config
        g = cfg.guidance_scale if guidance_scale is None else guidance_scale
        ctx = self.context(embeddings, attention_mask)  # (B, S, H)
        B, S, _ = ctx.shape
        full = self.causal_mask(S, torch.ones(B, S, dtype=torch.bool, device=ctx.device))  # (B, S, S)
        if all_positions:
            mask_c, Q = full, S
        else:
            last = (attention_mask.long().sum(1) - 1) if attention_mask is not None else torch.full((B,), S - 1, device=ctx.device)
            mask_c, Q = full[torch.arange(B, device=ctx.device), last][:, None], 1  # (B, 1, S)
        mask_u = torch.zeros_like(mask_c)
        E = cfg.embed_dim
        x = (randomness.normal(seeds, (Q, E), 4) if seeds is not None else
             torch.randn(B, Q, E, device=ctx.device, generator=generator))  # (B, Q, E)
        ab_all = self.alphas_cumprod(ctx.device)
        ts = torch.linspace(cfg.num_timesteps - 1, 0, max(1, steps or cfg.ddim_steps)).round().long().tolist()
        for k, t in enumerate(ts):
            tt = torch.full((2 * B, Q), t, dtype=torch.long, device=ctx.device)
            out = self.denoiser(torch.cat([x, x]), tt, torch.cat([ctx, ctx]), torch.cat([mask_c, mask_u])).float()
            x0_c, x0_u = out[:B], out[B:]  # (B, Q, E) each
            x0 = x0_u + g * (x0_c - x0_u)
            if cfg.clip_sample > 0:
                x0 = x0.clamp(-cfg.clip_sample, cfg.clip_sample)
            ab = ab_all[t]
            ab_prev = ab_all[ts[k + 1]] if k + 1 < len(ts) else torch.ones((), device=ctx.device)
            eps = (x - ab.sqrt() * x0) / (1 - ab).sqrt()
            x = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps
        pred = self.backbone.normalizer.denormalize(x)  # (B, Q, E)
        return pred if all_positions else pred[:, 0]

    @torch.no_grad()
    def predict_next(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None, **kw) -> torch.Tensor:
        return self.sample(embeddings, attention_mask, **kw)  # (B, E)
