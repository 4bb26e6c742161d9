"""Devices, and every choice that depends on the hardware.

:func:`resolve_device` turns a name into a ``torch.device`` and refuses one this machine lacks (one
clear error, before anything is loaded); inside :func:`running_on`, every model loaded through
:func:`memlab.loading.load_pretrained` and every space built by :func:`memlab.space.build_space` is
placed on that device, so families need no option of their own. Training places models itself
(accelerate), outside such a block.

The hardware-dependent choices are all made here, and nowhere else:

* :func:`native_bf16`: the device multiplies bf16 natively (CUDA compute capability >= 8.0; a CPU
  with ``avx512_bf16`` or ``amx_bf16``);
* :func:`auto_dtype`: what ``auto`` means for a probe's frozen encoder weights (``--dtype``) and for
  its decoders' compute: bf16 where :func:`native_bf16`, else float32;
* :func:`probe_autocast`: bf16 autocast of probe decoders, where :func:`auto_dtype` is bf16;
* :func:`train_bf16`: training's ``mixed_precision: auto`` and a recipe's frozen-model precompute
  (:func:`frozen_autocast`): bf16 on an accelerator with native bf16; a CPU run stays float32;
* :func:`batched_groups`: probe decoders of one group run as one vmapped pass (else member by
  member) on accelerators;
* :func:`async_copies`: host-to-device copies from pinned memory, without waiting (CUDA only);
* :func:`uses_tf32` and :func:`fused_adamw`: TF32 matmuls (CUDA) and AdamW's fused kernel (CUDA, CPU);
* :func:`launched`: whether this process is one of a launch of several (each then takes its own device).

A switch forces one side of the bf16 and batched choices on any device, so that a CPU runs the
paths a GPU takes (bf16 runs on every CPU, emulated where not native): the environment variable
``MEMLAB_ACCEL`` (:data:`ACCEL_ENV`) = ``native`` (bf16 and batched groups everywhere), ``none``
(float32, no autocast, member by member) or ``auto`` (the default: the hardware decides), and for
tests the context manager :func:`pretend`, which wins over the variable. Pinned copies, TF32 and
fused kernels follow the device alone: a CPU has no side of them to take.
"""

from __future__ import annotations

import contextlib
import functools
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from memlab.errors import MemlabError

_PLACE: ContextVar[torch.device | None] = ContextVar("memlab_device", default=None)

ACCEL_ENV = "MEMLAB_ACCEL"
"""The environment variable that forces a side of the hardware-dependent choices: auto, native or none."""


@dataclass(frozen=True)
class Accel:
    """A forced side of the hardware-dependent choices; None leaves that choice to the hardware."""

    bf16: bool | None = None
    """Native bf16 (:func:`native_bf16`): bf16 compute, autocast, bf16 training under ``mixed_precision: auto``."""
    batched: bool | None = None
    """Probe decoder groups run as one vmapped pass by default (:func:`batched_groups`)."""


ACCEL_SIDES = {"auto": Accel(), "native": Accel(bf16=True, batched=True), "none": Accel(bf16=False, batched=False)}
"""What each value of ``MEMLAB_ACCEL`` forces."""

_FORCED: ContextVar[Accel | None] = ContextVar("memlab_accel", default=None)


def forced() -> Accel:
    """The side forced now: the enclosing :func:`pretend`'s, else ``MEMLAB_ACCEL``'s (unset: ``auto``)."""
    inner = _FORCED.get()
    if inner is not None:
        return inner
    value = os.environ.get(ACCEL_ENV, "").strip().lower() or "auto"
    if value not in ACCEL_SIDES:
        raise MemlabError(f"{ACCEL_ENV}={value}: use auto, native or none")
    return ACCEL_SIDES[value]


