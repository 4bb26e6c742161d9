"""Experiment tracking (train.log_with): TensorBoard event files hold exactly what metrics.jsonl holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import write_config
from memlab.app.cli import main
from memlab.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_same(run: Path) -> dict:
    sc = _scalars(run / "tensorboard")
    recs = _records(run)
    checked = 0
    for split in ("train", "eval"):
        rows = [r for r in recs if r["split"] == split]
        keys = {k for r in rows for k, v in r.items() if k not in ("step", "split") and isinstance(v, (int, float))}
        for k in keys:
            want = [(r["step"], float(r[k])) for r in rows if k in r]
            got = sc[f"{split}/{k}"]
            assert [s for s, _ in got] == [s for s, _ in want], (split, k)
            assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6, abs=1e-12), (split, k)
            checked += 1
    assert checked == sum(1 for t in sc if t.split("/")[0] in ("train", "eval"))  # nothing logged twice or extra
    return sc


def test_tensorboard_scalars_equal_metrics_jsonl_and_resume_adds_no_duplicates(tmp_path, small_corpus):
    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 6, "save_every": 2, "eval_every": 3, "log_every": 1, "keep_checkpoints": 5,
                              "log_with": "tensorboard"})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    sc = _assert_same(run)
    for tag in ("train/loss", "train/token_accuracy", "train/lr", "train/tokens_per_s", "eval/loss"):
        assert tag in sc, tag
    # the resolved config is stored as hyperparameters
    hp = list((run / "tensorboard").rglob("hparams.yml"))
    assert hp and "train.lr" in hp[0].read_text()
    # a crash after step 6 was logged but before its checkpoint: resume from step 4 re-logs steps 5-6
    shutil.rmtree(run / "checkpoints" / "step-00000006")
    (run / "summary.json").unlink()
    assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 0
    sc = _assert_same(run)
    assert [s for s, _ in sc["train/loss"]] == list(range(1, 9))


def test_log_with_choices_and_missing_package(tmp_path, small_corpus, capsys, monkeypatch):
    from memlab import tracking

    assert tracking.parse_log_with(None) == [] and tracking.parse_log_with("none") == []
    assert tracking.parse_log_with(["tensorboard", "wandb"]) == ["tensorboard", "wandb"]
    assert tracking.parse_log_with("tensorboard,mlflow") == ["tensorboard", "mlflow"]
    cfg = write_config(tmp_path / "c.yaml", small_corpus)
    assert main(["train", str(cfg), "train.log_with=tensorbored", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "unknown tracker 'tensorbored'" in err and err.count("\n") == 1
    monkeypatch.setitem(tracking.TRACKERS, "wandb", "no_such_package_for_memlab")
    assert main(["train", str(cfg), "train.log_with=[tensorboard, wandb]", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "needs the no_such_package_for_memlab package" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()  # refused before anything was made


def test_report_logs_to_tensorboard(tmp_path):
    from memlab.tracking import log_report

    report = {"probe": {"ce": 2.5, "token_accuracy": 0.25}, "control": {"ce": 3.0}, "information_gain": 0.1667,
              "options": {"model": "m", "lr": 0.002}, "examples": [{"input": "a"}]}
    log_report(report, tmp_path, "tensorboard", name="probe")
    sc = _scalars(tmp_path / "tensorboard")
    assert sc["probe/ce"] == [(0, 2.5)] and sc["control/ce"] == [(0, 3.0)]
    assert sc["information_gain"][0][1] == pytest.approx(0.1667)
    with pytest.raises(ConfigError, match="unknown tracker"):
        log_report(report, tmp_path, "tb")
