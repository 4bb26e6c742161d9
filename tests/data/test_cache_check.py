"""Every cache memlab reads back is checked as a checkpoint is (memlab.cachecheck): bytes flipped, rows swapped or
scaled, the bytes of another dtype under a cache's name, a file cut short, are each one warning line naming the
cache, which is rebuilt, and the reading equals the undamaged one. A full disk while a cache is written is one
line naming the cache's folder, and nothing is left behind (no partial file, no lock)."""

from __future__ import annotations

import errno
import os
import json

import numpy as np
import pytest
import torch

from memlab import cachecheck
from memlab.data import mmapcache
from memlab.data.mmapcache import PieceCache, cached_embeddings
from memlab.errors import MemlabError

pytestmark = pytest.mark.usefixtures("one_thread")


def _ids(n: int = 40, t: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 500, (n, t), generator=torch.Generator().manual_seed(seed))  # (N, T)


def _encode(ids: torch.Tensor) -> torch.Tensor:
    """A deterministic stand-in encoder: (b, T) -> (b, 4)."""
    x = ids.double()
    return torch.stack([x.sum(1), x.mean(1) / 7, torch.sin(x).sum(1), x[:, 0] - 250], 1).float()  # (b, 4)


def _warnings(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memlab: warning:")]


def _rows(cache: PieceCache, n: int, d: int) -> np.memmap:
    return np.memmap(cache.bin, dtype=cache.np_dtype, mode="r+", shape=(n, d))


def _flip(cache, n, d):
    raw = bytearray(cache.bin.read_bytes())
    raw[len(raw) // 2] ^= 0x40  # one exponent bit of one number
    cache.bin.write_bytes(bytes(raw))


def _swap(cache, n, d):
    mm = _rows(cache, n, d)
    mm[[3, 17]] = mm[[17, 3]]
    mm.flush()


def _scale(cache, n, d):
    mm = _rows(cache, n, d)
    mm[5:9] = mm[5:9] * 1.5
    mm.flush()


def _truncate(cache, n, d):
    with open(cache.bin, "r+b") as f:
        f.truncate(cache.bin.stat().st_size - 8)


def _other_dtype(cache, n, d):
    """bfloat16 bytes of the same embeddings under the float16 cache's name (the same size)."""
    z = torch.from_numpy(np.array(_rows(cache, n, d))).float().to(torch.bfloat16)
    cache.bin.write_bytes(z.view(torch.uint16).numpy().tobytes())


def _edited_meta(cache, n, d):
    meta = json.loads(cache.meta.read_text())
    meta["pieces"][1][2] = meta["pieces"][0][2]
    cache.meta.write_text(json.dumps(meta))


@pytest.mark.parametrize("damage", [_flip, _swap, _scale, _truncate, _other_dtype, _edited_meta])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_damaged_embedding_cache_is_named_rebuilt_and_reads_as_the_undamaged_one(tmp_path, capsys, damage, dtype):
    if damage is _other_dtype and dtype != "float16":
        pytest.skip("the other dtype's bytes under a 16-bit cache's name")
    ids, stem = _ids(), tmp_path / "emb-x"
    clean, hit = cached_embeddings(stem, ids, _encode, dtype=dtype, piece_rows=16)
    assert not hit
    clean = clean.clone()
    cache = PieceCache(stem, dtype)
    damage(cache, *clean.shape)
    calls = []
    z, hit = cached_embeddings(stem, ids, lambda b: calls.append(b.shape[0]) or _encode(b), dtype=dtype,
                               piece_rows=16)
    lines = _warnings(capsys)
    assert not hit and sum(calls) == ids.shape[0], "a damaged cache is rebuilt, never read"
    assert len(lines) == 1 and str(cache.meta) in lines[0] and "is damaged" in lines[0], lines
    assert lines[0].endswith("rebuilding it")
    assert torch.equal(z, clean)
    again, hit = cached_embeddings(stem, ids, lambda b: pytest.fail("the rebuilt cache is read"), dtype=dtype)
    assert hit and torch.equal(again, clean) and not _warnings(capsys)


def test_a_cache_of_another_dtype_or_key_renamed_to_this_name_is_not_read(tmp_path, capsys):
    ids = _ids()
    cached_embeddings(tmp_path / "emb-x", ids, _encode, dtype="bfloat16")
    clean16, _ = cached_embeddings(tmp_path / "emb-y", ids, _encode, dtype="float16")
    clean16 = clean16.clone()
    bf, f16 = PieceCache(tmp_path / "emb-x", "bfloat16"), PieceCache(tmp_path / "emb-y", "float16")
    meta = json.loads(bf.meta.read_text())
    meta.update(dtype="float16", key="emb-y")  # its description edited to pass for the float16 cache
    f16.meta.write_text(json.dumps(meta))
    f16.bin.write_bytes(bf.bin.read_bytes())
    z, hit = cached_embeddings(tmp_path / "emb-y", ids, _encode, dtype="float16")
    assert not hit and torch.equal(z, clean16) and "do not match their digest" in _warnings(capsys)[0]


def test_a_damaged_partial_cache_is_not_resumed(tmp_path, capsys):
    ids, stem = _ids(50), tmp_path / "emb-x"
    clean = _encode(ids)

    def stop_at_third(b, seen=[]):
        seen.append(1)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return _encode(b)

    with pytest.raises(KeyboardInterrupt):
        cached_embeddings(stem, ids, stop_at_third, piece_rows=10)
    cache = PieceCache(stem)
    mm = np.memmap(cache.part, dtype=np.float32, mode="r+", shape=(50, 4))
    mm[4] = 0  # a row already marked done
    mm.flush()
    calls = []
    z, _ = cached_embeddings(stem, ids, lambda b: calls.append(b.shape[0]) or _encode(b), piece_rows=10)
    assert sum(calls) == 50 and torch.equal(z, clean)
    lines = _warnings(capsys)
    assert len(lines) == 1 and str(cache.part_meta) in lines[0] and "rows 0-10 do not match" in lines[0]


def test_a_cache_without_digests_is_rebuilt_once(tmp_path, capsys):
    ids, stem = _ids(), tmp_path / "emb-x"
    cached_embeddings(stem, ids, _encode)
    cache = PieceCache(stem)
    meta = json.loads(cache.meta.read_text())
    del meta["pieces"]  # as an earlier memlab wrote it
    cache.meta.write_text(json.dumps(meta))
    z, hit = cached_embeddings(stem, ids, _encode)
    assert not hit and "earlier memlab" in _warnings(capsys)[0] and torch.equal(z, _encode(ids))
    assert cached_embeddings(stem, ids, _encode)[1] and not _warnings(capsys)


def _full_disk(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("when", ["reserve", "piece"])
def test_a_full_disk_names_the_caches_folder_and_leaves_nothing(tmp_path, monkeypatch, when):
    folder = tmp_path / "cache"
    if when == "reserve":  # the file laid out before it is mapped: no bus error in a mapped write
        monkeypatch.setattr(mmapcache, "reserve", _full_disk)
    else:  # a piece's progress mark

        real = PieceCache._mark

        def mark(self, *a):
            if a[3] >= 20:
                _full_disk()
            return real(self, *a)

        monkeypatch.setattr(PieceCache, "_mark", mark)
    with pytest.raises(MemlabError) as e:
        cached_embeddings(folder / "emb-x", _ids(), _encode, piece_rows=10)
    assert str(e.value) == (f"could not write the embedding cache in {folder} (the disk is full); nothing of it "
                            "was kept")
    assert list(folder.iterdir()) == []  # no .part, no .part.json, no temporary, no lock


def test_the_lock_is_removed_and_taken_again_by_a_waiting_process(tmp_path):
    lock = tmp_path / "x.lock"
    with cachecheck.locked(lock):
        assert lock.exists()
    assert not lock.exists()
    with cachecheck.locked(lock), cachecheck.locked(tmp_path / "y.lock"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_reserve_allocates_the_whole_file(tmp_path):
    with open(tmp_path / "f", "wb") as f:
        cachecheck.reserve(f.fileno(), 1 << 20)
    st = (tmp_path / "f").stat()
    assert st.st_size == 1 << 20 and st.st_blocks * 512 >= 1 << 20  # allocated, not sparse


def test_digests_bind_the_bytes_to_what_made_them():
    a = np.arange(12, dtype=np.float32)
    d = cachecheck.digest({"dtype": "float32"}, a)
    assert cachecheck.matches(d, {"dtype": "float32"}, a.tobytes())
    assert not cachecheck.matches(d, {"dtype": "float16"}, a)
    assert not cachecheck.matches(d, {"dtype": "float32"}, a[::-1].copy())
    assert not cachecheck.matches("md5:00", {"dtype": "float32"}, a) and not cachecheck.matches(None, {}, a)
    rec = cachecheck.seal({"n": 3, "shape": (2, 4)})
    assert cachecheck.sealed(json.loads(json.dumps(rec)))
    assert not cachecheck.sealed({**rec, "n": 4})


# ---------------------------------------------------------------------------------------------- safetensors form
def _resaved(path, change):
    """The file at ``path`` saved again with its tensors changed by ``change`` and its metadata (digest) kept."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    change(tensors)
    save_file(tensors, str(path), meta)


@pytest.mark.parametrize("change", ["swap", "scale", "nodigest"])
def test_the_safetensors_cache_is_checked_and_a_damaged_one_removed(tmp_path, capsys, change):
    from memlab.data import chunkcache as cc
    from memlab.probes.encoders.encode import content_hash

    ids, key = _ids(), {"model": "m"}
    z = _encode(ids)
    path = tmp_path / f"emb-{content_hash(key, ids)[:20]}.safetensors"
    cc.write_chunk_embeddings(path, z, ids)
    assert torch.equal(cc.read_chunk_embeddings(path, ids), z)
    if change == "nodigest":
        from safetensors.torch import save_file

        save_file({"z": z, "ids": ids}, str(path))  # as an earlier memlab wrote it
    else:
        _resaved(path, lambda t: t["z"].__setitem__(slice(2, 4), t["z"][[3, 2]] * (1.5 if change == "scale" else 1)))
    assert cc.read_chunk_embeddings(path, ids) is None
    (line,) = _warnings(capsys)
    assert str(path) in line and "is damaged" in line and line.endswith("rebuilding it")
    assert not path.exists()  # removed: rebuilt in the memory-mapped form, said once


def test_a_probe_on_a_damaged_cache_reads_as_on_the_undamaged_one(tiny_llama, small_corpus, tmp_path, capsys):
    from memlab.probes.run import load_options, run_probe

    tiny = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=6", "n_train=64",
            "n_eval=16", "epochs=1", "n_examples=2"]

    def probe():
        return run_probe(load_options(None, tiny, model=str(tiny_llama), corpus=str(small_corpus), control=False,
                                      cache_dir=str(tmp_path)))

    clean = probe()
    capsys.readouterr()
    for meta in tmp_path.glob("emb-*.float32.json"):  # rows swapped and scaled in both caches
        n, d = json.loads(meta.read_text())["n"], json.loads(meta.read_text())["dim"]
        cache = PieceCache(meta.parent / meta.name.split(".")[0])
        mm = _rows(cache, n, d)
        mm[[0, 1]] = mm[[1, 0]] * 1.25
        mm.flush()
        del mm
    again = probe()
    lines = _warnings(capsys)
    assert len(lines) == 2 and all("do not match their digest" in ln for ln in lines), lines
    assert not again["timing"]["encode_cached"] and again["probe"] == clean["probe"]


def test_a_full_cache_disk_under_a_probe_names_the_cache_not_the_run(tiny_llama, small_corpus, tmp_path, capsys,
                                                                     monkeypatch):
    from memlab.app.cli import main

    monkeypatch.setattr(mmapcache, "reserve", _full_disk)
    cache, out = tmp_path / "cache", tmp_path / "runs" / "x"
    rc = main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--cache-dir", str(cache),
               "--out", str(out), "--seq-len", "6", "--n-train", "64", "--n-eval", "16", "--epochs", "1",
               "--no-control"])
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memlab: error:")]
    assert rc == 2 and errors == [f"memlab: error: could not write the embedding cache in {cache} (the disk is "
                                  "full); nothing of it was kept"], errors
    assert not out.exists() and list(cache.iterdir()) == []


# ---------------------------------------------------------------------------------------------- other caches
def test_a_damaged_tokenizer_cache_is_named_and_rebuilt(tmp_path, monkeypatch, capsys):
    from memlab.data.tokenizer import train_bpe

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    texts = ["It is a truth universally acknowledged, that a single man in possession of a good fortune."] * 20
    clean = train_bpe(texts, 300)
    (folder,) = (tmp_path / "tokenizers").iterdir()
    vocab = json.loads((folder / "tokenizer.json").read_text())
    merges = vocab["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]  # two merges swapped: a valid file that tokenizes otherwise
    (folder / "tokenizer.json").write_text(json.dumps(vocab))
    again = train_bpe(texts, 300)
    (line,) = _warnings(capsys)
    assert f"tokenizer cache {folder} is damaged" in line and line.endswith("rebuilding it")
    assert again.get_vocab() == clean.get_vocab() and again(texts[0])["input_ids"] == clean(texts[0])["input_ids"]
    assert train_bpe(texts, 300).get_vocab() == clean.get_vocab() and not _warnings(capsys)


def test_a_damaged_sentence_cache_is_named_and_rebuilt(tmp_path, monkeypatch, capsys, small_corpus):
    from conftest import write_config

    from memlab.config import load_config
    from memlab.models.sentence.recipe import SentenceOptions, corpus_documents

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    cfg = load_config(write_config(tmp_path / "c.yaml", small_corpus))
    clean = corpus_documents(cfg, SentenceOptions())
    (cached,) = (tmp_path / "cache" / "sentences").iterdir()
    got = json.loads(cached.read_text())
    split = next(iter(got["docs"]))
    got["docs"][split][0], got["docs"][split][1] = got["docs"][split][1], got["docs"][split][0]  # documents swapped
    cached.write_text(json.dumps(got))
    assert corpus_documents(cfg, SentenceOptions()) == clean
    (line,) = _warnings(capsys)
    assert f"sentence cache {cached} is damaged" in line and line.endswith("rebuilding it")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_really_full_disk_is_one_line_not_a_bus_error(tmp_path):
    """A 256 KiB tmpfs and a 4 MB cache: the space is reserved before the file is mapped, so the full disk is an
    OSError reported in one line (a sparse file mapped and written would die of SIGBUS, exit 135)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(MemlabError, match=f"could not write the embedding cache in {disk / 'c'} \\(the disk is full"):
            cached_embeddings(disk / "c" / "emb-x", torch.zeros(4000, 1, dtype=torch.long),
                              lambda b: torch.ones(b.shape[0], 256), piece_rows=500)
        assert list((disk / "c").iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
