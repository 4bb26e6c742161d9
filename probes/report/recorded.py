"""A probe run's recorded settings checked against each other whenever the run is read again.

``memlab probe --out RUN`` records how it was made in three files: ``probe.json`` (how its encoder is built again),
``report.json`` (every option, and the encoder as it was loaded: the layer resolved, the pooling) and the saved
decoder's ``decoder/config.json`` (the part that made it and its options). A reader trusts one of them for each
setting; if a file was edited by hand, or the folder put together from two runs, one instrument would read one layer
and another a different one. :func:`check_recorded` refuses such a run in one line. JSON only: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from memlab.errors import ConfigError


def read_json(path: Path, what: str, flag: str = "--probe") -> dict:
    """A JSON object of a probe run (one ConfigError line when it is missing, unreadable or not an object)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{flag} {path.parent}: not a probe run folder ({path.name} missing; give the --out "
                          "folder of memlab probe)") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag}: {path} cannot be read ({' '.join(str(e).split())[:100]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{flag}: {path} is not {what}")
    return data


def resolved_layer(value: int, num_layers: int) -> int:
    """A layer as given (negative from the end) -> its index (0 = embeddings, k = output of block k - 1)."""
    return value + num_layers + 1 if value < 0 else value


ENCODER_RECORDS = (("model", "model"), ("layer", "layer"), ("pool", "pool"), ("final_norm", "final_norm"),
                   ("random_init", "random_init"), ("special_tokens", "special_tokens"), ("dtype", "encoder_dtype"))
"""(probe.json's key, the report's option): how the run's encoder was built, written in both files."""
DECODER_RECORDS = ("conditioning", "inputs", "bag_head")
"""The decoder's config entries that the report's description of the decoder repeats."""


def _same(a, b) -> bool:
    return a == b or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b))


def recorded_mismatch(spec: dict, rep: dict, config: dict | None) -> str | None:
    """Where a probe run's files disagree about its settings (probe.json, the report's options and encoder, the
    saved decoder's config), as a phrase; None when they agree. A run edited by hand, or assembled from two runs,
    would otherwise be read at one layer by one instrument and at another by the other."""
    opts, enc = rep.get("options") or {}, rep.get("encoder") or {}
    for key, option in ENCODER_RECORDS:
        if key in spec and option in opts and not _same(spec[key], opts[option]):
            return f"probe.json has {key} {spec[key]!r} but report.json's options have {option} {opts[option]!r}"
    layer, layers = spec.get("layer"), enc.get("num_layers")
    if isinstance(layer, int) and isinstance(layers, int) and isinstance(enc.get("layer"), int) and \
            resolved_layer(layer, layers) != enc["layer"]:
        return (f"probe.json has layer {layer} (layer {resolved_layer(layer, layers)} of {layers}) but report.json's "
                f"encoder was read at layer {enc['layer']}")
    if spec.get("pool") and enc.get("pool") and spec["pool"] != enc["pool"]:
        return f"probe.json has pool {spec['pool']!r} but report.json's encoder pooled by {enc['pool']!r}"
    if not config:
        return None
    part = config.get("probe_part") or {}
    if part:
        saved = str(part.get("name", "")).partition(":")[0]  # a part's argument (pretrained:NAME) aside
        made = (rep.get("decoder") or {}).get("kind")
        for where, name in (("report.json's options have decoder", opts.get("decoder")),
                            ("report.json's decoder is", made)):
            if name and str(name).partition(":")[0] != saved:
                return f"decoder/config.json was saved by decoder part {saved!r} but {where} {name!r}"
        theirs = {**opts, **(opts.get("part_options") or {})}
        for k, v in (part.get("options") or {}).items():
            if k in theirs and not _same(theirs[k], v):
                return f"decoder/config.json has {k} {v!r} but report.json's options have {k} {theirs[k]!r}"
    described = rep.get("decoder") or {}
    for k in DECODER_RECORDS:
        if k in config and k in described and not _same(config[k], described[k]):
            return f"decoder/config.json has {k} {config[k]!r} but report.json's decoder has {k} {described[k]!r}"
    return None


def check_recorded(folder: str | Path, flag: str = "--probe") -> None:
    """One ConfigError line when the files of the probe run in ``folder`` disagree about its settings
    (:func:`recorded_mismatch`); a file that is not there is left to the reader that needs it."""
    p = Path(folder)
    files = {}
    for name in ("probe.json", "report.json", "decoder/config.json"):
        f = p / name
        if f.is_file():
            files[name] = read_json(f, f"the probe run's {name}", flag)
    if "probe.json" not in files or "report.json" not in files:
        return
    why = recorded_mismatch(files["probe.json"], files["report.json"], files.get("decoder/config.json"))
    if why is not None:
        raise ConfigError(f"{flag} {folder}: the run's recorded settings disagree ({why}); a run edited by hand or "
                          "put together from two runs is not read again: run the probe again")
