"""The one interface: an embedding space.

A space maps token sequences to vectors and vectors back to tokens. A memory
autoencoder is a space; SONAR is a pretrained space; a fitted inversion probe
is a space; SONAR-LLM and the LCM baselines are sequence models over the
vectors of any space.

Teacher forcing convention
--------------------------
``decoder_inputs(input_ids, attention_mask)`` turns tokenized text (in the
space's tokenizer, without special tokens) into ``(decoder_input_ids,
labels)``: the decoder's inputs start with the space's start token(s), and
``labels[:, t]`` is the token the decoder must predict after reading
``decoder_input_ids[:, : t + 1]``; padding and positions that must not be
scored hold ``-100``. So for any space::

    logits = space.decode_logits(z, decoder_input_ids)          # (B, T, V)
    loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100)

:func:`reconstruction_loss` is that computation.

White-box encoders
------------------
A space whose encoder can be searched with its own weights (``memlab invert --model space:NAME:ARG``) also
offers ``input_embeddings() -> (V, D_e)``, the row its encoder reads each token id as, and
``encode_embeddings(embeds (B, T, D_e), attention_mask) -> (B, D) or (B, K, D)``, which is ``encode`` for the
tokens whose rows ``embeds`` holds and is differentiable in ``embeds``. A memory autoencoder offers both;
:func:`memlab.testing.check_embedding_space` checks them where a space has them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class EmbeddingSpace(Protocol):
    dim: int
    """Width D of an embedding."""
    tokenizer: object
    """The space's tokenizer (a ``PreTrainedTokenizerBase``)."""

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, D)`` (or ``(B, K, D)`` for K memory vectors)."""
        ...

    def decoder_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenized targets ``(B, T)`` -> ``(decoder_input_ids, labels)``, both ``(B, T')``."""
        ...

    def decode_logits(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits ``(B, T', V)`` of the decoder reading ``z`` and ``decoder_input_ids``."""
        ...

    def generate(self, z: torch.Tensor, max_new_tokens: int = 64, **search) -> list[str]:
        """Decode embeddings to text; ``search`` may hold ``num_beams``, ``do_sample``, ``temperature``, ``top_p``."""
        ...

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        """Tokenize and encode sentences: ``(B, D)`` or ``(B, K, D)``."""
        ...


def decoder_token_stats(space: EmbeddingSpace, z: torch.Tensor, decoder_input_ids: torch.Tensor,
                        labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed token cross-entropy (float32, differentiable), correct-argmax count and target count of the
    space's decoder reading ``z`` and ``decoder_input_ids`` against ``labels`` (``-100``: not scored).

    A space may also offer ``decode_features(z, decoder_input_ids) -> (B, T', d)`` and ``output_head() ->
    (weight (V, d), bias or None)`` with ``decode_logits = features @ weight.T + bias``; the head then runs
    block by block (:func:`memlab.losses.linear_cross_entropy`), with the same values and no ``(B, T', V)``
    logits tensor."""
    from memlab.losses import linear_cross_entropy, logits_cross_entropy

    if hasattr(space, "decode_features") and hasattr(space, "output_head"):
        weight, bias = space.output_head()
        feats = space.decode_features(z, decoder_input_ids)  # (B, T', d)
        return linear_cross_entropy(feats, weight, labels.to(feats.device), bias=bias)
    return logits_cross_entropy(space.decode_logits(z, decoder_input_ids), labels)  # (B, T', V) logits


def reconstruction_loss(space: EmbeddingSpace, z: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        reduction: str = "mean") -> torch.Tensor:
    """Token cross-entropy of the space's decoder rebuilding ``input_ids`` from ``z`` (``mean`` or ``sum`` over
    the scored tokens, or ``none``: per position, 0 where not scored)."""
    dec_in, labels = space.decoder_inputs(input_ids, attention_mask)
    if reduction in ("mean", "sum"):
        total, _, count = decoder_token_stats(space, z, dec_in, labels)
        return total if reduction == "sum" else total / count
    logits = space.decode_logits(z, dec_in)  # (B, T', V)
    flat = logits.float().reshape(-1, logits.shape[-1])  # (B * T', V): rows, no transposed copy
    loss = torch.nn.functional.cross_entropy(flat, labels.reshape(-1), ignore_index=-100, reduction=reduction)
    return loss.view(labels.shape) if reduction == "none" else loss


def tokenize(space: EmbeddingSpace, sentences: list[str], max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sentences -> ``(input_ids, attention_mask)`` in the space's tokenizer, right-padded, no special tokens."""
    tok = space.tokenizer
    enc = tok(list(sentences), add_special_tokens=False, padding=True, truncation=max_length is not None,
              max_length=max_length, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def parse_space_spec(spec: str) -> tuple[str, str | None]:
    """``NAME`` or ``NAME:ARG`` (split at the first colon) -> ``(NAME, ARG or None)``: ``memory_ae:runs/ae``,
    ``sonar:cointegrated/SONAR_200_text_encoder``, ``toy_ae``. ``NAME`` is a loader in ``SPACES``."""
    from memlab.errors import ModelError

    if not spec or not spec.strip():
        raise ModelError("no space given: a space is NAME[:ARG] (e.g. memory_ae:RUN_DIR, sonar:NAME, toy_ae)")
    name, _, arg = spec.strip().partition(":")
    return name, (arg or None)


def build_space(spec: str) -> EmbeddingSpace:
    """The space a spec names: ``SPACES.get(NAME)(ARG)`` (see :func:`parse_space_spec`)."""
    from memlab.registry import SPACES

    from memlab.devices import place

    name, arg = parse_space_spec(spec)
    return place(SPACES.get(name)(arg))  # on the device of an enclosing memlab.devices.running_on (--device)
