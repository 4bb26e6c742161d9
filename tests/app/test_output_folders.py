"""One writer for every verb's output folder, and a resume that fails leaves the run as it was.

Each verb refuses a folder that holds files (naming what it holds) or that another process holds; a file it
replaces is replaced whole or not at all; a storage failure is one line naming the file; a failed command
removes what it made. A resume's config and records wait for a checkpoint; a run folder that cannot take a
checkpoint is refused before any training step, naming the cause."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import copy_run, hold_folder, one_line_error, write_config
from memlab.app.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

STEP = "step-{:08d}"


def _snapshot(run: Path) -> dict[str, bytes]:
    """Every file under ``run`` (lock files aside), by relative path."""
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and not p.name.startswith(".memlab.lock")}


@contextlib.contextmanager
def _size_limit(limit: int):
    """``ulimit -f`` in bytes for this process (Python ignores SIGXFSZ: a write past it raises EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture(scope="module")
def base_run(small_corpus, tmp_path_factory) -> Path:
    """A finished 4-step token-LM run, checkpoints at steps 2 and 4 (copy it before changing it)."""
    tmp = tmp_path_factory.mktemp("outfolders")
    cfg = write_config(tmp / "c.yaml", small_corpus,
                       train={"max_steps": 4, "save_every": 2, "eval_every": 100, "log_every": 1})
    assert main(["train", str(cfg), "--out", str(tmp / "base")]) == 0
    return tmp / "base"


@pytest.fixture()
def run(base_run, tmp_path) -> Path:
    return copy_run(base_run, tmp_path / "r")


@pytest.fixture(scope="module")
def eval_dir(base_run, tmp_path_factory) -> Path:
    """An earlier eval's folder."""
    out = tmp_path_factory.mktemp("evals") / "ev"
    assert main(["eval", "--run", str(base_run), "--task", "hellaswag", "--limit", "2", "--out", str(out)]) == 0
    return out


def _eval(run: Path, out: Path) -> int:
    return main(["eval", "--run", str(run), "--task", "hellaswag", "--limit", "2", "--out", str(out)])


# ----------------------------------------------------------------------------- one writer: refusals


def test_every_verb_refuses_a_training_run_and_names_it(run, capsys):
    before = _snapshot(run)
    for argv in (["quickstart", "--fast", "--only", "synthetic:constant", "--out", str(run)],
                 ["eval", "--run", str(run), "--task", "hellaswag", "--limit", "2", "--out", str(run)],
                 ["bench", "--parts", "flops", "--out", str(run)]):
        assert main(argv) == 2, argv
        msg = one_line_error(capsys)
        assert f"{run} already holds files (a training run)" in msg, msg
    assert _snapshot(run) == before  # summary.json and metrics as they were: nothing added, nothing replaced


def test_eval_refuses_an_earlier_eval_and_leaves_it_whole(base_run, eval_dir, capsys):
    before = _snapshot(eval_dir)
    assert _eval(base_run, eval_dir) == 2
    assert "already holds files (an evaluation)" in one_line_error(capsys)
    assert _snapshot(eval_dir) == before
    assert json.loads((eval_dir / "eval.json").read_text())["results"]


def test_a_folder_in_use_is_refused_by_quickstart_and_plot(run, tmp_path, capsys):
    folder = tmp_path / "training"
    proc = hold_folder(folder, fresh=True)  # `memlab train --out folder` setting up: only its lock file is there
    try:
        assert main(["quickstart", "--fast", "--only", "synthetic:constant", "--out", str(folder)]) == 2
        assert f"in use by process {proc.pid}" in one_line_error(capsys)
    finally:
        proc.kill()
        proc.wait()
    before = _snapshot(run)
    proc = hold_folder(run, fresh=False)  # `memlab train --resume run` writing into it
    try:
        assert main(["plot", str(run)]) == 2
        msg = one_line_error(capsys)
        assert f"in use by process {proc.pid}" in msg and "--out" not in msg
    finally:
        proc.kill()
        proc.wait()
    assert _snapshot(run) == before
    assert main(["plot", str(run)]) == 0  # the holder gone, the run's lock is free again


# ----------------------------------------------------------------------------- storage failures


def test_eval_under_a_size_limit_names_the_file_and_leaves_no_folder(base_run, eval_dir, tmp_path, capsys):
    out = tmp_path / "new" / "ev"
    with _size_limit((eval_dir / "eval.json").stat().st_size // 2):  # eval.json does not fit
        assert _eval(base_run, out) == 2
    msg = one_line_error(capsys)
    assert f"could not write {out / 'eval.json'} (a file size limit was reached)" in msg and "nothing" in msg
    assert not (tmp_path / "new").exists()  # the folders it made are gone: a rerun can use the same --out
    assert _eval(base_run, out) == 0
    assert json.loads((out / "eval.json").read_text())["results"]


def test_bench_under_a_size_limit_leaves_nothing_that_blocks_a_rerun(tmp_path, capsys):
    out = tmp_path / "b"
    with _size_limit(2048):
        assert main(["bench", "--parts", "flops", "--out", str(out)]) == 2
    msg = one_line_error(capsys)
    assert f"could not write {out / 'plots' / 'flops.png'} (a file size limit was reached)" in msg
    assert not out.exists()
    assert main(["bench", "--parts", "flops", "--out", str(out)]) == 0
    assert (out / "plots" / "flops.png").stat().st_size > 2048 and json.loads((out / "bench.json").read_text())


def test_quickstart_under_a_size_limit_names_a_file_and_keeps_nothing(tmp_path, capsys):
    out = tmp_path / "qs"
    with _size_limit(4096):
        assert main(["quickstart", "--fast", "--only", "synthetic:constant", "--out", str(out)]) == 2
    msg = one_line_error(capsys)
    assert f"could not write {out}/entries/" in msg and "size limit" in msg and "nothing of the quickstart" in msg
    assert not out.exists()


def test_plot_replaces_plot_files_whole_or_not_at_all(run, capsys):
    plots = run / "plots"
    before = {p.name: p.read_bytes() for p in plots.iterdir()}
    assert before and all(len(b) > 1024 for b in before.values())
    with _size_limit(1024):
        assert main(["plot", str(run)]) == 2
    assert f"could not write {plots}/" in one_line_error(capsys)
    assert {p.name: p.read_bytes() for p in plots.iterdir()} == before  # no half PNG, no temporary file
    shutil.rmtree(plots)
    with _size_limit(1024):
        assert main(["plot", str(run)]) == 2
    one_line_error(capsys)
    assert not plots.exists()  # the plots/ it made went again


def test_train_under_a_size_limit_names_the_tokenizer_file_and_leaves_no_cache_folder(small_corpus, tmp_path,
                                                                                     monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEMLAB_CACHE", str(cache))  # an empty cache: the BPE is trained and saved now
    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 2})
    out = tmp_path / "run"
    with _size_limit(8192):
        assert main(["train", str(cfg), "--out", str(out)]) == 2
    msg = one_line_error(capsys)
    assert "could not write" in msg and "tokenizer.json (a file size limit was reached)" in msg
    left = [p.relative_to(cache).as_posix() for p in cache.rglob("*")] if cache.exists() else []
    assert not [p for p in left if ".tmp" in p or p.endswith("tokenizer.json")], left
    assert not out.exists()


def test_save_files_replaces_whole_files_or_none(tmp_path):
    from memlab.errors import MemlabError
    from memlab.outdir import save_files

    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "a.json").write_text("old a")
    (folder / "b.json").write_text("old b")

    def partial(tmp: Path) -> None:
        (tmp / "a.json").write_text("new a")
        (tmp / "b.json").write_text("new b, cut")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(MemlabError, match=r"could not write .*tok/b\.json \(the disk is full\)"):
        save_files(folder, partial, "the tokenizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no temporary folder left
    assert (folder / "a.json").read_text() == "old a" and (folder / "b.json").read_text() == "old b"
    save_files(folder, lambda tmp: (tmp / "a.json").write_text("new a"), "the tokenizer")
    assert (folder / "a.json").read_text() == "new a" and (folder / "b.json").read_text() == "old b"


# ----------------------------------------------------------------------------- a resume that fails


def test_a_resume_that_fails_at_its_checkpoint_leaves_config_and_metrics_as_they_were(run, monkeypatch, capsys):
    from memlab.train import checkpoint as ckpt

    before = _snapshot(run)

    def full(folder):  # the disk fills up at the resumed run's next checkpoint
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "write_manifest", full)
    assert main(["train", "--resume", str(run), "train.max_steps=8", "train.save_every=3"]) == 2
    monkeypatch.undo()
    msg = one_line_error(capsys)
    assert "could not write checkpoint step-00000006 (the disk is full)" in msg and "free some space" in msg
    assert _snapshot(run) == before  # config.yaml still says 4 steps; no records past step 4
    assert main(["train", "--resume", str(run), "train.max_steps=6"]) == 0
    assert "max_steps: 6" in (run / "config.yaml").read_text()
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert steps == list(range(1, 7))


