"""Probe calibration: synthetic encoders of known content, the scores beside accuracy, the bag-of-words
read-out, the layer sweep and the learning curve (small budgets; the full targets are measured in docs/probes.md)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

from memlab.app.cli import main
from memlab.probes.run import ProbeOptions, load_options, run_probe
from memlab.probes.encoders.synthetic import SyntheticEncoder

# one worker builds the module's fitted runs once (pytest-xdist would build them on each worker that runs a test)
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.xdist_group("calibration")]

SMALL = ["hidden_size=64", "num_heads=4", "num_layers=1", "batch_size=32", "seq_len=8", "n_train=600", "n_eval=64",
         "epochs=15", "patience=15", "n_examples=1", "inputs=blank", "bag_head=false", "chunk_by=tokens"]


@pytest.fixture(scope="module")
def readings(tokenizer, small_corpus):
    """One probe of each synthetic encoder, on the same chunks, sharing one control."""
    cache: dict = {}
    out = {}
    for kind in ("concat", "bag", "constant"):
        opts = load_options(None, SMALL, model=f"synthetic:{kind}", corpus=str(small_corpus))
        out[kind] = run_probe(opts, encoder=SyntheticEncoder(kind, tokenizer, max_len=8), control_cache=cache)
    return out


def test_concat_is_rebuilt_whole(readings):
    r = readings["concat"]
    assert r["probe"]["token_accuracy"] >= 0.97 and r["probe"]["token_set_f1"] >= 0.97
    assert r["probe"]["exact_match"] > 0.7 and r["probe"]["sentence_bleu"] > 0.4  # BLEU is harsh on 3-word chunks
    assert r["control"]["token_accuracy"] < 0.3 and r["information_gain"] > 0.8
    assert r["calibration"]["checks"][0]["metric"] == "token_accuracy"
    assert r["calibration"]["status"] == ("passed" if r["probe"]["token_accuracy"] >= 0.99 else "failed")


def test_bag_keeps_the_set_not_the_order(readings):
    bag, concat = readings["bag"], readings["concat"]
    p = bag["probe"]
    assert bag["bow"]["recovered"] >= 0.9 and bag["bow"]["recovered"] > bag["bow"]["prior"] + 0.4  # the set...
    assert bag["calibration"]["status"] == "passed"
    assert p["token_accuracy"] < concat["probe"]["token_accuracy"] - 0.3  # ...not the positions
    assert p["token_set_f1"] > bag["control"]["token_set_f1"] + 0.2  # the decoder too reads more of the set
    assert p["token_set_f1"] - p["token_accuracy"] > 0.1 and bag["limited_by"].startswith("order-limited")


def test_constant_gives_nothing(readings):
    r = readings["constant"]
    assert abs(r["information_gain"]) <= 0.01
    assert r["calibration"]["status"] == "passed"
    assert r["probe"]["token_accuracy"] == pytest.approx(r["control"]["token_accuracy"], abs=0.02)
    assert abs(r["bow"]["recovered"] - r["bow"]["prior"]) < 0.05
    assert r["limited_by"].startswith("content-limited")


def test_failed_positive_control_is_reported(tokenizer, small_corpus):
    from memlab.probes.report.report import format_summary

    opts = load_options(None, SMALL, model="synthetic:concat", corpus=str(small_corpus), epochs=1, n_train=64,
                        readouts=[])
    rep = run_probe(opts, encoder=SyntheticEncoder("concat", tokenizer, max_len=8))
    assert rep["calibration"]["status"] == "failed" and rep["bow"] is None
    text = format_summary(rep)
    assert "calibration: failed" in text and "WARNING" in text and "could not see" in text
    assert "note: n_train=64 is below" in text  # a budget under the measured saturation is marked


def test_scores_agree_with_references():
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    from memlab.metrics import sentence_bleu as memlab_bleu
    from memlab.probes.readouts.bow import recovered_per_chunk
    from memlab.probes.readings import exact_match, limit_line, token_set_f1

    true = torch.tensor([[1, 2, 3, 4], [5, 5, 6, 7]])
    pred = torch.tensor([[4, 3, 2, 1], [5, 6, 9, 9]])
    assert token_set_f1(pred, true) == pytest.approx((1.0 + 2 * 2 / (3 + 3)) / 2)
    assert exact_match(pred, true) == 0.0 and exact_match(true, true) == 1.0
    hyp, ref = ["the cat sat on a mat today"], ["the cat sat on the mat today"]
    want = sentence_bleu([ref[0].split()], hyp[0].split(), smoothing_function=SmoothingFunction().method4)
    assert memlab_bleu(hyp, ref) == pytest.approx(want)
    # top-k with k = distinct tokens of each chunk; scores over kept ids [1, 2, 3, 5]
    kept = torch.tensor([1, 2, 3, 5])
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.0, 0.1, 0.2, 0.9]])
    assert recovered_per_chunk(scores, torch.tensor([[1, 2, 1], [5, 3, 4]]), kept) == pytest.approx([1.0, 2 / 3])
    full = {"token_set_f1": 0.9, "token_accuracy": 0.3}
    assert limit_line(full, {"token_set_f1": 0.1, "token_accuracy": 0.05}).startswith("order-limited")


def test_synthetic_on_the_command_line(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["probe", "--model", "synthetic:bag", "--corpus", str(small_corpus), "--out", str(out), "--no-control",
            "hidden_size=32", "num_layers=1", "seq_len=8", "n_train=64", "n_eval=16", "epochs=1"]
    assert main(args) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["encoder"]["name"] == "synthetic:bag" and rep["vocab_size"] == 4096  # the shipped BPE tokenizer
    assert {"token_set_f1", "sentence_bleu", "exact_match"} <= set(rep["probe"]) and "calibration" in rep
    assert "bag-of-words read-out" in capsys.readouterr().out
    from memlab.registry import SPACES

    again = SPACES.get("probe")(str(out))  # the fitted probe reloads with its synthetic encoder
    assert again.dim == rep["encoder"]["dim"]
    capsys.readouterr()  # transformers' own loading bar, outside any memlab command
    assert main(["probe", "--model", "synthetic:nope", "--corpus", str(small_corpus)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown synthetic encoder 'nope'" in err[0]


def test_layer_sweep_one_pass(tiny_llama, small_corpus, tmp_path, capsys):
    from memlab.probes.encoders.sources import load_encoder

    enc = load_encoder(str(tiny_llama), pool="mean")
    ids = torch.randint(5, 300, (3, 8))
    all_layers = enc.encode_layers(ids, torch.ones_like(ids), [0, 1, 2])  # (3, 3, 32)
    for j in range(3):  # the one-pass capture equals the single-layer encoder at each layer
        single = load_encoder(str(tiny_llama), pool="mean", layer=j).encode(ids, torch.ones_like(ids))
        assert torch.allclose(all_layers[:, j], single, atol=1e-5)
    out = tmp_path / "layers"
    base = ["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--pool", "mean", "--out", str(out),
            "seq_len=8", "n_train=64", "n_eval=16", "hidden_size=32", "num_layers=1", "epochs=1"]
    assert main([*base, "--layers", "all", "--layers-sequence"]) == 0
    res = json.loads((out / "layers.json").read_text())
    assert [r["layer"] for r in res["rows"]] == [0, 1, 2]
    assert all(0 <= r["bow_recovered"] <= 1 and "token_set_f1" in r for r in res["rows"])
    assert (out / "plots" / "layers.png").stat().st_size > 1000 and (out / "layers.md").is_file()
    capsys.readouterr()
    fresh = [str(tmp_path / "layers-bad") if a == str(out) else a for a in base]
    assert main([*fresh, "--layers", "0,5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of range" in err[0]


def test_python_probe_runs_the_experiment_the_command_runs(tiny_llama, small_corpus, tmp_path, capsys):
    """memlab.probes.probe(layers=[...]) is the layer sweep memlab probe --layers runs (one dispatch,
    memlab.probes.experiment), the same rows from the same options; memlab.probes.run.probe runs one probe only."""
    from memlab.errors import ConfigError
    from memlab.probes import probe
    from memlab.probes.run import probe as one_probe

    kw = dict(corpus=str(small_corpus), pool="mean", seq_len=8, n_train=64, n_eval=16, hidden_size=32, num_layers=1,
              epochs=1, ci_resamples=50, threads=1)
    got = probe(str(tiny_llama), out=tmp_path / "api", layers=[0, 2], **kw)
    assert [r["layer"] for r in got["rows"]] == [0, 2] and (tmp_path / "api" / "layers.json").is_file()
    flags = [f"{k}={v}" for k, v in kw.items() if k not in ("corpus", "pool")]
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--pool", "mean",
                 "--layers", "0,2", "--out", str(tmp_path / "cli"), *flags]) == 0
    cli = json.loads((tmp_path / "cli" / "layers.json").read_text())
    same = ("layer", "bow_recovered", "bits_per_chunk")
    assert [{k: r.get(k) for k in same} for r in cli["rows"]] == [{k: r.get(k) for k in same} for r in got["rows"]]
    with pytest.raises(ConfigError, match="layer sweep"):
        one_probe(str(tiny_llama), layers=[0, 2], **kw)


def test_learning_curve_one_pass(tiny_llama, small_corpus, tmp_path, capsys):
    out = tmp_path / "curve"
    base = ["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
            "seq_len=8", "n_eval=16", "hidden_size=32", "num_layers=1", "epochs=1"]
    assert main([*base, "--n-train", "64,32"]) == 0
    res = json.loads((out / "curve.json").read_text())
    assert [r["n_train"] for r in res["rows"]] == [32, 64]
    assert all("information_gain" in r and "bow_recovered" in r for r in res["rows"])
    assert (out / "plots" / "learning_curve.png").stat().st_size > 1000
    capsys.readouterr()
    fresh = [str(tmp_path / "curve-bad") if a == str(out) else a for a in base]
    assert main([*fresh, "--n-train", "64,10000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds only" in err[0] and "10000000 asked" in err[0]


def test_calibrate_option_runs_positive_controls(tiny_llama, small_corpus):
    opts = load_options(None, SMALL, model=str(tiny_llama), corpus=str(small_corpus), calibrate=True, epochs=1,
                        n_train=64)
    rep = run_probe(opts)
    cal = rep["calibration"]
    assert [c["control"].split()[0] for c in cal["checks"]] == ["synthetic:concat", "synthetic:bag"]
    assert cal["status"] == ("passed" if all(c["passed"] for c in cal["checks"]) else "failed")


@pytest.mark.parametrize("select", [True, False])
def test_decoder_selection_keeps_the_lower_held_back_ce(tokenizer, small_corpus, select):

    over = [o for o in SMALL if not o.startswith(("inputs", "bag_head", "epochs", "patience"))]
    opts = load_options(None, over + ["inputs=teacher", "bag_head=true", "epochs=4", "patience=4",
                                      f"select_decoder={str(select).lower()}"],
                        model="synthetic:concat", corpus=str(small_corpus), control=False, readouts=[])
    r = run_probe(opts, encoder=SyntheticEncoder("concat", tokenizer, max_len=8))
    dec = r["_fitted"].decoder
    choice = r["probe"].get("decoder_choice")
    if not select:
        assert choice is None and dec.config.bag_head and r["decoder"]["bag_head"]
        return
    assert choice["kept"] == ("plain" if choice["plain"] < choice["bag_head"] else "bag_head")
    kept_plain = choice["kept"] == "plain"
    assert bool(dec.config.bag_head) is not kept_plain and r["decoder"]["bag_head"] is not kept_plain
    assert dec.config.input_dropout == (ProbeOptions.plain_input_dropout if kept_plain else 0.0)
    best = min(h["best_val_ce"] for h in r["history"]["probe"] if "best_val_ce" in h)
    assert best == pytest.approx(min(choice["plain"], choice["bag_head"]))  # the kept decoder's own history


def test_the_learning_curve_reads_a_whole_code_saturated_and_a_constant_one_as_its_control(readings):
    concat, const = readings["concat"], readings["constant"]
    sat = concat["saturation"]
    assert [r["n_train"] for r in sat["curve"]] == [75, 150, 300, 600]  # the shares (38 is too few), then the run
    assert sat["curve"][-1]["bits_per_chunk"] == concat["readings"]["bits_per_chunk"]
    assert sat["saturated"] is True and sat["ceiling"]["reached"]  # read whole: nothing left to rise to
    code = concat["online_code"]
    assert code["n_chunks"] == 600 and code["blocks"][0] == {**code["blocks"][0], "start": 0, "end": 75}
    assert code["compression"]["low"] > 1.3 and code["probe_bits"] < 0.75 * code["control_bits"]
    assert concat["readings"]["online_compression"] == code["compression"]
    # a constant embedding: its probe is its control at every size, so its code is the control's, bit for bit
    assert const["online_code"]["compression"] == {"value": 1.0, "low": 1.0, "high": 1.0}
    assert const["online_code"]["probe_bits"] == const["online_code"]["control_bits"]
    assert const["saturation"]["saturated"] is True
    assert all(r["bits_per_chunk"]["value"] == 0 for r in const["saturation"]["curve"])
    pw = concat["pointwise"]
    assert len(pw["bits"]) == concat["n_eval"] and sum(pw["bits"]) / len(pw["bits"]) == pytest.approx(
        concat["readings"]["bits_per_chunk"]["value"], abs=1e-3)
    assert pw["most"][0]["bits"] >= pw["least"][0]["bits"] and pw["most"][0]["text"]
