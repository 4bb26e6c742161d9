"""One writer for every verb's output folder.

:class:`OutputFolder` is what ``quickstart``, ``eval``, ``bench`` and ``plot``
write through, on the same claim as ``train`` and ``probe``
(:func:`memlab.rundir.claim`):

- **the lock**: the folder is locked while the command writes into it; a
  second process is refused in one line;
- **a new folder or none**: a verb that makes a folder of its own refuses one
  that already holds files, naming what it holds ("a training run", "an
  evaluation", ...); ``plot`` writes into an existing run and takes its lock,
  so it is refused while the run trains;
- **whole files**: every file is written under a temporary name and renamed
  into place, so a file that a command replaces is replaced whole or not at
  all; a storage failure (full disk, file size limit, read-only folder) is one
  line that names the file;
- **nothing half made**: when the command fails (an error, a storage failure,
  Ctrl-C), what it made is removed: a new folder entirely (the folder it
  created, or what it wrote into the empty one it was given); in an existing
  run, the subfolders it created.

:func:`save_files` and :func:`save_folder` write what a library saves (a
tokenizer's ``save_pretrained``) the same way. :func:`check_room` finds a
folder that cannot take a write (read-only, full disk, file size limit)
before a command computes anything.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from memlab.errors import MemlabError
from memlab.rundir import (RunClaim, claim, fsync_path, guarded, holds, newest_file, release_under, replace_synced,
                           storage_failure, sync_tree, write_atomic)

try:
    import resource
except ImportError:  # pragma: no cover  (no file size limits to read: Windows)
    resource = None

_FAILED_WRITE = re.compile(r"^(could not write .*? \([^)]*\))")


class OutputFolder:
    """A verb's output folder: claimed on opening, written through whole-file writes, cleaned when the command
    fails. Use it as a context manager: leaving it with an exception removes what it made and re-raises (a
    storage failure as one MemlabError line); leaving it normally releases the lock."""

    def __init__(self, run_claim: RunClaim, what: str, fresh: bool, owned: bool):
        self.claim, self.what, self.fresh, self.owned = run_claim, what, fresh, owned
        self.path = run_claim.run_dir
        self._made: list[Path] = []  # subfolders this command created in an existing folder

    @classmethod
    def new(cls, path: str | Path, what: str) -> "OutputFolder":
        """A folder of this command's own: created now (or an empty one), refused when it holds files."""
        return cls(claim(path, fresh=True, what=what), what, fresh=True, owned=True)

    @classmethod
    def existing(cls, path: str | Path, what: str, busy_hint: str = "wait for it to end") -> "OutputFolder":
        """An existing folder this command adds to (a run's ``plots/``): refused while another process holds it."""
        owned = holds(path) is None  # a folder this process holds already (a training run plotting) stays held
        return cls(claim(path, fresh=False, what=what, busy_hint=busy_hint), what, fresh=False, owned=owned)

    # ------------------------------------------------------------------ writes
    def file(self, name: str) -> Path:
        return self.path / name

    def subdir(self, name: str) -> Path:
        """``name`` inside the folder, created if needed (and removed again if the command fails)."""
        d = self.path / name
        if not d.is_dir():
            with guarded(str(d)):
                d.mkdir(parents=True)
            self._made.append(d)
        return d

    def write(self, name: str, data: str | bytes) -> Path:
        """Write ``name`` whole (temporary name, then rename); a storage failure is one line naming it."""
        path = self.path / name
        if path.parent != self.path:
            self.subdir(str(path.parent.relative_to(self.path)))
        write_atomic(path, data)
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write(name, json.dumps(obj, indent=2, default=str))

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """The command succeeded: release the lock (and the locks of folders made inside it)."""
        release_under(self.path)
        if self.owned:
            self.claim.release()

    def fail(self) -> None:
        """The command failed: remove what it made, release the lock."""
        if self.fresh:
            release_under(self.path)
            self.claim.abandon()
            return
        for d in reversed(self._made):
            shutil.rmtree(d, ignore_errors=True)
        if self.owned:
            self.claim.release()

    def kept(self) -> str:
        """What is left after a failure, as the tail of the error line."""
        return f"nothing of the {self.what} was kept" if self.fresh else f"{self.path} is as it was"

    def __enter__(self) -> "OutputFolder":
        return self

    def __exit__(self, kind, e, tb) -> bool:
        if e is None:
            self.close()
            return False
        culprit = None
        if not isinstance(e, MemlabError) and storage_failure(e, writes_only=True) is not None:
            where = getattr(e, "filename", None)
            culprit = Path(where) if where else newest_file(self.path)  # found before the folder is removed
        self.fail()
        if isinstance(e, MemlabError):
            m = _FAILED_WRITE.match(str(e))
            if m is not None and (self.fresh or self._made):  # what the line said is kept is gone
                raise type(e)(f"{m.group(1)}; {self.kept()}") from None
            return False
        reason = storage_failure(e, writes_only=True)
        if reason is None:
            return False
        raise MemlabError(f"could not write {culprit or self.path} ({reason}); {self.kept()}") from None


