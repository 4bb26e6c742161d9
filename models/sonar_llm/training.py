"""The ``sonar_llm`` recipe: the shared sentence setup with the SONAR-LLM loss, token cross-entropy of
the next sentence through the space's (frozen or trainable) decoder."""

from __future__ import annotations

import torch.nn.functional as F

from memlab.models.sentence.recipe import SentenceRecipe
from memlab.registry import RECIPES
from memlab.train.setup import StepOutput


class SonarLLMLoss:
    """``loss_fn(model, batch)`` for SONAR-LLM; ``handle`` is the (frozen or trainable) space."""

    def __init__(self, handle):
        self.handle = handle
        self._device = None

    def _place(self, model) -> None:
        dev = next(model.parameters()).device
        if self._device != dev and getattr(model, "space", None) is None:
            self.handle.to(dev)
        self._device = dev

    def __call__(self, model, batch: dict) -> StepOutput:
        self._place(model)
        smask = batch["sentence_mask"]  # (B, S)
        out = model(batch["embeddings"][:, :-1], smask[:, :-1], next_input_ids=batch["input_ids"][:, 1:],
                    next_token_mask=batch["token_mask"][:, 1:] * smask[:, 1:, None], space=self.handle.space)
        valid = smask[:, 1:].bool()  # (B, S-1)
        cos = F.cosine_similarity(out.predictions[valid].detach().float(), batch["embeddings"][:, 1:][valid].float(), dim=-1)
        n = out.num_tokens.clamp(min=1)
        return StepOutput(loss=out.loss, metrics={"token_accuracy": out.correct_tokens / n, "cosine": cos.mean()},
                          weight=out.num_tokens)  # a device scalar, never read back here


class SonarLLMRecipe(SentenceRecipe):
    """SONAR-LLM: next-sentence embedding, token CE through the space's frozen decoder"""

    name = "sonar_llm"
    family = "sonar_llm"
    trains_decoder = True

    def make_loss(self, handle, model, opts):
        return SonarLLMLoss(handle)


RECIPES.register("sonar_llm", SonarLLMRecipe(), description=SonarLLMRecipe.__doc__)
