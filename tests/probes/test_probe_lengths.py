"""The length sweep (retention against length): one encoder load, each length cut from the same splits with the same
numbers of chunks, fitted with its own control and scored; curve.json, curve.md and the plot; bad input refused in one
line, exit 2, nothing written."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from memlab.app.cli import main
from memlab.errors import ConfigError
from memlab.probes.sweeps import lengths
from memlab.probes.options import load_options
from memlab.probes.run import run_probe
from tests.conftest import one_line_error

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["n_train=48", "n_eval=12", "hidden_size=32", "num_layers=1", "epochs=1", "ci_resamples=100",
        "select_decoder=false", "n_examples=1"]


@pytest.fixture(scope="module")
def sweep(tiny_llama, small_corpus, tmp_path_factory):
    """One CLI length sweep of the tiny Llama (3 and 6 words), counting the encoder loads."""
    out = tmp_path_factory.mktemp("lengths") / "run"
    loads = []
    real = lengths.load_encoder
    lengths.load_encoder = lambda opts, encoder=None: loads.append(opts.seq_len) or real(opts, encoder)
    try:
        rc = main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
                   "--seq-len", "6,3", *TINY])
    finally:
        lengths.load_encoder = real
    return rc, out, loads


def test_each_length_is_fitted_on_one_encoder_load(sweep):
    rc, out, loads = sweep
    assert rc == 0 and loads == [6]  # once, for the longest length
    res = json.loads((out / "curve.json").read_text())
    assert res["lengths"] == [3, 6] and [r["seq_len"] for r in res["rows"]] == [3, 6]
    short, long_ = res["rows"]
    assert short["n_train"] == long_["n_train"] == 48 and short["n_eval"] == long_["n_eval"] == res["n_eval"]
    assert long_["tokens_per_chunk"] > short["tokens_per_chunk"] >= 3  # a word is at least one token
    assert short["text"]["per_chunk"] == "3 words" and long_["text"]["per_chunk"] == "6 words"
    for r in res["rows"]:
        read = r["readings"]
        for key in ("bits_per_chunk", "bits_per_token", "token_accuracy"):
            assert read[key]["low"] <= read[key]["value"] <= read[key]["high"], key
        assert read["bits_per_token"]["value"] == pytest.approx(read["bits_per_chunk"]["value"]
                                                                / r["tokens_per_chunk"], rel=1e-6)
        assert r["control_accuracy"] is not None and r["retention"]
        if "free_running_accuracy" in read:  # the greedy reconstruction's positional accuracy, with its interval
            assert r["free_running_accuracy"] == pytest.approx(read["free_running_accuracy"]["value"])


def test_the_curve_files(sweep):
    _, out, _ = sweep
    table = (out / "curve.md").read_text().splitlines()
    assert table[0].startswith("| seq_len (words) | tokens per chunk | bits per chunk | bits per token")
    assert [ln.split("|")[1].strip() for ln in table[2:]] == ["3", "6"]
    assert (out / "plots" / "length_curve.png").stat().st_size > 5000
    assert not (out / "report.json").exists()  # the per-length reports are curve.json's rows


def test_one_progress_line_per_length(tiny_llama, small_corpus, tmp_path, capsys):
    rep = lengths.run_length_sweep(load_options(None, [*TINY, "seq_len=[3,5]", "readouts=[]", "chunk_by=tokens"],
                                                model=str(tiny_llama), corpus=str(small_corpus), progress=False))
    out = capsys.readouterr().out.splitlines()
    done = [ln for ln in out if ln.startswith("[seq_len ") and "tokens per chunk:" in ln]
    assert [ln.split("]")[0] for ln in done] == ["[seq_len 3", "[seq_len 5"]
    assert [r["tokens_per_chunk"] for r in rep["rows"]] == [3.0, 5.0]  # chunk_by=tokens: lengths are tokens


def test_lengths_from_yaml_key_value_and_the_api(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump({"recipe": "probe", "options": {"seq_len": [16, 8, 32]}}))
    assert load_options(cfg).seq_len == [8, 16, 32]
    assert load_options(None, ["seq_len=16,8"]).seq_len == [8, 16]
    assert load_options(None, ["seq_len=[16]"]).seq_len == 16  # a list of one is one length
    from memlab.probes import probe

    got = probe("synthetic:concat", seq_len=[3, 6], chunk_by="tokens", readouts=[], n_train=24, n_eval=8, epochs=1,
                hidden_size=16, num_heads=2, num_layers=1, ci_resamples=50, select_decoder=False, progress=False)
    assert [r["seq_len"] for r in got["rows"]] == [3, 6] and got["model"] == "synthetic:concat"
    with pytest.raises(ConfigError, match="length sweep"):  # one probe run takes one length
        run_probe(load_options(None, ["seq_len=3,6"], model="synthetic:concat"))


@pytest.mark.parametrize("extra, words", [
    (["--seq-len", "8,0"], "'seq_len' must be >= 2"),
    (["--seq-len", "8,-4"], "'seq_len' must be >= 2"),
    (["--seq-len", "8,1.5"], "comma list of integers"),
    (["seq_len=[8, 16.5]"], "'seq_len'"),
    (["--seq-len", "4,8", "--layers", "all"], "separate sweeps"),
    (["--seq-len", "4,8", "--n-train", "24,48"], "separate sweeps"),
    (["--seq-len", "4,8", "--compare", "llama,bow"], "separate sweeps"),
    (["--seq-len", "4,8", "max_chunk_tokens=16"], "max_chunk_tokens"),
    (["--seq-len", "4,64", "chunk_by=tokens"], "seq_len 64 tokens is longer than"),
    (["--seq-len", "4,60"], "seq_len 60 words"),
    (["--seq-len", "3,8"], "chunks of 8 words are longer than"),  # within the positions, not in this tokenizer
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(extra, words, tiny_llama, small_corpus, tmp_path,
                                                           capsys):
    out = tmp_path / "bad"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out), *TINY,
                 *extra]) == 2
    line = one_line_error(capsys)
    assert words in line, line
    assert not out.exists()


def test_a_limit_names_the_models_positions(tiny_llama, small_corpus, tmp_path, capsys):
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(tmp_path / "x"),
                 *TINY, "--seq-len", "4,100", "chunk_by=tokens"]) == 2
    line = one_line_error(capsys)
    assert "seq_len 100 tokens is longer than" in line and "reads: 48 tokens" in line, line
    assert not (tmp_path / "x").exists()


def test_every_length_scores_as_many_held_out_chunks(tiny_llama, small_corpus, capsys):
    opts = load_options(None, [*TINY, "n_eval=100000", "seq_len=[3,6]"], model=str(tiny_llama),
                        corpus=str(small_corpus))
    enc = lengths.load_encoder(replace(opts, seq_len=6))
    data = lengths.cut_lengths(opts, enc, [3, 6])
    counts = {n: d[2].shape[0] for n, d in data.items()}
    assert counts[3] == counts[6] < 100000  # the split holds fewer chunks of 6 words: that many at every length
    assert all(d[1].shape[0] == 48 for d in data.values())  # and the same training chunks' number
    assert data[3][3].accounting.per_chunk == "3 words" and data[6][3].accounting.per_chunk == "6 words"
    assert lengths.cut_lengths(replace(opts, seq_len=[3]), enc, [3])[3][2].shape[0] > counts[3]  # alone: more
