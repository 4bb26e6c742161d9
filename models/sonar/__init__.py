"""Native SONAR space: SONAR's text encoder and decoder as a transformers-style
family (``sonar``) and an embedding space (``SPACES['sonar']``), loading real
weights from Hugging Face ports or fairseq2 checkpoints. No fairseq2 needed."""

from memlab.models.sonar.configuration_sonar import PRESETS, SonarConfig
from memlab.models.sonar.modeling_sonar import SonarModel
from memlab.models.sonar.space import SonarSpace, load, toy_space
from memlab.registry import SPACES, ModelFamily, register_family

def example_inputs(config: SonarConfig, batch_size: int = 2) -> dict:
    """Random sentences autoencoded: ``model(**inputs).loss`` is the reconstruction cross-entropy."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, config.vocab_size, (batch_size, 12), generator=g)  # (B, T) past the control tokens
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0
    dec_in = torch.cat([torch.full_like(ids[:, :1], config.eos_token_id), ids[:, :-1]], 1)  # (B, T)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec_in, "labels": ids.masked_fill(mask == 0, -100)}


FAMILY = register_family(
    ModelFamily(
        name="sonar",
        config_class=SonarConfig,
        model_class=SonarModel,
        presets=PRESETS,
        description="SONAR text encoder + decoder (mean-pooled sentence vector, decoder cross-attends to it)",
        example_inputs=example_inputs,
    )
)
SPACES.register("sonar", load, description="SONAR sentence space (spec: toy | saved folder | enc.pt,dec.pt | HF ports)")

__all__ = ["SonarConfig", "SonarModel", "SonarSpace", "load", "toy_space", "FAMILY"]
