"""Multi-process failures as one line: ``memlab launch`` (accelerate launch, its failures read as data), an error
every process meets printed once, a lost peer as one line. The unit checks are instant; one real 2-process
launch (gloo on the CPU, about 20 s) runs in the default suite, the others are marked slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from memlab.app import launched
from memlab.app.cli import main
from memlab.app.commands.launch import describe, first_failure, split_argv
from memlab.errors import MemlabError

# launches processes: one xdist worker runs every such module, one after another (their ports)
pytestmark = pytest.mark.xdist_group("processes")

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "configs" / "lcm" / "mse_toy.yaml")
LAUNCH2 = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no"]


def _memlab_launch(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "memlab.app.cli", "launch", *LAUNCH2, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _finish(p: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out + err


def _errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("memlab: error:")]


# ---------------------------------------------------------------------------------------------- unit checks
def test_launcher_options_and_the_verb_are_told_apart():
    assert split_argv(["--num_processes", "2", "train", "c.yaml", "x=1"]) == (["--num_processes", "2"],
                                                                              ["train", "c.yaml", "x=1"])
    assert split_argv(["--config_file", "a.yaml", "--", "probe", "--model", "m"]) == (["--config_file", "a.yaml"],
                                                                                     ["probe", "--model", "m"])
    with pytest.raises(MemlabError, match="needs a verb"):
        split_argv(["--num_processes", "2"])


def test_the_failed_process_is_named_with_its_cause():
    assert describe(1, 2, -signal.SIGKILL).startswith("process 1 of 2 was killed by SIGKILL")
    assert describe(0, 2, 2) is None  # memlab's own line was printed by the process
    assert describe(1, 2, 143) == "process 1 of 2 was stopped by SIGTERM"
    assert describe(0, 2, 143) is None  # the main process printed what it kept
    assert "traceback is above" in describe(1, 4, 1)
    fail = lambda code, t: SimpleNamespace(exitcode=code, timestamp=t)  # noqa: E731
    # the survivor that lost its peer, and one stopped by the launcher, are consequences of the killed one
    assert first_failure({0: fail(launched.PEER_LOST, 1), 1: fail(-9, 2), 2: fail(143, 2)})[0] == 1
    assert first_failure({0: fail(143, 5), 1: fail(143, 3)})[0] == 1  # only consequences: the earliest


def test_a_lost_peer_is_one_line_and_only_inside_a_launch(monkeypatch):
    class DistBackendError(RuntimeError):
        pass

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    line = launched.peer_lost(DistBackendError("[../gloo/transport/tcp/pair.cc:538] Connection closed by peer"))
    assert line.startswith("process 0 of 2 lost another process") and "Connection closed by peer" in line
    assert launched.peer_lost(ValueError("a bug")) is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launched.peer_lost(DistBackendError("Connection closed by peer")) is None


def test_an_error_every_process_meets_is_printed_by_the_main_one_only(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(launched, "QUIET_WAIT_S", 0.0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, printed in (("1", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        assert main(["train", TOY, "--out", str(tmp_path / "run"), "train.bogus=1"]) == 2
        assert len(_errors(capsys.readouterr().err)) == printed, rank


# ---------------------------------------------------------------------------------------------- real launches
def test_a_bad_launch_is_one_line_without_the_launchers_traceback(tmp_path):
    code, text = _finish(_memlab_launch("train", TOY, "--out", str(tmp_path / "run"), "train.bogus=1"))
    assert code == 2 and len(_errors(text)) == 1 and "unknown config key 'train.bogus'" in _errors(text)[0], text
    assert "Traceback" not in text and "ChildFailedError" not in text and not (tmp_path / "run").exists()


@pytest.mark.slow  # two more 2-process launches
@pytest.mark.parametrize("launch", ["batch", "fsdp"])
def test_refused_launches_are_one_line(tmp_path, launch):
    if launch == "batch":
        p = _memlab_launch("train", TOY, "--out", str(tmp_path / "run"), "train.batch_size=1")
        want = "must be divisible by processes (2)"
    else:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        p = subprocess.Popen([sys.executable, "-m", "memlab.app.cli", "launch", "--use_fsdp", "--num_processes", "2",
                              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "train", TOY,
                              "--out", str(tmp_path / "run")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        want = "FSDP, which memlab does not support"
    code, text = _finish(p)
    assert code == 2 and len(_errors(text)) == 1 and want in _errors(text)[0], text
    assert "Traceback" not in text


def _rank_pids(parent: int) -> dict[int, int]:
    """rank -> pid of the launched processes under ``parent`` (Linux: read from /proc)."""
    out = {}
    for pid in map(int, subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()):
        try:
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        except OSError:
            continue
        if "RANK" in env:
            out[int(env["RANK"])] = pid
    return out


@pytest.mark.slow  # a 2-process run killed half-way
def test_a_killed_process_is_named_and_the_survivor_prints_no_traceback(tmp_path):
    run = tmp_path / "run"
    p = _memlab_launch("train", TOY, "--out", str(run), "train.max_steps=5000", "train.save_every=10")
    t0 = time.time()
    while not list((run / "checkpoints").glob("step-*")) and time.time() - t0 < 240 and p.poll() is None:
        time.sleep(0.5)
    os.kill(_rank_pids(p.pid)[1], signal.SIGKILL)
    code, text = _finish(p)
    assert code == 128 + signal.SIGKILL and "Traceback" not in text and "Connection closed" not in text, text
    assert _errors(text) == ["memlab: error: process 1 of 2 was killed by SIGKILL (out of memory, or killed by hand); "
                             "the others were stopped"]


def test_each_distinct_error_line_of_the_processes_is_printed_once(tmp_path, monkeypatch):
    monkeypatch.setenv(launched.ERRORS_ENV, str(tmp_path))
    for rank, line in ((1, "memlab: error: same"), (0, "memlab: error: same"), (2, "memlab: error: other")):
        monkeypatch.setenv("RANK", str(rank))
        assert launched.hand_over(line)
    assert launched.collected(str(tmp_path)) == ["memlab: error: same", "memlab: error: other"]
    assert not list(tmp_path.glob("*.tmp"))
    monkeypatch.delenv(launched.ERRORS_ENV)
    assert not launched.hand_over("memlab: error: outside a launch")  # printed by the process itself


@pytest.mark.slow  # a 2-process run whose processes all meet the same error after the process group started
def test_an_error_met_by_every_process_after_the_group_started_is_one_line(tmp_path):
    p = _memlab_launch("train", TOY, "--out", str(tmp_path / "run"), f"model.init_from={tmp_path / 'none'}")
    code, text = _finish(p)
    assert code == 2 and "Traceback" not in text, text
    assert len(_errors(text)) == 1 and "neither a saved model" in _errors(text)[0], text
    assert not (tmp_path / "run").exists()
