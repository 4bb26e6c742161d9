"""Hidden-state capture from any Hugging Face model, through explicit forward hooks.

A *frozen encoder* turns right-padded token ids ``(B, T)`` into one vector per
sequence ``(B, D)``. :class:`HiddenStateEncoder` does it for transformers
models: decoder-only (GPT-2, Llama, Qwen, Mistral, SmolLM), encoder-only
(BERT, RoBERTa, MiniLM) and the encoder of encoder-decoder models (T5,
M2M100). :class:`SpaceEncoder` does it for any memlab ``EmbeddingSpace``
(memory autoencoders, SONAR, fitted probes).

Layer numbering
---------------
A model with N blocks has N + 1 hidden states: ``layer=0`` is the input of the
first block (the embeddings), ``layer=k`` the output of block ``k - 1``, and
negative indices count from the end (``-1`` is the last block's output). The
hook reads the block's raw output; Hugging Face's ``output_hidden_states``
gives the same tensors at the same index except the last, which it returns
*after* the final norm. ``final_norm=True`` (with the last layer) reads the
final norm's output instead, which matches ``hidden_states[-1]``.

Architectures
-------------
:data:`ARCHITECTURES` maps known ``model_type``s to the attribute path of the
block list and of the final norm (relative to the backbone: the base model, or
the encoder of an encoder-decoder model or of an encoder-only class such as
``T5EncoderModel``). Unknown types fall back to
:func:`find_layers`: the largest ``nn.ModuleList`` whose children all share a
class is the block list, and a ``*Norm*`` module beside it on the same parent is the
final norm. Each encoder's ``describe()`` (report.json's ``encoder.hooks``) names
the table row or the fallback rule it used, with the module paths it hooked.

Pooling
-------
``last`` (last non-padding token), ``second_last``, ``mean`` (over
non-padding tokens, special tokens included) and ``first`` (the first token:
BERT's [CLS]). Pooling reads the attention mask, so padding never changes an
embedding.

Placed models
-------------
A model that accelerate spread over several GPUs, host memory and disk
(:mod:`memlab.probes.encoders.placement`) is read the same way: the hooks sit on the
same blocks, whose accelerate hooks run inside them (offloaded weights are
brought in for the block's forward pass and dropped after it), so a captured
state is the block's output on the device the block ran on. Inputs go to the
model's main device, and every captured state is moved there before pooling.
"""

from __future__ import annotations

import torch
from torch import nn

from memlab.errors import ModelError
from memlab.probes.parts import PARTS
from memlab.probes.encoders.placement import describe as placement_of
from memlab.probes.encoders.placement import main_device
from memlab.probes.encoders.pooling import pool_states

ARCHITECTURES: dict[str, tuple[str, str | None]] = {
    # decoder-only
    "gpt2": ("h", "ln_f"),
    "llama": ("layers", "norm"),
    "mistral": ("layers", "norm"),
    "qwen2": ("layers", "norm"),
    "qwen3": ("layers", "norm"),
    "gemma": ("layers", "norm"),
    "gemma2": ("layers", "norm"),
    "phi3": ("layers", "norm"),
    "smollm3": ("layers", "norm"),
    "gpt_neox": ("layers", "final_layer_norm"),
    # encoder-only (no final norm: each block ends with its own LayerNorm)
    "bert": ("encoder.layer", None),
    "roberta": ("encoder.layer", None),
    "xlm-roberta": ("encoder.layer", None),
    "distilbert": ("transformer.layer", None),
    # encoders of encoder-decoder models
    "t5": ("block", "final_layer_norm"),
    "mt5": ("block", "final_layer_norm"),
    "m2m_100": ("layers", "layer_norm"),
}


class _Stop(Exception):
    """Raised by a hook once the wanted state is captured: the rest of the model is skipped."""


