"""The sentence-LM backbone shared by SONAR-LLM and the LCM baselines.

The backbone (transformers ``LlamaModel`` fed through ``inputs_embeds``: RoPE, RMSNorm, SwiGLU,
causal SDPA attention) reads the embeddings of sentences ``0..n-1`` through an input projection;
each family puts its own head on its states. Embeddings enter normalised by a robust per-dimension
normaliser (median / IQR fitted on the training embeddings, stored as buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaModel, PreTrainedModel
from transformers.utils import ModelOutput

from memlab.errors import ModelError
from memlab.models.sentence.configuration_sentence import SentenceLMConfig


class RobustNormalizer(nn.Module):
    """Per-dimension ``(x - median) / IQR`` (scaled to a unit-variance Gaussian), fitted on training data."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("center", torch.zeros(max(dim, 1)))
        self.register_buffer("scale", torch.ones(max(dim, 1)))

    @torch.no_grad()
    def fit(self, x: torch.Tensor, max_rows: int = 200_000) -> None:
        """Fit on ``(N, E)`` embeddings (a random subset of ``max_rows`` rows at most)."""
        x = x.float()
        if x.shape[0] > max_rows:
            x = x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[:max_rows]]
        q = torch.quantile(x, torch.tensor([0.25, 0.5, 0.75]), dim=0)  # (3, E)
        iqr = (q[2] - q[0]) / 1.349  # a Gaussian's IQR is 1.349 sigma
        std = x.std(0)
        scale = torch.where(iqr > 1e-6, iqr, std.clamp(min=1e-6))
        self.center.copy_(q[1])
        self.scale.copy_(scale)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.center.to(x.dtype)) / self.scale.to(x.dtype)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.to(x.dtype) + self.center.to(x.dtype)


@dataclass
class SentenceModelOutput(ModelOutput):
    """``predictions``: ``(B, S, E)`` next-sentence embeddings in the space's scale (position ``i``
    predicts sentence ``i + 1``); ``last_hidden_state``: ``(B, S, H)`` backbone states; ``normalized``:
    ``(B, S, E)`` predictions in normalised units (the LCM losses); ``loss`` when targets are given
    (SONAR-LLM: mean token cross-entropy, with ``num_tokens`` / ``correct_tokens`` target tokens)."""

    loss: torch.Tensor | None = None
    predictions: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    normalized: torch.Tensor | None = None
    num_tokens: torch.Tensor | None = None
    correct_tokens: torch.Tensor | None = None


class SentencePreTrainedModel(PreTrainedModel):
    """Shared init for the sentence-level families (SONAR-LLM, LCM-MSE, LCM diffusion)."""

    config_class = SentenceLMConfig
    base_model_prefix = "sentence_model"
    main_input_name = "embeddings"
    _supports_sdpa = True
    _no_split_modules = ["LlamaDecoderLayer"]
    # an unfrozen space decoder (config.decoder_trained) is saved beside the model as space.*; it is restored into
    # the space (strictly) by load_space_for_model, so the model's own strict load does not read those keys
    _keys_to_ignore_on_load_unexpected = [r"^space\."]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
        elif hasattr(module, "variance_epsilon") and hasattr(module, "weight"):  # RMSNorm
            module.weight.fill_(1.0)
        elif isinstance(module, nn.LayerNorm) and module.weight is not None:
            module.weight.fill_(1.0)
            module.bias.zero_()


class SentenceBackbone(nn.Module):
    """Normalise -> input projection -> Llama decoder (causal over sentences) -> ``(B, S, H)``."""

    def __init__(self, config: SentenceLMConfig):
        super().__init__()
        if config.embed_dim <= 0:
            raise ModelError("embed_dim is 0: build the model from a space (the recipe sets it) or set model.embed_dim")
        self.normalizer = RobustNormalizer(config.embed_dim)
        self.in_proj = nn.Linear(config.embed_dim, config.hidden_size)
        self.decoder = LlamaModel(config.backbone_config())
        # it reads inputs_embeds: the token embedding never gets a gradient, so it is frozen (DDP would otherwise
        # wait for its gradient at every step)
        self.decoder.embed_tokens.requires_grad_(False)

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        E = self.in_proj.in_features
        if embeddings.shape[-1] != E:
            raise ModelError(f"embeddings of width {embeddings.shape[-1]} given to a model of width {E}")
        max_pos = self.decoder.config.max_position_embeddings
        if embeddings.shape[1] > max_pos:
            raise ModelError(f"{embeddings.shape[1]} sentences, more than the model allows (max_position_embeddings={max_pos})")
        x = self.in_proj(self.normalizer.normalize(embeddings.to(self.in_proj.weight.dtype)))  # (B, S, H)
        if attention_mask is not None and attention_mask.dim() == 2 and self.decoder.config._attn_implementation == "sdpa":
            # the causal padding mask made here: from a 2-D mask transformers would first ask whether it is all
            # ones, reading it back from the device at every batch
            s = x.shape[1]
            causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()  # (S, S)
            attention_mask = causal & attention_mask.bool()[:, None, None, :]  # (B, 1, S, S)
        return self.decoder(inputs_embeds=x, attention_mask=attention_mask).last_hidden_state  # (B, S, H)


def last_positions(x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``(B, S, ...)`` -> ``(B, ...)`` at each row's last real position (right padding)."""
    if attention_mask is None:
        return x[:, -1]
    idx = attention_mask.long().sum(1) - 1  # (B,)
    return x[torch.arange(x.shape[0], device=x.device), idx]
