"""One causal generation (memlab.generation): the over-long-prompt rule, shared by `memlab generate`
and the evaluation adapter; generators take GenerationOptions; the runner honours needs_scores."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError
from memlab.generation import GenerationOptions, causal_generate, fit_prompt
from memlab.registry import FAMILIES

WINDOW = 24


def test_fit_prompt_keeps_the_end():
    ids = list(range(30))
    assert fit_prompt(ids, 24, 4) == list(range(10, 30))  # 20 = 24 - 4 tokens, the last ones
    assert fit_prompt(ids[:5], 24, 4) == ids[:5]
    assert fit_prompt(ids, None, 4) == ids
    with pytest.raises(MemlabError, match="no room"):
        fit_prompt(ids, 24, 24)


@pytest.mark.parametrize("bad", [dict(max_new_tokens=0), dict(num_beams=0), dict(sample=True, temperature=0.0),
                                 dict(top_p=1.5), dict(max_sentences=0)])
def test_generation_options_reject_bad_values(bad):
    with pytest.raises(MemlabError):
        GenerationOptions(**bad)


@pytest.fixture(scope="module")
def small_lm(tmp_path_factory):
    """A toy token LM with a 24-position window, saved with a byte tokenizer."""
    from memlab.models.sentence.toy_space import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(0)
    model = FAMILIES.get("token_lm").make_model("toy", vocab_size=len(tok), max_position_embeddings=WINDOW,
                                                 pad_token_id=tok.pad_token_id)
    d = tmp_path_factory.mktemp("lm")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return model.eval(), tok, d


def test_over_long_prompt_is_cut_from_the_left(small_lm):
    model, tok, _ = small_lm
    long_prompt = "abcdefghij" * 5  # 50 byte tokens > the window
    tail = long_prompt[-(WINDOW - 6) :]  # what the rule keeps for 6 new tokens
    opts = GenerationOptions(max_new_tokens=6)
    (a,) = causal_generate(model, tok, [long_prompt], opts)
    (b,) = causal_generate(model, tok, [tail], opts)
    assert a == b  # only the end of the prompt was read
    (c,) = causal_generate(model, tok, ["xyz" + tail], opts)
    assert c == a  # a different (cut) beginning changes nothing
    with pytest.raises(MemlabError, match="no room"):
        causal_generate(model, tok, ["abc"], GenerationOptions(max_new_tokens=WINDOW))


def test_cli_and_eval_adapter_generate_the_same(small_lm, capsys):
    from memlab.app.cli import main
    from memlab.app.eval.adapters import load_adapter

    _, _, d = small_lm
    prompt = "The quick brown fox jumps over the lazy dog."  # longer than the window: cut, not an error
    assert main(["generate", "--run", str(d), "--prompt", prompt, "--max-new-tokens", "5"]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    (gen,) = load_adapter(d).generate([prompt], max_new_tokens=5)
    assert printed == prompt + gen
    assert main(["generate", "--run", str(d), "--prompt", "x", "--max-new-tokens", str(WINDOW)]) == 2
    assert "no room" in capsys.readouterr().err


def test_runner_gives_scored_tasks_only_to_scoring_adapters(small_lm):
    from memlab.adapters import GeneratorAdapter
    from memlab.app.eval.runner import evaluate_models
    from memlab.app.eval.tasks import TaskOptions

    calls = []

    def gen(model_dir, prompts, opts):
        calls.append(opts)
        return ["x"] * len(prompts)

    ad = GeneratorAdapter(small_lm[2], gen, "gen-only")
    res = evaluate_models([ad], ["hellaswag", "next_sentence"], TaskOptions(limit=2), log=lambda s: None)
    assert "cannot score" in res["gen-only"]["hellaswag"]["error"]
    assert res["gen-only"]["next_sentence"]["n"] == 2
    assert calls and isinstance(calls[0], GenerationOptions) and calls[0].max_new_tokens == TaskOptions().max_new_tokens


def test_run_config_is_found_from_a_checkpoint(tmp_path):
    from memlab.loading import run_config, run_dir_of

    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step-00000006"
    ckpt.mkdir(parents=True)
    (run / "config.yaml").write_text("options:\n  objective: causal_lm\n")
    assert run_dir_of(ckpt) == run and run_dir_of(run) == run
    assert run_config(ckpt)["options"]["objective"] == "causal_lm"
    loose = tmp_path / "a" / "b" / "c"  # a saved folder three levels under some config.yaml: not a run
    loose.mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("options:\n  objective: causal_lm\n")
    assert run_dir_of(loose) is None and run_config(loose) == {}
