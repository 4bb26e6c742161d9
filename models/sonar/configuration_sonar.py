"""Configuration of memlab's native SONAR text encoder + decoder.

SONAR (Duquenne et al., 2023) is a fixed-size sentence embedding space: a
Transformer encoder whose token states are mean-pooled into one vector, and a
Transformer decoder that cross-attends to that single vector. Both halves are
the NLLB "dense" Transformer: pre-norm layers, embeddings scaled by
``sqrt(d_model)``, fairseq sinusoidal positions (offset by ``pad_token_id + 1``),
ReLU feed-forward layers with biases, a final layer norm, and a decoder whose
output projection is tied to its input embedding.

Token ids follow the Hugging Face NLLB tokenizer (the fairseq dictionary):
``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3, SentencePiece pieces,
then the language tokens (``eng_Latn`` ...) and ``<mask>``. fairseq2
checkpoints store the four control tokens in another order; the converter
(:mod:`memlab.models.sonar.convert`) permutes them.
"""

from __future__ import annotations

from transformers import PretrainedConfig

ACTIVATIONS = ("relu", "gelu", "silu")
POOLINGS = ("mean", "max", "last")


class SonarConfig(PretrainedConfig):
    """Hyper-parameters of :class:`~memlab.models.sonar.modeling_sonar.SonarModel`.

    The defaults are SONAR's ``basic`` text encoder/decoder (24 + 24 layers,
    width 1024, 16 heads, FFN 8192, NLLB vocabulary of 256206 tokens).
    """

    model_type = "memlab_sonar"

    def __init__(
        self,
        vocab_size: int = 256206,
        d_model: int = 1024,
        encoder_layers: int = 24,
        decoder_layers: int = 24,
        encoder_attention_heads: int = 16,
        decoder_attention_heads: int = 16,
        encoder_ffn_dim: int = 8192,
        decoder_ffn_dim: int = 8192,
        max_position_embeddings: int = 512,
        activation_function: str = "relu",
        layer_norm_eps: float = 1e-5,
        scale_embedding: bool = True,
        pooling: str = "mean",
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.1,
        init_std: float | None = None,
        default_lang: str = "eng_Latn",
        pad_token_id: int = 1,
        bos_token_id: int = 0,
        eos_token_id: int = 2,
        unk_token_id: int = 3,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        """Number of token ids (NLLB: 256206)."""
        self.d_model = d_model
        """Width of both halves, which is also the embedding width D."""
        self.encoder_layers = encoder_layers
        """Number of encoder layers."""
        self.decoder_layers = decoder_layers
        """Number of decoder layers."""
        self.encoder_attention_heads = encoder_attention_heads
        """Attention heads per encoder layer."""
        self.decoder_attention_heads = decoder_attention_heads
        """Attention heads per decoder layer (self and cross attention)."""
        self.encoder_ffn_dim = encoder_ffn_dim
        """Inner width of the encoder's feed-forward layers."""
        self.decoder_ffn_dim = decoder_ffn_dim
        """Inner width of the decoder's feed-forward layers."""
        self.max_position_embeddings = max_position_embeddings
        """Longest token sequence (special tokens included) either half accepts."""
        self.activation_function = activation_function
        """Feed-forward activation: relu (SONAR), gelu or silu."""
        self.layer_norm_eps = layer_norm_eps
        """Epsilon of every LayerNorm."""
        self.scale_embedding = scale_embedding
        """Multiply token embeddings by sqrt(d_model) before adding positions."""
        self.pooling = pooling
        """How the encoder's token states become one vector: mean (SONAR), max or last."""
        self.dropout = dropout
        """Dropout on embeddings and on each sub-layer's output (training only)."""
        self.attention_dropout = attention_dropout
        """Dropout on attention weights (training only)."""
        self.activation_dropout = activation_dropout
        """Dropout after the feed-forward activation (training only)."""
        self.init_std = init_std
        """Std of the random init of linear layers; None: d_model ** -0.5."""
        self.default_lang = default_lang
        """Language token used when none is given (an NLLB code such as eng_Latn)."""
        self.unk_token_id = unk_token_id
        """Id of <unk>."""
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)
        # transformers 5 may drop non-standard keys from kwargs handling; keep ours explicit
        self.tie_word_embeddings = True

    def validate_sonar(self) -> None:
        """Raise :class:`~memlab.errors.ModelError` on an inconsistent config."""
        from memlab.errors import ModelError

        if self.d_model % 2:
            raise ModelError(f"SONAR d_model must be even (sinusoidal positions), got {self.d_model}")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, name):
                raise ModelError(f"SONAR d_model={self.d_model} is not divisible by {name}={getattr(self, name)}")
        if self.activation_function not in ACTIVATIONS:
            raise ModelError(f"unknown activation_function '{self.activation_function}'; valid: {', '.join(ACTIVATIONS)}")
        if self.pooling not in POOLINGS:
            raise ModelError(f"unknown pooling '{self.pooling}'; valid: {', '.join(POOLINGS)}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ModelError(f"pad_token_id={self.pad_token_id} outside the vocabulary of {self.vocab_size}")


PRESETS = {
    # 2 layers, width 64: the test size. vocab 512 fits the toy tokenizer of memlab.models.sonar.tokenizer.
    "toy": dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128),
    # SONAR's real size (sonar-space arch "basic", text_sonar_basic_encoder / _decoder).
    "basic": dict(vocab_size=256206, d_model=1024, encoder_layers=24, decoder_layers=24, encoder_attention_heads=16,
                  decoder_attention_heads=16, encoder_ffn_dim=8192, decoder_ffn_dim=8192, max_position_embeddings=512),
}
