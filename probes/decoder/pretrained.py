"""A pretrained causal LM as the probe's decoder: ``decoder=pretrained:NAME``.

``NAME`` is anything :func:`memlab.probes.encoders.sources.resolve_source` takes: a
shortcut (``smollm2``), a ``save_pretrained`` folder, a memlab run directory,
a GGUF file or a hub name (read from the local cache; ``trust_remote_code``
stays off). The LM (``AutoModelForCausalLM``) reads the probed embedding
through a trained map: the standardised embedding (as the scratch decoder's,
:class:`memlab.probes.decoder.model.EmbeddingNorm`) -> Linear -> vectors of the LM's
width, layer-normed with a gain at the scale of the LM's token embeddings,
joined to the token embeddings by the registered conditioning
(``conditioning=prefix``: ``prefix_len`` soft-prompt vectors before the tokens,
fed through ``inputs_embeds``; ``unrolled``: one vector added to each token).

* ``lora_r=0`` (default): the LM is frozen (``requires_grad`` off); only the
  map (and the bag head when on) trains.
* ``lora_r>0``: LoRA adapters of rank ``lora_r`` (scale ``lora_alpha / r``)
  through ``peft`` on the LM's attention projections (the peft default of its
  architecture, else every linear layer of its body) train with the map.
* ``finetune=true``: every weight of the LM trains with the map (as
  vec2text's inverter, a fine-tuned T5), and the whole LM is saved with it.

``map_hidden=H`` puts a hidden layer in the map (Linear -> GELU -> Linear, as
vec2text's embedding transform). Into a frozen or LoRA-adapted LM, a linear
map cannot turn codes the LM never saw (synthetic ``concat``'s random ones)
into its token embeddings; a non-linear one could, but on concat it read no
more. Fine-tuned, the LM learns the codes itself, and a linear map passes the
positive control (``configs/probes/calibration_pretrained.yaml``;
docs/results/probes.md).

Targets are the chunk texts in the decoder's own tokenizer (see
:func:`memlab.probes.chunks.targets.make_targets`), so every encoder read by one pretrained decoder
is scored over the same target tokens. The output layer is the LM's own, over
its whole vocabulary (``compact_vocab`` does not apply: a compact vocabulary's
*other* class would throw away what the LM knows of the tokens unseen in the
probe's training chunks, and at a few hundred chunks that costs more nats
than the embedding gives).

Saved (``save_pretrained``): ``config.json`` (with the LM's name and a
fingerprint of its weights) and ``decoder.safetensors`` holding only what
trained (the map, the bag head, the LoRA weights or the fine-tuned LM, the
standardisation); :func:`load_decoder` rebuilds the LM from its name and
refuses weights that do not fit or an LM that is not the one trained on.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM

from memlab.errors import ConfigError, ModelError
from memlab.loading import strict_from_pretrained
from memlab.probes.decoder.model import CompactVocab, EmbeddingNorm, ProbeDecoderConfig
from memlab.probes.encoders.sources import _load_tokenizer, resolve_source
from memlab.probes.parts import get_part
from memlab.probes.kinds import DecoderKind
from memlab.probes.sections import PretrainedOptions

WEIGHTS = "decoder.safetensors"
LM_PREFIX = "lm."


class PretrainedDecoderConfig(ProbeDecoderConfig):
    """:class:`ProbeDecoderConfig` of a pretrained decoder: ``hidden_size`` is the LM's width; ``source`` names
    the LM; ``lora_r``/``lora_alpha`` its adapters, ``finetune`` trains the whole LM instead; ``map_hidden`` the
    width of the map's hidden layer (0: linear); ``lm_fingerprint`` identifies the LM's weights before training."""

    model_type = "memlab_pretrained_probe_decoder"

    def __init__(self, source: str = "", lora_r: int = PretrainedOptions.lora_r,
                 lora_alpha: float = PretrainedOptions.lora_alpha, lm_fingerprint: str = "",
                 map_hidden: int = PretrainedOptions.map_hidden, finetune: bool = PretrainedOptions.finetune,
                 **kwargs):
        self.source = source
        self.lora_r = lora_r
        self.lora_alpha = lora_alpha
        self.map_hidden = map_hidden  # 0: the embedding-to-LM map is linear; H > 0: Linear(D, H) -> GELU -> Linear
        self.finetune = finetune  # every LM weight trains with the map (and is saved)
        self.lm_fingerprint = lm_fingerprint
        super().__init__(**kwargs)


def _is_causal_lm(config) -> bool:

    if getattr(config, "is_encoder_decoder", False):
        return False
    archs = getattr(config, "architectures", None) or []
    if archs:
        return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    return type(config) in MODEL_FOR_CAUSAL_LM_MAPPING


@lru_cache(maxsize=8)
def _lm_config(folder: str, gguf_file: str | None, what: str):
    """The config of the causal LM of ``folder``; a ModelError when it cannot be read or is not a causal LM."""

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False, **kw)
    except Exception as e:  # noqa: BLE001  (an unreadable config or GGUF header: one line)
        raise ModelError(f"{what}: not a model transformers can read ({str(e).strip().splitlines()[0][:160]})") from None
    if not _is_causal_lm(config):
        archs = ", ".join(getattr(config, "architectures", None) or [type(config).__name__])
        raise ModelError(f"{what} is not a causal LM ({archs}); a pretrained decoder is an AutoModelForCausalLM")
    return config


@lru_cache(maxsize=2)
def _base_lm(folder: str, gguf_file: str | None, what: str):
    """The causal LM of ``folder`` (float32, CPU, eval), read once per process; callers copy it."""


    kw = {"gguf_file": gguf_file} if gguf_file else {}
    config = copy.deepcopy(_lm_config(folder, gguf_file, what))
    try:
        lm = strict_from_pretrained(AutoModelForCausalLM, folder, what=what, config=config, dtype=torch.float32,
                                    trust_remote_code=False, **kw)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001  (a GGUF file fails in many ways)
        raise ModelError(f"{what}: its weights cannot be read as a causal LM "
                         f"({str(e).strip().splitlines()[0][:160]})") from None
    lm.config.use_cache = False
    return lm.eval()


def _source(name: str) -> tuple[str, str | None, str]:

    what = f"decoder 'pretrained:{name}'"
    try:
        folder, gguf_file, _ = resolve_source(name)
    except ModelError as e:
        raise ModelError(f"{what}: {e}") from None
    return folder, gguf_file, what


def load_lm(name: str):
    """A fresh copy of the causal LM ``name`` (see the module doc)."""
    return copy.deepcopy(_base_lm(*_source(name)))


def load_decoder_tokenizer(name: str):
    """The tokenizer of the causal LM ``name``: the one its targets are in."""

    folder, gguf_file, what = _source(name)
    return _load_tokenizer(folder, gguf_file, what)


def fingerprint(lm) -> str:
    """A short hash of the LM's input embedding matrix (its first rows) and shape: which LM a probe read with."""
    w = lm.get_input_embeddings().weight.detach()
    h = hashlib.sha256(json.dumps(list(w.shape)).encode())
    h.update(w[:64].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _lora(body: nn.Module, model_type: str, r: int, alpha: float) -> None:
    """LoRA adapters of rank ``r`` injected into ``body`` in place (peft); only they train there."""
    try:
        from peft import LoraConfig, inject_adapter_in_model  # optional (the lora extra)
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as TARGETS  # optional (lora)
    except ImportError:
        raise ConfigError(f"lora_r={r} needs peft: pip install peft (or pip install 'memlab[lora]')") from None
    targets = TARGETS.get(model_type) or "all-linear"
    inject_adapter_in_model(LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets), body)
    for n, p in body.named_parameters():
        p.requires_grad_("lora_" in n)