# ----------------------------------------------------------------------------- what a library saves


def save_folder(final: Path, save: Callable[[Path], None], what: str) -> bool:
    """``save(tmp)`` writes a folder under a temporary name, renamed to ``final`` once whole.

    Returns False when another process made ``final`` first (its copy is kept, this one dropped). A storage failure
    is one line naming the file that was being written; the temporary folder is removed."""
    final = Path(final)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    with guarded(what, tmp, name_in=(tmp, final)):
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save(tmp)
        sync_tree(tmp)  # every file on the disk before the folder is renamed into place
        try:
            replace_synced(tmp, final)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race: its copy stays
            return False
    return True


def save_files(folder: Path, save: Callable[[Path], None], what: str) -> None:
    """``save(tmp)`` writes files; each is then renamed into ``folder`` (replacing a file of the same name whole).

    A storage failure is one line naming the file that was being written, and leaves ``folder`` as it was."""
    folder = Path(folder)
    tmp = folder.parent / f".{folder.name}.tmp{os.getpid()}"
    with guarded(what, tmp, name_in=(tmp, folder)):
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save(tmp)
        sync_tree(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                target = folder / f.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, target)
        fsync_path(folder)
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- room for a write, checked first


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def file_size_limit() -> int | None:
    """The soft file size limit (``ulimit -f``) in bytes, None when there is none."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def check_room(folders: list[Path], largest: int, total: int, what: str) -> None:
    """Refuse, in one line naming the cause, folders that cannot take ``what`` (files of up to ``largest`` bytes,
    ``total`` in all): a folder that cannot be written (read-only), a file size limit below ``largest``, or a
    disk with less than ``total`` bytes free."""
    for folder in folders:
        try:
            fd, name = tempfile.mkstemp(prefix=".memlab-write-check.", dir=folder)
            try:
                os.write(fd, b"\0")
            finally:
                os.close(fd)
                os.unlink(name)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                why, fix = "the folder is read-only: permission denied", f"make {folder} writable"
            elif e.errno == errno.EROFS:
                why, fix = "the file system is read-only", "write to another file system"
            elif e.errno in (errno.ENOSPC, errno.EDQUOT):
                why, fix = "the disk is full", "free some space"
            else:
                why, fix = e.strerror or str(e), "fix the cause"
            raise MemlabError(f"cannot write {what} into {folder} ({why}); {fix}") from None
    limit = file_size_limit()
    if limit is not None and largest > limit:
        raise MemlabError(f"cannot write {what} into {folders[0]} (a file size limit: its files reach about "
                          f"{_mib(largest)}, the limit is {_mib(limit)}); raise the file size limit (ulimit -f)")
    free = shutil.disk_usage(folders[0]).free
    if total > free:
        raise MemlabError(f"cannot write {what} into {folders[0]} (the disk is full: {_mib(free)} free, it takes "
                          f"about {_mib(total)}); free some space")


def cut_back(path: Path, size: int) -> None:
    """Cut ``path`` back to its first ``size`` bytes (what was appended after goes); truncating needs no free space.
    A file that is missing or already that short is left alone."""
    with contextlib.suppress(OSError):
        if Path(path).stat().st_size > size:
            os.truncate(path, size)
