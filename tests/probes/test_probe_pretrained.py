"""decoder=pretrained:NAME: a causal LM reads the embedding through a trained map, frozen or with LoRA, and rebuilds
the chunk texts in its own tokenizer; saved as only what trained; bad decoders refused in one line."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from memlab.app.cli import main
from memlab.errors import ModelError
from memlab.probes.chunks import batch, cut as chunks
from memlab.probes.decoder import fit as T
from memlab.probes.decoder.fitloop import train_decoder
from memlab.probes.options import load_options
from memlab.probes.decoder.pretrained import LM_PREFIX, WEIGHTS, PretrainedDecoder
from tests.conftest import one_line_error

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = Path(__file__).resolve().parents[2] / "memlab" / "resources" / "checkpoints" / "token_lm-toy"
"""The shipped toy token LM: a tiny LlamaForCausalLM with memlab's BPE tokenizer (another tokenizer than the
encoder's in these tests)."""

RUN = ["--seq-len", "4", "--n-train", "48", "--n-eval", "12", "--epochs", "1", "--batch-size", "16",
       "conditioning=prefix", "prefix_len=2", "n_examples=2", "ci_resamples=200"]
HAS_PEFT = importlib.util.find_spec("peft") is not None


def _opts(corpus, **kw):
    return load_options(None, ["epochs=1", "batch_size=8", "conditioning=prefix", "prefix_len=2", "seq_len=4",
                               "select_decoder=false"], model="synthetic:concat", corpus=str(corpus),
                        decoder=f"pretrained:{TOY}", **kw)


def _trained(corpus, **kw):
    """A pretrained decoder built and trained on 24 random embeddings of real chunks, and its state before."""
    from memlab.probes.encoders.sources import load_tokenizer

    opts = _opts(corpus, **kw)
    tok = load_tokenizer(str(TOY))
    texts = chunks.probe_texts(4, 24, "train", str(corpus))
    from memlab.probes.chunks.cut import tokenize_chunks

    ids, _ = tokenize_chunks(texts, tok)  # (24, T)
    z = torch.randn(24, 6, generator=torch.Generator().manual_seed(0))  # (24, D)
    dec = T.build_decoder(6, tok, ids, opts)
    dec.set_normalization(z)
    before = {k: v.clone() for k, v in dec.state_dict().items()}
    train_decoder(dec, z, ids, opts)
    return dec, before, z, ids, tok


def test_probe_end_to_end_targets_in_the_decoders_tokenizer(tiny_llama, small_corpus, tmp_path):
    from memlab.probes.encoders.sources import load_tokenizer
    from memlab.probes.decoder.fitted import load_probe

    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--decoder", f"pretrained:{TOY}",
                 "--out", str(out), *RUN]) == 0
    rep = json.loads((out / "report.json").read_text())
    tg = rep["text"]["targets"]
    enc_tok, dec_tok = load_tokenizer(str(tiny_llama)), load_tokenizer(str(TOY))
    texts = chunks.probe_texts(4, 12, "test", str(small_corpus), at_most=True)
    n_dec = sum(len(x) for x in dec_tok(texts, add_special_tokens=False)["input_ids"])
    n_enc = sum(len(x) for x in enc_tok(texts, add_special_tokens=False)["input_ids"])
    assert tg["tokenizer"] == str(TOY) and tg["vocab_size"] == len(dec_tok) != len(enc_tok)
    assert tg["n_tokens"] == n_dec != n_enc  # the held-out targets are the texts in the decoder's tokens
    assert rep["vocab_size"] == len(dec_tok) and rep["probe"]["n_tokens"] == n_dec
    bits = rep["readings"]["bits_per_chunk"]
    assert bits["low"] <= bits["value"] <= bits["high"]
    if rep["probe"]["start"]["kept"] == "control":  # nothing read beat the control: exactly its readings
        assert bits["low"] == bits["value"] == bits["high"] == 0.0
    else:
        assert bits["low"] < bits["high"]
    assert rep["control"] is not None and rep["decoder"]["kind"] == f"pretrained:{TOY}"
    assert 0 < rep["decoder"]["trained_parameters"] < rep["decoder"]["parameters"]
    # saved: only what trained, and the LM by name; reloaded strictly, it gives the same log-probabilities
    from safetensors.torch import load_file

    saved = load_file(str(out / "decoder" / WEIGHTS))
    assert saved and not any(k.startswith(LM_PREFIX) for k in saved)
    fitted = load_probe(out)
    assert isinstance(fitted.decoder, PretrainedDecoder) and fitted.target_tokenizer is not fitted.tokenizer
    z = torch.randn(3, fitted.dim, generator=torch.Generator().manual_seed(1))  # (3, D)
    ids = torch.randint(0, len(dec_tok), (3, 5), generator=torch.Generator().manual_seed(2))  # (3, 5)
    first = fitted.decode_logits(z, ids)
    again = load_probe(out).decode_logits(z, ids)  # (3, 5, V)
    assert first.shape == (3, 5, len(dec_tok)) and torch.equal(first, again)
    assert torch.allclose(first.exp().sum(-1), torch.ones(3, 5), atol=1e-4)
    # a weight that does not fit is refused
    saved["cond.bias"] = torch.zeros(3)
    from safetensors.torch import save_file

    save_file(saved, str(out / "decoder" / WEIGHTS))
    with pytest.raises(ModelError, match="do not fit the pretrained decoder"):
        load_probe(out)


