"""Evaluation tasks and `memlab eval` on a tiny trained token LM (local data only)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memlab.errors import MemlabError


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, small_corpus):
    from memlab.config import load_config
    from memlab.train.experiment import run_experiment
    from tests.conftest import write_config

    d = tmp_path_factory.mktemp("evalrun")
    cfg = write_config(d / "c.yaml", small_corpus, train={"max_steps": 6, "eval_every": 6, "save_every": 6, "log_every": 3})
    run_experiment(load_config(cfg), d / "run")
    return d / "run"


@pytest.fixture(scope="module")
def adapter(tiny_run):
    from memlab.app.eval.adapters import load_adapter

    return load_adapter(tiny_run)


def test_tasks_are_registered():
    import memlab.app.eval  # noqa: F401
    from memlab.registry import TASKS

    assert {"next_sentence", "xsum", "cnn_dailymail", "needle", "multidoc_qa", "hellaswag"} <= set(TASKS.names())


def test_score_matches_a_direct_forward_pass(adapter):
    import torch

    ctx, cont = "It was a fine morning", " and she walked out."
    (lp, n), = adapter.score([ctx], [cont])
    tok, model = adapter.tok, adapter.model
    c = tok(ctx, add_special_tokens=False)["input_ids"]
    x = tok(cont, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([c + x])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    expected = sum(logp[len(c) + i - 1, t].item() for i, t in enumerate(x))
    assert n == len(x) and lp == pytest.approx(expected, abs=1e-4)
    # batching (right padding) does not change a score
    both = adapter.score([ctx, "A much longer context sentence that pads the other row"], [cont, " yes."])
    assert both[0][0] == pytest.approx(lp, abs=1e-4)
    assert lp < 0 and math.isfinite(lp)


def test_hellaswag_ranks_by_likelihood(adapter, monkeypatch):
    from memlab.app.eval.tasks import TaskOptions, get_task

    task = get_task("hellaswag")
    ex = task.load(TaskOptions())
    assert len(ex) == 8
    # a fake scorer that prefers the labelled ending proves the ranking and normalization logic
    labels = iter([e["label"] for e in ex for _ in e["endings"]])
    idx = iter([i for e in ex for i in range(len(e["endings"]))])
    fake = type("A", (), {"score": lambda self, c, x: [(0.0 if next(idx) == next(labels) else -50.0, 1) for _ in x]})()
    assert task.evaluate(fake, ex, TaskOptions()) == {"n": 8, "acc": 1.0, "acc_norm": 1.0}
    res = task.evaluate(adapter, ex, TaskOptions())
    assert 0.0 <= res["acc"] <= 1.0 and res["n"] == 8


def test_needle_prompt_has_needle_at_depth_and_fits(adapter):
    from memlab.app.eval.longctx import Needle, haystack_sentences
    from memlab.app.eval.tasks import TaskOptions

    task = Needle()
    opts = TaskOptions(needle_lengths=(384, 480), needle_depths=(0.0, 1.0))
    ex = task.load(opts)
    assert len(ex) == 4 and {e["length"] for e in ex} == {384, 480}
    sents = haystack_sentences()
    p0 = task.build_prompt(adapter, ex[0], sents)
    p1 = task.build_prompt(adapter, ex[1], sents)
    from memlab.app.eval.longctx import NEEDLE_INTRO

    def haystack(p):  # the text between the instructions and the question
        return p[len(NEEDLE_INTRO) : p.index("\nWhat is the special")]

    h0, h1 = haystack(p0), haystack(p1)
    assert len(h0) > 150
    assert h0.startswith(f"One of the special magic numbers for {ex[0]['key']} is: {ex[0]['value']}.")
    assert h1.endswith(f"One of the special magic numbers for {ex[1]['key']} is: {ex[1]['value']}.")
    assert 384 - 40 <= adapter.count_tokens(p0) <= 384 + 8
    res = task.evaluate(adapter, ex, opts)
    assert set(res) >= {"exact_match", "exact_match@384", "exact_match@480", "choice_accuracy"}
    # a model that echoes the value gets exact match 1
    echo = type("E", (), {"name": "echo", "max_context": 10_000, "can_score": False,
                          "count_tokens": lambda s, t: len(t.split()),
                          "generate": lambda s, ps, n: [p.split("is: ")[1].split(".")[0] for p in ps]})()
    assert task.evaluate(echo, ex, opts)["exact_match"] == 1.0
    with pytest.raises(MemlabError, match="does not fit"):
        task.evaluate(adapter, task.load(TaskOptions(needle_lengths=(5000,))), opts)


def test_qa_metrics():
    from memlab.app.eval.longctx import normalize_answer, qa_f1

    assert normalize_answer("The  Kelso!") == "kelso"
    assert qa_f1("in Kelso town", "Kelso") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert qa_f1("Vienna", "Paris") == 0.0


def test_bad_data_is_a_clear_error(tmp_path):
    from memlab.app.eval.tasks import TaskOptions, get_task

    bad = tmp_path / "x.jsonl"
    bad.write_text('{"document": "a"}\n')
    with pytest.raises(MemlabError, match="missing field 'summary'"):
        get_task("xsum").load(TaskOptions(data=str(bad)))
    with pytest.raises(MemlabError, match="not found"):
        get_task("xsum").load(TaskOptions(data=str(tmp_path / "none.jsonl")))


def test_memlab_eval_cli_writes_table(tiny_run, tmp_path, capsys):
    from memlab.app.cli import main

    out = tmp_path / "ev"
    rc = main(["eval", "--run", str(tiny_run), "--task", "hellaswag", "--task", "needle",
               "--task", "next_sentence", "--task", "xsum", "--task", "multidoc_qa", "--limit", "2",
               "--max-new-tokens", "6", "--needle-lengths", "300", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "eval.json").read_text())["results"]
    (row,) = res.values()
    assert 0 <= row["hellaswag"]["acc"] <= 1 and row["hellaswag"]["n"] == 2
    assert "first_rouge_l" in row["next_sentence"] and "full_bleu" in row["next_sentence"]
    assert "rouge_l" in row["xsum"] and "f1" in row["multidoc_qa"]
    table = (out / "eval.md").read_text()
    assert "hellaswag/acc" in table and "needle/exact_match" in table
    assert main(["eval", "--run", str(tiny_run), "--task", "nope", "--out", str(tmp_path / "e2")]) == 2
    assert "unknown evaluation task 'nope'" in capsys.readouterr().err
