"""The pooled search that gives the text back (propose, correct, certify) on tiny random models: a bidirectional
BERT as the encoder (mean pool), a causal llama as the proposer, each with its own word-level tokenizer over the
same words (different ids), so the proposal works in text and is re-tokenised for the encoder."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoConfig, AutoModel

from memlab.probes.invert.pooled.correct import CorrectOptions, correct
from memlab.probes.invert.pooled.searcher import LanguageHead, PooledOptions, PooledSearcher
from memlab.probes.invert.pooled.propose import ProposeOptions, Proposer
from memlab.probes.invert.pooled.recover import Recoverer
from memlab.probes.invert.layer import LayerReader

WORDS = [f"w{i}" for i in range(38)]  # + [UNK], [PAD]: 40 tokens
V, T = 40, 5
LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             tie_word_embeddings=True)
BERT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def word_tokenizer(shuffle: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(WORDS)
    random.Random(shuffle).shuffle(words)
    vocab = {"[UNK]": 0, "[PAD]": 1} | {w: i + 2 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def tiny(model_type: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return AutoModel.from_config(AutoConfig.for_model(model_type, vocab_size=V, **kw)).eval()


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    return PooledSearcher(LayerReader(tiny("bert", **BERT), 2), "mean", PooledOptions())


def chunks(n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, V, (n, T), generator=torch.Generator().manual_seed(seed))  # (n, T): no UNK, no PAD


def test_correction_recovers_a_tiny_chunk_exactly_and_certifies_it(encoder):
    """From a blank start, the corrected chunk's pooled state matches to float noise, the runner-up does not."""
    seqs = chunks(3, 1)
    rec = Recoverer(encoder, CorrectOptions(batch_size=64, topk=16), method="correct", forwards=6000, pad_id=1)
    exact = 0
    for i, true in enumerate(seqs):
        z = encoder.pooled(true[None])[0]  # (D,)
        got = rec.search(z, T, seed=i)
        assert got.forwards <= 6000 and got.start_distance > 0.05
        zz = encoder.pooled(torch.tensor([got.ids]))[0]
        assert abs(float((zz - z).norm() / z.norm()) - got.distance) < 1e-5  # the distance is the returned one's
        if got.ids == true.tolist():
            exact += 1
            assert got.distance < 1e-5 and got.runner_up > 100 * max(got.distance, 1e-7)  # certified, with a gap
    assert exact >= 2, exact


def test_correction_moves_fix_order(encoder):
    """A chunk given with two words swapped is put back in order by the moves alone (no swaps, no insertions)."""
    true = chunks(1, 7)[0]
    z = encoder.pooled(true[None])[0]
    start = true.clone()
    start[[0, 3]] = start[[3, 0]]
    opt = CorrectOptions(batch_size=32, move_share=1.0, insert_share=0.0, patience=20)
    got = correct(encoder, start, z, opt, forwards=2000)
    assert got.ids == true.tolist() and got.distance < 1e-5 and got.accepted["swap"] == 0


def test_budget_and_method_are_honoured(encoder):
    z = encoder.pooled(chunks(1, 3))[0]
    for f in (1, 10, 77):
        assert Recoverer(encoder, CorrectOptions(batch_size=16), method="correct", forwards=f,
                         pad_id=1).search(z, T).forwards <= f
    got = Recoverer(encoder, CorrectOptions(), method="correct", seconds=0.2, pad_id=1).search(z, T)
    assert got.seconds < 0.2 + 1.0
    with pytest.raises(ValueError, match="method must be one of"):
        Recoverer(encoder, CorrectOptions(), method="beam")


def test_proposer_works_in_text_and_retokenises_for_the_encoder(encoder):
    """The proposer's language model has its own tokenizer; the proposal is encoder ids of the chunk's length whose
    distance is the encoder's, and ``propose`` alone spends nothing on correction."""
    lm_tok, enc_tok = word_tokenizer(1), word_tokenizer(2)
    head = LanguageHead.of(LayerReader(tiny("llama", **LLAMA), 2))
    prop = Proposer(head, lm_tok, [], enc_tok, ProposeOptions(beams=4, branch=8))
    true = chunks(1, 4)
    z = encoder.pooled(true)[0]
    p = prop.propose(encoder, z, T)
    assert len(p.ids) == T and all(0 <= i < V for i in p.ids)
    assert enc_tok(p.text, add_special_tokens=False)["input_ids"][:T] == p.ids  # re-tokenised, not copied
    zz = encoder.pooled(torch.tensor([p.ids]))[0]
    assert abs(float((zz - z).norm() / z.norm()) - p.distance) < 1e-5
    short = prop.propose(encoder, z, T, forwards=10)  # one step's worth: finished greedily by the model
    assert len(short.ids) == T and short.forwards <= 10
    rec = Recoverer(encoder, CorrectOptions(), prop, method="propose", pad_id=1)
    got = rec.search(z, T)
    assert got.ids == p.ids and got.steps == 0 and got.proposal == p.text
    both = Recoverer(encoder, CorrectOptions(batch_size=32), prop, forwards=3000, pad_id=1).search(z, T)
    assert both.distance <= p.distance and both.steps > 0


