"""Token-level LM baseline: a Llama-style causal LM built from a transformers ``LlamaConfig``.

It is the baseline of the memory-model and SONAR-LLM comparisons and the
first family the training loop trains (recipe ``lm``).
"""

from transformers import LlamaConfig, LlamaForCausalLM

from memlab.adapters import CausalLMAdapter
from memlab.registry import EVAL_ADAPTERS, ModelFamily, register_family

PRESETS = {
    "toy": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=512, vocab_size=4096, tie_word_embeddings=True),
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=2048, vocab_size=4096, tie_word_embeddings=True),
    "base": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=12, max_position_embeddings=4096, vocab_size=32000, tie_word_embeddings=True),
}

def example_inputs(config: LlamaConfig, batch_size: int = 2) -> dict:
    """Random token chunks with labels: ``model(**inputs).loss`` is the next-token loss."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch_size, 16), generator=g)  # (B, T)
    return {"input_ids": ids, "labels": ids}


FAMILY = register_family(
    ModelFamily(
        name="token_lm",
        config_class=LlamaConfig,
        model_class=LlamaForCausalLM,
        presets=PRESETS,
        description="Llama-style causal token LM (transformers LlamaForCausalLM)",
        example_inputs=example_inputs,
    )
)
EVAL_ADAPTERS.register("token_lm", CausalLMAdapter.from_dir,
                       description="causal LM: log-likelihood scores and greedy generation")

from memlab.models.token_lm import recipe  # noqa: E402,F401  (registers the 'lm' recipe)
