"""Run folders: checked before any compute, and locked while a process writes into them.

:func:`claim` is called by ``memlab train`` (fresh or ``--resume``) and
``memlab probe`` before they load anything. A fresh run needs a folder that
does not exist or is empty; the folder is created at once, so an unwritable
``--out`` fails first, in one line. Then the process takes an exclusive lock
on ``RUN/.memlab.lock`` (``fcntl.flock``; ``filelock`` where there is no
fcntl). The operating system drops the lock when the process ends, however it
ends (``kill -9`` included), so a killed run never leaves its folder stuck; a
second process that asks for a folder in use is refused in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from memlab.errors import MemlabError

LOCK_NAME = ".memlab.lock"

_HELD: dict[str, "RunClaim"] = {}  # resolved folder -> this process's claim (a lock is taken once per process)


class RunClaim:
    """This process's exclusive lock on a run folder (a context manager; released when the process ends)."""

    def __init__(self, run_dir: Path, created: bool):
        self.run_dir, self.created = run_dir, created
        self._fh = None
        self._lock = None

    def acquire(self) -> "RunClaim":
        path = self.run_dir / LOCK_NAME
        try:
            fh = open(path, "a+")
        except OSError as e:
            raise MemlabError(f"cannot write into {self.run_dir}: {e.strerror}") from None
        try:
            import fcntl
        except ImportError:  # no fcntl (Windows): filelock's OS lock
            import filelock

            self._lock = filelock.FileLock(str(path) + ".os")
            try:
                self._lock.acquire(timeout=0)
            except filelock.Timeout:
                fh.close()
                raise MemlabError(_busy(self.run_dir, None)) from None
        else:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.seek(0)
                owner = fh.read().strip()
                fh.close()
                raise MemlabError(_busy(self.run_dir, owner)) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        _HELD[_key(self.run_dir)] = self
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the descriptor drops the flock
            self._fh = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        _HELD.pop(_key(self.run_dir), None)

    def __enter__(self) -> "RunClaim":
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def _key(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def _busy(run_dir: Path, owner: str | None) -> str:
    who = f"process {owner}" if owner else "another process"
    return f"{run_dir} is in use by {who} (a memlab run writing into it); wait for it to end or choose another --out"


def used_entries(run_dir: Path) -> list[str]:
    """What a folder holds, besides a lock file (a folder that holds only a lock is unused)."""
    return sorted(p.name for p in run_dir.iterdir() if p.name not in (LOCK_NAME, LOCK_NAME + ".os"))


def claim(run_dir: str | Path, fresh: bool, what: str = "run") -> RunClaim:
    """Check and lock ``run_dir`` before any compute.

    ``fresh``: the folder must not exist or be empty (it is created now);
    otherwise (``--resume``) it must exist. Raises a one-line MemlabError when
    the folder is a file, holds files, cannot be created or written, or is in
    use by another process. A folder this process already holds is returned as is.
    """
    run_dir = Path(run_dir)
    held = _HELD.get(_key(run_dir)) if run_dir.exists() else None
    if held is not None:
        if fresh and used_entries(run_dir):  # this process wrote into it already (e.g. an earlier probe)
            raise MemlabError(f"{what} directory {run_dir} already holds files; choose another --out")
        return held
    created = False
    if fresh:
        if run_dir.exists() and not run_dir.is_dir():
            raise MemlabError(f"--out {run_dir} is a file, not a directory")
        if run_dir.is_dir() and used_entries(run_dir):
            hint = "resume it with --resume or choose --out" if what == "run" else "choose another --out"
            raise MemlabError(f"{what} directory {run_dir} already holds files; {hint}")
        created = not run_dir.exists()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MemlabError(f"cannot create {what} directory {run_dir}: {e.strerror}") from None
        if not os.access(run_dir, os.W_OK | os.X_OK):
            raise MemlabError(f"cannot write into {what} directory {run_dir}: permission denied")
    elif not run_dir.is_dir():
        raise MemlabError(f"{run_dir} is not a directory")
    c = RunClaim(run_dir, created).acquire()
    if fresh and used_entries(run_dir):  # another process filled it between the check and the lock
        c.release()
        raise MemlabError(f"{what} directory {run_dir} already holds files; choose another --out")
    return c
