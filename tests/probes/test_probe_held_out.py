"""A held-out split smaller than --n-eval: all of it is scored, with one warning line and a note in the report."""

from __future__ import annotations

import json

import pytest

from memlab.app.cli import main
from memlab.data.corpus import load_corpus, make_splits, split_chapters, units
from memlab.data.views import token_chunks
from memlab.probes.chunks import cut as T

TINY = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=16", "n_train=64",
        "epochs=1", "n_examples=2", "select_decoder=false", "--no-bow", "--no-control"]
TOKENS = [*TINY, "chunk_by=tokens"]  # chunks cut in the model's own tokens

pytestmark = pytest.mark.usefixtures("one_thread")


def test_n_eval_larger_than_the_split_scores_all_of_it(tiny_llama, tokenizer, small_corpus, tmp_path, capsys):
    have = token_chunks(list(T._stream(str(small_corpus)).texts("test")), tokenizer, 16).shape[0]  # chunks there are
    assert 0 < have < 100_000
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
                 "--n-eval", "100000", *TOKENS]) == 0
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memlab: warning:")]
    assert len(warnings) == 1 and "n_eval=100000" in warnings[0] and f"all {have} are scored" in warnings[0]
    rep = json.loads((out / "report.json").read_text())
    assert rep["n_eval"] == have and f"holds {have} chunks of 16 tokens" in rep["eval_note"]
    assert len(rep["probe"]["accuracy_by_position"]) == 16


def test_enough_held_out_chunks_leave_no_note(tiny_llama, small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
                 "--n-eval", "8", *TOKENS]) == 0
    assert "memlab: warning:" not in capsys.readouterr().err
    rep = json.loads((out / "report.json").read_text())
    assert rep["n_eval"] == 8 and rep.get("eval_note") is None


def test_a_held_out_split_with_no_chunk_is_one_clear_line(tiny_llama, small_corpus, tmp_path, capsys):
    # one book of 24 chapters whose test chapters are cut to a word: the split exists but holds no chunk
    body = [c.text for c in split_chapters(load_corpus(str(small_corpus))[0])]
    chapters = [body[i % len(body)] for i in range(24)]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "book.txt").write_text("".join(f"\n\nCHAPTER {i + 1}\n\n{c}" for i, c in enumerate(chapters)))
    test_ids = {d.id for d in make_splits(units(load_corpus(str(tmp_path / "full")), "chapter"), 0.05, 0.05, 0)["test"]}
    assert test_ids
    short = [("Yes." if f"book/ch{i + 1:03d}" in test_ids else c) for i, c in enumerate(chapters)]
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "book.txt").write_text("".join(f"\n\nCHAPTER {i + 1}\n\n{c}" for i, c in enumerate(short)))
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(tmp_path / "short"), "--out",
                 str(tmp_path / "run"), *TOKENS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memlab: error:"), err
    assert "the test split of" in err[0] and "holds no chunk of 16 tokens" in err[0]


def test_word_chunks_beyond_the_split_are_all_scored(tiny_llama, small_corpus, tmp_path, capsys):
    have = len(T.probe_texts(5, 100_000, "test", str(small_corpus), 0, at_most=True))  # 5-word chunks there are
    assert 0 < have < 100_000
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out),
                 "--n-eval", "100000", *TINY, "seq_len=5"]) == 0  # 5 words fit the tiny model's 48 positions
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memlab: warning:")]
    assert len(warnings) == 1 and f"all {have} are scored" in warnings[0]
    rep = json.loads((out / "report.json").read_text())
    assert rep["n_eval"] == have and f"holds {have} chunks of 5 words" in rep["eval_note"]
