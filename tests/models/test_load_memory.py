"""The probe's loader reads a local folder a tensor at a time on the CPU (the same weights as transformers' own
read, no second copy), and benchmarks/load_memory.py's harness on a tiny model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch


def _bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "load_memory.py"
    spec = importlib.util.spec_from_file_location("load_memory", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=48)


@pytest.mark.parametrize("file_dtype,dtype", [("bfloat16", "float32"), ("float32", "bfloat16")])
def test_read_by_tensor_gives_transformers_own_weights(tmp_path, tokenizer, monkeypatch, file_dtype, dtype):
    import safetensors

    from memlab.probes.encoders.sources import load_encoder

    folder = tmp_path / "m"
    _bench().save_random_llama(folder, tokenizer, TINY, dtype=file_dtype, shard_mb=0)  # one shard per tensor
    assert len(list(folder.glob("*.safetensors"))) > 10
    backends = []
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: backends.append(k.get("backend")) or real(*a, **k))
    enc = load_encoder(str(folder), dtype=dtype, device="cpu")
    assert backends and set(backends) == {"pread"}  # read, not memory-mapped
    from transformers import AutoModel

    ref = AutoModel.from_pretrained(str(folder), dtype=getattr(torch, dtype))  # transformers' memory-mapped read
    got = enc.model.state_dict()
    assert set(got) == set(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert got[k].dtype == getattr(torch, dtype) and torch.equal(got[k], v), k


def test_a_damaged_shard_read_by_tensor_is_one_model_error(tmp_path, tokenizer):
    from memlab.errors import ModelError
    from memlab.probes.encoders.sources import load_encoder

    folder = tmp_path / "m"
    _bench().save_random_llama(folder, tokenizer, TINY, dtype="float32", shard_mb=0)
    shard = sorted(folder.glob("*.safetensors"))[3]
    shard.write_bytes(shard.read_bytes()[:40])  # truncated
    with pytest.raises(ModelError, match="cannot be read"):
        load_encoder(str(folder), dtype="float32", device="cpu")


def test_load_memory_benchmark_harness(tmp_path, tokenizer):
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    rows = _bench().main(["--work", str(tmp_path / "w"), "--layers", "1", "--hidden-size", "32", "--intermediate-size",
                          "64", "--heads", "4", "--shard-mb", "0", "--tokenizer", str(tok_dir),
                          "--dtypes", "bfloat16"])
    folder = next((tmp_path / "w").iterdir())
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == len(list(folder.glob("*.safetensors"))) > 3
    (row,) = rows
    assert row["dtype"] == "bfloat16" and row["param_dtypes"] == ["bfloat16"]
    assert 0 < 2 * row["params"] <= row["weight_bytes"] <= 2 * row["params"] + 1024  # 2 bytes each, + rotary buffer
    assert row["peak_rss_mb"] >= row["baseline_rss_mb"] > 0
    assert row["peak_over_weights"] == pytest.approx(row["peak_rss_bytes"] / row["weight_bytes"], rel=1e-3)
