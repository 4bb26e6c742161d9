"""Stopping on a signal: SIGINT and SIGTERM end a command with one line and the conventional exit status.

Inside :func:`stop_on_signals` (the CLI runs every verb in it) both signals
raise :class:`Stopped`, a ``KeyboardInterrupt``: the ``finally`` and
``except BaseException`` clean-ups run as they do for Ctrl-C (a run's lock is
released, a probe removes the folder it claimed), checkpoints already written
stay (they are written to a temporary name and renamed), and the CLI prints

    memlab: stopped by SIGTERM; kept: checkpoint runs/x/checkpoints/step-00000400 (memlab train --resume runs/x)

and exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).
What a stop keeps is announced by the code that keeps it (:func:`keep`),
e.g. the training loop after each checkpoint; nothing announced is "nothing".
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that end a command with one line."""

_kept: list[str] = []


class Stopped(KeyboardInterrupt):
    """A command stopped by a signal (``signum``)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def keep(what: str | None) -> None:
    """Announce what a stop now would keep (a phrase: ``checkpoint RUN/checkpoints/step-N``); None: nothing."""
    _kept[:] = [what] if what else []


def kept() -> str:
    """What a stop now keeps, as announced (``nothing`` when nothing was)."""
    return _kept[0] if _kept else "nothing"


def _raise(signum, frame):
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT and SIGTERM raise :class:`Stopped` inside the block (the main thread only: elsewhere the
    handlers cannot be set, and the block runs as it is); the previous handlers come back after it."""
    keep(None)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def message(e: KeyboardInterrupt) -> str:
    """The one line a stop prints."""
    name = e.name if isinstance(e, Stopped) else "SIGINT"
    return f"memlab: stopped by {name}; kept: {kept()}"


def exit_code(e: KeyboardInterrupt) -> int:
    return e.exit_code if isinstance(e, Stopped) else 128 + signal.SIGINT
