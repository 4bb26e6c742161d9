"""report.json's layout, pinned: users' scripts read these keys, so a key is renamed, moved or removed only with a new
``schema_version`` (and this pin and docs/probes_reference.md updated with it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memlab.probes.report.report import SCHEMA_VERSION, ProbeReport

pytestmark = pytest.mark.usefixtures("one_thread")

TOP = {"model", "encoder", "options", "vocab_size", "seq_len", "n_train", "n_eval", "text", "probe", "control",
       "information_gain", "readings", "retention", "bow", "readouts", "calibration", "limited_by",
       "control_shared_with", "decoder", "history", "examples", "timing", "memory", "definitions", "data_split",
       "budget_note", "eval_note", "run_dir", "schema_version", "saturation", "online_code", "pointwise"}
TEXT = {"chunk_by", "per_chunk", "mean_chars", "mean_tokens", "max_tokens", "truncated_chunks", "rendering", "targets"}
METRICS = {"ce", "token_accuracy", "entropy_ratio", "accuracy_by_position", "n_tokens", "token_set_f1",
           "sentence_bleu", "exact_match", "free_running_accuracy"}
READINGS = {"bits_per_chunk", "bits_per_char", "information_gain", "token_accuracy", "token_accuracy_gain",
            "token_set_f1", "token_set_f1_gain", "bow_recovered", "bow_gain", "free_running_accuracy",
            "free_running_accuracy_gain"}
BOW = {"recovered", "prior", "gain", "epochs", "kept_vocab", "device", "seconds"}
DECODER = {"kind", "targets_in", "parameters", "trained_parameters", "kept_vocab", "conditioning", "inputs",
           "bag_head", "input_dropout", "repeat_penalty", "token_table_dim"}
TIMING = {"load_s", "encode_s", "encode_cached", "train_s", "control_s", "bow_s", "total_s"}


def _documented() -> set[str]:
    """The top-level keys the reference's report.json table names."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "probes_reference.md"
    table = doc.read_text().split("### report.json", 1)[1].split("\n\n", 2)[1]
    return {k for line in table.splitlines() if line.startswith("| `")
            for k in re.findall(r"`([a-z_]+)`", line.split("|")[1])}


def test_report_json_keeps_its_keys_and_says_its_schema_version(tmp_path):
    from memlab.probes.run import probe

    rep = probe(model="synthetic:concat", out=tmp_path / "p", n_train=40, n_eval=8, seq_len=8, epochs=1,
                hidden_size=16, num_layers=1, num_heads=2, batch_size=16, n_examples=1, ci_resamples=50,
                progress=False)
    data = json.loads((tmp_path / "p" / "report.json").read_text())
    assert set(data) == TOP == _documented()
    assert data["schema_version"] == SCHEMA_VERSION == 1 and data == rep.to_dict()
    assert set(data["text"]) == TEXT
    for side in ("probe", "control"):
        assert METRICS <= set(data[side]), side
    assert READINGS <= set(data["readings"])
    free = data["readings"]["free_running_accuracy"]
    assert free["value"] == pytest.approx(data["probe"]["free_running_accuracy"])
    assert data["readings"]["free_running_accuracy_gain"]["value"] == pytest.approx(
        data["probe"]["free_running_accuracy"] - data["control"]["free_running_accuracy"])
    assert "free_running_accuracy" in data["definitions"]
    assert all(set(r) == {"value", "low", "high"} for r in data["readings"].values())
    assert BOW <= set(data["bow"]) and data["readouts"]["bow"]["recovered"] == data["bow"]["recovered"]
    assert set(data["decoder"]) == DECODER and TIMING <= set(data["timing"])
    assert data["calibration"]["status"] in ("passed", "failed") and data["calibration"]["checks"]
    assert {"control", "metric", "value", "needs", "passed"} <= set(data["calibration"]["checks"][0])
    assert set(data["history"]) == {"probe", "control"} and set(data["examples"][0]) == {"input", "reconstruction"}


def test_every_report_field_is_a_documented_key():
    fields = {f for f in ProbeReport.__dataclass_fields__ if f != "fitted"}
    assert fields == TOP
