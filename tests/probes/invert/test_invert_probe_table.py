"""memlab invert --probe RUN: a trained probe's held-out chunks inverted and read by the probe's saved decoder (and the
control its run kept), in one table; the run's settings taken over, and a flag that contradicts them refused."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from memlab.errors import ConfigError
from memlab.probes.invert.options import InvertOptions, ModelOptions
from memlab.probes.invert.beside.probe_run import read_probe_run, reconcile

N_EVAL = 8


def _main(verb: str, *argv, capsys):
    from memlab.app.cli import main

    code = main([verb, *argv])
    return code, capsys.readouterr()


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    """A probe of memlab's own small LM: last token of the last block, 4-token chunks, 1 epoch, its control kept."""
    from memlab.app.cli import main

    root = tmp_path_factory.mktemp("probe")
    run = root / "run"
    code = main(["probe", "--model", "memlab-lm", "--seq-len", "4", "--n-train", "32", "--n-eval", str(N_EVAL),
                 "--epochs", "1", "--no-bow", "--threads", "1", "--cache-dir", str(root / "cache"), "--out", str(run),
                 "chunk_by=tokens"])
    assert code == 0
    return run


def _copy(run, dest, **changes):
    """A copy of the run folder with report.json's ``options`` and ``encoder`` entries changed."""
    shutil.copytree(run, dest)
    rep = json.loads((dest / "report.json").read_text())
    for k, v in changes.items():
        section, _, key = k.partition("__")
        rep[section][key] = v
    (dest / "report.json").write_text(json.dumps(rep))
    return dest


