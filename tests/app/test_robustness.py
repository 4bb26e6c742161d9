"""Inputs that real users bring, and no silent wrong results, plus the loop's device syncs."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import one_line_error as _one_line_error
from conftest import hold_folder, write_config
from memlab.app.cli import main
from memlab.errors import DataError, MemlabError, ModelError

ROOT = Path(__file__).resolve().parents[2]
STEP = "step-{:08d}"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def one_file(small_corpus, tmp_path_factory) -> Path:
    """The small corpus as one plain-text file without chapter headings (a user's own .txt)."""
    text = "\n\n".join(p.read_text() for p in sorted(small_corpus.glob("*.txt")))
    text = re.sub(r"^\s*CHAPTER \d+\s*$", "", text, flags=re.MULTILINE)
    f = tmp_path_factory.mktemp("onefile") / "book.txt"
    f.write_text(text)
    return f


# ----------------------------------------------------------------------------- 1. one plain-text file is a corpus


def test_one_large_text_file_is_cut_into_blocks_and_trains(one_file, tmp_path, small_corpus):
    from memlab.data.corpus import load_corpus, make_splits, units

    docs = load_corpus(str(one_file))
    assert len(docs) == 1
    splits = make_splits(units(docs, "chapter"), 0.05, 0.05, 0)
    assert splits["validation"] and splits["test"] and splits["train"]
    # blocks are whole paragraphs: every block's text is found in the file as it is
    assert all(b.text.split("\n\n")[0] in one_file.read_text() for b in splits["test"])
    cfg = write_config(tmp_path / "c.yaml", one_file, train={"max_steps": 2, "save_every": 2, "eval_every": 2})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert "paragraph blocks" in summary["data_split"] and "validation" in summary["data_split"]
    assert summary["eval"]["loss"] > 0  # held-out data existed
    # a corpus with chapter headings keeps its chapters
    assert all("/b" not in u.id for u in units(load_corpus(str(small_corpus)), "chapter"))


def test_probe_accepts_one_text_file(one_file, small_corpus, tmp_path):
    from memlab.data.tokenizer import train_bpe
    from memlab.probes.chunks.cut import probe_chunks

    tok = train_bpe([one_file.read_text()], 300)
    ids = probe_chunks(tok, 16, 8, "test", str(one_file), 0)
    assert ids.shape == (8, 16)
    from memlab.probes.chunks.cut import split_description

    assert "paragraph blocks" in split_description(str(one_file))
    # and `memlab probe --corpus book.txt` runs end to end
    import transformers as tf

    model = tmp_path / "tiny-llama"
    torch.manual_seed(0)
    tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=4, vocab_size=len(tok), max_position_embeddings=48)
                        ).save_pretrained(model)
    tok.save_pretrained(model)
    out = tmp_path / "probe"
    assert main(["probe", "--model", str(model), "--corpus", str(one_file), "--out", str(out), "--seq-len", "5",
                 "--n-train", "32", "--n-eval", "8", "--epochs", "1", "--hidden-size", "32", "--num-layers", "1",
                 "--no-control", "num_heads=4", "n_examples=1"]) == 0
    assert json.loads((out / "report.json").read_text())["n_eval"] == 8


def test_an_empty_split_is_named(tmp_path):
    from memlab.probes.chunks.cut import probe_chunks
    from memlab.data.tokenizer import train_bpe

    f = tmp_path / "tiny.txt"
    f.write_text("A short note.\n\nAnother line of text.\n")
    tok = train_bpe([f.read_text()], 280)
    with pytest.raises(DataError, match=r"the test split of corpus '.*tiny.txt' is empty \(1 units"):
        probe_chunks(tok, 4, 1, "test", str(f), 0)


# ----------------------------------------------------------------------------- 2. empty config, 8. YAML line


def test_empty_and_broken_config_files(tmp_path, small_corpus, capsys):
    for text in ("", "# only a comment\n\n", "   \n"):
        f = tmp_path / "empty.yaml"
        f.write_text(text)
        assert main(["train", str(f), "--out", str(tmp_path / "r")]) == 2
        assert "config file is empty" in _one_line_error(capsys)
    assert not (tmp_path / "r").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain:\n  lr: 3e-4\n   max_steps: 3\n")
    assert main(["train", str(bad)]) == 2
    assert f"{bad}:4:" in _one_line_error(capsys)


# ----------------------------------------------------------------------------- 3. SONAR heads and float64 positions


