"""A causal model read at one layer through only the blocks below it, with the prefix's key-value cache.

Layer numbering is the probe's (:mod:`memlab.probes.encoders.capture`): a model with N blocks has N + 1 states, ``layer=0``
is the input of the first block (the embeddings, after any scaling and position embeddings the model adds),
``layer=k`` the raw output of block ``k - 1`` (for ``k < N`` the same tensor as ``output_hidden_states[k]``;
``k = N`` is the last block's output *before* the final norm). The blocks are found by the probe's hook table
(:func:`memlab.probes.encoders.capture.hook_plan`).

:class:`LayerReader` runs the model's own forward pass with ``inputs_embeds`` and a ``DynamicCache``; a hook on
block ``k - 1`` stops the pass once that block has run, so the blocks above layer ``k`` never run and their cache
entries stay empty. A :class:`Prefix` is the cache of the tokens recovered so far: verifying ``B`` candidate
tokens for the next position runs ``B`` one-token rows through ``k`` blocks against that cache, at the cost of
``B`` tokens (about ``2 * B * P_k`` FLOPs, ``P_k`` the parameters of the first ``k`` blocks), whatever the prefix
length.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from memlab.errors import ModelError
from memlab.probes.encoders.capture import backbone, hook_plan


class _Stop(Exception):
    """Raised by the hook once layer ``k`` is captured: the blocks above it never run."""


@dataclass
class Prefix:
    """The recovered tokens of a chunk so far and their key-value cache (only the blocks up to the layer filled)."""

    ids: list[int]
    cache: object | None


class LayerReader:
    """``model`` (a transformers base model or one with a ``base_model``) read at ``layer``, only through the
    blocks below it. ``vocab_size``: the candidate tokens are ids ``0 .. vocab_size - 1`` (default: the rows of the
    input embedding matrix)."""

    def __init__(self, model: nn.Module, layer: int, vocab_size: int | None = None):
        self.model = model.eval().requires_grad_(False)
        self.blocks, _, self.hooks = hook_plan(model)
        n = len(self.blocks)
        if not -(n + 1) <= layer <= n:
            raise ModelError(f"layer {layer} is out of range: the model has {n} blocks, so layers go from 0 "
                             f"(embeddings) to {n} (or -{n + 1} to -1)")
        self.layer = layer % (n + 1)
        self.num_layers = n
        self.bb = backbone(model)
        params = inspect.signature(self.bb.forward).parameters  # transformers 5 names it `cache`, earlier ones not
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        emb = self.bb.get_input_embeddings() if hasattr(self.bb, "get_input_embeddings") else None
        if emb is None:
            raise ModelError(f"{type(model).__name__} has no input embedding table to search over")
        rows = emb.weight.shape[0]
        self.vocab_size = rows if vocab_size is None else min(int(vocab_size), rows)
        with torch.no_grad():  # the embedding module's own output: a scaled table (Gemma) stays scaled
            self.embedding = emb(torch.arange(self.vocab_size, device=emb.weight.device)).detach()  # (V, D_e)
        self.device = self.embedding.device
        self.dtype = self.embedding.dtype

    # the one forward pass everything goes through
    def _run(self, embeds: torch.Tensor, cache) -> torch.Tensor:
        """States at the layer ``(B, t, D)`` of ``embeds`` ``(B, t, D_e)`` read after ``cache``'s tokens; ``cache`` (a
        DynamicCache, or None: no cache kept) is extended in place for the blocks that ran."""
        got: list[torch.Tensor] = []

        def keep(out):
            got.append(out[0] if isinstance(out, tuple) else out)
            raise _Stop

        if self.layer == 0:
            handle = self.blocks[0].register_forward_pre_hook(
                lambda m, a, kw: keep(a[0] if a else kw["hidden_states"]), with_kwargs=True)
        else:
            handle = self.blocks[self.layer - 1].register_forward_hook(lambda m, a, o: keep(o))
        kw = {self._cache_kw: cache, "use_cache": True} if cache is not None else {"use_cache": False}
        try:
            self.bb(inputs_embeds=embeds, **kw)
        except _Stop:
            pass
        finally:
            handle.remove()
        if not got:
            raise ModelError("the hooked block never ran")
        return got[0]

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, t)`` ids -> ``(B, t, D_e)`` the embedding module's outputs (the model adds positions itself)."""
        return self.embedding[ids.to(self.device)]

    @torch.no_grad()
    def full_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The layer's states ``(B, T, D)`` of whole sequences ``(B, T)``, read without a cache (the reference)."""
        return self._run(self.embed(ids), None).float()

    @torch.no_grad()
    def start(self, ids: list[int]) -> Prefix:
        """The prefix of ``ids`` (e.g. a BOS token the model always reads first; may be empty)."""
        cache = self._new_cache()
        if ids:
            self._run(self.embed(torch.tensor([ids])), cache)
        return Prefix(list(ids), cache)

    @torch.no_grad()
    def extend(self, prefix: Prefix, token: int) -> torch.Tensor:
        """Append ``token`` to ``prefix`` (its cache too); its state ``(D,)`` at the layer."""
        h = self._run(self.embed(torch.tensor([[token]])), prefix.cache)  # (1, 1, D)
        prefix.ids.append(int(token))
        return h[0, 0].float()

    def _batched(self, prefix: Prefix, b: int):
        cache = copy.deepcopy(prefix.cache)
        if b > 1 and prefix.ids:
            cache.batch_repeat_interleave(b)
        return cache

    @torch.no_grad()
    def candidate_states(self, prefix: Prefix, tokens: torch.Tensor) -> torch.Tensor:
        """States ``(B, D)`` at the next position of each candidate token ``(B,)`` after ``prefix`` (its cache is
        left as it was)."""
        embeds = self.embed(tokens.view(-1, 1))  # (B, 1, D_e)
        return self._run(embeds, self._batched(prefix, embeds.shape[0]))[:, 0].float()  # (B, D)

    def distance_grad(self, prefix: Prefix, e: torch.Tensor, target: torch.Tensor) -> tuple[float, torch.Tensor]:
        """At a continuous input ``e`` ``(D_e,)`` for the next position: the squared distance of its state to
        ``target`` ``(D,)`` over ``|target|^2``, and its gradient with respect to ``e`` ``(D_e,)``."""
        x = e.detach().to(self.device, self.dtype).view(1, 1, -1).requires_grad_(True)  # (1, 1, D_e)
        with torch.enable_grad():
            h = self._run(x, self._batched(prefix, 1))[0, 0].float()  # (D,)
            t = target.to(h.device)
            loss = (h - t).pow(2).sum() / t.pow(2).sum().clamp_min(1e-30)
            (g,) = torch.autograd.grad(loss, x)
        return float(loss.detach()), g.view(-1).float()  # (D_e,)


def select_rows(cache, rows: torch.Tensor, layers: int | None = None):
    """A new cache holding the batch rows ``rows`` ``(R,)`` of ``cache`` (a DynamicCache whose rows are the chunks of a
    group, all of one length): the first ``layers`` layers gathered (all when None); the layers above are shallow
    copies that the pass, stopped below them, never reads. ``cache`` itself is left as it was."""
    new = copy.copy(cache)
    new.layers = []
    for i, layer in enumerate(cache.layers):
        c = copy.copy(layer)
        if (layers is None or i < layers) and getattr(layer, "keys", None) is not None and layer.keys.numel():
            idx = rows.to(layer.keys.device)
            c.keys = layer.keys.index_select(0, idx)  # (R, H, S, hd)
            c.values = layer.values.index_select(0, idx)  # (R, H, S, hd)
        new.layers.append(c)
    return new


def row_bytes(cache, layers: int) -> int:
    """Bytes of one batch row's keys and values in the first ``layers`` layers of ``cache`` (what each candidate row
    of a verification pass copies)."""
    total = 0
    for layer in cache.layers[:layers]:
        k = getattr(layer, "keys", None)
        if k is not None and k.numel():
            total += 2 * k[:1].numel() * k.element_size()
    return total
