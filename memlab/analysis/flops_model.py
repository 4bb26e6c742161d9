"""An analytic model of inference FLOPs against sequence length.

Three ways to produce (generate) a text of ``T`` tokens are compared:

- **token LM**: a causal Transformer generating ``T`` tokens with a KV cache;
- **SONAR-LLM**: a causal Transformer over sentence embeddings generating
  ``T / s`` sentences of ``s`` tokens; each sentence is decoded token by token by a
  sentence decoder (cross-attending to the one predicted vector) and re-encoded by a
  sentence encoder to extend the context;
- **memory model**: an encoder turns every finished chunk of ``c`` tokens into
  ``k`` memory vectors; the decoder generates each token reading its own chunk's
  tokens plus the memories of all earlier chunks.

Assumptions (the conventions of :mod:`memlab.flops`, made explicit):

1. A multiply-add is 2 FLOPs. A token passing through a Transformer costs
   ``2 * P`` FLOPs for its ``P`` matrix parameters (projections, MLP, output
   head; input embeddings are lookups and cost nothing).
2. Attention costs ``4 * L * A * n`` FLOPs per query token reading ``n`` keys
   (``Q K^T`` and ``softmax @ V``, ``A`` = heads x head_dim), with a KV cache:
   token ``t`` of a causal stream reads ``t`` keys, so a stream of ``n`` tokens
   costs ``2 * L * A * n * (n + 1)`` for attention. A bidirectional encoder over
   ``n`` tokens reads ``n`` keys for every token: ``4 * L * A * n^2``.
3. Norms, activations, softmax, RoPE and sampling are left out (lower order).
4. SONAR-LLM: every sentence has exactly ``s`` tokens (the paper's average,
   60); the sentence model has a linear input and output projection between
   the embedding width and its own width instead of a vocabulary head; every
   generated sentence is encoded once (the prompt counts as generated text);
   the decoder's cross-attention reads one vector (its K/V projection is paid
   once per sentence).
5. Memory model: generation is chunk by chunk; the encoder runs once per
   finished chunk (bidirectional within the chunk); decoder token ``t`` reads
   its chunk's tokens causally plus ``k`` memories for each earlier chunk.

Costs are reported per generated token (total / ``T``), the quantity whose
crossover the SONAR-LLM paper plots.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from memlab.errors import MemlabError


@dataclass(frozen=True)
class TransformerShape:
    """The matrix shapes of one Transformer stack."""

    layers: int
    """Number of blocks L."""
    d_model: int
    """Residual width d."""
    d_ff: int
    """MLP hidden width."""
    heads: int
    """Query heads."""
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None = ``heads``."""
    head_dim: int | None = None
    """Width of a head; None = ``d_model // heads``."""
    gated_mlp: bool = True
    """SwiGLU (3 matrices) rather than a plain 2-matrix MLP."""
    cross_attention: bool = False
    """Each block also cross-attends to a memory (Q and O projections per token)."""
    vocab_head: int = 0
    """Output vocabulary (a ``d x V`` head); 0 = no vocabulary head."""
    in_proj: int = 0
    """Width of a linear input projection (continuous inputs, e.g. 1024-d sentence vectors); 0 = none."""
    out_proj: int = 0
    """Width of a linear output projection (continuous outputs); 0 = none."""

    def __post_init__(self) -> None:
        if min(self.layers, self.d_model, self.d_ff, self.heads) <= 0:
            raise MemlabError(f"a Transformer shape needs positive sizes, got {self}")

    @property
    def attn_width(self) -> int:
        """A = heads x head_dim (the width of queries, keys and values)."""
        return self.heads * (self.head_dim or self.d_model // self.heads)

    @property
    def kv_width(self) -> int:
        return (self.kv_heads or self.heads) * (self.head_dim or self.d_model // self.heads)

    def block_params(self) -> int:
        """Matrix parameters of one block that every token multiplies through."""
        d, a = self.d_model, self.attn_width
        attn = 2 * d * a + 2 * d * self.kv_width  # Q, O and K, V
        mlp = (3 if self.gated_mlp else 2) * d * self.d_ff
        cross = 2 * d * a if self.cross_attention else 0  # cross-attention Q and O (K/V of the memory: per memory)
        return attn + mlp + cross

    def matrix_params(self) -> int:
        """P: all matrix parameters a token passes through (blocks + head + projections)."""
        return (self.layers * self.block_params() + self.d_model * self.vocab_head
                + self.in_proj * self.d_model + self.out_proj * self.d_model)

    def per_token(self, keys: float | np.ndarray) -> float | np.ndarray:
        """Forward FLOPs of one token that reads ``keys`` earlier keys."""
        return 2.0 * self.matrix_params() + 4.0 * self.layers * self.attn_width * keys

    def causal_stream(self, n: float | np.ndarray) -> float | np.ndarray:
        """FLOPs of ``n`` tokens through a causal stack with a KV cache (token t reads t keys)."""
        return 2.0 * self.matrix_params() * n + 2.0 * self.layers * self.attn_width * n * (n + 1)

    def bidirectional(self, n: float | np.ndarray) -> float | np.ndarray:
        """FLOPs of encoding ``n`` tokens with full (bidirectional) attention."""
        return 2.0 * self.matrix_params() * n + 4.0 * self.layers * self.attn_width * n * n


def token_lm_flops(T: float | np.ndarray, lm: TransformerShape) -> float | np.ndarray:
    """Total FLOPs for a token LM to generate ``T`` tokens."""
    return lm.causal_stream(np.asarray(T, dtype=float))


def sonar_llm_flops(T: float | np.ndarray, model: TransformerShape, encoder: TransformerShape,
                    decoder: TransformerShape, sentence_len: float = 60.0) -> float | np.ndarray:
    """Total FLOPs for SONAR-LLM to generate ``T`` tokens as ``T / sentence_len`` sentences."""
    T = np.asarray(T, dtype=float)
    s = float(sentence_len)
    n_sent = T / s
    sentence_model = model.causal_stream(n_sent)
    encode = n_sent * encoder.bidirectional(s)
    mem_kv = 2.0 * decoder.layers * decoder.d_model * decoder.kv_width  # K and V of the one vector, per layer
    cross = 4.0 * decoder.layers * decoder.attn_width * 1.0  # each token reads one memory key
    decode = n_sent * (decoder.causal_stream(s) + s * cross + mem_kv)
    return sentence_model + encode + decode


def memory_model_flops(T: float | np.ndarray, encoder: TransformerShape, decoder: TransformerShape,
                       chunk_len: int, num_memories: int) -> float | np.ndarray:
    """Total FLOPs for an encoder-decoder memory model to generate ``T`` tokens chunk by chunk."""
    T = np.asarray(T, dtype=float)
    c, k = float(chunk_len), float(num_memories)
    chunks = T / c
    encode = chunks * encoder.bidirectional(c)
    own = chunks * decoder.causal_stream(c)  # tokens reading their own chunk
    # token t of chunk j reads k * j memories: sum over chunks j < T/c of c * k * j
    mem_keys = c * k * chunks * (chunks - 1) / 2.0
    memory_read = 4.0 * decoder.layers * decoder.attn_width * mem_keys
    return encode + own + memory_read


# ---------------------------------------------------------------------- the paper's settings
def paper_settings(sentence_len: float = 60.0) -> dict:
    """The SONAR-LLM paper's comparison, as this model reads it.

    - token LM and SONAR-LLM backbone: the Llama-3.2-1B shape that the paper's
      1.3B configurations start from (16 layers, d 2048, SwiGLU 8192, 32 query /
      8 KV heads of 64), the LM with its 128,256-token head, SONAR-LLM with
      1024 -> 2048 -> 1024 projections instead;
    - SONAR text encoder and decoder (NLLB-1B based): 24 layers each, d 1024,
      ReLU MLP 8192, 16 heads; the decoder cross-attends and has a 256,206-token head;
    - ``sentence_len`` = 60 tokens per sentence.
    """
    lm = TransformerShape(layers=16, d_model=2048, d_ff=8192, heads=32, kv_heads=8, head_dim=64, vocab_head=128256)
    model = replace(lm, vocab_head=0, in_proj=1024, out_proj=1024)
    enc = TransformerShape(layers=24, d_model=1024, d_ff=8192, heads=16, gated_mlp=False)
    dec = replace(enc, cross_attention=True, vocab_head=256206)
    return {"lm": lm, "model": model, "encoder": enc, "decoder": dec, "sentence_len": sentence_len}


def crossover(cost_a, cost_b, lo: float = 16.0, hi: float = 2.0**24) -> float | None:
    """Smallest ``T`` in ``[lo, hi]`` where ``cost_a(T) - cost_b(T)`` changes sign (log bisection), or None."""
    grid = np.geomspace(lo, hi, 2000)
    diff = cost_a(grid) - cost_b(grid)
    sign = np.sign(diff)
    idx = np.nonzero(sign[1:] != sign[:-1])[0]
    if len(idx) == 0:
        return None
    a, b = grid[idx[0]], grid[idx[0] + 1]
    for _ in range(60):
        m = np.sqrt(a * b)
        if np.sign(cost_a(m) - cost_b(m)) == sign[idx[0]]:
            a = m
        else:
            b = m
    return float(np.sqrt(a * b))


def sonar_vs_token_lm(lengths=None, sentence_len: float = 60.0) -> dict:
    """Per-token inference FLOPs of the paper's two models against ``T``, and their crossover."""
    p = paper_settings(sentence_len)
    T = np.asarray(lengths if lengths is not None else 2.0 ** np.arange(7, 21), dtype=float)

    def lm(t):
        return token_lm_flops(t, p["lm"]) / t

    def sonar(t):
        return sonar_llm_flops(t, p["model"], p["encoder"], p["decoder"], sentence_len) / t

    return {"tokens": T.tolist(), "token_lm": lm(T).tolist(), "sonar_llm": sonar(T).tolist(),
            "crossover_tokens": crossover(lm, sonar), "sentence_len": sentence_len,
            "params": {k: v.matrix_params() for k, v in p.items() if isinstance(v, TransformerShape)}}


def plot_flops(curves: dict[str, tuple[list, list]], path, crossover_at: float | None = None,
               title: str = "Inference FLOPs per generated token") -> None:
    """Log-log plot of FLOPs per token against sequence length for each named curve."""
    from memlab.plots import finish_axes, pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (x, y) in curves.items():
        ax.loglog(x, y, marker="o", ms=3, label=name)
    if crossover_at:
        ax.axvline(crossover_at, color="grey", ls="--", lw=1, label=f"crossover ~{crossover_at:,.0f} tokens")
    ax.set_title(title)
    finish_axes(ax, "sequence length T (tokens)", "FLOPs per token", log=True, legend_fontsize=8)
    save_figure(fig, path, dpi=120)
