"""What one process of a multi-process launch (``accelerate launch``, ``torchrun``, ``memlab launch``) prints
when it fails.

* An error that every process meets before the process group starts (a bad
  argument, an unknown config key) is printed by the main process only: the
  others stay quiet, and wait a moment, so the main process prints before the
  launcher, seeing one of them end, stops it.
* Under ``memlab launch`` (:data:`ERRORS_ENV` set) a process hands its error
  line to the launcher (:func:`hand_over`) instead of printing it; the launcher
  prints each distinct line once (:func:`collected`), so an error that every
  process meets after the process group started (a bad ``init_from``, an empty
  corpus, damaged weights) is one line too.
* Every process ``memlab launch`` starts ends with its launcher (:func:`tie_to_launcher`): a launcher that is
  killed (``kill -9`` included) takes its processes with it within a second, and they write nothing after.
* A process that loses another one (gloo's "Connection closed by peer", an
  NCCL error) says so in one line and exits :data:`PEER_LOST`; under
  ``memlab launch`` (:data:`WRAPPED_ENV` set) it stays quiet, because the
  launcher names the process that failed and why.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PEER_LOST = 3
"""Exit status of a process that stopped because another process of its launch ended."""

WRAPPED_ENV = "MEMLAB_LAUNCH"
"""Set by ``memlab launch`` in every process it starts."""

LAUNCHER_ENV = "MEMLAB_LAUNCHER_PID"
"""Set by ``memlab launch``: its process id, the parent of every process it starts."""

WATCH_S = 0.5
"""How often a launched process checks that its launcher is still its parent (where no death signal is set)."""

ERRORS_ENV = "MEMLAB_LAUNCH_ERRORS"
"""Set by ``memlab launch``: the folder where each process leaves its error line (``rank-N.txt``)."""

QUIET_WAIT_S = 5.0
"""How long a quiet process waits before it exits (the main process prints first)."""

PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL error", "ProcessGroupGloo",
               "ProcessGroupNCCL", "gloo/transport")
"""Phrases of the errors a collective raises when another process of the launch is gone."""


def rank() -> int:
    """This process's rank in its launch (0 outside one)."""
    return int(os.environ.get("RANK", "0") or 0)


def world() -> int:
    """How many processes the launch started (1 outside one)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def wrapped() -> bool:
    """Whether ``memlab launch`` started this process."""
    return os.environ.get(WRAPPED_ENV) == "1"


def _end_now() -> None:
    """End this process at once: no clean-up, no exit hook, nothing written."""
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(128 + signal.SIGKILL)  # pragma: no cover - where SIGKILL cannot be sent


def _death_signal() -> bool:
    """Linux: have the kernel send SIGKILL to this process when its parent ends (``prctl(PR_SET_PDEATHSIG)``)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _watch(parent: int, launcher: int, every: float) -> None:
    while True:
        time.sleep(every)
        if os.getppid() != parent:  # the launcher is gone: this process was handed to another parent
            _end_now()
        if parent != launcher and not _alive(launcher):  # a process between them outlived the launcher
            _end_now()


def tie_to_launcher(every: float | None = None) -> bool:
    """Under ``memlab launch`` (:data:`LAUNCHER_ENV` set): end this process when its launcher ends, by any
    signal. On Linux the kernel kills it the moment its parent (the launcher) dies (a death signal); everywhere, a
    watchdog thread checks every :data:`WATCH_S` seconds that its parent is still the same process, and that the
    launcher still runs where a process stands between them, and kills it when not. A launcher already gone ends
    it here. Returns whether it is tied (False outside ``memlab launch``)."""
    pid = os.environ.get(LAUNCHER_ENV, "")
    if not pid.isdigit():
        return False
    launcher = int(pid)
    _death_signal()
    parent = os.getppid()  # the launcher (accelerate starts its processes itself), set before the check below
    if parent != launcher and not _alive(launcher):  # the launcher died before the death signal was set
        _end_now()
    threading.Thread(target=_watch, args=(parent, launcher, WATCH_S if every is None else every), daemon=True,
                     name="memlab-launcher-watch").start()
    return True


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            return "\nState:\tZ" not in fh.read()
    except OSError:
        return True  # no /proc: it answered the signal


def _group_started() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except ImportError:  # pragma: no cover
        return False


def quiet_on_this_process() -> bool:
    """True on a process other than the main one of a launch whose process group has not started: an error met
    there is met by every process (the same arguments), and the main one prints it. Waits a moment first."""
    if world() <= 1 or rank() == 0 or _group_started():
        return False
    time.sleep(QUIET_WAIT_S)
    return True


def peer_lost(e: BaseException) -> str | None:
    """One line for a collective's failure because another process of the launch ended; None for anything
    else (outside a launch, always None)."""
    if world() <= 1:
        return None
    text = " ".join(str(e).split())
    is_dist = any(c.__name__ in ("DistError", "DistBackendError", "DistNetworkError") for c in type(e).__mro__)
    if not (is_dist or any(p in text for p in PEER_ERRORS)):
        return None
    return (f"process {rank()} of {world()} lost another process of the launch ({text[:120]}); it stops too "
            "(the launcher's report names the process that failed)")


def hand_over(line: str) -> bool:
    """Under ``memlab launch``: leave ``line`` for the launcher to print (True); elsewhere do nothing (False)."""
    folder = os.environ.get(ERRORS_ENV)
    if not folder or not os.path.isdir(folder):
        return False
    path = os.path.join(folder, f"rank-{rank()}.txt")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
        os.replace(path + ".tmp", path)  # the launcher reads the line whole or not at all
    except OSError:
        return False
    return True


def collected(folder: str) -> list[str]:
    """The distinct error lines the processes left in ``folder``, in rank order."""
    lines: list[str] = []
    names = [n for n in os.listdir(folder) if n.startswith("rank-") and n.endswith(".txt")] if os.path.isdir(folder) else []
    for name in sorted(names, key=lambda n: int(n[5:-4]) if n[5:-4].isdigit() else 0):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                line = fh.read().strip()
        except OSError:
            continue
        if line and line not in lines:
            lines.append(line)
    return lines
