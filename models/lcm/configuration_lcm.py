"""Configurations of the Large Concept Model baselines: the shared sentence-LM backbone with other heads."""

from __future__ import annotations

from memlab.models.sentence.configuration_sentence import SentenceLMConfig


class LCMMSEConfig(SentenceLMConfig):
    """LCM-MSE ("Base-LCM"): the SONAR-LLM backbone regressing the next (normalised) embedding with MSE.

    Same arguments as :class:`~memlab.models.sentence.configuration_sentence.SentenceLMConfig`.
    """

    model_type = "memlab_lcm_mse"

    def __init__(self, **kwargs):  # explicit: transformers would otherwise generate a dataclass __init__
        super().__init__(**kwargs)


class LCMDiffusionConfig(SentenceLMConfig):
    """Two-tower diffusion LCM: the backbone is the context encoder; a denoiser with AdaLN timestep
    modulation cross-attends to it (causally) and predicts the clean next embedding.

    Args (besides SentenceLMConfig's):
        denoiser_layers: blocks of the denoiser tower (its width is ``hidden_size``).
        num_timesteps: diffusion steps ``T`` of the cosine noise schedule.
        ddim_steps: DDIM sampling steps (deterministic, eta = 0).
        guidance_scale: classifier-free guidance ``g``: ``x0 = x0_u + g * (x0_c - x0_u)``.
        cfg_dropout: probability that a training position loses its context (learns the unconditional model).
        clip_sample: predicted clean embeddings are clamped to ``[-clip, clip]`` in normalised units (0 = off).
    """

    model_type = "memlab_lcm_diffusion"

    def __init__(self, denoiser_layers: int = 2, num_timesteps: int = 100, ddim_steps: int = 20,
                 guidance_scale: float = 1.5, cfg_dropout: float = 0.15, clip_sample: float = 10.0, **kwargs):
        self.denoiser_layers = denoiser_layers
        self.num_timesteps = num_timesteps
        self.ddim_steps = ddim_steps
        self.guidance_scale = guidance_scale
        self.cfg_dropout = cfg_dropout
        self.clip_sample = clip_sample
        super().__init__(**kwargs)
