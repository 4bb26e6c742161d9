"""memlab launch [accelerate launch options] VERB ...: run a memlab verb on several processes, failures in one line.

    memlab launch --multi_gpu --num_processes 2 train configs/lcm/mse_toy.yaml --out runs/x
    memlab launch --config_file my_accelerate.yaml -- train configs/x.yaml train.lr=1e-3

It is ``accelerate launch ... -m memlab.app.worker VERB ...`` (every launcher
option works; ``--`` may separate them from the verb), run in this process so
that a failure comes back as data rather than as the launcher's traceback: for
the process that failed first, one line says which one and why (killed by a
signal, stopped, an exit status), and the command exits non-zero. A process
that failed with memlab's own one-line error has printed it already; the
processes the launcher stopped because of it print nothing more.

Refused in one line before any process starts: a verb that does not run on
several processes (:data:`MULTI_PROCESS`: every verb but ``train``,
``probe`` and ``invert``; each would run whole on every process), and a sharded or offloaded
engine (FSDP, DeepSpeed, Megatron-LM, TPU or SageMaker launches, asked by a
flag or by an accelerate config file): memlab trains data-parallel (DDP)
replicas only. The processes end with the launcher: one that is killed, by any
signal, ``kill -9`` included, takes them with it within a second
(:func:`memlab.app.launched.tie_to_launcher`), and they write nothing after.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile

from memlab.app.launched import ERRORS_ENV, LAUNCHER_ENV, PEER_LOST, WRAPPED_ENV, collected
from memlab.errors import MemlabError

STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGTERM, -signal.SIGINT)
"""Exit statuses of a process the launcher (or a user) stopped."""


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="run train, probe or invert on several processes (accelerate launch), failures in one "
                                      "line",
                       description="accelerate launch's options, then a memlab verb and its arguments (e.g. "
                                   "`memlab launch --multi_gpu --num_processes 2 train CONFIG`); `--` may separate "
                                   "them. The launcher's and the collectives' tracebacks become one line naming the "
                                   "process that failed; the processes end with the launcher. Only train, probe and "
                                   "invert run on several processes, data parallel (no FSDP or DeepSpeed).")
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


MULTI_PROCESS = ("train", "probe", "invert")
"""The verbs that run on several processes (``train``: data-parallel replicas; ``probe``: the encoder pass shared
out; ``invert``: the chunks shared out, :mod:`memlab.probes.invert.merge`). Every other verb is refused under
``memlab launch``: it would run whole on every process."""

ENGINE_OPTIONS = {"--use_fsdp": "FSDP", "--fsdp_": "FSDP", "--use_deepspeed": "DeepSpeed", "--deepspeed_": "DeepSpeed",
                  "--zero_stage": "DeepSpeed", "--zero3_": "DeepSpeed", "--offload_": "DeepSpeed",
                  "--use_megatron_lm": "Megatron-LM", "--megatron_lm_": "Megatron-LM", "--tpu": "a TPU launch",
                  "--tpu_": "a TPU launch"}
"""Launcher options (or their prefixes) that ask for an engine memlab does not run under."""


def engine_refused(name: str) -> MemlabError:
    return MemlabError(f"memlab launch: the launch asks for {name}, which memlab does not support (its verbs run "
                       "data-parallel replicas, and its checkpoints hold full replicas); launch with --multi_gpu "
                       "(data parallel; it starts the processes on the CPU too where there is no GPU) or one process")


def check_verb(verb: list[str]) -> None:
    """A verb that does not run on several processes, refused before any process starts."""
    if verb and verb[0] not in MULTI_PROCESS and verb[0] not in ("-h", "--help"):
        raise MemlabError(f"memlab launch: `memlab {verb[0]}` runs in one process (only "
                          f"{', '.join(MULTI_PROCESS[:-1])} and {MULTI_PROCESS[-1]} run on several): run it without "
                          "memlab launch")


def check_engine(launcher: list[str]) -> None:
    """A sharded or offloaded engine asked by a launcher option, refused before any process starts."""
    for a in launcher:
        flag = a.split("=", 1)[0]
        for option, name in ENGINE_OPTIONS.items():
            if flag == option or (option.endswith("_") and flag.startswith(option)):
                raise engine_refused(name)


COUNT_OPTIONS = ("--num_processes", "--num_machines", "--num_cpu_threads_per_process")
"""Launcher options that take a count (at least 1)."""


def _option_values(launcher: list[str], name: str) -> list[str]:
    """The values given to launcher option ``name`` (``--name V`` or ``--name=V``)."""
    out = []
    for i, a in enumerate(launcher):
        if a == name and i + 1 < len(launcher):
            out.append(launcher[i + 1])
        elif a.startswith(name + "="):
            out.append(a.split("=", 1)[1])
    return out


def check(args) -> None:
    """The launcher's counts and the verb's own flags, checked once, here, before any process starts."""
    from memlab.app import cli

    launcher, verb = split_argv(list(args.argv))
    check_verb(verb)
    check_engine(launcher)
    for name in COUNT_OPTIONS:
        for value in _option_values(launcher, name):
            if not value.strip().isdigit() or int(value) < 1:
                raise MemlabError(f"memlab launch: {name} must be a positive integer, got {value!r}")
    try:
        _, verb_args = cli.parse(verb)
    except SystemExit as e:  # argparse printed its line (or the verb's help): nothing to launch
        if e.code:
            err = MemlabError("the verb's arguments were refused")
            err.quiet = True
            raise err from None
        args.answered = True
        return
    verb_check = getattr(sys.modules[cli.module_name(verb_args.verb)], "check", None)
    if verb_check is not None:
        verb_check(verb_args)


@contextlib.contextmanager
def engines_refused(launcher_module):
    """An engine that an accelerate config file asks for (its ``distributed_type``), refused by the launcher
    before it starts a process: accelerate reads the file and then calls the engine's launcher, replaced here."""
    names = {"deepspeed_launcher": "DeepSpeed", "tpu_launcher": "a TPU launch", "tpu_pod_launcher": "a TPU launch",
             "sagemaker_launcher": "a SageMaker launch"}
    real = {name: getattr(launcher_module, name) for name in [*names, "multi_gpu_launcher", "simple_launcher"]
            if hasattr(launcher_module, name)}

    def refuse(name):
        def refused(*a, **k):
            raise engine_refused(names[name])
        return refused

    def checked(name):
        def launcher(args):
            for attr, engine in (("use_fsdp", "FSDP"), ("use_deepspeed", "DeepSpeed"), ("use_megatron_lm", "Megatron-LM")):
                if getattr(args, attr, False):
                    raise engine_refused(engine)
            return real[name](args)
        return launcher

    for name in real:
        setattr(launcher_module, name, checked(name) if name.endswith(("multi_gpu_launcher", "simple_launcher"))
                else refuse(name))
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(launcher_module, name, fn)


