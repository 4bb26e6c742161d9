"""A fitted probe is an EmbeddingSpace: the frozen encoder's ``encode`` and the trained decoder; and the probe
decoder's files: how a decoder part is built from the encoder's facts and its options (:func:`build_decoder`), saved
(:func:`save_decoder`) and loaded again (:func:`load_decoder`, :func:`load_probe`).

Teacher forcing (see :mod:`memlab.space`): ``decoder_inputs`` puts the start
token (BOS, else CLS, EOS or pad) before the text and drops its last token;
labels are the text, ``-100`` on padding. A decoder trained with blank inputs
(``inputs="blank"``) ignores the input ids and generates all positions at once. ``decode_logits`` returns exact
log-probabilities over the tokenizer's full vocabulary.

A decoder with its own tokenizer (``decoder=pretrained:NAME``) rebuilds text in that tokenizer
(``target_tokenizer``): ``generate`` decodes with it, and ``decode_logits`` and ``decoder_inputs`` are over its
vocabulary; ``encode`` and ``encode_text`` stay in the encoder's.
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
from memlab.probes.capture import right_pad
from memlab.probes.chunks import shift_right
from memlab.probes.decoder import ProbeDecoder, ProbeDecoderConfig
from memlab.probes.encoders import load_encoder, load_tokenizer
from memlab.probes.parts import (PARTS, DecoderKind, encoder_kind, get_part, own_options, part_options, reads_tokens,
                                 split_name, takes)
from memlab.probes.readings import reconstruct_ids
from memlab.rundir import write_atomic


class FittedProbe:
    """Frozen encoder + trained probe decoder, usable wherever an EmbeddingSpace is."""

    def __init__(self, encoder, decoder: ProbeDecoder, target_tokenizer=None):
        if decoder.config.embed_dim != encoder.dim:
            raise ModelError(f"the decoder reads embeddings of width {decoder.config.embed_dim}, "
                             f"the encoder gives {encoder.dim}")
        self.encoder = encoder
        self.decoder = decoder.eval()
        self.tokenizer = encoder.tokenizer
        self.target_tokenizer = target_tokenizer if target_tokenizer is not None else encoder.tokenizer
        self.dim = int(encoder.dim)
        self.max_length = int(decoder.config.max_len)  # the most tokens its decoder rebuilds (target tokenizer)
        self.input_max_length = getattr(encoder, "max_length", None)  # the most its encoder reads (its tokenizer)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder.encode(input_ids, attention_mask)  # (B, D)

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])

    def decoder_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        ids, mask = right_pad(input_ids, attention_mask)
        if ids.shape[1] > self.max_length:
            raise ModelError(f"{ids.shape[1]} tokens are more than this probe's decoder rebuilds ({self.max_length})")
        labels = ids.masked_fill(mask == 0, -100)  # (B, T)
        return shift_right(ids, int(self.decoder.config.start_id)), labels

    def _check(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 2 or z.shape[-1] != self.decoder.config.embed_dim:
            raise ModelError(f"embeddings of shape {tuple(z.shape)} do not fit this probe's decoder "
                             f"(width {self.decoder.config.embed_dim})")
        return z

    def decode_logits(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.decoder(self._check(z), decoder_input_ids)  # (B, T, C)
        return self.decoder.full_log_probs(logits)  # (B, T, V)

    @torch.no_grad()
    def generate(self, z: torch.Tensor, max_new_tokens: int = 64, num_beams: int = 1, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None) -> list[str]:
        """Greedy (default), sampling (``do_sample``, ``temperature``, ``top_p``) or beam search (``num_beams``)."""
        z = self._check(z)
        steps = min(max_new_tokens, self.max_length)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        parallel = not reads_tokens(self.decoder.config)  # the inputs hold no true token: all positions at once
        if not do_sample and (num_beams <= 1 or parallel):

            seq = reconstruct_ids(self.decoder, z, steps)  # (B, T): the greedy reconstruction the report scores
            return self.target_tokenizer.batch_decode(seq.tolist(), skip_special_tokens=True)
        b = z.shape[0]
        start = int(self.decoder.config.start_id)
        if parallel:  # every position is sampled at once from z alone
            logits = self.decoder(z, torch.full((b, steps), start, dtype=torch.long))  # (B, T, C)
            logp = self.decoder.full_log_probs(logits) / max(temperature, 1e-6)  # (B, T, V)
            probs = _top_p(torch.softmax(logp, -1).flatten(0, 1), top_p)  # (B*T, V)
            seq = torch.multinomial(probs, 1, generator=gen).view(b, steps)  # (B, T)
            return self.target_tokenizer.batch_decode(seq.tolist(), skip_special_tokens=True)
        if num_beams > 1:
            return self._beam(z, steps, num_beams)
        seq = torch.full((b, 1), start, dtype=torch.long)  # (B, 1)
        for _ in range(steps):
            logp = self.decoder.full_log_probs(self.decoder(z, seq)[:, -1:])[:, 0] / max(temperature, 1e-6)  # (B, V)
            nxt = torch.multinomial(_top_p(torch.softmax(logp, -1), top_p), 1, generator=gen)  # (B, 1)
            seq = torch.cat([seq, nxt], dim=1)
        return self.target_tokenizer.batch_decode(seq[:, 1:].tolist(), skip_special_tokens=True)

    def _beam(self, z: torch.Tensor, steps: int, k: int) -> list[str]:
        b = z.shape[0]
        start = int(self.decoder.config.start_id)
        zk = z.repeat_interleave(k, 0)  # (B*k, D)
        seq = torch.full((b * k, 1), start, dtype=torch.long)  # (B*k, 1)
        score = torch.full((b, k), float("-inf"))
        score[:, 0] = 0.0
        for _ in range(steps):
            logp = self.decoder.full_log_probs(self.decoder(zk, seq)[:, -1:])[:, 0]  # (B*k, V)
            v = logp.shape[-1]
            cand = (score.view(-1, 1) + logp).view(b, k * v)  # (B, k*V)
            score, flat = cand.topk(k, dim=-1)  # (B, k)
            beam, tok = flat // v, flat % v
            rows = (torch.arange(b)[:, None] * k + beam).view(-1)  # (B*k,)
            seq = torch.cat([seq[rows], tok.view(-1, 1)], dim=1)
        best = seq.view(b, k, -1)[:, 0, 1:]  # (B, T)
        return self.target_tokenizer.batch_decode(best.tolist(), skip_special_tokens=True)

    def save(self, out_dir: str | Path, encoder_spec: dict) -> None:
        """Write ``decoder/`` (save_pretrained) and ``probe.json`` (how to rebuild the encoder)."""
        out = Path(out_dir)  # each file whole: a kill while writing leaves no empty or half file
        save_decoder(self.decoder, out / "decoder")
        write_atomic(out / "probe.json", json.dumps(encoder_spec, indent=2))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(-1, descending=True)  # (B, V)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p
    sorted_p = sorted_p * keep
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p)


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


def decoder_config(embed_dim: int, tokenizer, train_ids: torch.Tensor, opts, compact: bool = True):
    """The decoder's config: the encoder's facts (the embedding's width, the targets' vocabulary, the kept ids, the
    start id, the chunk length), the generic decoder settings the chosen decoder honours, the chosen conditioning's
    and inputs' options, the shape its own options set, and which part it is (``probe_part``: its name and own
    options, what :func:`memlab.probes.fitted.load_decoder` rebuilds it from)."""
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
                              probe_part=record)


def build_decoder(embed_dim: int, tokenizer, train_ids: torch.Tensor, opts, compact: bool = True) -> ProbeDecoder:
    """A fresh decoder of the chosen decoder part, built from :func:`decoder_config` and its own options;
    ``tokenizer`` and ``train_ids``: the targets' (the decoder's own tokenizer for ``decoder=pretrained:NAME``)."""
    torch.manual_seed(opts.seed)
    cfg = decoder_config(embed_dim, tokenizer, train_ids, opts, compact)
    part = get_part("decoder", opts.decoder)
    if isinstance(part.impl, DecoderKind):  # its argument (decoder=pretrained:NAME) and its own options
        return part.impl.build(cfg, split_name(opts.decoder)[1], part_options(opts, part))
    return part.impl(cfg, **own_options(part, opts))


def _own(part, values: dict):
    """``part``'s options dataclass from saved ``values`` (its defaults for the rest), or None without options."""
    if part.options is None:
        return None
    names = {f.name for f in fields(part.options)}
    return part.options(**{k: v for k, v in values.items() if k in names})


