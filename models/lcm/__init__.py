"""Large Concept Model baselines over any EmbeddingSpace: LCM-MSE (family/recipe ``lcm_mse``) and
the two-tower diffusion LCM (family/recipe ``lcm_diffusion``), on the shared sentence-LM backbone
(:mod:`memlab.models.sentence`).

Importing this package registers both families, both recipes and their generators.
"""

from memlab.models.lcm.configuration_lcm import LCMDiffusionConfig, LCMMSEConfig
from memlab.models.lcm.modeling_lcm import LCMDiffusionModel, LCMMSEModel
from memlab.models.sentence.configuration_sentence import SHARED_PRESETS
from memlab.models.sentence.generation import sentence_generator
from memlab.registry import GENERATORS, ModelFamily, register_family


def lcm_example_inputs(config, batch_size: int, sentences: int = 4) -> dict:
    """Random documents of ``sentences + 1`` embeddings: the first ``S`` read, the last ``S`` targets."""
    import torch

    g = torch.Generator().manual_seed(0)
    emb = torch.randn(batch_size, sentences + 1, config.embed_dim, generator=g)  # (B, S+1, E)
    return dict(embeddings=emb[:, :-1], attention_mask=torch.ones(batch_size, sentences, dtype=torch.long),
                targets=emb[:, 1:])


_PRESETS = {k: dict(v, embed_dim=32) for k, v in SHARED_PRESETS.items()}

register_family(ModelFamily(name="lcm_mse", config_class=LCMMSEConfig, model_class=LCMMSEModel, presets=_PRESETS,
                            description="LCM-MSE: next sentence embedding by regression (the shared sentence-LM backbone)",
                            example_inputs=lcm_example_inputs))
register_family(ModelFamily(
    name="lcm_diffusion", config_class=LCMDiffusionConfig, model_class=LCMDiffusionModel,
    presets={k: dict(v, denoiser_layers=v["num_hidden_layers"]) for k, v in _PRESETS.items()},
    description="two-tower diffusion LCM: context encoder + AdaLN denoiser, DDIM with classifier-free guidance",
    example_inputs=lcm_example_inputs))
GENERATORS.register("lcm_mse", sentence_generator, description="sentence-by-sentence generation (LCM-MSE)")
GENERATORS.register("lcm_diffusion", sentence_generator, description="sentence-by-sentence generation (LCM diffusion)")

from memlab.models.lcm import recipe  # noqa: E402,F401  (registers the 'lcm_mse' and 'lcm_diffusion' recipes)
