"""Bad input on every verb: one line ``memlab: error: ...``, exit 2, answered before torch is imported.

The cases are built from the registered verbs (:data:`memlab.app.cli.VERBS`, every module of
``memlab.app.commands``) and from their parsers' options, so a new verb or a new typed flag is covered when it is
added: ``--help`` and an unknown flag in a fresh interpreter (torch not imported, fast), every typed option given a
value of the wrong type or range, a path too long for the file system for every option that names a folder to
write, an address-space limit too small to start torch. A table adds the cases that need a verb's own knowledge
(flags that do nothing together, repeated values). Writes under a file-size limit and under kill -9 are in
``test_write_faults.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memlab.app import cli
from memlab.app import commands as cmd

# launches processes: one xdist worker runs every such module, one after another (their ports)
pytestmark = pytest.mark.xdist_group("processes")

ROOT = Path(__file__).resolve().parents[2]


FAST_S = 1.0
"""Most seconds a refusal may take inside the interpreter (imports and parsing, not the interpreter's start)."""

_PROBE = (
    "import sys, time\n"
    "t = time.perf_counter()\n"
    "from memlab.app.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "sys.stderr.write('\\n@@ torch=%d seconds=%.3f\\n' % ('torch' in sys.modules, time.perf_counter() - t))\n"
    "sys.exit(rc)\n"
)


def fresh(argv: list[str], limits=None, timeout: float = 120) -> tuple[int, str, str, bool, float]:
    """``memlab ARGV`` in a fresh interpreter: (exit status, stdout, stderr without the probe line, whether torch was
    imported, seconds from the first import to the answer). ``limits``: ``{resource: bytes}`` set in the child."""

    def preexec():
        import resource

        for which, value in (limits or {}).items():
            resource.setrlimit(which, (value, value))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=timeout, preexec_fn=preexec if limits else None)
    err, _, tail = p.stderr.rpartition("\n@@ ")
    fields = dict(kv.split("=") for kv in tail.split()) if tail.startswith("torch=") else {}
    return p.returncode, p.stdout, err if fields else p.stderr, fields.get("torch") == "1", float(
        fields.get("seconds", "nan"))


def assert_one_line(rc: int, err: str, phrase: str = "") -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("memlab: error: "), err
    assert "Traceback" not in err
    assert phrase in lines[0], lines[0]
    return lines[0]


def no_torch(verb: str, torch_loaded: bool, seconds: float) -> None:
    assert not torch_loaded, f"memlab {verb} imported torch before answering"
    assert seconds < FAST_S, f"memlab {verb} took {seconds:.2f} s to answer"


TOY = str(ROOT / "configs" / "token_lm" / "toy.yaml")

NEEDS = {"train": [TOY], "eval": ["--run", "r"], "probe": ["--model", "m"], "invert": ["--model", "m", "--layer", "1"],
         "generate": ["--run", "r", "--prompt", "x"], "plot": ["r"]}
"""What a verb needs besides the flag under test (its required arguments); a verb not named needs nothing."""


def command(verb: str, *args: str) -> list[str]:
    return [verb, *NEEDS.get(verb, []), *args]


def answer(argv: list[str], capsys) -> tuple[int, str, bool, float]:
    """(exit status, stderr, torch imported, seconds) of ``memlab ARGV`` in a fresh interpreter."""
    rc, _, err, torch_loaded, seconds = fresh(argv)
    return rc, err, torch_loaded, seconds


def verb_parser(verb: str) -> argparse.ArgumentParser:
    parser = cli.build_parser(full=[verb])
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[verb]


# ---------------------------------------------------------------------------------------------- every verb


@pytest.mark.parametrize("verb", cli.VERBS)
def test_help_is_answered_before_torch_is_imported(verb):
    rc, out, err, torch_loaded, seconds = fresh([verb, "--help"])
    assert rc == 0 and f"usage: memlab {verb}" in out, err
    no_torch(verb, torch_loaded, seconds)


