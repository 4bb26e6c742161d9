"""Caches checked as checkpoints are: a digest of their bytes and of what made them, verified when read.

Every cache memlab reads back (the probe's chunk embeddings and controls, the token files, the sentence
embeddings, the other caches under ``$MEMLAB_CACHE``) records, beside its bytes, a digest of them
(:func:`digest`): the bytes hashed after the description of what made them (its format, key, dtype and shape,
as a JSON object). Rows swapped, scaled or flipped, bytes of another dtype under a cache's name, a file cut short
or a description edited then no longer match, and the reader names the cache in one ``memlab: warning:`` line
and rebuilds it: a damaged cache is never a reading.

The hash is xxHash's XXH3-128 (``xxhash``, which ``datasets`` installs: tens of GB/s, so checking a large
memory-mapped cache costs little beside reading it), else BLAKE2b; a digest names its kind (``xxh3_128:...``),
and one this installation cannot compute reads as damaged.

:func:`locked` is the lock several processes take turns on while one writes a cache; it leaves no file behind.
:func:`reserve` lays out a file's whole size on the disk before it is memory-mapped, so a full disk is an
``OSError`` there rather than a bus error (SIGBUS) in the middle of a write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

try:
    import xxhash
except ImportError:  # pragma: no cover - datasets installs it
    xxhash = None

KIND = "xxh3_128" if xxhash is not None else "blake2b"
"""The hash this installation writes."""
BLOCK = 8 << 20
"""Bytes read at a time when a file is hashed."""


def _hasher(kind: str):
    if kind == "xxh3_128" and xxhash is not None:
        return xxhash.xxh3_128()
    if kind == "blake2b":
        return hashlib.blake2b(digest_size=16)
    raise ValueError(f"a digest of kind '{kind}', which this installation cannot compute")


def _made(made: dict) -> bytes:
    return json.dumps(made, sort_keys=True, default=str).encode()


def digest(made: dict, *chunks, kind: str = KIND) -> str:
    """``KIND:hex`` of the description ``made`` (what made the bytes: format, key, dtype, shape) and the bytes
    of ``chunks`` (anything with the buffer protocol: bytes, numpy arrays, memory maps)."""
    h = _hasher(kind)
    h.update(_made(made))
    for c in chunks:
        h.update(c)
    return f"{kind}:{h.hexdigest()}"


def matches(recorded, made: dict, *chunks) -> bool:
    """Whether ``recorded`` (a digest read from a cache's description) is the digest of ``made`` and ``chunks``."""
    if not isinstance(recorded, str) or ":" not in recorded:
        return False
    try:
        return digest(made, *chunks, kind=recorded.split(":", 1)[0]) == recorded
    except ValueError:
        return False


def file_digest(path: str | Path, made: dict, kind: str = KIND) -> str:
    """:func:`digest` of ``made`` and a file's bytes, read a block at a time."""
    h = _hasher(kind)
    h.update(_made(made))
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return f"{kind}:{h.hexdigest()}"


def file_matches(path: str | Path, recorded, made: dict) -> bool:
    """Whether the file at ``path`` (and ``made``) gives the digest ``recorded``."""
    if not isinstance(recorded, str) or ":" not in recorded:
        return False
    try:
        return file_digest(path, made, kind=recorded.split(":", 1)[0]) == recorded
    except (ValueError, OSError):
        return False


def seal(record: dict) -> dict:
    """``record`` with a ``digest`` of its own content (every other key): an edited description is found."""
    body = {k: v for k, v in record.items() if k != "digest"}
    return {**body, "digest": digest({"record": json.loads(json.dumps(body, default=str))})}


def sealed(record) -> bool:
    """Whether ``record`` (a dict read back) is one :func:`seal` made and nothing in it changed since."""
    if not isinstance(record, dict):
        return False
    body = {k: v for k, v in record.items() if k != "digest"}
    # through JSON, as the record was written: tuples become lists, and the digest is of that form
    return matches(record.get("digest"), {"record": json.loads(json.dumps(body, default=str))})


def seal_folder(folder: str | Path, made: dict) -> None:
    """Record in ``folder/DIGESTS`` (sealed) the digest of every file under ``folder`` (:func:`files_digests`)."""
    folder = Path(folder)
    (folder / DIGESTS).write_text(json.dumps(seal({"files": files_digests(folder, made)})))


def folder_problem(folder: str | Path, made: dict) -> str | None:
    """Why the files under ``folder`` are not the ones :func:`seal_folder` recorded (None: they are)."""
    folder = Path(folder)
    try:
        info = json.loads((folder / DIGESTS).read_text())
    except (OSError, ValueError):
        return "it records no digest of its files (written by an earlier memlab)"
    if not sealed(info):
        return f"its {DIGESTS} does not match its digest"
    return files_problem(folder, info.get("files"), made, ignore=(DIGESTS,))


DIGESTS = "memlab-digests.json"
"""The file in a cache folder that records the digests of the others (:func:`seal_folder`)."""


def files_digests(folder: str | Path, made: dict) -> dict[str, str]:
    """The digest of every file under ``folder`` (by its path relative to it), each with ``made``."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): file_digest(p, {**made, "file": str(p.relative_to(folder))})
            for p in sorted(folder.rglob("*")) if p.is_file()}


def files_problem(folder: str | Path, recorded, made: dict, ignore: tuple[str, ...] = ()) -> str | None:
    """Why the files under ``folder`` (less those named in ``ignore``) are not the ones :func:`files_digests`
    recorded (None: they are)."""
    folder = Path(folder)
    if not isinstance(recorded, dict) or not recorded:
        return "it records no digest of its files (written by an earlier memlab)"
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - set(ignore)
    for name, d in recorded.items():
        if name not in present:
            return f"{name} is missing"
        if not file_matches(folder / name, d, {**made, "file": name}):
            return f"{name} does not match its digest"
    extra = sorted(present - set(recorded))
    return f"{extra[0]} was not written with it" if extra else None


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold the lock file ``path`` (processes asking at once take turns); it is removed when released.

    A process that waited on a lock file its holder removed finds its path gone (or another file there) once it
    holds it, and takes the lock again on the file now at that path."""
    path = Path(path)
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): processes may write the same cache twice, each atomically
        yield
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)  # its holder removed it: take the lock on the file now at that path
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # still held: a process waiting on it finds it gone and opens a new one
        os.close(fd)


def reserve(fd: int, size: int) -> None:
    """Allocate ``size`` bytes of the open file ``fd`` on the disk now: a full disk is an ``OSError`` here, not a
    bus error when a memory-mapped page is first written. A file system that cannot allocate ahead is left
    sparse (:func:`os.posix_fallocate` emulates it where the call is missing)."""
    if size <= 0:
        return
    if hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as e:
            import errno

            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
                raise
    os.ftruncate(fd, max(size, os.fstat(fd).st_size))
