"""The training loop: end to end on the bundled corpus, exact resume after SIGKILL,
2 processes == 1 process, and user errors at the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import kill_after, one_line_error, write_config
from memlab.app.cli import main

# launches processes: one xdist worker runs every such module, one after another (their ports)
pytestmark = pytest.mark.xdist_group("processes")

ROOT = Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "tests") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _losses(run: Path) -> list[float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["split"] == "train"]


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def test_shipped_toy_config_on_bundled_corpus(tmp_path):
    run = tmp_path / "run"
    rc = main(["train", str(ROOT / "configs/token_lm/toy.yaml"), "--out", str(run), "train.max_steps=40",
               "train.batch_size=8", "train.eval_every=20", "train.save_every=20", "train.eval_batches=2",
               "train.log_every=10"])
    assert rc == 0
    for f in ("config.yaml", "metrics.jsonl", "summary.json", "plots/loss.png", "tokenizer/tokenizer.json"):
        assert (run / f).is_file(), f
    ck = run / "checkpoints" / "step-00000040"
    for f in ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "trainer_state.json", "tokenizer.json"):
        assert (ck / f).is_file(), f
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["eval"]["loss"] > 0 and summary["tokens_per_s"] > 0
    losses = _losses(run)
    assert losses[-1] < losses[0] - 0.5, losses  # it learns
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert [e["step"] for e in evals] == [20, 40]
    # the saved model reloads and generates
    assert main(["generate", "--run", str(run), "--prompt", "It was", "--max-new-tokens", "5"]) == 0


def _train_cmd(cfg: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memlab.app.cli", "train", str(cfg), *extra]


def test_resume_after_sigkill_gives_identical_weights(tmp_path, small_corpus):
    """A real SIGKILL at an arbitrary point after a checkpoint (maybe inside the next one); the resumed run ends
    on the uninterrupted run's weights and losses bit for bit (dropout on: the RNG state is restored too)."""
    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 40, "save_every": 5, "eval_every": 1000, "log_every": 5, "keep_checkpoints": 3},
                       model={"overrides": {"attention_dropout": 0.1}})
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    # the uninterrupted reference runs beside the one that is killed (one thread each)
    ref_proc = subprocess.Popen(_train_cmd(cfg, "--out", str(ref)), env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    proc = subprocess.Popen(_train_cmd(cfg, "--out", str(killed)), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, ckpts = time.time() + 120, killed / "checkpoints"
    while time.time() < deadline and not (ckpts.exists() and any(ckpts.glob("step-000000[12][05]"))):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ref_proc.wait(timeout=300) == 0, ref_proc.stderr.read()[-2000:]
    ref_proc.stderr.close()
    assert not (killed / "checkpoints" / "step-00000040").exists(), "the run finished before it could be killed"
    assert not (killed / "summary.json").exists()
    r = subprocess.run([sys.executable, "-m", "memlab.app.cli", "train", "--resume", str(killed)], env=_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = _weights(ref, 40), _weights(killed, 40)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _losses(ref) == pytest.approx(_losses(killed), rel=0, abs=0)


def test_two_processes_match_one(tmp_path, small_corpus):
    """The token LM on 2 processes (its loss reads the base model block by block) gives the 1-process losses at the
    same global batch. The other families' cases are in tests/train/test_distributed.py."""
    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 4, "batch_size": 8, "save_every": 100, "eval_every": 2, "log_every": 1,
                              "eval_batches": 1})
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", str(cfg), "--out", str(one)]) == 0
    r = _launch2(str(cfg), "--out", str(two))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((two / "summary.json").read_text())["processes"] == 2
    l1, l2 = _losses(one), _losses(two)
    assert len(l1) == len(l2) == 4
    assert l1 == pytest.approx(l2, rel=2e-4)
    assert l1[-1] < l1[0]


def _launch2(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           "-m", "memlab.app.cli", "train", *args], env=_env(), capture_output=True, text=True)


def test_two_process_resume_is_exact(tmp_path, small_corpus):
    """A 2-process run with dropout, resumed on 2 processes from its step-2 checkpoint (its folder as a kill right
    after that checkpoint leaves it), ends on the same weights bit for bit: each process restores its own RNG."""
    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 4, "save_every": 2, "eval_every": 100, "min_lr_ratio": 1.0,
                              "warmup_steps": 0, "keep_checkpoints": 2},
                       model={"overrides": {"attention_dropout": 0.2}})
    full = tmp_path / "full"
    r = _launch2(str(cfg), "--out", str(full))
    assert r.returncode == 0, r.stderr[-3000:]
    split = kill_after(full, 2, tmp_path / "split")
    assert (split / "checkpoints" / "step-00000002" / "rng-1.pt").is_file()
    r = _launch2("--resume", str(split))
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _weights(full, 4), _weights(split, 4)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_guards(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 3, "save_every": 3, "eval_every": 3})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    config_before = (run / "config.yaml").read_text()
    summary_before = (run / "summary.json").read_text()
    assert main(["train", "--resume", str(run), "data.seq_len=16"]) == 2
    assert "cannot change when a run resumes" in capsys.readouterr().err
    assert main(["train", "--resume", str(run)]) == 2
    assert "already finished at step 3" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == config_before
    assert (run / "summary.json").read_text() == summary_before