@contextmanager
def pretend(bf16: bool | None = None, batched: bool | None = None) -> Iterator[Accel]:
    """Within the block, take the given side of each choice whatever the hardware and ``MEMLAB_ACCEL`` say
    (None: the hardware's own; ``pretend()`` alone: the machine's own choices, the variable ignored)."""
    side = Accel(bf16=bf16, batched=batched)
    token = _FORCED.set(side)
    try:
        yield side
    finally:
        _FORCED.reset(token)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (``/proc/cpuinfo``; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(w for line in text.splitlines() if line.startswith("flags") for w in line.split(":", 1)[-1].split())


def launched() -> bool:
    """Whether this process is one of a launch of several (``WORLD_SIZE`` > 1, as ``accelerate launch`` sets)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def best_device() -> torch.device:
    """The best device present: a CUDA GPU, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    return torch.device("mps" if mps is not None and mps.is_available() else "cpu")


def native_bf16(device: torch.device | str | None = None) -> bool:
    """The device multiplies bf16 natively, or the switch says so: CUDA compute capability >= 8.0 (Ampere on;
    ``torch.cuda.is_bf16_supported()`` also says yes where bf16 is emulated), a CPU with ``avx512_bf16`` or
    ``amx_bf16``, never MPS. None: the current CUDA device."""
    side = forced().bf16
    if side is not None:
        return side
    kind = "cuda" if device is None else torch.device(device).type
    if kind == "cpu":
        return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
    if kind != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def auto_dtype(device: torch.device | str) -> torch.dtype:
    """What ``auto`` means for a probe's encoder weights and decoder compute: bf16 where :func:`native_bf16`,
    else float32."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def probe_autocast(device: torch.device | str):
    """The context probe decoders train and score in: bf16 autocast where :func:`auto_dtype` is bf16 (on any
    device: emulated on a CPU without native bf16 when the switch forces it), else none."""
    dev = torch.device(device)
    if auto_dtype(dev) == torch.bfloat16:
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_bf16(device: torch.device | str) -> bool:
    """Training's ``mixed_precision: auto`` and a recipe's frozen precompute take bf16: on an accelerator with
    native bf16; on a CPU only when the switch forces it (a CPU run is float32 whatever the CPU, so it reads
    the same on every CPU)."""
    side = forced().bf16
    if side is not None:
        return side
    return torch.device(device).type != "cpu" and native_bf16(device)


def mixed_precision(choice: str, device: torch.device | str) -> str:
    """accelerate's ``mixed_precision`` for ``train.mixed_precision``: ``auto`` -> ``bf16`` where
    :func:`train_bf16`, else ``no``; other choices as given."""
    if choice != "auto":
        return choice
    return "bf16" if train_bf16(device) else "no"


def frozen_autocast(device: torch.device | str):
    """The context of a recipe's frozen-model precompute: bf16 autocast where :func:`train_bf16`, else none."""
    dev = torch.device(device)
    if train_bf16(dev):
        return torch.autocast(dev.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batched_groups(device: torch.device | str) -> bool:
    """Probe decoders of one group run as one vmapped pass by default: on accelerators, where one pass instead of
    several small ones saves launches; on a CPU member by member (measured faster on 2 cores: docs/probes.md)."""
    side = forced().batched
    if side is not None:
        return side
    return torch.device(device).type != "cpu"


def async_copies(device: torch.device | str) -> bool:
    """Host-to-device copies go from pinned memory without waiting: to a CUDA device (pinning needs one)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` (a host tensor) on ``device``: pinned and copied without waiting where :func:`async_copies`."""
    if async_copies(device) and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def uses_tf32(device: torch.device | str) -> bool:
    """float32 matmuls and convolutions run in TF32: on CUDA (Ampere on; a no-op before)."""
    return torch.device(device).type == "cuda"


def fused_adamw(device: torch.device | str | None) -> bool:
    """AdamW's fused kernel: on CUDA and on CPU (where the per-parameter loop costs a quarter of a small model's
    step: 7 ms vs 2.5 ms for 3.3M parameters, one thread); None (not placed yet): no."""
    return device is not None and torch.device(device).type in ("cuda", "cpu")


def resolve_device(name: str | None = "auto") -> torch.device:
    """``auto`` (or None): :func:`best_device`; else ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, refused with a
    :class:`~memlab.errors.MemlabError` when this machine does not have it."""
    if name is None or name == "auto":
        return best_device()
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise MemlabError(f"--device {name}: not a device (use auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise MemlabError(f"--device {name}: no CUDA GPU is available on this machine "
                              "(torch.cuda.is_available() is False); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise MemlabError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise MemlabError(f"--device {name}: MPS is not available on this machine; use --device cpu")
    elif dev.type != "cpu":
        raise MemlabError(f"--device {name}: unsupported device type '{dev.type}' (use auto, cpu, cuda, cuda:N or mps)")
    return dev


@contextmanager
def running_on(device: torch.device) -> Iterator[torch.device]:
    """Within the block, loaded models and built spaces go to ``device`` (:func:`place`)."""
    token = _PLACE.set(torch.device(device))
    try:
        yield torch.device(device)
    finally:
        _PLACE.reset(token)


def place(obj):
    """Move ``obj`` (a module, or a space holding modules) to the device of the enclosing :func:`running_on`;
    unchanged outside one."""
    dev = _PLACE.get()
    if dev is None:
        return obj
    if isinstance(obj, torch.nn.Module):
        return obj.to(dev)
    for v in vars(obj).values():
        if isinstance(v, torch.nn.Module):
            v.to(dev)
    return obj