def test_frozen_lm_is_unchanged_while_the_map_trains(small_corpus):
    dec, before, *_ = _trained(small_corpus)
    after = dec.state_dict()
    lm = [k for k in after if k.startswith(LM_PREFIX)]
    assert lm and all(torch.equal(before[k], after[k]) for k in lm)
    assert not any(p.requires_grad for p in dec.lm.parameters())
    assert not torch.equal(before["cond.weight"], after["cond.weight"])


@pytest.mark.skipif(not HAS_PEFT, reason="peft is not installed")
def test_lora_trains_only_its_adapters_and_the_map(small_corpus, tmp_path):
    dec, before, z, ids, _ = _trained(small_corpus, lora_r=2)
    trainable = [n for n, p in dec.named_parameters() if p.requires_grad]
    in_lm = [n for n in trainable if n.startswith(LM_PREFIX)]
    assert in_lm and all("lora_" in n for n in in_lm) and "cond.weight" in trainable
    after = dec.state_dict()
    frozen = [k for k in after if k.startswith(LM_PREFIX) and "lora_" not in k]
    assert all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in after if "lora_" in k)  # the adapters moved
    from memlab.probes.decoder.pretrained import load_decoder

    dec.save_pretrained(tmp_path / "dec")
    back = load_decoder(tmp_path / "dec")
    x = batch.shift_right(ids.clamp(min=0)[:4], int(dec.config.start_id))  # (4, T)
    assert torch.allclose(dec.eval()(z[:4], x), back(z[:4], x), atol=1e-6)


def test_a_hidden_layer_in_the_map_trains_saves_and_reloads(small_corpus, tmp_path):
    from memlab.probes.decoder.pretrained import load_decoder

    dec, before, z, ids, _ = _trained(small_corpus, map_hidden=12)
    first, out = dec.cond[0], dec.cond[2]
    assert tuple(first.weight.shape) == (12, 6) and tuple(out.weight.shape) == (2 * dec.config.hidden_size, 12)
    assert isinstance(dec.cond[1], torch.nn.GELU)
    after = dec.state_dict()
    assert not torch.equal(before["cond.0.weight"], after["cond.0.weight"])  # both layers of the map trained
    assert not torch.equal(before["cond.2.weight"], after["cond.2.weight"])
    assert all(torch.equal(before[k], after[k]) for k in after if k.startswith(LM_PREFIX))  # the LM frozen
    dec.save_pretrained(tmp_path / "dec")
    back = load_decoder(tmp_path / "dec")
    assert back.config.map_hidden == 12
    x = batch.shift_right(ids.clamp(min=0)[:4], int(dec.config.start_id))  # (4, T)
    assert torch.allclose(dec.eval()(z[:4], x), back(z[:4], x), atol=1e-6)
    # a control (a constant embedding, standardised to zeros) gets prompts with a spread all the same
    with torch.no_grad():
        zero = dec.cond(torch.zeros(1, 6)).view(2, -1)  # (P, d)
    assert float(zero.std(dim=1).min()) > 0


@pytest.mark.parametrize("extra", [{}, {"map_hidden": 8}, {"bag_head": True}])
def test_a_probe_and_its_control_start_alike_whatever_the_embeddings_width(small_corpus, extra):
    """The map's draws do not depend on the embedding's width: a constant embedding (standardised to zeros) gives
    the same soft prompts from decoders built for widths 6 and 10, so probes of any width can share one control."""
    from memlab.probes.chunks.cut import tokenize_chunks
    from memlab.probes.encoders.sources import load_tokenizer

    tok = load_tokenizer(str(TOY))
    ids, _ = tokenize_chunks(chunks.probe_texts(4, 8, "train", str(small_corpus)), tok)  # (8, T)
    prompts = []
    for width in (6, 10):
        dec = T.build_decoder(width, tok, ids, _opts(small_corpus, **extra))
        with torch.no_grad():
            prompts.append(dec.cond(torch.zeros(1, width)))  # (1, P * d)
        if extra.get("map_hidden"):  # the hidden layer's output weight too (what a zero embedding's units meet)
            prompts.append(dec.cond[2].weight.detach().clone())
    half = len(prompts) // 2
    assert all(torch.equal(a, b) for a, b in zip(prompts[:half], prompts[half:]))  # width 6's against width 10's


