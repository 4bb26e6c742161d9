"""CLI verbs: one module per verb, each with ``add_parser(sub)`` and ``run(args) -> int``.

A verb module imports argparse and this package only at module level; whatever
is heavy (torch, transformers, a model's package) is imported inside ``run``.
So ``memlab --help``, ``memlab VERB --help`` and every refusal of a malformed
flag answer before torch is loaded. A module may also define ``check(args)``:
checks across flags (a flag that does nothing without another) that the CLI
runs after parsing and before anything heavy is imported; a failed check
raises :class:`memlab.errors.MemlabError` (one line, exit 2).

The argparse types below refuse a bad value while the arguments are read:
``positive_int``, ``non_negative_int``, ``positive_float``, ``fraction`` and
``int_list`` (a comma list of distinct positive integers).

Note: the verb modules are attributes of this package once imported (``list``
among them), so the code here never calls a builtin of the same name.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from memlab.errors import ConfigError


def check_threads(n: int | None) -> None:
    """``--threads``: unset (torch's own count) or a positive number, else one error before anything runs."""
    if n is not None and n < 1:
        raise ConfigError(f"--threads must be a positive number of CPU threads, got {n}")


def _int(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def _float(text: str) -> float:
    try:
        x = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def positive_float(text: str) -> float:
    """A finite number > 0."""
    x = _float(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return x


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    x = _float(text)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return x


def int_list(text: str) -> list[int]:
    """``"256,448"`` -> [256, 448]: one or more positive integers separated by commas, none twice."""
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    if "" in items:
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}; give positive integers separated by commas")
    out = []
    for x in items:
        try:
            n = int(x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"each value must be a positive integer, got {n} in {text!r}")
        if n in out:
            raise argparse.ArgumentTypeError(f"{n} is given twice in {text!r}")
        out.append(n)
    return out


def int_list_text(text: str) -> str:
    """:func:`int_list`'s check, keeping the text as written (for options parsed again further on)."""
    int_list(text)
    return str(text)


def choice_list(choices: tuple[str, ...]):
    """An argparse type: a comma list of distinct names out of ``choices``."""

    def parse(text: str) -> list[str]:
        items = [x.strip() for x in str(text).split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(choices)}, got {text!r}")
        for x in items:
            if x not in choices:
                raise argparse.ArgumentTypeError(f"unknown {x!r}; choose from {', '.join(choices)}")
            if items.count(x) > 1:
                raise argparse.ArgumentTypeError(f"{x!r} is given twice in {text!r}")
        return items

    parse.__name__ = "list"
    return parse


DEVICES = ("auto", "cpu", "cuda", "mps")


def check_device(name: str | None) -> None:
    """``--device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, else one error before anything is imported
    (whether this machine has it is checked when the verb runs)."""
    if name is None:
        return
    kind, _, index = str(name).partition(":")
    if kind not in DEVICES or (index and (kind == "auto" or not index.isdigit())):
        raise ConfigError(f"--device {name}: not a device (use auto, cpu, cuda, cuda:N or mps)")


def check_writable_dir(path: str, flag: str) -> None:
    """A folder a verb will write into (``--cache-dir``): a file there, a parent that is a file, or a place where
    no folder can be made or written is one ConfigError line now, before anything is loaded. Nothing is left
    behind: a folder made to try it is removed."""
    from memlab.rundir import check_path

    check_path(path, flag)  # a name too long: ENAMETOOLONG, before the path is looked up
    p = Path(os.path.expanduser(path))
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a folder")
    from memlab.rundir import first_missing  # torch-free, as this module must stay

    missing = first_missing(p)
    if missing is None:
        if not os.access(p, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: cannot write into it (permission denied)")
        return
    if missing.parent.exists() and not missing.parent.is_dir():
        raise ConfigError(f"{flag} {path} cannot be created: {missing.parent} is a file")
    try:
        os.mkdir(missing)
    except FileExistsError:  # another process (of a launch) made it meanwhile
        return
    except OSError as e:
        raise ConfigError(f"{flag} {path} cannot be created ({e.strerror})") from None
    try:
        os.rmdir(missing)
    except OSError:  # another process wrote into it meanwhile: it is theirs now
        pass


def check_new_out(path: str | None, what: str) -> None:
    """``--out`` of a new run: a file, or a folder that already holds files, is one line now, before anything is
    loaded (the run claims the folder later and checks it again)."""
    if not path:
        return
    from memlab.rundir import check_path, describe, used_entries

    check_path(path, "--out")
    p = Path(os.path.normpath(path))
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--out {p} is a file, not a directory")
    if p.is_dir() and used_entries(p):
        raise ConfigError(f"{what} directory {p} already holds files ({describe(p)}); choose another --out")
    base = next((q for q in [p, *p.parents] if q.exists()), Path("."))
    if not base.is_dir():
        raise ConfigError(f"cannot create {what} directory {p}: {base} is a file, not a folder")
    _try_write(base, f"--out {p}")


def _try_write(folder: Path, what: str) -> None:
    """One byte written into ``folder`` and removed: a read-only folder or a full disk is one line now, naming
    ``what`` and the folder, rather than after the model has loaded."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".memlab-write-check.", dir=folder)
    except OSError as e:
        raise ConfigError(f"{what}: cannot write into {folder} ({_why(e)})") from None
    try:
        os.write(fd, b"\0")
        os.fsync(fd)
    except OSError as e:
        raise ConfigError(f"{what}: cannot write into {folder} ({_why(e)})") from None
    finally:
        os.close(fd)
        os.unlink(name)


def _why(e: OSError) -> str:
    import errno

    return {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up", errno.EROFS:
            "the file system is read-only", errno.EACCES: "permission denied", errno.EPERM: "permission denied"}.get(
        e.errno, e.strerror or str(e))
