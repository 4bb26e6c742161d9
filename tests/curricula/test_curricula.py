"""Objectives (batch transforms + losses) and curricula (phase schedules): transforms, the combined
loss, switching by steps / threshold / plateau, logging per phase and resume in the middle of a phase."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import write_config
from memlab.config import load_config
from memlab.curricula import PhaseSchedule, make_objective
from memlab.curricula.objectives import blank_targets, shifted_targets
from memlab.errors import MemlabError
from memlab.models.memory import MemoryConfig, MemoryModel
from memlab.registry import CURRICULA, OBJECTIVES
from memlab.train.experiment import run_experiment


def _tiny() -> MemoryModel:
    torch.manual_seed(0)
    return MemoryModel(MemoryConfig(vocab_size=50, chunk_len=6, encoder_hidden_size=32, hidden_size=32,
                                    encoder_intermediate_size=64, intermediate_size=64, encoder_heads=2,
                                    num_attention_heads=2, max_chunks=4, pad_token_id=0, bos_token_id=1,
                                    eos_token_id=2, blank_token_id=4))


def test_registries():
    assert {"next_token", "copy", "blank_copy", "combined", "causal_lm"} <= set(OBJECTIVES.names())
    assert {"phases", "blank_copy_then_next_token"} <= set(CURRICULA.names())


def test_transforms_chunks_and_padded_sentences():
    m = _tiny()
    ids = torch.tensor([[[7, 8, 9, 10, 11, 12]]])
    dec, lab = shifted_targets(m, ids, None)
    assert dec.tolist() == [[[1, 7, 8, 9, 10, 11]]] and torch.equal(lab, ids)
    bdec, blab = blank_targets(m, ids, None)
    assert (bdec == 4).all() and torch.equal(blab, ids)  # nothing of the chunk leaks into the inputs
    mask = torch.tensor([[[1, 1, 1, 0, 0, 0]]])
    dec, lab = shifted_targets(m, ids, mask)
    assert dec.tolist() == [[[1, 7, 8, 9, 0, 0, 0]]]
    assert lab.tolist() == [[[7, 8, 9, 2, -100, -100, -100]]]  # tokens, then the end token


def test_objectives_losses_and_combined():
    m = _tiny()
    batch = {"input_ids": torch.randint(5, 50, (3, 4, 6))}
    outs = {n: make_objective(n)(m, batch) for n in ("next_token", "copy", "blank_copy", "causal_lm")}
    for name, out in outs.items():
        assert out.loss.dim() == 0 and torch.isfinite(out.loss) and out.weight == 3 * 4 * 6
        assert 0 <= float(out.metrics["token_accuracy"]) <= 1
    comb = make_objective("combined", weight=0.5, copy="blank_copy")(m, batch)
    expect = outs["next_token"].loss + 0.5 * outs["blank_copy"].loss
    assert torch.allclose(comb.loss, expect, atol=1e-5)
    assert torch.allclose(comb.metrics["blank_copy_loss"], outs["blank_copy"].loss)
    # copy_length: next token on whole chunks, the copy term on the first tokens from their own memories
    short = make_objective("combined", weight=0.5, copy="blank_copy", copy_length=3)(m, batch)
    copy3 = make_objective("blank_copy", length=3)(m, batch)
    assert torch.allclose(short.loss, outs["next_token"].loss + 0.5 * copy3.loss, atol=1e-5)
    assert short.weight == comb.weight and not torch.allclose(copy3.loss, outs["blank_copy"].loss)
    for bad in (0, 2.5, True):
        with pytest.raises(MemlabError, match="copy_length"):
            make_objective("combined", copy_length=bad)
    with pytest.raises(MemlabError, match="cached"):
        make_objective("combined", copy_length=3)(m, {**batch, "memories": m.encode_chunks(batch["input_ids"]).detach()})
    # cached memories are used instead of the encoder when the batch carries them
    mem = m.encode_chunks(batch["input_ids"]).detach()
    cached = make_objective("copy")(m, {**batch, "memories": mem + 1.0})
    assert not torch.allclose(cached.loss, outs["copy"].loss)
    with pytest.raises(MemlabError, match="unknown objective"):
        make_objective("telepathy")


def test_blank_copy_mix_trains_the_decoder_on_memory_mixtures():
    import torch.nn.functional as F

    m = _tiny()
    batch = {"input_ids": torch.randint(5, 50, (2, 3, 6))}
    plain, mixed = make_objective("blank_copy"), make_objective("blank_copy", mix=1.0)
    m.eval()  # evaluation never mixes
    assert torch.allclose(mixed(m, batch).loss, plain(m, batch).loss)
    m.train()  # no dropout and no memory noise in _tiny: training-mode differences come from the mix alone
    same = {"input_ids": batch["input_ids"][:1, :1].expand(2, 3, 6)}  # mixtures of one chunk are that chunk
    assert torch.allclose(mixed(m, same).loss, plain(m, same).loss, atol=1e-5)
    from memlab.randomness import SEED_KEY, example_seeds

    seeds = example_seeds(0, 5, torch.arange(2))
    got = mixed(m, {**batch, SEED_KEY: seeds})
    n = 6
    idx, w = mixed.mixture(n, "cpu", seeds)  # the draws the loss made: per example, from its seed
    partner, a = idx[:, 1], w[:, 0]
    assert (partner != torch.arange(n)).all()  # a partner is another chunk of the batch
    assert torch.equal(mixed.mixture(3, "cpu", seeds[1:])[1], w[3:])  # example 1 alone draws its own weights again
    assert torch.allclose(mixed(m, {**batch, SEED_KEY: seeds}).loss, got.loss)
    mem = m.encode_chunks(batch["input_ids"]).flatten(0, 1)  # (6, K, M)
    mix = a[:, None, None] * mem + (1 - a[:, None, None]) * mem[partner]
    dec, lab = blank_targets(m, batch["input_ids"], None)
    logits = m.decode(mix.view(2, 3, *mix.shape[1:]), dec).flatten(0, 1)  # (6, L, V)
    ce = lambda y: F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # noqa: E731  (6, L)
    lab = lab.flatten(0, 1)
    expect = (a[:, None] * ce(lab) + (1 - a[:, None]) * ce(lab[partner])).sum() / lab.numel()
    assert torch.allclose(got.loss, expect, atol=1e-5)
    four = make_objective("blank_copy", mix=0.5, mix_parts=4)
    idx, w = four.mixture(1000, "cpu")
    assert idx.shape == w.shape == (1000, 4) and torch.equal(idx[:, 0], torch.arange(1000))
    assert torch.allclose(w.sum(1), torch.ones(1000)) and 0.4 < (w[:, 0] == 1).float().mean() < 0.6
    assert torch.isfinite(four(m, batch).loss)
    got.loss.backward()
    assert m.encoder.embed.weight.grad.abs().sum() > 0  # the mixture is differentiable to the encoder
    with pytest.raises(MemlabError, match="mix"):
        make_objective("blank_copy", mix=1.5)
    with pytest.raises(MemlabError, match="mix_parts"):
        make_objective("blank_copy", mix=0.5, mix_parts=1)
    # copy: the mixture is in the memory only; the target stays the chunk's own tokens
    copy = make_objective("copy", mix=1.0)
    got = copy(m, {**batch, SEED_KEY: seeds})
    idx, w = copy.mixture(n, "cpu", seeds)
    partner, a = idx[:, 1], w[:, 0]
    mix = a[:, None, None] * mem + (1 - a[:, None, None]) * mem[partner]
    dec, lab = shifted_targets(m, batch["input_ids"], None)
    logits = m.decode(mix.view(2, 3, *mix.shape[1:]), dec)
    assert torch.allclose(got.loss, F.cross_entropy(logits.flatten(0, -2), lab.flatten()), atol=1e-5)


def test_chunk_length_option():
    m = _tiny()
    batch = {"input_ids": torch.randint(5, 50, (2, 3, 6))}
    full = make_objective("blank_copy")(m, batch)
    short = make_objective("blank_copy", length=2)(m, batch)
    assert full.weight == 2 * 3 * 6 and short.weight == 2 * 3 * 2  # only the first 2 tokens are targets
    mem = m.encode_chunks(batch["input_ids"]).detach()
    with pytest.raises(MemlabError, match="length"):
        make_objective("blank_copy", length=2)(m, {**batch, "memories": mem})
    with pytest.raises(MemlabError, match="does not take"):
        make_objective("copy", weight=2.0)


def test_schedule_switches_and_state():
    s = PhaseSchedule([{"objective": "blank_copy", "steps": 3},
                       {"objective": "copy", "metric": "copy_accuracy", "threshold": 0.8},
                       {"objective": "combined", "metric": "next_token_loss", "mode": "min", "patience": 2,
                        "options": {"weight": 0.25}},
                       {"objective": "next_token"}])
    for step in range(4):
        s.on_step_start(step)
    assert s.index == 1 and s.start == 3 and s.log_fields()["objective"] == "copy"
    assert s.on_eval(5, {"copy_accuracy": 0.5}) == {}
    rec = s.on_eval(6, {"copy_accuracy": 0.85})
    assert s.index == 2 and rec["phase_end"] == 1 and s.objective.weight == 0.25
    state = json.loads(json.dumps(s.state_dict()))  # checkpointed as JSON
    s.on_eval(7, {"next_token_loss": 3.0})
    s.on_eval(8, {"next_token_loss": 3.1})
    assert s.index == 2
    s.on_eval(9, {"next_token_loss": 3.05})
    assert s.index == 3 and "plateau" in s.switches[-1]["phase_end_reason"]
    fresh = PhaseSchedule(s.phases)
    fresh.load_state_dict(state)
    assert fresh.index == 2 and fresh.start == 6
    with pytest.raises(MemlabError, match="unknown objective 'telepathy'"):
        PhaseSchedule([{"objective": "telepathy"}])
    with pytest.raises(MemlabError, match="metric"):
        PhaseSchedule([{"objective": "copy", "threshold": 0.5}, {"objective": "next_token"}])


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_curriculum_run_logs_phases_and_resumes_mid_phase(small_corpus, tmp_path):
    phases = [{"objective": "blank_copy", "steps": 8}, {"objective": "next_token"}]
    cfg = write_config(tmp_path / "c.yaml", small_corpus, recipe="memory",
                       model={"family": "memory", "preset": "toy", "overrides": {"chunk_len": 8}},
                       data={"vocab_size": 300, "seq_len": 16},
                       train={"max_steps": 12, "batch_size": 4, "eval_every": 4, "save_every": 6, "keep_checkpoints": 5,
                              "log_every": 1, "eval_batches": 1},
                       options={"curriculum": "phases", "phases": phases, "eval_objectives": ["blank_copy"]})
    run = tmp_path / "run"
    run_experiment(load_config(cfg), run)
    recs = [r for r in _records(run) if r["split"] == "train"]
    assert [r["objective"] for r in recs] == ["blank_copy"] * 8 + ["next_token"] * 4
    assert "next_token_loss" in recs[-1] and "blank_copy_loss" in recs[0]
    # resume from the checkpoint at step 6 (inside phase 0): the switch happens at step 8 again, same losses
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000012")
    (resumed / "summary.json").unlink()
    run_experiment(load_config(resumed / "config.yaml"), resumed, resume=True)
    again = [r for r in _records(resumed) if r["split"] == "train"]
    assert [r["objective"] for r in again] == [r["objective"] for r in recs]
    assert [round(r["loss"], 4) for r in again] == [round(r["loss"], 4) for r in recs]


def test_shipped_curriculum_configs_load():
    root = Path(__file__).resolve().parents[2] / "configs" / "memory"
    found = [p for p in root.glob("*.yaml") if "curriculum" in p.name]
    assert found
    for p in found:
        cfg = load_config(p)
        assert cfg.options.curriculum in CURRICULA.names()


def test_flops_and_mfu_follow_the_curriculum_phase(small_corpus, tmp_path):
    """A combined phase runs the decoder twice: the loop's FLOPs per example (and so MFU) change at the switch."""
    from memlab.loading import load_pretrained
    from memlab.models.memory.recipe import memory_flops

    phases = [{"objective": "blank_copy", "steps": 3}, {"objective": "combined", "options": {"weight": 0.5}}]
    cfg = write_config(tmp_path / "c.yaml", small_corpus, recipe="memory",
                       model={"family": "memory", "preset": "toy", "overrides": {"chunk_len": 8}},
                       data={"vocab_size": 300, "seq_len": 16},
                       train={"max_steps": 6, "batch_size": 4, "eval_every": 6, "save_every": 6, "log_every": 1,
                              "eval_batches": 1},
                       options={"curriculum": "phases", "phases": phases, "eval_objectives": ["blank_copy"]})
    run = tmp_path / "run"
    summary = run_experiment(load_config(cfg), run)
    recs = [r for r in _records(run) if r["split"] == "train"]
    assert [r["objective"] for r in recs] == ["blank_copy"] * 3 + ["combined"] * 3
    model = load_pretrained(run)
    k = model.config.num_memories
    expect = {1: memory_flops(model, 1, k, 8, 2, True), 2: memory_flops(model, 2, k, 8, 2, True)}
    assert expect[1] < expect[2] < 2 * expect[1]  # the encoder pass is not repeated
    for r in recs:
        assert r["flops_per_example"] == pytest.approx(expect[2 if r["objective"] == "combined" else 1], rel=1e-9)
        # MFU is the window's FLOPs over its time and the measured matmul rate
        assert r["mfu"] * summary["matmul_flops_per_s"] == pytest.approx(r["flops_per_example"] * r["examples_per_s"],
                                                                          rel=1e-6)
    assert summary["mfu"] > 0
