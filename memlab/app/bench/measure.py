"""Timing, peak memory and cost-exponent helpers for the benchmarks."""

from __future__ import annotations

import gc
import os
import threading
import time
from statistics import median
from typing import Callable

import numpy as np
import torch

from memlab.devices import resolve_device


def sync(device: torch.device | str | None = None) -> None:
    """Wait for the device's queued work (CUDA, MPS) so that a timer reads the work, not its launch."""
    kind = None if device is None else torch.device(device).type
    if torch.cuda.is_available() and kind in (None, "cuda"):
        torch.cuda.synchronize()
    elif kind == "mps":
        torch.mps.synchronize()


class PeakMemory:
    """Peak memory of a block: CUDA's allocator peak on a GPU, else the process RSS sampled every
    millisecond (a coarse but honest number on CPU), minus the value before the block."""

    def __init__(self, device: torch.device | str = "cpu", interval: float = 0.001):
        self.device = torch.device(device)
        self.interval = interval
        self.peak_bytes = 0

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        import psutil

        self._proc = psutil.Process(os.getpid())
        self._base = self._proc.memory_info().rss
        self._max = self._base
        self._stop = threading.Event()

        def sample():
            while not self._stop.is_set():
                self._max = max(self._max, self._proc.memory_info().rss)
                time.sleep(self.interval)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self._stop.set()
            self._thread.join()
            self._max = max(self._max, self._proc.memory_info().rss)
            self.peak_bytes = self._max - self._base
        return False


def time_call(fn: Callable[[], object], repeats: int = 3, warmup: int = 1, device="cpu") -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return median(times)


def cost_exponent(lengths, costs) -> float:
    """Slope of log(cost) against log(length): cost ~ length^exponent (least squares)."""
    x, y = np.log(np.asarray(lengths, float)), np.log(np.asarray(costs, float))
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def device_of(name: str | None = None) -> torch.device:
    """``--device`` of ``memlab bench``: None or auto is the best device present; a device this machine lacks is
    refused (:func:`memlab.devices.resolve_device`)."""
    return resolve_device(name or "auto")