def _get(module: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        module = getattr(module, part)
    return module


def backbone(model: nn.Module) -> nn.Module:
    """The module whose blocks are hooked: the encoder of an encoder-decoder model, else the base model."""
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
        return model.get_encoder()
    return getattr(model, "base_model", model)


def find_layers(module: nn.Module) -> tuple[nn.ModuleList, nn.Module | None]:
    """Fallback rule for unknown architectures: (block list, final norm or None).

    The block list is the ``nn.ModuleList`` with the most parameters whose
    children all have one class; the final norm is a child of the list's parent
    whose class name contains "norm": the last one registered after the list,
    else the last one before it (OPT registers its final norm first).
    """
    best, best_n, parent_of = None, -1, None
    for parent in module.modules():
        for child in parent.children():
            if isinstance(child, nn.ModuleList) and len(child) > 0 and len({type(c) for c in child}) == 1:
                n = sum(p.numel() for p in child.parameters())
                if n > best_n:
                    best, best_n, parent_of = child, n, parent
    if best is None:
        raise ModelError(f"{type(module).__name__}: no list of transformer blocks found to hook")
    before, after, seen = [], [], False
    for child in parent_of.children():
        if child is best:
            seen = True
        elif "norm" in type(child).__name__.lower():
            (after if seen else before).append(child)
    norms = after or before
    return best, (norms[-1] if norms else None)


def _path_of(root: nn.Module, module: nn.Module | None) -> str | None:
    if module is None:
        return None
    return next((name for name, m in root.named_modules() if m is module), None)


def hook_plan(model: nn.Module) -> tuple[nn.ModuleList, nn.Module | None, dict]:
    """(block list, final norm, how they were found) of a model: from :data:`ARCHITECTURES`, else :func:`find_layers`.

    The third item names the rule for the report: ``{"rule": "table", "model_type": ..., "layers": PATH,
    "final_norm": PATH or None}`` for a table row, ``{"rule": "fallback", ...}`` with the paths the rule found
    (relative to the backbone) otherwise, and why the table did not apply.
    """
    bb = backbone(model)
    mt = getattr(getattr(model, "config", None), "model_type", None)
    why = f"model_type '{mt}' is not in the table"
    if mt in ARCHITECTURES:
        layers_path, norm_path = ARCHITECTURES[mt]
        enc = bb.get_encoder() if hasattr(bb, "get_encoder") else bb
        for root in (bb, enc) if enc is not bb else (bb,):  # T5EncoderModel: the table's paths are in its encoder
            try:
                layers, norm = _get(root, layers_path), (_get(root, norm_path) if norm_path else None)
                return layers, norm, {"rule": "table", "model_type": mt, "layers": layers_path, "final_norm": norm_path}
            except AttributeError:  # a variant with other names: use the rule
                why = f"the table row '{mt}' names modules this model does not have"
    layers, norm = find_layers(bb)
    return layers, norm, {"rule": "fallback", "model_type": mt, "layers": _path_of(bb, layers),
                          "final_norm": _path_of(bb, norm), "why": why}


def right_pad(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move every row's real tokens to the left (left-padded batches become right-padded)."""
    if mask.shape[1] == 0 or bool(mask[:, 0].all()) and bool((mask[:, :-1] >= mask[:, 1:]).all()):
        return ids, mask
    order = torch.argsort(-mask.long(), dim=1, stable=True)  # (B, T) real tokens first, in order
    return ids.gather(1, order), mask.gather(1, order)


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after a text when it adds special tokens ([CLS] ... [SEP], <s> ...)."""
    try:
        bare = tokenizer("a b", add_special_tokens=False)["input_ids"]
        full = tokenizer("a b", add_special_tokens=True)["input_ids"]
    except Exception:  # noqa: BLE001  (a tokenizer without special-token templates)
        return [], []
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return full[:i], full[i + len(bare) :]
    return [], []


def wrap_special(ids: torch.Tensor, mask: torch.Tensor, prefix: list[int], suffix: list[int], pad_id: int):
    """Right-padded ``(B, T)`` -> ``(B, p + T + s)`` with the prefix before and the suffix right after each row's text."""
    if not prefix and not suffix:
        return ids, mask
    b, t = ids.shape
    p, s = len(prefix), len(suffix)
    lengths = mask.sum(1).long()  # (B,)
    out = torch.full((b, p + t + s), pad_id, dtype=ids.dtype, device=ids.device)  # (B, T')
    if p:
        out[:, :p] = torch.tensor(prefix, dtype=ids.dtype, device=ids.device)
    out[:, p : p + t] = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
    rows = torch.arange(b, device=ids.device)
    for j, tok in enumerate(suffix):
        out[rows, p + lengths + j] = tok
    new_mask = (torch.arange(p + t + s, device=ids.device)[None] < (lengths + p + s)[:, None]).to(mask.dtype)  # (B, T')
    return out, new_mask


def model_max_positions(config) -> int | None:
    """The longest input a model's position table allows, or None (relative positions, e.g. T5)."""
    for key in ("max_position_embeddings", "n_positions", "max_source_positions"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            if getattr(config, "model_type", "") in ("roberta", "xlm-roberta"):
                v -= getattr(config, "pad_token_id", 1) + 1  # positions start after the padding index
            return v
    return None


class HiddenStateEncoder:
    """A frozen transformers model read at one layer and pooled: ``(B, T)`` ids -> ``(B, D)``.

    ``special_tokens`` wraps each text in the tokenizer's special tokens
    (e.g. [CLS] ... [SEP]) before the model reads it, as the model was trained.
    """

    masks_padding = True
    """A chunk's embedding does not depend on the padding after it (the attention mask hides it): the probe may
    encode chunks of like length together, each batch cut to its longest chunk."""

    def __init__(self, model: nn.Module, tokenizer, layer: int = -1, pool: str = "last", final_norm: bool = False,
                 special_tokens: bool = True, name: str = "model"):
        if pool not in PARTS["pool"]:
            raise ModelError(f"unknown pooling '{pool}'; use one of {', '.join(PARTS['pool'].names())}")
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        self.pool = pool
        self.pool_options = None  # the pooling's own options (a registered pooling's options class), if any
        self.layers, self.norm, self.hooks = hook_plan(model)
        n = len(self.layers)
        if not -(n + 1) <= layer <= n:
            raise ModelError(f"layer {layer} is out of range for {name}: it has {n} blocks, so layers go "
                             f"from 0 (embeddings) to {n} (or -{n + 1} to -1)")
        self.layer = layer % (n + 1)
        self.final_norm = bool(final_norm)
        if self.final_norm and (self.layer != n or self.norm is None):
            raise ModelError(f"final_norm applies only to the last layer ({n}) of a model that has a final norm")
        self.prefix, self.suffix = special_affixes(tokenizer) if special_tokens else ([], [])
        cfg = model.config
        self.dim = int(getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None) or cfg.n_embd)
        limit = model_max_positions(cfg)
        self.max_length = None if limit is None else limit - len(self.prefix) - len(self.suffix)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @property
    def device(self) -> torch.device:
        """Where inputs go: the model's device, or the main device of an accelerate-placed model."""
        return main_device(self.model)

    def describe(self) -> dict:
        out = {"name": self.name, "layer": self.layer, "num_layers": len(self.layers), "pool": self.pool,
               "final_norm": self.final_norm, "dim": self.dim, "special_tokens": [self.prefix, self.suffix],
               "hooks": dict(self.hooks)}
        if self.pool_options is not None:  # a registered pooling's own options
            out["pool_options"] = dict(vars(self.pool_options))
        placed = placement_of(self.model, self.layers)
        if placed is not None:  # accelerate spread the model over devices, host memory or disk
            out["placement"] = placed
        return out

    def token_table(self) -> torch.Tensor | None:
        """The model's input token embeddings ``(V, D)``: what a probe decoder's output layer maps."""
        try:
            return self.model.get_input_embeddings().weight
        except (AttributeError, NotImplementedError):
            return None

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The chosen layer's states ``(B, T, D)`` for ids that already hold any special tokens."""
        captured: list[torch.Tensor] = []

        def keep(out):
            captured.append(out[0] if isinstance(out, tuple) else out)
            raise _Stop

        if self.final_norm:
            handle = self.norm.register_forward_hook(lambda m, a, o: keep(o))
        elif self.layer == 0:
            handle = self.layers[0].register_forward_pre_hook(
                lambda m, a, kw: keep(a[0] if a else kw["hidden_states"]), with_kwargs=True)
        else:
            handle = self.layers[self.layer - 1].register_forward_hook(lambda m, a, o: keep(o))
        bb = backbone(self.model)
        try:
            with torch.no_grad():
                bb(input_ids=input_ids, attention_mask=attention_mask)
        except _Stop:
            pass
        finally:
            handle.remove()
        if not captured:
            raise ModelError(f"{self.name}: the hooked module never ran")
        return captured[0]

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` text ids (no special tokens) -> ``(B, D)`` float32 embeddings."""
        ids, mask = right_pad(input_ids, attention_mask)
        if self.max_length is not None and ids.shape[1] > self.max_length and int(mask.sum(1).max()) > self.max_length:
            raise ModelError(f"sequences of {int(mask.sum(1).max())} tokens are longer than {self.name} allows "
                             f"({self.max_length} with its special tokens)")
        ids, mask = wrap_special(ids, mask, self.prefix, self.suffix, self.pad_id)
        dev = self.device
        h = self.hidden_states(ids.to(dev), mask.to(dev)).to(dev)  # (B, T', D) from where the block ran
        return pool_states(h.float(), mask.to(dev), self.pool, self.pool_options).cpu()  # (B, D)

    def layer_index(self, layers: str | list[int]) -> list[int]:
        """``"all"``, ``"0,3,6"`` or a list -> layer indices 0..n (negatives count from the end); checked."""
        n = len(self.layers)
        if isinstance(layers, str):
            if layers.strip() == "all":
                return list(range(n + 1))
            try:
                layers = [int(x) for x in layers.split(",") if x.strip()]
            except ValueError:
                raise ModelError(f"--layers takes 'all' or a comma list of integers, got {layers!r}") from None
        bad = [x for x in layers if not -(n + 1) <= x <= n]
        if bad or not layers:
            raise ModelError(f"layers {bad or layers} are out of range for {self.name}: it has {n} blocks, so layers "
                             f"go from 0 (embeddings) to {n} (or -{n + 1} to -1)")
        return sorted({x % (n + 1) for x in layers})

    def encode_layers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: list[int]) -> torch.Tensor:
        """``(B, T)`` ids -> ``(B, L, D)`` pooled states of every layer in ``layers`` (0..n), in one forward pass."""
        ids, mask = right_pad(input_ids, attention_mask)
        ids, mask = wrap_special(ids, mask, self.prefix, self.suffix, self.pad_id)
        dev = self.device
        got: dict[int, torch.Tensor] = {}
        last = max(layers)

        def keep(i, out):
            got[i] = out[0] if isinstance(out, tuple) else out
            if i == last:
                raise _Stop

        handles = []
        for i in layers:
            if i == 0:
                handles.append(self.layers[0].register_forward_pre_hook(
                    lambda m, a, kw: keep(0, a[0] if a else kw["hidden_states"]), with_kwargs=True))
            else:
                handles.append(self.layers[i - 1].register_forward_hook(lambda m, a, o, i=i: keep(i, o)))
        try:
            with torch.no_grad():
                backbone(self.model)(input_ids=ids.to(dev), attention_mask=mask.to(dev))
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        m = mask.to(dev)  # every layer's states pooled on one device, wherever its block ran
        pooled = [pool_states(got[i].to(dev).float(), m, self.pool, self.pool_options).cpu()  # L x (B, D)
                  for i in layers]
        return torch.stack(pooled, 1)  # (B, L, D)

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])


class SpaceEncoder:
    """Any memlab ``EmbeddingSpace`` as a frozen encoder; ``(B, K, D)`` memories are flattened to ``(B, K*D)``."""

    def __init__(self, space, name: str = "space"):
        self.space = space
        self.tokenizer = space.tokenizer
        self.name = name
        self.pool = "space"
        self.layer = None
        if hasattr(space, "input_max_length"):  # a space whose encoder and decoder differ in length (a fitted probe)
            self.max_length = space.input_max_length
        else:
            self.max_length = getattr(space, "max_length", None) or getattr(space, "max_tokens", None)
        modules = [space] if isinstance(space, nn.Module) else [v for v in vars(space).values() if isinstance(v, nn.Module)]
        for m in modules:
            m.eval().requires_grad_(False)
        self.device = next((p.device for m in modules for p in m.parameters()), torch.device("cpu"))
        self.dim = int(self.encode_text(["a"]).shape[-1])

    def describe(self) -> dict:
        return {"name": self.name, "pool": "space", "dim": self.dim}

    def token_table(self) -> torch.Tensor | None:
        """The space's input token embeddings ``(V, D)``, where it has them (else None)."""
        return self.space.input_embeddings() if callable(getattr(self.space, "input_embeddings", None)) else None

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.max_length is not None and int(attention_mask.sum(1).max()) > self.max_length:
            raise ModelError(f"sequences of {int(attention_mask.sum(1).max())} tokens are longer than {self.name} "
                             f"allows ({self.max_length})")
        with torch.no_grad():
            z = self.space.encode(input_ids.to(self.device), attention_mask.to(self.device))  # (B, D) or (B, K, D)
        return z.reshape(z.shape[0], -1).float().cpu()  # (B, D')

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])


# the built-in poolings (registered in memlab.probes.catalog): (B, T, D) states, (B, T) mask -> (B, D)


