"""Progress of long work: a tqdm bar on a terminal, plain lines in a log.

:func:`progress_bar` is what the training loop, the probe's encoder passes
and its decoder fits use. On a terminal (stderr is a TTY) it is a tqdm bar.
Off a terminal (a log file, a job scheduler, ``nohup``) a bar's carriage
returns would be noise, so it prints plain lines to stderr instead: one when
a stage starts, one every :data:`EVERY_S` seconds while it runs, and one when
it ends, so a log shows that work goes on::

    memlab: encode train: started (8000)
    memlab: encode train: 2400/8000 (30%), 61 s
    memlab: encode train: done 8000/8000, 198 s

``show=True`` asks for the bar even off a terminal (``--progress``);
``show=False`` turns both off (``train.progress=false``).
"""

from __future__ import annotations

import os
import sys
import time

EVERY_S = float(os.environ.get("MEMLAB_PROGRESS_EVERY", "60") or 60)
"""Seconds between two plain progress lines of one stage (``MEMLAB_PROGRESS_EVERY`` sets it)."""


class PlainProgress:
    """The part of tqdm's interface that memlab uses (``update``, ``set_postfix``, ``close``), as plain lines."""

    def __init__(self, total: int | None, desc: str, initial: int = 0, every: float | None = None, stream=None):
        self.total, self.desc, self.n = total, desc, initial
        self.every = EVERY_S if every is None else every
        self.stream = stream
        self.postfix = ""
        self.closed = False
        self.t0 = self.last = time.monotonic()
        self._say(f"started ({total})" if total else "started")

    def _say(self, what: str) -> None:
        print(f"memlab: {self.desc}: {what}", file=self.stream or sys.stderr, flush=True)

    def _count(self) -> str:
        if not self.total:
            return str(self.n)
        return f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every and not self.closed:
            self.last = now
            self._say(f"{self._count()}, {now - self.t0:.0f} s{self.postfix}")

    def set_postfix(self, **values) -> None:
        self.postfix = "".join(f", {k}={v}" for k, v in values.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._say(f"done {self._count().split(' (')[0]}, {time.monotonic() - self.t0:.0f} s{self.postfix}")


def on_terminal() -> bool:
    """Whether progress (written to stderr) reaches a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def progress_bar(total: int | None, desc: str, show: bool | None = None, initial: int = 0, leave: bool = False,
                 enabled: bool = True):
    """A tqdm bar (on a terminal, or ``show=True``), plain lines (:class:`PlainProgress`, off a terminal with
    ``show=None``) or nothing (``show=False`` or not ``enabled``, e.g. on a process other than the main one)."""
    from tqdm.auto import tqdm

    if not enabled or show is False:
        return tqdm(total=total, disable=True)
    if show or on_terminal():
        return tqdm(total=total, initial=initial, desc=desc, leave=leave, dynamic_ncols=True)
    return PlainProgress(total, desc, initial)
