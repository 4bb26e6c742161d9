"""The learning curve's verdict, its extrapolation, the online code and pointwise information, on cases whose answer
is known by hand (the probe runs that read them: tests/probes/test_probe_calibration.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memlab.probes.readouts.online_code import Block, online_code, uniform_block
from memlab.probes.readouts.pointwise import pointwise
from memlab.probes.readings import ChunkScores
from memlab.probes.readouts.saturation import MIN_CHUNKS, Point, curve_sizes, limit_note, power_limit, verdict

LN2 = math.log(2)


def test_online_code_by_hand():
    # 2 chunks of 3 tokens under the uniform code over V = 8 (3 bits a token), then 2 blocks of 1 and 2 chunks
    first = uniform_block(2, np.array([3, 3]), 8)
    b1 = Block(2, 3, np.array([4.0]) * LN2, np.array([6.0]) * LN2, np.array([3]))  # probe 4 bits, control 6
    b2 = Block(3, 5, np.array([1.0, 3.0]) * LN2, np.array([5.0, 5.0]) * LN2, np.array([3, 3]))
    code = online_code([first, b1, b2], 8, n_resamples=200)
    assert first.probe_nll.tolist() == pytest.approx([9 * LN2, 9 * LN2])
    assert code["probe_bits"] == pytest.approx(18 + 4 + 1 + 3) and code["control_bits"] == pytest.approx(18 + 6 + 10)
    assert code["uniform_bits"] == pytest.approx(5 * 9) and code["n_chunks"] == 5
    assert code["bits_per_chunk"]["value"] == pytest.approx((34 - 26) / 5)
    assert code["compression"]["value"] == pytest.approx(34 / 26)
    assert code["uniform_compression"] == pytest.approx({"probe": 45 / 26, "control": 45 / 34})
    assert code["bits_per_chunk"]["low"] <= code["bits_per_chunk"]["value"] <= code["bits_per_chunk"]["high"]
    assert [(b["start"], b["end"]) for b in code["blocks"]] == [(0, 2), (2, 3), (3, 5)]


def test_a_code_equal_to_the_controls_compresses_nothing():
    first = uniform_block(4, np.array([5, 6, 7, 8]), 100)
    nll = np.array([10.0, 12.0, 9.0])
    code = online_code([first, Block(4, 7, nll, nll.copy(), np.array([5, 5, 5]))], 100, n_resamples=100)
    assert code["compression"] == {"value": 1.0, "low": 1.0, "high": 1.0}
    assert code["bits_per_chunk"] == {"value": 0.0, "low": 0.0, "high": 0.0}


def test_the_power_law_finds_a_known_limit():
    ns = np.array([500, 1000, 2000, 4000, 8000])
    ys = 100 - 80 * (ns / 8000.0) ** -0.6 / 4  # L = 100
    lim, a, alpha = power_limit(ns, ys)
    assert lim[0] == pytest.approx(100, rel=0.03) and alpha[0] == pytest.approx(0.6, rel=0.1) and a[0] > 0
    flat = power_limit(ns, 100 - 0 * ns)
    assert flat[0][0] == pytest.approx(100) and flat[1][0] == 0  # not rising: its last value


def _scores(nll, m=200, tokens=10, seed=0, hits=None):
    rng = np.random.default_rng(seed)
    per = np.asarray(nll, dtype=np.float64) + rng.normal(0, 0.5, m)  # (M,) a chunk's NLL around its mean
    hits = np.full(m, tokens // 2) if hits is None else np.full(m, hits)
    return ChunkScores(per, hits, np.full(m, tokens))


def _curve(bits_at):
    """Points at 125-2000 chunks whose probe reads ``bits_at(n)`` bits per chunk below a fixed control (NLL 100)."""
    ns = [125, 250, 500, 1000, 2000]
    ctl = ChunkScores(np.full(200, 100.0), np.full(200, 2), np.full(200, 10))
    return [Point(n, _scores(100 - bits_at(n) * LN2, seed=k, hits=min(10, 2 + k)), ctl) for k, n in enumerate(ns)]


def test_a_flat_curve_is_saturated_and_a_rising_one_is_not():
    flat = verdict(_curve(lambda n: 40.0), n_resamples=300)
    assert flat["saturated"] is True and flat["limit"] is None
    assert [r["n_train"] for r in flat["curve"]] == [125, 250, 500, 1000, 2000]
    assert flat["curve"][-1]["bits_per_chunk"]["value"] == pytest.approx(40, abs=0.2)
    rising = verdict(_curve(lambda n: 60 - 50 * (n / 125) ** -0.7), n_resamples=300)
    assert rising["saturated"] is False and rising["last_doubling"]["low"] > 0.05 * 60 * 0.5
    lim = rising["limit"]["bits_per_chunk"]
    assert lim["low"] <= 60 <= lim["high"] and lim["value"] == pytest.approx(60, abs=2)
    acc = rising["limit"]["token_accuracy"]  # 0.2, 0.3, ... 0.6: a step a doubling, like log n
    assert acc["value"] is None and "log n" in acc["note"]
    line = limit_note("content-limited: something", rising)
    assert line.startswith("content-limited: something; and by the training chunks: still rising")
    assert limit_note(None, rising).startswith("the training chunks: still rising")
    assert limit_note("x", flat) == "x"


def test_a_curve_within_the_tolerance_is_saturated():
    # the last doubling adds 1 bit of 100: shown above zero, but not above 5 % of the reading
    rising_a_little = verdict(_curve(lambda n: 100.0 if n == 2000 else 99.0), n_resamples=300)
    assert rising_a_little["last_doubling"]["low"] > 0 and rising_a_little["saturated"] is True


def test_a_curve_at_its_ceiling_is_saturated():
    # the probe pays 1 bit of the control's 100 at the end, after a last step of +30: the chunks come back whole
    pts = _curve(lambda n: 69.0)
    pts[-1].probe.nll[:] = 1.0 * LN2
    whole = verdict(pts, n_resamples=300)
    assert whole["last_doubling"]["low"] > 25 and whole["ceiling"]["reached"] and whole["saturated"] is True
    assert whole["ceiling"]["bits_per_chunk"] == pytest.approx(100 / LN2) and whole["ceiling"]["left"] == pytest.approx(1)


def test_curve_sizes_leave_out_small_shares():
    assert curve_sizes([0.0625, 0.125, 0.25, 0.5], 8000) == [500, 1000, 2000, 4000]
    assert curve_sizes([0.0625, 0.5], 200) == [100] and MIN_CHUNKS > 200 * 0.0625
    assert curve_sizes([], 8000) == [] and curve_sizes([1.0], 64) == []


def test_pointwise_information_is_the_bits_of_each_chunk():
    p = ChunkScores(np.array([1.0, 5.0, 2.0]) * LN2, np.zeros(3), np.array([2, 4, 1]))
    c = ChunkScores(np.array([3.0, 5.0, 10.0]) * LN2, np.zeros(3), np.array([2, 4, 1]))
    pw = pointwise(p, c, ["a", "b", "c"], shown=2)
    assert pw["bits"] == pytest.approx([2.0, 0.0, 8.0])
    assert [r["text"] for r in pw["most"]] == ["c", "a"] and [r["text"] for r in pw["least"]] == ["b", "a"]
    assert pw["most"][0]["bits_per_token"] == pytest.approx(8.0)
    assert pointwise(p, None) is None


def test_a_probe_run_carries_its_curve_and_code_and_none_without_shares(tmp_path):
    from memlab.probes.report import format_summary
    from memlab.probes.run import probe

    tiny = dict(n_eval=8, seq_len=8, epochs=1, hidden_size=16, num_layers=1, num_heads=2, batch_size=32, n_examples=1,
                ci_resamples=50, progress=False, readouts=[], chunk_by="tokens")
    rep = probe(model="synthetic:concat", n_train=128, curve_shares=[0.5, 0.25], **tiny)
    sat, code = rep.saturation, rep.online_code
    assert [r["n_train"] for r in sat["curve"]] == [64, 128] and sat["saturated"] in (True, False)  # 32: too few
    assert sat["curve"][-1]["bits_per_chunk"] == rep["readings"]["bits_per_chunk"]
    assert [(b["start"], b["end"]) for b in code["blocks"]] == [(0, 64), (64, 128)] and code["n_chunks"] == 128
    first, v = code["blocks"][0], rep.vocab_size  # the first block: the uniform code, log2 V bits a target token
    assert first["probe_bits"] == first["control_bits"] > 0
    tokens = first["probe_bits"] / math.log2(v)
    assert tokens == pytest.approx(round(tokens)) and 64 <= round(tokens) <= 64 * 8
    assert code["probe_bits"] == pytest.approx(sum(b["probe_bits"] for b in code["blocks"]))
    assert "learning curve (bits per chunk by training chunks): 64:" in format_summary(rep)
    assert "online code:" in format_summary(rep) and rep["readings"]["online_compression"] == code["compression"]
    none = probe(model="synthetic:concat", n_train=128, curve_shares=[], **tiny)
    assert none.saturation["curve"][0]["n_train"] == 128 and none.saturation["saturated"] is None
    assert none.online_code is None and "online_compression" not in none.readings
