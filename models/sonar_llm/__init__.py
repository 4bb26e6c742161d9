"""SONAR-LLM: a Llama-style decoder over sentence embeddings of any EmbeddingSpace, trained with
token-level cross-entropy through the space's frozen decoder (family and recipe ``sonar_llm``).

Importing this package registers the family, the ``sonar_llm`` recipe, its generator for
``memlab generate`` and its evaluation adapter; the backbone, data path and generation it shares with
the LCM baselines live in :mod:`memlab.models.sentence`.
"""

from memlab.models.sentence.configuration_sentence import SHARED_PRESETS
from memlab.models.sentence.generation import sentence_generator
from memlab.models.sonar_llm.configuration_sonar_llm import SonarLLMConfig
from memlab.models.sonar_llm.examples import sonar_llm_example_inputs
from memlab.models.sonar_llm.modeling_sonar_llm import SonarLLMModel
from memlab.registry import EVAL_ADAPTERS, GENERATORS, ModelFamily, register_family

FAMILY = register_family(
    ModelFamily(
        name="sonar_llm",
        config_class=SonarLLMConfig,
        model_class=SonarLLMModel,
        presets={k: dict(v, embed_dim=32) for k, v in SHARED_PRESETS.items()},
        description="SONAR-LLM: Llama decoder over sentence embeddings, CE through the space's frozen decoder",
        example_inputs=sonar_llm_example_inputs,
    )
)
GENERATORS.register("sonar_llm", sentence_generator, description="sentence-by-sentence generation (SONAR-LLM)")


def _eval_adapter(model_dir):
    """SONAR-LLM: sentence-level likelihood through the space's decoder, sentence-by-sentence generation."""
    from memlab.models.sonar_llm.eval_adapter import sonar_llm_adapter

    return sonar_llm_adapter(model_dir)


EVAL_ADAPTERS.register("sonar_llm", _eval_adapter)

from memlab.models.sonar_llm import training  # noqa: E402,F401  (registers the 'sonar_llm' recipe)
