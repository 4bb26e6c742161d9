"""Probe parts that live outside memlab's tree (tests/test_probe_parts.py): one pooling, one encoder kind, one
read-out and one scorer, each one registration, registered by importing this package."""

from __future__ import annotations

import torch

from memlab.probes.parts import EncoderKind, Part, register_part


def max_pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over the real tokens: (B, T, D), (B, T) -> (B, D)."""
    return h.masked_fill(mask[..., None] == 0, float("-inf")).amax(1)  # (B, D)


class FirstToken:
    """An oracle encoder: the one-hot of a chunk's first token (``onehot:TOKENIZER_DIR``)."""

    pool, layer, max_length = "oracle", None, None

    def __init__(self, tokenizer, name: str):
        self.tokenizer, self.name, self.dim = tokenizer, name, len(tokenizer)

    def describe(self) -> dict:
        return {"name": self.name, "dim": self.dim}

    def encode(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(ids[:, 0], self.dim).float()  # (B, V)


def load_first_token(spec: str, **_) -> FirstToken:
    from memlab.data.tokenizer import load_tokenizer

    return FirstToken(load_tokenizer(spec.partition(":")[2]), spec)


def prior_readout(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu") -> dict:
    """The k tokens in most training chunks for every chunk: a read-out that ignores the embedding."""
    from memlab.probes.chunks import rows

    counts: dict[int, int] = {}
    for r in rows(train_ids):
        for t in set(r):
            counts[t] = counts.get(t, 0) + 1
    order = sorted(counts, key=counts.get, reverse=True)
    per = [len(set(r) & set(order[: len(set(r))])) / len(set(r)) for r in rows(eval_ids)]
    mean = sum(per) / len(per)
    return {"recovered": mean, "prior": mean, "gain": 0.0, "_per_chunk": {"recovered": per, "prior": per}}


def first_token_match(pred: torch.Tensor, true: torch.Tensor, hyps, refs) -> float:
    """Share of chunks whose first token is rebuilt."""
    return float((pred[:, 0] == true[:, 0]).float().mean())


register_part("pool", Part("max", max_pool, description="max over real tokens (a test plugin)"))
register_part("encoder", Part("onehot", EncoderKind(lambda s: s.startswith("onehot:"), load_first_token),
                              description="onehot:TOKENIZER_DIR, the first token's one-hot (a test plugin)"))
register_part("readout", Part("prior", prior_readout, description="the frequency prior alone (a test plugin)"))
register_part("scorer", Part("first_token_match", first_token_match, description="first token rebuilt (a test plugin)"))
