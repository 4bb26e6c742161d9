"""The probe's trainable decoder: a small Llama-style causal LM conditioned on one embedding.

Conditioning and token inputs are registered parts (:mod:`memlab.probes.parts`); the built-in ones:

Conditioning (``conditioning``):

* ``prefix``: the embedding is projected to ``prefix_len`` vectors of width d
  that the decoder reads as a memory prefix before its tokens;
* ``unrolled``: as in the memory-models paper, the embedding is projected to
  ``max_len * d`` and the t-th slice is added to the t-th token's input.

Token inputs (``inputs``):

* ``teacher``: the true previous tokens (teacher forcing); the decoder's own
  language knowledge then helps, which the control run measures;
* ``blank``: every input is the start token (blank copy), so all the decoder
  knows of a chunk comes through the embedding.

Input dropout (``input_dropout``, teacher inputs only): while training, that
share of the true previous tokens is replaced by the start token, so the
decoder cannot lean on its own language model alone and must read the
embedding (word dropout); evaluation and generation see every true token.

Bag head (``bag_head``): a linear map of the embedding to the output classes,
the same for every position, added to each position's logits: a
bag-of-words read-out inside the decoder that every position trains.

Embeddings are standardised per dimension with statistics of the training
cache (buffers ``z_mean``, ``z_std``; each std floored at a tenth of the
median), so models with huge activations train as easily as small ones.

Compact vocabulary: the output layer covers only the ``K`` token ids seen in
the training data plus one *other* class whose probability is spread evenly
over the ``V - K`` unseen ids. :meth:`ProbeDecoder.full_log_probs` gives the
exact distribution over the whole vocabulary; it is a proper distribution, so
cross-entropy and H_r stay defined on the full vocabulary V.

Attention (``one_dtype_sdpa``): transformers' SDPA attention with query, key
and value cast to one dtype first. Under autocast the rotary embedding leaves
query and key in float32 and value in the autocast dtype; outside
``torch.func.vmap`` autocast casts all three for SDPA, but vmap's batching
rule for SDPA bypasses autocast, so a batched group
(:mod:`memlab.probes.decoder.fitloop`) would hand SDPA mixed dtypes. The explicit cast
is what autocast does, so both paths compute alike. For the same reason the
conditioning's bias and layer norm run in float32 (the token embeddings'
dtype) under autocast too, and the norm by elementwise ops (:func:`layer_norm`):
vmapped, a bf16 bias gradient is summed in another order, CPU layer_norm
promotes a bf16 input to float32 where one member alone keeps bf16, and
layer_norm's batching rule rounds otherwise than its kernel. So a batched
group trains as its members one by one, to float32 rounding, in bf16 too.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers import AttentionInterface, DynamicCache, LlamaConfig, LlamaModel, PretrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from memlab.probes.decoder.table import TableHead
from memlab.probes.parts import get_part
from memlab.probes.sections import DecoderSection, LlamaOptions, PrefixOptions, TeacherOptions

ATTENTION = "memlab_one_dtype_sdpa"
"""The probe decoder body's attention implementation (registered with transformers below)."""