class PretrainedDecoder(CompactVocab, EmbeddingNorm, nn.Module):
    """A causal LM reading one embedding through a trained map (see the module doc); the probe decoder's interface
    (:class:`memlab.probes.decoder.model.ProbeDecoderAPI`)."""

    def __init__(self, config: PretrainedDecoderConfig, lm):
        super().__init__()
        c = self.config = config
        self.lm = lm
        for p in lm.parameters():
            p.requires_grad_(bool(c.finetune))
        head = lm.get_output_embeddings()
        emb = lm.get_input_embeddings()
        if head is None or emb is None:
            raise ModelError(f"decoder '{c.source}' has no input embeddings or output layer to read")
        d = int(emb.weight.shape[1])
        c.hidden_size = d
        n_cond = get_part("conditioning", c.conditioning).impl.vectors(c)
        room = getattr(lm.config, "max_position_embeddings", None)
        if room is not None and c.max_len + n_cond > room:
            raise ModelError(f"decoder '{c.source}' reads at most {room} positions; its {n_cond} conditioning "
                             f"vectors and chunks of {c.max_len} tokens need {c.max_len + n_cond} (lower seq_len)")
        if int(head.weight.shape[0]) < c.vocab_size:
            raise ModelError(f"decoder '{c.source}': its output layer has {head.weight.shape[0]} rows, its tokenizer "
                             f"{c.vocab_size} tokens")
        if c.lora_r:
            _lora(self.body, lm.config.model_type, c.lora_r, c.lora_alpha)
        n_classes = self._init_vocab(range(c.vocab_size), c.start_id, c.vocab_size)  # the LM's whole output layer
        self._cond = get_part("conditioning", c.conditioning).impl
        self._inputs = get_part("inputs", c.inputs).impl
        # the map's draws come from a private generator seeded from the global seed (build_decoder sets it), the
        # embedding-shaped weight last: a probe and its control (a constant embedding, standardised to zeros) start
        # alike whatever the embedding's width (building a layer draws from the global generator by its shape)
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))
        self.cond_norm = nn.LayerNorm(d)
        with torch.no_grad():  # soft prompts at the scale of the LM's own token embeddings
            self.cond_norm.weight.fill_(float(emb.weight.float().pow(2).mean().sqrt()))
        self.bag = nn.Linear(c.embed_dim, n_classes, bias=False) if c.bag_head else None
        if self.bag is not None:
            nn.init.zeros_(self.bag.weight)  # starts silent
        h = int(c.map_hidden)
        out = nn.Linear(h or c.embed_dim, n_cond * d)
        first = nn.Linear(c.embed_dim, h) if h else None
        self.cond = nn.Sequential(first, nn.GELU(), out) if h else out

        def draw(t: torch.Tensor, std: float) -> None:
            t.copy_(torch.randn(t.shape, generator=gen) * std)

        with torch.no_grad():
            # a random output bias: a constant embedding (the control's) still gives soft prompts with a spread, which
            # the layer norm maps to token scale (all-zero prompts make the LM's gradients overflow)
            draw(out.bias, 0.02)
            if first is not None:
                draw(out.weight, h ** -0.5)  # the layer norm after it sets the prompts' scale
                first.bias.zero_()
                draw(first.weight, c.embed_dim ** -0.5)  # unit-scale hidden units from a standardised z
            else:
                draw(out.weight, 0.02)
        self._init_norm(c.embed_dim)

    @property
    def body(self) -> nn.Module:
        """The LM without its output layer (its hidden states are after the final norm)."""
        return getattr(self.lm, self.lm.base_model_prefix)

    def forward(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Compact logits ``(B, T, K [+1])`` for embeddings ``z`` (B, D) and full-vocabulary input ids (B, T)."""
        c = self.config
        b, t = decoder_input_ids.shape
        if t > c.max_len:
            raise ValueError(f"decoder inputs of {t} tokens exceed max_len={c.max_len}")
        ids = self._inputs(decoder_input_ids, c, self.training).clamp(0, c.vocab_size - 1)  # (B, T)
        x = self.lm.get_input_embeddings()(ids)  # (B, T, d)
        zn = self.standardise(z, x.dtype)  # (B, D)
        if self.training and c.cond_dropout:
            zn = nn.functional.dropout(zn, c.cond_dropout)
        cond = self.cond_norm(self.cond(zn).view(b, -1, c.hidden_size))  # (B, P or max_len, d)
        x = self._cond.join(x, cond)  # (B, P' + T, d)
        h = self.body(inputs_embeds=x).last_hidden_state[:, self._cond.offset(c):]  # (B, T, d)
        head = self.lm.get_output_embeddings()
        bias = None if head.bias is None else head.bias[: c.vocab_size]
        logits = nn.functional.linear(h, head.weight[: c.vocab_size], bias)  # (B, T, V): the LM's own output layer
        if self.bag is not None:
            logits = logits + self.bag(zn).unsqueeze(1)  # (B, 1, C) added at every position
        return logits

    def embedding_weights(self) -> list[str]:
        """The embedding's pathway (:class:`~memlab.probes.decoder.model.ProbeDecoderAPI`): the map's first layer (with
        ``map_hidden`` the hidden layer's weight: zeroed, it leaves GELU(its bias), a constant as the control's) and
        the bag head's weight."""
        first = "cond.0.weight" if isinstance(self.cond, nn.Sequential) else "cond.weight"
        return [first] + (["bag.weight"] if self.bag is not None else [])

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What :meth:`save_pretrained` writes: everything outside the LM and the LM's LoRA weights, or with
        ``finetune`` the whole LM too (a tied weight once)."""
        kept, seen = {}, set()
        for k, v in self.state_dict().items():
            if not (self.config.finetune or not k.startswith(LM_PREFIX) or "lora_" in k):
                continue
            if k.startswith(LM_PREFIX) and v.data_ptr() in seen:  # a tied weight (output layer = input embeddings)
                continue
            seen.add(v.data_ptr())
            kept[k] = v
        return kept

    def save_pretrained(self, folder: str | Path) -> None:

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(str(out))
        save_file({k: v.detach().cpu().contiguous() for k, v in self.trained_state().items()}, str(out / WEIGHTS))


def build(config: ProbeDecoderConfig, arg: str, options: PretrainedOptions | dict | None = None) -> PretrainedDecoder:
    """The ``pretrained:ARG`` decoder for a built config (vocabulary in the LM's tokenizer) and the part's options."""
    seed = int(torch.initial_seed())
    lm = load_lm(arg)
    torch.manual_seed(seed)  # the map's draws do not depend on whether the LM was read from disk or the cache
    names = set(inspect.signature(ProbeDecoderConfig.__init__).parameters) - {"self", "kwargs"}
    fields = {k: getattr(config, k) for k in names if hasattr(config, k)}  # a key kept only where set (the table's width)
    o = options if isinstance(options, PretrainedOptions) else PretrainedOptions(**(options or {}))
    cfg = PretrainedDecoderConfig(source=_stored_name(arg), lora_r=int(o.lora_r), lora_alpha=float(o.lora_alpha),
                                  lm_fingerprint=fingerprint(lm), map_hidden=int(o.map_hidden),
                                  finetune=bool(o.finetune), **fields)
    return PretrainedDecoder(cfg, lm)


def _stored_name(arg: str) -> str:
    """A path as an absolute path (the saved probe loads from anywhere); a shortcut or hub name as given."""
    p = Path(arg).expanduser()
    return str(p.resolve()) if p.exists() else arg


def load_decoder(folder: str | Path) -> PretrainedDecoder:
    """A saved pretrained decoder back: its LM rebuilt by name, the trained weights loaded strictly."""

    folder = Path(folder)
    try:
        cfg = PretrainedDecoderConfig.from_pretrained(str(folder))
        saved = load_file(str(folder / WEIGHTS))
    except (OSError, ValueError, SafetensorError) as e:
        raise ModelError(f"{folder}: the saved pretrained decoder cannot be read ({str(e).splitlines()[0][:160]})") \
            from None
    lm = load_lm(cfg.source)
    if cfg.lm_fingerprint and fingerprint(lm) != cfg.lm_fingerprint:
        raise ModelError(f"{folder}: the LM '{cfg.source}' is not the one this probe decoder was trained on "
                         "(its weights differ)")
    dec = PretrainedDecoder(cfg, lm)
    want = dec.trained_state()
    missing, extra = sorted(set(want) - set(saved)), sorted(set(saved) - set(want))
    bad = [k for k in set(want) & set(saved) if want[k].shape != saved[k].shape]
    if missing or extra or bad:
        what = (f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(extra[:3])}" if extra
                else f"reshaped {', '.join(sorted(bad)[:3])}")
        raise ModelError(f"{folder}: the saved weights do not fit the pretrained decoder ({what})")
    dec.load_state_dict(saved, strict=False)
    return dec.eval()


def check(opts, arg: str, explicit: set) -> None:
    """The pretrained decoder's own option checks (one ConfigError each), and that ``arg`` is a causal LM."""
    _lm_config(*_source(arg))
    if opts.chunk_by != "words":
        raise ConfigError("decoder=pretrained reads the chunk texts in its own tokenizer: use chunk_by=words")
    if opts.lora_r < 0:
        raise ConfigError(f"'lora_r' must be >= 0 (0: the LM frozen), got {opts.lora_r}")
    if opts.finetune and opts.lora_r:
        raise ConfigError("finetune=true trains every LM weight; lora_r adapts a frozen LM: choose one")
    if opts.map_hidden < 0:
        raise ConfigError(f"'map_hidden' must be >= 0 (0: a linear map), got {opts.map_hidden}")
    if opts.lora_r == 0 and "lora_alpha" in explicit:
        raise ConfigError("'lora_alpha' scales LoRA adapters, and lora_r=0 trains none ("
                          + ("finetune=true trains the whole LM" if opts.finetune else "the LM stays frozen")
                          + "); set lora_r > 0 or drop lora_alpha")
    if opts.lora_r:
        if not opts.lora_alpha > 0:
            raise ConfigError(f"'lora_alpha' must be > 0, got {opts.lora_alpha}")
        try:
            import peft  # noqa: F401  (optional: the lora extra)
        except ImportError:
            raise ConfigError(f"lora_r={opts.lora_r} needs peft, which is not installed: pip install peft "
                              "(or pip install 'memlab[lora]')") from None


KIND = DecoderKind(build, load_decoder_tokenizer, load_decoder, PretrainedDecoderConfig.model_type)
"""The ``pretrained:NAME`` decoder kind (registered in :mod:`memlab.probes.catalog`)."""
