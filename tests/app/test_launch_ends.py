"""Launches that end together: the processes of ``memlab launch`` end with their launcher, whatever signal ended it
(``kill -9`` included), and write nothing after; a verb that does not run on several processes, and a sharded
engine, are refused in one line before any process starts. The tie itself is checked with real processes in
seconds; one real 2-process launch killed with ``kill -9`` is marked slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memlab.app import launched
from memlab.app.cli import main

# launches processes: one xdist worker runs every such module, one after another (their ports)
pytestmark = pytest.mark.xdist_group("processes")

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "configs" / "lcm" / "mse_toy.yaml")

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from memlab.app import launched
    if {no_death_signal}:
        launched._death_signal = lambda: False  # the watchdog alone, as where there is no prctl
    launched.tie_to_launcher(every=0.1)
    Path({started!r}).write_text("started")
    time.sleep(2.5)
    Path({after!r}).write_text("written after its launcher died")
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    env = {{**os.environ, {env!r}: str(os.getpid())}}
    subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env)
    time.sleep(60)
""")


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended (its new parent reaps it when it will)


def _child_of(parent: int, deadline: float) -> int:
    while time.time() < deadline:
        kids = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    raise AssertionError("the child did not start")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("no_death_signal", [False, True], ids=["death-signal", "watchdog"])
def test_a_launched_process_ends_when_its_launcher_is_killed(tmp_path, no_death_signal):
    started, after = tmp_path / "started", tmp_path / "after"
    child = CHILD.format(no_death_signal=no_death_signal, started=str(started), after=str(after))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(env=launched.LAUNCHER_ENV), child], env=env)
    try:
        deadline = time.time() + 60
        pid = _child_of(parent.pid, deadline)
        while not started.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert started.exists()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        t0 = time.time()
        while _alive(pid) and time.time() - t0 < 10:
            time.sleep(0.05)
        assert not _alive(pid), "the launched process outlived its launcher"
        assert time.time() - t0 < 3
        time.sleep(max(0.0, 3.0 - (time.time() - t0)))
        assert not after.exists(), "the launched process wrote after its launcher died"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_outside_memlab_launch_a_process_is_not_tied(monkeypatch):
    monkeypatch.delenv(launched.LAUNCHER_ENV, raising=False)
    assert not launched.tie_to_launcher()


def _errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("memlab: error:")]


@pytest.mark.parametrize("verb", [["generate", "x"], ["quickstart"], ["bench"],
                                  ["eval", "x"]])
def test_a_verb_that_runs_in_one_process_is_refused_under_launch(tmp_path, capsys, verb):
    out = tmp_path / "run"
    assert main(["launch", "--multi_gpu", "--num_processes", "2", *verb, "--out", str(out)]) == 2
    (line,) = _errors(capsys.readouterr().err)
    assert line == (f"memlab: error: memlab launch: `memlab {verb[0]}` runs in one process (only train, probe "
                    "and invert run on several): run it without memlab launch")
    assert not out.exists()


@pytest.mark.parametrize("flag,engine", [(["--use_fsdp"], "FSDP"), (["--use_deepspeed"], "DeepSpeed"),
                                         (["--zero_stage", "2"], "DeepSpeed"), (["--use_megatron_lm"], "Megatron-LM"),
                                         (["--fsdp_version=2"], "FSDP")])
@pytest.mark.parametrize("verb", ["train", "probe"])
def test_a_sharded_engine_is_refused_for_every_verb(tmp_path, capsys, flag, engine, verb):
    args = [TOY] if verb == "train" else ["--model", "m"]
    out = tmp_path / "run"
    assert main(["launch", *flag, "--num_processes", "2", verb, *args, "--out", str(out)]) == 2
    (line,) = _errors(capsys.readouterr().err)
    assert f"the launch asks for {engine}, which memlab does not support" in line and not out.exists()


@pytest.mark.parametrize("kind,engine", [("FSDP", "FSDP"), ("DEEPSPEED", "DeepSpeed"), ("MEGATRON_LM", "Megatron-LM")])
def test_a_sharded_engine_asked_by_a_config_file_is_refused_before_any_process(tmp_path, capsys, kind, engine):
    cfg = tmp_path / "accelerate.yaml"
    cfg.write_text(f"compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nnum_processes: 2\n"
                   "num_machines: 1\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\n")
    out = tmp_path / "run"
    assert main(["launch", "--config_file", str(cfg), "train", TOY, "--out", str(out)]) == 2
    (line,) = _errors(capsys.readouterr().err)
    assert f"the launch asks for {engine}, which memlab does not support" in line and not out.exists()


def _workers(launcher: int) -> list[int]:
    return [int(x) for x in subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split()]


@pytest.mark.slow  # a real 2-process launch (about 40 s to its first checkpoint on a busy 2-core machine)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_memlab_launch_ends_its_processes_and_nothing_is_written_after(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "memlab.app.cli", "launch", "--multi_gpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "train", TOY,
                          "--out", str(run), "train.max_steps=5000", "train.save_every=10"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not list((run / "checkpoints").glob("step-*")) and time.time() - t0 < 240 and p.poll() is None:
        time.sleep(0.3)
    workers = _workers(p.pid)
    assert len(workers) == 2 and p.poll() is None
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t1 = time.time()
    while any(_alive(w) for w in workers) and time.time() - t1 < 10:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers) and time.time() - t1 < 3, "the workers outlived the launcher"
    files = {f: f.stat().st_mtime_ns for f in run.rglob("*") if f.is_file()}
    time.sleep(5)
    assert {f: f.stat().st_mtime_ns for f in run.rglob("*") if f.is_file()} == files  # nothing written after
    assert not (run / "summary.json").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_whose_launcher_is_gone_ends_and_one_whose_launcher_is_further_up_is_watched(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = "from memlab.app import launched; launched.tie_to_launcher(every=0.1); import time; time.sleep(20)"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process id that no longer runs
    started = time.time()
    child = subprocess.run([sys.executable, "-c", code], env={**env, launched.LAUNCHER_ENV: str(gone.pid)},
                           timeout=30)
    assert child.returncode == -signal.SIGKILL and time.time() - started < 15
    # a launcher that is not the parent (a process between them): its end is seen by the watchdog
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child = subprocess.Popen([sys.executable, "-c", code], env={**env, launched.LAUNCHER_ENV: str(launcher.pid)})
    try:
        time.sleep(3)
        assert child.poll() is None  # its launcher runs: it runs
        launcher.kill()
        launcher.wait()
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        for p in (launcher, child):
            if p.poll() is None:
                p.kill()
