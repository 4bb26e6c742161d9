"""Configuration shared by the sentence-level families (SONAR-LLM, the LCM baselines): a Llama-style
decoder over the sentence embeddings of an embedding space. Each family subclasses
:class:`SentenceLMConfig` with its own ``model_type``."""

from __future__ import annotations

from transformers import LlamaConfig, PretrainedConfig

SHARED_PRESETS = {
    "toy": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=64),
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                  max_position_embeddings=128),
    "base": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                 max_position_embeddings=512),
}


class SentenceLMConfig(PretrainedConfig):
    """A decoder-only Transformer (RoPE, RMSNorm, SwiGLU: Llama) over sentence embeddings.

    Args:
        embed_dim: width ``E`` of a (flattened) sentence embedding of the space; ``0`` = set from the
            space when the recipe builds the model.
        space_shape: shape of one embedding in the space (``[D]`` or ``[K, D]``); ``E`` is its product.
        space: spec of the space (``NAME`` or ``NAME:ARG``, e.g. ``memory_ae:runs/ae``,
            ``sonar:cointegrated/SONAR_200_text_encoder``) used to rebuild it at generation time.
        end_sentence: the sentence that ends every document.
        stop_cosine: generation stops when the cosine to the end sentence's embedding reaches this.
        decoder_trained: the space's decoder was unfrozen and trained; its weights are saved
            beside the model under the ``space.`` prefix.
        hidden_size / intermediate_size / num_hidden_layers / num_attention_heads /
        num_key_value_heads / max_position_embeddings (most sentences per document) / rope_theta /
        rms_norm_eps / initializer_range: the Llama backbone.
    """

    def __init__(
        self,
        embed_dim: int = 0,
        space_shape: list[int] | None = None,
        space: str = "",
        end_sentence: str = "End of sequence.",
        stop_cosine: float = 0.98,
        decoder_trained: bool = False,
        hidden_size: int = 64,
        intermediate_size: int = 128,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        max_position_embeddings: int = 64,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        self.embed_dim = embed_dim
        self.space_shape = list(space_shape) if space_shape else ([embed_dim] if embed_dim else [])
        self.space = space
        self.end_sentence = end_sentence
        self.stop_cosine = stop_cosine
        self.decoder_trained = decoder_trained
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    def backbone_config(self) -> LlamaConfig:
        """The Llama config of the backbone (it reads ``inputs_embeds``; its 1-entry vocabulary is unused)."""
        return LlamaConfig(
            vocab_size=1, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps, initializer_range=self.initializer_range,
            pad_token_id=None, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
        )
