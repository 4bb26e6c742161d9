"""The report's ``text.targets.seen_in_training``: how often the training targets hold each held-out target token."""

import torch

from memlab.probes.chunks import PAD
from memlab.probes.report import seen_line
from memlab.probes.targets import SEEN_AT_LEAST, Targets


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
    from memlab.probes.inversion import probe

    rep = probe(model="synthetic:concat", out=tmp_path / "p", n_train=48, n_eval=12, seq_len=8, epochs=1,
                hidden_size=16, num_layers=1, num_heads=2, batch_size=16, control=False, readouts=[],
                select_decoder=False, n_examples=0, progress=False).to_dict()
    seen = rep["text"]["targets"]["seen_in_training"]
    assert 0.0 < seen["20"] <= seen["5"] <= seen["1"] <= 1.0
    assert "seen_in_training" in rep["definitions"]
