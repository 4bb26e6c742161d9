"""The probe's embedding cache on disk: a large one written as shards with an index (memlab.data.chunkcache)
reads back bit for bit and gives the same probe reading; a missing, truncated or foreign shard or index is
named in one warning line and the cache rebuilt."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import memlab.data.chunkcache as cc
from memlab.probes.run import load_options, run_probe

TINY = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=6", "n_train=64", "n_eval=16",
        "epochs=1", "n_examples=2"]
pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int = 50, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(3, 300, (n, 6), generator=g)  # (N, D), (N, T)


def _row_bytes(z, ids) -> int:
    return z[0].numel() * z.element_size() + ids[0].numel() * ids.element_size()


def _warnings(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def test_a_large_cache_is_written_as_shards_and_read_back_bit_for_bit(tmp_path, monkeypatch):
    z, ids = _data()
    one = tmp_path / "one" / "emb-x.safetensors"
    cc.write_chunk_embeddings(one, z, ids)  # the default shard size: one file, as before
    assert sorted(p.name for p in one.parent.iterdir()) == ["emb-x.safetensors"]
    monkeypatch.setattr(cc, "SHARD_BYTES", 12 * _row_bytes(z, ids))  # 12 rows a shard: 5 shards
    path = tmp_path / "sharded" / "emb-x.safetensors"
    cc.write_chunk_embeddings(path, z, ids)
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == sorted(["emb-x.index.json"] + [f"emb-x-{i:05d}-of-00005.safetensors" for i in range(1, 6)])
    info = json.loads(cc.index_path(path).read_text())
    assert info["z_shape"] == [50, 8] and info["ids_shape"] == [50, 6] and info["z_dtype"] == "float32"
    assert [s["rows"] for s in info["shards"]] == [[0, 12], [12, 24], [24, 36], [36, 48], [48, 50]]
    assert info["chunks"] == cc.chunks_fingerprint(ids)
    a, b = cc.read_chunk_embeddings(one, ids), cc.read_chunk_embeddings(path, ids)
    assert torch.equal(a, z) and torch.equal(b, z) and b.dtype == z.dtype
    # written again at a larger shard size: 2 shards, the 5 old ones gone; then small enough for one file
    monkeypatch.setattr(cc, "SHARD_BYTES", 25 * _row_bytes(z, ids))
    cc.write_chunk_embeddings(path, z, ids)
    assert len(list(path.parent.glob("emb-x-*-of-00002.safetensors"))) == 2 and len(list(path.parent.iterdir())) == 3
    monkeypatch.setattr(cc, "SHARD_BYTES", 1 << 30)
    cc.write_chunk_embeddings(path, z, ids)
    assert sorted(p.name for p in path.parent.iterdir()) == ["emb-x.safetensors"]  # the shards gone too
    assert torch.equal(cc.read_chunk_embeddings(path, ids), z)


@pytest.mark.parametrize("damage,says", [
    ("truncate", "is damaged (shard emb-x-00003-of-00005.safetensors:"),
    ("remove", "is damaged (shard emb-x-00003-of-00005.safetensors: missing)"),
    ("foreign", "holds other chunks (shard emb-x-00003-of-00005.safetensors:"),
    ("index", "is damaged ("),
])
def test_a_damaged_or_foreign_shard_is_named_in_one_line(tmp_path, monkeypatch, capsys, damage, says):
    z, ids = _data()
    monkeypatch.setattr(cc, "SHARD_BYTES", 12 * _row_bytes(z, ids))
    path = tmp_path / "emb-x.safetensors"
    cc.write_chunk_embeddings(path, z, ids)
    shard = tmp_path / "emb-x-00003-of-00005.safetensors"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "remove":
        shard.unlink()
    elif damage == "foreign":
        other_z, other_ids = _data(seed=1)
        cc.write_chunk_embeddings(tmp_path / "other" / "emb-y.safetensors", other_z, other_ids)
        shutil.copy(tmp_path / "other" / "emb-y-00003-of-00005.safetensors", shard)
    else:
        index = cc.index_path(path)
        index.write_text(index.read_text()[:40])
    capsys.readouterr()
    assert cc.read_chunk_embeddings(path, ids) is None
    (line,) = _warnings(capsys)
    assert line.startswith(f"memlab: warning: embedding cache {cc.index_path(path)} ") and says in line, line
    assert line.endswith("; rebuilding it")
    cc.write_chunk_embeddings(path, z, ids)  # what cached_encode does next: whole again
    assert torch.equal(cc.read_chunk_embeddings(path, ids), z) and not _warnings(capsys)
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def test_a_cache_in_pieces_gives_the_same_probe_reading(tiny_llama, small_corpus,
                                                        tmp_path, monkeypatch):
    import memlab.data.mmapcache as mc

    def probe(cache, **kw):
        return run_probe(load_options(None, TINY, model=str(tiny_llama), corpus=str(small_corpus), control=False,
                                      cache_dir=str(cache), **kw))

    plain = probe(tmp_path / "plain")
    assert sorted(p.name.split(".", 1)[1] for p in (tmp_path / "plain").glob("emb-*")) == \
        ["float32.bin", "float32.bin", "float32.json", "float32.json"]  # no lock left
    monkeypatch.setattr(mc, "PIECE_BYTES", 1024)  # the 64 training chunks' embeddings: several pieces
    first, again = probe(tmp_path / "pieces"), probe(tmp_path / "pieces")
    assert not first["timing"]["encode_cached"] and again["timing"]["encode_cached"]
    assert again["probe"] == first["probe"]  # a first run reads its embeddings back as a cached run does
    # encoded a piece at a time, the padding-masked encoder's batches differ from one pass's: float noise only
    assert first["probe"]["ce"] == pytest.approx(plain["probe"]["ce"], rel=1e-4)
    half = probe(tmp_path / "half", cache_dtype="bfloat16")
    assert probe(tmp_path / "half", cache_dtype="bfloat16")["probe"] == half["probe"]  # first run reads as cached


def test_a_cache_of_the_earlier_safetensors_form_is_still_read(tmp_path):
    from memlab.probes.encoders.encode import cached_encode, content_hash

    z, ids = _data()
    key = {"model": "m"}
    cc.write_chunk_embeddings(tmp_path / f"emb-{content_hash(key, ids)[:20]}.safetensors", z, ids)
    got, hit = cached_encode(None, ids, key, str(tmp_path))  # no encoder: it must not be called
    assert hit and torch.equal(got, z)

