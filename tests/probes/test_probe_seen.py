"""The report's ``text.targets.seen_in_training``: how often the training targets hold each held-out target token."""

import torch

from memlab.probes.chunks.batch import PAD
from memlab.probes.chunks.targets import SEEN_AT_LEAST, Targets
from memlab.probes.report.report import seen_line


def test_seen_in_training_counts_occurrences_by_hand():
    # token 3 occurs 6 times in training, token 4 once, token 5 never; PAD is not a token
    train = torch.tensor([[3, 3, 3, PAD], [3, 3, 3, 4]])
    held = torch.tensor([[3, 4, 5, PAD], [3, 3, PAD, PAD]])
    seen = Targets(tokenizer=None, train_ids=train, eval_ids=held, name="x").seen_in_training()
    assert list(seen) == [str(k) for k in SEEN_AT_LEAST]
    # held-out tokens: 3, 4, 5, 3, 3 -> at least once: 3,4,3,3 (4 of 5); at least 5 times: 3,3,3 (3 of 5)
    assert seen["1"] == 4 / 5 and seen["5"] == 3 / 5 and seen["20"] == 0.0
    # a held-out id beyond every training id counts as unseen, not as an index error
    far = Targets(None, train, torch.tensor([[40, 3]]), "x").seen_in_training()
    assert far["1"] == 0.5
    assert "80.0 % at least once" in seen_line(seen) and "60.0 % at least 5 times" in seen_line(seen)


def test_report_says_how_often_training_holds_the_targets(tmp_path):
    from memlab.probes.run import probe

    rep = probe(model="synthetic:concat", out=tmp_path / "p", n_train=48, n_eval=12, seq_len=8, epochs=1,
                hidden_size=16, num_layers=1, num_heads=2, batch_size=16, control=False, readouts=[],
                select_decoder=False, n_examples=0, progress=False).to_dict()
    seen = rep["text"]["targets"]["seen_in_training"]
    assert 0.0 < seen["20"] <= seen["5"] <= seen["1"] <= 1.0
    assert "seen_in_training" in rep["definitions"]


def test_chunk_texts_are_cut_once_per_process_for_the_same_options(monkeypatch):
    """Entries of one comparison read the same chunk texts: the second probe of the same options cuts nothing."""
    from memlab.paths import resource
    from memlab.probes.chunks import cut as chunks
    from memlab.probes.options import ProbeOptions
    from memlab.probes.encoders.synthetic import load_synthetic

    chunks._cut_by_name.cache_clear()
    calls = []
    real = chunks.cap_tokens
    monkeypatch.setattr(chunks, "cap_tokens", lambda *a, **k: calls.append(1) or real(*a, **k))
    tok = str(resource("checkpoints", "token_lm-toy"))
    opts = ProbeOptions(model="synthetic:concat", seq_len=8, n_train=30, n_eval=6, max_chunk_tokens=10,
                        chunk_tokenizer=tok)
    enc = load_synthetic("synthetic:concat", max_len=16)
    first = chunks._words_data(opts, enc)
    assert len(calls) == 2  # training and held-out texts
    second = chunks._words_data(opts, enc)
    assert len(calls) == 2 and second[2] == first[2] and second[3] == first[3]
    assert torch.equal(second[0], first[0])
    second[2].append("changed")  # a caller's list is its own
    assert chunks._words_data(opts, enc)[2] == first[2][:30] and len(first[2]) == 30
    chunks._words_data(ProbeOptions(**{**opts.__dict__, "seed": 1}), enc)  # other options: cut again
    assert len(calls) == 4
