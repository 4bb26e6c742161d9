"""Recipes ``lcm_mse`` and ``lcm_diffusion``: same data, space handling and backbone as ``sonar_llm``
(:class:`~memlab.models.sentence.recipe.SentenceRecipe`), other losses.

Both losses live in normalised units (robust median/IQR normaliser fitted on the training
embeddings). In evaluation both also report ``next_sentence_ce``: the token cross-entropy of the
space's decoder reading the predicted (MSE) or sampled (diffusion, DDIM + guidance) embedding,
the quantity SONAR-LLM trains on, so the three families share one yardstick.
"""

from __future__ import annotations

import torch.nn.functional as F

from memlab.models.sentence.objective import decoder_cross_entropy, next_sentence_targets
from memlab.models.sentence.recipe import SentenceRecipe
from memlab.registry import RECIPES
from memlab.train.setup import StepOutput


class LCMLoss:
    """MSE between predicted and true next embeddings in normalised units (``diffusion``: of the clean
    embedding predicted from a noised one at a random timestep)."""

    def __init__(self, handle, diffusion: bool):
        self.handle, self.diffusion = handle, diffusion
        self._device = None

    def __call__(self, model, batch: dict) -> StepOutput:
        dev = next(model.parameters()).device
        if self._device != dev:
            self.handle.to(dev)
            self._device = dev
        inp, mask = batch["embeddings"][:, :-1], batch["sentence_mask"][:, :-1]  # (B, S-1, E), (B, S-1)
        target = batch["embeddings"][:, 1:]  # (B, S-1, E)
        valid, ids, tmask = next_sentence_targets(batch, self.handle.tokenizer.pad_token_id or 0)  # (B, S-1), (N, L)
        out = model(inp, mask, targets=target, target_mask=valid)
        metrics: dict = {}
        n_tokens = tmask.sum()  # a device scalar: the loop averages with it without reading it back
        if not model.training:  # the shared yardstick: decoder CE of the model's next-sentence embedding
            z = (model.sample(inp, mask, all_positions=True) if self.diffusion else out.predictions)[valid]  # (N, E)
            total, correct, count = decoder_cross_entropy(self.handle.space, self.handle.shape, z, ids, tmask)
            metrics["next_sentence_ce"] = total / count.clamp(min=1)
            metrics["token_accuracy"] = correct / count.clamp(min=1)
            metrics["cosine"] = F.cosine_similarity(z.float(), target[valid].float(), dim=-1).mean()
        return StepOutput(loss=out.loss, metrics=metrics, weight=n_tokens)


class LCMMSERecipe(SentenceRecipe):
    """LCM-MSE: regression of the next normalised embedding (same backbone, data and budget as sonar_llm)."""

    name = "lcm_mse"
    family = "lcm_mse"

    def make_loss(self, handle, model, opts):
        return LCMLoss(handle, diffusion=False)


class LCMDiffusionRecipe(SentenceRecipe):
    """Two-tower diffusion LCM: denoise the next normalised embedding (x0 prediction, cosine schedule, CFG)."""

    name = "lcm_diffusion"
    family = "lcm_diffusion"

    def make_loss(self, handle, model, opts):
        return LCMLoss(handle, diffusion=True)


RECIPES.register("lcm_mse", LCMMSERecipe(), description=LCMMSERecipe.__doc__)
RECIPES.register("lcm_diffusion", LCMDiffusionRecipe(), description=LCMDiffusionRecipe.__doc__)
