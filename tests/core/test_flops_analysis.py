"""The analytic inference-FLOPs model: parameter counts against real modules, sums, the paper's crossover."""

from __future__ import annotations

import numpy as np
import pytest

from memlab import flops
from memlab.analysis import flops_model as fm


def test_shape_counts_match_a_real_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    shape = fm.TransformerShape(layers=3, d_model=64, d_ff=96, heads=4, kv_heads=2, vocab_head=100)
    assert shape.matrix_params() == flops.matrix_params(model)
    # one token with no context costs 2 FLOPs per matrix parameter, as memlab.flops counts a forward pass
    assert shape.per_token(0) == pytest.approx(flops.transformer_forward_flops(flops.matrix_params(model), 3, 64, 1) - 4 * 3 * 64)


def test_causal_stream_is_the_sum_over_tokens():
    s = fm.TransformerShape(layers=2, d_model=32, d_ff=64, heads=4)
    n = 37
    assert s.causal_stream(n) == pytest.approx(sum(s.per_token(t) for t in range(1, n + 1)))
    assert s.bidirectional(n) == pytest.approx(n * s.per_token(n))


def test_paper_crossover_is_about_4096_tokens():
    r = fm.sonar_vs_token_lm()
    x = r["crossover_tokens"]
    assert 2048 <= x <= 8192, x
    lm = dict(zip(r["tokens"], r["token_lm"]))
    so = dict(zip(r["tokens"], r["sonar_llm"]))
    assert lm[1024] < so[1024] and lm[16384] > so[16384]
    # SONAR-LLM's quadratic term is scaled by 1/60^2: near-linear total cost up to 1M tokens
    assert so[2**20] / so[2**12] < 1.02 and lm[2**20] / lm[2**12] > 10
    # a longer sentence moves the crossover earlier (the encoder/decoder cost per token is fixed,
    # while the sentence model's share shrinks)
    assert fm.sonar_vs_token_lm(sentence_len=120)["crossover_tokens"] < x


def test_memory_model_scales_attention_by_k_over_c():
    dec = fm.TransformerShape(layers=2, d_model=64, d_ff=128, heads=4)
    enc = fm.TransformerShape(layers=2, d_model=64, d_ff=128, heads=4)
    c, k, T = 64, 4, 2.0**16

    def quad(f):  # the T^2 part: f(2T) - 2 f(T)
        return f(2 * T) - 2 * f(T)

    mem = quad(lambda t: fm.memory_model_flops(t, enc, dec, c, k))
    lm = quad(lambda t: fm.token_lm_flops(t, dec))
    assert mem / lm == pytest.approx(k / c, rel=1e-6)


def test_crossover_none_when_curves_do_not_cross():
    assert fm.crossover(lambda t: t * 0 + 1.0, lambda t: t * 0 + 2.0) is None
    assert fm.crossover(lambda t: t, lambda t: 1000 + 0 * t) == pytest.approx(1000, rel=1e-6)


def test_plot_writes_png(tmp_path):
    r = fm.sonar_vs_token_lm()
    p = tmp_path / "f.png"
    fm.plot_flops({"token LM": (r["tokens"], r["token_lm"]), "SONAR-LLM": (r["tokens"], r["sonar_llm"])}, p,
                  crossover_at=r["crossover_tokens"])
    assert p.stat().st_size > 5000


def test_bad_shape_is_an_error():
    from memlab.errors import MemlabError

    with pytest.raises(MemlabError):
        fm.TransformerShape(layers=0, d_model=8, d_ff=8, heads=1)