def test_finetune_trains_the_whole_lm_and_saves_it_once(small_corpus, tmp_path):
    from safetensors.torch import load_file

    from memlab.probes.decoder.pretrained import load_decoder

    dec, before, z, ids, _ = _trained(small_corpus, finetune=True)
    after = dec.state_dict()
    lm = [k for k in after if k.startswith(LM_PREFIX)]
    assert all(p.requires_grad for p in dec.lm.parameters())
    assert sum(not torch.equal(before[k], after[k]) for k in lm) > len(lm) // 2  # the LM itself trained
    dec.save_pretrained(tmp_path / "dec")
    saved = load_file(str(tmp_path / "dec" / WEIGHTS))
    ptrs = {v.data_ptr() for k, v in after.items() if k.startswith(LM_PREFIX)}
    assert len([k for k in saved if k.startswith(LM_PREFIX)]) == len(ptrs)  # every LM tensor, a tied one once
    back = load_decoder(tmp_path / "dec")
    x = batch.shift_right(ids.clamp(min=0)[:4], int(dec.config.start_id))  # (4, T)
    assert torch.allclose(dec.eval()(z[:4], x), back(z[:4], x), atol=1e-6)
    assert not torch.allclose(back(z[:4], x), _trained(small_corpus)[0].eval()(z[:4], x), atol=1e-3)


def _fails(args, capsys, *expect):
    assert main(["probe", *args]) == 2
    line = one_line_error(capsys)
    for e in expect:
        assert e in line, line


def _save_lm(folder: Path, tokenizer, bert: bool = False) -> Path:
    import transformers as tf

    torch.manual_seed(0)
    if bert:
        tf.BertModel(tf.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                   vocab_size=len(tokenizer))).save_pretrained(folder)
    else:
        tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=2, vocab_size=len(tokenizer),
                                           max_position_embeddings=64)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_bad_decoders_are_refused_in_one_line(tokenizer, small_corpus, tmp_path, capsys, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = ["--model", "synthetic:concat", "--corpus", str(small_corpus), *RUN]
    out = tmp_path / "out"
    bert = _save_lm(tmp_path / "bert", tokenizer, bert=True)
    _fails([*base, "--out", str(out), "--decoder", f"pretrained:{bert}"], capsys, "is not a causal LM", "BertModel")
    from memlab import assets

    if assets.is_installed("minilm"):
        _fails([*base, "--out", str(out), "--decoder", "pretrained:minilm"], capsys, "is not a causal LM")
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "of": 2, "and": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    unk = _save_lm(tmp_path / "unk", PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]",
                                                            pad_token="[UNK]"))
    _fails([*base, "--out", str(out), "--decoder", f"pretrained:{unk}"], capsys, "cannot encode the corpus text",
           "unknown token")
    _fails([*base, "--out", str(out), "--decoder", f"pretrained:{tmp_path / 'none'}"], capsys, "does not exist")
    _fails([*base, "--out", str(out), "--decoder", "pretrained"], capsys, "needs an argument")
    _fails([*base, "--out", str(out), "--decoder", "llama:x"], capsys, "takes no argument")
    _fails([*base, "--out", str(out), "lora_r=4"], capsys, "'lora_r' applies to decoder=pretrained")
    good = ["--decoder", f"pretrained:{TOY}"]
    _fails([*base, "--out", str(out), *good, "lora_alpha=8"], capsys, "lora_r=0 trains none")
    _fails([*base, "--out", str(out), *good, "map_hidden=-1"], capsys, "'map_hidden' must be >= 0")
    _fails([*base, "--out", str(out), "map_hidden=8"], capsys, "'map_hidden' applies to decoder=pretrained")
    _fails([*base, "--out", str(out), "finetune=true"], capsys, "'finetune' applies to decoder=pretrained")
    _fails([*base, "--out", str(out), *good, "chunk_by=tokens"], capsys, "use chunk_by=words")
    monkeypatch.setitem(sys.modules, "peft", None)  # as if peft were not installed
    _fails([*base, "--out", str(out), *good, "lora_r=4"], capsys, "needs peft", "pip install peft")
    _fails([*base, "--out", str(out), *good, "lora_r=4", "finetune=true"], capsys, "choose one")
    assert not out.exists()  # nothing was written


def test_a_scratch_decoder_in_a_named_tokenizer_reloads_in_it(tiny_llama, small_corpus, tmp_path):
    from memlab.probes.decoder.fitted import load_probe

    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out), *RUN,
                 f"target_tokenizer={TOY}", "--no-control", "--no-bow", "select_decoder=false", "hidden_size=32",
                 "num_layers=1"]) == 0
    fitted = load_probe(out)
    assert len(fitted.target_tokenizer) == fitted.decoder.config.vocab_size != len(fitted.tokenizer)
