"""Limits of the machine as one-line errors: an address-space limit (``ulimit -v``) and running out of memory.

:func:`check_address_space` runs before torch is imported. Importing torch and
transformers maps about :data:`BASE_MIB` of address space, and each CPU thread
of torch's pool (OpenMP) adds about :data:`PER_THREAD_MIB` (its stack and its
allocator arena); below that, the import fails with an ``ImportError``, or the
thread pool's start-up retries its allocations without end. So a limit below
what the command needs is refused at once, in one line that says what it
needs and how to lower it (fewer threads).

:func:`memory_failure` recognises what running out of memory raises later (a
``MemoryError``, torch's allocator error, an ``ImportError`` of a library that
could not be mapped) so that the CLI prints it as one line.
"""

from __future__ import annotations

import os

BASE_MIB = 700
"""Address space of a process that imported torch, transformers and accelerate and ran one matmul on one
thread (``VmPeak``, measured with torch 2.x on Linux x86-64: 633-638 MiB, rounded up)."""

PER_THREAD_MIB = 180
"""Address space each further CPU thread of torch's pool adds (``VmPeak`` at 2 threads less 1 thread: 174 MiB)."""

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def address_space_limit() -> int | None:
    """The soft address-space limit (``ulimit -v``) in bytes, None when there is none (or no ``resource``)."""
    try:
        import resource
    except ImportError:  # pragma: no cover  (Windows)
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def planned_threads(threads: int | None = None) -> int:
    """How many CPU threads torch will start: ``threads`` (``--threads``), else ``OMP_NUM_THREADS``, else the
    CPUs this process may run on."""
    if threads:
        return int(threads)
    for var in THREAD_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover
        return os.cpu_count() or 1


def needed_mib(threads: int) -> int:
    """Address space (MiB) a command on ``threads`` CPU threads needs before it loads anything of its own."""
    return BASE_MIB + PER_THREAD_MIB * max(threads - 1, 0)


def check_address_space(threads: int | None = None) -> None:
    """Refuse, in one line, an address-space limit too small to start torch on the planned threads."""
    from memlab.errors import MemlabError

    limit = address_space_limit()
    if limit is None:
        return
    n = planned_threads(threads)
    have = limit // 2**20
    if have >= needed_mib(n):
        return
    fits = 1 + max((have - BASE_MIB) // PER_THREAD_MIB, -1)
    how = (f"; or start fewer threads: OMP_NUM_THREADS={fits} (about {needed_mib(fits)} MiB)" if 1 <= fits < n
           else "")
    raise MemlabError(f"the address-space limit (ulimit -v) is {have} MiB; torch on {n} CPU thread"
                      f"{'s' if n > 1 else ''} needs about {needed_mib(n)} MiB before it loads anything: raise the "
                      f"limit (ulimit -v {needed_mib(n) * 1024 + 1})" + how)


_PHRASES = ("can't allocate memory", "cannot allocate memory", "out of memory", "failed to map segment",
            "std::bad_alloc", "failed to allocate")


def memory_failure(e: BaseException) -> str | None:
    """What did not fit, when ``e`` is what running out of memory raises (else None)."""
    text = " ".join(str(e).split())
    if isinstance(e, MemoryError):
        return f"out of memory{f' ({text[:160]})' if text else ''}{_where(e)}"
    low = text.lower()
    if isinstance(e, (RuntimeError, ImportError, OSError)) and any(p in low for p in _PHRASES):
        if isinstance(e, ImportError):
            return f"out of memory while importing {getattr(e, 'name', None) or 'a library'} ({text[:160]})"
        return f"out of memory ({text[:160]})"
    return None


def _where(e: BaseException) -> str:
    """`` in PACKAGE/FILE.py`` of the innermost frame of ``e``'s traceback (what was being made), else ``""``."""
    tb, last = e.__traceback__, None
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith("<"):  # not importlib's frozen frames
            last = tb.tb_frame.f_code
        tb = tb.tb_next
    if last is None:
        return ""
    parts = last.co_filename.replace("\\", "/").split("/")
    return f" in {'/'.join(parts[-2:])}, {last.co_name}()"


def limit_hint() -> str:
    """``; the address-space limit (ulimit -v) is N MiB`` when one is set, else ``""``."""
    limit = address_space_limit()
    return "" if limit is None else f"; the address-space limit (ulimit -v) is {limit // 2**20} MiB"
