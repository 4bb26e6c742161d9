"""The parallel encoder-decoder memory model.

Every chunk of ``T`` tokens is encoded to ``K`` memory vectors, all chunks of
a batch in one call (``(B, C, T) -> (B*C, T)``, no loop, no recurrence). A
Llama-style causal decoder reads projected memories as prefix slots before
its tokens. Three memory modes (``memory_mode``):

* ``own``: chunk ``c`` reads its own memory (copy and blank copy: the autoencoder);
* ``previous``: chunk ``c`` reads the memories of chunks ``< c`` (the memory LM), all chunks at once
  under one attention mask;
* ``none``: no memory (a plain causal LM of the same decoder; the baseline).

In ``own`` mode the memory slots carry a learned *distance* embedding (0 = own chunk). In ``previous``
mode slot states are computed once per chunk (``(B, C*K, d)``, each slot attending only to itself) and
every token row attends to the shared slot keys/values of earlier chunks plus its own causal tokens;
distance (row chunk - slot chunk, clamped to ``max_chunks``) enters as a learned per-head attention
bias, so the work grows as ``C`` (slots, MLP) plus a small ``C^2 K L`` attention score term.
With ``memory_injection="unrolled"`` the nearest visible memory is also projected to
``T x d`` and added to the token positions, so the decoder need not read position out of a
single prefix vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from memlab.errors import ModelError
from memlab.forward import RUN, run_mode
from memlab.models.memory.configuration_memory import MemoryConfig
from memlab.models.memory.layers import Attention, Block, MixerBlock

MODES = ("own", "previous", "none")


@dataclass
class MemoryModelOutput(ModelOutput):
    """``loss`` (mean token CE over labels != -100, over the kept positions when ``logits_to_keep > 0``),
    ``logits`` ``(B, C, L, V)`` (``(B, n, V)`` with ``logits_to_keep=n > 0``), ``memories`` ``(B, C, K, M)``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    memories: torch.Tensor | None = None


class MemoryEncoder(nn.Module):
    """Bidirectional Transformer or masked Mixer over one chunk, pooled to K memory vectors."""

    def __init__(self, cfg: MemoryConfig):
        super().__init__()
        d, k = cfg.encoder_hidden_size, cfg.num_memories
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.pos = nn.Embedding(cfg.chunk_len, d)
        if cfg.encoder_type == "mixer":
            self.layers = nn.ModuleList(MixerBlock(d, cfg.encoder_heads, cfg.encoder_intermediate_size, cfg.chunk_len,
                                                   cfg.rms_norm_eps) for _ in range(cfg.encoder_layers))
        else:
            self.layers = nn.ModuleList(Block(d, cfg.encoder_heads, cfg.encoder_intermediate_size, cfg.rms_norm_eps)
                                        for _ in range(cfg.encoder_layers))
        self.norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        if cfg.pooling == "query":
            self.queries = nn.Parameter(torch.zeros(k, d))
            self.pool_attn = Attention(d, cfg.encoder_heads)
        elif cfg.pooling == "flatten":  # straight to the memory width: no rank limit at the encoder width
            self.flat = nn.Linear(cfg.chunk_len * d, k * cfg.space_dim, bias=False)
        elif k > 1:
            self.expand = nn.Linear(d, k * d, bias=False)
        wide = cfg.memory_dim and cfg.pooling != "flatten"
        self.bottleneck = nn.Linear(d, cfg.memory_dim, bias=False) if wide else nn.Identity()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(N, T)`` chunks -> ``(N, K, M)`` memories."""
        return self.from_embeddings(self.embed(input_ids), attention_mask)

    def from_embeddings(self, embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(N, T, D)`` token embeddings (rows of ``embed``, or any inputs of that width: differentiable in them)
        -> ``(N, K, M)`` memories, as :meth:`forward` gives them for the tokens whose rows they are."""
        n, t = embeds.shape[:2]
        if t > self.cfg.chunk_len:
            raise ModelError(f"a chunk of {t} tokens does not fit the encoder (chunk_len={self.cfg.chunk_len})")
        # no mask given (chunks): none in attention either; a given mask is used as it is (asking whether it is
        # all ones would read it back from the device at every batch)
        attn_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (N, 1, 1, T) keys
        keep = (torch.ones(n, t, dtype=torch.bool, device=embeds.device) if attention_mask is None
                else attention_mask.bool())  # (N, T)
        x = embeds + self.pos.weight[:t]  # (N, T, D)
        for layer in self.layers:
            x = layer(x, mask=attn_mask, pad=keep)
        x = self.norm(x)  # (N, T, D)
        k = self.cfg.num_memories
        if self.cfg.pooling == "query":
            q = self.queries.expand(n, -1, -1)  # (N, K, D)
            mem = self.pool_attn(q, mask=keep[:, None, None, :], context=x)  # (N, K, D)
        elif self.cfg.pooling == "flatten":
            x = x * keep[..., None].to(x.dtype)  # (N, T, D) padding zeroed
            x = F.pad(x, (0, 0, 0, self.cfg.chunk_len - t))  # (N, T_max, D)
            return self.flat(x.flatten(1)).view(n, k, -1)  # (N, K, M)
        else:
            if self.cfg.pooling == "last":
                last = (keep.long().sum(1) - 1).clamp(min=0)  # (N,)
                pooled = x[torch.arange(n, device=x.device), last]  # (N, D)
            else:
                w = keep[..., None].to(x.dtype)  # (N, T, 1)
                pooled = (x * w).sum(1) / w.sum(1).clamp(min=1.0)  # (N, D)
            mem = self.expand(pooled).view(n, k, -1) if k > 1 else pooled[:, None]  # (N, K, D)
        return self.bottleneck(mem)  # (N, K, M)


