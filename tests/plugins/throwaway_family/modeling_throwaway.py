"""Model of the throwaway family: embedding -> tanh -> output layer, a next-token loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_throwaway import ThrowawayConfig


class ThrowawayModel(PreTrainedModel):
    """``logits[:, t]`` depend on ``input_ids[:, t]`` only."""

    config_class = ThrowawayConfig

    def __init__(self, config: ThrowawayConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_) -> CausalLMOutput:
        logits = self.head(torch.tanh(self.embed(input_ids)))  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)