def one_dtype_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, with query, key and value (B, H, T, d) in the autocast dtype when autocast is
    on (as autocast casts SDPA's arguments outside ``torch.func.vmap``), else in value's dtype."""
    dev = query.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else value.dtype
    return sdpa_attention_forward(module, query.to(dtype), key.to(dtype), value.to(dtype), attention_mask, **kwargs)


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """``norm(x)`` (x (..., d)) by means and elementwise ops: the same arithmetic under ``torch.func.vmap`` as
    without it."""
    mu = x.mean(-1, keepdim=True)  # (..., 1)
    var = (x - mu).pow(2).mean(-1, keepdim=True)  # (..., 1)
    return (x - mu) * torch.rsqrt(var + norm.eps) * norm.weight + norm.bias  # (..., d)


AttentionInterface.register(ATTENTION, one_dtype_sdpa)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the masks SDPA gets


class ProbeDecoderConfig(PretrainedConfig):
    model_type = "memlab_probe_decoder"

    # the defaults are the probe options' (memlab.probes.sections), where they live once
    def __init__(self, embed_dim: int = 64, vocab_size: int = 512, kept_ids: list[int] | None = None,
                 start_id: int = 0, hidden_size: int = LlamaOptions.hidden_size,
                 num_layers: int = LlamaOptions.num_layers, num_heads: int = LlamaOptions.num_heads,
                 intermediate_size: int | None = None, max_len: int = 64,
                 conditioning: str = DecoderSection.conditioning, prefix_len: int = PrefixOptions.prefix_len,
                 inputs: str = DecoderSection.inputs, cond_dropout: float = DecoderSection.cond_dropout,
                 bag_head: bool = DecoderSection.bag_head, input_dropout: float = TeacherOptions.input_dropout,
                 repeat_penalty: float = TeacherOptions.repeat_penalty, token_table_dim: int = 0, **kwargs):
        self.embed_dim = embed_dim
        self.vocab_size = vocab_size  # V: the tokenizer's full vocabulary
        self.kept_ids = list(kept_ids) if kept_ids is not None else list(range(vocab_size))  # K seen ids, sorted
        self.start_id = start_id
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.max_len = max_len
        self.conditioning = conditioning
        self.prefix_len = prefix_len
        self.inputs = inputs
        self.cond_dropout = cond_dropout  # dropout on the standardised embedding while training (regularises the map)
        self.input_dropout = input_dropout  # share of teacher inputs replaced by the start token while training
        self.repeat_penalty = repeat_penalty  # nats off a token already in the greedy reconstruction (teacher inputs)
        self.bag_head = bag_head  # add a position-shared linear read-out of the embedding to every position's logits
        if token_table_dim:  # the output layer maps the encoder's token table of this width (absent: a scratch layer)
            self.token_table_dim = token_table_dim
        super().__init__(**kwargs)


@runtime_checkable
class ProbeDecoderAPI(Protocol):
    """What training (:mod:`memlab.probes.decoder.fit`), scoring (:mod:`memlab.probes.readings`) and the fitted probe
    (:mod:`memlab.probes.decoder.model`) use of a probe decoder: an ``nn.Module`` with

    * ``forward(z (B, D), decoder_input_ids (B, T)) -> logits (B, T, C)`` over its C output classes;
    * the output vocabulary of :class:`CompactVocab` (``num_kept``, ``has_other``, ``to_compact``, ``to_full``,
      ``compact_targets``, ``other_penalty``, ``full_log_probs``, ``predict_full``);
    * ``set_normalization(z_train)`` (:class:`EmbeddingNorm`);
    * ``config`` with ``embed_dim``, ``vocab_size``, ``start_id``, ``max_len``, ``inputs``, ``bag_head``,
      ``input_dropout``, ``repeat_penalty``; and ``save_pretrained(folder)``;
    * ``embedding_weights()``: the names of the parameters that multiply the standardised embedding directly (its
      *pathway*). The control reads an embedding that standardises to exact zeros, so its function does not depend
      on them; zeroing them makes the decoder's output independent of the embedding (a probe then starts as its
      control: :func:`memlab.probes.decoder.fit.contain`).
    """

    num_kept: int
    has_other: bool
    config: Any

    def forward(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor: ...

    def set_normalization(self, z: torch.Tensor) -> None: ...

    def compact_targets(self, labels: torch.Tensor) -> torch.Tensor: ...

    def full_log_probs(self, logits: torch.Tensor) -> torch.Tensor: ...

    def predict_full(self, logits: torch.Tensor) -> torch.Tensor: ...

    def save_pretrained(self, folder) -> None: ...

    def embedding_weights(self) -> list[str]: ...


class CompactVocab:
    """The output vocabulary of a probe decoder: the ``K`` kept token ids (seen in training, and the start id) and,
    when ``K < V``, one *other* class whose probability is spread evenly over the ``V - K`` unseen ids (see the
    module doc). ``_init_vocab`` registers the buffers ``to_compact`` (V+1,) and ``to_full`` (K,)."""

    def _init_vocab(self, kept_ids, start_id: int, vocab_size: int) -> int:
        """Set up the kept ids; returns the number of output classes ``C = K [+ 1]``."""
        kept = torch.tensor(sorted(set(kept_ids) | {start_id}), dtype=torch.long)  # (K,)
        self.num_kept = int(kept.numel())
        self.has_other = self.num_kept < vocab_size
        to_compact = torch.full((vocab_size + 1,), self.num_kept, dtype=torch.long)  # unseen -> other
        to_compact[kept] = torch.arange(self.num_kept)
        self.register_buffer("to_compact", to_compact)  # (V+1,)
        self.register_buffer("to_full", kept)  # (K,)
        seen = set(kept_ids) | {start_id}  # host ints (the buffers may be on the meta device while loading)
        # the id an *other* prediction names: the first unseen one (a host int, found once: no sync per call)
        self._fallback = next((i for i in range(vocab_size) if i not in seen), 0)
        return self.num_kept + int(self.has_other)

    def compact_targets(self, labels: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary labels (B, T) -> compact class ids; negative labels (-100, a probe chunk's PAD) -> -100."""
        out = self.to_compact[labels.clamp(0, self.config.vocab_size)]  # (B, T)
        return torch.where(labels < 0, torch.full_like(out, -100), out)

    def other_penalty(self) -> float:
        """``ln(V - K)``: extra nats for a target in the *other* class (0 without one)."""
        return math.log(self.config.vocab_size - self.num_kept) if self.has_other else 0.0

    def full_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Compact logits (B, T, C) -> exact log-probabilities over the full vocabulary (B, T, V)."""
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, C)
        v = self.config.vocab_size
        if self.has_other:
            full = (logp[..., -1:] - self.other_penalty()).expand(*logp.shape[:-1], v).clone()  # (B, T, V)
        else:
            full = torch.full((*logp.shape[:-1], v), float("-inf"), device=logp.device)  # (B, T, V)
        full[..., self.to_full] = logp[..., : self.num_kept]
        return full

    def predict_full(self, logits: torch.Tensor) -> torch.Tensor:
        """Argmax over the full vocabulary, computed on compact logits: (B, T, C) -> (B, T) token ids."""
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, C)
        best, idx = logp[..., : self.num_kept].max(-1)  # (B, T)
        pred = self.to_full[idx]  # (B, T)
        if self.has_other:
            other_wins = logp[..., -1] - self.other_penalty() > best  # (B, T)
            pred = torch.where(other_wins, torch.full_like(pred, self._fallback), pred)
        return pred


class EmbeddingNorm:
    """Embeddings standardised per dimension with statistics of the training cache (buffers ``z_mean``, ``z_std``;
    each std floored at a tenth of the median; see the module doc)."""

    def _init_norm(self, embed_dim: int) -> None:
        self.register_buffer("z_mean", torch.zeros(embed_dim))
        self.register_buffer("z_std", torch.ones(embed_dim))

    def standardise(self, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(B, D) embeddings -> (B, D) standardised, in ``dtype``."""
        return (z.to(dtype) - self.z_mean) / self.z_std  # (B, D)

    def set_normalization(self, z: torch.Tensor) -> None:
        """Standardise inputs with the mean and std of training embeddings ``z`` (N, D)."""
        same = (z == z[:1]).all(0)  # (D,) dimensions constant in training: their mean is that value, exactly
        self.z_mean.copy_(torch.where(same, z[0], z.mean(0)))  # so a constant embedding standardises to exact zeros
        std = z.std(0) if z.shape[0] > 1 else torch.ones_like(self.z_std)  # (D,)
        std = std.masked_fill(same, 0.0)
        live = std[std > 0]
        # dimensions that hardly vary in training must not blow up when they do vary later
        floor = 0.1 * float(live.median()) if live.numel() else 1.0
        self.z_std.copy_(std.clamp(min=max(floor, 1e-6)))