def check_logits_to_keep(n, positions: int) -> int:
    """``logits_to_keep`` as an int in ``0..positions`` (``positions`` = ``C * L`` decoder positions per example)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise ModelError(f"logits_to_keep must be a non-negative int (0 = every position), got {n!r}")
    if n < 0 or n > positions:
        raise ModelError(f"logits_to_keep={n} is outside 0..{positions} (0 = every position; at most the "
                         f"{positions} decoder positions of an example, chunks x chunk positions)")
    return n


def apply_head(hidden: torch.Tensor, norm: nn.Module, weight: torch.Tensor | None, logits_to_keep: int) -> torch.Tensor:
    """Final norm + tied head. ``hidden`` ``(B, C, L, d)`` -> logits ``(B, C, L, V)`` when ``logits_to_keep`` is 0,
    else only the last ``n`` positions of the flattened ``(B, C*L)`` sequence -> ``(B, n, V)``: the norm and the
    head (the large per-token cost at small widths) run on those ``n`` positions alone. ``weight=None``: the
    normed features ``(B, C, L, d)`` before the head (for :func:`memlab.losses.linear_cross_entropy`)."""
    if weight is None:
        return norm(hidden)
    if logits_to_keep == 0:
        return F.linear(norm(hidden), weight)  # (B, C, L, V)
    b, c, length, d = hidden.shape
    h = hidden.reshape(b, c * length, d)[:, -logits_to_keep:]  # (B, n, d) last n positions, chunk-major order
    return F.linear(norm(h), weight)  # (B, n, V)


class MemoryDecoder(nn.Module):
    """Llama-style causal Transformer that reads memory slots before its tokens."""

    def __init__(self, cfg: MemoryConfig):
        super().__init__()
        d, m, k = cfg.hidden_size, cfg.space_dim, cfg.num_memories
        self.cfg = cfg
        self.max_len = cfg.chunk_len + 1  # room for an end token after a full sentence
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.pos = nn.Embedding(self.max_len, d)
        self.dist = nn.Embedding(cfg.max_chunks + 1, d)  # own mode: slot embedding of distance 0
        self.dist_bias = nn.Embedding(cfg.max_chunks + 1, cfg.num_attention_heads)  # previous mode: per-head bias
        self.slot = nn.Embedding(k, d)
        self.mem_proj = nn.Linear(m, d, bias=False)
        self.mem_norm = nn.LayerNorm(d)
        if cfg.memory_injection == "unrolled":
            self.unroll = nn.Linear(k * m, self.max_len * d, bias=False)
            self.unroll_norm = nn.LayerNorm(d)
            self.unroll_norm.is_unroll_norm = True  # initial gain: config.injection_scale
        if getattr(cfg, "own_memory_path", "shared") == "separate":  # the own chunk's memory: its own input weights
            self.own_proj = nn.Linear(m, d, bias=False)
            self.own_norm = nn.LayerNorm(d)
            if cfg.memory_injection == "unrolled":
                self.own_unroll = nn.Linear(k * m, self.max_len * d, bias=False)
                self.own_unroll_norm = nn.LayerNorm(d)
                self.own_unroll_norm.is_unroll_norm = True
        self.layers = nn.ModuleList(Block(d, cfg.num_attention_heads, cfg.intermediate_size, cfg.rms_norm_eps)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)

    def _unrolled(self, mem: torch.Tensor, length: int, own: bool = False) -> torch.Tensor:
        n = mem.shape[0]
        proj, norm = (self.own_unroll, self.own_unroll_norm) if own and hasattr(self, "own_unroll") else (self.unroll, self.unroll_norm)
        u = proj(mem.flatten(1)).view(n, self.max_len, -1)[:, :length]  # (N, L, d)
        return norm(u)

    def forward(self, memories: torch.Tensor | None, decoder_input_ids: torch.Tensor, mode: str,
                logits_to_keep: int = 0, head: bool = True) -> torch.Tensor:
        """Memories ``(B, C, K, M)`` (None in mode ``none``) + decoder inputs ``(B, C, L)`` -> logits ``(B, C, L, V)``.

        ``logits_to_keep`` (transformers' meaning): 0 keeps every position; ``n > 0`` keeps only the last ``n``
        positions of each example's flattened decoder sequence (chunk-major, ``C * L`` positions: the last ``n``
        positions of the last chunk, continuing into earlier chunks when ``n > L``), returned as ``(B, n, V)``;
        the norm and head run only on those positions (the layers still run on all of them). ``n`` above
        ``C * L`` or not an int raises a ModelError. ``head=False``: the normed features ``(B, C, L, d)``
        that the tied head (``embed.weight``) turns into logits.
        """
        b, c, length = decoder_input_ids.shape
        if length > self.max_len:
            raise ModelError(f"{length} decoder positions do not fit the decoder (chunk_len + 1 = {self.max_len})")
        if mode not in MODES:
            raise ModelError(f"unknown memory mode {mode!r}; choose one of {', '.join(MODES)}")
        logits_to_keep = check_logits_to_keep(logits_to_keep, c * length)
        if not head and logits_to_keep:
            raise ModelError("head=False returns the features of every position; logits_to_keep must be 0")
        weight = self.embed.weight if head else None
        k, d = self.cfg.num_memories, self.cfg.hidden_size
        tok = self.embed(decoder_input_ids.reshape(b * c, length)) + self.pos.weight[:length]  # (BC, L, d)
        mask, causal = None, True
        if mode == "none":
            x = tok
        else:
            if memories is None:
                raise ModelError(f"memory mode {mode!r} needs memories")
            if c > self.cfg.max_chunks:
                raise ModelError(f"{c} chunks per example exceed model.max_chunks={self.cfg.max_chunks}")
            if mode == "own":
                proj, norm = (self.own_proj, self.own_norm) if hasattr(self, "own_proj") else (self.mem_proj, self.mem_norm)
                mem = norm(proj(memories)) + self.slot.weight  # (B, C, K, d)
                prefix = (mem + self.dist.weight[0]).reshape(b * c, k, d)  # (BC, K, d)
                if self.cfg.memory_injection == "unrolled":
                    tok = tok + self._unrolled(memories.reshape(b * c, k, -1), length, own=True)
            else:
                mem = self.mem_norm(self.mem_proj(memories)) + self.slot.weight  # (B, C, K, d)
                return self._previous(memories, mem, tok.view(b, c, length, d), logits_to_keep, weight)
            x = torch.cat([prefix.to(tok.dtype), tok], 1)  # (BC, K + L, d)
        for layer in self.layers:
            x = layer(x, mask=mask, causal=causal)
        hid = x[:, -length:].reshape(b, c, length, d)  # (B, C, L, d) token positions (memory slots dropped)
        return apply_head(hid, self.norm, weight, logits_to_keep)  # (B, C, L, V) or (B, n, V), tied head

    SLOT_GROUPS = 8  # previous mode: chunk rows in this many groups, each reading only the slots it can see

    def _previous(self, memories: torch.Tensor, mem: torch.Tensor, tok: torch.Tensor,
                  logits_to_keep: int = 0, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``previous`` mode: memories ``(B, C, K, M)``, projected slots ``mem`` ``(B, C, K, d)`` and token
        embeddings ``tok`` ``(B, C, L, d)`` -> logits ``(B, C, L, V)``, or ``(B, n, V)`` for the last
        ``n = logits_to_keep > 0`` positions of the flattened ``C * L`` sequence (checked by ``forward``).
        Slot states are computed once per chunk and shared by every token row; row ``c`` sees the slots of
        chunks ``< c`` and its own causal tokens."""
        b, c, length, d = tok.shape
        k, h = self.cfg.num_memories, self.cfg.num_attention_heads
        idx = torch.arange(c, device=tok.device)
        if self.cfg.memory_injection == "unrolled":
            prev = torch.cat([torch.zeros_like(memories[:, :1]), memories[:, :-1]], 1)  # (B, C, K, M)
            u = self._unrolled(prev.reshape(b * c, k, -1), length).view(b, c, length, d)
            u = u * (idx > 0).to(u.dtype)[None, :, None, None]  # chunk 0 has no previous memory
            tok = tok + u
        slots = mem.reshape(b, c * k, d).to(tok.dtype)  # (B, CK, d) once per chunk, not per row
        slot_chunk = idx.repeat_interleave(k)  # (CK,)
        dist = (idx[:, None] - slot_chunk[None, :]).clamp(0, self.cfg.max_chunks)  # (C, CK) row chunk - slot chunk
        bias = self.dist_bias(dist).permute(0, 2, 1).to(tok.dtype)  # (C, H, CK)
        bias = bias.masked_fill(~(slot_chunk[None, :] < idx[:, None])[:, None, :], float("-inf"))  # earlier only
        causal = torch.ones(length, length, dtype=torch.bool, device=tok.device).tril()  # (L, L)
        tok_part = torch.zeros(length, length, dtype=tok.dtype, device=tok.device).masked_fill(~causal, float("-inf"))
        groups = []  # rows c0:c1 need only the slots of chunks < c1 - 1: skip keys no row of a group sees
        bounds = _group_bounds(c, min(c, self.SLOT_GROUPS))
        for c0, c1 in zip(bounds[:-1], bounds[1:]):
            s = (c1 - 1) * k
            mask = torch.empty(c1 - c0, h, length, s + length, dtype=tok.dtype, device=tok.device)  # (G, H, L, s + L)
            mask[..., :s] = bias[c0:c1, :, None, :s]  # slot keys: distance bias, -inf for chunks >= own chunk
            mask[..., s:] = tok_part  # own tokens: causal
            groups.append((c0, c1, s, mask))
        x = tok  # (B, C, L, d)
        for layer in self.layers:
            x, slots = layer.forward_with_slots(x, slots, groups)
        return apply_head(x, self.norm, weight, logits_to_keep)  # (B, C, L, V), (B, n, V) or features (B, C, L, d)


