"""Probe parts that live outside memlab's tree (tests/probes/test_probe_parts.py): one part of each kind (an encoder kind,
a pooling, a conditioning, an input mode, a decoder, a read-out and a scorer), each with an option of its own, each
one registration, registered by importing this package."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memlab.probes.decoder import ProbeDecoder
from memlab.probes.parts import Conditioning, EncoderKind, InputMode, Part, register_part


@dataclass
class MaxOptions:
    max_scale: float = 1.0
    """Scale of the pooled state."""


@dataclass
class OneHotOptions:
    onehot_value: float = 1.0
    """The value at the first token's id."""


@dataclass
class RepeatOptions:
    repeat_vectors: int = 2
    """Memory vectors read before the tokens."""


@dataclass
class EveryOtherOptions:
    blank_every: int = 2
    """Every this-many-th teacher input is the start token."""


@dataclass
class NarrowOptions:
    narrow_width: int = 16
    """The decoder's width."""


@dataclass
class PriorOptions:
    prior_min_chunks: int = 1
    """A token counts for the prior once it is in this many training chunks."""


@dataclass
class FirstTokenOptions:
    match_position: int = 0
    """The position compared."""


def max_pool(h: torch.Tensor, mask: torch.Tensor, options: MaxOptions = MaxOptions()) -> torch.Tensor:
    """Max over the real tokens, scaled: (B, T, D), (B, T) -> (B, D)."""
    return options.max_scale * h.masked_fill(mask[..., None] == 0, float("-inf")).amax(1)  # (B, D)


class FirstToken:
    """An oracle encoder: the one-hot of a chunk's first token (``onehot:TOKENIZER_DIR``)."""

    pool, layer, max_length = "oracle", None, None

    def __init__(self, tokenizer, name: str, value: float = 1.0):
        self.tokenizer, self.name, self.dim, self.value = tokenizer, name, len(tokenizer), value

    def describe(self) -> dict:
        return {"name": self.name, "dim": self.dim, "value": self.value}

    def encode(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.value * torch.nn.functional.one_hot(ids[:, 0], self.dim).float()  # (B, V)


def load_first_token(spec: str, options: OneHotOptions = OneHotOptions(), **_) -> FirstToken:
    from memlab.data.tokenizer import load_tokenizer

    return FirstToken(load_tokenizer(spec.partition(":")[2]), spec, options.onehot_value)


def _repeat_vectors(config) -> int:
    return int(getattr(config, "repeat_vectors", RepeatOptions.repeat_vectors))  # the option, in the decoder's config


def _repeat_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return torch.cat([cond, x], dim=1)  # (B, P + T, d)


def _every_other(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    k = int(getattr(config, "blank_every", EveryOtherOptions.blank_every))  # the option, in the decoder's config
    keep = (torch.arange(ids.shape[1], device=ids.device) % k) != k - 1  # (T,)
    return torch.where(keep, ids, torch.full_like(ids, config.start_id))  # (B, T)


def narrow_decoder(config, options: NarrowOptions = NarrowOptions()) -> ProbeDecoder:
    """The scratch decoder at the plugin's own width."""
    config.hidden_size, config.intermediate_size = options.narrow_width, 4 * options.narrow_width
    return ProbeDecoder(config)


def prior_readout(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu",
                  options: PriorOptions = PriorOptions()) -> dict:
    """The k tokens in most training chunks for every chunk: a read-out that ignores the embedding."""
    from memlab.probes.chunks import rows

    counts: dict[int, int] = {}
    for r in rows(train_ids):
        for t in set(r):
            counts[t] = counts.get(t, 0) + 1
    order = sorted((t for t in counts if counts[t] >= options.prior_min_chunks), key=counts.get, reverse=True)
    per = [len(set(r) & set(order[: len(set(r))])) / len(set(r)) for r in rows(eval_ids)]
    mean = sum(per) / len(per)
    return {"recovered": mean, "prior": mean, "gain": 0.0, "min_chunks": options.prior_min_chunks,
            "_per_chunk": {"recovered": per, "prior": per}}


def first_token_match(pred: torch.Tensor, true: torch.Tensor, hyps, refs,
                      options: FirstTokenOptions = FirstTokenOptions()) -> float:
    """Share of chunks whose token at ``match_position`` is rebuilt."""
    i = options.match_position
    return float((pred[:, i] == true[:, i]).float().mean())


register_part("pool", Part("max", max_pool, options=MaxOptions,
                           description="max over real tokens (a test plugin)"))
register_part("encoder", Part("onehot", EncoderKind(lambda s: s.startswith("onehot:"), load_first_token),
                              options=OneHotOptions,
                              description="onehot:TOKENIZER_DIR, the first token's one-hot (a test plugin)"))
register_part("conditioning", Part("repeat", Conditioning(_repeat_vectors, _repeat_join, _repeat_vectors),
                                   options=RepeatOptions,
                                   description="repeat_vectors memory vectors (a test plugin)"))
register_part("inputs", Part("every_other", InputMode(_every_other), options=EveryOtherOptions,
                             description="teacher inputs with every blank_every-th one blanked (a test plugin)"))
register_part("decoder", Part("narrow", narrow_decoder, options=NarrowOptions, honours="all",
                              description="the scratch decoder at narrow_width (a test plugin)"))
register_part("readout", Part("prior", prior_readout, options=PriorOptions,
                              description="the frequency prior alone (a test plugin)"))
register_part("scorer", Part("first_token_match", first_token_match, options=FirstTokenOptions,
                             description="first token rebuilt (a test plugin)"))
