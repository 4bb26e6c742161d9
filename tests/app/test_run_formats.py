"""Runs written before the stage rooms (commit 401c1d4) load and resume after them.

``tests/fixtures/runs_401c1d4/`` holds what 401c1d4's ``memlab invert`` wrote of a per-position and of a pooled run stopped
after their first chunk (``invert.json``, the first line of ``chunks.jsonl`` and of ``log.txt``, as a kill leaves
them) and the report of each uninterrupted; ``probe.json`` there pins what its ``memlab probe`` wrote with the
options below: the run folder's files, ``probe.json``, the decoder's ``config.json`` keys and ``model_type``,
``report.json``'s keys and schema version, and the digits it read on its seeds. The same commands today write the
same files and keys and read the same digits; the old stopped runs resume to the old reports.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memlab.app.cli import main
from memlab.devices import ACCEL_SIDES, pretend

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "runs_401c1d4"
PROBE = ["probe", "--model", "memlab-lm", "--seq-len", "4", "--n-train", "16", "--n-eval", "4", "--epochs", "1",
         "--threads", "1", "--no-control", "--no-bow", "select_decoder=false", "bag_head=false", "chunk_by=tokens",
         "n_examples=1", "ci_resamples=20", "hidden_size=8", "num_heads=1", "num_layers=1"]
"""The probe 401c1d4 ran (tests/fixtures/runs_401c1d4/probe.json holds what it wrote)."""
SAME = {"positions": ("index", "text", "true_ids", "recovered_ids", "exact", "certificates", "tried"),
        "pooled": ("index", "text", "true_ids", "recovered_ids", "exact", "forwards")}
"""The fields of a chunk's result that a resumed run gives as the uninterrupted one did (timings aside)."""

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_probe_run_writes_the_files_keys_and_digits_it_wrote(tmp_path, capsys):
    pins = json.loads((DATA / "probe.json").read_text())
    run = tmp_path / "run"
    native = ACCEL_SIDES["native"]  # the side 401c1d4 wrote its pins on, whatever MEMLAB_ACCEL says
    with pretend(bf16=native.bf16, batched=native.batched):
        assert main([*PROBE, "--out", str(run)]) == 0
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert files == pins["files"]
    assert json.loads((run / "probe.json").read_text()) == pins["probe.json"]
    config = json.loads((run / "decoder" / "config.json").read_text())
    assert sorted(config) == pins["config_keys"] and config["model_type"] == pins["model_type"]
    report = json.loads((run / "report.json").read_text())
    added = {"saturation", "online_code", "pointwise"}  # the learning curve, online code and pointwise bits since
    assert sorted(set(report) - added) == pins["report_keys"] and report["schema_version"] == pins["schema_version"]
    assert report["readings"] == pins["readings"]
    # the same digits on the same seeds; the bound leaves room for another CPU's bf16 kernel (its sums in another
    # order), not for the float32 side (2e-5 apart on these seeds)
    assert {k: report["probe"][k] for k in pins["probe"]} == pytest.approx(pins["probe"], rel=1e-6, abs=0)
    from memlab.registry import SPACES

    again = SPACES.get("probe")(str(run))  # the run folder loads as a space
    import torch

    z = again.encode(torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long))
    assert z.shape == (1, again.dim) and len(again.generate(z, max_new_tokens=4)) == 1


@pytest.mark.parametrize("search", ["positions", "pooled"])
def test_a_stopped_inversion_written_before_resumes_to_its_report(search, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(DATA / f"invert_{search}", run)
    old = json.loads((run / "uninterrupted.json").read_text())
    (run / "uninterrupted.json").unlink()
    assert not (run / "report.json").exists() and (run / "chunks.jsonl").read_text().count("\n") == 1
    assert main(["invert", "--resume", str(run)]) == 0, capsys.readouterr().err
    n = len(old["chunks"])
    assert f"resumed: 1 of {n} chunks kept, {n - 1} to search" in (run / "log.txt").read_text()
    report = json.loads((run / "report.json").read_text())
    added = {"states_dtype", "noise_floor", "least_margin", "ambiguous"} if search == "positions" else set()
    assert sorted(set(report) - added) == old["keys"] and added <= set(report)  # the precision's fields since
    same = SAME[search]

    def kept(c: dict) -> dict:  # a first position without a BOS: then one pass over the vocabulary, now ranked rounds
        return {k: (c[k][1:] if k == "tried" and (c.get("from_table") or [False])[0] else c[k]) for k in same}

    assert [kept(c) for c in report["chunks"]] == [kept(c) for c in old["chunks"]]
    assert sorted({"invert.json", "chunks.jsonl", "log.txt", "report.json", "summary.txt"}) == \
        sorted(p.name for p in run.iterdir() if not p.name.startswith("."))
