"""Large Concept Model baselines over any EmbeddingSpace: LCM-MSE (family/recipe ``lcm_mse``) and
the two-tower diffusion LCM (family/recipe ``lcm_diffusion``), on the SONAR-LLM backbone.

Importing this package registers both families, both recipes and their generators.
"""

from memlab.models.lcm.configuration_lcm import LCMDiffusionConfig, LCMMSEConfig
from memlab.models.lcm.modeling_lcm import LCMDiffusionModel, LCMMSEModel
from memlab.models.sonar_llm.configuration_sonar_llm import SHARED_PRESETS
from memlab.models.sonar_llm.examples import lcm_example_inputs
from memlab.models.sonar_llm.generation import sentence_generator
from memlab.registry import GENERATORS, ModelFamily, register_family

_PRESETS = {k: dict(v, embed_dim=32) for k, v in SHARED_PRESETS.items()}

register_family(ModelFamily(name="lcm_mse", config_class=LCMMSEConfig, model_class=LCMMSEModel, presets=_PRESETS,
                            description="LCM-MSE: next sentence embedding by regression (SONAR-LLM backbone)",
                            example_inputs=lcm_example_inputs))
register_family(ModelFamily(
    name="lcm_diffusion", config_class=LCMDiffusionConfig, model_class=LCMDiffusionModel,
    presets={k: dict(v, denoiser_layers=v["num_hidden_layers"]) for k, v in _PRESETS.items()},
    description="two-tower diffusion LCM: context encoder + AdaLN denoiser, DDIM with classifier-free guidance",
    example_inputs=lcm_example_inputs))
GENERATORS.register("lcm_mse", sentence_generator, description="sentence-by-sentence generation (LCM-MSE)")
GENERATORS.register("lcm_diffusion", sentence_generator, description="sentence-by-sentence generation (LCM diffusion)")

from memlab.models.lcm import recipe  # noqa: E402,F401  (registers the 'lcm_mse' and 'lcm_diffusion' recipes)