def load_probe(path: str | Path | None = None, **_) -> FittedProbe:
    """Reload a fitted probe from its run directory (``memlab probe --out DIR``): the encoder from ``probe.json``
    (its kind's and pooling's own options included), the decoder by the part that made it (:func:`load_decoder`)."""

    if path is None:
        raise ModelError("the 'probe' space needs the run directory of a fitted probe")
    p = Path(path)
    if not (p / "probe.json").is_file() or not (p / "decoder" / "config.json").is_file():
        raise ModelError(f"{p}: not a probe run directory (probe.json and decoder/ expected)")
    spec = json.loads((p / "probe.json").read_text())
    saved = spec.get("part_options") or {}
    kw = {}
    kind = encoder_kind(spec["model"])
    if kind is not None and saved and takes(kind.impl.load, "options"):
        kw["options"] = _own(kind, saved)
    encoder = load_encoder(spec["model"], layer=spec.get("layer", -1), pool=spec.get("pool"),
                           final_norm=spec.get("final_norm", False), random_init=spec.get("random_init", False),
                           special_tokens=spec.get("special_tokens", True), dtype=spec.get("dtype", "float32"),
                           max_len=spec.get("max_len"), **kw)
    if spec.get("pool") and saved and hasattr(encoder, "pool_options"):
        encoder.pool_options = _own(get_part("pool", spec["pool"]), saved)
    decoder, target_tokenizer = load_decoder(p / "decoder")
    if target_tokenizer is None and spec.get("target_tokenizer"):  # a scratch decoder's targets in a named tokenizer

        target_tokenizer = load_tokenizer(spec["target_tokenizer"])
    return FittedProbe(encoder, decoder, target_tokenizer)


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
    :class:`~memlab.probes.parts.DecoderKind` whose ``config_type`` its config.json names, else the decoder part its
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