def test_beside_probe_on_all_its_chunks(probe_run, tmp_path, capsys):
    """Every held-out chunk: the probe's row is the run's own readings again (the very chunks it read), and the
    inversion's row is read on the same token ids."""
    out = tmp_path / "inv"
    code, cap = _main("invert", "--probe", str(probe_run), "--n", str(N_EVAL), "--forwards", "4", "--batch-size",
                      "4", "--no-control", "--threads", "1", "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    run = json.loads((probe_run / "report.json").read_text())
    assert rep["model"] == "memlab-lm" and rep["layer"] == run["encoder"]["layer"]
    assert rep["text"]["seq_len"] == 4 and rep["text"]["chunk_by"] == "tokens"
    table = rep["table"]
    assert table["columns"] == ["token_accuracy", "free_running_accuracy", "exact_match", "token_set_f1",
                                "bits_per_chunk"]
    assert list(table["rows"]) == ["inversion", "trained probe", "probe control"]  # no search control asked
    assert [c["true_ids"] for c in table["per_chunk"]] == [c["true_ids"] for c in rep["chunks"]]
    assert table["chunks"] == list(range(N_EVAL))
    probe, control, inv = table["rows"]["trained probe"], table["rows"]["probe control"], table["rows"]["inversion"]
    assert math.isclose(probe["token_accuracy"]["value"], run["probe"]["token_accuracy"], abs_tol=1e-9)
    assert math.isclose(control["token_accuracy"]["value"], run["control"]["token_accuracy"], abs_tol=1e-9)
    assert math.isclose(probe["free_running_accuracy"]["value"], run["probe"]["free_running_accuracy"], abs_tol=1e-9)
    for k in ("value", "low", "high"):  # the same chunks, the same bootstrap: the run's own interval
        assert math.isclose(probe["bits_per_chunk"][k], run["readings"]["bits_per_chunk"][k], abs_tol=1e-6)
    assert inv["token_accuracy"] is None and inv["bits_per_chunk"] is None and control["bits_per_chunk"] is None
    assert inv["exact_match"]["value"] == rep["totals"]["exact_match"]["value"]
    assert math.isclose(inv["free_running_accuracy"]["value"], rep["totals"]["token_accuracy"]["value"])
    assert "beside the trained probe" in cap.out and "probe control" in cap.out and "bits per chunk" in cap.out


def test_pooled_search_takes_the_probes_pooling(probe_run, tmp_path, capsys):
    out = tmp_path / "inv"
    code, cap = _main("invert", "--probe", str(probe_run), "--n", "2", "--forwards", "24", "--batch-size", "12",
                      "--threads", "1", "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    assert rep["states"] == "last"  # the probe's pooling
    rows = rep["table"]["rows"]
    assert list(rows) == ["inversion", "inversion control", "trained probe", "probe control"]
    for row in rows.values():
        for r in row.values():
            assert r is None or r["low"] <= r["value"] <= r["high"]
    assert [c["true_ids"] for c in rep["table"]["per_chunk"]] == [c["true_ids"] for c in rep["chunks"]]
    per = rep["table"]["per_chunk"]
    assert len(per) == 2 and all(len(c["probe_ids"]) == len(c["true_ids"]) for c in per)
    assert all(c["control_nll"] is not None and c["probe_nll"] > 0 for c in per)


def test_a_run_without_its_control_says_so(probe_run, tmp_path, capsys):
    run = _copy(probe_run, tmp_path / "run", options__cache_dir=None)
    code, cap = _main("invert", "--probe", str(run), "--states", "positions", "--n", "2", "--threads", "1",
                      "--out", str(tmp_path / "inv"), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((tmp_path / "inv" / "report.json").read_text())
    table = rep["table"]
    assert list(table["rows"]) == ["inversion", "trained probe"]
    assert table["rows"]["inversion"]["exact_match"]["value"] == 1.0 == rep["totals"]["exact_match"]["value"]
    assert "probe control" not in table["rows"] and table["rows"]["trained probe"]["bits_per_chunk"] is None
    assert any("kept no control" in n for n in table["notes"]) and "kept no control" in cap.out


@pytest.mark.parametrize("argv, says", [
    (["--model", "smollm2"], "--model smollm2 contradicts"),
    (["--layer", "2"], "--layer 2 contradicts"),
    (["--seq-len", "5"], "--seq-len 5 contradicts"),
    (["--chunk-by", "words"], "--chunk-by words contradicts"),
    (["--n-eval", "16"], "--n-eval 16 contradicts"),
    (["--states", "mean"], "--states mean contradicts"),
    (["--n", "9"], "more than the 8 held-out chunks"),
    (["--noise", "0.1"], "--noise does not go with --probe"),
])
def test_a_contradicting_flag_is_refused_in_one_line(probe_run, tmp_path, capsys, argv, says):
    out = tmp_path / "inv"
    code, cap = _main("invert", "--probe", str(probe_run), *argv, "--out", str(out), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error:") and says in lines[0], cap.err
    assert not out.exists()


def test_the_same_layer_by_another_name_is_not_a_contradiction(probe_run):
    s = read_probe_run(str(probe_run))
    got = reconcile(InvertOptions(model=ModelOptions(layer=-1)), {"layer"}, s)
    assert got.model.layer == s.layer == s.num_layers and got.model.states == "last" and got.text.n == N_EVAL
    assert got.text.seq_len == 4 and got.text.chunk_by == "tokens" and got.model.model == "memlab-lm"


def test_poolings_and_folders(probe_run, tmp_path, capsys):
    mean = read_probe_run(str(_copy(probe_run, tmp_path / "mean", encoder__pool="mean")))
    vals = InvertOptions()
    assert reconcile(vals, set(), mean).model.states == "mean"
    for pool in ("first", "second_last"):  # every built-in pooling is read by the pooled search of its name
        run = read_probe_run(str(_copy(probe_run, tmp_path / pool, encoder__pool=pool)))
        assert reconcile(vals, set(), run).model.states == pool
    with pytest.raises(ConfigError, match="--states second_last contradicts"):
        reconcile(InvertOptions(model=ModelOptions(states="second_last")), {"states"}, mean)
    other = read_probe_run(str(_copy(probe_run, tmp_path / "max", encoder__pool="max")))  # a plugin's pooling
    with pytest.raises(ConfigError, match="--states positions"):
        reconcile(vals, set(), other)
    positions = InvertOptions(model=ModelOptions(states="positions"))
    assert reconcile(positions, {"states"}, other).model.states == "positions"
    normed = _copy(probe_run, tmp_path / "norm", options__final_norm=True)  # both files: a run read after the norm
    spec = json.loads((normed / "probe.json").read_text())
    (normed / "probe.json").write_text(json.dumps(dict(spec, final_norm=True)))
    with pytest.raises(ConfigError, match="final norm"):
        reconcile(vals, set(), read_probe_run(str(normed)))
    for folder, says in ((tmp_path / "nowhere", "no such folder"), (tmp_path, "not a probe run folder")):
        code, cap = _main("invert", "--probe", str(folder), "--out", str(tmp_path / "x"), capsys=capsys)
        assert code == 2 and says in cap.err and len(cap.err.strip().splitlines()) == 1
    sweep = _copy(probe_run, tmp_path / "sweep", options__seq_len=[4, 8])
    with pytest.raises(ConfigError, match="length sweep"):
        read_probe_run(str(sweep))