def test_a_restart_that_fails_before_its_first_checkpoint_puts_the_record_back(run, monkeypatch, capsys):
    from memlab.train import checkpoint as ckpt

    shutil.rmtree(run / "checkpoints")
    before = _snapshot(run)
    monkeypatch.setattr(ckpt, "write_manifest", lambda folder: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    assert main(["train", "--resume", str(run), "--restart", "train.max_steps=2"]) == 2
    monkeypatch.undo()
    assert "the disk is full" in one_line_error(capsys)
    assert _snapshot(run) == before  # metrics.jsonl and summary.json of the old run are back
    assert not [p for p in run.iterdir() if p.name.endswith(".replaced")]


@contextlib.contextmanager
def _read_only(folder: Path):
    """``folder`` made unwritable: chmod for a user, the immutable attribute for root (chmod does not stop it)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = lambda: folder.chmod(0o755)  # noqa: E731
    else:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            pytest.skip("no way to make a folder read-only for root here (chattr +i)")
        undo = lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)  # noqa: E731
    try:
        yield
    finally:
        undo()


def test_a_read_only_checkpoints_folder_is_found_before_any_step(run, capsys):
    before = _snapshot(run)
    with _read_only(run / "checkpoints"):
        assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 2
    msg = one_line_error(capsys)
    assert f"cannot write a checkpoint into {run / 'checkpoints'} (the folder is read-only" in msg
    assert "free some space" not in msg and f"make {run / 'checkpoints'} writable" in msg
    assert _snapshot(run) == before  # no step ran: metrics.jsonl as it was


def test_a_full_disk_or_a_size_limit_is_found_before_any_step(run, monkeypatch, capsys):
    before = _snapshot(run)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 2
    monkeypatch.undo()
    msg = one_line_error(capsys)
    assert "(the disk is full: 0.0 MiB free" in msg and "free some space" in msg
    weights = (run / "checkpoints" / STEP.format(4) / "model.safetensors").stat().st_size
    with _size_limit(weights // 2):
        assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 2
    msg = one_line_error(capsys)
    assert "(a file size limit:" in msg and "ulimit -f" in msg and "disk is full" not in msg
    assert _snapshot(run) == before