class ProbeDecoder(CompactVocab, EmbeddingNorm, PreTrainedModel):
    config_class = ProbeDecoderConfig
    base_model_prefix = "body"
    _supports_sdpa = True
    group_modes = True
    """``forward(..., mode="prepare" | "read")``: trains in a batched group (:mod:`memlab.probes.decoder.fitloop`)."""
    incremental_decoding = True
    """``forward(..., mode="next", state=...)`` decodes one position at a time on cached keys and values."""

    def __init__(self, config: ProbeDecoderConfig):
        super().__init__(config)
        self._init_seed = int(torch.randint(0, 2**31 - 1, (1,), device="cpu"))  # from the global seed (post_init)
        c = config
        n_classes = self._init_vocab(c.kept_ids, c.start_id, c.vocab_size)
        self._cond = get_part("conditioning", c.conditioning).impl
        self._inputs = get_part("inputs", c.inputs).impl
        n_cond = self._cond.vectors(c)
        body_cfg = LlamaConfig(vocab_size=self.num_kept + 1, hidden_size=c.hidden_size,
                               intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
                               num_attention_heads=c.num_heads, num_key_value_heads=c.num_heads,
                               max_position_embeddings=c.max_len + n_cond, use_cache=False)
        body_cfg._attn_implementation = ATTENTION
        self.body = LlamaModel(body_cfg)
        # everything the embedding's width does not shape is made (and initialised) first, so that a probe and its
        # control (the same decoder on a constant embedding) start from the same weights whatever the width
        table_dim = getattr(c, "token_table_dim", 0)  # the output layer a map of the encoder's token table, or free
        self.lm_head = TableHead(c.hidden_size, n_classes, table_dim) if table_dim else \
            nn.Linear(c.hidden_size, n_classes, bias=False)
        self.cond = nn.Linear(c.embed_dim, n_cond * c.hidden_size)
        # each conditioning vector is layer-normed, with a gain that starts at the scale of token embeddings:
        # Adam then cannot blow the conditioning up into noise that swamps the tokens
        self.cond_norm = nn.LayerNorm(c.hidden_size)
        with torch.no_grad():
            self.cond_norm.weight.fill_(0.02)
        # the same linear map of the embedding is added to the logits of every position: a bag-of-words read-out
        # inside the decoder, trained by all T positions at once (data-efficient where order is not kept)
        self.bag = nn.Linear(c.embed_dim, n_classes, bias=False) if getattr(c, "bag_head", False) else None
        self._init_norm(c.embed_dim)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def post_init(self):
        super().post_init()
        # every weight drawn from one private generator, the embedding-shaped ones (cond, bag) last: a probe and its
        # control start from the same weights whatever the embedding's width
        if any(p.is_meta for p in self.parameters()):  # built to be loaded (from_pretrained): weights come later
            return
        gen = torch.Generator().manual_seed(self._init_seed)
        late = {"cond", "bag"}
        mods = [(n, m) for n, m in self.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
        with torch.no_grad():
            for n, m in sorted(mods, key=lambda nm: nm[0].split(".")[0] in late):  # stable: order kept otherwise
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 0.02)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
        if self.bag is not None:  # starts silent: the decoder begins as without it
            nn.init.zeros_(self.bag.weight)

    def embedding_weights(self) -> list[str]:
        """The embedding's pathway (:class:`ProbeDecoderAPI`): the conditioning map's weight and the bag head's."""
        return ["cond.weight"] + (["bag.weight"] if self.bag is not None else [])

    def forward(self, z: torch.Tensor, decoder_input_ids: torch.Tensor, mode: str = "logits", state: dict | None = None):
        """Compact logits ``(B, T, K [+1])`` for embeddings ``z`` (B, D) and full-vocabulary input ids (B, T).

        With ``inputs="blank"`` only the shape of ``decoder_input_ids`` is used: every input is the start token.
        ``mode`` splits the pass where a group of decoders trained together (:mod:`memlab.probes.decoder.fitloop`) needs it:

        * ``"prepare"``: ``(zn (B, D), compact ids (B, T))``: the standardised embedding and the ids the body reads,
          with the training noise (input and conditioning dropout) drawn here, from the global generator;
        * ``"read"``: logits from what ``"prepare"`` gave (no randomness: a pure function of the weights);
        * ``"next"``: incremental greedy decoding: the logits ``(B, 1, C)`` of the last position of
          ``decoder_input_ids``, reusing the keys and values of the earlier positions kept in ``state`` (a dict, empty
          on the first call, that the caller passes back unchanged with one more token each time).
        """
        if mode == "prepare":
            return self._prepare(z, decoder_input_ids)
        if mode == "read":
            return self._read(z, decoder_input_ids)
        if mode == "next":
            return self._next(z, decoder_input_ids, state)
        if mode != "logits":
            raise ValueError(f"unknown decoder mode '{mode}'; use logits, prepare, read or next")
        return self._read(*self._prepare(z, decoder_input_ids))

    def _prepare(self, z: torch.Tensor, decoder_input_ids: torch.Tensor):
        c = self.config
        if decoder_input_ids.shape[1] > c.max_len:
            raise ValueError(f"decoder inputs of {decoder_input_ids.shape[1]} tokens exceed max_len={c.max_len}")
        decoder_input_ids = self._inputs(decoder_input_ids, c, self.training)  # (B, T)
        ids = self.to_compact[decoder_input_ids.clamp(0, c.vocab_size)]  # (B, T)
        zn = self.standardise(z, self.z_mean.dtype)  # (B, D)
        if self.training and getattr(c, "cond_dropout", 0.0):
            zn = nn.functional.dropout(zn, c.cond_dropout)
        return zn, ids

    def _conditioned(self, zn: torch.Tensor, ids: torch.Tensor, cond: torch.Tensor | None = None):
        """Body inputs (B, P' + T, d) of compact ``ids`` (B, T) joined with the conditioning (computed when None)."""
        c = self.config
        x = self.body.embed_tokens(ids)  # (B, T, d)
        if cond is None:
            # the bias added and the norm taken in x's dtype (float32 under autocast too), the norm by elementwise
            # ops: a batched group's vmapped pass then rounds as one member's does (see the module doc)
            cond = nn.functional.linear(zn.to(x.dtype), self.cond.weight).to(x.dtype) + self.cond.bias
            cond = layer_norm(cond.view(ids.shape[0], -1, c.hidden_size), self.cond_norm)  # (B, P or max_len, d)
        return self._cond.join(x, cond), cond  # (B, P' + T, d): the registered conditioning

    def _head(self, h: torch.Tensor, zn: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(h)  # (B, T, C)
        if self.bag is not None:
            logits = logits + self.bag(zn.to(logits.dtype)).unsqueeze(1)  # (B, 1, C) added at every position
        return logits

    def _read(self, zn: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x, _ = self._conditioned(zn, ids)
        h = self.body(inputs_embeds=x).last_hidden_state  # (B, P' + T, d)
        return self._head(h[:, self._cond.offset(self.config) :], zn)  # (B, T, C)

    def _next(self, z: torch.Tensor, decoder_input_ids: torch.Tensor, state: dict) -> torch.Tensor:
        """Conditionings join causally (appending a token changes no earlier row), so only the rows after those
        already in the cache go through the body."""

        if not state:
            state["zn"], _ = self._prepare(z, decoder_input_ids[:, :1])  # (B, D)
            state["cache"], state["cond"] = DynamicCache(config=self.body.config), None
        zn, cache = state["zn"], state["cache"]
        if decoder_input_ids.shape[1] > self.config.max_len:
            raise ValueError(f"decoder inputs of {decoder_input_ids.shape[1]} tokens exceed max_len={self.config.max_len}")
        ids = self._inputs(decoder_input_ids, self.config, False)  # (B, t): evaluation sees every true token
        ids = self.to_compact[ids.clamp(0, self.config.vocab_size)]  # (B, t)
        x, state["cond"] = self._conditioned(zn, ids, state["cond"])  # (B, P' + t, d)
        seen = cache.get_seq_length()
        h = self.body(inputs_embeds=x[:, seen:], cache=cache, use_cache=True).last_hidden_state  # (B, new, d)
        return self._head(h[:, -1:], zn)  # (B, 1, C)


# the built-in conditionings and token inputs (registered in memlab.probes.catalog)


# The fitted probe and the decoder's files.


