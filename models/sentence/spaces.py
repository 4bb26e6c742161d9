"""Spaces for sentence models: spec strings, flattening and device placement.

A spec is ``NAME`` or ``NAME:ARG`` (split at the first colon): ``memory_ae:runs/ae``,
``sonar:cointegrated/SONAR_200_text_encoder``, ``toy_ae:DIR``. ``NAME`` is a
loader registered in :data:`memlab.registry.SPACES`; it is called with ``ARG``
(or ``None``). Sentence models see every embedding flattened to ``E = K * D``
numbers; :class:`SpaceHandle` reshapes to the space's ``(D,)`` or ``(K, D)``
before its decoder reads them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.data.embcache import space_device
from memlab.errors import ModelError
from memlab.space import build_space, parse_space_spec


def normalize_spec(spec: str) -> str:
    """Make path arguments absolute, so that a run can rebuild its space from anywhere: the argument, or each of
    its comma-separated parts (``sonar:enc.pt,dec.pt,tokenizer=DIR``: both paths and the tokenizer's)."""
    name, arg = parse_space_spec(spec)
    if not arg:
        return spec.strip()
    if Path(arg).exists():
        return f"{name}:{Path(arg).resolve()}"

    def absolute(part: str) -> str:
        key, eq, value = part.partition("=")
        if eq and Path(value).exists():
            return f"{key}={Path(value).resolve()}"
        return str(Path(part).resolve()) if not eq and Path(part).exists() else part

    return f"{name}:" + ",".join(absolute(p.strip()) for p in arg.split(","))


def load_space(spec: str):
    space = build_space(spec)
    for m in modules_of(space):
        m.eval()
    return space


def modules_of(space) -> list[torch.nn.Module]:
    if isinstance(space, torch.nn.Module):
        return [space]
    return [v for v in vars(space).values() if isinstance(v, torch.nn.Module)]


class SpaceHandle:
    """A space with its spec, its embedding shape and the flatten/unflatten of embeddings."""

    def __init__(self, space, spec: str, freeze: bool = True):
        self.space, self.spec = space, spec
        with torch.no_grad():
            z = space.encode_text(["End of sequence."])  # (1, D) or (1, K, D)
        self.shape = list(z.shape[1:])
        if self.shape[-1] != space.dim:
            raise ModelError(f"space '{spec}' says dim={space.dim} but encodes vectors of width {self.shape[-1]}")
        self.width = int(torch.tensor(self.shape).prod())
        if freeze:
            for m in modules_of(space):
                m.requires_grad_(False)
                m.eval()

    @property
    def tokenizer(self):
        return self.space.tokenizer

    def device(self) -> torch.device:
        return space_device(self.space)

    def to(self, device) -> "SpaceHandle":
        for m in modules_of(self.space):
            m.to(device)
        return self

    def unflatten(self, z: torch.Tensor) -> torch.Tensor:
        """``(N, E)`` -> ``(N, D)`` or ``(N, K, D)``."""
        return z.reshape(z.shape[0], *self.shape)

    @torch.no_grad()
    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        """Sentences -> ``(N, E)`` flattened float32 embeddings on the CPU (truncated to the space's
        ``max_tokens`` when it declares one)."""
        limit = getattr(self.space, "max_tokens", None)
        if not limit:
            return self.space.encode_text(list(sentences)).float().flatten(1).cpu()
        from memlab.space import tokenize

        ids, mask = tokenize(self.space, list(sentences), max_length=int(limit))
        dev = self.device()
        return self.space.encode(ids.to(dev), mask.to(dev)).float().flatten(1).cpu()

    @torch.no_grad()
    def generate(self, z: torch.Tensor, max_new_tokens: int = 64, **search) -> list[str]:
        """``(N, E)`` flattened embeddings -> decoded sentences."""
        z = self.unflatten(z.to(self.device()))
        dtype = next((p.dtype for m in modules_of(self.space) for p in m.parameters()), z.dtype)
        return self.space.generate(z.to(dtype), max_new_tokens=max_new_tokens, **search)

    def check_width(self, width: int, what: str = "the model") -> None:
        if width != self.width:
            raise ModelError(f"space '{self.spec}' has embeddings of width {self.width} (shape {self.shape}); "
                             f"{what} was built for width {width}")


def load_space_for_model(model) -> SpaceHandle:
    """Rebuild the space a saved sentence model was trained on (with its trained decoder, if any)."""
    cfg = model.config
    handle = SpaceHandle(load_space(cfg.space), cfg.space)
    handle.check_width(cfg.embed_dim, f"the saved model ({cfg.space})")
    if getattr(cfg, "decoder_trained", False):
        state = getattr(model, "_space_state", None)
        if not state:
            raise ModelError("the model was trained with an unfrozen decoder but its 'space.' weights are missing")
        if not isinstance(handle.space, torch.nn.Module):
            raise ModelError(f"space '{cfg.space}' is not an nn.Module: its trained decoder cannot be restored")
        handle.space.load_state_dict(state, strict=True)
    return handle
