"""memlab quickstart: entries, table and plot, on a fast configuration."""

from __future__ import annotations

import json

import pytest

from memlab.app.cli import main
from memlab.app.quickstart import CHECKPOINTS, Entry, default_entries, format_table, run_quickstart


pytestmark = pytest.mark.usefixtures("one_thread")


def test_default_entries_and_shipped_checkpoint():
    names = [e.name for e in default_entries()]
    assert names == ["memory_ae", "token_lm", "random_init", "minilm", "smollm2", "minilm_random",
                     "synthetic:concat", "synthetic:bag", "synthetic:constant"]
    lm = CHECKPOINTS / "token_lm-toy"
    assert (lm / "model.safetensors").is_file() and (lm / "tokenizer.json").is_file()
    assert (lm / "README.md").read_text().count("memlab train configs/token_lm/toy.yaml") >= 1


def test_quickstart_fast_cli(tmp_path, capsys):
    out = tmp_path / "qs"
    rc = main(["quickstart", "--fast", "--only", "token_lm", "random_init", "synthetic:constant", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["name"]: r for r in summary["rows"]}
    assert set(rows) == {"token_lm", "random_init", "synthetic:constant"}
    for r in rows.values():
        assert 0 <= r["token_accuracy"] <= 1 and r["entropy_ratio"] < 1
        assert 0 <= r["token_set_f1"] <= 1 and 0 <= r["bow_recovered"] <= 1
        assert r["free_running_accuracy"] == pytest.approx(r["readings"]["free_running_accuracy"]["value"])
    # the constant calibration row gives nothing: it shares token_lm's control (same chunks, same decoder options),
    # and from the same start weights, batches and dropout draws the probe of a constant embedding is that control
    const = rows["synthetic:constant"]
    assert abs(const["information_gain"]) <= 0.01
    bits = const["readings"]["bits_per_chunk"]
    assert bits["low"] <= 0 <= bits["high"] and const["retention"].startswith("no evidence of retention")
    assert const["calibration"] == "passed" and rows["token_lm"]["calibration"] == ""
    # every model reads the same text: the same chunks of words, in the token_lm tokenizer here
    assert rows["token_lm"]["mean_tokens"] == const["mean_tokens"]
    for r in rows.values():
        for x in r["readings"].values():
            assert x["low"] <= x["value"] <= x["high"]
    assert (out / "quickstart.png").stat().st_size > 1000
    assert (out / "entries" / "token_lm" / "report.json").is_file()
    printed = capsys.readouterr().out
    assert "| token_lm |" in printed and "| random_init |" in printed and "TF1" in printed
    lines = printed.splitlines()
    assert next(x for x in lines if x.startswith("| model |")).split("|")[4].strip() == "bits per chunk"
    head = [c.strip() for c in next(x for x in lines if x.startswith("| model |")).split("|")]
    assert head[head.index("token acc") + 1] == "free-running acc"
    const_line = next(x for x in lines if x.startswith("| synthetic:constant |"))
    assert const_line.split("|")[4].strip().startswith("no evidence [")  # never a bare figure


def test_skipped_entries_and_bad_names(tmp_path, capsys):
    from memlab.errors import MemlabError

    entries = [e for e in default_entries() if e.name == "token_lm"]
    entries.append(Entry("absent", "nothing", lambda ctx: None, lambda: "not installed here"))
    summary = run_quickstart(out=tmp_path / "qs", fast=True, entries=entries)
    assert {"name": "absent", "skipped": "not installed here"} in summary["rows"]
    assert "skipped: not installed here" in format_table(summary["rows"])
    with pytest.raises(MemlabError, match="unknown quickstart entry"):
        run_quickstart(out=tmp_path / "qs2", fast=True, only=["nope"])
    assert main(["quickstart", "--fast", "--only", "nope", "--out", str(tmp_path / "qs3")]) == 2
    # a bad probe option fails before any entry is loaded
    assert main(["quickstart", "--fast", "--set", "nope=1", "--out", str(tmp_path / "qs4")]) == 2
    assert main(["quickstart", "--fast", "--set", "inputs=sideways", "--out", str(tmp_path / "qs5")]) == 2
    assert not (tmp_path / "qs4" / "entries").exists()


def test_rows_share_target_tokens_and_one_control(tiny_llama, tmp_path):
    """An encoder with another tokenizer is scored over the toy BPE's tokens too, with the control of the first row;
    a row's own budget applies to it alone and is listed."""
    from memlab.app.quickstart import bag_budget, _hf

    entries = [e for e in default_entries() if e.name in ("token_lm", "synthetic:bag")]
    entries.insert(1, Entry("tiny", "a 300-token BPE model", _hf(lambda c: str(tiny_llama), pool="mean")))
    summary = run_quickstart(out=tmp_path / "qs", fast=True, entries=entries, overrides=["seq_len=6"])  # fits 48
    rows = {r["name"]: r for r in summary["rows"]}
    reps = {n: json.loads((tmp_path / "qs" / "entries" / n.replace(":", "-") / "report.json").read_text())
            for n in rows}
    assert reps["tiny"]["control_shared_with"] == "token_lm" and reps["token_lm"]["control_shared_with"] is None
    assert reps["tiny"]["vocab_size"] == reps["token_lm"]["vocab_size"] == 4096
    assert reps["tiny"]["text"]["targets"]["n_tokens"] == reps["token_lm"]["text"]["targets"]["n_tokens"]
    assert reps["tiny"]["text"]["mean_tokens"] != reps["token_lm"]["text"]["mean_tokens"]  # read in its own tokens
    bag = rows["synthetic:bag"]
    assert bag["own_budget"] == {k: v for k, v in bag_budget(summary["options"]).items()}
    assert reps["synthetic:bag"]["probe"] is None and reps["synthetic:bag"]["n_train"] == 4 * summary["options"]["n_train"] == 256
    assert bag["calibration"] in ("passed", "failed") and bag["token_accuracy"] is None
    assert "synthetic:bag: n_train=256, sequence=False" in (tmp_path / "qs" / "table.md").read_text()


def test_the_concat_control_runs_at_its_own_budget(tmp_path, capsys):
    """The sequence decoder's positive control runs in a default quickstart, at a budget of its own: more chunks,
    fewer epochs, a narrower decoder with the settings that read concat whole, neither a control nor a bag-of-words
    read-out (its test reads neither); the row, the printed line, the table and the plot hold a probe without a
    control."""
    from memlab.app.quickstart import CONCAT_CHUNKS, CONCAT_EPOCHS, CONCAT_WIDTH, concat_budget

    entries = [e for e in default_entries() if e.name in ("synthetic:concat", "synthetic:constant")]
    assert entries[0].elsewhere is None and entries[0].options is concat_budget
    full = concat_budget({"n_train": 2000, "epochs": 16})
    assert full["n_train"] == CONCAT_CHUNKS * 2000 > 2000 and full["epochs"] == CONCAT_EPOCHS < 16
    assert full["control"] is False
    assert full["readouts"] == [] and full["bag_head"] is False and full["input_dropout"] > 0
    assert full["hidden_size"] == CONCAT_WIDTH < 128 and full["num_layers"] == 1
    tiny = concat_budget({"n_train": 64, "epochs": 1, "hidden_size": 32})
    assert tiny["epochs"] == 1 and tiny["hidden_size"] == 32  # never more epochs, nor a wider decoder, than asked
    summary = run_quickstart(out=tmp_path / "qs", fast=True, entries=entries)
    rows = {r["name"]: r for r in summary["rows"]}
    concat = rows["synthetic:concat"]
    assert "not_run" not in concat and concat["calibration"] in ("passed", "failed")
    assert concat["own_budget"]["n_train"] == CONCAT_CHUNKS * summary["options"]["n_train"]
    assert concat["own_budget"]["control"] is False and concat["own_budget"]["readouts"] == []
    assert 0 <= concat["token_accuracy"] <= 1 and concat["control_accuracy"] is None
    assert concat["bow_recovered"] is None and concat["bits_per_chunk"] is None
    rep = json.loads((tmp_path / "qs" / "entries" / "synthetic-concat" / "report.json").read_text())
    assert rep["control"] is None and rep["n_train"] == CONCAT_CHUNKS * summary["options"]["n_train"]
    # the constant row keeps its control: the concat row's budget is its own
    assert rows["synthetic:constant"]["control_accuracy"] is not None
    printed = capsys.readouterr().out
    assert "[synthetic:concat] not run here" not in printed
    line = next(x for x in printed.splitlines() if x.startswith("| synthetic:concat |"))
    assert line.split("|")[4].strip() == ""  # no control: no bits per chunk, and no invented figure
    assert f"synthetic:concat: n_train={CONCAT_CHUNKS * 64}" in (tmp_path / "qs" / "table.md").read_text()
    assert (tmp_path / "qs" / "quickstart.png").stat().st_size > 1000


def test_a_row_that_cannot_pass_here_is_not_run_and_says_where_it_runs(tmp_path, capsys):
    """An entry marked ``elsewhere`` is not run by a default quickstart (no failed calibration in the table) and
    names where it runs; asked for by name, it runs."""
    const = next(e for e in default_entries() if e.name == "synthetic:constant")
    far = Entry("far", "runs elsewhere", const.load, elsewhere="`memlab probe --config X` runs it")
    entries = [far, const]
    summary = run_quickstart(out=tmp_path / "qs", fast=True, entries=entries)
    rows = {r["name"]: r for r in summary["rows"]}
    assert rows["far"] == {"name": "far", "not_run": far.elsewhere}
    assert not (tmp_path / "qs" / "entries" / "far").exists()
    printed = capsys.readouterr().out
    assert "[far] not run here:" in printed and "calibration failed" not in printed
    assert "| far | not run here:" in format_table(summary["rows"])
    asked = run_quickstart(out=tmp_path / "qs2", fast=True, entries=entries, only=["far"])
    assert [r["name"] for r in asked["rows"]] == ["far"] and "not_run" not in asked["rows"][0]
    assert (tmp_path / "qs2" / "entries" / "far" / "report.json").is_file()


def test_invert_adds_each_vector_read_with_its_weights(tmp_path, capsys):
    """--invert N: each entry that names a model memlab invert loads is also inverted from its vector (the pooled
    search) on the first N held-out chunks, beside its control; an entry that cannot be says why in its row."""
    entries = [e for e in default_entries() if e.name in ("token_lm", "random_init")]
    summary = run_quickstart(out=tmp_path / "qs", fast=True, entries=entries, invert=2, invert_gflops=5)
    inv = {r["name"]: r for r in summary["inversion"]}
    assert inv["random_init"]["why"].startswith("random weights")
    lm = inv["token_lm"]
    assert lm["states"] == "last" and lm["chunks"] == 2 and lm["gflops_per_chunk"] > 0
    for key in ("token_f1", "control_token_f1", "token_accuracy", "exact_match", "certified"):
        r = lm["readings"][key]
        assert 0 <= r["low"] <= r["value"] <= r["high"] <= 1
    rep = json.loads((tmp_path / "qs" / "entries" / "token_lm" / "invert" / "report.json").read_text())
    assert rep["states"] == "last" and len(rep["chunks"]) == 2 and rep["search"]["gflops"] == 5
    # the chunks the inversion reads are the probe's held-out chunks (its first two, uncapped)
    probe = json.loads((tmp_path / "qs" / "entries" / "token_lm" / "report.json").read_text())
    assert rep["text"]["seq_len"] == probe["seq_len"] == summary["options"]["seq_len"]
    assert rep["text"]["n_eval"] == probe["n_eval"] and rep["text"]["corpus"] == "austen"
    table = (tmp_path / "qs" / "invert.md").read_text()
    assert "| token_lm | last | 2 x 16 words |" in table and "| random_init | not inverted: random weights" in table
    assert "From each vector itself" in capsys.readouterr().out


def test_invert_flag_is_checked_before_any_work(tmp_path):
    assert main(["quickstart", "--fast", "--invert", "-1", "--out", str(tmp_path / "qs")]) == 2
    assert main(["quickstart", "--fast", "--invert", "1", "--invert-gflops", "0", "--out", str(tmp_path / "q2")]) == 2
    assert not (tmp_path / "qs").exists() and not (tmp_path / "q2").exists()


@pytest.mark.slow
def test_invert_reads_the_memory_vector_on_chunks_it_can_hold(tmp_path):
    """The memory autoencoder's vector is inverted through its own encoder (``--states space``), on chunks of at most
    the probe's cap in its own tokens (its chunk length), so no chunk is refused (about a minute: SmolLM2 proposes)."""
    entries = [e for e in default_entries() if e.name == "memory_ae"]
    summary = run_quickstart(out=tmp_path / "qs", fast=True, entries=entries, invert=2, invert_gflops=5)
    row = summary["inversion"][0]
    assert row["states"] == "space" and row["chunk"] == "32 tokens" and row["chunks"] == 2
    assert 0 <= row["readings"]["token_accuracy"]["value"] <= 1
