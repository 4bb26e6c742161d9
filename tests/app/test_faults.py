"""Nothing lost, nothing silently wrong:
each refusal is one line, exit 2, and leaves what a run saved as it was."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
import yaml
from conftest import copy_run, hold_folder, write_config
from conftest import one_line_error as _one_line_error
from safetensors.torch import save_file

from memlab.app.cli import main
from memlab.errors import ConfigError

STEP = "step-{:08d}"

pytestmark = pytest.mark.usefixtures("one_thread")


def _snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run (the lock file aside), by relative path: what a refusal must leave as it was."""
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".memlab.lock"}


def _train_steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]


@pytest.fixture(scope="module")
def base_run(small_corpus, tmp_path_factory) -> Path:
    """A finished 6-step token-LM run with checkpoints at steps 2, 4 and 6 (copy it before changing it)."""
    tmp = tmp_path_factory.mktemp("faults")
    cfg = write_config(tmp / "c.yaml", small_corpus,
                       train={"max_steps": 6, "save_every": 2, "eval_every": 100, "log_every": 1, "keep_checkpoints": 3})
    run = tmp / "base"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    return run


@pytest.fixture()
def run(base_run, tmp_path) -> Path:
    return copy_run(base_run, tmp_path / "r")


@pytest.fixture()
def model_dir(base_run, tmp_path) -> Path:
    """A saved model folder (weights, config, tokenizer): the newest checkpoint of the run, copied."""
    d = tmp_path / "model"
    shutil.copytree(base_run / "checkpoints" / STEP.format(6), d)
    return d


# ----------------------------------------------------------------------------- data lost or results silently wrong


