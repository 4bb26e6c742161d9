"""The ``memlab`` command line: ``memlab <verb> ...``.

Each verb is a module in :mod:`memlab.app.commands` with ``add_parser(subparsers)``
and ``run(args) -> int``. A user's mistake (:class:`memlab.errors.MemlabError`)
prints one line ``memlab: error: ...`` and exits 2, without a traceback; so
does a storage failure (a full disk) of a write that no guarded path caught.
SIGINT and SIGTERM print one line saying what was kept and exit 130 and 143
(:mod:`memlab.interrupts`); on the processes of a launch, an error every
process meets is printed once, and a lost peer is one line, exit 3
(:mod:`memlab.app.launched`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from memlab import __version__, devices, interrupts
from memlab.app import launched
from memlab.app.quiet import quiet_libraries
from memlab.errors import MemlabError

VERBS = ("quickstart", "train", "probe", "generate", "plot", "list", "eval", "bench", "launch", "invert")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memlab",
        description="memlab: measure, train and compare memory in language models.",
    )
    parser.add_argument("--version", action="version", version=f"memlab {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="<verb>")
    for verb in VERBS:
        importlib.import_module(f"memlab.app.commands.{verb.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["launch"] and argv[1:2] not in (["-h"], ["--help"]):  # the launcher's options pass as given
            args, extra = parser.parse_args(["launch"]), []
            args.argv = argv[1:]
        else:
            args, extra = parser.parse_known_args(argv)
        if extra:  # dotted overrides may follow options: `train CFG --out D key=value`
            if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
                args.overrides = list(args.overrides) + extra
            else:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # argparse's usage errors (exit 2) and --help/--version (exit 0)
        return int(e.code or 0)
    if args.verb is None:
        parser.print_help()
        return 0
    try:
        devices.forced()  # a wrong MEMLAB_ACCEL is one line before anything runs
        # the libraries' bars and warnings as memlab's lines, for this command only (memlab.app.quiet)
        with interrupts.stop_on_signals(), quiet_libraries():  # SIGINT, SIGTERM: the clean-ups run, then one line
            return int(args.func(args) or 0)
    except MemlabError as e:
        if not (e.quiet or launched.quiet_on_this_process()):
            print(f"memlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or a signal: what was kept, once per launch
        if launched.rank() == 0:
            print(interrupts.message(e), file=sys.stderr)
        return interrupts.exit_code(e)
    except Exception as e:  # a write that no guarded path caught: a full disk is still one line
        from memlab.rundir import storage_failure

        lost = launched.peer_lost(e)  # another process of a launch ended: gloo's or NCCL's error, as one line
        if lost is not None:
            if not launched.wrapped():  # under `memlab launch` the launcher names the process that failed
                print(f"memlab: stopped: {lost}", file=sys.stderr)  # not the error: that is the failed one's line
            return launched.PEER_LOST
        reason = storage_failure(e, writes_only=True)
        if reason is None:
            raise
        where = getattr(e, "filename", None)
        print(f"memlab: error: could not write{f' {where}' if where else ''} ({reason})", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