def _cli(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


def test_cli_default_is_propose_correct_with_its_readings_and_control(capsys, tmp_path):
    """memlab-lm (causal, tied head) proposes for itself; the report has the certificate, exact text, BLEU and the
    control, whose readings are those of its ids against the TRUE chunk."""
    import json

    out = tmp_path / "run"
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--states", "mean", "--seq-len", "4", "--n", "2",
                     "--forwards", "300", "--batch-size", "16", "--threads", "1", "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    s = rep["search"]
    assert s["method"] == "propose-correct" and s["proposer"] == "memlab-lm" and s["budget_seconds"] > 0
    for c in rep["chunks"]:
        assert c["forwards"] <= 300 and c["proposal"] and c["certified"] == (c["distance"] <= s["tol"])
        true, ctrl = c["true_ids"], c["control_ids"]
        assert c["control_token_accuracy"] == sum(a == b for a, b in zip(ctrl, true)) / len(true)
        assert c["control_exact"] == (ctrl == true)
    for key in ("exact_text", "certified", "bleu", "token_f1_over_control", "control_bleu"):
        assert key in rep["totals"], key
    assert "BLEU" in cap.out and "certified" in cap.out and "propose-correct" in cap.out


@pytest.mark.parametrize("argv, says", [
    (["--method", "beam"], "--method takes propose-correct, relax-correct, propose, correct, relax or swap"),
    (["--gflops", "-1"], "--gflops must be >= 0"),
    (["--branch", "0"], "--branch must be >= 1"),
])
def test_cli_bad_pooled_setting_one_line(argv, says, capsys, tmp_path):
    out = tmp_path / "run"
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--states", "mean", *argv, "--out", str(out),
                     capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0], cap.err
    assert not out.exists()


def test_cli_proposer_that_is_not_causal_is_refused(capsys, tmp_path):
    from memlab import assets

    if not assets.is_installed("minilm"):
        pytest.skip("the minilm asset is not installed")
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--states", "mean", "--proposer", "minilm", "--n", "1",
                     "--seq-len", "4", "--out", str(tmp_path / "p"), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--proposer minilm" in lines[0], cap.err


@pytest.mark.parametrize("argv", [["--method", "correct"], ["--proposer", "none"]])
def test_cli_no_proposer_when_none_is_asked(argv, capsys, tmp_path):
    import json

    out = tmp_path / "run"
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", "--states", "last", "--seq-len", "4", "--n", "1",
                     "--forwards", "50", "--batch-size", "16", "--threads", "1", *argv, "--out", str(out),
                     capsys=capsys)
    assert code == 0, cap.err
    rep = json.loads((out / "report.json").read_text())
    assert rep["search"]["proposer"] is None and rep["chunks"][0]["proposal"] == ""
    assert rep["chunks"][0]["forwards"] <= 50


def test_edits_keep_the_length_and_do_what_they_say():
    from memlab.probes.invert.pooled.correct import apply, order_edits

    ids = [10, 11, 12, 13, 14, 15]
    assert apply(ids, ("swap", 2, 99)) == [10, 11, 99, 13, 14, 15]
    assert apply(ids, ("move", 1, 2, 3)) == [10, 13, 14, 11, 12, 15]  # block 11 12 put back after 14
    assert apply(ids, ("exchange", 0, 5)) == [15, 11, 12, 13, 14, 10]
    assert apply(ids, ("reverse", 2, 3)) == [10, 11, 14, 13, 12, 15]
    assert apply(ids, ("insert_delete", 1, 99, 4)) == [10, 99, 11, 12, 14, 15]
    results = [tuple(apply(ids, op)) for ops in order_edits(len(ids)).values() for op in ops]
    assert all(sorted(r) == ids and list(r) != ids for r in results)  # permutations that change the order
    assert len(set(results)) == len(results)  # each order reached by one edit
    assert (15, 11, 12, 13, 14, 10) in results and (10, 11, 12, 15, 13, 14) in results  # exchange, block move


def test_table_scores_are_the_estimate_they_define(encoder):
    """The token table's ranking of a swap is ``|r - c (U_v - U_cur)|^2`` with the best ``c >= 0``."""
    ids, true = chunks(1, 5)[0], chunks(1, 6)[0]
    z = encoder.pooled(true[None])[0]
    got = encoder.table_scores(ids, z)  # (T, V)
    u = encoder.token_table()
    r = z - encoder.pooled(ids[None])[0]
    for t, v in ((0, 3), (2, 17), (4, int(true[4]))):
        d = u[v] - u[ids[t]]
        c = max(float(r @ d) / float(d @ d), 0.0)
        assert abs(float(got[t, v]) - float((r - c * d).pow(2).sum())) < 1e-4 * max(1.0, float(r @ r))
    assert got.shape == (T, V) and torch.all(got <= r.pow(2).sum() + 1e-5)  # never worse than no change


@pytest.mark.parametrize("bf16", [True, False])
def test_screened_correction_reports_float32_distances(encoder, bf16):
    """With the bfloat16 screen the verified distances are float32's, and the budget counts the screen; where
    bf16 is not native the screen is skipped and every edit verified (both sides forced)."""
    from memlab.devices import pretend

    true = chunks(1, 9)[0]
    z = encoder.pooled(true[None])[0]
    start = chunks(1, 10)[0]
    with pretend(bf16=bf16):
        assert encoder.screens == bf16
        got = correct(encoder, start, z, CorrectOptions(batch_size=64, screen=8), forwards=1500)
    zz = encoder.pooled(torch.tensor([got.ids]))[0]
    assert abs(float((zz - z).norm() / z.norm()) - got.distance) < 1e-6
    assert got.forwards <= 1500 and got.distance < float((encoder.pooled(start[None])[0] - z).norm() / z.norm())
