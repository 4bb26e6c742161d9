"""White-box inversion (memlab invert): exact recovery from per-position states on tiny random causal models of each
architecture family, the cached truncated pass against the full model, the certificate under wrong weights, and the
command's bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModel

from memlab.errors import ModelError
from memlab.probes.invert.options import PositionsOptions
from memlab.probes.invert.positions.searcher import Searcher
from memlab.probes.invert.positions.run import check_applies
from memlab.probes.invert.layer import LayerReader

V = 211
DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4)
GQA = dict(DECODER, num_key_value_heads=2)
FAMILIES = {  # model_type -> tiny config (3 blocks, width 32)
    "llama": GQA, "mistral": GQA, "qwen2": GQA, "qwen3": dict(GQA, head_dim=8), "gemma": dict(GQA, head_dim=8),
    "gemma2": dict(GQA, head_dim=8), "phi3": dict(GQA, pad_token_id=0), "stablelm": GQA, "olmo2": GQA,
    "starcoder2": GQA, "phi": DECODER, "gpt_neox": DECODER,
    "gpt2": dict(n_embd=32, n_layer=3, n_head=4), "gpt_bigcode": dict(n_embd=32, n_layer=3, n_head=4),
    "gptj": dict(n_embd=32, n_layer=3, n_head=4, rotary_dim=4),
    "opt": dict(hidden_size=32, ffn_dim=64, num_hidden_layers=3, num_attention_heads=4, word_embed_proj_dim=32),
    "falcon": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4),
    "bloom": dict(hidden_size=32, n_layer=3, n_head=4),
    "gpt_neo": dict(hidden_size=32, num_layers=3, num_heads=4, attention_types=[[["global", "local", "global"], 1]]),
}
FAST = PositionsOptions(batch_size=32, budget=96, exhaustive_batch=V, accept_gap=float("inf"))


def tiny(model_type: str, seed: int = 0):
    try:
        cfg = AutoConfig.for_model(model_type, vocab_size=V, **FAMILIES.get(model_type, DECODER))
    except (KeyError, ValueError) as e:  # a family this transformers does not have
        pytest.skip(f"{model_type}: {e}")
    torch.manual_seed(seed)
    return AutoModel.from_config(cfg).eval()


def invert(reader: LayerReader, seqs: torch.Tensor, states: torch.Tensor, prefix: list[int] = ()):
    """Each sequence ``(n, T)`` recovered from its states ``(n, T, D)``: the searcher's positions per sequence."""
    s = Searcher(reader, FAST)
    firsts = s.first_positions(list(prefix), states[:, 0])
    return [s.chunk(states[i], list(prefix), seqs[i].tolist(), first=firsts[i]) for i in range(len(seqs))]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_exact_inversion_and_cached_states(family):
    model = tiny(family)
    layer = 2  # below the last block: hidden_states[2] is the raw output of block 1
    reader = LayerReader(model, layer)
    seqs = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(1))  # (1, 5)
    with torch.no_grad():
        ref = model(input_ids=seqs, output_hidden_states=True).hidden_states[layer]  # (1, 5, D)
    states = reader.full_states(seqs)  # (1, 5, D)
    torch.testing.assert_close(states, ref, rtol=1e-5, atol=1e-5)
    prefix = reader.start(seqs[0, :3].tolist())  # the cached pass through the first `layer` blocks only
    cached = torch.stack([reader.extend(prefix, int(t)) for t in seqs[0, 3:]])  # (3, D)
    torch.testing.assert_close(cached, ref[0, 3:], rtol=1e-4, atol=1e-5)
    check_applies(reader, seqs[0].tolist(), family)
    for seq, got in zip(seqs, invert(reader, seqs, states)):
        assert [p.token for p in got] == seq.tolist()
        assert all(p.certificate == "match" for p in got)
        assert all(p.gap >= FAST.min_gap and p.distance <= FAST.tol for p in got)
        assert all(p.runner_up > 0.01 for p in got)  # the runner-up is a wrong token, far away


