"""Placing a frozen encoder bigger than one device: accelerate's big-model inference.

A transformers model is loaded whole on its device (``device_map=none``) or placed by accelerate
(``device_map=auto``): its blocks fill the GPUs, then host memory, then an offload folder on disk, within a
memory budget (``max_memory``, e.g. ``cpu:200MB,0:20GiB``; default: each device's free memory). Offloaded
blocks keep their weights on the ``meta`` device; accelerate's hooks bring them to the main device for their
forward pass and drop them after it, and move every block's inputs to where the block runs. Weights go from
the files straight to their place, shard by shard: no second full copy is made in host memory.

By default (``device_map`` unset) the model is placed by accelerate when it does not fit: when its weights, in
the dtype they are loaded in (summed from the safetensors headers, else counted on a ``meta``-device build of
its config), take more than :data:`FIT_SHARE` of the device's free memory (a GPU's free memory, or the host's
available memory for the CPU). On the CPU, accelerate then uses host memory up to that share and the disk past it.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from accelerate import dispatch_model, infer_auto_device_map
from transformers import AutoModel

from memlab.errors import ConfigError
from memlab.loading import safetensors_files
from memlab.probes.parts import encoder_kind

DEVICE_MAPS = ("auto", "none")
FIT_SHARE = 0.8
"""Share of a device's free memory the weights may take and still count as fitting (the rest: activations)."""

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Placement:
    """How a transformers encoder is placed: ``device_map`` (None: ``auto`` when it does not fit ``device``),
    ``max_memory`` (a budget string or mapping, see :func:`parse_max_memory`) and ``offload_dir`` (the folder of
    disk-offloaded weights; default: a temporary folder removed at exit)."""

    device_map: str | None = None
    max_memory: str | dict | None = None
    offload_dir: str | None = None

    @property
    def default(self) -> bool:
        return self.device_map is None and self.max_memory is None and self.offload_dir is None


def parse_size(text, what: str = "max_memory") -> int:
    """``200MB``, ``20GiB``, ``1.5GB`` or a number of bytes -> bytes (MB = 10^6 bytes, MiB = 2^20)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise ConfigError(f"'{what}': {text!r} is not a size (use bytes or a number with B, KB, MB, GB, TB, KiB, "
                          "MiB, GiB or TiB, e.g. 200MB)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def _device_key(key) -> int | str:
    """A budget's device: ``cpu``, ``mps``, a GPU index (``0``, ``cuda:0``); checked to exist on this machine."""
    k = str(key).strip().lower()
    if k.startswith("cuda:"):
        k = k[5:]
    if k.isdigit():
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(k) >= n:
            raise ConfigError(f"'max_memory': GPU {k} is not on this machine (it has {n} CUDA GPU(s)); budget "
                              "cpu and the GPUs it has")
        return int(k)
    if k == "cpu":
        return "cpu"
    if k == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError("'max_memory': mps is not available on this machine")
        return "mps"
    raise ConfigError(f"'max_memory': unknown device {key!r} (use cpu, mps, or a GPU index such as 0 or cuda:0; "
                      "the disk takes what the others do not)")


def parse_max_memory(value) -> dict[int | str, int] | None:
    """``"cpu:200MB,0:20GiB"`` or a mapping ``{cpu: 200MB, 0: 20GiB}`` -> ``{"cpu": 200000000, 0: 21474836480}``
    (accelerate's ``max_memory``); None stays None. A malformed budget is one ConfigError."""
    if value is None:
        return None
    if isinstance(value, dict):
        items = list(value.items())
    else:
        parts = [p for p in str(value).split(",") if p.strip()]
        if not parts or any(":" not in p for p in parts):
            raise ConfigError(f"'max_memory' takes DEVICE:SIZE pairs separated by commas (e.g. cpu:200MB,0:20GiB), "
                              f"got {value!r}")
        items = [p.rsplit(":", 1) for p in parts]
    out: dict[int | str, int] = {}
    for k, v in items:
        dev = _device_key(k)
        if dev in out:
            raise ConfigError(f"'max_memory' names {k!r} twice")
        out[dev] = parse_size(v)
    if not out:
        raise ConfigError("'max_memory' is empty; give at least one DEVICE:SIZE (e.g. cpu:200MB)")
    return out


def check(placement: Placement, model: str = "") -> None:
    """One ConfigError naming the option when a placement makes no sense (before anything loads)."""
    if placement.device_map is not None and placement.device_map not in DEVICE_MAPS:
        raise ConfigError(f"'device_map' must be auto or none (or unset: auto when the model does not fit the "
                          f"device), got {placement.device_map!r}")
    parse_max_memory(placement.max_memory)
    if placement.device_map == "none":
        for k in ("max_memory", "offload_dir"):
            if getattr(placement, k) is not None:
                raise ConfigError(f"'{k}' places a model by accelerate; it does not apply with device_map=none")
    if placement.offload_dir is not None and Path(placement.offload_dir).exists() \
            and not Path(placement.offload_dir).is_dir():
        raise ConfigError(f"'offload_dir': {placement.offload_dir} exists and is not a folder")
    kind = encoder_kind(model)
    if kind is not None and kind.impl.source is None and placement.device_map != "none" and not placement.default:
        raise ConfigError("'device_map', 'max_memory' and 'offload_dir' place transformers models, not "
                          f"{kind.name} encoders")


