"""Every family on several processes (gloo on the CPU): 2 processes give the 1-process loss curve at the same
global batch, a killed 2-process run resumes exactly, a sentence cache is encoded once across processes, and
bad launches or a failure on one process end every process with one clear line.

Each run is tiny (a few steps of a shipped toy config) and shared by the assertions of its family
(module-scoped fixtures): the 1-process reference runs in this process, the 2-process ones under
``accelerate launch``. A "killed" run is the 2-process run's directory as a kill right after a checkpoint
leaves it (later checkpoints, the summary and the plots gone, later metrics records still there); resuming
it must rebuild the uninterrupted run's final weights bit for bit. The default suite runs one case of each
behaviour (the token LM's are in tests/train/test_train.py); the extra cases (memory resume, frozen encoder with the
combined objective, SONAR-LLM with a trained decoder, LCM-MSE beside LCM diffusion) are marked ``slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import kill_after
from memlab.app.cli import main

# launches processes on a port of its own, so that one xdist worker runs this module while another runs the
# other modules that launch processes (on accelerate's default port)
pytestmark = pytest.mark.xdist_group("processes-own-port")
PORT = "29517"

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
REL = 2e-4
SHORT = ["train.eval_every=2", "train.log_every=1", "train.eval_batches=1", "train.progress=false"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "tests") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launch2(*args: str, script: list[str] | None = None) -> subprocess.CompletedProcess:
    target = script if script is not None else ["-m", "memlab.app.cli"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
           "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", PORT, *target, *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stderr[-3000:]


def _records(run: Path, split: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    last = sorted((run / "checkpoints").glob("step-*"))[-1]
    return load_file(str(last / "model.safetensors"))


COMPARED = ("loss", "next_sentence_ce", "blank_copy_loss", "copy_loss", "next_token_loss", "blank_copy_accuracy",
            "next_token_accuracy")


def assert_same_curves(one: Path, two: Path, steps: int) -> None:
    """Train and eval records of the 1- and 2-process runs: the same steps, phases and losses (rel 2e-4). Under bf16
    autocast (a CPU or GPU that multiplies bf16 natively) a batch split over two processes rounds its logits
    otherwise, so an argmax within rounding of a tie may flip: accuracies then agree to two tokens in 512."""
    summary = json.loads((two / "summary.json").read_text())
    assert summary["processes"] == 2
    acc_abs = 2 / 512 if summary.get("mixed_precision") == "bf16" else 0.0
    for split in ("train", "eval"):
        a, b = _records(one, split), _records(two, split)
        assert [r["step"] for r in a] == [r["step"] for r in b] and a, split
        for x, y in zip(a, b):
            assert x.get("phase") == y.get("phase") and x.get("objective") == y.get("objective")
            for k in COMPARED:
                if k in x:
                    tol = dict(abs=acc_abs, rel=REL) if k.endswith("accuracy") else dict(rel=REL)
                    assert y[k] == pytest.approx(x[k], **tol), (split, x["step"], k)
    assert _records(one, "train")[-1]["step"] == steps


def assert_resumes_exactly(two: Path, step: int, tmp: Path) -> None:
    killed = kill_after(two, step, tmp / "killed")
    _ok(_launch2("train", "--resume", str(killed)))
    a, b = _weights(two), _weights(killed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [r["loss"] for r in _records(two, "train")] == [r["loss"] for r in _records(killed, "train")]


def _pair(tmp: Path, config: Path, *overrides: str, script: list[str] | None = None,
          two_only: tuple[str, ...] = ()) -> tuple[Path, Path]:
    one, two = tmp / "one", tmp / "two"
    assert main(["train", str(config), "--out", str(one), *SHORT, *overrides]) == 0
    _ok(_launch2("train", str(config), "--out", str(two), *SHORT, *overrides, *two_only, script=script))
    return one, two


# ---------------------------------------------------------------------------------------------- memory family
@pytest.fixture(scope="module")
def memory_curriculum(tmp_path_factory):
    """Blank copy, then next token from step 2 on (a phase switch), 5 steps, checkpoints at 3 and 5."""
    tmp = tmp_path_factory.mktemp("memory")
    one, two = _pair(tmp, CONFIGS / "memory/toy.yaml", "train.max_steps=5", "train.save_every=3",
                     "options.curriculum=blank_copy_then_next_token", "options.switch_max_steps=2")
    return tmp, one, two


def test_memory_curriculum_on_two_processes_matches_one_across_the_phase_switch(memory_curriculum):
    tmp, one, two = memory_curriculum
    assert_same_curves(one, two, 5)
    assert [r["objective"] for r in _records(two, "train")] == ["blank_copy"] * 2 + ["next_token"] * 3


@pytest.mark.slow  # another 2-process run or two: the default suite keeps one case per family
def test_memory_curriculum_two_process_resume_in_the_second_phase_is_exact(memory_curriculum):
    tmp, _, two = memory_curriculum
    assert_resumes_exactly(two, 3, tmp)


@pytest.mark.slow  # another 2-process run or two: the default suite keeps one case per family
def test_memory_combined_on_a_frozen_encoder_two_processes_match_one(memory_curriculum, tmp_path):
    encoder = memory_curriculum[1]  # the 1-process curriculum run: a trained encoder of the same shape
    one, two = _pair(tmp_path, CONFIGS / "memory/toy.yaml", "train.max_steps=4", "train.save_every=4",
                     "options.objective=combined", f"options.encoder_from={encoder}")
    assert_same_curves(one, two, 4)
    assert json.loads((two / "summary.json").read_text())["frozen_encoder"] is True
    src, got = _weights(encoder), _weights(two)
    assert all(torch.equal(src[k], got[k]) for k in got if k.startswith("encoder."))  # frozen: not trained


# ---------------------------------------------------------------------------------------------- sentence families
def test_sonar_llm_two_processes_match_one_and_encode_each_sentence_once(tmp_path):
    counts = tmp_path / "counts"
    counts.mkdir()
    one, two = _pair(tmp_path, CONFIGS / "sonar_llm/toy.yaml", "train.max_steps=4", "train.save_every=4",
                     two_only=(f"options.cache_dir={tmp_path / 'cache'}",),  # the 2-process run builds its own cache
                     script=[str(ROOT / "tests/dist_helper.py"), "count-encodes", str(counts), "--"])
    assert_same_curves(one, two, 4)
    for split in ("train", "validation"):
        shares, unique = [], set()
        for r in (0, 1):
            log = json.loads((counts / f"encodes-{r}.json").read_text())
            at = next(i for i, e in enumerate(log) if e.get("split") == split)
            unique.add(log[at]["unique"])
            nxt = next((i for i in range(at + 1, len(log)) if "split" in log[i]), len(log))
            shares.append([s for e in log[at + 1 : nxt] for s in e["encode"]])
        assert shares[0] and shares[1], "each process encodes a share"
        assert len(unique) == 1 and len(shares[0]) + len(shares[1]) == unique.pop(), "each sentence encoded once"
        assert not set(shares[0]) & set(shares[1])
    assert {p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()} == {"train", "validation"}  # saved once


@pytest.mark.slow  # another 2-process run or two: the default suite keeps one case per family
def test_sonar_llm_unfrozen_decoder_two_processes_match_one_and_resume_exactly(tmp_path):
    one, two = _pair(tmp_path, CONFIGS / "sonar_llm/toy.yaml", "train.max_steps=4", "train.save_every=2",
                     "options.unfreeze_decoder=true")
    assert_same_curves(one, two, 4)
    w = _weights(two)
    assert any(k.startswith("space.") for k in w)  # the trained decoder is saved beside the model
    assert_resumes_exactly(two, 2, tmp_path)


@pytest.mark.slow  # the LCM recipe on 2 processes: the diffusion case below covers it, with evaluation and resume
def test_lcm_mse_two_processes_match_one(tmp_path):
    """LCM-MSE on 2 processes. Its recipe and loss are the diffusion family's (``LCMLoss``), which
    ``test_lcm_diffusion_two_processes_match_one_with_evaluation_and_resume_exactly`` runs in the default suite."""
    one, two = _pair(tmp_path, CONFIGS / "lcm/mse_toy.yaml", "train.max_steps=4", "train.save_every=4")
    assert_same_curves(one, two, 4)
    assert "next_sentence_ce" in _records(two, "eval")[0]


def test_lcm_diffusion_two_processes_match_one_with_evaluation_and_resume_exactly(tmp_path):
    one, two = _pair(tmp_path, CONFIGS / "lcm/diffusion_toy.yaml", "train.max_steps=4", "train.save_every=2")
    assert_same_curves(one, two, 4)  # per-example timesteps, noise and DDIM samples: the split does not matter
    assert [r["step"] for r in _records(two, "eval")] == [2, 4] and "next_sentence_ce" in _records(two, "eval")[0]
    assert_resumes_exactly(two, 2, tmp_path)


# ---------------------------------------------------------------------------------------------- bad launches
def _memlab_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("memlab: error:")]


def test_bad_launches_fail_in_one_line_before_any_compute(tmp_path):
    cfg = str(CONFIGS / "lcm/mse_toy.yaml")
    fresh = tmp_path / "new-run"
    r = _launch2("train", cfg, "--out", str(fresh), "train.batch_size=1",  # more processes than examples a batch
                 script=[str(ROOT / "tests/dist_helper.py"), "threads", str(tmp_path), "6", "--"])
    lines = _memlab_lines(r)
    assert r.returncode != 0 and len(lines) == 1 and "train.batch_size=1 must be divisible by processes (2)" in lines[0]
    assert "exitcode: 2" in r.stderr and not fresh.exists()
    # the launcher's OMP_NUM_THREADS=1 replaced before any set-up: each of 2 processes on 6 cores takes 3 threads
    assert [json.loads((tmp_path / f"threads-{i}.json").read_text()) for i in (0, 1)] == [3, 3]
    run = tmp_path / "finished"
    assert main(["train", cfg, "--out", str(run), "train.max_steps=2", "train.save_every=2", "train.eval_every=2",
                 "train.eval_batches=1"]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--num_processes", "2",
                        "--main_process_port", PORT, "--num_machines", "1", "--mixed_precision", "no",
                        "--dynamo_backend", "no", "-m", "memlab.app.cli", "train", "--resume", str(run),
                        "train.max_steps=4"],
                       env=_env(), capture_output=True, text=True, timeout=300)
    lines = _memlab_lines(r)
    assert r.returncode != 0 and len(lines) == 1 and "FSDP, which memlab does not support" in lines[0], r.stderr[-2000:]
    assert "exitcode: 2" in r.stderr and time.time() - t0 < 120
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_a_failure_on_one_process_ends_every_process_with_its_message(tmp_path):
    run = tmp_path / "run"
    t0 = time.time()
    r = _launch2("train", str(CONFIGS / "lcm/mse_toy.yaml"), "--out", str(run), *SHORT, "train.max_steps=50",
                 script=[str(ROOT / "tests/dist_helper.py"), "fail", "1", "2", "--"])
    took = time.time() - t0
    lines = _memlab_lines(r)
    assert r.returncode != 0 and lines == ["memlab: error: injected failure on process 1 after step 2"], r.stderr[-2000:]
    assert took < 240, f"the other process waited {took:.0f} s"  # not the collective's 30-minute timeout
    assert not (run / "summary.json").exists()


# ---------------------------------------------------------------------------------------------- fast unit checks
def test_threads_per_process_share_the_host_unless_asked():
    from memlab.train.processes import rank_threads

    launched = {"OMP_NUM_THREADS": "1"}  # what torchrun and accelerate launch set when it is unset
    assert rank_threads(0, 2, cores=16, environ=launched) == 8
    assert rank_threads(0, 4, cores=16, environ={}) == 4
    assert rank_threads(0, 3, cores=2, environ=launched) == 1  # never 0
    assert rank_threads(0, 2, cores=16, environ={"OMP_NUM_THREADS": "3"}) is None  # the user's choice, kept
    assert rank_threads(5, 2, cores=16, environ={"OMP_NUM_THREADS": "3"}) == 5  # train.threads wins
    assert rank_threads(0, 1, cores=16, environ=launched) is None  # one process: torch's default


def test_negative_threads_are_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(CONFIGS / "lcm/mse_toy.yaml"), "--out", str(out), "train.threads=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["memlab: error: 'train.threads' is out of range: -1"] and not out.exists()


def test_auto_mixed_precision_takes_bf16_only_where_it_is_native(monkeypatch):
    from memlab.train import processes as devices

    monkeypatch.delenv("MEMLAB_ACCEL", raising=False)  # the hardware's own choice
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # says yes under emulation too
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert devices.mixed_precision("auto", cpu=False) == "no"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert devices.mixed_precision("auto", cpu=False) == "bf16"
    assert devices.mixed_precision("auto", cpu=True) == "no" and devices.mixed_precision("fp16", cpu=False) == "fp16"
    from memlab.devices import train_bf16

    assert not train_bf16(torch.device("cpu"))  # a CPU run trains in float32 whatever the CPU


def test_diffusion_loss_does_not_depend_on_how_the_batch_is_split():
    from toy_spaces import SENTENCES, document_batch, random_space

    from memlab.models.lcm.recipe import LCMLoss
    from memlab.models.sentence.spaces import SpaceHandle
    from memlab.randomness import SEED_KEY, example_seeds
    from memlab.registry import FAMILIES

    torch.manual_seed(0)
    handle = SpaceHandle(random_space(), "toy_ae")
    docs = [SENTENCES[i : i + 3] + ["End of sequence."] for i in range(0, 8, 2)]
    batch = document_batch(handle, docs)
    batch[SEED_KEY] = example_seeds(1, 7, torch.arange(len(docs)))
    model = FAMILIES.get("lcm_diffusion").make_model("toy", embed_dim=32, cfg_dropout=0.5).train()
    loss = LCMLoss(handle, diffusion=True)
    whole = loss(model, batch)
    halves = [loss(model, {k: v[s] for k, v in batch.items()}) for s in (slice(0, 2), slice(2, 4))]
    mean = sum(h.loss * h.weight for h in halves) / sum(h.weight for h in halves)
    assert torch.allclose(mean, whole.loss, rtol=1e-5)
    batch[SEED_KEY] = example_seeds(1, 8, torch.arange(len(docs)))  # another step: other draws
    assert not torch.allclose(loss(model, batch).loss, whole.loss)


def test_objectives_refuse_a_model_outside_the_forward_convention():
    from memlab.curricula import make_objective
    from memlab.errors import ModelError

    class Plain(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ModelError, match="forward_modes"):
        make_objective("blank_copy")(Plain(), {"input_ids": torch.zeros(1, 1, 4, dtype=torch.long)})
