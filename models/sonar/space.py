"""SONAR as an :class:`~memlab.space.EmbeddingSpace`, and its loader.

Conventions (those of sonar-space): the encoder reads ``[lang] tokens </s>``
and mean-pools it into one vector; the decoder reads ``</s> [lang] tokens``
and must predict ``tokens </s>`` (the language token after ``</s>`` is forced,
so it is not scored). :meth:`SonarSpace.encode` and
:meth:`SonarSpace.decoder_inputs` take plain token ids (no special tokens, as
:func:`memlab.space.tokenize` gives) and add these themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from memlab.errors import ModelError
from memlab.loading import check_safetensors_weights
from memlab.models.sonar.configuration_sonar import PRESETS, SonarConfig
from memlab.models.sonar.generation import generate_ids
from memlab.models.sonar.modeling_sonar import SonarModel
from memlab.models.sonar.tokenizer import (build_toy_tokenizer, check_layout, check_matches_checkpoint, lang_token_id,
                                          nllb_tokenizer, spm_file)


class SonarSpace(torch.nn.Module):
    """A SONAR text encoder + decoder with its tokenizer; ``dim`` = ``d_model`` (1024 for real SONAR).

    An ``nn.Module`` (its one child is ``model``), so ``.to()``, ``.eval()``,
    ``requires_grad_()`` and ``state_dict()`` act on the weights."""

    def __init__(self, model: SonarModel, tokenizer, lang: str | None = None):
        super().__init__()
        check_layout(tokenizer, model.config.vocab_size)
        self.model = model
        self.tokenizer = tokenizer
        self.dim = int(model.config.d_model)
        self.lang = lang or model.config.default_lang
        lang_token_id(tokenizer, self.lang)  # fail early on an unknown language
        self.eval()  # a pretrained space starts in inference mode (no dropout)

    # -- helpers -----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _lang(self, lang: str | None) -> int:
        return lang_token_id(self.tokenizer, lang or self.lang)

    def _plain(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
            raise ModelError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must be equal (B, T)")
        ids, keep = input_ids.to(self.device), attention_mask.to(self.device).bool()  # (B, T)
        return ids.masked_fill(~keep, self.model.config.pad_token_id), keep, keep.sum(1)  # lens: (B,)

    def with_specials(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lang: str | None = None):
        """Plain right-padded ids ``(B, T)`` -> encoder ids ``[lang] x </s>`` and mask, ``(B, T + 2)``."""
        ids, keep, lens = self._plain(input_ids, attention_mask)
        B = ids.shape[0]
        cfg = self.model.config
        full = torch.full((B, ids.shape[1] + 2), cfg.pad_token_id, dtype=torch.long, device=ids.device)  # (B, T+2)
        full[:, 0] = self._lang(lang)
        full[:, 1:-1] = ids
        rows = torch.arange(B, device=ids.device)
        full[rows, lens + 1] = cfg.eos_token_id
        mask = (torch.arange(full.shape[1], device=ids.device)[None] <= (lens + 1)[:, None]).long()  # (B, T+2)
        return full, mask

    # -- the EmbeddingSpace protocol ----------------------------------------------------------
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lang: str | None = None) -> torch.Tensor:
        """``(B, T)`` plain ids -> ``(B, D)`` sentence embeddings."""
        full, mask = self.with_specials(input_ids, attention_mask, lang)
        return self.model.encode(full, mask).sentence_embedding  # (B, D)

    def decoder_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lang: str | None = None):
        """``(B, T)`` plain ids -> ``(decoder_input_ids, labels)``, both ``(B, T + 2)``:
        inputs ``</s> [lang] x``, labels ``-100 x </s>`` then ``-100`` on padding."""
        ids, keep, lens = self._plain(input_ids, attention_mask)
        B, T = ids.shape
        cfg = self.model.config
        dec = torch.full((B, T + 2), cfg.pad_token_id, dtype=torch.long, device=ids.device)  # (B, T+2)
        dec[:, 0], dec[:, 1], dec[:, 2:] = cfg.eos_token_id, self._lang(lang), ids
        labels = torch.full((B, T + 2), -100, dtype=torch.long, device=ids.device)  # (B, T+2)
        labels[:, 1:-1] = ids.masked_fill(~keep, -100)
        labels[torch.arange(B, device=ids.device), lens + 1] = cfg.eos_token_id
        return dec, labels

    def decode_logits(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits ``(B, T', V)`` of the decoder reading ``z`` (B, D)."""
        return self.model.decode(z.to(self.device), decoder_input_ids.to(self.device))

    def decode_features(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced features ``(B, T', D)`` that :meth:`output_head` maps to :meth:`decode_logits`' logits
        (losses then never hold the ``(B, T', 256k)`` logits)."""
        return self.model.decode(z.to(self.device), decoder_input_ids.to(self.device), head=False)

    def output_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.model.output_head()

    def generate(self, z: torch.Tensor, max_new_tokens: int = 64, lang: str | None = None, **search) -> list[str]:
        """Embeddings ``(B, D)`` -> text; ``search``: ``num_beams``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``length_penalty``."""
        cfg = self.model.config
        prefix = [cfg.eos_token_id, self._lang(lang)]
        max_new_tokens = min(max_new_tokens, cfg.max_position_embeddings - len(prefix))
        was = self.model.training
        self.model.eval()
        try:
            rows = generate_ids(self.model, z.to(self.device), prefix, cfg.eos_token_id, max_new_tokens, **search)
        finally:
            self.model.train(was)
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def encode_text(self, sentences: list[str], lang: str | None = None) -> torch.Tensor:
        """Sentences -> ``(B, D)``; longer sentences are cut to the model's maximum length."""
        from memlab.space import tokenize

        if not sentences:
            raise ModelError("encode_text needs at least one sentence")
        ids, mask = tokenize(self, list(sentences), max_length=self.model.config.max_position_embeddings - 2)
        return self.encode(ids, mask, lang)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encode(input_ids, attention_mask)  # (B, D)

    def save_pretrained(self, path: str | Path) -> None:
        """Model (safetensors) and tokenizer in one folder, loadable with ``load(path)``."""
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))


# -- loading ---------------------------------------------------------------------------------
def toy_space(seed: int = 0, **overrides) -> SonarSpace:
    """A randomly initialised toy SONAR with the toy tokenizer (tests, laptops)."""
    tok = build_toy_tokenizer(vocab_size=PRESETS["toy"]["vocab_size"])
    torch.manual_seed(seed)
    cfg = SonarConfig(**{**PRESETS["toy"], **overrides})
    return SonarSpace(SonarModel(cfg).eval(), tok)


def _tokenizer(spec, fallback: str | None):
    """A tokenizer object as given, else the one at ``spec or fallback``: a SentencePiece model (a ``.model`` file, or
    a folder holding one and no ``tokenizer.json``) becomes the NLLB tokenizer (:func:`nllb_tokenizer`); anything
    else loads with AutoTokenizer (a folder or a hub name)."""
    from memlab.data.tokenizer import load_tokenizer

    if spec is not None and not isinstance(spec, (str, Path)):
        return spec  # a tokenizer object
    name = spec or fallback
    if name is None:
        raise ModelError("a fairseq2 SONAR checkpoint carries no tokenizer: give one, e.g. the space spec "
                         "'sonar:enc.pt,dec.pt,tokenizer=PATH' (an NLLB tokenizer folder, hub name or sentencepiece .model)")
    spm = spm_file(name)
    return nllb_tokenizer(spm) if spm is not None else load_tokenizer(str(name))


SPEC_OPTIONS = ("tokenizer", "lang", "num_heads", "preset")
"""``key=value`` parts a ``sonar:`` spec may carry after its paths (``sonar:enc.pt,dec.pt,tokenizer=DIR``);
``preset`` sizes the random ``toy`` space (``sonar:toy,preset=basic``: SONAR's real shape, random weights)."""


def parse_spec(spec: str) -> tuple[str, dict]:
    """``'enc.pt,dec.pt,tokenizer=DIR,lang=fra_Latn'`` -> ``('enc.pt,dec.pt', {'tokenizer': 'DIR', 'lang': 'fra_Latn'})``."""
    paths, opts = [], {}
    for part in (p.strip() for p in spec.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            paths.append(part)
        elif key.strip() in SPEC_OPTIONS:
            opts[key.strip()] = int(value) if key.strip() == "num_heads" and value.strip().isdigit() else value.strip()
        else:
            raise ModelError(f"unknown option '{key.strip()}' in the SONAR spec '{spec}'; valid: {', '.join(SPEC_OPTIONS)}")
    return ",".join(paths), opts


def from_fairseq2(encoder_path: str, decoder_path: str, tokenizer=None, num_heads: int | None = None, **cfg_overrides) -> SonarSpace:
    """Official fairseq2 checkpoints (``.pt``, read with ``weights_only=True``) -> a memlab SONAR space."""
    from memlab.models.sonar.convert import config_from_state_dict, convert_fairseq2, heads_beside, load_checkpoint_file

    num_heads = num_heads or heads_beside(encoder_path)  # explicit, else a config.json / asset card beside the weights
    sd = {**convert_fairseq2(load_checkpoint_file(encoder_path), "encoder"),
          **convert_fairseq2(load_checkpoint_file(decoder_path), "decoder")}
    return _build(sd, config_from_state_dict(sd, num_heads=num_heads, **cfg_overrides), _tokenizer(tokenizer, None),
                  f"{encoder_path},{decoder_path}")


def _read_port(name: str) -> tuple[dict, dict, Path]:
    """State dict + config.json of a Hugging Face port (local folder, or hub name with a network / warm cache)."""
    p = Path(name)
    if not p.is_dir():
        try:
            from huggingface_hub import snapshot_download

            p = Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.bin"]))
        except Exception as e:
            raise ModelError(f"SONAR port '{name}' is neither a local folder nor reachable on the hub ({type(e).__name__})") from None
    from safetensors.torch import load_file

    from memlab.models.sonar.convert import load_checkpoint_file

    files = sorted(p.glob("*.safetensors"))
    sd = {}
    for f in files or sorted(p.glob("pytorch_model*.bin")):
        sd.update(load_file(str(f)) if f.suffix == ".safetensors" else load_checkpoint_file(str(f)))
    if not sd:
        raise ModelError(f"{p}: no *.safetensors or pytorch_model*.bin weights")
    return sd, json.loads((p / "config.json").read_text()), p


def from_hf_ports(encoder: str, decoder: str | None = None, tokenizer=None, **cfg_overrides) -> SonarSpace:
    """Hugging Face M2M100 ports of the SONAR encoder and decoder -> a memlab SONAR space.

    Without ``decoder``, ``encoder`` must be a full M2M100 port holding both halves."""
    from memlab.models.sonar.convert import config_from_state_dict, convert_hf_port

    esd, ecfg, edir = _read_port(encoder)
    dsd, dcfg, _ = (esd, ecfg, edir) if decoder is None else _read_port(decoder)
    sd = {**convert_hf_port(esd, "encoder"), **convert_hf_port(dsd, "decoder")}
    cfg = config_from_state_dict(sd, num_heads=ecfg.get("encoder_attention_heads"))
    cfg["decoder_attention_heads"] = dcfg.get("decoder_attention_heads", cfg["decoder_attention_heads"])
    for k in ("scale_embedding", "activation_function", "pad_token_id"):
        if k in ecfg:
            cfg[k] = ecfg[k]
    # SONAR reads at most 512 positions; the M2M100 ports declare transformers' default of 1024
    cfg["max_position_embeddings"] = min(int(ecfg.get("max_position_embeddings", SONAR_POSITIONS)), SONAR_POSITIONS)
    cfg.update(cfg_overrides)
    return _build(sd, cfg, _tokenizer(tokenizer, str(edir)), encoder if decoder is None else f"{encoder},{decoder}")


SONAR_POSITIONS = PRESETS["basic"]["max_position_embeddings"]
"""The longest sequence SONAR's text encoder and decoder read (512, special tokens included)."""


def _build(sd: dict, cfg_kwargs: dict, tokenizer, where: str) -> SonarSpace:
    cfg = SonarConfig(**cfg_kwargs)
    check_matches_checkpoint(tokenizer, cfg.vocab_size, where)  # before any weight is placed
    with torch.device("meta"):
        model = SonarModel(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    if missing or unexpected:
        raise ModelError(f"SONAR weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return SonarSpace(model.eval(), tokenizer)


def load(spec: str | None = None, *, decoder: str | None = None, tokenizer=None, lang: str | None = None, **kw) -> SonarSpace:
    """The ``sonar`` space loader.

    ``spec``: ``toy`` (random toy model), a folder saved by :meth:`SonarSpace.save_pretrained`,
    a fairseq2 encoder checkpoint ``enc.pt`` (with ``decoder=dec.pt`` or spec ``enc.pt,dec.pt``,
    and ``tokenizer=``), or a Hugging Face M2M100 port (folder or hub name): an encoder port with
    ``decoder=`` its decoder port, or one port holding both halves. The spec may end with
    ``key=value`` options (:func:`parse_spec`): ``tokenizer=`` (an NLLB tokenizer folder, hub name,
    or SentencePiece ``.model`` file), ``lang=``, ``num_heads=``; so a config's
    ``options.space: sonar:enc.pt,dec.pt,tokenizer=nllb/sentencepiece.bpe.model`` is complete.
    """
    if spec is not None and "=" in spec:  # 'enc.pt,dec.pt,tokenizer=DIR[,lang=...][,num_heads=N]'
        spec, opts = parse_spec(spec)
        tokenizer = tokenizer if tokenizer is not None else opts.pop("tokenizer", None)
        lang = lang or opts.pop("lang", None)
        kw = {**opts, **kw}
        kw.pop("tokenizer", None), kw.pop("lang", None)
    if spec is None or spec == "toy":
        preset = kw.pop("preset", None)
        if preset is not None and preset not in PRESETS:
            raise ModelError(f"unknown SONAR preset '{preset}'; valid: {', '.join(PRESETS)}")
        space = toy_space(**{**PRESETS.get(preset or "toy", {}), **kw})
    elif "," in spec and decoder is None:
        enc, dec = (s.strip() for s in spec.split(",", 1))
        return load(enc, decoder=dec, tokenizer=tokenizer, lang=lang, **kw)
    elif (Path(spec) / "config.json").is_file() and json.loads((Path(spec) / "config.json").read_text()).get("model_type") == SonarConfig.model_type:
        check_safetensors_weights(spec)  # a pickled pytorch_model.bin: one line, never unpickled
        model = SonarModel.from_pretrained(spec, use_safetensors=True).eval()
        tok = _tokenizer(tokenizer, spec)
        if tokenizer is not None:  # a tokenizer other than the one saved beside the weights
            check_matches_checkpoint(tok, model.config.vocab_size, spec)
        space = SonarSpace(model, tok)
    elif spec.endswith((".pt", ".pth")) or Path(spec).is_file():
        if decoder is None:
            raise ModelError("a fairseq2 SONAR encoder checkpoint needs its decoder: decoder=<path> (or spec 'enc.pt,dec.pt')")
        space = from_fairseq2(spec, decoder, tokenizer, **kw)
    else:  # a Hugging Face port: an encoder port plus decoder=, or one full M2M100 port
        space = from_hf_ports(spec, decoder, tokenizer, **kw)
    if lang is not None:
        lang_token_id(space.tokenizer, lang)
        space.lang = lang
    return space
