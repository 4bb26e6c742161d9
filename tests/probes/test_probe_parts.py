"""The probe's parts: every registered part meets its kind's contract, and parts from outside the tree
(tests/plugins/probe_parts: a pooling, an encoder kind, a read-out, a scorer) plug in by one registration each."""

from __future__ import annotations

import json
import re

import pytest
import torch

from memlab.app.cli import main
from memlab.probes.decoder.model import ProbeDecoderConfig
from memlab.probes.parts import KINDS, PARTS, ReadoutContext, encoder_kind, takes_context
from memlab.probes.kinds import Conditioning, DecoderKind, EncoderKind

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def plugin():
    import tests.plugins.probe_parts as plugin  # noqa: F401  (registers its parts)

    return plugin


def check_part_contract(kind: str, name: str, decoder_source: str | None = None) -> None:
    """Call a registered part as its kind's contract says (memlab.probes.parts) and check what comes back
    (``decoder_source``: the argument of a decoder that takes one, a causal LM folder)."""
    part = PARTS[kind].get(name)
    assert part.name == name and all(isinstance(o, str) for o in part.option_names)
    g = torch.Generator().manual_seed(0)
    if kind == "encoder":
        assert isinstance(part.impl, EncoderKind) and callable(part.impl.load)
        assert isinstance(part.impl.takes("synthetic:concat"), bool)
    elif kind == "pool":
        h, mask = torch.randn(3, 5, 4, generator=g), torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
        out = part.impl(h, mask)
        assert out.shape == (3, 4)
        moved = h.clone()
        moved[1, 2:], moved[2, 1:] = 99.0, -99.0  # padded states must not count
        assert torch.allclose(part.impl(moved, mask)[1:], out[1:])
    elif kind == "conditioning":
        cfg = ProbeDecoderConfig(max_len=6, prefix_len=2, hidden_size=8, conditioning=name)
        assert isinstance(part.impl, Conditioning)
        n, off = part.impl.vectors(cfg), part.impl.offset(cfg)
        x, cond = torch.randn(2, 6, 8, generator=g), torch.randn(2, n, 8, generator=g)
        joined = part.impl.join(x, cond)
        assert joined.shape[0] == 2 and joined.shape[2] == 8 and joined.shape[1] - off == 6
    elif kind == "inputs":
        cfg = ProbeDecoderConfig(start_id=1, input_dropout=0.5)
        ids = torch.randint(2, 50, (4, 7), generator=g)
        for training in (True, False):
            out = part.impl(ids, cfg, training)
            assert out.shape == ids.shape and out.dtype == ids.dtype
            assert bool(((out == ids) | (out == 1)).all())  # a true token or the start token
    elif kind == "decoder":
        cfg = ProbeDecoderConfig(embed_dim=6, vocab_size=40, kept_ids=list(range(20)), hidden_size=16, num_layers=1,
                                 num_heads=2, max_len=5)
        if isinstance(part.impl, DecoderKind):  # decoder=NAME:ARG with its own tokenizer (of at least 40 tokens)
            assert len(part.impl.tokenizer(decoder_source)) >= 40 and part.argument
            dec = part.impl.build(cfg, decoder_source, {})
        else:
            dec = part.impl(cfg)
        logits = dec(torch.randn(3, 6, generator=g), torch.randint(0, 40, (3, 5), generator=g))
        assert logits.shape[:2] == (3, 5)
        assert torch.allclose(dec.full_log_probs(logits).exp().sum(-1), torch.ones(3, 5), atol=1e-4)
    elif kind == "readout":
        ids = torch.randint(0, 30, (40, 6), generator=g)
        ids[::3, 4:] = -1  # padded chunks
        z = torch.nn.functional.one_hot(ids.clamp(min=0), 30).float().sum(1)  # (40, 30)
        kw = {}
        if takes_context(part.impl):  # a read-out of text gets the chunks' texts (here one word per token id)
            texts = [" ".join(f"w{t}" for t in row if t >= 0) for row in ids.tolist()]
            kw["context"] = ReadoutContext(texts[:30], texts[30:], dim=30)
        out = part.impl(z[:30], ids[:30], z[30:], ids[30:], seed=0, device="cpu", **kw)
        assert 0 <= out["recovered"] <= 1 and 0 <= out["prior"] <= 1
        assert out["gain"] == pytest.approx(out["recovered"] - out["prior"])
        assert len(out["_per_chunk"]["recovered"]) == len(out["_per_chunk"]["prior"]) == 10
    elif kind == "scorer":
        true = torch.randint(0, 30, (6, 5), generator=g)
        text = [" ".join(map(str, r)) for r in true.tolist()]
        assert part.impl(true, true, text, text) == pytest.approx(1.0)  # a whole reconstruction scores 1
        worse = part.impl(torch.full_like(true, 31), true, ["x"] * 6, text)
        assert 0.0 <= worse < 1.0


@pytest.mark.parametrize("kind", KINDS)
def test_every_registered_part_meets_its_contract(kind, plugin, tiny_llama):
    names = PARTS[kind].names()
    assert names
    for name in names:
        check_part_contract(kind, name, decoder_source=str(tiny_llama))


