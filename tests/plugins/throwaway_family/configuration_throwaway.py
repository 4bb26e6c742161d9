"""Config of the throwaway family: a bigram LM (each token predicts the next one alone)."""

from __future__ import annotations

from transformers import PretrainedConfig


class ThrowawayConfig(PretrainedConfig):
    """Args:
        vocab_size: tokens of the vocabulary.
        hidden_size: width of the bigram's bottleneck.
        max_position_embeddings: longest text the evaluation adapter reads.
    """

    model_type = "memlab_test_throwaway"

    def __init__(self, vocab_size: int = 300, hidden_size: int = 16, max_position_embeddings: int = 256, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_position_embeddings = max_position_embeddings
        super().__init__(**kwargs)
