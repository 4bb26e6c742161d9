"""SONAR-LLM: a Llama-style decoder that predicts the next sentence embedding.

The shared backbone (:class:`~memlab.models.sentence.modeling_sentence.SentenceBackbone`) reads the
embeddings of sentences ``0..n-1``; an output projection predicts the embedding of sentence ``n``,
in the space's own scale.

SONAR-LLM is trained by teacher forcing *through the space's frozen decoder*
(see :mod:`memlab.models.sentence.objective`).
"""

from __future__ import annotations

import torch
from torch import nn

from memlab.errors import ModelError
from memlab.models.sentence.modeling_sentence import (SentenceBackbone, SentenceModelOutput, SentencePreTrainedModel,
                                                      last_positions)
from memlab.models.sonar_llm.configuration_sonar_llm import SonarLLMConfig


class SonarLLMModel(SentencePreTrainedModel):
    """SONAR-LLM: next-sentence embedding prediction, trained through the space's frozen decoder."""

    config_class = SonarLLMConfig

    def __init__(self, config: SonarLLMConfig):
        super().__init__(config)
        self.backbone = SentenceBackbone(config)
        self.out_proj = nn.Linear(config.hidden_size, config.embed_dim)
        self.post_init()

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None,
                next_input_ids: torch.Tensor | None = None, next_token_mask: torch.Tensor | None = None,
                space=None, **_) -> SentenceModelOutput:
        """``embeddings (B, S, E)``; with ``next_input_ids``/``next_token_mask (B, S, L)`` (the tokens of
        the sentence each position must predict, in the space's tokenizer; an all-zero mask row is
        skipped) and the ``space`` whose decoder reads the predictions, also the SONAR-LLM loss."""
        h = self.backbone(embeddings, attention_mask)  # (B, S, H)
        pred = self.backbone.normalizer.denormalize(self.out_proj(h))  # (B, S, E)
        if next_input_ids is None:
            return SentenceModelOutput(predictions=pred, last_hidden_state=h)
        if space is None:
            raise ModelError("the SONAR-LLM loss goes through a space's decoder: pass space=")
        from memlab.models.sentence.objective import decoder_cross_entropy, select_targets

        pad = getattr(space.tokenizer, "pad_token_id", None) or 0
        valid, ids, mask = select_targets(next_input_ids, next_token_mask, pad, attention_mask)  # (B, S), (N, L)
        shape = self.config.space_shape or [self.config.embed_dim]
        total, correct, count = decoder_cross_entropy(space, shape, pred[valid], ids, mask)
        count = count.to(total.device)
        return SentenceModelOutput(loss=total / count.clamp(min=1), predictions=pred, last_hidden_state=h,
                                   num_tokens=count, correct_tokens=correct)

    @torch.no_grad()
    def predict_next(self, embeddings: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> torch.Tensor:
        """``(B, S, E)`` context -> ``(B, E)`` embedding of the next sentence."""
        return last_positions(self(embeddings, attention_mask).predictions, attention_mask)