@lru_cache(maxsize=None)
def _group_bounds(chunks: int, groups: int) -> list[int]:
    """Chunk rows ``0..chunks`` cut into ``groups`` near-equal groups: the bounds, computed once per shape."""
    return torch.linspace(0, chunks, groups + 1).round().long().tolist()


def add_memory_noise(memories: torch.Tensor, sigma: float, sampling: str = "fixed",
                     seeds: torch.Tensor | None = None) -> torch.Tensor:
    """``m + s * rms(m) * eps`` per memory vector (last dim), eps ~ N(0, I), with ``s = sigma`` (``fixed``) or
    ``s ~ U(0, sigma)`` drawn per vector (``uniform``); the scale is not differentiated. ``seeds`` ``(B,)``
    (:mod:`memlab.randomness`): each example's noise from its own seed, so the draw does not depend on the
    batch it is in; memories are then ``(B, ...)``."""
    from memlab import randomness

    rms = memories.detach().float().pow(2).mean(-1, keepdim=True).sqrt()  # (B, C, K, 1)
    scale = sigma * rms
    if sampling == "uniform":
        scale = scale * randomness.uniform(seeds, tuple(rms.shape[1:]) if seeds is not None else rms.shape, 11,
                                           device=rms.device)
    shape = tuple(memories.shape[1:]) if seeds is not None else memories.shape
    eps = randomness.normal(seeds, shape, 12, device=memories.device).to(memories.dtype)  # (B, C, K, M)
    return memories + scale.to(memories.dtype) * eps


