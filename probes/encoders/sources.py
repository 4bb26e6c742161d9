"""Build a frozen encoder from a name: a shortcut, a memlab space, a local folder or run, or a hub name.

``spec`` forms: each a registered encoder kind (:mod:`memlab.probes.parts`, newest registration first; the
built-in ones registered in :mod:`memlab.probes.catalog`, defined at the end of this module), whose own loader builds it:

* a shortcut from :mod:`memlab.assets` (``minilm``, ``smollm2``);
* ``space:NAME[:PATH]``: a registered EmbeddingSpace (``memlab list spaces``),
  e.g. ``space:memory_ae:runs/ae`` for a memory autoencoder;
* a local path: a ``save_pretrained`` folder or a memlab run directory (its
  latest checkpoint); the tokenizer must be saved beside the weights;
* a GGUF file (``model.gguf``) of any architecture transformers' GGUF reader
  knows: config, tokenizer and (dequantized) weights all come from the file;
* ``synthetic:concat|bag|constant[:TOKENIZER_DIR]``: a calibration encoder of known content
  (:mod:`memlab.probes.encoders.synthetic`);
* a Hugging Face hub name, read from the local cache when offline.

``trust_remote_code`` stays off. ``random_init=True`` builds the same
architecture with fresh random weights (the probe's floor).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

from memlab import assets
from memlab.devices import auto_dtype, running_on
from memlab.errors import ModelError
from memlab.loading import resolve_model_dir, strict_from_pretrained
from memlab.probes.encoders import placement as P
from memlab.probes.encoders.capture import HiddenStateEncoder, SpaceEncoder
from memlab.probes.parts import encoder_kind
from memlab.probes.kinds import EncoderKind
from memlab.space import build_space

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")


def _offline() -> bool:
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _errors(gguf_file: str | None, *listed: type[Exception]) -> tuple[type[Exception], ...]:
    """What a load may fail with: transformers' GGUF reader fails in many ways (an architecture it does not know,
    a damaged file: struct, index, key, shape errors), so any error of a GGUF load is the file's."""
    return (Exception,) if gguf_file else listed


def _gguf_error(what: str, stage: str, e: Exception) -> ModelError:
    if isinstance(e, MemoryError):  # the file is fine; the host is too small for its dequantized weights
        raise e
    return ModelError(f"{what}: transformers cannot read this GGUF file's {stage} ({_first_line(e)})")


def _load_tokenizer(folder: str, gguf_file: str | None, what: str):

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    if Path(folder).is_dir() and not gguf_file and not any((Path(folder) / f).is_file() for f in TOKENIZER_FILES):
        raise ModelError(f"{what} has no tokenizer (none of {', '.join(TOKENIZER_FILES)} in {folder}); "
                         "save one beside the weights")
    try:
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **kw)
    except _errors(gguf_file, OSError, ValueError, TypeError, KeyError) as e:
        if gguf_file:
            raise _gguf_error(what, "tokenizer", e) from None
        raise ModelError(f"{what} has no usable tokenizer ({_first_line(e)}); save one beside the weights") from None
    if tok is None or not hasattr(tok, "pad_token"):
        raise ModelError(f"{what} has no tokenizer; save one beside the weights")
    if tok.pad_token is None:
        for cand in ("eos_token", "unk_token", "bos_token"):
            if getattr(tok, cand) is not None:
                tok.pad_token = getattr(tok, cand)
                break
        else:
            raise ModelError(f"the tokenizer of {what} has no pad, EOS, UNK or BOS token to pad with")
    tok.padding_side = "right"
    return tok