def test_parts_from_outside_the_tree_plug_in(plugin, tiny_llama, tokenizer, small_corpus, tmp_path):
    assert encoder_kind("onehot:x").name == "onehot" and encoder_kind("synthetic:bag").name == "synthetic"
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    out = tmp_path / "run"
    base = ["--corpus", str(small_corpus), "hidden_size=32", "num_heads=4", "num_layers=1", "n_train=96", "n_eval=16",
            "seq_len=4", "epochs=3", "n_examples=1"]
    assert main(["probe", "--model", f"onehot:{tok_dir}", "--out", str(out), *base,
                 "scorers=[token_set_f1,first_token_match]", "readouts=[bow,prior]"]) == 0
    rep = json.loads((out / "report.json").read_text())
    p, c = rep["probe"], rep["control"]
    assert "first_token_match" in p and "sentence_bleu" not in p  # the chosen scorers, and only those
    # the oracle's first token, where the held-back chunks show it is read (else the probe is its control)
    assert p["accuracy_by_position"][0] >= c["accuracy_by_position"][0]
    assert set(rep["readouts"]) == {"bow", "prior"} and rep["readouts"]["prior"]["gain"] == 0.0
    assert rep["encoder"]["name"] == f"onehot:{tok_dir}"
    pooled = tmp_path / "pooled"
    assert main(["probe", "--model", str(tiny_llama), "--pool", "max", "--out", str(pooled), *base, "--no-control"]) == 0
    assert json.loads((pooled / "report.json").read_text())["encoder"]["pool"] == "max"


OWN = {"onehot_value": 2.0, "repeat_vectors": 3, "blank_every": 3, "narrow_width": 8, "prior_min_chunks": 2,
       "match_position": 1}
"""An option of each outside part the probe below chooses, each away from its default."""


def test_every_kind_of_part_from_outside_the_tree_runs_with_its_own_option(plugin, tiny_llama, tokenizer,
                                                                           small_corpus, tmp_path, capsys):
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    base = ["--corpus", str(small_corpus), "n_eval=8", "seq_len=4", "epochs=1", "n_examples=1", "ci_resamples=50"]
    chosen = ["conditioning=repeat", "inputs=every_other", "decoder=narrow", "readouts=[prior]",
              "scorers=[first_token_match]", *(f"{k}={v}" for k, v in OWN.items())]
    out = tmp_path / "run"
    assert main(["probe", "--model", f"onehot:{tok_dir}", "--out", str(out), "--n-train", "48", *base, *chosen]) == 0
    printed = capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    assert rep["options"]["part_options"] == OWN
    assert rep["encoder"]["value"] == 2.0  # the encoder kind read its option
    d = rep["decoder"]
    assert (d["kind"], d["conditioning"], d["inputs"]) == ("narrow", "repeat", "every_other")
    saved = json.loads((out / "decoder" / "config.json").read_text())
    assert (saved["hidden_size"], saved["repeat_vectors"], saved["blank_every"]) == (8, 3, 3)  # each part's option
    assert rep["readouts"]["prior"]["min_chunks"] == 2 and "first_token_match" in rep["probe"]
    assert "prior read-out: recovered" in printed and "prior read-out over its prior" in printed  # the summary
    pooled = tmp_path / "pooled"
    assert main(["probe", "--model", str(tiny_llama), "--pool", "max", "max_scale=2.0", "--out", str(pooled),
                 "--n-train", "48", *base, "--no-control", "sequence=false"]) == 0
    assert json.loads((pooled / "report.json").read_text())["encoder"]["pool_options"] == {"max_scale": 2.0}
    curve = tmp_path / "curve"  # a sweep's table has the outside read-out's own columns
    assert main(["probe", "--model", f"onehot:{tok_dir}", "--out", str(curve), "--n-train", "24,48", *base,
                 "sequence=false", "readouts=[prior]", "prior_min_chunks=2"]) == 0
    head = (curve / "curve.md").read_text().splitlines()[0]
    assert "prior_recovered" in head and "prior_prior" in head
    rows = json.loads((curve / "curve.json").read_text())["rows"]  # its gain is the retention line's reading
    assert all("of the prior read-out over its prior" in r["retention"] for r in rows)
    capsys.readouterr()
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for name, option in [("onehot", "onehot_value=1.0"), ("max", "max_scale=1.0"), ("repeat", "repeat_vectors=2"),
                         ("every_other", "blank_every=2"), ("narrow", "narrow_width=16"),
                         ("prior", "prior_min_chunks=1"), ("first_token_match", "match_position=0")]:
        assert re.search(rf"^  {name} .*\[options: {option}\]$", listed, re.M), name
    wrong = tmp_path / "wrong"  # an outside part's option is typed, and refused when its part is not chosen
    assert main(["probe", "--model", f"onehot:{tok_dir}", "--out", str(wrong), *base, "narrow_width=wide"]) == 2
    assert main(["probe", "--model", f"onehot:{tok_dir}", "--out", str(wrong), *base, "narrow_width=8"]) == 2
    err = capsys.readouterr().err
    assert "'narrow_width' must be an integer" in err and "'narrow_width' applies to decoder=narrow" in err
    assert not wrong.exists()
