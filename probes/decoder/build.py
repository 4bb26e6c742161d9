"""The probe decoder's files: a decoder part built from the encoder's facts and its options (:func:`build_decoder`),
saved (:func:`save_decoder`) and loaded again (:func:`load_decoder`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
import torch
from safetensors.torch import load_model, save_model

from memlab.errors import ConfigError, DataError, ModelError
from memlab.loading import strict_from_pretrained
from memlab.outdir import save_files
from memlab.probes.decoder.model import ProbeDecoder, ProbeDecoderConfig
from memlab.probes.parts import PARTS, get_part, own_options, part_options, split_name, takes
from memlab.probes.kinds import DecoderKind


def start_token_id(tokenizer) -> int:
    """The id that starts every decoder input: BOS, else CLS, else EOS, else pad."""
    for name in ("bos_token_id", "cls_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            return int(v)
    return 0


def _plugin_options(opts) -> dict:
    """The options of plugin conditionings and input modes that ``opts`` chooses: kept in the decoder's config (saved
    with it), where their parts read them."""
    chosen = {o for k in ("conditioning", "inputs") for o in get_part(k, getattr(opts, k)).option_names}
    return {k: v for k, v in (opts.part_options or {}).items() if k in chosen}


LLAMA_SHAPE = ("hidden_size", "num_layers", "num_heads")
"""The decoder config's fields a decoder part's options may set (the built-in llama's own)."""


def decoder_config(embed_dim: int, tokenizer, train_ids: torch.Tensor, opts, compact: bool = True, table_dim: int = 0):
    """The decoder's config: the encoder's facts (the embedding's width, the targets' vocabulary, the kept ids, the
    start id, the chunk length), the generic decoder settings the chosen decoder honours, the chosen conditioning's
    and inputs' options, the shape its own options set, and which part it is (``probe_part``: its name and own
    options, what :func:`memlab.probes.decoder.build.load_decoder` rebuilds it from); ``table_dim``: the width
    of the token table its output layer maps (0: none)."""
    v = len(tokenizer)
    kept = sorted(set(torch.unique(train_ids).tolist()) - {-1}) if compact else list(range(v))
    if kept and kept[-1] >= v:
        raise DataError(f"token id {kept[-1]} is outside the tokenizer's {v} tokens")
    part = get_part("decoder", opts.decoder)
    own = part_options(opts, part)
    honoured = set(part.honoured("decoder"))
    generic = {k: getattr(opts, k) for k in ("conditioning", "inputs", "cond_dropout", "bag_head") if k in honoured}
    shape = {k: getattr(opts, k) for k in LLAMA_SHAPE if k in part.option_names}
    record = {"name": opts.decoder, "options": asdict(own) if own is not None else {}}
    return ProbeDecoderConfig(embed_dim=embed_dim, vocab_size=v, kept_ids=kept, start_id=start_token_id(tokenizer),
                              max_len=int(train_ids.shape[1]), prefix_len=opts.prefix_len, input_dropout=opts.input_dropout,
                              repeat_penalty=opts.repeat_penalty, **generic, **shape, **_plugin_options(opts),
                              probe_part=record, **({"token_table_dim": table_dim} if table_dim else {}))


def build_decoder(embed_dim: int, tokenizer, train_ids: torch.Tensor, opts, compact: bool = True,
                  table: torch.Tensor | None = None) -> ProbeDecoder:
    """A fresh decoder of the chosen decoder part, built from :func:`decoder_config` and its own options;
    ``tokenizer`` and ``train_ids``: the targets' (the decoder's own tokenizer for ``decoder=pretrained:NAME``);
    ``table``: the targets' token table (V, D_t) its output layer maps (:mod:`memlab.probes.decoder.table`)."""
    torch.manual_seed(opts.seed)
    part = get_part("decoder", opts.decoder)
    table = table if "token_table" in part.option_names else None
    cfg = decoder_config(embed_dim, tokenizer, train_ids, opts, compact, 0 if table is None else table.shape[1])
    if isinstance(part.impl, DecoderKind):  # its argument (decoder=pretrained:NAME) and its own options
        return part.impl.build(cfg, split_name(opts.decoder)[1], part_options(opts, part))
    dec = part.impl(cfg, **own_options(part, opts))
    if table is not None:
        dec.lm_head.set_table(table, dec.to_full.tolist(), dec.has_other)
    return dec


def _own(part, values: dict):
    """``part``'s options dataclass from saved ``values`` (its defaults for the rest), or None without options."""
    if part.options is None:
        return None
    names = {f.name for f in fields(part.options)}
    return part.options(**{k: v for k, v in values.items() if k in names})


WEIGHTS = "model.safetensors"
"""The weights file of a decoder saved by :func:`save_decoder` (as ``save_pretrained`` names it)."""


def _decoder_part(config):
    """The registered decoder part a decoder ``config`` names (``probe_part``), or None (a decoder saved before
    decoders named their part: the built-in one)."""
    record = getattr(config, "probe_part", None) if not isinstance(config, dict) else config.get("probe_part")
    if not record:
        return None, {}
    try:
        return get_part("decoder", record["name"]), record.get("options") or {}
    except ConfigError:
        raise ModelError(f"this probe's decoder part '{record['name']}' is not registered: install (or import) the "
                         "package that registers it") from None


def save_decoder(decoder, folder: str | Path) -> None:
    """Write a probe decoder into ``folder``: by its part's ``save`` when it has one, by ``save_pretrained`` (a
    transformers model), else as ``config.json`` and ``model.safetensors`` (its state, shared tensors once)."""
    folder = Path(folder)
    part, _ = _decoder_part(decoder.config)

    def write(tmp: Path) -> None:  # into a temporary folder; each file then renamed whole (memlab.outdir.save_files)
        if part is not None and part.save is not None:
            part.save(decoder, tmp)
        elif hasattr(decoder, "save_pretrained"):
            decoder.save_pretrained(str(tmp))
        else:
            (tmp / "config.json").write_text(decoder.config.to_json_string())
            save_model(decoder, str(tmp / WEIGHTS))

    save_files(folder, write, f"the probe decoder in {folder}")


def load_decoder(folder: Path):
    """A saved probe decoder (strict) and its targets' tokenizer (None: the encoder's): the registered
    :class:`~memlab.probes.kinds.DecoderKind` whose ``config_type`` its config.json names, else the decoder part its
    config names (``probe_part``: by the part's ``load``, or rebuilt from its config and own options and its weights
    read strictly), else the built-in decoder."""

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{folder}: the saved decoder's config.json cannot be read ({e})") from None
    for name in PARTS["decoder"].names():
        kind = PARTS["decoder"].get(name).impl
        if isinstance(kind, DecoderKind) and kind.config_type == config.get("model_type"):
            dec = kind.load(folder)
            return dec, kind.tokenizer(dec.config.source)
    part, own = _decoder_part(config)
    if part is None or part.impl is ProbeDecoder:
        return strict_from_pretrained(ProbeDecoder, folder), None
    if part.load is not None:
        return part.load(folder), None
    dec = part.impl(ProbeDecoderConfig.from_pretrained(str(folder)), **({"options": _own(part, own)}
                                                                       if takes(part.impl, "options") else {}))
    missing, unexpected = load_model(dec, str(folder / WEIGHTS), strict=False)
    if missing or unexpected:
        raise ModelError(f"{folder}: the saved weights do not fit decoder '{part.name}' (missing {sorted(missing)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")
    return dec.eval(), None
