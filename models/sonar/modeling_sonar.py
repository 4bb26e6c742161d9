"""memlab's native SONAR text encoder and decoder (no fairseq2).

The computation mirrors sonar-space 0.5 / fairseq2 0.8 layer by layer (see
``tests/parity``): token embedding x sqrt(D) + fairseq sinusoidal positions
(position ``p`` uses step ``p + pad_token_id + 1``), pre-norm Transformer
layers, a final LayerNorm, mean pooling over the real tokens (encoder), and a
decoder that cross-attends to the sentence vector as a one-element memory and
projects with its tied input embedding. Module names follow transformers'
M2M100 so that the Hugging Face ports of SONAR load by renaming prefixes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from memlab.errors import ModelError
from memlab.models.sonar.configuration_sonar import SonarConfig

_ACT = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def sinusoidal_positions(length: int, dim: int, offset: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """fairseq's sinusoidal table for steps ``offset .. offset + length - 1``: ``(length, dim)``, sin | cos halves."""
    half = dim // 2
    steps = torch.arange(offset, offset + length, device=device, dtype=dtype)  # (S,)
    idx = torch.arange(half, device=device, dtype=dtype)
    freqs = torch.exp(idx * -math.log(10000.0) / (half - 1))  # (D/2,)
    ang = torch.outer(steps, freqs)  # (S, D/2)
    return torch.cat([ang.sin(), ang.cos()], dim=-1)  # (S, D)


@dataclass
class SonarEncoderOutput(ModelOutput):
    """Encoder output: one vector per sentence plus the token states it pools."""

    sentence_embedding: torch.FloatTensor | None = None  # (B, D)
    last_hidden_state: torch.FloatTensor | None = None  # (B, T, D), after the final LayerNorm


@dataclass
class SonarOutput(ModelOutput):
    """Autoencoder output of :meth:`SonarModel.forward`."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None  # (B, T', V)
    sentence_embedding: torch.FloatTensor | None = None  # (B, D)


class SonarAttention(nn.Module):
    """Multi-head attention with biased q/k/v/out projections (fairseq layout)."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, dim // heads, dropout
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # (B, H, S, hd)

    def kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split(self.k_proj(memory)), self.split(self.v_proj(memory))  # 2 x (B, H, S, hd)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
        q = self.split(self.q_proj(x))  # (B, H, T, hd)
        p = self.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)  # (B, H, T, hd)
        return self.out_proj(o.transpose(1, 2).flatten(2))  # (B, T, D)


