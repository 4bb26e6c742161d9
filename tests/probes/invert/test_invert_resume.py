"""Nothing found is lost: a per-position inversion killed with SIGKILL and resumed with ``--resume`` redoes no
finished chunk and ends with the report of an uninterrupted run; ``memlab.probes.invert`` from Python."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ARGS = ["--model", "memlab-lm", "--layer", "2", "--seq-len", "8", "--n", "5", "--threads", "1",
        "--chunk-batch", "1", "--first-batch", "2"]
SAME = ("index", "true_ids", "recovered_ids", "exact", "certificates", "tried", "exhaustive", "found_at")


def _cli(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


def _chunks(run):
    return [{k: c[k] for k in SAME} for c in json.loads((run / "report.json").read_text())["chunks"]]


def test_kill_and_resume_gives_the_uninterrupted_report(tmp_path, capsys):
    killed = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "memlab.app.cli", "invert", *ARGS, "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    lines = killed / "chunks.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if lines.is_file() and lines.read_text().count("\n") >= 2:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (killed / "report.json").exists()
    before = [json.loads(x)["index"] for x in lines.read_text().splitlines() if x.endswith("}")]
    assert 2 <= len(before) < 5

    code, cap = _cli("--resume", str(killed), capsys=capsys)
    assert code == 0, cap.err
    log = (killed / "log.txt").read_text()
    assert f"resumed: {len(before)} of 5 chunks kept, {5 - len(before)} to search" in log
    after = [json.loads(x)["index"] for x in lines.read_text().splitlines()]
    assert sorted(after) == list(range(5))  # each chunk searched once: none of the kept ones again

    whole = tmp_path / "whole"
    code, cap = _cli(*ARGS, "--out", str(whole), capsys=capsys)
    assert code == 0, cap.err
    assert _chunks(killed) == _chunks(whole)
    a, b = (json.loads((r / "report.json").read_text()) for r in (killed, whole))
    assert a["certificates"] == b["certificates"] and a["totals"]["exact_match"] == b["totals"]["exact_match"]


@pytest.mark.parametrize("argv, says", [
    (["--resume", "{tmp}/nothing"], "no such run folder"),
    (["--resume", "{tmp}"], "not a run of memlab invert"),
    (["--resume", "{run}", "--budget", "4"], "give no --budget"),
    (["--resume", "{run}"], "has finished"),
])
def test_resume_bad_input_one_line(argv, says, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "invert.json").write_text(json.dumps({"kind": "memlab invert", "options": {}}))
    (run / "report.json").write_text("{}")
    argv = [a.format(tmp=tmp_path, run=run) for a in argv]
    code, cap = _cli(*argv, capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error:") and says in lines[0], cap.err


def test_python_entry_returns_the_report(tmp_path):
    import memlab.probes

    rep = memlab.probes.invert("memlab-lm", layer=2, out=tmp_path / "r", seq_len=4, n=2, threads=1, first_batch=4)
    assert rep.totals["exact_match"].value == 1.0 and len(rep.chunks) == 2
    assert (tmp_path / "r" / "report.json").is_file() and (tmp_path / "r" / "chunks.jsonl").is_file()
    with pytest.raises(TypeError, match="no option named 'budgett'"):
        memlab.probes.invert("memlab-lm", layer=2, budgett=3)


def test_pooled_search_resumes_too(tmp_path, capsys):
    """The pooled search keeps its chunks the same way: a run cut after its first chunk and resumed ends with the
    chunks of the whole run."""
    import shutil

    args = ["--model", "memlab-lm", "--layer", "2", "--states", "last", "--seq-len", "4", "--n", "3", "--forwards",
            "16", "--threads", "1"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    code, cap = _cli(*args, "--out", str(whole), capsys=capsys)
    assert code == 0, cap.err
    shutil.copytree(whole, cut)
    (cut / "report.json").unlink()
    first = (cut / "chunks.jsonl").read_text().splitlines()[0]
    (cut / "chunks.jsonl").write_text(first + "\n")
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    assert code == 0, cap.err
    a, b = (json.loads((r / "report.json").read_text())["chunks"] for r in (whole, cut))
    assert [(c["recovered_ids"], c["control_ids"]) for c in a] == [(c["recovered_ids"], c["control_ids"]) for c in b]
    assert "resumed: 1 of 3 chunks kept, 2 to search" in (cut / "log.txt").read_text()