@contextlib.contextmanager
def one_process_refused(launcher_module):
    """accelerate's simple launcher (one process) refuses a launch that asked for more than one: without
    ``--multi_gpu`` (or a config that sets a multi-process type) ``--num_processes N`` would start one worker."""
    real = launcher_module.simple_launcher

    def simple(args):
        n = getattr(args, "num_processes", None) or 1
        if n > 1:
            raise MemlabError(f"memlab launch: --num_processes {n} would start one process: add --multi_gpu (it "
                              "starts the processes on the CPU too where there is no GPU), or give --num_processes 1")
        return real(args)

    launcher_module.simple_launcher = simple
    try:
        yield
    finally:
        launcher_module.simple_launcher = real


def _refuse(message: str):
    raise MemlabError(f"memlab launch: {' '.join(message.split())} (the launcher's options: accelerate launch --help)")


def run(args) -> int:
    if getattr(args, "answered", False):  # the verb's --help
        return 0
    quiet_launcher_logs()
    import accelerate.commands.launch as accelerate_launch
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    quiet_launcher_logs()  # again, for the loggers that the imports above made
    launcher, verb = split_argv(list(args.argv))
    check_verb(verb)
    check_engine(launcher)
    parser = launch_command_parser()
    parser.error = _refuse  # an unknown or malformed launcher option: one line, not the launcher's usage
    parsed = parser.parse_args([*launcher, "-m", "memlab.app.worker", *verb])
    os.environ[WRAPPED_ENV] = "1"  # the processes leave naming the failed one to this launcher
    os.environ[LAUNCHER_ENV] = str(os.getpid())  # the processes end with this one (memlab.app.launched)
    quiet_launcher_logs()
    with tempfile.TemporaryDirectory(prefix="memlab-launch-") as errors:
        os.environ[ERRORS_ENV] = errors  # each process leaves its error line here; each distinct line is printed once
        try:
            return _launch(parsed, launch_command, accelerate_launch, errors, ChildFailedError, SignalException)
        finally:
            os.environ.pop(ERRORS_ENV, None)
            os.environ.pop(LAUNCHER_ENV, None)


def _launch(parsed, launch_command, accelerate_launch, errors: str, child_failed, signal_exception) -> int:
    try:
        with one_process_refused(accelerate_launch), engines_refused(accelerate_launch):
            launch_command(parsed)
    except ValueError as e:  # accelerate's checks of its options ("at least 2 processes to use --multi_gpu")
        raise MemlabError(f"memlab launch: {' '.join(str(e).split())}") from None
    except child_failed as e:
        rank, failure = first_failure(e.failures)
        world = int(getattr(parsed, "num_processes", None) or len(e.failures))
        _print_errors(errors, describe(rank, world, failure.exitcode))
        code = failure.exitcode
        return code if code > 0 else 128 - code
    except signal_exception as e:  # the launcher itself stopped (Ctrl-C): each process printed what it kept
        return 128 + int(e.sigval)
    except subprocess.CalledProcessError as e:  # one process (simple launcher)
        _print_errors(errors, None)
        return e.returncode if e.returncode > 0 else 128 - e.returncode
    return 0


def _print_errors(folder: str, line: str | None) -> None:
    """The line naming the process that failed first (when it did not print memlab's own line), then each
    distinct error line the processes left, once."""
    if line:
        print(f"memlab: error: {line}", file=sys.stderr)
    for text in collected(folder):
        print(text, file=sys.stderr)