def test_sonar_head_count_is_never_guessed(tmp_path):
    from memlab.models.sonar import toy_space
    from memlab.models.sonar.convert import config_from_state_dict, heads_beside
    from memlab.models.sonar.space import from_fairseq2
    from test_sonar import _outputs, _to_fs2

    space = toy_space(seed=0)
    sd = space.model.state_dict()
    torch.save({"model": _to_fs2(sd, "encoder")}, tmp_path / "enc.pt")
    torch.save({"model": _to_fs2(sd, "decoder")}, tmp_path / "dec.pt")
    with pytest.raises(ModelError, match="d_model=64 is not a known SONAR configuration.*num_heads"):
        from_fairseq2(str(tmp_path / "enc.pt"), str(tmp_path / "dec.pt"), tokenizer=space.tokenizer,
                      max_position_embeddings=128)
    # the published width needs nothing: 1024 -> 16 heads
    assert config_from_state_dict({"encoder.embed_tokens.weight": torch.zeros(8, 1024)})["encoder_attention_heads"] == 16
    # a config.json beside the weights gives the count, and the loaded space matches the original exactly
    (tmp_path / "config.json").write_text(json.dumps({"num_heads": 4}))
    assert heads_beside(str(tmp_path / "enc.pt")) == 4
    loaded = from_fairseq2(str(tmp_path / "enc.pt"), str(tmp_path / "dec.pt"), tokenizer=space.tokenizer,
                           max_position_embeddings=128)
    assert loaded.model.config.encoder_attention_heads == 4
    (za, la), (zb, lb) = _outputs(space), _outputs(loaded)
    assert torch.equal(za, zb) and torch.equal(la, lb)


def test_sonar_positions_keep_float64():
    from memlab.models.sonar import toy_space
    from memlab.models.sonar.modeling_sonar import sinusoidal_positions

    model = toy_space(seed=0).model.double().eval()
    enc = model.encoder
    ids = torch.tensor([[0, 5, 9, 2]])
    got = enc.embed(ids)  # (1, 4, D)
    steps = torch.arange(enc.offset, enc.offset + 4, dtype=torch.float64)
    half = got.shape[-1] // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float64) * -torch.log(torch.tensor(10000.0, dtype=torch.float64))
                      / (half - 1))
    ang = torch.outer(steps, freqs)
    ref = enc.embed_tokens(ids) * enc.scale + torch.cat([ang.sin(), ang.cos()], -1)
    assert got.dtype == torch.float64
    assert (got - ref).abs().max().item() < 1e-12  # a float32 table is about 1e-7 away
    assert sinusoidal_positions(3, 8, 2).dtype == torch.float32


# ----------------------------------------------------------------------------- 4. two runs into one folder


def test_a_folder_in_use_is_refused_and_a_killed_holder_frees_it(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 2, "save_every": 2, "eval_every": 2})
    run = tmp_path / "run"
    holder = hold_folder(run, fresh=True)  # another `memlab train --out run` that has started
    try:
        assert main(["train", str(cfg), "--out", str(run)]) == 2
        assert "is in use by process" in _one_line_error(capsys)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(["train", str(cfg), "--out", str(run)]) == 0  # kill -9 left no stuck lock
    holder = hold_folder(run, fresh=False)  # a `--resume` of the run is under way
    try:
        assert main(["train", "--resume", str(run), "train.max_steps=4"]) == 2
        assert "is in use" in _one_line_error(capsys)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(["train", "--resume", str(run), "train.max_steps=4"]) == 0
    from memlab.probes.run import load_options, run_probe

    probe_dir = tmp_path / "probe"
    holder = hold_folder(probe_dir, fresh=True)  # a probe writing into it
    try:
        with pytest.raises(MemlabError, match="is in use"):
            run_probe(load_options(None, model="no-such-model"), probe_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_two_trainings_started_together_one_refuses(tmp_path, small_corpus):
    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 6, "save_every": 3, "eval_every": 3})
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "memlab.app.cli", "train", str(cfg), "--out", str(run)]
    a = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    b = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (_, ea), (_, eb) = a.communicate(timeout=300), b.communicate(timeout=300)
    assert sorted([a.returncode, b.returncode]) == [0, 2], (ea[-500:], eb[-500:])
    loser = eb if b.returncode == 2 else ea
    assert re.search(r"in use|already holds files", loser) and "Traceback" not in loser
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert steps == sorted(set(steps))  # one run's records, not two interleaved


# ----------------------------------------------------------------------------- 5. NaN weights


def test_divergence_keeps_good_checkpoints_and_names_one(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 40, "lr": 1e6, "save_every": 1, "log_every": 1, "eval_every": 1000,
                              "warmup_steps": 0, "clip_grad": 0.0, "keep_checkpoints": 2})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 2
    msg = _one_line_error(capsys)
    assert "not finite" in msg or "loss became" in msg
    named = re.search(r"last good checkpoint: (\S+?)[;)]", msg).group(1)
    dirs = sorted((run / "checkpoints").glob("step-*"))
    assert dirs and Path(named) == dirs[-1]
    for d in dirs:  # every checkpoint on disk holds finite weights
        assert all(torch.isfinite(t).all() for t in load_file(str(d / "model.safetensors")).values())