def test_the_verb_list_is_answered_before_torch_is_imported():
    rc, out, err, torch_loaded, seconds = fresh(["--help"])
    assert rc == 0 and not torch_loaded and seconds < FAST_S, err
    for verb in cli.VERBS:
        assert f"    {verb}" in out
    rc, _, err, torch_loaded, _ = fresh(["no-such-verb"])
    assert_one_line(rc, err, "invalid choice") and not torch_loaded


@pytest.mark.parametrize("verb", [v for v in cli.VERBS if v != "launch"])
def test_an_unknown_flag_is_one_line_before_torch_is_imported(verb, capsys):
    rc, err, torch_loaded, seconds = answer(command(verb, "--no-such-flag", "1"), capsys)
    assert_one_line(rc, err, "unrecognized arguments: --no-such-flag")
    no_torch(verb, torch_loaded, seconds)


BAD_FOR_TYPE = {
    cmd.positive_int: ["0", "-3", "1.5", "x"],
    cmd.non_negative_int: ["-1", "x"],
    cmd.positive_float: ["0", "-1e-3", "nan", "x"],
    cmd.fraction: ["0", "1.5", "x"],
    cmd.int_list: ["0", "-64", "8,8", "8,,16", "x"],
    cmd.int_list_text: ["0", "-64", "8,8", "8,,16", "x"],
    int: ["x", "1.5"],
    float: ["x"],
}
"""Values each option type refuses; an option whose type is not here is refused a value by its choices, if any."""


def typed_cases():
    for verb in cli.VERBS:
        if verb == "launch":
            continue
        for action in verb_parser(verb)._actions:
            if not action.option_strings or action.nargs not in (None, 1):
                continue
            flag = max(action.option_strings, key=len)
            bad = BAD_FOR_TYPE.get(action.type, [])
            if action.choices is not None:
                bad = bad + ["no-such-choice"]
            elif getattr(action.type, "__name__", "") == "list":  # a comma list of names: a repeat, a stranger
                bad = bad + ["no-such-name"]
            for value in bad:
                yield pytest.param(verb, flag, value, id=f"{verb} {flag}={value}")


@pytest.mark.parametrize("verb,flag,value", list(typed_cases()))
def test_every_typed_option_refuses_a_wrong_value_in_one_line(verb, flag, value, capsys):
    assert cli.main([verb, f"{flag}={value}"]) == 2
    err = capsys.readouterr().err
    assert_one_line(2, err, f"argument {flag}")


# ---------------------------------------------------------------------------------------------- the table

