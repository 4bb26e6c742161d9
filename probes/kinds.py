"""What a part of each kind is: the records an encoder kind, a conditioning, a decoder kind and an input mode register
(:mod:`memlab.probes.parts` holds the registry and re-exports them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class EncoderKind:
    """How one kind of ``model`` spec becomes a frozen encoder."""

    matches: Callable[[str], bool] | str
    """Whether a ``model`` spec is of this kind: a function of the spec, or the prefix its specs start with."""
    load: Callable[..., Any]
    """``load(spec, layer=, pool=, final_norm=, random_init=, special_tokens=, device=, dtype=, max_len=)``."""
    source: Callable[[str], tuple] | None = None
    """A transformers model's kind: ``source(spec) -> (folder or hub name, GGUF file or None, default pooling)``;
    accelerate may place it (``device_map``, ``max_memory``, ``offload_dir`` apply to it alone)."""
    known_content: Callable[[str, Any], dict] | str | None = None
    """A calibration encoder of known content (a function, or its ``"module:attr"``): ``known_content(spec, fit) ->
    the report's calibration`` checks its own probe against what it must give (``fit``: a
    :class:`memlab.probes.report.report.Fit`; its report then describes no corpus split)."""

    def takes(self, spec: str) -> bool:
        """Whether ``spec`` is of this kind (:attr:`matches`)."""
        return spec.startswith(self.matches) if isinstance(self.matches, str) else bool(self.matches(spec))


@dataclass(frozen=True)
class Conditioning:
    """``vectors(config)``: conditioning vectors per chunk; ``join(x (B, T, d), cond (B, P, d)) -> (B, P' + T, d)``
    and ``offset(config)``: how many leading positions of the decoder's output are not tokens."""

    vectors: Callable[[Any], int]
    join: Callable[[Any, Any], Any]
    offset: Callable[[Any], int] = field(default=lambda c: 0)


@dataclass(frozen=True)
class DecoderKind:
    """A decoder with its own tokenizer: ``build(config, arg, options) -> nn.Module`` (``options``: the part's options
    dataclass, :func:`part_options`), ``tokenizer(arg)``: the tokenizer its targets are in, ``load(folder)``: a
    saved decoder back (strict). Calling it as ``f(config)`` is refused: it needs its argument."""

    build: Callable[..., Any]
    tokenizer: Callable[[str], Any]
    load: Callable[[Any], Any]
    config_type: str = ""
    """The ``model_type`` its saved ``config.json`` holds (how :func:`memlab.probes.decoder.fitted.load_probe` finds it)."""


@dataclass(frozen=True)
class InputMode:
    """A token-input mode: called as ``f(decoder_input_ids (B, T), config, training) -> (B, T)``;
    ``reads_tokens=False`` says the ids never depend on the true tokens, so every position is decoded at once."""

    ids: Callable[[Any, Any, bool], Any]
    reads_tokens: bool = True

    def __call__(self, ids, config, training: bool):
        return self.ids(ids, config, training)
