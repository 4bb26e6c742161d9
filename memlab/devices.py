"""The device a command runs its models on (``--device`` of ``memlab generate`` and ``memlab eval``).

:func:`resolve_device` turns a name into a ``torch.device`` and refuses one this machine lacks (one
clear error, before anything is loaded); inside :func:`running_on`, every model loaded through
:func:`memlab.loading.load_pretrained` and every space built by :func:`memlab.space.build_space` is
placed on that device, so families need no option of their own. Training places models itself
(accelerate), outside such a block.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch

from memlab.errors import MemlabError

_PLACE: ContextVar[torch.device | None] = ContextVar("memlab_device", default=None)


def best_device() -> torch.device:
    """The best device present: a CUDA GPU, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    return torch.device("mps" if mps is not None and mps.is_available() else "cpu")


def native_bf16(device: torch.device | None = None) -> bool:
    """The device multiplies bf16 natively: on CUDA compute capability >= 8.0 (Ampere on), never emulation
    (``torch.cuda.is_bf16_supported()`` also says yes where bf16 is emulated)."""
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0)


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