def _load_model(folder: str, gguf_file: str | None, random_init: bool, what: str, dtype=torch.float32,
                device: str = "cpu", placement: P.Placement = P.Placement()):
    """The model of ``folder`` built in ``dtype`` straight on ``device`` (no full float32 copy in host memory), or
    placed by accelerate over the GPUs, host memory and disk (:mod:`memlab.probes.encoders.placement`)."""

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False, **kw)
    except _errors(gguf_file, OSError, ValueError, KeyError) as e:
        if gguf_file:
            raise _gguf_error(what, "metadata", e) from None
        msg = _first_line(e)
        if Path(folder).exists():
            raise ModelError(f"{what}: not a model transformers can read ({msg})") from None
        where = "offline, " if _offline() else ""
        raise ModelError(
            f"unknown model '{folder}': not a shortcut ({', '.join(sorted(assets.ASSETS))}), not a local path, "
            f"and {where}not in the Hugging Face cache") from None
    place = P.plan(placement, device, lambda: P.weights_bytes(folder, gguf_file, config, dtype))
    if random_init:
        torch.manual_seed(0)
        with torch.device("cpu" if place else device):  # the random weights are made where they are read
            model = AutoModel.from_config(config, dtype=dtype)
        if place:  # the one copy in host memory is spread by accelerate (disk-offloaded blocks written out)
            model = P.dispatch(model, place)
    else:

        # weights that do not fit are refused, not run at random; a task head the encoder does not read may stay
        try:
            on_cpu = torch.device(device).type == "cpu" and not place
            if place:  # accelerate places each shard's weights on a GPU, in host memory or on disk
                kw.update(place)
            elif not on_cpu:
                kw["device_map"] = str(device)  # weights go from the file to the device, shard by shard
            # on the CPU a local folder's tensors are read and cast one at a time: no second copy of the weights
            model = strict_from_pretrained(AutoModel, folder, allow_unexpected=True, what=what, config=config,
                                           dtype=dtype, trust_remote_code=False,
                                           read_by_tensor=on_cpu and not gguf_file, **kw)
        except ModelError:
            raise
        except _errors(gguf_file) as e:  # a GGUF file fails in many ways; other reads are strict's one line
            raise _gguf_error(what, "weights", e) from None
    model.config.use_cache = False
    if getattr(model.config, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
        enc = model.get_encoder()
        for name in ("decoder", "lm_head"):
            if hasattr(model, name) and getattr(model, name) is not enc:
                setattr(model, name, torch.nn.Identity())  # free the decoder: only the encoder is read
    return model


def load_space(spec: str, random_init: bool = False, device: str = "cpu", **_) -> SpaceEncoder:
    """The ``space:NAME[:PATH]`` encoder kind: a registered EmbeddingSpace, built onto ``device``."""
    if random_init:
        raise ModelError("random_init applies to transformers models, not to memlab spaces")
    with running_on(torch.device(device)):  # the space's modules are built onto the probe's device
        return SpaceEncoder(build_space(spec.partition(":")[2]), name=spec)


def resolve_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """``float32``, ``bfloat16``, ``float16`` or ``auto`` (:func:`memlab.devices.auto_dtype`: bf16 where the device
    multiplies it natively, a CPU included, else float32)."""
    if name == "auto":
        return auto_dtype(device)
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise ModelError(f"unknown dtype '{name}'; use auto, float32, bfloat16 or float16")
    return table[name]


def shortcut_source(spec: str) -> tuple[str, str | None, str]:
    """A packaged model (:mod:`memlab.assets`) -> (folder, GGUF file name or None, its default pooling)."""
    folder, gguf_file, asset = assets.resolve(spec)
    return str(folder), gguf_file, asset.pool


def path_source(spec: str) -> tuple[str, str | None, str]:
    """A GGUF file, a ``save_pretrained`` folder or a memlab run directory -> (folder, GGUF file name or None,
    ``last``)."""
    p = Path(os.path.expanduser(spec))
    if p.is_file() and (p.suffix.lower() == ".gguf" or assets.is_gguf(p)):
        folder, gguf_file = assets.gguf_source(p)
        return str(folder), gguf_file, "last"
    if p.exists():
        return str(resolve_model_dir(p)), None, "last"
    raise ModelError(f"model path '{spec}' does not exist")


def hub_source(spec: str) -> tuple[str, str | None, str]:
    """A Hugging Face hub name -> (the name, None, ``last``); a spec with more than one ``/`` is a missing path."""
    if spec.count("/") > 1:
        raise ModelError(f"model path '{spec}' does not exist")
    return spec, None, "last"


def resolve_source(spec: str) -> tuple[str, str | None, str]:
    """A shortcut, GGUF file, folder, run directory or hub name -> (folder or hub name, GGUF file name or None,
    the shortcut's default pooling or ``last``): the ``source`` of the registered encoder kind that takes it."""
    kind = encoder_kind(spec)
    if kind is None or kind.impl.source is None:
        raise ModelError(f"'{spec}' is not a transformers model (a shortcut, folder, run, GGUF file or hub name)")
    return kind.impl.source(spec)


def load_tokenizer(spec: str):
    """The tokenizer of a model ``spec`` (a shortcut, GGUF file, folder, run directory or hub name), alone."""
    folder, gguf_file, _ = resolve_source(spec)
    return _load_tokenizer(folder, gguf_file, f"model '{spec}'")


def load_encoder(spec: str, **kw):
    """A frozen encoder for ``spec``, built by the registered encoder kind that takes it (see the module doc), with
    ``.tokenizer``, ``.dim``, ``.encode(ids, mask)``; ``kw``: as :func:`load_transformers` takes them."""
    kind = encoder_kind(spec)
    if kind is None:
        raise ModelError(f"no registered encoder kind takes '{spec}'")
    P.check(P.Placement(kw.get("device_map"), kw.get("max_memory"), kw.get("offload_dir")), spec)
    return kind.impl.load(spec, **kw)


def load_transformers(spec: str, layer: int = -1, pool: str | None = None, final_norm: bool = False,
                      random_init: bool = False, special_tokens: bool = True, device: str = "cpu",
                      dtype: str = "float32", max_len: int | None = None, device_map: str | None = None,
                      max_memory: str | dict | None = None, offload_dir: str | None = None) -> HiddenStateEncoder:
    """The shortcut, folder and hub encoder kinds: the transformers model their ``source`` names, frozen.

    ``pool=None`` takes the shortcut's pooling (``mean`` for MiniLM) or ``last`` otherwise. ``dtype`` is the
    encoder's weight type (``auto``: bf16 where the hardware multiplies bf16 natively); embeddings are float32.
    ``device_map``, ``max_memory`` and ``offload_dir`` place it by accelerate over the GPUs, host memory and disk
    (:mod:`memlab.probes.encoders.placement`); by default it is so placed only when it does not fit ``device``.
    """
    placement = P.Placement(device_map, max_memory, offload_dir)
    folder, gguf_file, default_pool = resolve_source(spec)
    model = _load_model(folder, gguf_file, random_init, spec, dtype=resolve_dtype(dtype, device),
                        device=device, placement=placement)
    tok = _load_tokenizer(folder, gguf_file, f"model '{spec}'")
    if len(tok) > getattr(model.config, "vocab_size", len(tok)) + 1024:
        raise ModelError(f"model '{spec}': its tokenizer has {len(tok)} tokens, more than the model's vocabulary")
    if not P.is_placed(model):  # an accelerate-placed model stays where its hooks expect it
        model.to(device)
    name = f"{spec} (random init)" if random_init else spec
    return HiddenStateEncoder(model, tok, layer=layer, pool=pool or default_pool, final_norm=final_norm,
                              special_tokens=special_tokens, name=name)


def _is_path(spec: str) -> bool:
    return Path(os.path.expanduser(spec)).exists() or spec.startswith((".", "/", "~"))


# the encoder kinds of this module (registered in memlab.probes.catalog): the first whose ``matches`` takes the spec,
# newest registration first, loads it
HUB = EncoderKind(lambda s: True, load_transformers, source=hub_source)
FOLDER = EncoderKind(_is_path, load_transformers, source=path_source)
SHORTCUT = EncoderKind(lambda s: s in assets.ASSETS, load_transformers, source=shortcut_source)
SPACE = EncoderKind("space:", load_space)
