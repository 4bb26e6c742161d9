"""A throwaway model family that lives outside memlab's tree (tests/models/test_new_family.py): everything a
new family needs (config, model, toy preset, registration, evaluation adapter) in its own folder,
registered by importing this package."""

from memlab.registry import EVAL_ADAPTERS, ModelFamily, register_family

from .configuration_throwaway import ThrowawayConfig
from .modeling_throwaway import ThrowawayModel

PRESETS = {"toy": dict(vocab_size=300, hidden_size=16)}


def example_inputs(config: ThrowawayConfig, batch_size: int = 2) -> dict:
    """Random token rows with labels: ``model(**inputs).loss`` is the next-token loss."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch_size, 12), generator=g)  # (B, T)
    return {"input_ids": ids, "labels": ids}


def _eval_adapter(model_dir):
    """Bigram LM: scores and greedy generation."""
    from .eval_adapter import bigram_adapter

    return bigram_adapter(model_dir)


FAMILY = register_family(ModelFamily(name="throwaway", config_class=ThrowawayConfig, model_class=ThrowawayModel,
                                     presets=PRESETS, description="throwaway bigram LM (a test plugin)",
                                     example_inputs=example_inputs))
EVAL_ADAPTERS.register("throwaway", _eval_adapter)