def test_generate_refuses_nan_weights(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 2, "save_every": 2, "eval_every": 2})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    model = tmp_path / "model"
    import shutil

    shutil.copytree(run / "checkpoints" / STEP.format(2), model)
    w = load_file(str(model / "model.safetensors"))
    k = next(iter(w))
    w[k] = torch.full_like(w[k], float("nan"))
    save_file(w, str(model / "model.safetensors"), metadata={"format": "pt"})
    assert main(["generate", "--run", str(model), "--prompt", "It was"]) == 2
    assert "NaN" in _one_line_error(capsys)


def test_uniform_loss_warning():
    from memlab.train.metrics_log import UniformWatch

    ln_v = torch.log(torch.tensor(512.0)).item()
    w = UniformWatch(512, warmup_steps=10)
    assert all(w.update(s, ln_v) is None for s in range(1, 10))  # a fresh model starts at ln V: no warning
    w = UniformWatch(512, warmup_steps=10)
    assert w.update(1, 0.5 * ln_v) is None  # it learned ...
    assert w.update(2, ln_v) is None and w.update(3, ln_v * 1.001) is None
    msg = w.update(4, ln_v)  # ... then sat at ln V for three logging steps
    assert msg and "ln V" in msg and w.update(5, ln_v) is None  # once


# ----------------------------------------------------------------------------- 6. damaged checkpoints


@pytest.fixture()
def finished_run(tmp_path, small_corpus):
    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 6, "save_every": 2, "eval_every": 100, "log_every": 1, "keep_checkpoints": 3})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    return run


def _truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", ["truncate_weights", "empty_state", "truncate_optimizer", "flip_weight_bytes"])
def test_resume_skips_a_damaged_newest_checkpoint(finished_run, capsys, damage):
    run = finished_run
    newest = run / "checkpoints" / STEP.format(6)
    if damage == "truncate_weights":
        _truncate(newest / "model.safetensors")
    elif damage == "empty_state":
        (newest / "trainer_state.json").write_text("")
    elif damage == "truncate_optimizer":
        _truncate(newest / "optimizer.pt")
    else:  # random bytes inside the weights, same size
        data = bytearray((newest / "model.safetensors").read_bytes())
        data[-64:-32] = os.urandom(32)
        (newest / "model.safetensors").write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["generate", "--run", str(run), "--prompt", "It was", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err  # named, set aside, and the older checkpoint is used
    assert "step-00000006" in err and "set aside as step-00000006.damaged" in err and "Traceback" not in err
    assert (run / "checkpoints" / "step-00000006.damaged").is_dir()  # kept, not deleted
    assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["steps"] == 8
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert steps == list(range(1, 9))


def test_no_intact_checkpoint_is_one_line(finished_run, capsys):
    for d in (finished_run / "checkpoints").glob("step-*"):
        _truncate(d / "model.safetensors")
    assert main(["train", "--resume", str(finished_run), "train.max_steps=8"]) == 2
    assert "no intact checkpoint" in _one_line_error(capsys)
    assert main(["generate", "--run", str(finished_run), "--prompt", "x"]) == 2
    assert "no intact checkpoint" in _one_line_error(capsys)


def test_damaged_files_without_manifest_are_one_line(finished_run):
    from memlab.train import checkpoint as ckpt

    d = finished_run / "checkpoints" / STEP.format(6)
    (d / "manifest.json").unlink()  # a checkpoint from before manifests
    (d / "trainer_state.json").write_text("")
    _truncate(d / "optimizer.pt")
    _truncate(d / "model.safetensors")
    with pytest.raises(ModelError, match="trainer_state.json is damaged"):
        ckpt.load_trainer_state(d)
    with pytest.raises(ModelError, match="optimizer.pt is damaged"):
        ckpt.load_torch(d / "optimizer.pt")
    from memlab.loading import load_pretrained

    with pytest.raises(ModelError, match="damaged|cannot be read"):
        load_pretrained(d)


def test_torn_metrics_line_is_dropped(finished_run, capsys):
    m = finished_run / "metrics.jsonl"
    m.write_text(m.read_text() + '{"step": 7, "split": "tr')
    assert main(["plot", str(finished_run)]) == 0  # plotting a crashed run's metrics works too
    assert main(["train", "--resume", str(finished_run), "train.max_steps=8"]) == 0
    assert "incomplete" in capsys.readouterr().err
    steps = [json.loads(x)["step"] for x in m.read_text().splitlines() if '"train"' in x]
    assert steps == list(range(1, 9))


# ----------------------------------------------------------------------------- 7. probe output folder


def test_probe_refuses_a_used_or_unwritable_out_before_compute(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "report.json").write_text("{}")
    # the model does not exist: the folder check must come first
    assert main(["probe", "--model", "no-such-model-anywhere", "--out", str(used)]) == 2
    assert "already holds files" in _one_line_error(capsys)
    assert (used / "report.json").read_text() == "{}"
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["probe", "--model", "no-such-model-anywhere", "--out", str(blocker / "sub")]) == 2
    assert "cannot create probe directory" in _one_line_error(capsys)