def test_failed_start_leaves_no_run_dir(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus)
    run = tmp_path / "new" / "run"
    assert main(["train", str(cfg), "--out", str(run), "data.tokenizer=no-such-org/none"]) == 2
    capsys.readouterr()
    assert not run.exists()
    assert main(["train", str(cfg), "--out", str(run), "train.max_steps=2", "train.save_every=2"]) == 0


def test_user_errors_exit_2_without_traceback(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus)
    assert main(["train", str(cfg), "train.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memlab: error: unknown config key 'train.lrr'") and "Traceback" not in err
    assert err.count("\n") == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["train", str(cfg), f"data.corpus={empty}", "--out", str(tmp_path / "r0")]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["train", str(cfg), "data.seq_len=100000", "--out", str(tmp_path / "r1")]) == 2
    assert "longer than the model allows" in capsys.readouterr().err
    assert main(["train", str(cfg), "data.tokenizer=no-such-org/nothing-here", "--out", str(tmp_path / "r2")]) == 2
    assert "could not be loaded" in capsys.readouterr().err


def test_existing_run_is_never_overwritten(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 4, "save_every": 4, "eval_every": 4})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["train", str(cfg), "--out", str(run)]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_resume_can_extend_a_finished_run(tmp_path, small_corpus):
    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 6, "save_every": 3, "eval_every": 3})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    assert main(["train", "--resume", str(run), "train.max_steps=9"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 9
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert steps == list(range(1, 10))


def _compiled_and_eager(tmp_path: Path, backend: str) -> dict:
    """Train the LCM toy 3 steps eagerly and with ``train.compile`` on ``backend``: the compiled forward gives the
    eager losses and the checkpoint the eager weight names. Returns dynamo's counters of the compiled run."""
    from torch._dynamo.utils import counters

    cfg = ROOT / "configs/lcm/mse_toy.yaml"
    common = ["train.max_steps=3", "train.eval_every=3", "train.save_every=3", "train.log_every=1", "train.eval_batches=1"]
    assert main(["train", str(cfg), "--out", str(tmp_path / "eager"), *common]) == 0
    counters.clear()
    assert main(["train", str(cfg), "--out", str(tmp_path / "compiled"), *common, "train.compile=true",
                 f"train.compile_backend={backend}"]) == 0
    seen = {k: dict(v) for k, v in counters.items()}
    assert seen["stats"]["unique_graphs"] >= 1  # the forward did go through the compiler
    eager, compiled = _losses(tmp_path / "eager"), _losses(tmp_path / "compiled")
    assert len(eager) == 3 and torch.allclose(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    we, wc = _weights(tmp_path / "eager", 3), _weights(tmp_path / "compiled", 3)
    assert we.keys() == wc.keys()
    assert all(torch.allclose(we[k], wc[k], rtol=1e-3, atol=1e-5) for k in we)
    return seen


def test_compiled_forward_trains_the_same_and_saves_the_same_names(tmp_path):
    """``train.compile`` with dynamo's ``eager`` backend (graphs captured, no code generated): the model is compiled
    in place, keeps its weight names and trains as the eager one. Inductor itself: the slow test below."""
    seen = _compiled_and_eager(tmp_path, "eager")
    assert not seen.get("inductor") and not seen.get("aot_autograd")  # the chosen backend, not the default


@pytest.mark.slow  # inductor's C++ compilation takes minutes on 2 CPU cores
def test_compiled_forward_with_inductor_trains_the_same_and_saves_the_same_names(tmp_path):
    """The default backend, inductor: generated kernels give the eager losses and weights."""
    seen = _compiled_and_eager(tmp_path, "inductor")
    assert seen["aot_autograd"]["total"] >= 1


def test_an_unknown_compile_backend_is_refused_in_one_line(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus)
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(out), "train.compile=true", "train.compile_backend=no-such"]) == 2
    assert "'train.compile_backend' 'no-such' is not a torch.compile backend" in one_line_error(capsys)
    assert not out.exists()
