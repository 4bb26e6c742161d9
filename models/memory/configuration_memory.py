"""Configuration of the parallel encoder-decoder memory model."""

from __future__ import annotations

from transformers import PretrainedConfig

from memlab.errors import ModelError

ENCODER_TYPES = ("transformer", "mixer")
POOLINGS = ("last", "mean", "query", "flatten")
INJECTIONS = ("prefix", "unrolled")
COPY_INPUTS = ("blank", "shifted")
OWN_MEMORY_PATHS = ("shared", "separate")
NOISE_SAMPLING = ("fixed", "uniform")

# Keys that must agree between a trained encoder and the model that loads it frozen.
ENCODER_KEYS = ("vocab_size", "encoder_type", "encoder_hidden_size", "encoder_layers", "encoder_heads",
                "encoder_intermediate_size", "chunk_len", "num_memories", "pooling", "memory_dim")

# Keys that leave every weight as it is (training-time noise, what the decoder reads as a space): a model
# loaded with ``model.init_from`` may change them.
INIT_FROM_KEYS = ("memory_noise", "memory_noise_sampling", "copy_inputs")


class MemoryConfig(PretrainedConfig):
    """Encoder (bidirectional Transformer or masked Mixer) -> K memory vectors per chunk -> causal decoder.

    Args:
        vocab_size: tokens of the shared vocabulary.
        chunk_len: tokens per chunk ``T`` (sentences: the longest sentence, padded).
        max_chunks: most chunks ``C`` one example may hold (memory distance embeddings).
        encoder_type: ``transformer`` (bidirectional attention) or ``mixer`` (token mixing by a
            learned position-by-position linear map, masked at padding).
        encoder_hidden_size / encoder_layers / encoder_heads / encoder_intermediate_size: encoder shape.
        num_memories: memory vectors ``K`` per chunk.
        pooling: ``last`` (last real token), ``mean`` (mean over real tokens) or ``query`` (K learned
            queries attend to the encoder states) or ``flatten`` (one linear map of all T positions' states,
            padding zeroed: a position-aware pooling, the dual of the unrolled decoder); ``last``/``mean``
            expand to K vectors by a linear map.
        memory_dim: width of a memory vector (the bottleneck, the space's ``dim``); 0 = encoder width.
        hidden_size / num_hidden_layers / num_attention_heads / intermediate_size: the Llama-style decoder.
        memory_injection: ``prefix`` (memories are decoder prefix slots) or ``unrolled`` (also: the
            nearest visible memory is projected to ``T x d`` and added to the decoder's token positions).
        injection_scale: initial gain of the LayerNorm on the unrolled memory. 1.0 makes the injected
            memory ~50x larger than the token embeddings (fine for blank copy, whose inputs are blanks);
            objectives that read real tokens (next token, copy, combined) want ~0.02, so the memory does
            not drown the tokens at the start of training.
        own_memory_path: ``shared`` (a chunk's own memory, read by copy objectives, and earlier chunks'
            memories, read by next token, go through the same projection, norm and unrolled injection) or
            ``separate`` (the own memory has its own projection, norm and unrolled injection, so next-token
            training leaves the copy pathway's input weights alone; the decoder layers stay shared).
        memory_noise: training-time Gaussian noise on every memory vector, as a share of that vector's RMS
            (``m + sigma * rms(m) * eps``; 0 = off). Like dropout it acts only in ``train()`` mode: it
            caps the bits one memory can carry, so the decoder must lean on the language and learns a
            neighbourhood of each memory, not a point (a smoother space for models that predict memories).
        memory_noise_sampling: ``fixed`` (every vector gets ``sigma = memory_noise``) or ``uniform`` (each vector
            draws ``sigma ~ U(0, memory_noise)``: the decoder sees clean memories and very noisy ones, so it learns
            to hedge, not guess, when a memory is far from any sentence's).
        copy_inputs: what the decoder reads when rebuilding a chunk as a space: ``blank`` (blank copy:
            all token inputs are ``blank_token_id``) or ``shifted`` (teacher forcing).
        blank_token_id: the id of a blanked input (default: the mask token, else pad).
        rms_norm_eps, initializer_range, tie_word_embeddings: as in Llama.
    """

    model_type = "memlab_memory"

    def __init__(
        self,
        vocab_size: int = 4096,
        chunk_len: int = 32,
        max_chunks: int = 16,
        encoder_type: str = "transformer",
        encoder_hidden_size: int = 64,
        encoder_layers: int = 2,
        encoder_heads: int = 4,
        encoder_intermediate_size: int = 128,
        num_memories: int = 1,
        pooling: str = "mean",
        memory_dim: int = 0,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        intermediate_size: int = 128,
        memory_injection: str = "unrolled",
        injection_scale: float = 1.0,
        own_memory_path: str = "shared",
        memory_noise: float = 0.0,
        memory_noise_sampling: str = "fixed",
        copy_inputs: str = "blank",
        blank_token_id: int | None = None,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.chunk_len = chunk_len
        self.max_chunks = max_chunks
        self.encoder_type = encoder_type
        self.encoder_hidden_size = encoder_hidden_size
        self.encoder_layers = encoder_layers
        self.encoder_heads = encoder_heads
        self.encoder_intermediate_size = encoder_intermediate_size
        self.num_memories = num_memories
        self.pooling = pooling
        self.memory_dim = memory_dim
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.memory_injection = memory_injection
        self.injection_scale = injection_scale
        self.own_memory_path = own_memory_path
        self.memory_noise = memory_noise
        self.memory_noise_sampling = memory_noise_sampling
        self.copy_inputs = copy_inputs
        self.blank_token_id = blank_token_id
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def space_dim(self) -> int:
        """Width of one memory vector."""
        return self.memory_dim or self.encoder_hidden_size

    @property
    def blank_id(self) -> int:
        return self.blank_token_id if self.blank_token_id is not None else (self.pad_token_id or 0)

    def validate_memory(self) -> None:
        """Raise a ModelError for a config that cannot be built."""
        for key, value, allowed in (("encoder_type", self.encoder_type, ENCODER_TYPES), ("pooling", self.pooling, POOLINGS),
                                    ("memory_injection", self.memory_injection, INJECTIONS),
                                    ("copy_inputs", self.copy_inputs, COPY_INPUTS),
                                    ("own_memory_path", self.own_memory_path, OWN_MEMORY_PATHS),
                                    ("memory_noise_sampling", self.memory_noise_sampling, NOISE_SAMPLING)):
            if value not in allowed:
                raise ModelError(f"model.{key}={value!r}; choose one of {', '.join(allowed)}")
        if not self.memory_noise >= 0:
            raise ModelError(f"model.memory_noise must be >= 0, got {self.memory_noise}")
        if self.chunk_len < 1:
            raise ModelError(f"model.chunk_len must be >= 1, got {self.chunk_len}")
        if not 1 <= self.num_memories <= self.chunk_len:
            raise ModelError(f"model.num_memories={self.num_memories} must be between 1 and the chunk length {self.chunk_len}")
        for width, heads, name in ((self.encoder_hidden_size, self.encoder_heads, "encoder"),
                                   (self.hidden_size, self.num_attention_heads, "decoder")):
            if width % heads:
                raise ModelError(f"{name} width {width} is not divisible by its {heads} heads")
