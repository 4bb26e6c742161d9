"""Parallel encoder-decoder memory models (family ``memory``), their recipe and the ``memory_ae`` space."""

from memlab.models.memory.configuration_memory import MemoryConfig
from memlab.models.memory.modeling_memory import MemoryModel, MemoryModelOutput
from memlab.registry import EVAL_ADAPTERS, GENERATORS, SPACES, ModelFamily, register_family

PRESETS = {
    "toy": dict(chunk_len=16, encoder_hidden_size=48, encoder_layers=2, encoder_heads=4, encoder_intermediate_size=96,
                hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=4096),
    "small": dict(chunk_len=32, encoder_hidden_size=256, encoder_layers=4, encoder_heads=4, encoder_intermediate_size=704,
                  hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=704, vocab_size=4096),
    "paper": dict(chunk_len=64, max_chunks=16, encoder_hidden_size=1024, encoder_layers=16, encoder_heads=16,
                  encoder_intermediate_size=2816, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                  intermediate_size=2816, vocab_size=8000),
}

def example_inputs(config: MemoryConfig, batch_size: int = 2) -> dict:
    """Two chunks per example, blank copy: ``model(**inputs).loss`` rebuilds each chunk from its memory."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(8, config.vocab_size, (batch_size, 2, config.chunk_len), generator=g)  # (B, C, T)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


FAMILY = register_family(
    ModelFamily(name="memory", config_class=MemoryConfig, model_class=MemoryModel, presets=PRESETS,
                description="parallel encoder-decoder memory model (Transformer/Mixer encoder, K memories per chunk)",
                example_inputs=example_inputs)
)


def _load_space(spec=None, **kw):
    """Trained memory autoencoder (run dir or save_pretrained folder with its tokenizer)."""
    from memlab.models.memory.space import load

    return load(spec, **kw)


def _reconstruct(model_dir, prompts, opts):
    """memlab generate: rebuild each prompt from its memory."""
    from memlab.models.memory.space import reconstruct

    return reconstruct(model_dir, prompts, opts)


def _eval_adapter(model_dir):
    """Memory LM: scores and greedy generation, reading the memories of the previous chunks."""
    from memlab.models.memory.eval_adapter import memory_adapter

    return memory_adapter(model_dir)


SPACES.register("memory_ae", _load_space, description="trained memory autoencoder (run dir or saved folder)")
GENERATORS.register("memory", _reconstruct, description="rebuild prompts from their memories")
EVAL_ADAPTERS.register("memory", _eval_adapter)

from memlab.models.memory import recipe  # noqa: E402,F401  (registers the 'memory' recipe)

__all__ = ["MemoryConfig", "MemoryModel", "MemoryModelOutput"]
