"""Run folders: checked before any compute, and locked while a process writes into them.

:func:`claim` is called by ``memlab train`` (fresh or ``--resume``) and
``memlab probe`` before they load anything. A fresh run needs a folder that
does not exist or is empty; the folder is created at once, so an unwritable
``--out`` fails first, in one line. Then the process takes an exclusive lock
on ``RUN/.memlab.lock`` (``fcntl.flock``; ``filelock`` where there is no
fcntl). The operating system drops the lock when the process ends, however it
ends (``kill -9`` included), so a killed run never leaves its folder stuck; a
second process that asks for a folder in use is refused in one line.

The folder is the one the user named, taken lexically (``runs/a/../b`` is
``runs/b``; no folder ``runs/a`` is made on the way). A command that fails
after claiming a folder it created calls :meth:`RunClaim.abandon`, which
removes what the claim made (the folder and any parents it had to create).

Every write into a run folder goes through :func:`guarded` (or
:func:`write_atomic`, built on it): a storage failure (a full disk, a file
size limit, a read-only folder) becomes one line, and the temporary files of
the write are removed. :mod:`memlab.outdir` builds every other verb's output
folder (quickstart, eval, bench, plot) on the same claim.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator

from memlab.errors import MemlabError

LOCK_NAME = ".memlab.lock"

_HELD: dict[str, "RunClaim"] = {}  # resolved folder -> this process's claim (a lock is taken once per process)


class RunClaim:
    """This process's exclusive lock on a run folder (a context manager; released when the process ends)."""

    def __init__(self, run_dir: Path, created: bool, made: Path | None = None, fresh: bool = False):
        self.run_dir, self.created, self.fresh = run_dir, created, fresh
        self.made = made if created else None  # the topmost folder this claim created (run_dir or a parent)
        self._fh = None
        self._lock = None

    def acquire(self, hint: str = "wait for it to end or choose another --out") -> "RunClaim":
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
                raise MemlabError(_busy(self.run_dir, None, hint)) from None
        else:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.seek(0)
                owner = fh.read().strip()
                fh.close()
                raise MemlabError(_busy(self.run_dir, owner, hint)) from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
        except OSError as e:  # a full disk: the folder named, and the claim undone by its caller
            with contextlib.suppress(OSError):  # closing flushes the same unwritten line again
                fh.close()
            raise MemlabError(f"cannot write into {self.run_dir}: {storage_failure(e) or e.strerror}") from None
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

    def abandon(self) -> None:
        """Release the lock and remove what a fresh claim made: the folders it created, or what was written
        into the empty folder it was given (a resume's claim is only released)."""
        self.release()
        if not self.fresh:
            return
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)
            return
        for p in self.run_dir.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()

    def __enter__(self) -> "RunClaim":
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def _key(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def holds(run_dir: str | Path) -> RunClaim | None:
    """This process's claim on ``run_dir``, if it holds one."""
    return _HELD.get(_key(Path(run_dir))) if Path(run_dir).exists() else None


def safe_name(text: str) -> str:
    """``text`` as one folder name: characters other than letters, digits, ``-``, ``_`` and ``.`` become ``_``
    (``../../x`` -> ``.._.._x``), so a name never leads out of the folder it is put in."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "_"


def first_missing(path: Path) -> Path | None:
    """The topmost folder of ``path`` that does not exist yet (None when it exists)."""
    missing = None
    for p in [path, *path.parents]:
        if p.exists():
            break
        missing = p
    return missing


def _busy(run_dir: Path, owner: str | None, hint: str) -> str:
    who = f"process {owner}" if owner else "another process"
    return f"{run_dir} is in use by {who} (a memlab run writing into it); {hint}"


def release_under(folder: Path) -> None:
    """Release this process's claims on folders inside ``folder`` (not on ``folder`` itself)."""
    top = _key(folder) + os.sep
    for key in [k for k in _HELD if k.startswith(top)]:
        _HELD[key].release()


def used_entries(run_dir: Path) -> list[str]:
    """What a folder holds, besides a lock file (a folder that holds only a lock is unused)."""
    return sorted(p.name for p in run_dir.iterdir() if p.name not in (LOCK_NAME, LOCK_NAME + ".os"))


_KINDS = (("config.yaml", "a training run"), ("checkpoints", "a training run"), ("metrics.jsonl", "a training run"),
          ("eval.json", "an evaluation"), ("bench.json", "a benchmark run"), ("scaling.json", "a scaling sweep"),
          ("probe.json", "a probe"), ("summary.txt", "an inversion"), ("report.json", "a probe"),
          ("table.md", "a quickstart run"))
"""A file or folder that tells what a used folder holds, first match wins."""


def describe(run_dir: Path) -> str:
    """What a used folder holds, as a phrase: ``a training run``, ``an evaluation``, ... or its first entries."""
    names = used_entries(run_dir)
    for marker, kind in _KINDS:
        if marker in names:
            return kind
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: " + ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _holds_files(what: str, run_dir: Path, hint: str = "choose another --out") -> MemlabError:
    return MemlabError(f"{what} directory {run_dir} already holds files ({describe(run_dir)}); {hint}")


def claim(run_dir: str | Path, fresh: bool, what: str = "run", busy_hint: str | None = None) -> RunClaim:
    """Check and lock ``run_dir`` before any compute.

    ``fresh``: the folder must not exist or be empty (it is created now);
    otherwise (``--resume``) it must exist. Raises a one-line MemlabError when
    the folder is a file, holds files, cannot be created or written, or is in
    use by another process (``busy_hint``: what to do then). A folder this process already holds is returned as is.
    """
    run_dir = Path(os.path.normpath(run_dir))  # as the user wrote it: runs/zz/../base is runs/base
    check_path(run_dir, f"{what} directory")
    held = holds(run_dir)
    if held is not None:
        if fresh and used_entries(run_dir):  # this process wrote into it already (e.g. an earlier probe)
            raise _holds_files(what, run_dir)
        return held
    created = False
    if fresh:
        if run_dir.exists() and not run_dir.is_dir():
            raise MemlabError(f"--out {run_dir} is a file, not a directory")
        if run_dir.is_dir() and used_entries(run_dir):
            hint = "resume it with --resume or choose --out" if what == "run" else "choose another --out"
            raise _holds_files(what, run_dir, hint)
        made = first_missing(run_dir)
        created = made is not None
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            raise MemlabError(f"cannot create {what} directory {run_dir}: {e.strerror}") from None
        if not os.access(run_dir, os.W_OK | os.X_OK):
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            raise MemlabError(f"cannot write into {what} directory {run_dir}: permission denied")
    elif not run_dir.is_dir():
        raise MemlabError(f"{run_dir} does not exist" if not run_dir.exists() else f"{run_dir} is not a directory")
    else:
        made, created = None, False
    c = RunClaim(run_dir, created, made, fresh)
    try:
        c.acquire(*([busy_hint] if busy_hint else []))
    except MemlabError:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    if fresh and used_entries(run_dir):  # another process filled it between the check and the lock
        c.release()
        raise _holds_files(what, run_dir)
    return c


def in_use_by(run_dir: str | Path) -> str | None:
    """Who holds ``run_dir`` (``process N``) when another process does, else None; takes no lock.

    Only for explaining a refusal (a folder that looks incomplete because a run is still setting it up)."""
    path = Path(run_dir) / LOCK_NAME
    if holds(run_dir) is not None or not path.is_file():
        return None
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return None
    try:
        with open(path) as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                owner = fh.read().strip()
                return f"process {owner}" if owner else "another process"
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except OSError:
        return None
    return None


# ----------------------------------------------------------------------------- guarded writes


def storage_failure(e: BaseException, writes_only: bool = False) -> str | None:
    """Why a write failed, when ``e`` is a storage failure (full disk, size limit, read-only, I/O), else None.

    safetensors reports an I/O error as a SafetensorError, torch's zip writer as a RuntimeError, tokenizers as a
    plain Exception.
    ``writes_only``: of the OSErrors, only those no read raises (full disk, size limit, read-only)."""
    import errno

    if isinstance(e, OSError):
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return "the disk is full"
        if e.errno == errno.EFBIG:
            return "a file size limit was reached"
        if e.errno == errno.EROFS:
            return "the file system is read-only"
        if writes_only:
            return None
        if e.errno == errno.ENAMETOOLONG:
            return "the path is too long for the file system"
        return e.strerror or " ".join(str(e).split())[:120]
    text = " ".join(str(e).split())
    low = text.lower()
    if type(e).__name__ == "SafetensorError" or isinstance(e, RuntimeError) or type(e) is Exception:  # tokenizers: Exception
        if "no space" in low or "disk quota" in low or "os error 28" in low or "enospc" in low:
            return "the disk is full"
        if "file too large" in low or "os error 27" in low:
            return "a file size limit was reached"
        if ("i/o error" in low or "ioerror" in low or "file write failed" in low or "inline_container" in low
                or "pytorchstreamwriter" in low):
            return text[:120]
    return None


def newest_file(folder: Path) -> Path | None:
    """The file under ``folder`` written last (by modification time, then size): the one a failed write was
    writing, since files are written one after another."""
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()] if folder.is_dir() else []
    key = lambda p: (p.stat().st_mtime_ns, p.stat().st_size)  # noqa: E731
    return max(files, key=key) if files else None


