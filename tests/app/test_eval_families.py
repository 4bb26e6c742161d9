"""Evaluation adapters for the memory model and SONAR-LLM families (fresh toy models, saved and reloaded)."""

from __future__ import annotations

import math

import pytest
import torch

from memlab.registry import FAMILIES


@pytest.fixture(scope="module")
def byte_tok():
    from memlab.models.sentence.toy_space import byte_tokenizer

    return byte_tokenizer()


@pytest.fixture(scope="module")
def memory_dir(tmp_path_factory, byte_tok):
    if "memory" not in FAMILIES:
        pytest.skip("memory family not installed")
    torch.manual_seed(0)
    model = FAMILIES.get("memory").make_model("toy", vocab_size=len(byte_tok), chunk_len=8, max_chunks=8)
    d = tmp_path_factory.mktemp("mem")
    model.save_pretrained(d)
    byte_tok.save_pretrained(d)
    return d


def test_memory_adapter_scores_are_consistent_and_use_memory(memory_dir):
    from memlab.app.eval.adapters import load_adapter
    from memlab.models.memory.eval_adapter import MemoryLMAdapter

    ad = load_adapter(memory_dir)
    assert isinstance(ad, MemoryLMAdapter) and ad.mode == "previous" and ad.max_context == 64
    ctx, cont = "The cat sat on the mat.", " Then it slept."
    (lp, n), = ad.score([ctx], [cont])
    ids = ad.tok(ctx + cont, add_special_tokens=False)["input_ids"]
    assert n == len(ad.tok(cont, add_special_tokens=False)["input_ids"])
    assert lp == pytest.approx(float(ad._logprobs(ids)[-n:].sum()), abs=1e-4) and lp < 0
    # the continuation sits in later chunks: changing the first chunk changes its score only through memory
    (lp2, _), = ad.score(["Q!Z w?t sat on the mat."], [cont])
    assert lp2 != pytest.approx(lp, abs=1e-6)
    ad.mode = "none"
    (a, _), = ad.score([ctx], [cont])
    (b, _), = ad.score(["Q!Z w?t sat on the mat."], [cont])
    assert a == pytest.approx(b, abs=1e-5)  # without memory, a different first chunk cannot matter
    ad.mode = "previous"
    (g,) = ad.generate(["Once upon a time"], max_new_tokens=5)
    assert isinstance(g, str)
    # greedy generation agrees with the scorer's argmax
    ids = ad.tok("Once upon a time", add_special_tokens=False)["input_ids"]
    nxt = ad._next_token(ids)
    full = ad._logprobs(ids + [nxt])
    assert math.isfinite(float(full[-1]))


def test_memory_adapter_in_eval_table(memory_dir):
    from memlab.app.eval.adapters import load_adapter
    from memlab.app.eval.runner import evaluate_models, format_table
    from memlab.app.eval.tasks import TaskOptions

    ad = load_adapter(memory_dir, name="memory")
    res = evaluate_models([ad], ["hellaswag"], TaskOptions(limit=2), log=lambda s: None)
    assert res["memory"]["hellaswag"]["n"] == 2
    assert "| memory |" in format_table(res)


def test_sonar_llm_adapter(tmp_path):
    if "sonar_llm" not in FAMILIES:
        pytest.skip("sonar_llm family not installed")
    from memlab.app.eval.adapters import load_adapter
    from memlab.models.sonar_llm.eval_adapter import SonarLLMAdapter
    from memlab.models.sentence.spaces import SpaceHandle, load_space

    handle = SpaceHandle(load_space("toy_ae"), "toy_ae")
    torch.manual_seed(0)
    model = FAMILIES.get("sonar_llm").make_model("toy", embed_dim=handle.width, space_shape=handle.shape, space="toy_ae")
    model.save_pretrained(tmp_path)
    ad = load_adapter(tmp_path)
    assert isinstance(ad, SonarLLMAdapter)
    res = ad.score(["A man fills a kettle. He", "It rained."], [" waits for it to boil.", " The end."])
    (lp1, n1), (lp2, n2) = res
    assert lp1 < 0 and lp2 < 0 and n1 > 0 and n2 > 0
    # the unterminated context sentence is scored with the ending: more targets than the ending alone
    assert n1 > len(" waits for it to boil.".encode())
    (g,) = ad.generate(["It was a bright cold day. The clocks were striking."], max_new_tokens=8)
    assert isinstance(g, str)