def test_prefix_and_deepest_layer():
    """A fixed prefix (a BOS token) and the last block's output (before the final norm)."""
    model = tiny("llama")
    reader = LayerReader(model, -1)
    assert reader.layer == 3
    seqs = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(2))
    full = torch.cat([torch.zeros(2, 1, dtype=torch.long), seqs], 1)  # token 0 as BOS
    states = reader.full_states(full)[:, 1:]  # (2, 5, D)
    for seq, got in zip(seqs, invert(reader, seqs, states, prefix=[0])):
        assert [p.token for p in got] == seq.tolist()


def test_ranking_alone_without_exhaustive_fallback():
    """The gradient ranking finds the true token within the ranked budget (no exhaustive pass needed)."""
    reader = LayerReader(tiny("qwen2"), 2)
    seqs = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(3))
    got = Searcher(reader, PositionsOptions(batch_size=16, budget=96, exhaustive=False)).chunk(
        reader.full_states(seqs)[0], [], seqs[0].tolist())
    assert sum(p.token == t for p, t in zip(got[1:], seqs[0, 1:].tolist())) >= 6
    assert all(p.true_rank is not None for p in got)


def test_wrong_weights_give_no_certificate():
    """States made by one model, searched with another of the same shape: nothing matches, and the gap says so."""
    seqs = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(4))
    states = LayerReader(tiny("llama", seed=0), 2).full_states(seqs)
    wrong = LayerReader(tiny("llama", seed=7), 2)
    got = [p for chunk in invert(wrong, seqs, states) for p in chunk]
    assert not any(p.certificate == "match" for p in got)
    assert sum(p.certificate == "none" for p in got) >= len(got) // 2
    assert min(p.distance for p in got) > 0.05


def test_noisy_states_nearest_certificate():
    """Small noise on the states: no exact match within the tolerance, but the exhaustive search still finds the
    token, certified as the unique nearest one."""
    model = tiny("llama")
    reader = LayerReader(model, 2)
    seqs = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(5))
    states = reader.full_states(seqs)
    noisy = states + 0.01 * states.norm(dim=-1, keepdim=True) * torch.randn(states.shape) / states.shape[-1] ** 0.5
    got = invert(reader, seqs, noisy)[0]
    assert [p.token for p in got] == seqs[0].tolist()
    assert all(p.certificate == "nearest" and p.exhaustive for p in got)


def test_bidirectional_model_is_refused():
    cfg = AutoConfig.for_model("bert", vocab_size=V, **DECODER)
    reader = LayerReader(AutoModel.from_config(cfg).eval(), 2)
    with pytest.raises(ModelError, match="causal"):
        check_applies(reader, [5, 6, 7, 8], "tiny-bert")


def _cli(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv, says", [
    (["--model", "memlab-lm"], "--layer"),
    (["--model", "memlab-lm", "--layer", "x"], "--layer takes an integer"),
    (["--model", "memlab-lm", "--layer", "2", "--n", "0"], "--n must be >= 1"),
    (["--model", "memlab-lm", "--layer", "2", "--tol", "nan"], "--tol takes a finite number"),
    (["--model", "memlab-lm", "--layer", "2", "--noise", "inf"], "--noise takes a finite number"),
    (["--model", "memlab-lm", "--layer", "2", "--seed", "-1"], "--seed must be >= 0"),
    (["--model", "memlab-lm", "--layer", "2", "--forwards", "8"],
     "--forwards applies to --states last, mean, first, second_last, logits or space"),
    (["--model", "memlab-lm", "--layer", "2", "--states", "mean", "--budget", "8"], "--budget applies to --states positions"),
    (["--model", "memlab-lm", "--layer", "2", "--states", "pooled"],
     "--states takes positions, last, mean, first, second_last, logits or space"),
    (["--model", "memlab-lm", "--layer", "2", "--chunk-by", "lines"], "--chunk-by"),
    (["--model", "memlab-lm", "--layer", "99"], "out of range"),
    (["--model", "/nonexistent/model/dir", "--layer", "1"], "does not exist"),
    (["--model", "memlab-lm", "--layer", "1", "--device", "gpu0"], "not a device"),
    (["--model", "memlab-lm", "--layer", "1", "--cache-dir", __file__], "is a file"),
])
def test_cli_bad_input_one_line(argv, says, capsys, tmp_path):
    out = tmp_path / "run"
    code, cap = _cli(*argv, "--out", str(out), capsys=capsys)
    assert code == 2
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memlab: error:") and says in lines[0], cap.err
    assert not out.exists()


