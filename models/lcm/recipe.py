"""Recipes ``lcm_mse`` and ``lcm_diffusion``: same data, space handling and backbone as ``sonar_llm``
(:class:`~memlab.models.sentence.recipe.SentenceRecipe`), other losses.

Both losses live in normalised units (robust median/IQR normaliser fitted on the training
embeddings). In evaluation both also report ``next_sentence_ce``: the token cross-entropy of the
space's decoder reading the predicted (MSE) or sampled (diffusion, DDIM + guidance) embedding,
the quantity SONAR-LLM trains on, so the three families share one yardstick.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memlab import randomness

from memlab.models.sentence.objective import decoder_cross_entropy, next_sentence_targets
from memlab.models.sentence.recipe import SentenceRecipe
from memlab.registry import RECIPES
from memlab.train.setup import StepOutput


class LCMLoss:
    """MSE between predicted and true next embeddings in normalised units (``diffusion``: of the clean
    embedding predicted from a noised one at a per-example random timestep), weighted by the number of
    predicted sentences (the loss is their mean, so any split of a batch gives the same weighted mean).
    :meth:`evaluate` (the recipe's ``eval_step_fn``) adds the shared yardstick, weighted by target tokens."""

    def __init__(self, handle, diffusion: bool):
        self.handle, self.diffusion = handle, diffusion
        self._device = None

    def _forward(self, model, batch: dict):
        dev = next(model.parameters()).device
        if self._device != dev:
            self.handle.to(dev)
            self._device = dev
        inp, mask = batch["embeddings"][:, :-1], batch["sentence_mask"][:, :-1]  # (B, S-1, E), (B, S-1)
        target = batch["embeddings"][:, 1:]  # (B, S-1, E)
        valid = (batch["token_mask"][:, 1:] * batch["sentence_mask"][:, 1:, None]).sum(-1) > 0  # (B, S-1)
        out = model(inp, mask, targets=target, target_mask=valid, seeds=batch.get(randomness.SEED_KEY))
        return out, inp, mask, target, valid

    def __call__(self, model, batch: dict) -> StepOutput:
        out, *_, valid = self._forward(model, batch)
        return StepOutput(loss=out.loss, weight=valid.sum())  # a device scalar: never read back here

    @torch.no_grad()
    def evaluate(self, model, batch: dict) -> dict[str, StepOutput]:
        """``loss`` (with ``cosine`` of the next-sentence embedding, per sentence) and ``decoder``: the token
        cross-entropy and accuracy of the space's decoder reading the model's next-sentence embedding (MSE: the
        prediction; diffusion: a DDIM sample with per-example noise), per target token."""
        out, inp, mask, target, valid = self._forward(model, batch)
        seeds = batch.get(randomness.SEED_KEY)
        z = (model(inp, mask, mode="sample", seeds=seeds).predictions if self.diffusion else out.predictions)[valid]  # (N, E)
        _, ids, tmask = next_sentence_targets(batch, self.handle.tokenizer.pad_token_id or 0)  # (N, L)
        total, correct, count = decoder_cross_entropy(self.handle.space, self.handle.shape, z, ids, tmask)
        n = count.clamp(min=1)
        cos = F.cosine_similarity(z.float(), target[valid].float(), dim=-1).mean()
        return {"loss": StepOutput(loss=out.loss, metrics={"cosine": cos}, weight=valid.sum()),
                "decoder": StepOutput(loss=total / n, metrics={"next_sentence_ce": total / n, "token_accuracy": correct / n},
                                      weight=count)}


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
