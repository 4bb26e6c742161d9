"""The other caches memlab reads back, checked as checkpoints are (memlab.cachecheck): token files, sentence
embeddings, probe controls, the tokenizer and sentence caches under ``$MEMLAB_CACHE``. A damaged one is one warning
line naming it and a rebuild whose reading equals the undamaged one; a full disk while one is written is one line
naming its folder, with nothing left behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_cache_check import _encode, _full_disk, _ids, _resaved, _warnings

from memlab.errors import MemlabError

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------- token files
TEXTS = ["It is a truth universally acknowledged.", "She was the youngest of the two daughters."]


@pytest.mark.parametrize("damage", ["flip", "swap", "meta"])
def test_a_damaged_token_cache_is_named_and_written_again(tmp_path, tokenizer, capsys, damage):
    from memlab.data.stream import token_file

    path, dtype, n = token_file(iter(TEXTS), tokenizer, tmp_path / "t")
    want = np.fromfile(path, dtype=dtype)
    if damage == "flip":
        raw = bytearray(path.read_bytes())
        raw[3] ^= 1
        path.write_bytes(bytes(raw))
    elif damage == "swap":
        got = want.copy()
        got[[0, 5]] = got[[5, 0]]
        got.tofile(path)
    else:  # the description's count edited
        meta = json.loads((tmp_path / "t.json").read_text())
        meta["tokens"] -= 1
        (tmp_path / "t.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert token_file(iter(TEXTS), tokenizer, tmp_path / "t") == (path, dtype, n)
    (line,) = _warnings(capsys)
    assert f"token cache {tmp_path / 't.json'} is damaged" in line and line.endswith("rebuilding it")
    assert np.array_equal(np.fromfile(path, dtype=dtype), want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin", "t.json"]  # no lock, no temporary


def test_a_full_disk_while_token_files_are_written_names_the_caches_folder(tmp_path, tokenizer, monkeypatch):
    from memlab.data import stream

    monkeypatch.setattr(stream, "encode_stream", lambda *a: (_full_disk() for _ in [0]))
    folder = tmp_path / "tokens"
    with pytest.raises(MemlabError) as e:
        stream.token_file(iter(TEXTS), tokenizer, folder / "t")
    assert str(e.value) == f"could not write the token cache in {folder} (the disk is full)"
    assert list(folder.iterdir()) == []


# ---------------------------------------------------------------------------------------------- sentence embeddings
@pytest.mark.parametrize("damage", ["arrow", "meta", "nodigest"])
def test_a_damaged_sentence_embedding_cache_is_named_and_rebuilt(tmp_path, capsys, damage):
    from toy_spaces import SENTENCES, random_space

    from memlab.data import embcache

    docs, space = [SENTENCES[:4], SENTENCES[4:]], random_space()
    clean = embcache.build_or_load(space, "toy_ae", docs, "train", tmp_path, max_tokens=20)
    (folder,) = list(tmp_path.iterdir())
    meta = json.loads((folder / "meta.json").read_text())
    if damage == "arrow":  # two embeddings' numbers swapped inside the Arrow file (same size)
        arrow = next((folder / "data").glob("*.arrow"))
        raw = np.frombuffer(arrow.read_bytes(), dtype=np.uint8).copy()
        z = clean.embeddings.numpy().tobytes()
        at = raw.tobytes().find(z[:32])
        assert at > 0
        raw[at:at + 4], raw[at + 4:at + 8] = raw[at + 4:at + 8].copy(), raw[at:at + 4].copy()
        arrow.write_bytes(raw.tobytes())
    elif damage == "meta":
        meta["truncated_sentences"] += 1
        (folder / "meta.json").write_text(json.dumps(meta))
    else:
        del meta["files"], meta["digest"]
        (folder / "meta.json").write_text(json.dumps(meta))
    again = embcache.build_or_load(space, "toy_ae", docs, "train", tmp_path, max_tokens=20)
    (line,) = _warnings(capsys)
    assert f"embedding cache {folder} is damaged" in line and line.endswith("rebuilding it")
    assert torch.equal(again.embeddings, clean.embeddings) and again.meta == clean.meta
    with pytest.raises(MemlabError, match="is damaged"):  # a folder the user named is refused, not deleted
        (folder / "meta.json").write_text(json.dumps({**json.loads((folder / "meta.json").read_text()), "split": "x"}))
        embcache.build_or_load(space, "toy_ae", docs, "train", tmp_path, max_tokens=20, path=folder)
    assert folder.is_dir()


# ---------------------------------------------------------------------------------------------- probe controls
@pytest.mark.parametrize("damage", ["weights", "numbers"])
def test_a_damaged_control_entry_is_named_and_trained_again(tokenizer, small_corpus, tmp_path, capsys, damage):
    from test_probe_control_cache import _probe

    from memlab.probes.decoder import fit as train
    from memlab.probes.decoder.control_cache import FOLDER

    a = _probe(tokenizer, small_corpus, tmp_path)
    (entry,) = (tmp_path / FOLDER).iterdir()
    if damage == "weights":  # every weight of the control scaled, the file whole
        _resaved(entry / "control.safetensors", lambda t: [v.mul_(1.5) for v in t.values() if v.is_floating_point()])
    else:  # a number of the kept metrics edited
        info = json.loads((entry / "entry.json").read_text())
        text = json.dumps(info)
        key = '"ce": '
        at = text.index(key) + len(key)
        (entry / "entry.json").write_text(text[:at] + "0.5, \"was\": " + text[at:])
    capsys.readouterr()
    runs = []
    real = train.train_decoders
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "train_decoders", lambda *x, desc="", **k: runs.append(desc) or real(*x, desc=desc, **k))
        b = _probe(tokenizer, small_corpus, tmp_path)
    lines = _warnings(capsys)
    assert len(lines) == 1 and f"control cache {entry} is damaged" in lines[0] and "digest" in lines[0], lines
    assert any(d.startswith("control") for d in runs) and b["control_shared_with"] is None  # trained again
    assert b["readings"] == a["readings"]


@pytest.mark.parametrize("cache", ["safetensors", "sentence embeddings"])
def test_a_full_disk_while_any_cache_is_written_names_its_folder(tmp_path, monkeypatch, cache):
    folder = tmp_path / "cache"
    if cache == "safetensors":
        import safetensors.torch

        from memlab.data import chunkcache as cc

        monkeypatch.setattr(safetensors.torch, "save_file", _full_disk)
        write = lambda: cc.write_chunk_embeddings(folder / "emb-x.safetensors", _encode(_ids()), _ids())  # noqa: E731
    else:
        import datasets
        from toy_spaces import SENTENCES, random_space

        from memlab.data import embcache

        monkeypatch.setattr(datasets.Dataset, "save_to_disk", _full_disk)
        write = lambda: embcache.build_or_load(random_space(), "toy_ae", [SENTENCES[:3]], "train", folder)  # noqa: E731
    with pytest.raises(MemlabError) as e:
        write()
    assert str(e.value) == f"could not write the embedding cache in {folder} (the disk is full)"
    assert not folder.exists() or list(folder.iterdir()) == []
