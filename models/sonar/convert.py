"""State-dict conversion into memlab's SONAR layout.

Three sources:

* **fairseq2 checkpoints** (sonar-space's ``text_sonar_basic_encoder.pt`` /
  ``..._decoder.pt``, and state dicts of models built by sonar-space's
  factories): keys like ``encoder_frontend.embed.weight``,
  ``encoder.layers.0.self_attn.output_proj.weight``, ``ffn.inner_proj``,
  ``decoder_frontend.embed.weight``, ``final_proj.weight``. fairseq2's NLLB
  tokenizer puts the control tokens in the order ``<pad>, <unk>, <s>, </s>``,
  Hugging Face's (and memlab's) in ``<s>, <pad>, </s>, <unk>``: embedding rows
  0-3 are permuted (:data:`FS2_TO_HF`).
* **legacy fairseq checkpoints** (``{"state_dict": ...}`` with ``embed_tokens``,
  ``fc1``, ``out_proj``): already in fairseq/HF token order.
* **Hugging Face M2M100 ports** (e.g. ``cointegrated/SONAR_200_text_encoder``,
  an ``M2M100Encoder``; decoder ports saved as M2M100 models): M2M100 names are
  memlab's names, so only prefixes change.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

import torch

from memlab.errors import ModelError

FS2_TO_HF = {0: 1, 1: 3, 2: 0, 3: 2}
"""fairseq2 control-token id -> Hugging Face / memlab id (pieces and language tokens keep their ids)."""

_LAYER_MAP = [  # fairseq2 suffix inside a layer -> memlab suffix
    (r"self_attn\.output_proj\.", "self_attn.out_proj."),
    (r"encoder_decoder_attn\.output_proj\.", "encoder_attn.out_proj."),
    (r"encoder_decoder_attn\.", "encoder_attn."),
    (r"encoder_decoder_attn_layer_norm\.", "encoder_attn_layer_norm."),
    (r"ffn\.inner_proj\.", "fc1."),
    (r"ffn\.output_proj\.", "fc2."),
    (r"ffn_layer_norm\.", "final_layer_norm."),
]


def fs2_ids_to_hf(ids: torch.Tensor) -> torch.Tensor:
    """Map fairseq2 token ids to memlab's (only the four control tokens move)."""
    out = ids.clone()
    for a, b in FS2_TO_HF.items():
        out[ids == a] = b
    return out


def _permute_rows(emb: torch.Tensor) -> torch.Tensor:
    out = emb.clone()
    for fs2, hf in FS2_TO_HF.items():
        out[hf] = emb[fs2]
    return out


def _unwrap(sd: Mapping) -> dict:
    sd = dict(sd)
    for key in ("model", "state_dict"):
        if key in sd and isinstance(sd[key], Mapping):
            sd = dict(sd[key])
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _layer_key(rest: str) -> str:
    for pat, rep in _LAYER_MAP:
        if re.match(pat, rest):
            return re.sub("^" + pat, rep, rest)
    return rest  # q_proj/k_proj/v_proj, self_attn_layer_norm keep their names


def convert_fairseq2(state_dict: Mapping, part: str) -> dict[str, torch.Tensor]:
    """A fairseq2 (or legacy fairseq) SONAR ``part`` ('encoder' or 'decoder') -> memlab keys ``{part}.*``."""
    if part not in ("encoder", "decoder"):
        raise ModelError(f"part must be 'encoder' or 'decoder', got '{part}'")
    sd = _unwrap(state_dict)
    fs2_embed = f"{part}_frontend.embed.weight"
    out: dict[str, torch.Tensor] = {}
    if fs2_embed in sd:  # fairseq2 layout
        for k, v in sd.items():
            if k == fs2_embed:
                out[f"{part}.embed_tokens.weight"] = _permute_rows(v)
            elif k.startswith(f"{part}.layers."):
                n, rest = k[len(f"{part}.layers."):].split(".", 1)
                out[f"{part}.layers.{n}.{_layer_key(rest)}"] = v
            elif k.startswith("layer_norm.") and part == "encoder":  # the encoder model's final LayerNorm
                out["encoder." + k] = v
            elif k.startswith(f"{part}.layer_norm."):
                out[k] = v
            elif k == "final_proj.weight":
                if not torch.equal(v, sd[fs2_embed]):
                    raise ModelError("this SONAR decoder has an untied final_proj; memlab ties it to the embedding as sonar-space does")
            elif k.endswith("_float_tensor") or k.endswith(".freqs"):
                continue  # position buffers
            else:
                raise ModelError(f"unexpected key '{k}' in a fairseq2 SONAR {part} checkpoint")
    elif "embed_tokens.weight" in sd:  # legacy fairseq layout (already in fairseq token order)
        for k, v in sd.items():
            if k in ("version",) or k.startswith("embed_positions") or k == "output_projection.weight":
                continue
            k = re.sub(r"^layers\.(\d+)\.encoder_attn\.", r"layers.\1.encoder_attn.", k)
            out[f"{part}.{k}"] = v
    else:
        raise ModelError(f"not a SONAR {part} checkpoint: expected '{fs2_embed}' (fairseq2) or 'embed_tokens.weight' (fairseq); "
                         f"found keys like {', '.join(list(sd)[:4])}")
    return out