def test_cli_inverts_memlab_lm(capsys, tmp_path):
    out = tmp_path / "run"
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--seq-len", "4", "--n", "2", "--threads", "1",
                     "--cache-dir", str(tmp_path / "cache"), "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    assert rep["totals"]["exact_match"]["value"] == 1.0
    assert rep["certificates"]["none"] == 0 and rep["worst_gap"] >= 2
    assert len(rep["chunks"]) == 2 and rep["chunks"][0]["recovered_ids"] == rep["chunks"][0]["true_ids"]
    assert "exact match: 1.000" in cap.out
    again = tmp_path / "again"  # the kept first-position table is read back, with the same result
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--seq-len", "4", "--n", "2", "--threads", "1",
                     "--cache-dir", str(tmp_path / "cache"), "--out", str(again), capsys=capsys)
    rep2 = json.loads((again / "report.json").read_text())
    assert code == 0 and "kept table" in rep2["search"]["first_position"]
    assert [c["recovered_ids"] for c in rep2["chunks"]] == [c["recovered_ids"] for c in rep["chunks"]]
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--out", str(out), capsys=capsys)
    assert code == 2 and (out / "report.json").is_file()  # a used folder is refused and kept


def test_command_module_imports_nothing_heavy():
    code = ("import sys, memlab.app.commands.invert as m; "
            "print(sorted(x for x in ('torch', 'numpy', 'transformers') if x in sys.modules))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "[]"


def test_noisy_states_separated_without_exhaustive_search():
    """Noise above the tolerance: the best ranked candidate is accepted early when every other verified one is far
    (certificate ``separated``), and the exhaustive search is skipped."""
    reader = LayerReader(tiny("llama"), 2)
    seqs = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(6))
    states = reader.full_states(seqs)
    noisy = states + 0.01 * states.norm(dim=-1, keepdim=True) * torch.randn(states.shape) / states.shape[-1] ** 0.5
    s = Searcher(reader, PositionsOptions(batch_size=32, budget=96, exhaustive_batch=V, accept_gap=5.0))
    got = s.chunk(noisy[0], [], first=s.first_positions([], noisy[:, 0])[0])
    assert [p.token for p in got] == seqs[0].tolist()
    assert all(p.certificate == "separated" and not p.exhaustive for p in got[1:])


def test_cli_refuses_a_bidirectional_encoder(capsys, tmp_path):
    from memlab import assets

    if not assets.is_installed("minilm"):
        pytest.skip("the minilm asset is not installed")
    code, cap = _cli("--model", "minilm", "--layer", "3", "--n", "1", "--seq-len", "4", "--out", str(tmp_path / "r"),
                     capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "causal" in lines[0] and "memlab probe" in lines[0]
    assert not (tmp_path / "r").exists()


def test_exhaustive_fallback_stops_at_a_match():
    """A ranked budget of one candidate: the fallback goes on down the ranking and stops at the match."""
    reader = LayerReader(tiny("gpt_neox"), 2)
    seqs = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(8))
    s = Searcher(reader, PositionsOptions(batch_size=1, budget=1, exhaustive_batch=8))
    got = s.chunk(reader.full_states(seqs)[0], [], seqs[0].tolist())
    assert [p.token for p in got] == seqs[0].tolist() and all(p.certificate == "match" for p in got)
    fell_back = [p for p in got if p.exhaustive]
    assert fell_back and all(p.tried < V for p in fell_back)


def test_cli_names_the_positions_without_a_certificate(capsys, tmp_path):
    """Noise as large as the states: the summary names every position that had no certificate."""
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--seq-len", "3", "--n", "1", "--noise", "1",
                     "--threads", "1", "--out", str(tmp_path / "r"), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    none = rep["certificates"]["none"]
    assert none > 0 and f"no certificate: {none} positions" in cap.out and "chunk 0 position" in cap.out
    assert rep["noise"] == 1.0
