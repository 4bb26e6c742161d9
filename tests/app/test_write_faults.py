"""Writes under faults, as a user's machine meets them: a file-size limit during a training run, ``kill -9`` in
the middle of each kind of write (a file replaced, the files a library saves, a folder made whole), a probe killed at
spread moments. What is left is the old file or the new one, never an empty or half file; a refusal is one line.
Runs of real work are marked slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from test_bad_input_sweep import assert_one_line, fresh


# ---------------------------------------------------------------------------------------------- real work, slow


@pytest.fixture(scope="module")
def toy_config(tmp_path_factory, small_corpus) -> Path:
    from conftest import write_config

    d = tmp_path_factory.mktemp("sweep")
    return write_config(d / "c.yaml", small_corpus, train={"max_steps": 4, "save_every": 2, "eval_every": 2})


def assert_whole(folder: Path) -> None:
    """Every file memlab left in ``folder`` (not its temporaries, set-aside copies or lock) is non-empty and reads
    whole: JSON parses, safetensors load."""
    for f in folder.rglob("*"):
        if not f.is_file() or ".tmp" in str(f.relative_to(folder)) or ".old" in f.name or f.name == ".memlab.lock":
            continue
        assert f.stat().st_size > 0, f"{f} is empty after kill -9"
        if f.suffix == ".json":
            json.loads(f.read_text())
        elif f.suffix == ".safetensors":
            load_file(str(f))


@pytest.mark.slow
@pytest.mark.parametrize("kib", [8, 64, 640])  # below the corpus's files, below the weights, below the optimizer's state
def test_a_file_size_limit_names_the_file_and_keeps_nothing_half_made(toy_config, tmp_path, kib):
    import resource

    out = tmp_path / "run"
    rc, _, err, _, _ = fresh(["train", str(toy_config), "--out", str(out)], limits={resource.RLIMIT_FSIZE: kib * 1024},
                             timeout=600)
    line = assert_one_line(rc, err)
    assert "file size limit" in line or "File too large" in line, line
    for f in out.rglob("*") if out.exists() else []:  # nothing empty, nothing under a temporary name
        assert ".tmp" not in f.name, f
        assert not f.is_file() or f.stat().st_size > 0 or f.name == ".memlab.lock", f


@pytest.mark.slow
def test_a_kill_during_any_write_leaves_every_file_whole(toy_config, tmp_path):
    """Train with a checkpoint at every step and kill -9 at spread moments; after each kill every file under its
    final name is whole (JSON parses, safetensors load, no empty file), and the run resumes to its end."""
    from memlab.train.metrics_log import read_metrics

    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "memlab.app.cli", "train", str(toy_config), "--out", str(run),
            "train.max_steps=12", "train.save_every=1", "train.eval_every=6"]
    for i, delay in enumerate((3.0, 4.5, 6.0, 7.5, 9.0)):
        p = subprocess.Popen(argv if i == 0 else argv[:3] + ["train", "--resume", str(run)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not run.exists():
            continue
        assert_whole(run)
        read_metrics(run / "metrics.jsonl", warn=False)  # a torn last line at most
    if (run / "config.yaml").is_file():
        done = subprocess.run(argv[:3] + ["train", "--resume", str(run)], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------------- kill -9 during writes

_WRITER = r"""
import json, sys
from pathlib import Path
from memlab.outdir import save_files, save_folder
from memlab.rundir import write_atomic

kind, folder = sys.argv[1], Path(sys.argv[2])
v = 0
while True:
    v += 1
    text = json.dumps({"version": v, "fill": [v] * 200_000})  # one version over 1 MB: whole or not is plain to see
    print("w", flush=True)  # the write starts now
    if kind == "file":
        write_atomic(folder / "f.json", text)
    elif kind == "files":
        save_files(folder / "model", lambda tmp: [(tmp / n).write_text(text) for n in ("config.json", "w.json")],
                   "the model")
    else:
        import shutil
        shutil.rmtree(folder / "old", ignore_errors=True)
        if (folder / "cache").exists():
            (folder / "cache").rename(folder / "old")
        save_folder(folder / "cache", lambda tmp: (tmp / "meta.json").write_text(text), "the cache")
"""


def _whole(path: Path) -> int:
    data = json.loads(path.read_text())  # a half file does not parse
    assert set(data["fill"]) == {data["version"]} and len(data["fill"]) == 200_000
    return data["version"]


@pytest.mark.parametrize("kind", ["file", "files", "folder"])
def test_a_kill_at_any_moment_of_a_write_leaves_the_old_file_or_the_new_one(kind, tmp_path):
    """The writers under kill -9: a file replaced (write_atomic), the files a library saves replaced one by one
    (save_files), a folder made whole then renamed (save_folder)."""
    import random

    rnd = random.Random(0)
    for _ in range(8):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, kind, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        for _ in range(2 + rnd.randrange(3)):  # one version written at least, then into a write
            p.stdout.readline()
        time.sleep(rnd.uniform(0.0, 0.01))
        p.kill()
        p.wait()
        p.stdout.close()
        files = {"file": ["f.json"], "files": ["model/config.json", "model/w.json"], "folder": ["cache/meta.json"]}
        for name in files[kind]:
            f = tmp_path / name
            if kind == "folder" and not f.exists():  # killed between setting the old copy aside and the rename
                f = tmp_path / "old" / "meta.json"
            assert _whole(f) >= 1
        if kind == "folder":  # the writer takes its copy aside itself; leftovers of a kill are temporary names
            for leftover in tmp_path.glob("cache.tmp*"):
                shutil_rmtree(leftover)


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_kill_during_a_probe_leaves_no_empty_or_half_file(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for delay in (6.0, 12.0, 18.0, 24.0, 30.0):
        out = tmp_path / f"probe-{delay:.0f}"
        p = subprocess.Popen([sys.executable, "-m", "memlab.app.cli", "probe", "--model", "synthetic:concat", "--out",
                              str(out), "n_train=64", "n_eval=16", "epochs=1"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.kill()
        p.wait()
        if out.exists():
            assert_whole(out)