@contextlib.contextmanager
def guarded(what: str, *temps: Path, then: Callable[..., str] | None = None,
            name_in: tuple[Path, Path] | None = None) -> Iterator[None]:
    """Run a write of ``what``: on any failure the ``temps`` (files or folders) are removed; a storage failure
    becomes one MemlabError line ``could not write WHAT (why)``, followed by ``then(why)`` or ``then()`` (what the
    run keeps, what to do).

    ``name_in=(tmp_folder, final_folder)``: a folder written under a temporary name; the line names the file that
    was being written (the newest one in ``tmp_folder``), as it would have been called in ``final_folder``."""
    try:
        yield
    except BaseException as e:
        if name_in is not None and storage_failure(e) is not None and (f := newest_file(name_in[0])) is not None:
            what = str(name_in[1] / f.relative_to(name_in[0]))
        for t in temps:
            if t.is_dir() and not t.is_symlink():
                shutil.rmtree(t, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    t.unlink()
        reason = storage_failure(e)
        if reason is None:
            raise
        tail = "" if then is None else then(reason) if inspect.signature(then).parameters else then()
        raise MemlabError(f"could not write {what} ({reason})" + (f"; {tail}" if tail else "")) from None


def fsync_path(path: str | Path) -> None:
    """Flush a file's (or a folder's: its entries') data to the disk; a file system that cannot sync a folder
    is left as it is."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if not Path(path).is_dir():  # a file that cannot reach the disk is a failed write
            raise
    finally:
        os.close(fd)


def sync_tree(folder: str | Path) -> None:
    """:func:`fsync_path` every file and folder under ``folder`` (before it is renamed into place)."""
    folder = Path(folder)
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            fsync_path(p)
    for p in sorted((q for q in folder.rglob("*") if q.is_dir()), reverse=True):
        fsync_path(p)
    fsync_path(folder)


def replace_synced(src: str | Path, dst: str | Path) -> None:
    """Rename ``src`` (a file or a folder, already synced) onto ``dst`` and sync the folder that holds it, so that
    after a crash ``dst`` is the old one or the new one, never an empty or half file."""
    os.replace(src, dst)
    fsync_path(Path(dst).parent)


def write_atomic(path: str | Path, data: str | bytes, then: Callable[..., str] | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, synced, then renamed (a failure or
    a kill at any moment leaves the old file whole, or the new one)."""
    path = Path(path)
    check_path(path, "file")
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with guarded(str(path), tmp, then=then):
        with open(tmp, "wb") as fh:
            fh.write(data if isinstance(data, bytes) else data.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        replace_synced(tmp, path)


def check_path(path: str | Path, what: str = "--out") -> None:
    """A MemlabError when ``path`` cannot name a file here: a name longer than the file system takes, or a path
    longer than the system's limit (checked on the text, before anything is made)."""
    path = Path(path)
    base = next((p for p in [path, *path.parents] if _exists(p)), Path("."))
    try:
        name_max = os.pathconf(base if base.is_dir() else base.parent, "PC_NAME_MAX")
        path_max = os.pathconf(base if base.is_dir() else base.parent, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or a name it does not know
        name_max, path_max = 255, 4096
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise MemlabError(f"{what} {_short(path)}: the name {_short(Path(part))} is {len(os.fsencode(part))} "
                              f"bytes long; this file system takes at most {name_max} (ENAMETOOLONG)")
    size = len(os.fsencode(str(path.absolute())))
    if size >= path_max:
        raise MemlabError(f"{what} {_short(path)}: the path is {size} bytes long; the system takes at most "
                          f"{path_max - 1} (ENAMETOOLONG)")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up
        return False


def _short(path: Path, keep: int = 60) -> str:
    text = str(path)
    return text if len(text) <= keep else f"{text[:keep // 2]}...{text[-keep // 2:]}"


def read_metrics(path: Path, warn: bool = True) -> list[dict]:
    """The records of a metrics file; a torn last line is dropped (with one warning line)."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    out = []
    for i, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError("not a record")
        except ValueError:
            if i == len(lines) - 1:
                if warn:
                    print(f"memlab: warning: {path}: the last line is incomplete (a write was cut short); dropped",
                          file=sys.stderr)
                break
            raise MemlabError(f"{path}: line {i + 1} is not a JSON record; fix or delete that line") from None
        out.append(rec)
    return out
