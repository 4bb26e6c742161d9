"""memlab launch [accelerate launch options] VERB ...: run a memlab verb on several processes, failures in one line.

    memlab launch --multi_gpu --num_processes 2 train configs/lcm/mse_toy.yaml --out runs/x
    memlab launch --config_file my_accelerate.yaml -- train configs/x.yaml train.lr=1e-3

It is ``accelerate launch ... -m memlab.app.cli VERB ...`` (every launcher option
works; ``--`` may separate them from the verb), run in this process so that
a failure comes back as data rather than as the launcher's traceback: for the
process that failed first, one line says which one and why (killed by a
signal, stopped, an exit status), and the command exits non-zero. A process
that failed with memlab's own one-line error has printed it already; the
processes the launcher stopped because of it print nothing more.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess

from memlab.app.launched import PEER_LOST, WRAPPED_ENV
from memlab.errors import MemlabError

STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGTERM, -signal.SIGINT)
"""Exit statuses of a process the launcher (or a user) stopped."""


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="run a verb on several processes (accelerate launch), failures in one line",
                       description="accelerate launch's options, then a memlab verb and its arguments (e.g. "
                                   "`memlab launch --multi_gpu --num_processes 2 train CONFIG`); `--` may separate "
                                   "them. The launcher's and the collectives' tracebacks become one line naming the "
                                   "process that failed.")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="accelerate launch options, then VERB and its arguments")
    p.set_defaults(func=run)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[launcher options..., VERB, verb args...]`` -> (launcher options, verb and its arguments)."""
    from memlab.app.cli import VERBS

    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    for i, a in enumerate(argv):
        if a in VERBS and a != "launch" and not (i and argv[i - 1].startswith("--") and "=" not in argv[i - 1]
                                                 and argv[i - 1] in VALUE_OPTIONS):
            return argv[:i], argv[i:]
    raise MemlabError(f"memlab launch needs a verb to run ({', '.join(v for v in VERBS if v != 'launch')}) after "
                      "the launcher's options")


VALUE_OPTIONS = ("--config_file", "--main_process_ip", "--mixed_precision", "--dynamo_backend", "--main_training_function")
"""Launcher options whose value could be a word (the value is never taken for the verb)."""


def describe(rank: int, world: int, exitcode: int) -> str | None:
    """The line for the process that failed first (None when it printed memlab's own line already)."""
    who = f"process {rank} of {world}"
    if exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.Signals._value2member_map_ else f"signal {-exitcode}"
        hint = " (out of memory, or killed by hand)" if -exitcode == signal.SIGKILL else ""
        return f"{who} was killed by {name}{hint}; the others were stopped"
    if exitcode == 2:
        return None  # memlab's one line, printed by the main process (or by the one that met it)
    if exitcode in STOPPED:
        return None if rank == 0 else f"{who} was stopped by {signal.Signals(exitcode - 128).name}"
    if exitcode == PEER_LOST:
        return f"{who} lost another process of the launch"
    return f"{who} failed with exit status {exitcode}" + (" (its traceback is above)" if exitcode == 1 else "")


def first_failure(failures: dict) -> tuple[int, object]:
    """The failure that caused the others: the earliest one that is not a consequence (a process stopped by the
    launcher, or one that lost its peer), else the earliest."""
    ordered = sorted(failures.items(), key=lambda kv: (kv[1].timestamp, kv[0]))
    causes = [kv for kv in ordered if kv[1].exitcode not in STOPPED + (PEER_LOST,)]
    return (causes or ordered)[0]


def quiet_launcher_logs() -> None:
    """The elastic agent's own log lines ("failed (exitcode: 2)", "Received 15 death signal"): replaced by the
    line :func:`run` prints. Its modules give each logger its own level (``LOGLEVEL``, read as they load)."""
    os.environ.setdefault("LOGLEVEL", "CRITICAL")
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(("torch.distributed", "accelerate")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def run(args) -> int:
    import sys

    quiet_launcher_logs()
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    quiet_launcher_logs()  # again, for the loggers that the imports above made
    launcher, verb = split_argv(list(args.argv))
    parsed = launch_command_parser().parse_args([*launcher, "-m", "memlab.app.cli", *verb])
    os.environ[WRAPPED_ENV] = "1"  # the processes leave naming the failed one to this launcher
    quiet_launcher_logs()
    try:
        launch_command(parsed)
    except ChildFailedError as e:
        rank, failure = first_failure(e.failures)
        world = int(getattr(parsed, "num_processes", None) or len(e.failures))
        line = describe(rank, world, failure.exitcode)
        if line:
            print(f"memlab: error: {line}", file=sys.stderr)
        code = failure.exitcode
        return code if code > 0 else 128 - code
    except SignalException as e:  # the launcher itself stopped (Ctrl-C): each process printed what it kept
        return 128 + int(e.sigval)
    except subprocess.CalledProcessError as e:  # one process (simple launcher): it printed its own line
        return e.returncode if e.returncode > 0 else 128 - e.returncode
    return 0