def _header_elements(path: Path, skip: tuple[str, ...]) -> int:
    """Number of weights in a safetensors file (its JSON header alone is read), keys under ``skip`` left out."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > path.stat().st_size - 8:  # a damaged length: never allocate what the file cannot hold
            raise ValueError(f"{path}: safetensors header longer than the file")
        header = json.loads(f.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items()
               if k != "__metadata__" and not k.startswith(skip))


def weights_bytes(folder: str, gguf_file: str | None, config, dtype: torch.dtype) -> int | None:
    """Bytes the model's weights take in ``dtype``: from the safetensors headers of a local folder (a causal LM's
    head, which the encoder does not read, left out), else counted on a ``meta``-device build of ``config``;
    None when neither can be read (the loader then names what is wrong)."""

    size = torch.empty((), dtype=dtype).element_size()
    files = [] if gguf_file else safetensors_files(folder)
    if files and all(f.is_file() for f in files):
        try:
            return size * sum(_header_elements(f, ("lm_head.",)) for f in files)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, struct.error):
            pass  # a damaged header: the loader names it; count the config's weights

    try:
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    except Exception:  # noqa: BLE001  (a config transformers cannot build: its load fails with the reason)
        return None
    return size * sum(t.numel() for t in model.parameters())


def _host_share() -> int:
    """How many processes of this host share its memory (``LOCAL_WORLD_SIZE`` of a distributed launch, else 1)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def free_bytes(device: str | torch.device) -> int | None:
    """Free memory of ``device``: a GPU's (``torch.cuda.mem_get_info``), the host's available memory for the CPU
    (``MemAvailable``, split between the processes of a distributed launch on this host); None where unknown
    (then the model counts as fitting)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev.index if dev.index is not None else torch.cuda.current_device())[0])
    if dev.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // _host_share()
        except (OSError, ValueError, IndexError):
            pass
        try:
            import psutil  # optional: hosts without /proc
        except ImportError:
            return None
        return int(psutil.virtual_memory().available) // _host_share()
    return None


_TEMP_DIRS: list[str] = []


def _temp_offload_dir() -> str:
    d = tempfile.mkdtemp(prefix="memlab-offload-")
    if not _TEMP_DIRS:
        atexit.register(lambda: [shutil.rmtree(x, ignore_errors=True) for x in _TEMP_DIRS])
    _TEMP_DIRS.append(d)
    return d


def plan(placement: Placement, device: str | torch.device, size: Callable[[], int | None]) -> dict | None:
    """The ``from_pretrained`` arguments that place a model by accelerate (``device_map``, ``max_memory``,
    ``offload_folder``), or None to load it whole on ``device``; ``size()``: the model's bytes (called only when
    the default decides by size)."""
    check(placement)
    budget = parse_max_memory(placement.max_memory)
    dev = torch.device(device)
    if placement.device_map == "none":
        return None
    if placement.device_map is None and budget is None:  # the default: placed only when it does not fit
        free = free_bytes(dev)
        need = size() if free is not None else None
        if need is None or need <= FIT_SHARE * free:
            return None
        if dev.type == "cpu":  # host memory up to the share, the disk past it (the GPUs stay out of a CPU run)
            budget = {"cpu": int(FIT_SHARE * free)}
    elif budget is None and dev.type == "cpu":
        free = free_bytes(dev)
        budget = {"cpu": int(FIT_SHARE * free)} if free is not None else None
    folder = placement.offload_dir or _temp_offload_dir()
    Path(folder).mkdir(parents=True, exist_ok=True)
    return {"device_map": "auto", "max_memory": budget, "offload_folder": folder}


def dispatch(model: torch.nn.Module, kw: dict) -> torch.nn.Module:
    """Place an already built model (``random_init``) by the plan ``kw``: accelerate infers the map under its
    budget and dispatches it (disk-offloaded blocks written to the offload folder)."""

    device_map = infer_auto_device_map(model, max_memory=kw["max_memory"],
                                       no_split_module_classes=list(getattr(model, "_no_split_modules", None) or []),
                                       dtype=next(model.parameters()).dtype)
    model = dispatch_model(model, device_map=device_map, offload_dir=kw["offload_folder"])
    model.hf_device_map = dict(device_map)
    return model


def is_placed(model: torch.nn.Module) -> bool:
    """Whether accelerate placed the model with hooks (its weights may lie on several devices, the CPU or the
    disk; it must not be moved)."""
    return hasattr(model, "_hf_hook") and bool(getattr(model, "hf_device_map", None))


def main_device(model: torch.nn.Module) -> torch.device:
    """Where a model's inputs go: the main device of an accelerate-placed model (where offloaded blocks run),
    else the device of its first weight."""
    hook = getattr(model, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is not None:
        return torch.device(dev)
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def module_device(model: torch.nn.Module, module: torch.nn.Module) -> str | None:
    """Where an accelerate-placed model keeps ``module``'s weights (a GPU index, ``cpu`` or ``disk``): the entry
    of its ``hf_device_map`` that holds the module; None when not placed."""
    dmap = getattr(model, "hf_device_map", None) or {}
    name = next((n for n, m in model.named_modules() if m is module), None)
    if name is None or not dmap:
        return None
    for key in sorted(dmap, key=len, reverse=True):  # the longest entry that is the module or one of its parents
        if key == "" or name == key or name.startswith(key + "."):
            return str(dmap[key])
    return None


def describe(model: torch.nn.Module, blocks: torch.nn.ModuleList | None = None) -> dict | None:
    """The placement of an accelerate-placed model for the report: modules per device, the main device and,
    with ``blocks``, where each block's weights lie; None for a model on one device."""
    if not is_placed(model):
        return None
    counts: dict[str, int] = {}
    for v in model.hf_device_map.values():
        counts[str(v)] = counts.get(str(v), 0) + 1
    out = {"device_map": "auto", "main_device": str(main_device(model)), "modules": counts}
    if blocks is not None:
        out["blocks"] = [module_device(model, b) for b in blocks]
    return out
