"""Free-running token accuracy: the greedy reconstruction's positional accuracy, beside the teacher-forced one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from memlab.probes.chunks.batch import PAD
from memlab.probes.decoder.model import CompactVocab
from memlab.probes.readings import (ChunkScores, Reading, free_running_accuracy, free_running_hits, readings,
                                    reconstruction_scores)
from memlab.probes.decoder.fit import evaluate

V, T, START = 12, 6, 0


def test_free_running_hits_count_positions_of_real_tokens():
    true = torch.tensor([[3, 4, 5, PAD], [7, 8, 9, 10]])  # 3 + 4 real tokens
    pred = torch.tensor([[3, 5, 5, 5], [8, 8, 9, 1]])  # row 0: positions 0 and 2; row 1: positions 1 and 2
    assert free_running_hits(pred, true) == [2, 2]
    assert free_running_accuracy(pred, true) == pytest.approx(4 / 7)
    assert free_running_accuracy(true.clamp(min=0), true) == 1.0


class NextIsPlusOne(CompactVocab, nn.Module):
    """Writes ``input + 1`` at every position: under teacher forcing it is right wherever the chunk counts up, but
    from the start token it writes ``START + 1`` first and every later token follows its own wrong one."""

    incremental_decoding = False

    def __init__(self):
        nn.Module.__init__(self)
        self.config = SimpleNamespace(vocab_size=V, start_id=START, repeat_penalty=0.0, inputs="teacher")
        self._init_vocab(range(V), START, V)
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the decoder a device

    def forward(self, z, ids):  # (B, D), (B, T) -> (B, T, V)
        return torch.nn.functional.one_hot((ids + 1) % V, V).float() * 20.0


def test_perfect_under_teacher_forcing_but_wrong_when_free_reads_high_then_low():
    dec = NextIsPlusOne()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [3, 4, 5, 6, 7, 8], [4, 5, 6, 7, PAD, PAD]])  # (3, T) each counts up
    z = torch.zeros(ids.shape[0], 4)
    teacher = evaluate(dec, z, ids)
    free = reconstruction_scores(dec, z, ids, tokenizer=_Tok(), scorers=[])
    n = int((ids >= 0).sum())
    assert teacher["token_accuracy"] == pytest.approx((n - 3) / n)  # only each chunk's first token is missed
    assert free.metrics["free_running_accuracy"] == 0.0  # it writes 1, 2, 3, ... and never meets the chunk
    assert free.free_hits == [0, 0, 0]
    scores = teacher.with_reconstruction(free)
    assert scores.chunks.free_hits == [0, 0, 0] and scores["free_running_accuracy"] == 0.0
    assert scores.chunks.nll is teacher.chunks.nll and scores["ce"] == teacher["ce"]
    read = readings(scores.chunks, None, [10, 10, 10], n_resamples=50)
    assert read["token_accuracy"].value > 0.8 and read["free_running_accuracy"] == Reading(0.0, 0.0, 0.0)


def test_free_running_gain_is_paired_over_the_control():
    def per(free):
        return ChunkScores(nll=[1.0, 2.0, 3.0, 4.0], hits=[1, 1, 1, 1], tokens=[4, 4, 4, 4], free_hits=free)

    read = readings(per([4, 3, 2, 4]), per([1, 1, 2, 0]), [10] * 4, n_resamples=200)
    assert read["free_running_accuracy"].value == pytest.approx(13 / 16)
    gain = read["free_running_accuracy_gain"]
    assert gain.value == pytest.approx(9 / 16) and 0 < gain.low <= gain.value <= gain.high
    assert "free_running_accuracy_gain" not in readings(per([4, 3, 2, 4]), per(None), [10] * 4, n_resamples=20)


class _Tok:
    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, r)) for r in rows]
