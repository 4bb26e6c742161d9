"""Embedding caches written in pieces to memory-mapped files: a kill at any point resumes from the last finished
piece with the same content, storage dtypes halve the files, and reading maps rather than loads
(memlab.data.mmapcache)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from memlab.data.mmapcache import PieceCache, cached_embeddings

pytestmark = pytest.mark.usefixtures("one_thread")


def _ids(n: int, t: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 500, (n, t), generator=torch.Generator().manual_seed(seed))  # (N, T)


def _encode(ids: torch.Tensor) -> torch.Tensor:
    """A deterministic stand-in encoder: (b, T) -> (b, 5)."""
    x = ids.double()
    return torch.stack([x.sum(1), x.mean(1), x.max(1).values, torch.sin(x).sum(1), x[:, 0]], 1).float()  # (b, 5)


class Stop(Exception):
    pass


def test_a_write_stopped_mid_way_resumes_from_its_last_piece_with_equal_content(tmp_path, capsys):
    ids = _ids(103)
    whole, hit = cached_embeddings(tmp_path / "a" / "emb-x", ids, _encode, piece_rows=10)
    assert not hit and torch.equal(whole, _encode(ids))
    seen = []

    def failing(b):
        seen.append(b.shape[0])
        if len(seen) == 4:
            raise Stop  # mid-write: three pieces are in
        return _encode(b)

    stem = tmp_path / "b" / "emb-x"
    with pytest.raises(Stop):
        cached_embeddings(stem, ids, failing, piece_rows=10)
    part = PieceCache(stem)
    assert json.loads(part.part_meta.read_text())["done"] == 30 and not part.meta.exists()
    calls = []
    z, hit = cached_embeddings(stem, ids, lambda b: calls.append(b.clone()) or _encode(b), piece_rows=10)
    assert not hit and torch.equal(z, whole)
    assert torch.equal(torch.cat(calls), ids[30:])  # only the rows not yet written were computed
    assert "resuming at row 30 of 103" in capsys.readouterr().err
    z2, hit2 = cached_embeddings(stem, ids, lambda b: pytest.fail("a finished cache is read, not computed"))
    assert hit2 and torch.equal(z2, whole)
    assert sorted(p.name for p in stem.parent.iterdir()) == ["emb-x.float32.bin", "emb-x.float32.json"]  # no lock


WRITER = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {tests!r})
    from test_cache_scale import _encode, _ids
    from memlab.data.mmapcache import cached_embeddings

    def slow(b):
        time.sleep(0.05)
        return _encode(b)

    cached_embeddings({stem!r}, _ids(400), slow, piece_rows=8)
""")


def test_a_kill_9_mid_write_leaves_finished_pieces_and_the_run_resumes(tmp_path):
    stem = tmp_path / "emb-k"
    code = WRITER.format(tests=os.path.dirname(__file__), stem=str(stem))
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"})
    part = PieceCache(stem).part_meta
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if json.loads(part.read_text())["done"] >= 40:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = json.loads(part.read_text())["done"]
    assert 40 <= done < 400 and done % 8 == 0
    ids = _ids(400)
    calls = []
    z, hit = cached_embeddings(stem, ids, lambda b: calls.append(b.shape[0]) or _encode(b), piece_rows=8)
    assert not hit and sum(calls) == 400 - done
    assert torch.equal(z, _encode(ids))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_halves_the_file_and_reads_as_float32(tmp_path, dtype):
    ids = _ids(64)
    z32, _ = cached_embeddings(tmp_path / "emb-x", ids, _encode)
    z16, _ = cached_embeddings(tmp_path / "emb-x", ids, _encode, dtype=dtype)
    a, b = PieceCache(tmp_path / "emb-x"), PieceCache(tmp_path / "emb-x", dtype)
    assert b.bin.stat().st_size * 2 == a.bin.stat().st_size
    assert z16.dtype == torch.float32
    assert torch.equal(z16, _encode(ids).to(getattr(torch, dtype)).float())
    again, hit = cached_embeddings(tmp_path / "emb-x", ids, _encode, dtype=dtype)
    assert hit and torch.equal(again, z16)


def test_a_damaged_or_foreign_cache_is_named_and_rebuilt(tmp_path, capsys):
    ids = _ids(20)
    stem = tmp_path / "emb-x"
    cached_embeddings(stem, ids, _encode)
    PieceCache(stem).meta.write_text("{trunc")
    z, hit = cached_embeddings(stem, ids, _encode)
    assert not hit and torch.equal(z, _encode(ids)) and "is damaged" in capsys.readouterr().err
    other = _ids(20, seed=1)
    z, hit = cached_embeddings(stem, other, _encode)
    assert not hit and torch.equal(z, _encode(other)) and "holds other chunks" in capsys.readouterr().err


def test_a_finished_cache_is_mapped_not_loaded(tmp_path):
    n, d = 50_000, 512  # 100 MB of float32
    stem = tmp_path / "emb-big"
    cached_embeddings(stem, torch.zeros(n, 1, dtype=torch.long), lambda b: torch.ones(b.shape[0], d), piece_rows=8192)
    proc = psutil.Process()
    before = proc.memory_info().rss
    z, hit = cached_embeddings(stem, torch.zeros(n, 1, dtype=torch.long), lambda b: pytest.fail("computed"))
    assert hit and z.shape == (n, d)
    assert proc.memory_info().rss - before < 30 * 2**20  # nothing read yet
    assert float(z[n // 2].sum()) == d  # rows read as they are used
