"""Nothing wrong is silent: pickled or damaged weights, eval's limits, signals, progress in a log, the shipped
memory autoencoder as the default space. Each refusal is one line and exit 2; a stop by a signal is one line
saying what was kept, exit 130 (SIGINT) or 143 (SIGTERM)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import one_line_error, write_config
from memlab.app.cli import main
from memlab.errors import ModelError
from memlab.paths import resource

TOY = resource("checkpoints", "token_lm-toy")
AE = resource("checkpoints", "memory_ae-small")
TINY_PROBE = ["--n-train", "32", "--n-eval", "8", "--epochs", "0.5", "--no-control", "--no-bow", "--seq-len", "8"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _pickled(src: Path, dst: Path, truncate: bool = False) -> Path:
    """A copy of the saved folder ``src`` whose weights are a pickled ``pytorch_model.bin`` (no safetensors)."""
    shutil.copytree(src, dst)
    f = dst / "pytorch_model.bin"
    torch.save(load_file(str(dst / "model.safetensors")), f)
    (dst / "model.safetensors").unlink()
    if truncate:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return dst


@pytest.fixture
def no_unpickling(monkeypatch):
    """Any torch.load of weights fails the test: a pickle must be refused before it is read."""
    def refuse(*a, **k):
        raise AssertionError("a weights file was unpickled")

    monkeypatch.setattr(torch, "load", refuse)


# ---------------------------------------------------------------------------------------------- pickled weights
@pytest.mark.parametrize("truncate", [False, True])
def test_pickled_weights_are_refused_in_one_line_by_every_reader(tmp_path, capsys, no_unpickling, truncate):
    model = _pickled(TOY, tmp_path / "model", truncate)
    named = str(model / "pytorch_model.bin")
    assert main(["generate", "--run", str(model), "--prompt", "It was"]) == 2
    line = one_line_error(capsys)
    assert named in line and "pickled" in line and "safetensors" in line
    assert main(["probe", "--model", str(model), "--out", str(tmp_path / "probe"), *TINY_PROBE]) == 2
    assert named in one_line_error(capsys) and not (tmp_path / "probe").exists()
    assert main(["eval", "--run", str(model), "--task", "needle", "--out", str(tmp_path / "eval")]) == 2
    assert named in one_line_error(capsys) and not (tmp_path / "eval").exists()
    from memlab.loading import load_pretrained  # what train's init_from reads through

    with pytest.raises(ModelError, match="pickled"):
        load_pretrained(model)


def test_a_run_checkpoint_with_a_pickle_and_no_manifest_is_refused(tmp_path, capsys, no_unpickling):
    run = tmp_path / "run"
    step = _pickled(TOY, run / "checkpoints" / "step-00000002")
    (step / "trainer_state.json").write_text(json.dumps({"step": 2}))
    assert main(["generate", "--run", str(run), "--prompt", "It was"]) == 2
    assert str(step / "pytorch_model.bin") in one_line_error(capsys)


def test_a_space_with_pickled_weights_is_refused(tmp_path, capsys, no_unpickling):
    ae = _pickled(AE, tmp_path / "ae")
    out = tmp_path / "probe"
    assert main(["probe", "--model", f"space:memory_ae:{ae}", "--out", str(out), *TINY_PROBE]) == 2
    assert str(ae / "pytorch_model.bin") in one_line_error(capsys) and not out.exists()


def test_a_truncated_safetensors_file_is_named(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(TOY, model)
    f = model / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert main(["generate", "--run", str(model), "--prompt", "It was"]) == 2
    assert str(f) in one_line_error(capsys)


# ---------------------------------------------------------------------------------------------- eval's options
@pytest.mark.parametrize("limit", ["0", "-3"])
def test_eval_limit_below_one_is_refused(tmp_path, capsys, limit):
    out = tmp_path / "eval"
    assert main(["eval", "--run", str(TOY), "--task", "needle", "--limit", limit, "--out", str(out)]) == 2
    assert "argument --limit: must be a positive integer" in one_line_error(capsys) and not out.exists()


def test_eval_data_is_refused_for_a_task_that_does_not_read_it(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"context": "It was a fine day.", "continuation": "They set out."}) + "\n")
    out = tmp_path / "eval"
    assert main(["eval", "--run", str(TOY), "--task", "needle", "--data", str(data), "--out", str(out)]) == 2
    line = one_line_error(capsys)
    assert "not read by task needle" in line and "next_sentence" in line and not out.exists()
    from memlab.app.commands.eval import check_data_is_read

    check_data_is_read(str(data), ["next_sentence", "hellaswag"])  # tasks that read it: no error
    check_data_is_read("local", ["needle"])


# ---------------------------------------------------------------------------------------------- signals
def _signal_at(monkeypatch, target, name: str, signum: int, after=None):
    """Replace ``target.name`` by a wrapper that sends ``signum`` to this process once ``after(*args)`` holds."""
    real = getattr(target, name)

    def wrapped(*a, **k):
        if after is None or after(*a):
            os.kill(os.getpid(), signum)
        return real(*a, **k)

    monkeypatch.setattr(target, name, wrapped)


def test_sigterm_ends_train_naming_the_last_checkpoint_and_the_resume_is_exact(small_corpus, tmp_path, capsys,
                                                                              monkeypatch):
    from memlab.train.loop import Trainer

    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 4, "save_every": 2, "eval_every": 100, "log_every": 1})
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(whole)]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        _signal_at(m, Trainer, "_after_step", signal.SIGTERM, after=lambda self, *a: self.step == 3)
        assert main(["train", str(cfg), "--out", str(run)]) == 143
    err = capsys.readouterr().err
    stop = [ln for ln in err.splitlines() if ln.startswith("memlab: stopped")]
    assert stop == [f"memlab: stopped by SIGTERM; kept: checkpoint {run / 'checkpoints' / 'step-00000002'} "
                    f"(memlab train --resume {run} continues from it)"], err
    assert "Traceback" not in err and "memlab: train: started (4)" in err  # a log shows the training began
    assert not (run / "summary.json").exists()
    assert main(["train", "--resume", str(run)]) == 0
    a, b = (load_file(str(r / "checkpoints" / "step-00000004" / "model.safetensors")) for r in (whole, run))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigint_ends_a_probe_keeping_nothing_and_no_folder(tmp_path, capsys, monkeypatch):
    from memlab.probes.encoders import encode

    _signal_at(monkeypatch, encode, "encode_all", signal.SIGINT)
    out = tmp_path / "probe"
    assert main(["probe", "--model", "synthetic:concat", "--out", str(out), *TINY_PROBE]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "memlab: stopped by SIGINT; kept: nothing" and "Traceback" not in err
    assert not out.exists()  # not even the lock


@pytest.mark.parametrize("verb", ["eval", "quickstart"])
def test_sigterm_ends_eval_and_quickstart_in_one_line(tmp_path, capsys, monkeypatch, verb):
    out = tmp_path / verb
    if verb == "eval":
        from memlab.app.eval import runner

        _signal_at(monkeypatch, runner, "evaluate_models", signal.SIGTERM)
        argv = ["eval", "--run", str(TOY), "--task", "needle", "--out", str(out)]
    else:
        from memlab.app import quickstart

        _signal_at(monkeypatch, quickstart, "run_probe", signal.SIGTERM)
        argv = ["quickstart", "--fast", "--only", "synthetic:concat", "--out", str(out)]
    assert main(argv) == 143
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "memlab: stopped by SIGTERM; kept: nothing" and "Traceback" not in err
    assert not out.exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back after the command


# ---------------------------------------------------------------------------------------------- progress in a log
def test_progress_off_a_terminal_is_plain_lines(capsys):
    from memlab.progress import PlainProgress, progress_bar

    bar = progress_bar(10, "encode train", None)  # stderr is captured: not a terminal
    assert isinstance(bar, PlainProgress)
    bar.every = 0  # a line at every update (every EVERY_S seconds otherwise)
    bar.update(4)
    bar.set_postfix(loss="1.250")
    bar.update(6)
    bar.close()
    bar.close()
    assert capsys.readouterr().err.splitlines() == [
        "memlab: encode train: started (10)", "memlab: encode train: 4/10 (40%), 0 s",
        "memlab: encode train: 10/10 (100%), 0 s, loss=1.250", "memlab: encode train: done 10/10, 0 s, loss=1.250"]
    shown = progress_bar(10, "x", True)  # --progress: the bar itself
    shown.close()
    assert not isinstance(shown, PlainProgress) and "\r" in capsys.readouterr().err
    progress_bar(10, "x", False).close()  # train.progress=false: nothing at all
    progress_bar(10, "x", None, enabled=False).close()  # another process than the main one: nothing
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------- the shipped space
def test_memory_ae_without_a_path_is_the_shipped_one_and_its_chunks_are_capped(tmp_path, capsys):
    from memlab.models.memory.space import PRETRAINED_DIR
    from memlab.registry import SPACES

    assert PRETRAINED_DIR == AE and SPACES.get("memory_ae")(None).dim > 0
    out = tmp_path / "probe"
    assert main(["probe", "--model", "space:memory_ae", "--out", str(out), *TINY_PROBE[:-2]]) == 0  # 32 words
    err = capsys.readouterr().err
    assert "memlab: note:" in err and "longer than space:memory_ae allows (32 tokens)" in err
    report = json.loads((out / "report.json").read_text())
    assert report["options"]["max_chunk_tokens"] == 32 and report["text"]["max_tokens"] <= 32
    assert "dropped to fit 32 tokens" in report["text"]["per_chunk"]
