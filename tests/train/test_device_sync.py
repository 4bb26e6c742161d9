"""Nothing is read back from the device per micro-batch, and an evaluation computes each thing once."""

from __future__ import annotations

import pytest
import torch
from toy_spaces import SENTENCES, document_batch, random_space

from memlab.registry import FAMILIES

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.xdist_group("processes")]

DOCS = [SENTENCES[:3] + ["End of sequence."], SENTENCES[3:8] + ["End of sequence."]]


def _tiny_memory():
    from memlab.models.memory import MemoryConfig, MemoryModel

    torch.manual_seed(0)
    return MemoryModel(MemoryConfig(vocab_size=60, chunk_len=6, encoder_hidden_size=32, hidden_size=32,
                                    encoder_intermediate_size=64, intermediate_size=64, encoder_heads=2,
                                    num_attention_heads=2, max_chunks=4, pad_token_id=0, bos_token_id=1,
                                    eos_token_id=2, blank_token_id=4))


def _memory_batch(n: int = 4, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (n, 3, 6), generator=g)  # (B, C, T)
    mask = torch.ones_like(ids)
    mask[0, 2, 4:] = 0  # a padded chunk
    return {"input_ids": ids, "attention_mask": mask}


def _sentence_loss(kind: str):
    from memlab.models.sentence.spaces import SpaceHandle

    torch.manual_seed(0)
    handle = SpaceHandle(random_space(), "toy_ae")
    batch = document_batch(handle, DOCS)
    if kind == "sonar_llm":
        from memlab.models.sonar_llm.training import SonarLLMLoss

        return FAMILIES.get("sonar_llm").make_model("toy", embed_dim=32), SonarLLMLoss(handle), batch
    from memlab.models.lcm.recipe import LCMLoss

    model = FAMILIES.get(kind).make_model("toy", embed_dim=32)
    model.backbone.normalizer.fit(batch["embeddings"][batch["sentence_mask"].bool()])
    return model, LCMLoss(handle, diffusion=kind == "lcm_diffusion"), batch


def _family_step(kind: str):
    """``(model, loss_fn, batch)`` of a toy setup of each family."""
    if kind == "token_lm":
        from memlab.models.token_lm.recipe import causal_lm_step

        torch.manual_seed(0)
        return FAMILIES.get("token_lm").make_model("toy", vocab_size=100), causal_lm_step, {
            "input_ids": torch.randint(0, 100, (4, 16))}
    if kind.startswith("memory:"):
        from memlab.curricula import PhaseSchedule

        return _tiny_memory(), PhaseSchedule([{"objective": kind.split(":")[1]}]), _memory_batch()
    return _sentence_loss(kind)


@pytest.mark.parametrize("kind", ["token_lm", "memory:blank_copy", "memory:combined", "memory:next_token",
                                  "sonar_llm", "lcm_mse", "lcm_diffusion"])
def test_a_training_step_reads_nothing_back_from_the_device(kind, host_reads):
    from memlab.train.metrics_log import MetricWindow

    model, loss_fn, batch = _family_step(kind)
    model.train()
    loss_fn(model, batch)  # first call: one-time set-up (moving a space, caches) may read
    host_reads["n"] = 0
    out = loss_fn(model, batch)
    out.loss.backward()
    window = MetricWindow(type("Acc", (), {"device": torch.device("cpu"), "num_processes": 1})())
    window.add(out, 0)
    assert host_reads["n"] == 0, f"{kind}: {host_reads['n']} reads of a device value in one micro-batch"
    # the weight is the batch's target count, as before (not a constant): the window's mean is weighted by it
    assert torch.is_tensor(out.weight) or kind == "token_lm"
    assert float(out.weight) > 1


def test_evaluate_objectives_reads_once(host_reads):
    from memlab.curricula import evaluate_objectives

    model = _tiny_memory().eval()
    batches = [_memory_batch(seed=s) for s in range(3)]
    host_reads["n"] = 0
    got = evaluate_objectives(model, batches)
    assert host_reads["n"] == 1  # one transfer for all sums, not one per batch and objective
    one = [evaluate_objectives(model, [b]) for b in batches]
    assert set(got) == {f"{o}_{m}" for o in ("blank_copy", "copy", "next_token") for m in ("loss", "accuracy")}
    # every batch has the same padding, so the same target count: the weighted mean is the mean of batch means
    for k in got:
        assert got[k] == pytest.approx(sum(o[k] for o in one) / 3, rel=1e-6)


