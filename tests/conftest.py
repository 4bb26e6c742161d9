"""Shared fixtures: an offline environment, a shared tokenizer cache and a small corpus."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _memlab_cache(tmp_path_factory):
    """A per-session tokenizer cache, so tests never read or write the user's."""
    cache = tmp_path_factory.mktemp("memlab-cache")
    old = os.environ.get("MEMLAB_CACHE")
    os.environ["MEMLAB_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("MEMLAB_CACHE", None)
    else:
        os.environ["MEMLAB_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def _cores_shared_by_workers():
    """Under pytest-xdist each worker takes its share of the cores for torch's intra-op threads, so that the
    workers do not fight over them (2 workers on 2 cores: one thread each)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on a shared 2-core machine much faster than several threads fighting."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def host_reads(monkeypatch):
    """Counts reads of a tensor's value back to the host (``item``, ``tolist``, ``float()``, ``bool()``, as in an
    ``if``): ``host_reads["n"]``, set it to 0 before the code under test. On an accelerator each is a sync."""
    import torch

    reads = {"n": 0}
    for name in ("item", "tolist", "__float__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            reads["n"] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """Two short 'novels' cut from the bundled Austen text, with chapter headings: a fast local corpus."""
    from memlab.data.corpus import load_corpus, split_chapters

    out = tmp_path_factory.mktemp("corpus")
    for doc in load_corpus("austen")[:2]:
        chapters = split_chapters(doc)[:6]
        text = "".join(f"\n\nCHAPTER {i + 1}\n\n{c.text[:6000]}" for i, c in enumerate(chapters))
        (out / f"{doc.id}.txt").write_text(f"{doc.id.upper()}\n{text}")
    return out


class SixtyTokens:
    """A stand-in tokenizer for probe decoders built on random ids: 60 ids, BOS 0."""

    bos_token_id = 0

    def __len__(self):
        return 60


def one_line_error(capsys) -> str:
    """The one ``memlab: error:`` line a refused command printed (asserting there is one, and no traceback)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("memlab: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def kill_after(run: Path, step: int, dst: Path) -> Path:
    """A copy of the finished run ``run`` at ``dst`` as a kill right after its step-``step`` checkpoint would leave
    it: later checkpoints, the summary and the plots gone, later metrics records still there."""
    shutil.copytree(run, dst)
    for ck in (dst / "checkpoints").glob("step-*"):
        if int(ck.name.split("-")[1]) > step:
            shutil.rmtree(ck)
    (dst / "summary.json").unlink()
    shutil.rmtree(dst / "plots", ignore_errors=True)
    return dst


def copy_run(run: Path, dst: Path) -> Path:
    """A copy of the finished run ``run`` at ``dst`` that no process holds (its lock file left behind)."""
    shutil.copytree(run, dst)
    (dst / ".memlab.lock").unlink(missing_ok=True)
    return dst


def hold_folder(folder: Path, fresh: bool) -> subprocess.Popen:
    """Another process that claims ``folder`` (``fresh``: as a new run setting up, else as a resume) and keeps its lock
    for two minutes, as ``memlab train`` does while it writes; the caller kills it."""
    code = ("import sys, time; from memlab.rundir import claim; claim(sys.argv[1], fresh=sys.argv[2] == '1'); "
            "print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder), "1" if fresh else "0"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def write_config(path: Path, corpus: Path, **sections) -> Path:
    """Write a toy token-LM experiment config on ``corpus`` with section overrides."""
    import yaml

    cfg = {
        "name": "test",
        "recipe": "lm",
        "model": {"family": "token_lm", "preset": "toy"},
        "data": {"corpus": str(corpus), "vocab_size": 300, "seq_len": 32, "val_fraction": 0.1, "test_fraction": 0.1},
        "train": {"max_steps": 20, "batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "eval_every": 10,
                  "eval_batches": 2, "save_every": 10, "log_every": 1},
    }
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v) if isinstance(v, dict) else cfg.__setitem__(k, v)
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def tokenizer(small_corpus):
    """A 300-token byte-level BPE trained on the small corpus (probe tests)."""
    from memlab.data.corpus import load_corpus
    from memlab.data.tokenizer import train_bpe

    return train_bpe([d.text for d in load_corpus(str(small_corpus))], 300)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory, tokenizer):
    """A saved 2-layer, 32-wide random Llama causal LM with the probe tokenizer (probe tests)."""
    import torch
    import transformers as tf

    d = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=4, vocab_size=len(tokenizer),
                                       max_position_embeddings=48)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d