def test_1_resume_without_checkpoints_keeps_the_record_until_restart_is_asked(run, capsys):
    shutil.rmtree(run / "checkpoints")
    before = _snapshot(run)
    assert main(["train", "--resume", str(run), "train.max_steps=4"]) == 2
    msg = _one_line_error(capsys)
    assert "no checkpoint" in msg and "--restart" in msg and "metrics.jsonl" in msg
    assert _snapshot(run) == before  # metrics, summary and config as they were
    assert main(["train", "--resume", str(run), "--restart", "train.max_steps=4"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert _train_steps(run) == [1, 2, 3, 4]


def test_1_restart_is_refused_where_it_would_drop_checkpoints(run, capsys):
    before = _snapshot(run)
    assert main(["train", "--resume", str(run), "--restart", "train.max_steps=8"]) == 2
    assert "resume it without --restart" in _one_line_error(capsys)
    assert _snapshot(run) == before


def test_2_weights_of_another_family_are_refused_not_run_at_random(base_run, tmp_path, capsys):
    out = tmp_path / "probe"
    assert main(["probe", "--model", f"space:memory_ae:{base_run}", "--out", str(out), "--n-train", "16"]) == 2
    msg = _one_line_error(capsys)
    assert "'token_lm' model" in msg and "'memory'" in msg
    assert not out.exists()  # the probe removes the folder it claimed


@pytest.mark.parametrize("header", ["no_tensors", "large_header_no_tensors"])
def test_2_a_safetensors_file_without_the_weights_is_refused(model_dir, tmp_path, capsys, header):
    f = model_dir / "model.safetensors"
    if header == "no_tensors":
        save_file({}, str(f))
    else:  # a valid header padded with metadata, and still no tensors
        save_file({}, str(f), metadata={"pad": "x" * (4 << 20)})
    before = _snapshot(model_dir)
    assert main(["generate", "--run", str(model_dir), "--prompt", "It was", "--max-new-tokens", "2"]) == 2
    msg = _one_line_error(capsys)
    assert "do not fit" in msg and "missing" in msg and "model.embed_tokens.weight" in msg
    out = tmp_path / "probe"
    assert main(["probe", "--model", str(model_dir), "--out", str(out), "--n-train", "16"]) == 2
    assert "missing" in _one_line_error(capsys)
    assert not out.exists() and _snapshot(model_dir) == before


def test_2_strict_loading_names_missing_and_unexpected_keys(model_dir):
    from safetensors.torch import load_file

    from memlab.errors import ModelError
    from memlab.loading import load_pretrained

    weights = load_file(str(model_dir / "model.safetensors"))
    gone = sorted(weights)[-1]  # a weight tied to none
    weights["extra.weight"] = weights.pop(gone)
    save_file(weights, str(model_dir / "model.safetensors"))
    with pytest.raises(ModelError, match=rf"1 missing \(first: {gone}\); 1 unexpected \(first: extra.weight\)"):
        load_pretrained(model_dir)


def test_3_a_refused_resume_rewrites_nothing(run, capsys):
    before = _snapshot(run)
    assert main(["train", "--resume", str(run), "train.max_steps=3"]) == 2
    assert "already finished at step 6" in _one_line_error(capsys)
    assert _snapshot(run) == before  # config.yaml keeps max_steps: 6


def test_4_a_run_name_never_leads_out_of_runs(small_corpus, tmp_path):
    from memlab.config import load_config
    from memlab.train.experiment import default_run_dir

    cfg = load_config(write_config(tmp_path / "c.yaml", small_corpus, name="../../escaped"))
    d = default_run_dir(cfg)
    assert d.parent == Path("runs") and ".." not in d.parts and "/" not in d.name
    assert d.name.startswith(".._.._escaped-")


# ----------------------------------------------------------------------------- tracebacks where one line is promised


def test_5_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_temporary_folder(run, capsys, monkeypatch):
    import errno

    from memlab.train import checkpoint as ckpt
    from memlab.train.checkpoint import verify_checkpoint

    def full(folder):  # the disk fills up while the checkpoint's last file is written
        (folder / "manifest.json").write_text("{")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "write_manifest", full)
    assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 2
    monkeypatch.undo()
    msg = _one_line_error(capsys)
    assert "could not write checkpoint step-00000008" in msg and "disk is full" in msg and "step-00000006" in msg
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [STEP.format(s) for s in (2, 4, 6)]  # no step-8.tmpPID left behind
    assert all(verify_checkpoint(run / "checkpoints" / n) is None for n in names)  # older ones intact
    assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 0
    assert not [p for p in (run / "checkpoints").iterdir() if ".tmp" in p.name]
    assert json.loads((run / "summary.json").read_text())["steps"] == 8


def test_5_the_guard_turns_a_safetensors_write_error_into_one_line(tmp_path):
    from safetensors import SafetensorError

    from memlab.errors import MemlabError
    from memlab.rundir import guarded

    tmp = tmp_path / "x.tmp1"
    with pytest.raises(MemlabError, match=r"could not write w \(the disk is full\); kept"):
        with guarded("w", tmp, then=lambda: "kept"):
            tmp.write_text("partial")
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert not tmp.exists()
    with pytest.raises(ValueError):  # anything else is a bug and keeps its traceback
        with guarded("w", tmp):
            raise ValueError("not a storage failure")


def test_6_an_oversized_safetensors_header_is_one_line(model_dir, tmp_path, capsys):
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    out = tmp_path / "probe"
    assert main(["probe", "--model", str(model_dir), "--out", str(out), "--n-train", "16"]) == 2
    assert "header too large" in _one_line_error(capsys)
    assert not out.exists()
    assert main(["generate", "--run", str(model_dir), "--prompt", "It was"]) == 2
    assert "cannot be read" in _one_line_error(capsys)


# ----------------------------------------------------------------------------- unclear or inconsistent


def test_7_resume_of_a_run_still_setting_up_names_its_process(tmp_path, capsys):
    folder = tmp_path / "starting"
    proc = hold_folder(folder, fresh=True)  # a fresh train that has not written config.yaml yet
    try:
        assert main(["train", "--resume", str(folder)]) == 2
        assert f"in use by process {proc.pid}" in _one_line_error(capsys)
    finally:
        proc.kill()
        proc.wait()
    assert main(["train", "--resume", str(folder)]) == 2
    assert "holds no config.yaml" in _one_line_error(capsys)
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no such run directory" in _one_line_error(capsys)


def test_8_probe_sets_a_damaged_checkpoint_aside_and_leaves_it_while_the_run_is_in_use(run, capsys):
    from memlab.probes.encoders.sources import load_encoder

    newest = run / "checkpoints" / STEP.format(6)
    (newest / "trainer_state.json").write_text("")
    proc = hold_folder(run, fresh=False)  # a resume of it is writing
    try:
        load_encoder(str(run))
        err = capsys.readouterr().err
        assert "left in place" in err and f"in use by process {proc.pid}" in err and newest.is_dir()
    finally:
        proc.kill()
        proc.wait()
    load_encoder(str(run))  # the probe's loader, as `memlab probe --model RUN`
    err = capsys.readouterr().err
    assert "set aside as step-00000006.damaged" in err and "using step-00000004" in err
    assert not newest.exists() and (newest.parent / "step-00000006.damaged" / "model.safetensors").is_file()


def test_9_plot_names_a_missing_folder_and_warns_once(run, tmp_path, capsys):
    assert main(["plot", str(tmp_path / "does-not-exist")]) == 2
    assert "does-not-exist: no such run directory" in _one_line_error(capsys)
    m = run / "metrics.jsonl"
    m.write_text(m.read_text() + '{"step": 7, "split": "tr')
    assert main(["plot", str(run)]) == 0
    assert capsys.readouterr().err.count("incomplete") == 1


def test_10_a_checkpoint_without_manifest_is_named_once(run, capsys):
    (run / "checkpoints" / STEP.format(6) / "manifest.json").unlink()
    for _ in range(2):
        assert main(["generate", "--run", str(run), "--prompt", "It was", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert err.count("has no manifest.json") == 1 and "not checked" in err


def test_11_resume_after_the_family_was_edited_names_both_families(run, capsys):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"] = {"family": "memory", "preset": "toy"}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    before = _snapshot(run)
    assert main(["train", "--resume", str(run), "train.max_steps=8"]) == 2
    msg = _one_line_error(capsys)
    assert "'token_lm' model" in msg and "model.family: memory" in msg and "put back model.family: token_lm" in msg
    assert _snapshot(run) == before


def test_12_one_type_rule_for_config_values(small_corpus, tmp_path, capsys):
    from memlab.config import load_config

    quoted = write_config(tmp_path / "q.yaml", small_corpus, train={"max_steps": "2"})
    with pytest.raises(ConfigError, match=r"'train.max_steps' must be an integer, got '2' \(a quoted string"):
        load_config(quoted)
    with pytest.raises(ConfigError, match="'train.batch_size' must be an integer"):
        load_config(write_config(tmp_path / "l.yaml", small_corpus, train={"batch_size": [1, 2]}))
    with pytest.raises(ConfigError, match="'train.cpu' must be true or false"):
        load_config(write_config(tmp_path / "b.yaml", small_corpus, train={"cpu": "true"}))
    (tmp_path / "e.yaml").write_text((tmp_path / "q.yaml").read_text().replace("lr: 0.003", "lr: 3e-3")
                                     .replace("max_steps: '2'", "max_steps: 2"))
    assert load_config(tmp_path / "e.yaml").train.lr == pytest.approx(3e-3)  # YAML 1.1 leaves 3e-3 a string
    assert main(["train", str(quoted), "--out", str(tmp_path / "r")]) == 2
    assert "quoted" in _one_line_error(capsys) and not (tmp_path / "r").exists()


def test_13_a_refused_out_leaves_no_folder_on_the_way(run, small_corpus, tmp_path, capsys):
    before = _snapshot(run)
    cfg = write_config(tmp_path / "c.yaml", small_corpus)
    dotted = tmp_path / "zz" / ".." / run.name
    assert main(["train", str(cfg), "--out", str(dotted)]) == 2
    assert "already holds files" in _one_line_error(capsys)
    assert not (tmp_path / "zz").exists() and _snapshot(run) == before
    assert not (run / ".memlab.lock").exists()  # not even a lock file in the run it refused


# ----------------------------------------------------------------------------- the probe's cache and folder


def test_probe_refuses_an_unusable_cache_dir_before_compute(tiny_llama, tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    for cache, says in ((blocker, "is a file, not a folder"), (blocker / "sub", "cannot be created")):
        out = tmp_path / "out"
        assert main(["probe", "--model", str(tiny_llama), "--cache-dir", str(cache), "--out", str(out)]) == 2
        assert says in _one_line_error(capsys) and not out.exists()
    assert blocker.read_text() == "x"


def test_a_damaged_or_foreign_probe_cache_file_is_named_and_rebuilt(tiny_llama, tmp_path, capsys):
    from memlab.probes.encoders.sources import load_encoder
    from memlab.probes.encoders.encode import cached_encode

    enc = load_encoder(str(tiny_llama))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (6, 8), generator=gen)  # (N, T)
    other = torch.randint(3, 200, (6, 8), generator=gen)  # (N, T)
    kw = dict(batch_size=4, progress=False)
    z, hit = cached_encode(enc, ids, {"k": 1}, str(tmp_path), **kw)  # (N, D)
    z = z.clone()  # it maps the file this test damages
    (f,) = tmp_path.glob("emb-*.bin")
    assert not hit and cached_encode(enc, ids, {"k": 1}, str(tmp_path), **kw)[1]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # truncated
    z2, hit = cached_encode(enc, ids, {"k": 1}, str(tmp_path), **kw)
    assert not hit and torch.equal(z, z2) and "is damaged" in capsys.readouterr().err
    cached_encode(enc, other, {"k": 2}, str(tmp_path), **kw)
    for suffix in (".json", ".bin"):  # the files of other chunks under this name
        (g,) = [p for p in tmp_path.glob(f"emb-*{suffix}") if p.name != f.name.replace(".bin", suffix)]
        shutil.copy(g, f.with_name(f.name.replace(".bin", suffix)))
    z3, hit = cached_encode(enc, ids, {"k": 1}, str(tmp_path), **kw)
    assert not hit and torch.equal(z, z3) and "holds other chunks" in capsys.readouterr().err
    assert cached_encode(enc, ids, {"k": 1}, str(tmp_path), **kw)[1]  # whole again
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_damaged_sentence_cache_is_rebuilt_or_refused(tmp_path, capsys):
    from toy_spaces import SENTENCES, random_space

    from memlab.data import embcache
    from memlab.errors import DataError

    docs = [SENTENCES[:4], SENTENCES[4:]]
    space = random_space()
    first = embcache.build_or_load(space, "toy_ae", docs, "train", tmp_path / "root", max_tokens=20)
    (folder,) = (tmp_path / "root").iterdir()
    (folder / "meta.json").write_text('{"space": "toy')  # truncated
    again = embcache.build_or_load(space, "toy_ae", docs, "train", tmp_path / "root", max_tokens=20)
    assert "is damaged" in capsys.readouterr().err and torch.equal(first.embeddings, again.embeddings)
    named = tmp_path / "named"
    embcache.build_or_load(space, "toy_ae", docs, "train", tmp_path, path=named)
    for arrow in (named / "data").glob("*.arrow"):
        arrow.write_bytes(arrow.read_bytes()[:100])
    with pytest.raises(DataError, match="is damaged.*delete it to rebuild"):
        embcache.build_or_load(space, "toy_ae", docs, "train", tmp_path, path=named)
    assert (named / "meta.json").is_file()  # a folder the user named is left as it is
