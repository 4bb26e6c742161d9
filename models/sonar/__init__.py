"""Native SONAR space: SONAR's text encoder and decoder as a transformers-style
family (``sonar``) and an embedding space (``SPACES['sonar']``), loading real
weights from Hugging Face ports or fairseq2 checkpoints. No fairseq2 needed."""

from memlab.models.sonar.configuration_sonar import PRESETS, SonarConfig
from memlab.models.sonar.modeling_sonar import SonarModel
from memlab.models.sonar.space import SonarSpace, load, toy_space
from memlab.registry import SPACES, ModelFamily, register_family

FAMILY = register_family(
    ModelFamily(
        name="sonar",
        config_class=SonarConfig,
        model_class=SonarModel,
        presets=PRESETS,
        description="SONAR text encoder + decoder (mean-pooled sentence vector, decoder cross-attends to it)",
    )
)
SPACES.register("sonar", load, description="SONAR sentence space (spec: toy | saved folder | enc.pt,dec.pt | HF ports)")

__all__ = ["SonarConfig", "SonarModel", "SonarSpace", "load", "toy_space", "FAMILY"]
