"""The bench harness on tiny sizes: structure of bench.json, README and plots (no timing assertions)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from memlab.devices import auto_dtype
from memlab.errors import MemlabError


def test_cost_exponent_and_timer():
    from memlab.app.bench.measure import PeakMemory, cost_exponent, time_call

    T = np.array([1024, 2048, 4096, 8192])
    assert cost_exponent(T, 3e-9 * T**2) == pytest.approx(2.0)
    assert cost_exponent(T, 5e-6 * T**1.2 + 0) == pytest.approx(1.2)
    assert time_call(lambda: sum(range(1000)), repeats=3) > 0
    with PeakMemory("cpu") as pm:
        x = torch.ones(64, 1024, 1024)  # 256 MiB, touched
        x += 1
        time.sleep(0.02)  # a few samples while it is held
    del x
    # it sees the allocation (RSS may also hold a little more: the allocator, the sampler thread)
    assert 200 * 2**20 <= pm.peak_bytes < 1024 * 2**20


def test_bench_quick_harness(tmp_path, small_corpus):
    from memlab.app.bench.runner import run_bench
    from tests.conftest import write_config

    cfg = write_config(tmp_path / "lm.yaml", small_corpus)
    out = tmp_path / "bench"
    res = run_bench(out, ["flops", "prefill", "generation", "mfu", "probe"], device="cpu", quick=True,
                    mfu_configs={"token_lm": str(cfg), "missing": str(tmp_path / "nope.yaml")}, command="memlab bench --quick",
                    log=lambda s: None)
    P = res["parts"]
    assert 2048 <= P["flops"]["crossover_tokens"] <= 8192
    rows = P["prefill"]["rows"]
    assert [r["tokens"] for r in rows] == [128, 256]
    assert all(r["full_attention"]["seconds"] > 0 for r in rows)
    if P["prefill"]["memory_family"]:
        assert all(r["memory"]["seconds"] > 0 and r["speedup"] > 0 for r in rows)
        assert np.isfinite(P["prefill"]["memory_exponent"])
    g = P["generation"]["rows"]
    assert [r["context_tokens"] for r in g] == [64, 128] and all(r["sonar_llm_s_per_token"] > 0 for r in g)
    m = P["mfu"]["token_lm"]
    assert 0 < m["mfu_steady"] < 1.5 and m["matmul_flops_per_s"] > 1e6
    assert "skipped" in P["mfu"]["missing"]
    pr = P["probe"]
    assert "encode_s" in pr or "skipped" in pr or "error" in pr
    if "encode_s" in pr:
        assert pr["encode_s"] > 0 and pr["decoder_train_s"] > 0 and 0 < pr["encode_share"] < 1
    fp32 = pr["decoder_mfu"]["float32"]  # the decoders' MFU in float32, beside the run's own float32 matmul
    assert fp32["dtype"] == "float32" and fp32["members"] == 3 and fp32["matmul_n"] == 2048
    assert fp32["flops_per_step"] > 0 and 0 < fp32["mfu"] < 1.5 and fp32["matmul_flops_per_s"] > 1e6
    native = auto_dtype(torch.device("cpu")) != torch.float32  # the probe's decoders train in bf16 here
    assert ("native" in pr["decoder_mfu"]) == native
    if native:
        assert pr["decoder_mfu"]["native"]["dtype"] == "bfloat16" and pr["decoder_mfu"]["native"]["mfu"] > 0
    saved = json.loads((out / "bench.json").read_text())
    assert set(saved["parts"]) == {"flops", "prefill", "generation", "mfu", "probe"}
    readme = (out / "README.md").read_text()
    assert "memlab bench --quick" in readme and "(a) Prefill" in readme and "(c) Training MFU" in readme
    assert "Target: >= 0.5 in float32" in readme and f"| float32 | {fp32['mfu']:.2f} |" in readme
    for p in ("flops", "prefill", "generation"):
        assert (out / "plots" / f"{p}.png").stat().st_size > 1000
    with pytest.raises(MemlabError, match="already holds files"):
        run_bench(out, ["flops"])
    with pytest.raises(MemlabError, match="unknown bench part 'speed'"):
        run_bench(tmp_path / "b2", ["speed"])


def test_bench_cli_flops_only(tmp_path, capsys):
    from memlab.app.cli import main

    assert main(["bench", "--parts", "flops", "--out", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    assert "crossover" not in text or "tokens" in text
    assert "SONAR-LLM becomes cheaper" in text
    assert main(["bench", "--parts", "flops", "--prefill-lengths", "1k", "--out", str(tmp_path / "c")]) == 2


def test_mfu_falls_back_when_a_config_cannot_be_set_up(tmp_path, small_corpus):
    from memlab.app.bench.mfu import run_mfu
    from tests.conftest import write_config

    good = write_config(tmp_path / "lm.yaml", small_corpus)
    bad = write_config(tmp_path / "bad.yaml", tmp_path / "no-such-corpus.txt")
    res = run_mfu(tmp_path / "out", {"lm": str(bad)}, steps=2, log=lambda s: None, fallbacks={"lm": str(good)})
    r = res["lm"]
    assert r["config"] == str(good) and r["fallback_from"] == str(bad) and "no-such-corpus" in r["fallback_reason"]
    assert r["mfu_steady"] > 0
    res = run_mfu(tmp_path / "out2", {"lm": str(bad)}, steps=2, log=lambda s: None)  # no fallback: the error is kept
    assert "error" in res["lm"] and "fallback_from" not in res["lm"]


def test_every_benchmark_script_is_indexed():
    """benchmarks/README.md names every script of benchmarks/ (and none that is not there)."""
    import re
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    scripts = {p.name for p in folder.glob("*.py")}
    text = (folder / "README.md").read_text()
    indexed = set(re.findall(r"^\| `([\w.]+\.py)` \|", text, flags=re.M))
    assert indexed == scripts, (scripts - indexed, indexed - scripts)
