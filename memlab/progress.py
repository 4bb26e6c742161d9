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

A :class:`WorkLine` is one line for one unit of work (a quickstart entry): on a
terminal the unit's bars are drawn on that line, prefixed with its label, and
its result replaces it, so a finished run shows one line per unit. Inside a
memlab command (:func:`folding`) the libraries' own bars (transformers'
"Loading weights", its GGUF de-quantisation) are drawn as memlab's
(:func:`library_bar`): on a terminal a bar that appears only when the work
takes more than a second, in a log plain lines only when it runs longer than
:data:`EVERY_S`.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

from tqdm.auto import tqdm

EVERY_S = float(os.environ.get("MEMLAB_PROGRESS_EVERY", "60") or 60)
"""Seconds between two plain progress lines of one stage (``MEMLAB_PROGRESS_EVERY`` sets it)."""

LIBRARY_DELAY_S = 1.0
"""On a terminal, a library's bar shows only once its work has run this long."""

LIBRARY_NAMES = {"Loading weights": "load weights", "Writing model shards": "write weights",
                 "Converting and de-quantizing GGUF tensors...": "de-quantize GGUF tensors"}
"""The libraries' bar descriptions, as memlab names the stage."""


class PlainProgress:
    """The part of tqdm's interface that memlab uses (``update``, ``set_postfix``, ``close``, iteration), as plain
    lines. ``quiet``: no start line, and a done line only when a progress line was printed (a library's stage,
    silent unless it runs longer than ``every``)."""

    def __init__(self, total: int | None, desc: str, initial: int = 0, every: float | None = None, stream=None,
                 iterable=None, quiet: bool = False):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.n, self.iterable = total, desc, initial, iterable
        self.every = EVERY_S if every is None else every
        self.stream = stream
        self.postfix = ""
        self.closed = False
        self.quiet = self.silent = quiet
        self.t0 = self.last = time.monotonic()
        if not quiet:
            self._say(f"started ({total})" if total else "started")

    def _say(self, what: str) -> None:
        self.silent = False
        print(f"memlab: {self.desc}: {what}", file=self.stream or sys.stderr, flush=True)

    def _count(self) -> str:
        if not self.total:
            return str(self.n)
        return f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)"

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every and not self.closed:
            self.last = now
            self._say(f"{self._count()}, {now - self.t0:.0f} s{self.postfix}")

    def set_postfix(self, **values) -> None:
        self.postfix = "".join(f", {k}={v}" for k, v in values.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or self.desc

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if not (self.quiet and self.silent):
                self._say(f"done {self._count().split(' (')[0]}, {time.monotonic() - self.t0:.0f} s{self.postfix}")


def on_terminal() -> bool:
    """Whether progress (written to stderr) reaches a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


_line: WorkLine | None = None
"""The work line open on the terminal, if any."""
_drawn = False
"""Whether a status or a bar is drawn on the terminal's current line (no newline after it yet)."""
_folding = False
"""Whether the libraries' bars are drawn as memlab's (inside a memlab command: :func:`folding`)."""


def _terminal_width(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80


def _clear_drawn(stream) -> None:
    """Erase the status or bar drawn on the terminal's current line, so that a line printed now starts clean."""
    global _drawn
    if _drawn:
        _drawn = False
        stream.write("\r\x1b[K")
        stream.flush()


class _Guarded:
    """sys.stdout or sys.stderr while a work line is open: a line printed by anything else than the progress (a
    note, a warning) first erases the status drawn on the line. Progress draws start with a carriage return."""

    def __init__(self, stream, terminal):
        self._stream, self._terminal = stream, terminal

    def write(self, s: str) -> int:
        global _drawn
        if s.startswith("\r"):
            _drawn = True
        elif s:
            _clear_drawn(self._terminal)
        return self._stream.write(s)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class WorkLine:
    """One line for one unit of work: ``LABEL WHAT`` when it starts, ``LABEL RESULT`` at :meth:`done` (on ``out``,
    default stdout).

    On a terminal it is one live line: the unit's bars (:func:`progress_bar`, :func:`library_bar`) are drawn on it
    as ``LABEL desc``, anything else printed meanwhile (a note, a warning) first erases it, and the result replaces
    it. Off a terminal the start and the result are two plain lines, the plain progress lines between them.
    """

    def __init__(self, label: str, what: str, out=None):
        global _line
        self.label, self.what, self.out = label, what, out
        self.live = on_terminal()
        if not self.live:
            print(f"{label} {what}", file=out or sys.stdout, flush=True)
            return
        end_line()
        self._streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Guarded(sys.stdout, sys.stderr), _Guarded(sys.stderr, sys.stderr)
        _line = self
        self.show()

    def show(self) -> None:
        """Draw the status ``LABEL WHAT`` on the terminal's line (cut to its width)."""
        stream = self._streams[1]
        text = f"{self.label} {self.what}"[: _terminal_width(stream) - 1]
        sys.stderr.write(f"\r{text}\x1b[K")
        sys.stderr.flush()

    def done(self, result: str) -> None:
        """Replace the line by ``LABEL RESULT``."""
        self.close(keep=False)
        print(f"{self.label} {result}", file=self.out or sys.stdout, flush=True)

    def close(self, keep: bool = True) -> None:
        """Stop drawing on the terminal; ``keep``: leave ``LABEL WHAT`` as a line (the work ended without a
        result: what follows, an error, is about it)."""
        global _line, _drawn
        if _line is not self:
            return
        _line = None
        stdout, stderr = self._streams
        if sys.stdout is not stdout and isinstance(sys.stdout, _Guarded):
            sys.stdout = stdout
        if sys.stderr is not stderr and isinstance(sys.stderr, _Guarded):
            sys.stderr = stderr
        stderr.write(f"\r\x1b[K{self.label} {self.what}\n" if keep else "\r\x1b[K")
        stderr.flush()
        _drawn = False


def end_line() -> None:
    """Close the open work line, if any, keeping its start as a line (what is printed next is about it)."""
    if _line is not None:
        _line.close(keep=True)


class _LineBar(tqdm):
    """A terminal bar that, once closed, draws its work line's status again."""

    def close(self) -> None:
        was_open = not getattr(self, "disable", True)
        super().close()
        if was_open and _line is not None and not self._instances:
            _line.show()


def _terminal_bar(total, desc: str, initial: int = 0, leave: bool = False, iterable=None, **kw):
    if _line is None:
        return tqdm(iterable, total=total, initial=initial, desc=desc, leave=leave, dynamic_ncols=True, **kw)
    _clear_drawn(_line._streams[1])  # the bar is drawn on the status's line, from its start
    return _LineBar(iterable, total=total, initial=initial, desc=f"{_line.label} {desc}", leave=False,
                    dynamic_ncols=True, **kw)


def progress_bar(total: int | None, desc: str, show: bool | None = None, initial: int = 0, leave: bool = False,
                 enabled: bool = True):
    """A tqdm bar (on a terminal, or ``show=True``), plain lines (:class:`PlainProgress`, off a terminal with
    ``show=None``) or nothing (``show=False`` or not ``enabled``, e.g. on a process other than the main one).
    Inside a :class:`WorkLine` a terminal bar is drawn on its line and erased when closed."""
    if not enabled or show is False:
        return tqdm(total=total, disable=True)
    if show or on_terminal():
        return _terminal_bar(total, desc, initial=initial, leave=leave)
    return PlainProgress(total, desc, initial)


def library_bar(iterable=None, desc: str | None = None, total: int | None = None, disable: bool = False,
                **_tqdm_options):
    """A library's tqdm bar (its call's arguments) drawn as memlab's: on a terminal a transient bar shown only once
    the work has run :data:`LIBRARY_DELAY_S` (none while another bar is drawn), off a terminal plain lines only when
    it runs longer than :data:`EVERY_S`. The library's own options (position, unit, leave) are not used."""
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    name = LIBRARY_NAMES.get(desc or "", (desc or "load").rstrip(".: "))
    if disable or (on_terminal() and tqdm._instances):  # a bar within a bar (a save during a fit): not drawn
        return tqdm(iterable, total=total, disable=True)
    if on_terminal():
        return _terminal_bar(total, name, iterable=iterable, delay=LIBRARY_DELAY_S)
    return PlainProgress(total, name, iterable=iterable, quiet=True)


@contextmanager
def folding():
    """Inside: the libraries' bars that memlab routes here (:func:`fold_bars`, transformers' tqdm hook) are drawn as
    memlab's (:func:`library_bar`). A memlab command's scope (:mod:`memlab.app.quiet`)."""
    global _folding
    before, _folding = _folding, True
    try:
        yield
    finally:
        _folding = before


@contextmanager
def fold_bars(module):
    """Inside :func:`folding`: ``module``'s ``tqdm`` (a library module that calls tqdm directly, e.g. transformers'
    GGUF reader) draws as :func:`library_bar` for the block's duration; outside, the library's own bar."""
    if not _folding or not hasattr(module, "tqdm"):
        yield
        return
    own = module.tqdm
    module.tqdm = library_bar
    try:
        yield
    finally:
        module.tqdm = own