# ----------------------------------------------------------------------------- one evaluation pass


def _trainer(tmp_path, phases: list[dict], evals=("blank_copy", "copy", "next_token")):
    from memlab.config import TrainConfig
    from memlab.curricula import PhaseSchedule
    from memlab.curricula.objectives import ObjectiveEvaluation
    from memlab.models.memory.data import CachedDataset
    from memlab.train.loop import Trainer
    from memlab.train.setup import TrainSetup

    model = _tiny_memory()
    data = _memory_batch(n=24, seed=1)
    ds = CachedDataset(data["input_ids"], data["attention_mask"])
    schedule = PhaseSchedule(phases)
    setup = TrainSetup(model=model, train_data=ds, eval_data=ds, loss_fn=schedule, callbacks=[schedule],
                       eval_step_fn=ObjectiveEvaluation(lambda: schedule.objective, evals))
    cfg = TrainConfig(max_steps=2, batch_size=4, eval_batches=3, cpu=True, warmup_steps=0)
    return Trainer(setup, cfg, tmp_path), schedule, list(evals)


def _old_evaluation(trainer, schedule, evals) -> dict[str, float]:
    """What evaluation logged before: the loss function's weighted means, then evaluate_objectives on the batches."""
    from memlab.curricula import evaluate_objectives

    model = trainer.setup.model.eval()
    batches = list(trainer.eval_batches())
    sums: dict[str, float] = {}
    weight = 0.0
    with torch.no_grad():
        for b in batches:
            out = schedule(model, b)
            w = float(out.weight)
            for k, v in {"loss": out.loss, **out.metrics}.items():
                sums[k] = sums.get(k, 0.0) + float(v) * w
            weight += w
        ref = {k: v / weight for k, v in sums.items()}
        ref.update(evaluate_objectives(model, batches, evals))
    return ref


@pytest.mark.parametrize("phase, encodes, decodes", [
    ({"objective": "blank_copy"}, 1, 3),  # blank copy's loss is its eval entry: 3 decoder passes, not 4
    ({"objective": "combined"}, 1, 3),  # next token and blank copy come from the loss: 3, not 5
    ({"objective": "causal_lm"}, 1, 4),  # the loss reads no memory; the three eval objectives share one encoding
    ({"objective": "copy", "options": {"length": 3}}, 2, 4),  # a cut loss encodes its own cut chunks
])
def test_evaluation_encodes_each_batch_once_and_logs_what_it_did(tmp_path, phase, encodes, decodes):
    trainer, schedule, evals = _trainer(tmp_path, [phase])
    model = trainer.setup.model
    ref = _old_evaluation(trainer, schedule, evals)
    calls = {"encode": 0, "decode": 0}
    for name, key in (("encode_chunks", "encode"), ("decode_features", "decode"), ("decode", "decode")):
        real = getattr(model, name)

        def counted(*a, _real=real, _key=key, **k):
            calls[_key] += 1
            return _real(*a, **k)

        setattr(model, name, counted)
    got = trainer.evaluate()
    n_batches = len(list(trainer.eval_batches()))
    assert n_batches == 3
    assert calls == {"encode": encodes * n_batches, "decode": decodes * n_batches}
    assert set(got) == set(ref)
    for k in ref:
        assert got[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), k
    assert model.training  # evaluation hands the model back in training mode


def test_a_curriculum_switches_on_the_shared_evaluation(tmp_path):
    trainer, schedule, _ = _trainer(tmp_path, [
        {"objective": "blank_copy", "metric": "blank_copy_accuracy", "threshold": 0.0}, {"objective": "next_token"}])
    (tmp_path / "metrics.jsonl").parent.mkdir(exist_ok=True)
    trainer.save = lambda: None
    trainer.train()
    assert schedule.index == 1 and schedule.switches[0]["phase_end_reason"].startswith("blank_copy_accuracy=")


def test_an_eval_step_without_a_loss_group_is_one_clear_error(tmp_path):
    from memlab.errors import MemlabError

    trainer, _, _ = _trainer(tmp_path, [{"objective": "blank_copy"}])
    step = trainer.setup.eval_step_fn
    trainer.setup.eval_step_fn = lambda m, b: {k: v for k, v in step(m, b).items() if k != "loss"}
    with pytest.raises(MemlabError, match="no 'loss' group"):
        trainer.evaluate()
