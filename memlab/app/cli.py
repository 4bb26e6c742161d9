"""The ``memlab`` command line: ``memlab <verb> ...``.

Each verb is a module in :mod:`memlab.app.commands` with ``add_parser(subparsers)``
and ``run(args) -> int`` (and optionally ``check(args)``); a new module there is
a new verb. Only the verb named on the command line is imported, and a verb
module imports nothing heavy at module level, so ``--help`` and a malformed
flag are answered before torch is loaded: the flags are read, the verb's
``check`` runs, the address-space limit is checked (:mod:`memlab.limits`), and
only then does ``run`` import what it needs.

A user's mistake (:class:`memlab.errors.MemlabError`) or a malformed flag prints
one line ``memlab: error: ...`` and exits 2, without a traceback; so do a
storage failure (a full disk) of a write that no guarded path caught and
running out of memory. SIGINT and SIGTERM print one line saying what was kept
and exit 130 and 143 (:mod:`memlab.interrupts`); on the processes of a launch,
an error every process meets is printed once, and a lost peer is one line,
exit 3 (:mod:`memlab.app.launched`).
"""

from __future__ import annotations

import argparse
import ast
import errno
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

from memlab import __version__
from memlab.errors import MemlabError

PATH_ERRORS = (errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR)
"""OSErrors of a path (too long, not permitted, not a folder) that end a command with one line naming it."""

ORDER = ("quickstart", "train", "probe", "invert", "generate", "plot", "list", "eval", "bench", "launch")
"""The order of the verbs in ``memlab --help``; any other module of :mod:`memlab.app.commands` follows."""


def _verbs() -> tuple[str, ...]:
    import memlab.app.commands as package

    found = {m.name.replace("_", "-") for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")}
    return tuple(v for v in ORDER if v in found) + tuple(sorted(found - set(ORDER)))


VERBS = _verbs()


def module_name(verb: str) -> str:
    return f"memlab.app.commands.{verb.replace('-', '_')}"


def summary(verb: str) -> str:
    """A verb's one-line help for ``memlab --help``, read from its module's source without importing it (the
    ``help=`` of its ``add_parser`` call, else the first line of its docstring)."""
    spec = importlib.util.find_spec(module_name(verb))
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, TypeError, AttributeError):
        return ""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser"
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == verb):
            for kw in node.keywords:
                if kw.arg == "help":
                    try:
                        return str(ast.literal_eval(kw.value))
                    except ValueError:
                        break
    return (ast.get_docstring(tree) or "").strip().split("\n")[0]


class Parser(argparse.ArgumentParser):
    """argparse with memlab's error line: ``memlab: error: MESSAGE (see PROG --help)``, exit 2."""

    def error(self, message: str):
        self.exit(2, f"memlab: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser(full=None) -> argparse.ArgumentParser:
    """The ``memlab`` parser. ``full``: the verbs whose own parsers are built (their modules imported); the others
    are listed by name and help only. None: every verb."""
    parser = Parser(prog="memlab", description="memlab: measure, train and compare memory in language models.")
    parser.add_argument("--version", action="version", version=f"memlab {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="<verb>")
    for verb in VERBS:
        if full is None or verb in full:
            importlib.import_module(module_name(verb)).add_parser(sub)
        else:
            sub.add_parser(verb, help=summary(verb))
    return parser


def parse(argv: list[str]):
    """(parser, args) for ``argv``; argparse's SystemExit (a usage error, ``--help``) passes through."""
    verb = argv[0] if argv and argv[0] in VERBS else None
    parser = build_parser(full=[verb] if verb else [])
    if verb == "launch" and argv[1:2] not in (["-h"], ["--help"]):  # the launcher's options pass as given
        args, extra = parser.parse_args(["launch"]), []
        args.argv = argv[1:]
    else:
        args, extra = parser.parse_known_args(argv)
    if extra:  # dotted overrides may follow options: `train CFG --out D key=value`
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = list(args.overrides) + extra
        else:
            subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            subparsers.choices.get(args.verb, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return parser, args


PATH_FLAGS = ("out", "cache_dir", "offload_dir")
"""Options that name a folder a verb writes into: a path too long for the file system is refused at once."""


def check_paths(args) -> None:
    from memlab.rundir import check_path

    for dest in PATH_FLAGS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and value:
            check_path(value, f"--{dest.replace('_', '-')}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, args = parse(argv)
    except SystemExit as e:  # argparse's usage errors (exit 2) and --help/--version (exit 0)
        return int(e.code or 0)
    if args.verb is None:
        parser.print_help()
        return 0
    from memlab.app import launched

    try:
        check = getattr(sys.modules[module_name(args.verb)], "check", None)
        if check is not None:
            check(args)  # checks across flags, before anything heavy is imported
        check_paths(args)
        from memlab.limits import check_address_space

        check_address_space(getattr(args, "threads", None))  # before torch: a too small ulimit -v would hang it
        return _run(args)
    except MemlabError as e:
        line = f"memlab: error: {e}"
        if not (e.quiet or launched.hand_over(line) or launched.quiet_on_this_process()):
            print(line, file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C while the arguments were checked: nothing was made yet
        from memlab import interrupts

        print(interrupts.message(e), file=sys.stderr)
        return interrupts.exit_code(e)


def _run(args) -> int:
    """Run the verb: its libraries' output as memlab's lines, signals and failures of the machine as one line."""
    from memlab import interrupts
    from memlab.app import launched
    from memlab.limits import limit_hint, memory_failure

    try:
        from memlab import devices
        from memlab.app.quiet import quiet_libraries

        devices.forced()  # a wrong MEMLAB_ACCEL is one line before anything runs
        # the libraries' bars and warnings as memlab's lines, for this command only (memlab.app.quiet)
        with interrupts.stop_on_signals(), quiet_libraries():  # SIGINT, SIGTERM: the clean-ups run, then one line
            return int(args.func(args) or 0)
    except MemlabError:
        raise
    except KeyboardInterrupt as e:  # Ctrl-C or a signal: what was kept, once per launch
        if launched.rank() == 0:
            print(interrupts.message(e), file=sys.stderr)
        return interrupts.exit_code(e)
    except Exception as e:  # a write that no guarded path caught: a full disk is still one line
        lost = launched.peer_lost(e)  # another process of a launch ended: gloo's or NCCL's error, as one line
        if lost is not None:
            if not launched.wrapped():  # under `memlab launch` the launcher names the process that failed
                print(f"memlab: stopped: {lost}", file=sys.stderr)  # not the error: that is the failed one's line
            return launched.PEER_LOST
        memory = memory_failure(e)
        if memory is not None:
            quiet_exit_hooks()
            raise MemlabError(f"memlab {args.verb}: {memory}{limit_hint()}; nothing half-made was kept") from None
        from memlab.rundir import storage_failure

        reason = storage_failure(e, writes_only=True)
        where = getattr(e, "filename", None)
        if reason is not None:
            raise MemlabError(f"could not write{f' {where}' if where else ''} ({reason})") from None
        if isinstance(e, OSError) and e.errno in PATH_ERRORS and where:  # a path no guarded step checked
            raise MemlabError(f"{where}: {e.strerror}") from None
        raise


EXIT_HOOKS = (("torch._dynamo.utils", "dump_compile_times"),)
"""Libraries' exit hooks that allocate (import, tabulate): dropped after running out of memory, where they would
print a traceback of their own under the one line."""


def quiet_exit_hooks() -> None:
    import atexit

    for module, name in EXIT_HOOKS:
        hook = getattr(sys.modules.get(module), name, None)
        if hook is not None:
            atexit.unregister(hook)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
