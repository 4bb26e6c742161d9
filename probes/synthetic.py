"""Synthetic calibration encoders: embeddings whose information content is known by construction.

``memlab probe --model synthetic:NAME[:TOKENIZER_DIR]`` probes one like any model:

* ``concat``: each token id has a fixed random code (``code_dim`` = 32
  Gaussian numbers scaled to unit length, seeded: wide enough that a linear
  read-out tells 4096 codes apart); the chunk's embedding is the concatenation of its tokens'
  codes, position by position (zero-padded to ``max_len`` positions). Fully
  invertible: a working probe rebuilds every token.
* ``bag``: the mean of the tokens' codes (``bag_dim`` numbers each). The set
  of tokens is kept (random codes in a wide space are nearly orthogonal), their
  order is lost: a working probe rebuilds the set, not the positions.
* ``constant``: the same vector for every chunk. Nothing is kept: the probe
  must score as its control (information gain 0).

They read a real tokenizer: by default the BPE tokenizer shipped with
memlab's small causal LM (``memlab/resources/checkpoints/token_lm-toy``, 4096
tokens), or the tokenizer saved in ``TOKENIZER_DIR``; so the whole probe
pipeline (corpus chunks, compact vocabulary, report) runs as for a real model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.data.tokenizer import load_tokenizer
from memlab.errors import ModelError
from memlab.paths import resource
from memlab.probes.parts import EncoderKind

KINDS = ("concat", "bag", "constant")
DEFAULT_TOKENIZER = resource("checkpoints", "token_lm-toy")


class SyntheticEncoder:
    """A calibration encoder (see the module doc): ``(B, T)`` ids -> ``(B, D)`` float32."""

    pool = "synthetic"
    layer = None
    resizable = True
    """Built for any chunk length: the probe rebuilds it (:meth:`resized`) for its longest chunk."""

    def __init__(self, kind: str, tokenizer, max_len: int = 64, code_dim: int = 32, bag_dim: int = 512,
                 seed: int = 0):
        if kind not in KINDS:
            raise ModelError(f"unknown synthetic encoder '{kind}'; use synthetic:{', synthetic:'.join(KINDS)}")
        self.kind = kind
        self.seed = seed
        self.tokenizer = tokenizer
        self.name = f"synthetic:{kind}"
        self.max_length = int(max_len)
        self.code_dim = int(code_dim if kind == "concat" else bag_dim)
        gen = torch.Generator().manual_seed(seed)
        v = len(tokenizer)
        codes = torch.randn(v, self.code_dim, generator=gen)  # (V, c): one fixed random code per token id
        self.codes = codes / codes.norm(dim=1, keepdim=True)  # unit length: every code is as loud as any other
        self.dim = self.max_length * self.code_dim if kind == "concat" else (8 if kind == "constant" else self.code_dim)

    def resized(self, max_len: int) -> "SyntheticEncoder":
        """The same codes for chunks of up to ``max_len`` tokens."""
        return SyntheticEncoder(self.kind, self.tokenizer, max_len=max_len, code_dim=self.code_dim,
                                bag_dim=self.code_dim, seed=self.seed)

    def describe(self) -> dict:
        return {"name": self.name, "pool": self.pool, "dim": self.dim, "layer": None, "code_dim": self.code_dim,
                "max_len": self.max_length}

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, t = input_ids.shape
        if t > self.max_length:
            raise ModelError(f"{self.name} was built for at most {self.max_length} tokens, got {t}")
        if self.kind == "constant":
            return torch.ones(b, self.dim)  # (B, 8): the same for every chunk
        m = attention_mask.float().unsqueeze(-1)  # (B, T, 1)
        codes = self.codes[input_ids.clamp(0, self.codes.shape[0] - 1)] * m  # (B, T, c)
        if self.kind == "bag":
            return codes.sum(1) / m.sum(1).clamp(min=1.0)  # (B, c)
        out = torch.zeros(b, self.max_length, self.code_dim)  # (B, max_len, c)
        out[:, :t] = codes
        return out.flatten(1)  # (B, max_len * c)

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])


def load_synthetic_kind(spec: str, random_init: bool = False, max_len: int | None = None, **_) -> SyntheticEncoder:
    """The ``synthetic:`` encoder kind: :func:`load_synthetic`, for chunks of up to ``max_len`` tokens (default
    64); the other encoder options do not apply to it."""
    if random_init:
        raise ModelError("random_init applies to transformers models, not to synthetic encoders")
    return load_synthetic(spec, max_len=max_len or 64)


def load_synthetic(spec: str, max_len: int = 64) -> SyntheticEncoder:
    """``synthetic:KIND[:TOKENIZER_DIR]`` -> a :class:`SyntheticEncoder`."""

    _, _, rest = spec.partition(":")
    kind, _, folder = rest.partition(":")
    if kind not in KINDS:
        raise ModelError(f"unknown synthetic encoder '{kind}'; use synthetic:{', synthetic:'.join(KINDS)}")
    folder = folder or str(DEFAULT_TOKENIZER)
    if not Path(folder).is_dir():
        raise ModelError(f"{spec}: tokenizer folder '{folder}' does not exist")
    tok = load_tokenizer(folder)
    return SyntheticEncoder(kind, tok, max_len=max_len)


KIND = EncoderKind("synthetic:", load_synthetic_kind,
                   known_content="memlab.probes.report:check_synthetic_spec")
"""The ``synthetic:`` encoder kind (registered in :mod:`memlab.probes.catalog`)."""