class MemoryPreTrainedModel(PreTrainedModel):
    config_class = MemoryConfig
    base_model_prefix = "memory"
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, MixerBlock):
            nn.init.normal_(module.mix, mean=0.0, std=1.0 / module.mix.shape[-1])
        elif isinstance(module, MemoryEncoder) and hasattr(module, "queries"):
            nn.init.normal_(module.queries, mean=0.0, std=std)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            gain = self.config.injection_scale if getattr(module, "is_unroll_norm", False) else 1.0
            nn.init.constant_(module.weight, gain)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


class MemoryModel(MemoryPreTrainedModel):
    """Encoder -> K memories per chunk -> decoder (autoencoder, memory LM, or both)."""

    forward_modes = (RUN,)

    def __init__(self, config: MemoryConfig):
        super().__init__(config)
        config.validate_memory()
        self.encoder = MemoryEncoder(config)
        self.decoder = MemoryDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.decoder.embed

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(N, T)`` chunks -> ``(N, K, M)`` memories."""
        return self.encoder(input_ids, attention_mask)

    def encode_embeddings(self, embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(N, T, D)`` token embeddings (rows of the encoder's table, :meth:`encoder_embeddings`) -> ``(N, K, M)``
        memories, differentiable in ``embeds``: :meth:`encode` from the inputs of its first block."""
        return self.encoder.from_embeddings(embeds, attention_mask)

    def encoder_embeddings(self) -> nn.Embedding:
        """The encoder's token embedding table (the decoder has its own: :meth:`get_input_embeddings`)."""
        return self.encoder.embed

    def encode_chunks(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, C, T)`` -> ``(B, C, K, M)``: every chunk of the batch in one encoder call."""
        b, c, t = input_ids.shape
        flat_mask = attention_mask.reshape(b * c, t) if attention_mask is not None else None
        mem = self.encoder(input_ids.reshape(b * c, t), flat_mask)  # (BC, K, M)
        return mem.view(b, c, *mem.shape[1:])

    def decode(self, memories: torch.Tensor | None, decoder_input_ids: torch.Tensor, memory_mode: str = "own",
               logits_to_keep: int = 0, seeds: torch.Tensor | None = None) -> torch.Tensor:
        """Memories ``(B, C, K, M)`` + decoder inputs ``(B, C, L)`` -> logits ``(B, C, L, V)``; with
        ``logits_to_keep=n > 0`` only the last ``n`` positions of the flattened ``C * L`` sequence, ``(B, n, V)``
        (see ``MemoryDecoder.forward``). In ``train()`` mode with ``config.memory_noise > 0`` the decoder reads
        the memories with Gaussian noise added (``add_memory_noise``; ``seeds`` ``(B,)``: drawn per example)."""
        return self.decoder(self._train_noise(memories, seeds), decoder_input_ids, memory_mode, logits_to_keep)

    def _train_noise(self, memories: torch.Tensor | None, seeds: torch.Tensor | None = None) -> torch.Tensor | None:
        if memories is not None and self.training and self.config.memory_noise > 0:
            memories = add_memory_noise(memories, self.config.memory_noise, self.config.memory_noise_sampling, seeds)
        return memories

    def decode_features(self, memories: torch.Tensor | None, decoder_input_ids: torch.Tensor,
                        memory_mode: str = "own", seeds: torch.Tensor | None = None) -> torch.Tensor:
        """As :meth:`decode`, but the normed features ``(B, C, L, d)`` that :meth:`output_head` maps to the logits
        (so a loss can run the head block by block: :func:`memlab.losses.linear_cross_entropy`)."""
        return self.decoder(self._train_noise(memories, seeds), decoder_input_ids, memory_mode, head=False)

    def output_head(self) -> tuple[torch.Tensor, None]:
        """``(weight (V, d), bias)`` of the output head (tied to the decoder's input embeddings; no bias)."""
        return self.decoder.embed.weight, None

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                memory_mode: str = "own", memories: torch.Tensor | None = None, logits_to_keep: int = 0,
                mode: str | None = None, fn=None, args: tuple = (), kwargs: dict | None = None,
                **_) -> MemoryModelOutput:
        """Chunks ``(B, T)`` or ``(B, C, T)``; without decoder inputs the decoder blank-copies them.

        ``mode="run"`` (:mod:`memlab.forward`): returns ``fn(self, *args, **kwargs)`` and does nothing else; the
        objectives run their encoder and decoder passes so, inside one forward of a DDP/FSDP wrapper.

        ``logits_to_keep`` has transformers' meaning: 0 (default) returns the logits of every position,
        ``(B, C, L, V)`` (``(B, L, V)`` for 2-D inputs); ``n > 0`` returns only the logits of the last ``n``
        positions of each example's decoder sequence flattened chunk-major (``C * L`` positions: the last ``n``
        positions of the last chunk, reaching back into earlier chunks when ``n > L``), as ``(B, n, V)`` for
        2-D and 3-D inputs alike, and applies the output head only there (prefill: ``logits_to_keep=1``).
        ``n`` must be an int in ``0..C*L`` (else ModelError). With ``n > 0`` the loss, when there are labels
        (given, or the blank-copy targets), is the mean CE over those same last ``n`` positions only
        (labels ``(B, C, L)`` flattened the same way), so it matches the returned logits.
        """
        if mode == RUN:
            return run_mode(self, fn, args, kwargs)
        if mode is not None:
            raise ModelError(f"unknown forward mode {mode!r}; MemoryModel accepts {', '.join(self.forward_modes)}")
        squeeze = input_ids is not None and input_ids.dim() == 2
        if squeeze:
            input_ids = input_ids[:, None]
            attention_mask = attention_mask[:, None] if attention_mask is not None else None
        if memories is None and memory_mode != "none":
            memories = self.encode_chunks(input_ids, attention_mask)  # (B, C, K, M)
        if decoder_input_ids is None:
            decoder_input_ids = torch.full_like(input_ids, self.config.blank_id)
            if labels is None:
                labels = input_ids if attention_mask is None else input_ids.masked_fill(attention_mask == 0, -100)
        elif decoder_input_ids.dim() == 2:
            decoder_input_ids = decoder_input_ids[:, None]
        logits = self.decode(memories, decoder_input_ids, memory_mode, logits_to_keep)  # (B, C, L, V) or (B, n, V)
        loss = None
        if labels is not None:
            b, c, length = decoder_input_ids.shape
            labels = labels.reshape(b, c, length)  # (B, C, L)
            if logits_to_keep:
                labels = labels.reshape(b, c * length)[:, -logits_to_keep:]  # (B, n) the kept positions
            loss = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), ignore_index=-100)
        if squeeze and not logits_to_keep:
            logits = logits[:, 0]  # (B, L, V)
        return MemoryModelOutput(loss=loss, logits=logits, memories=memories)
