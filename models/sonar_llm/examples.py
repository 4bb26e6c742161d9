"""Example inputs of SONAR-LLM for the registry-wide tests (``ModelFamily.example_inputs``)."""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=4)
def example_space(dim: int):
    """A seeded random ``toy_ae`` space of width ``dim``: the decoder the SONAR-LLM example loss goes through."""
    from memlab.models.sentence.toy_space import load_toy_space

    return load_toy_space(None, dim=dim, seed=0)


def sonar_llm_example_inputs(config, batch_size: int, sentences: int = 4, tokens: int = 6) -> dict:
    """Random embeddings ``(B, S, E)``, random next-sentence tokens ``(B, S, L)`` and a toy space."""
    space = example_space(config.embed_dim)
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(batch_size, sentences, config.embed_dim, generator=g)  # (B, S, E)
    ids = torch.randint(4, len(space.tokenizer), (batch_size, sentences, tokens), generator=g)  # (B, S, L)
    return dict(embeddings=emb, attention_mask=torch.ones(batch_size, sentences, dtype=torch.long),
                next_input_ids=ids, next_token_mask=torch.ones_like(ids), space=space)