CASES = [  # (argv, phrase of the one line)
    (["invert", "--model", "m", "--layer", "1", "--seq-len", "0"], "--seq-len must be >= 2"),
    (["invert", "--model", "m", "--layer", "1", "--n", "x"], "--n takes an integer"),
    (["invert", "--model", "m", "--layer", "1", "--states", "sum"],
     "--states takes positions, last, mean, first, second_last, logits or space"),
    (["invert", "--model", "m"], "give --layer"),
    (["bench", "--mfu-steps", "0"], "--mfu-steps: must be a positive integer"),
    (["bench", "--mfu-steps=-3"], "--mfu-steps: must be a positive integer"),
    (["bench", "--prefill-lengths", "0"], "--prefill-lengths: each value must be a positive integer"),
    (["bench", "--prefill-lengths=-64"], "--prefill-lengths: each value must be a positive integer"),
    (["bench", "--generation-contexts", "256,256"], "256 is given twice"),
    (["bench", "--parts", "mfu,mfu"], "'mfu' is given twice"),
    (["eval", "--run", "r", "--task", "needle", "--needle-lengths", "0"], "each value must be a positive integer"),
    (["eval", "--run", "r", "--task", "needle", "--needle-lengths=-5"], "each value must be a positive integer"),
    (["eval", "--run", "r", "--task", "needle", "--task", "needle"], "--task needle is given twice"),
    (["eval", "--run", "r", "--run", "r"], "--run r is given twice"),
    (["eval", "--scaling", "s.yaml", "--run", "r"], "--scaling runs a sweep of its own"),
    (["eval"], "give at least one --run"),
    (["generate", "--run", "r", "--prompt", "It was", "--temperature", "0.7"], "--temperature applies to sampling"),
    (["generate", "--run", "r", "--prompt", "  "], "a prompt must hold some text"),
    (["plot", "r", "--metrics", "loss", "loss"], "--metrics names loss twice"),
    (["train"], "give a config file"),
    (["eval", "--run", "r", "--device", "gpu0"], "--device gpu0: not a device"),
    (["generate", "--run", "r", "--prompt", "x", "--device", "cuda:x"], "--device cuda:x: not a device"),
    (["bench", "--device", "auto:0"], "--device auto:0: not a device"),
    (["train", TOY, "--restart"], "--restart applies to --resume RUN"),
    (["train", "--resume", "r", "--out", "o"], "--out applies to a new run"),
    (["list", "--bogus"], "unrecognized arguments: --bogus (see memlab list --help)"),
    (["probe", "--model", "m", "--seq-len", "8,8"], "8 is given twice"),
    (["probe", "--model", "m", "--n-train", "100,200,100"], "100 is given twice"),
    (["probe", "--model", "m", "--n-train", "8,,16"], "--n-train: an empty item in '8,,16'"),
    (["probe", "--model", "m", "--seq-len", "8,,16"], "'seq_len': an empty item in '8,,16'"),
    (["probe", "--model", "m", "--n-train", "64,"], "--n-train: an empty item in '64,'"),
    (["probe", "--model", "m", "--seq-len", ",8"], "'seq_len': an empty item in ',8'"),
    (["probe", "--model", "m", "--seq-len", "8,1"], "'seq_len' must be >= 2"),
    (["probe", "--model", "m", "seq_len=8,,16"], "'seq_len': an empty item in '8,,16'"),
    (["probe", "--model", "m", "seq_len=8,8"], "'seq_len': 8 is given twice"),
    (["probe", "--model", "m", "--seed", "-1"], "'seed' must be an integer in [0, 2**32), got -1"),
    (["probe", "--model", "m", "--epochs", "0"], "'epochs' must be a finite number > 0, got 0"),
    (["probe", "--model", "m", "--lr", "nan"], "'lr' must be a finite number > 0, got nan"),
    (["probe", "--model", "m", "--cache-dtype", "bogus"], "'cache_dtype' must be one of float32, float16, bfloat16"),
    (["probe", "--model", "m", "epochs=0"], "'epochs' must be a finite number > 0"),
    (["probe", "--model", "m", "fit.lr=nan"], "'lr' must be a finite number > 0"),
    (["probe", "--model", "./no-such-model"], "model path './no-such-model' does not exist"),
    (["probe", "--model", "/no/such/model"], "model path '/no/such/model' does not exist"),
    (["probe", "--model", "m", "--corpus", "/no/such/corpus.txt"], "corpus '/no/such/corpus.txt' not found"),
    (["probe", "--model", "m", "--corpus", "no-such-corpus.jsonl"], "corpus 'no-such-corpus.jsonl' not found"),
    (["probe", "--model", "m", "--cache-dir", "/proc/no-such-cache"], "--cache-dir /proc/no-such-cache cannot be "
                                                                      "created"),
    (["invert", "--model", "m", "--layer", "1", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["invert", "--model", "m", "--layer", "1", "--noise", "inf"], "--noise takes a finite number, got 'inf'"),
    (["invert", "--model", "m", "--layer", "1", "--noise", "nan"], "--noise takes a finite number, got 'nan'"),
    (["invert", "--model", "m", "--layer", "1", "--n", "1e20"], "--n takes an integer, got '1e20'"),
    (["invert", "--model", "m", "--layer", "1", "--n", "300"], "--n 300 is more than the --n-eval 256 chunks"),
    (["invert", "--model", "m", "--layer", "1", "--cache-dir", "/proc/no-such-cache"], "--cache-dir "
                                                                                        "/proc/no-such-cache cannot"),
    (["invert", "--model", "./no-such-model", "--layer", "1"], "model path './no-such-model' does not exist"),
    (["invert", "--model", "m", "--layer", "1", "--states-from", "/no/such/model"], "model path '/no/such/model'"),
    (["invert", "--model", "m", "--layer", "1", "--corpus", "/no/such/corpus"], "corpus '/no/such/corpus' not found"),
    (["launch", "--multi_gpu", "--num_processes", "0", "train", TOY], "--num_processes must be a positive integer"),
    (["launch", "--multi_gpu", "--num_processes", "2", "probe", "--model", "m", "--seq-len", "8,8"], "8 is given twice"),
    (["launch", "--multi_gpu", "--num_processes", "2", "invert", "--layer", "1"], "give --model NAME_OR_PATH"),
    (["launch", "--multi_gpu", "--num_processes", "2", "bench", "--mfu-steps", "0"], "`memlab bench` runs in one process"),
    (["launch", "--use_fsdp", "--num_processes", "2", "train", TOY], "the launch asks for FSDP, which memlab does not"),
    (["launch", "--use_deepspeed", "--num_processes", "2", "probe", "--model", "m"], "asks for DeepSpeed"),
    (["launch", "--multi_gpu", "--num_processes", "2"], "memlab launch needs a verb to run"),
]


@pytest.mark.parametrize("argv,phrase", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_a_known_bad_input_is_one_line_before_torch_is_imported(argv, phrase, capsys):
    rc, err, torch_loaded, seconds = answer(argv, capsys)
    assert_one_line(rc, err, phrase)
    no_torch(argv[0], torch_loaded, seconds)


def test_an_unknown_launcher_option_is_one_line_not_the_launchers_usage():
    rc, _, err, _, _ = fresh(["launch", "--multi_cpu", "train", TOY])
    assert_one_line(rc, err, "unrecognized arguments: --multi_cpu")


def test_a_launch_that_would_start_one_process_is_refused(tmp_path):
    rc, _, err, _, _ = fresh(["launch", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                              "--dynamo_backend", "no", "train", TOY, "--out", str(tmp_path / "run")])
    assert_one_line(rc, err, "--num_processes 2 would start one process: add --multi_gpu")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- paths and limits


def path_cases():
    for verb in cli.VERBS:
        if verb == "launch":
            continue
        for action in verb_parser(verb)._actions:
            if action.dest in cli.PATH_FLAGS and action.option_strings:
                yield pytest.param(verb, max(action.option_strings, key=len), id=f"{verb} {action.dest}")


@pytest.mark.parametrize("verb,flag", list(path_cases()))
@pytest.mark.parametrize("shape", ["long name", "long path"])
def test_a_path_too_long_is_one_line_and_makes_nothing(verb, flag, shape, tmp_path, capsys):
    if shape == "long name":
        path = tmp_path / ("n" * 300) / "run"
    else:
        path = tmp_path.joinpath(*["p" * 200] * 24) / "run"
    rc, err, torch_loaded, seconds = answer(command(verb, flag, str(path)), capsys)
    assert_one_line(rc, err, "ENAMETOOLONG")
    assert sorted(tmp_path.iterdir()) == []
    no_torch(verb, torch_loaded, seconds)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
@pytest.mark.parametrize("verb", [v for v in cli.VERBS if v != "launch"])
def test_an_address_space_too_small_for_torch_is_one_line_at_once(verb, tmp_path):
    import resource

    from memlab.limits import BASE_MIB

    out = tmp_path / "run"
    outs = {a.dest for a in verb_parser(verb)._actions}
    argv = command(verb, *(["--out", str(out)] if "out" in outs else []))
    limit = (BASE_MIB // 2) * 2**20  # room for Python, not for torch
    t = time.monotonic()
    rc, _, err, torch_loaded, _ = fresh(argv, limits={resource.RLIMIT_AS: limit}, timeout=60)
    assert time.monotonic() - t < 30  # never the thread pool's endless start-up
    if rc == 2 and "the address-space limit" not in err:  # a verb refused what it was given first: one line too
        assert_one_line(rc, err)
    else:
        assert_one_line(rc, err, f"the address-space limit (ulimit -v) is {BASE_MIB // 2} MiB")
    assert not torch_loaded and not out.exists()


def test_the_address_space_check_says_how_many_threads_fit(monkeypatch):
    from memlab import limits
    from memlab.errors import MemlabError

    need = limits.needed_mib(4)
    monkeypatch.setattr(limits, "address_space_limit", lambda: (limits.needed_mib(2) + 1) * 2**20)
    with pytest.raises(MemlabError, match=rf"torch on 4 CPU threads needs about {need} MiB.*OMP_NUM_THREADS=2"):
        limits.check_address_space(4)
    limits.check_address_space(2)  # fits
    monkeypatch.setattr(limits, "address_space_limit", lambda: None)
    limits.check_address_space(64)  # no limit


def test_running_out_of_memory_is_recognised():
    from memlab.limits import memory_failure

    assert "out of memory" in memory_failure(MemoryError())
    assert memory_failure(RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate "
                                       "memory: you tried to allocate 8589934592 bytes"))
    assert "importing numpy" in memory_failure(ImportError("failed to map segment from shared object", name="numpy"))
    assert memory_failure(RuntimeError("shape mismatch")) is None and memory_failure(ValueError("x")) is None


@pytest.mark.parametrize("kw", [dict(mfu_steps=0), dict(mfu_steps=-3), dict(prefill_lengths=[0]),
                                dict(prefill_lengths=[-64]), dict(generation_contexts=[256, 256])])
def test_the_bench_api_refuses_what_its_flags_refuse(kw, tmp_path):
    from memlab.app.bench.runner import run_bench
    from memlab.errors import MemlabError

    with pytest.raises(MemlabError, match="must be a positive integer"):
        run_bench(tmp_path / "b", ["flops"], **kw)
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------------------------------------- probe and invert


@pytest.mark.parametrize("verb", ["probe", "invert"])
def test_an_out_already_used_is_refused_before_torch_and_kept(verb, tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "report.json").write_text("{}\n")
    (used / "probe.json").write_text("{}\n")
    before = sorted((p.name, p.read_text()) for p in used.iterdir())
    rc, _, err, torch_loaded, seconds = fresh(command(verb, "--out", str(used)))
    assert_one_line(rc, err, f"directory {used} already holds files (a probe); choose another --out")
    no_torch(verb, torch_loaded, seconds)
    assert sorted((p.name, p.read_text()) for p in used.iterdir()) == before


def test_an_inversions_folder_is_called_an_inversion(tmp_path):
    used = tmp_path / "inv"
    used.mkdir()
    for name in ("report.json", "summary.txt"):
        (used / name).write_text("x\n")
    rc, _, err, torch_loaded, _ = fresh(command("invert", "--out", str(used)))
    assert_one_line(rc, err, "already holds files (an inversion)")
    assert not torch_loaded


def test_a_probe_config_with_bad_values_is_refused_before_torch(tmp_path):
    cfg = tmp_path / "probe.yaml"
    cfg.write_text("model: m\nfit:\n  epochs: 0\n")
    rc, _, err, torch_loaded, seconds = fresh(["probe", "--config", str(cfg)])
    assert_one_line(rc, err, "'epochs' must be a finite number > 0")
    no_torch("probe", torch_loaded, seconds)
    cfg.write_text("recipe: probe\noptions:\n  model: m\n  seed: -3\n")
    rc, _, err, torch_loaded, seconds = fresh(["probe", "--config", str(cfg)])
    assert_one_line(rc, err, "'seed' must be an integer in [0, 2**32), got -3")
    no_torch("probe", torch_loaded, seconds)


@pytest.mark.parametrize("verb", ["probe", "invert"])
def test_a_full_disk_at_out_is_one_line_naming_the_folder(verb, tmp_path, monkeypatch, capsys):
    import errno

    from memlab.app import commands

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commands.os, "write", full)
    out = tmp_path / "run"
    assert cli.main(command(verb, "--out", str(out))) == 2
    line = assert_one_line(2, capsys.readouterr().err)
    assert f"--out {out}: cannot write into {tmp_path} (the disk is full)" in line
    assert sorted(tmp_path.iterdir()) == []
