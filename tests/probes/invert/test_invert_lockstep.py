"""The lockstep search (many chunks advanced together, ranked by the model's next-token distribution and the
gradient), the interleaved ranking, the kept first-position table's checks and the chunk log read back."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from memlab.probes.invert.chunklog import ChunkLog, read_chunks
from memlab.probes.invert.positions.firsttable import read_table, table_path, write_table
from memlab.probes.invert.positions.lockstep import Lockstep, LockstepOptions
from memlab.probes.invert.positions.rank import NextTokenHead, interleave
from memlab.probes.invert.report import chunk_result
from memlab.probes.invert.layer import LayerReader, select_rows
from test_invert import V, tiny

FAST = LockstepOptions(first_batch=4, batch_size=32, budget=96, exhaustive_batch=64, accept_gap=float("inf"))


def _tied(family: str, seed: int = 0):
    model = tiny(family, seed)
    model.config.tie_word_embeddings = True
    return model


def _run(reader, seqs, prefix, opts=FAST, **kw):
    states = [reader.full_states(torch.tensor([prefix + s]))[0, len(prefix):] for s in seqs]  # each (T_i, D)
    search = Lockstep(reader, opts)
    firsts = None if prefix else search.first.first_positions(prefix, torch.stack([t[0] for t in states]))
    return search, search.group(states, prefix, seqs, firsts, **kw)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "qwen3"])
@pytest.mark.parametrize("prefix", [[], [0]])
def test_group_recovers_chunks_of_several_lengths(family, prefix):
    reader = LayerReader(_tied(family), 2)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(1, V, (n,), generator=g).tolist() for n in (5, 2, 7)]
    finished = []
    search, got = _run(reader, seqs, prefix, on_chunk=lambda j, ps: finished.append((j, len(ps))))
    assert search.head is not None  # tied embeddings: the prior is read
    assert [[p.token for p in ps] for ps in got] == seqs
    assert all(p.certificate == "match" and p.gap >= 2 for ps in got for p in ps)
    assert finished == [(1, 2), (0, 5), (2, 7)]  # each chunk reported as it finishes, shortest first
    later = [p for ps in got for p in ps[(0 if prefix else 1):]]
    assert all(p.prior_rank is not None for p in later)
    assert all(p.grad_rank is not None for p in later if p.tried > FAST.first_batch)  # past the prior-only round
    assert all(p.found_at is not None and p.found_at <= p.tried for p in later)


def test_a_chunk_is_found_alike_alone_or_in_a_group():
    """The result of a chunk does not depend on the chunks beside it (a resumed run regroups them)."""
    reader = LayerReader(_tied("llama"), 2)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(1, V, (6,), generator=g).tolist() for _ in range(3)]
    _, together = _run(reader, seqs, [0])
    _, alone = _run(reader, seqs[1:2], [0])
    key = lambda ps: [(p.token, p.certificate, p.tried) for p in ps]  # noqa: E731
    assert key(together[1]) == key(alone[0])


def test_untied_head_falls_back_to_the_gradient():
    model = tiny("llama")
    model.config.tie_word_embeddings = False
    reader = LayerReader(model, 2)
    assert NextTokenHead.of(reader) is None
    seqs = [torch.randint(1, V, (5,), generator=torch.Generator().manual_seed(5)).tolist()]
    search, got = _run(reader, seqs, [0])
    assert search.head is None and [p.token for p in got[0]] == seqs[0]
    assert all(p.prior_rank is None for p in got[0])


def test_the_prior_ranks_the_model_own_greedy_text_first():
    """Text the model itself would write greedily is ranked first by the prior: one round per position."""
    reader = LayerReader(_tied("llama"), 3)  # the last block: the prior reads it too
    head = NextTokenHead.of(reader)
    ids = [0]
    for _ in range(6):  # the model's greedy continuation of the BOS
        h = head.top.full_states(torch.tensor([ids]))[0, -1]  # (D,)
        ids.append(int(head.logits(h[None])[0].argmax()))
    search, got = _run(reader, [ids[1:]], [0], opts=LockstepOptions(first_batch=1, accept_gap=float("inf")))
    assert [p.token for p in got[0]] == ids[1:]
    assert all(p.prior_rank == 0 and p.found_at == 1 for p in got[0])


def test_no_exhaustive_keeps_the_best_ranked_candidate():
    reader = LayerReader(_tied("llama"), 2)
    seqs = [torch.randint(1, V, (4,), generator=torch.Generator().manual_seed(6)).tolist()]
    opts = LockstepOptions(first_batch=2, batch_size=2, budget=4, exhaustive=False, accept_gap=float("inf"))
    _, got = _run(reader, seqs, [0], opts=opts)
    assert all(p.tried <= 4 and not p.exhaustive for p in got[0])
    assert all(p.certificate in ("match", "none") for p in got[0])


def test_interleave_takes_each_ranking_in_turn_without_repeats():
    tried = torch.zeros(10, dtype=torch.bool)
    tried[7] = True
    got = interleave([torch.tensor([7, 1, 2, 3]), torch.tensor([1, 4, 5, 6])], tried, 5)
    assert got.tolist() == [1, 4, 2, 5, 3]


def test_select_rows_leaves_the_cache_alone():
    reader = LayerReader(_tied("llama"), 2)
    cache = reader._new_cache()
    reader._run(reader.embed(torch.tensor([[1, 2, 3], [4, 5, 6]])), cache)  # two rows of three
    keys = cache.layers[0].keys.clone()
    sub = select_rows(cache, torch.tensor([1, 1, 0]), layers=2)
    assert sub.layers[0].keys.shape[0] == 3 and torch.equal(sub.layers[0].keys[2], keys[0])
    reader._run(reader.embed(torch.tensor([[7], [8], [9]])), sub)
    assert torch.equal(cache.layers[0].keys, keys)  # the group's cache is as it was


def test_kept_table_is_checked_when_read(tmp_path):
    table = torch.randn(7, 4)
    path = table_path(tmp_path, "model|2|[]")
    write_table(path, "model|2|[]", table)
    torch.testing.assert_close(read_table(path, "model|2|[]"), table)
    with pytest.warns(UserWarning, match="other weights"):
        assert read_table(path, "model|3|[]") is None
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF  # one byte of the states
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="damaged"):
        assert read_table(path, "model|2|[]") is None
    path.write_bytes(b"not a table")
    with pytest.warns(UserWarning, match="cannot be read"):
        assert read_table(path, "model|2|[]") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_table(tmp_path / "none.safetensors", "k") is None


def test_chunk_log_skips_a_line_cut_short(tmp_path):
    reader = LayerReader(_tied("llama"), 2)
    seqs = [torch.randint(1, V, (3,), generator=torch.Generator().manual_seed(7)).tolist() for _ in range(2)]
    _, got = _run(reader, seqs, [0])
    log = ChunkLog(tmp_path, total_tokens=6, total_chunks=2)
    for i, ps in enumerate(got):
        msg = log.add(chunk_result(i, "t", seqs[i], ps, str, 0.1), i + 1)
    assert "2/2 chunks, 6/6 units" in msg and "left" in msg
    with open(tmp_path / "chunks.jsonl", "a") as f:
        f.write(json.dumps({"index": 2, "text": "cut"})[:15])  # a kill in the middle of a line
    back = read_chunks(tmp_path)
    assert sorted(back) == [0, 1] and back[1].recovered_ids == seqs[1]
    assert (tmp_path / "log.txt").read_text().count("\n") == 2


@pytest.mark.parametrize("length", [24, pytest.param(512, marks=pytest.mark.slow)])
def test_a_long_chunk_in_passes_bounded_by_memory(length):
    """A long chunk (512 tokens, slow; 24 by default) comes back exactly while each verification pass copies at most
    a bounded share of its key-value cache (several passes a round)."""
    reader = LayerReader(_tied("llama"), 2)
    seq = torch.randint(1, V, (length,), generator=torch.Generator().manual_seed(8)).tolist()
    opts = LockstepOptions(first_batch=16, batch_size=64, exhaustive_batch=V, accept_gap=float("inf"),
                           pass_memory_mb=length / 500)  # about 8 candidate rows a pass
    search = Lockstep(reader, opts)
    states = reader.full_states(torch.tensor([[0] + seq]))[0, 1:]  # (T, D)
    cache = reader._new_cache()
    reader._run(reader.embed(torch.tensor([[0] + seq])), cache)
    assert 2 <= search._pass_rows(cache) < 16  # the bound splits a first round into several passes
    got = search.group([states], [0], [seq])[0]
    assert [p.token for p in got] == seq and all(p.certificate == "match" for p in got)


def test_fused_order_puts_the_token_every_ranking_likes_first():
    from memlab.probes.invert.positions.rank import fused

    a = torch.arange(10.0)  # token 0 first, token 1 second, token 9 last
    b = torch.arange(10.0).flip(0)  # token 9 first, token 0 last
    b[1], b[8] = 1.0, 8.0  # token 1 second here too
    assert int(fused([a, b]).argmin()) == 1  # second in both beats first in one and last in the other


def test_tokens_with_equal_states_are_not_certified():
    """Two tokens whose embedding rows are equal give equal states: the position keeps one of them, uncertified
    (a gap of 0 over 0 is no certificate), at the first position's table and further on."""
    model = _tied("llama")
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[7] = emb[5]  # token 7 is indistinguishable from token 5
    reader = LayerReader(model, 2)
    seqs = [[5, 3, 7, 9], [7, 2, 4, 6]]
    _, got = _run(reader, seqs, [])
    for seq, ps in zip(seqs, got):
        for t, p in zip(seq, ps):
            if t in (5, 7):  # at the first position (the table) and further on
                assert p.certificate == "none" and p.token in (5, 7)
            else:
                assert p.certificate == "match" and p.token == t