def convert_hf_port(state_dict: Mapping, part: str) -> dict[str, torch.Tensor]:
    """An M2M100 port (``M2M100Encoder``, ``M2M100Model`` or ``M2M100ForConditionalGeneration``) -> ``{part}.*`` keys."""
    sd = _unwrap(state_dict)
    out: dict[str, torch.Tensor] = {}
    head = None
    for k, v in sd.items():
        k2 = k[len("model."):] if k.startswith("model.") else k
        if k2.startswith("embed_positions") or ".embed_positions." in k2:
            continue
        if k2 == "lm_head.weight":
            head = v
            continue
        if k2 == "shared.weight":
            out.setdefault(f"{part}.embed_tokens.weight", v)
            continue
        if k2.startswith(("encoder.", "decoder.")):
            if not k2.startswith(part + "."):
                continue  # the other half of a full M2M100 (e.g. a dummy encoder in a decoder port)
            k2 = k2[len(part) + 1:]
        out[f"{part}.{k2}"] = v
    if f"{part}.embed_tokens.weight" not in out:
        raise ModelError(f"no {part} embedding in this M2M100 port (keys like {', '.join(list(sd)[:4])})")
    if head is not None and part == "decoder" and not torch.equal(head, out["decoder.embed_tokens.weight"]):
        raise ModelError("this decoder port has an untied lm_head; SONAR's output projection is tied to its embedding")
    return out


def known_heads() -> dict[int, int]:
    """Width -> attention heads of the published SONAR configurations (memlab's presets other than ``toy``)."""
    from memlab.models.sonar.configuration_sonar import PRESETS

    return {p["d_model"]: p["encoder_attention_heads"] for name, p in PRESETS.items() if name != "toy"}


HEAD_KEYS = ("num_heads", "encoder_attention_heads", "num_attention_heads", "model_num_heads", "num_encoder_attn_heads")


def heads_beside(weights_path: str) -> int | None:
    """The head count written beside a checkpoint: ``config.json`` (a heads key) or a fairseq2 asset card
    (``*.yaml`` with ``num_heads`` or ``model_arch: basic``) in the same folder; None when there is none."""
    import json

    import yaml

    folder = Path(weights_path).parent
    cards: list[dict] = []
    if (folder / "config.json").is_file():
        try:
            cards.append(json.loads((folder / "config.json").read_text()))
        except ValueError:
            raise ModelError(f"{folder / 'config.json'} is not valid JSON") from None
    for card in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml")):
        try:
            data = yaml.safe_load(card.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(data, dict):
            cards.append(data)
    from memlab.models.sonar.configuration_sonar import PRESETS

    for c in cards:
        for k in HEAD_KEYS:
            if isinstance(c.get(k), int) and c[k] > 0:
                return c[k]
        arch = c.get("model_arch")
        if isinstance(arch, str) and arch in PRESETS and arch != "toy":
            return PRESETS[arch]["encoder_attention_heads"]
    return None


def config_from_state_dict(sd: Mapping[str, torch.Tensor], **overrides) -> dict:
    """Sizes of a converted (memlab-keyed) state dict, as SonarConfig kwargs.

    Heads cannot be read off the weights: ``num_heads`` (given, or read from a
    card beside the weights by the caller) is used, else the head count of the
    published SONAR configuration of that width (:func:`known_heads`); any
    other width without ``num_heads`` is refused.
    """
    cfg: dict = {}
    for part in ("encoder", "decoder"):
        emb = sd.get(f"{part}.embed_tokens.weight")
        if emb is None:
            continue
        cfg["vocab_size"], cfg["d_model"] = emb.shape
        layers = {int(m.group(1)) for k in sd if (m := re.match(rf"{part}\.layers\.(\d+)\.", k))}
        cfg[f"{part}_layers"] = len(layers)
        if layers:
            cfg[f"{part}_ffn_dim"] = sd[f"{part}.layers.0.fc1.weight"].shape[0]
    if "d_model" not in cfg:
        raise ModelError("no embedding found in the state dict")
    heads = overrides.pop("num_heads", None) or known_heads().get(cfg["d_model"])
    if heads is None:
        known = ", ".join(f"{d} ({h} heads)" for d, h in known_heads().items())
        raise ModelError(f"SONAR width d_model={cfg['d_model']} is not a known SONAR configuration (known: {known}) and "
                         "the head count is not stored in the weights: pass num_heads=N, or put a config.json with "
                         "num_heads beside the checkpoint")
    cfg.setdefault("encoder_attention_heads", heads)
    cfg.setdefault("decoder_attention_heads", heads)
    cfg.update(overrides)
    return cfg


def load_checkpoint_file(path: str) -> dict:
    """Read a ``.pt`` (``weights_only=True``) or ``.safetensors`` state dict."""
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"checkpoint not found: {path}") from None
    except Exception as e:  # an unpickling error names a forbidden global: the file is not a plain state dict
        raise ModelError(f"{path}: cannot be read as a weights-only checkpoint ({str(e).splitlines()[0][:160]})") from None