# ----------------------------------------------------------------------------- 8. smaller ones


def test_full_disk_says_what_was_saved(tmp_path, small_corpus, capsys, monkeypatch):
    from memlab.train import checkpoint as ckpt

    cfg = write_config(tmp_path / "c.yaml", small_corpus, train={"max_steps": 6, "save_every": 2, "eval_every": 100})
    real, calls = torch.save, []

    def full(obj, f, *a, **k):
        calls.append(f)
        if "step-00000004" in str(f):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(ckpt.torch, "save", full)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 2
    msg = _one_line_error(capsys)
    assert "disk is full" in msg and "step-00000002" in msg and f"--resume {run}" in msg
    assert [d.name for d in (run / "checkpoints").iterdir()] == ["step-00000002"]  # no partial folder left
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0


def test_zero_layers_and_missing_jsonl_field(tmp_path, small_corpus, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_corpus)
    assert main(["train", str(cfg), "model.overrides.num_hidden_layers=0", "--out", str(tmp_path / "r")]) == 2
    assert "num_hidden_layers' must be >= 1" in _one_line_error(capsys)
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"body": "two"}) + "\n")
    from memlab.data.corpus import load_corpus

    with pytest.raises(DataError, match="missing field 'text' in row 2"):
        load_corpus(str(f))


# ----------------------------------------------------------------------------- the loop reads the device at logging steps only


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))


def _toy_setup(bad_from: int | None):
    from memlab.train.setup import StepOutput, TrainSetup

    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss = ((batch["x"] * model.w).sum(-1) ** 2).mean()
        if bad_from is not None and calls["n"] >= bad_from:
            loss = loss * float("nan")
        return StepOutput(loss=loss, metrics={"token_accuracy": loss.detach() * 0 + 0.5}, weight=2.0)

    data = [{"x": torch.randn(4)} for _ in range(16)]
    return TrainSetup(model=_Toy(), train_data=data, eval_data=None, loss_fn=loss_fn)


def test_metrics_stay_on_the_device_and_nan_is_caught_within_one_interval(tmp_path, host_reads):
    from memlab.config import TrainConfig
    from memlab.train.loop import Trainer

    reads = host_reads
    cfg = TrainConfig(max_steps=20, batch_size=4, grad_accum=2, log_every=5, eval_every=1000, save_every=1000,
                      warmup_steps=0, cpu=True, clip_grad=0.0)
    t = Trainer(_toy_setup(None), cfg, tmp_path / "a")
    (tmp_path / "a").mkdir()
    t.save = lambda: None
    reads["n"] = 0
    t.train()
    # 4 logging steps; each reads the device a fixed few times, never once per micro-batch (40 of them)
    assert reads["n"] <= 4 * 4, reads
    recs = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [5, 10, 15, 20] and all(r["token_accuracy"] == pytest.approx(0.5) for r in recs)
    # a NaN in micro-batch 15 (step 8) is reported at the next logging step (10), naming step 8
    (tmp_path / "b").mkdir()
    t = Trainer(_toy_setup(bad_from=15), cfg, tmp_path / "b")
    with pytest.raises(MemlabError, match="loss became nan at step 8"):
        t.train()
    assert t.step == 10


def test_claim_rules(tmp_path):
    from memlab.rundir import LOCK_NAME, claim

    d = tmp_path / "out"
    c = claim(d, fresh=True, what="probe")
    assert c.created and (d / LOCK_NAME).is_file()
    assert claim(d, fresh=True, what="probe") is c  # this process holds it; still empty
    (d / "report.json").write_text("{}")
    with pytest.raises(MemlabError, match="already holds files"):
        claim(d, fresh=True, what="probe")  # a second probe of this process into the same folder
    c.release()
    with pytest.raises(MemlabError, match="already holds files"):
        claim(d, fresh=True)
    with claim(d, fresh=False):  # a resume of it
        pass
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / LOCK_NAME).write_text("123\n")  # a lock left by a killed process: the folder is still unused
    claim(empty, fresh=True).release()
