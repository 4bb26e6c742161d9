"""The probe on two processes (gloo on the CPU, as training's launches are tested): the encoder pass shared out and
gathered into one cache, one report naming both processes, the one-process reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.app.cli import main

# launches processes: one xdist worker runs every such module, one after another (their ports)
pytestmark = pytest.mark.xdist_group("processes")

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "synthetic:concat", "--seq-len", "8", "--n-train", "64", "--n-eval", "32", "--epochs", "1",
        "--no-bow", "ci_resamples=200"]


def _launch2(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "memlab.app.cli", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
           "1", "--mixed_precision", "no", "--dynamo_backend", "no", "probe", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two launches of a few processes: about 2 minutes on 2 shared cores
@pytest.mark.usefixtures("one_thread")
def test_two_processes_share_the_encoder_pass_and_read_what_one_reads(tmp_path):
    cache = tmp_path / "cache"
    r = _launch2(*TINY, "--out", str(tmp_path / "two"), "--cache-dir", str(cache))
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    procs = two["timing"]["processes"]
    assert procs["count"] == 2 and len(procs["devices"]) == 2
    assert r.stdout.count("retention:") == 1  # one summary: the main process reports
    assert sorted(p.name.split(".", 1)[1] for p in cache.glob("emb-*")) == \
        ["float32.bin", "float32.bin", "float32.json", "float32.json"]  # no lock left
    assert main(["probe", *TINY, "--threads", "1", "--out", str(tmp_path / "one"), "--cache-dir", str(cache)]) == 0
    one = json.loads((tmp_path / "one" / "report.json").read_text())
    assert one["timing"]["encode_cached"]  # the gathered cache is the one-process run's
    assert "processes" not in one["timing"]
    a, b = one["readings"]["bits_per_chunk"], two["readings"]["bits_per_chunk"]
    assert a["low"] <= b["value"] <= a["high"]
    assert b["value"] == pytest.approx(a["value"], abs=1e-9)  # the same fit: a code encoder's numbers are exact


def test_a_sweep_is_refused_in_a_launch_in_one_line(tmp_path):
    r = _launch2(*TINY, "--n-train", "32,64", "--out", str(tmp_path / "curve"))
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memlab: error:")]
    assert len(lines) == 1 and "runs one probe" in lines[0]
    assert not (tmp_path / "curve").exists()
