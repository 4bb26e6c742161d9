"""benchmarks/probe_cost.py: the encoder runs once, so its time does not grow with decoder epochs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import transformers as tf


def test_probe_cost_benchmark_split(tmp_path, small_corpus):
    from memlab.data.corpus import load_corpus
    from memlab.data.tokenizer import train_bpe

    n_threads = torch.get_num_threads()
    tok = train_bpe([d.text for d in load_corpus(str(small_corpus))], 300)
    model_dir = tmp_path / "m"
    tf.LlamaModel(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=4, vocab_size=len(tok), max_position_embeddings=32)
                  ).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "probe_cost.py"
    spec = importlib.util.spec_from_file_location("probe_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        res = mod.main(["--model", str(model_dir), "--corpus", str(small_corpus), "--n-train", "32", "--seq-len", "16",
                        "--epochs", "1", "1", "8", "--hidden-size", "32", "--num-layers", "1", "--threads", "1",
                        "--out", str(tmp_path / "cost.json")])
    finally:
        torch.set_num_threads(n_threads)
    _, a, b = res["rows"]  # the first row warms up (first-call overheads), the other two compare
    assert a["encode_s"] == b["encode_s"] > 0  # one encoder pass serves every epoch count
    assert b["train_s"] > a["train_s"] * 2  # decoder training grows with epochs (8x the work)
    assert b["encoder_share"] < a["encoder_share"]
    assert b["without_cache_s"] == b["train_s"] + 8 * b["encode_s"]
    assert (tmp_path / "cost.json").is_file() and res["memory"]["peak_rss_mb"] > 0


def _run_benchmark(name: str, argv: list[str]) -> dict:
    """benchmarks/NAME.py's main(argv), torch's thread count restored after."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    n_threads = torch.get_num_threads()
    try:
        return mod.main(argv)
    finally:
        torch.set_num_threads(n_threads)


def test_quickstart_budget_benchmark_reports_matmul_rate(tmp_path):
    res = _run_benchmark("quickstart_budget", ["--out", str(tmp_path / "b"), "--fast", "--only", "synthetic:constant",
                                               "--threads", "1"])
    assert list(res["entries"]) == ["synthetic:constant"] and res["quickstart_s"] >= res["entries"]["synthetic:constant"]
    assert res["matmul_gflops_before"] > 0 and res["matmul_gflops_after"] > 0 and res["threads"] == 1
    d = res["decoder"]
    assert d["flops_per_step"] > 0 and d["mfu"] == d["decoder_flops_per_s"] / d["matmul_flops_per_s"] > 0
    assert (tmp_path / "b" / "budget.json").is_file() and res["calibration"] == {"synthetic:constant": "passed"}


def test_probe_budget_benchmark_times_the_probe_beside_the_matmul_rate(tmp_path, tiny_llama, small_corpus):
    res = _run_benchmark("probe_budget", ["--out", str(tmp_path / "b"), "--model", str(tiny_llama), "--threads", "1",
                                          f"corpus={small_corpus}", "n_train=64", "n_eval=16", "seq_len=8",
                                          "hidden_size=32", "num_layers=1", "epochs=2", "n_examples=1"])
    assert res["exit"] == 0 and res["n_train"] == 64 and res["threads"] == 1
    t = res["timing"]
    assert res["probe_s"] >= t["train_s"] + t["encode_s"] > 0 and t["control_s"] > 0  # the control trained too
    assert res["matmul_gflops_before"] > 0 and res["matmul_gflops_after"] > 0
    assert res["within_budget"] == (res["probe_s"] <= res["budget_s"])
    assert (tmp_path / "b" / "budget.json").is_file() and (tmp_path / "b" / "probe" / "report.json").is_file()