class SonarEncoderLayer(nn.Module):
    """Pre-norm layer: ``x + SelfAttn(LN(x))``, then ``x + FFN(LN(x))``."""

    def __init__(self, cfg: SonarConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = SonarAttention(d, cfg.encoder_attention_heads, cfg.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.fc1, self.fc2 = nn.Linear(d, cfg.encoder_ffn_dim), nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.act, self.drop, self.act_drop = _ACT[cfg.activation_function], nn.Dropout(cfg.dropout), nn.Dropout(cfg.activation_dropout)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act_drop(self.act(self.fc1(self.final_layer_norm(x)))))  # (B, T, D)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        h = self.self_attn_layer_norm(x)
        k, v = self.self_attn.kv(h)
        x = x + self.drop(self.self_attn(h, k, v, mask))  # (B, T, D)
        return x + self.drop(self.ffn(x))


class SonarDecoderLayer(SonarEncoderLayer):
    """Pre-norm decoder layer: causal self attention, cross attention to the sentence vector(s), FFN."""

    def __init__(self, cfg: SonarConfig):
        nn.Module.__init__(self)
        d, h = cfg.d_model, cfg.decoder_attention_heads
        self.self_attn = SonarAttention(d, h, cfg.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.encoder_attn = SonarAttention(d, h, cfg.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.fc1, self.fc2 = nn.Linear(d, cfg.decoder_ffn_dim), nn.Linear(cfg.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.act, self.drop, self.act_drop = _ACT[cfg.activation_function], nn.Dropout(cfg.dropout), nn.Dropout(cfg.activation_dropout)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor], cache: dict | None = None) -> torch.Tensor:
        h = self.self_attn_layer_norm(x)
        k, v = self.self_attn.kv(h)  # (B, H, T, hd)
        if cache is not None:  # incremental decoding: append this step's keys/values
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
            cache["k"], cache["v"] = k, v
        causal = x.shape[1] > 1
        if causal and k.shape[2] != x.shape[1]:
            raise ModelError("incremental decoding feeds one token at a time")
        x = x + self.drop(self.self_attn(h, k, v, causal=causal))
        h = self.encoder_attn_layer_norm(x)
        x = x + self.drop(self.encoder_attn(h, *memory_kv))  # (B, T, D)
        return x + self.drop(self.ffn(x))


class _Stack(nn.Module):
    """Embedding (scaled) + sinusoidal positions + layers + final LayerNorm."""

    def __init__(self, cfg: SonarConfig, layers: list[nn.Module]):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.offset, self.max_len, self.drop = cfg.pad_token_id + 1, cfg.max_position_embeddings, nn.Dropout(cfg.dropout)

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        if start + ids.shape[1] > self.max_len:
            raise ModelError(f"SONAR takes at most {self.max_len} tokens (special tokens included), got {start + ids.shape[1]}")
        x = self.embed_tokens(ids) * self.scale  # (B, T, D)
        dt = torch.promote_types(x.dtype, torch.float32)  # float32 for half precisions, the model's own in float64
        pos = sinusoidal_positions(ids.shape[1], x.shape[-1], self.offset + start, ids.device, dt)  # (T, D)
        return self.drop((x.to(dt) + pos).type_as(x))


class SonarEncoder(_Stack):
    def __init__(self, cfg: SonarConfig):
        super().__init__(cfg, [SonarEncoderLayer(cfg) for _ in range(cfg.encoder_layers)])
        self.pooling = cfg.pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SonarEncoderOutput:
        keep = attention_mask.bool()  # (B, T)
        x = self.embed(input_ids)  # (B, T, D)
        mask = keep[:, None, None, :]  # (B, 1, 1, T)
        for layer in self.layers:
            x = layer(x, mask)
        x = self.layer_norm(x)  # (B, T, D)
        return SonarEncoderOutput(sentence_embedding=pool(x, keep, self.pooling), last_hidden_state=x)


def pool(x: torch.Tensor, keep: torch.Tensor, how: str) -> torch.Tensor:
    """``(B, T, D)`` token states -> ``(B, D)`` over the positions where ``keep`` (B, T) is true."""
    if how == "mean":
        lens = keep.sum(1).to(x.dtype)  # (B,)
        return (x * keep[..., None]).sum(1) * (1.0 / (lens + 1e-7))[:, None]  # (B, D)
    if how == "max":
        return x.masked_fill(~keep[..., None], float("-inf")).max(1).values
    last = (keep.sum(1) - 1).clamp(min=0)  # (B,) right padding
    return x[torch.arange(x.shape[0], device=x.device), last]


class SonarDecoder(_Stack):
    def __init__(self, cfg: SonarConfig):
        super().__init__(cfg, [SonarDecoderLayer(cfg) for _ in range(cfg.decoder_layers)])

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Cross-attention keys/values of each layer for ``memory`` (B, S, D); computed once per generation."""
        return [layer.encoder_attn.kv(memory) for layer in self.layers]

    def forward(self, ids: torch.Tensor, memory_kv: list, caches: list[dict] | None = None, start: int = 0,
                head: bool = True) -> torch.Tensor:
        x = self.embed(ids, start)  # (B, T, D)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory_kv[i], None if caches is None else caches[i])
        x = self.layer_norm(x)
        return F.linear(x, self.embed_tokens.weight) if head else x  # (B, T, V), tied projection; or features (B, T, D)


class SonarPreTrainedModel(PreTrainedModel):
    config_class = SonarConfig
    base_model_prefix = "sonar"
    supports_gradient_checkpointing = False
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.init_std or self.config.d_model ** -0.5
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):  # fairseq2's init_scaled_embedding
            init.normal_(module.weight, mean=0.0, std=self.config.d_model ** -0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class SonarModel(SonarPreTrainedModel):
    """SONAR text encoder + decoder: ``encode`` -> (B, D) sentence vectors, ``decode`` -> (B, T, V) logits.

    Token ids here include SONAR's special tokens (``[lang] x </s>`` for the
    encoder, ``</s> [lang] x`` for the decoder); :class:`~memlab.models.sonar.space.SonarSpace`
    adds them to plain text.
    """

    def __init__(self, config: SonarConfig):
        config.validate_sonar()
        super().__init__(config)
        self.encoder = SonarEncoder(config)
        self.decoder = SonarDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SonarEncoderOutput:
        """``(B, T)`` ids with special tokens -> sentence embeddings ``(B, D)``."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if (attention_mask.sum(1) == 0).any():
            raise ModelError("SONAR cannot encode an empty sequence (a row of the attention mask is all zero)")
        return self.encoder(input_ids, attention_mask)

    def decode(self, embeddings: torch.Tensor, decoder_input_ids: torch.Tensor, head: bool = True) -> torch.Tensor:
        """Teacher-forced logits ``(B, T, V)``; ``embeddings`` is ``(B, D)`` or a memory ``(B, S, D)``.
        ``head=False``: the final-norm features ``(B, T, D)`` that :meth:`output_head` maps to the logits."""
        memory = embeddings[:, None] if embeddings.dim() == 2 else embeddings  # (B, S, D)
        if memory.shape[-1] != self.config.d_model or memory.shape[0] != decoder_input_ids.shape[0]:
            raise ModelError(f"embeddings {tuple(embeddings.shape)} do not fit decoder inputs {tuple(decoder_input_ids.shape)} "
                             f"and width {self.config.d_model}")
        memory = memory.to(self.decoder.embed_tokens.weight.dtype)
        return self.decoder(decoder_input_ids, self.decoder.memory_kv(memory), head=head)

    def output_head(self) -> tuple[torch.Tensor, None]:
        """``(weight (V, D), bias)`` of the decoder's output projection (tied to its token embeddings; no bias)."""
        return self.decoder.embed_tokens.weight, None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> SonarOutput:
        """Autoencode: encode ``input_ids``, decode ``decoder_input_ids``; cross-entropy against ``labels`` (-100 ignored)."""
        z = self.encode(input_ids, attention_mask).sentence_embedding  # (B, D)
        if decoder_input_ids is None:
            return SonarOutput(sentence_embedding=z)
        logits = self.decode(z, decoder_input_ids)  # (B, T', V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        return SonarOutput(loss=loss, logits=logits, sentence_embedding=z)
