"""Inversion probe: end to end on tiny local models, the fitted probe as an EmbeddingSpace, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers as tf

from memlab.app.cli import main
from memlab.errors import MemlabError
from memlab.probes.run import ProbeOptions, load_options, run_probe
from memlab.testing import check_embedding_space

SHORT = ["Mr. Darcy.", "It was fine.", "They set out."]
TINY = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=6", "n_train=64", "n_eval=16",
        "epochs=2", "n_examples=2"]  # 6 words: about 18 tokens of the tests' 300-token BPE


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=len(tokenizer), max_position_embeddings=64)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def test_cli_probe_end_to_end(tiny_llama, small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out), *TINY])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    p, c = rep["probe"], rep["control"]
    v = rep["vocab_size"]
    t = rep["text"]  # chunks of 16 words, each as many tokens as it takes, padded to the longest
    assert t["chunk_by"] == "words" and t["per_chunk"] == "6 words" and t["mean_tokens"] <= t["max_tokens"]
    for m in (p, c):
        assert 0.0 <= m["token_accuracy"] <= 1.0 and m["ce"] > 0
        assert m["entropy_ratio"] == pytest.approx(1 - m["ce"] / math.log(v))
        assert len(m["accuracy_by_position"]) == t["max_tokens"]
        assert m["n_tokens"] == pytest.approx(t["mean_tokens"] * rep["n_eval"])  # pads are not scored
    assert rep["information_gain"] == pytest.approx((c["ce"] - p["ce"]) / c["ce"])
    r = rep["readings"]
    assert r["information_gain"]["value"] == pytest.approx(rep["information_gain"])
    assert r["token_accuracy"]["value"] == pytest.approx(p["token_accuracy"])
    # bits per chunk: the summed CE difference in bits, per chunk and per character
    bits = (c["ce"] - p["ce"]) * p["n_tokens"] / math.log(2)
    assert r["bits_per_chunk"]["value"] == pytest.approx(bits / rep["n_eval"], rel=1e-4)
    assert r["bits_per_char"]["value"] == pytest.approx(bits / (t["mean_chars"] * rep["n_eval"]), rel=1e-4)
    for x in r.values():
        assert x["low"] <= x["value"] <= x["high"]
    assert rep["encoder"]["layer"] == 2 and rep["encoder"]["pool"] == "last"
    assert len(rep["examples"]) == 2 and all(isinstance(e["reconstruction"], str) for e in rep["examples"])
    assert (out / "plots" / "accuracy_by_position.png").stat().st_size > 1000
    assert (out / "decoder" / "model.safetensors").is_file()
    assert "H_r=" in capsys.readouterr().out


class FirstTokens:
    """An oracle encoder: one-hot of the first two tokens (any object with these members plugs in)."""

    name, pool, layer, max_length = "first-tokens", "oracle", None, None

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.v = len(tokenizer)
        self.dim = 2 * self.v

    def describe(self):
        return {"name": self.name, "dim": self.dim}

    def encode(self, ids, mask):
        z = torch.zeros(ids.shape[0], 2, self.v)  # (B, 2, V)
        z.scatter_(2, ids[:, :2, None], 1.0)
        return z.flatten(1)  # (B, 2V)


@pytest.mark.parametrize("inputs", ["teacher", "blank"])
def test_probe_reads_the_embedding(tokenizer, small_corpus, inputs):
    opts = load_options(None, TINY, model="oracle", corpus=str(small_corpus), epochs=10, lr=3e-3, n_train=512,
                        chunk_by="tokens", seq_len=16,
                        n_eval=64, inputs=inputs, conditioning="unrolled" if inputs == "blank" else "prefix")
    rep = run_probe(opts, encoder=FirstTokens(tokenizer))
    p, c = rep["probe"], rep["control"]
    # held-out first tokens (almost all occur in training) are read from the embedding; the control must guess.
    # With teacher inputs the contained probe is kept here; its control's weights at a tenth of the learning rate
    # read 0.47-0.50 of the first tokens in these 10 epochs (0.83 at the full rate), against the control's 0.09
    assert p["accuracy_by_position"][0] > c["accuracy_by_position"][0] + 0.3
    assert p["accuracy_by_position"][1] > c["accuracy_by_position"][1] + 0.1
    fitted = rep["_fitted"]
    ids = torch.tensor([[5, 6, 7, 8]])
    z = fitted.encode(ids, torch.ones_like(ids))
    dec_in, _ = fitted.decoder_inputs(ids, torch.ones_like(ids))
    same = torch.allclose(fitted.decode_logits(z, dec_in), fitted.decode_logits(z, torch.zeros_like(dec_in)))
    assert same == (inputs == "blank")  # blank inputs: the token ids never reach the decoder
    out = fitted.generate(z, max_new_tokens=4)
    assert len(out) == 1 and isinstance(out[0], str)


@pytest.mark.parametrize("conditioning,pool", [("prefix", "last"), ("unrolled", "mean")])
def test_fitted_probe_is_an_embedding_space(tiny_llama, tiny_bert, small_corpus, tmp_path, conditioning, pool):
    from memlab.registry import SPACES

    model = tiny_llama if pool == "last" else tiny_bert
    opts = load_options(None, TINY, model=str(model), corpus=str(small_corpus), pool=pool, conditioning=conditioning,
                        control=False, epochs=1)
    rep = run_probe(opts, tmp_path / "run")
    fitted = rep["_fitted"]
    check_embedding_space(fitted, SHORT)  # the decoder rebuilds at most seq_len=16 tokens
    again = SPACES.get("probe")(str(tmp_path / "run"))
    ids = torch.tensor([[5, 6, 7, 8]])
    z = fitted.encode(ids, torch.ones_like(ids))
    dec_in, _ = fitted.decoder_inputs(ids, torch.ones_like(ids))
    assert torch.allclose(again.encode(ids, torch.ones_like(ids)), z)
    assert torch.allclose(again.decode_logits(z, dec_in), fitted.decode_logits(z, dec_in), atol=1e-5)
    assert len(fitted.generate(z, max_new_tokens=4, num_beams=2)) == 1
    with pytest.raises(MemlabError, match="width"):
        fitted.decode_logits(torch.zeros(1, fitted.dim + 1), dec_in)


def test_disk_cache_is_reused(tiny_llama, small_corpus, tmp_path):
    opts = load_options(None, TINY, model=str(tiny_llama), corpus=str(small_corpus), control=False, epochs=1,
                        cache_dir=str(tmp_path / "cache"))
    a = run_probe(opts)
    b = run_probe(opts)
    assert not a["timing"]["encode_cached"] and b["timing"]["encode_cached"]
    assert len(list((tmp_path / "cache").glob("emb-*.float32.bin"))) == 2
    assert b["probe"]["ce"] == pytest.approx(a["probe"]["ce"], rel=1e-5)


def test_control_is_shared_between_probes_of_the_same_chunks(tiny_llama, small_corpus):
    cache: dict = {}
    kw = dict(corpus=str(small_corpus), epochs=1)
    a = run_probe(load_options(None, TINY, model=str(tiny_llama), pool="last", **kw), control_cache=cache)
    b = run_probe(load_options(None, TINY, model=str(tiny_llama), pool="mean", **kw), control_cache=cache)
    c = run_probe(load_options(None, TINY, model=str(tiny_llama), pool="mean", lr=1e-3, **kw), control_cache=cache)
    assert a["control_shared_with"] is None and a["timing"]["control_s"] > 0
    assert b["control_shared_with"] == str(tiny_llama) and b["timing"]["control_s"] == 0.0
    assert b["control"] == a["control"] and b["probe"] != a["probe"]  # a different encoder, the same control
    assert c["control_shared_with"] is None and len(cache) == 2  # another decoder option trains its own


def _fails(argv, capsys, match):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memlab: error:") and match in err[0], err


def test_bad_input_gives_one_clear_error(tiny_llama, small_corpus, tmp_path, capsys):
    base = ["--corpus", str(small_corpus), *TINY]
    _fails(["probe", "--model", "no-such-org/no-such-model", *base], capsys, "unknown model")
    _fails(["probe", "--model", str(tmp_path / "missing"), *base], capsys, "does not exist")
    _fails(["probe", "--model", str(tiny_llama), "--layer", "3", *base], capsys, "out of range")
    _fails(["probe", "--model", str(tiny_llama), "--layer", "-4", *base], capsys, "out of range")
    _fails(["probe", "--model", str(tiny_llama), *base, "seq_len=50"], capsys, "longer than")
    _fails(["probe", "--model", str(tiny_llama), "--pool", "no-such-pool", *base], capsys, "pool")
    _fails(["probe", "--model", str(tiny_llama), *base, "colour=red"], capsys, "unknown config key 'colour'")
    out = tmp_path / "never-written"
    model = ["probe", "--model", str(tiny_llama), "--out", str(out), *base]
    _fails([*model, "--epochs", "0"], capsys, "'epochs' must be a finite number > 0, got 0")
    _fails([*model, "--epochs", "-3"], capsys, "'epochs' must be a finite number > 0, got -3")
    _fails([*model, "--lr", "nan"], capsys, "'lr' must be a finite number > 0, got nan")
    _fails([*model, "--lr", "-1"], capsys, "'lr' must be a finite number > 0, got -1")
    _fails([*model, "--inputs", "blank", "input_dropout=0.5"], capsys,
           "'input_dropout' applies to inputs=teacher, not to inputs=blank")
    _fails([*model, "prefix_len=8"], capsys, "'prefix_len' applies to conditioning=prefix, not to conditioning=unrolled")
    _fails([*model, "--conditioning", "sideways"], capsys, "unknown probe conditioning 'sideways'; registered: prefix")
    _fails([*model, "decoder=no_such_decoder"], capsys, "unknown probe decoder 'no_such_decoder'")
    _fails([*model, "readouts=[bow,knn]"], capsys, "unknown probe readout 'knn'")
    _fails([*model, "scorers=[rouge]"], capsys, "unknown probe scorer 'rouge'")
    _fails([*model, "chunk_by=lines"], capsys, "'chunk_by' must be one of words, tokens")
    assert not out.exists()  # nothing saved touched
    no_tok = tmp_path / "no-tok"
    tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=300)).save_pretrained(no_tok)
    capsys.readouterr()  # transformers' own save bar, outside any memlab command
    _fails(["probe", "--model", str(no_tok), *base], capsys, "tokenizer")


def test_decoder_rejects_wrong_width(tokenizer):
    from memlab.probes.decoder.fitloop import train_decoder
    from memlab.probes.decoder.fit import build_decoder

    ids = torch.randint(0, len(tokenizer), (8, 16))
    opts = ProbeOptions(hidden_size=32, num_heads=4, num_layers=1, seq_len=16, epochs=1, batch_size=4)
    dec = build_decoder(24, tokenizer, ids, opts)
    with pytest.raises(MemlabError, match="width 20"):
        train_decoder(dec, torch.zeros(8, 20), ids, opts)


def test_shipped_probe_configs_load():
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[2].joinpath("configs", "probes").glob("*.yaml"))
    assert files
    from memlab.config import load_config

    for f in files:
        cfg = load_config(f)
        assert cfg.recipe == "probe" and isinstance(cfg.options, ProbeOptions)
        opts = load_options(f, ["n_train=7"])
        assert opts.n_train == 7 and opts.model == cfg.options.model
    with pytest.raises(MemlabError, match="unknown config key 'options.colour'"):
        load_options(files[0], ["colour=red"])


def test_experiment_sections_used_or_refused_and_sweeps_in_yaml(tiny_llama, small_corpus, tmp_path, capsys):
    import yaml

    cfg = tmp_path / "probe.yaml"
    cfg.write_text(yaml.safe_dump({"recipe": "probe", "options": {"model": str(tiny_llama)}, "data": {"seq_len": 8},
                                   "train": {"lr": 1.0}}))
    _fails(["probe", "--config", str(cfg)], capsys, "sections 'data', 'train' are not used by recipe: probe")
    opts = {"model": str(tiny_llama), "corpus": str(small_corpus), "n_train": [32, 64], "n_eval": 16, "seq_len": 4,
            "hidden_size": 32, "num_layers": 1, "epochs": 1}
    cfg.write_text(yaml.safe_dump({"recipe": "probe", "options": opts}))
    assert main(["probe", "--config", str(cfg), "--out", str(tmp_path / "curve")]) == 0  # a learning curve
    rows = json.loads((tmp_path / "curve" / "curve.json").read_text())["rows"]
    assert [r["n_train"] for r in rows] == [32, 64] and all("bits_per_chunk" in r for r in rows)
    assert main(["probe", "--config", str(cfg), "--out", str(tmp_path / "layers"), "n_train=32", "layers=[0,2]"]) == 0
    assert [r["layer"] for r in json.loads((tmp_path / "layers" / "layers.json").read_text())["rows"]] == [0, 2]
