"""``memlab launch ... invert`` (gloo's CPU launch, as training's and the probe's launches are tested): the chunks
shared out over two processes, each with its own records and log, merged by the main process into the one report
a one-process run gives (the readings and their intervals, the recovered tokens, the certificates), each
process's time and rate listed; ``kill -9`` of the launcher ends its workers, and ``memlab invert --resume``
finishes the run with the same report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from memlab.app.cli import main

# launches processes: one xdist worker runs every such module, one after another (their ports)
pytestmark = pytest.mark.xdist_group("processes")

ARGS = ["--model", "memlab-lm", "--layer", "2", "--seq-len", "6", "--n", "4", "--threads", "1", "--first-batch", "2"]
SAME = ("index", "text", "true_ids", "recovered_ids", "exact", "certificates", "tried", "exhaustive", "true_ranks",
        "found_at", "from_table")
READ = ("tried", "true_rank", "certificates", "exhaustive_positions", "share_of_vocab", "found_at", "prior_rank",
        "grad_rank", "secant_rank", "vocab_size", "model", "layer", "states", "text", "search")
LAUNCH = [sys.executable, "-m", "memlab.app.cli", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
          "1", "--mixed_precision", "no", "--dynamo_backend", "no", "invert"]


def _report(run):
    return json.loads((run / "report.json").read_text())


def _same_report(a: dict, b: dict) -> None:
    """The one-process run's report: every reading and interval (times apart), the tokens and certificates of each
    chunk; the distances within float noise (the chunks verified beside a chunk change the last bits)."""
    for k in READ:
        assert a[k] == b[k], k
    ta, tb = dict(a["totals"]), dict(b["totals"])
    ta.pop("seconds_per_token"), tb.pop("seconds_per_token")
    assert ta == tb
    assert [{k: c[k] for k in SAME} for c in a["chunks"]] == [{k: c[k] for k in SAME} for c in b["chunks"]]
    for ca, cb in zip(a["chunks"], b["chunks"]):
        assert ca["distances"] == pytest.approx(cb["distances"], rel=1e-3, abs=1e-5)
        assert ca["runner_up"] == pytest.approx(cb["runner_up"], rel=1e-4)


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    run = tmp_path_factory.mktemp("launch") / "one"
    assert main(["invert", *ARGS, "--out", str(run)]) == 0
    return run


def test_the_chunks_are_shared_out_chunk_by_chunk():
    from memlab.probes.invert.merge import Share

    assert Share(0, 2).mine([0, 1, 2, 3, 5]) == [0, 2]
    assert Share(1, 2).mine([0, 1, 2, 3, 5]) == [1, 3, 5]
    assert Share().mine([4, 7]) == [4, 7] and not Share().launched


@pytest.mark.usefixtures("one_thread")
def test_two_processes_give_the_one_process_report(one, tmp_path):
    two = tmp_path / "two"
    r = subprocess.run([*LAUNCH, *ARGS, "--out", str(two)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("exact match:") == 1 and r.stdout.count("run: ") == 1  # one summary: the main process's
    rep = _report(two)
    _same_report(_report(one), rep)
    procs = rep["processes"]
    assert [p["rank"] for p in procs] == [0, 1] and [p["chunks"] for p in procs] == [[0, 2], [1, 3]]
    assert all(p["seconds"] > 0 and p["tokens_per_second"] > 0 for p in procs)
    assert "process 1 of 2: 2 chunks" in (two / "summary.txt").read_text()
    assert (two / "log.1.txt").is_file()  # each process's own log
    names = sorted(p.name for p in two.iterdir() if not p.name.startswith("."))  # the records folded into one file, the meeting files gone
    assert names == ["chunks.jsonl", "invert.json", "log.1.txt", "log.txt", "report.json", "summary.txt"]
    assert sorted(json.loads(x)["index"] for x in (two / "chunks.jsonl").read_text().splitlines()) == [0, 1, 2, 3]


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in open(f"/proc/{pid}/status").read()
    except OSError:
        return False


@pytest.mark.slow  # a launch killed mid-run, then resumed: about a minute on 2 shared cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_the_launcher_ends_the_workers_and_resume_finishes_with_the_same_report(one, tmp_path):
    run = tmp_path / "killed"
    args = [*ARGS, "--chunk-batch", "1"]  # one chunk at a time: records early
    p = subprocess.Popen([*LAUNCH, *args, "--out", str(run)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 300 and p.poll() is None:
        files = list(run.glob("chunks*.jsonl")) if run.is_dir() else []
        if sum(f.read_text().count("\n") for f in files) >= 1:
            break
        time.sleep(0.02)
    workers = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                              text=True).stdout.split()]
    assert p.poll() is None and len(workers) == 2, "the launch ended before it could be killed"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t1 = time.time()
    while any(_alive(w) for w in workers) and time.time() - t1 < 10:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "a worker outlived its launcher by 10 s"
    assert not (run / "report.json").exists()
    assert main(["invert", "--resume", str(run)]) == 0
    rep = _report(run)
    a = _report(one)
    a["search"]["chunk_batch"] = rep["search"]["chunk_batch"]  # how many chunks go together: not what is found
    _same_report(a, rep)
