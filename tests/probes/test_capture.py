"""Hidden-state capture: hooks equal output_hidden_states on tiny random-init models of each architecture."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from torch import nn

from memlab.errors import MemlabError
from memlab.probes.encoders.capture import (ARCHITECTURES, HiddenStateEncoder, find_layers, hook_plan, right_pad,
                                            wrap_special)
from memlab.probes.encoders.pooling import pool_states

V = 101
SMALL = dict(vocab_size=V)
DEC = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=64, **SMALL)
ENC = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
           **SMALL)

CASES = {
    "gpt2": lambda: tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **SMALL)),
    "llama": lambda: tf.LlamaModel(tf.LlamaConfig(**DEC)),
    "qwen2": lambda: tf.Qwen2Model(tf.Qwen2Config(**DEC)),
    "mistral": lambda: tf.MistralModel(tf.MistralConfig(**DEC)),
    "qwen3": lambda: tf.Qwen3Model(tf.Qwen3Config(head_dim=8, **DEC)),
    "gemma": lambda: tf.GemmaModel(tf.GemmaConfig(head_dim=8, **DEC)),
    "gemma2": lambda: tf.Gemma2Model(tf.Gemma2Config(head_dim=8, sliding_window=4, **DEC)),
    "phi3": lambda: tf.Phi3Model(tf.Phi3Config(pad_token_id=0, bos_token_id=1, eos_token_id=2, **DEC)),
    "smollm3": lambda: tf.SmolLM3Model(tf.SmolLM3Config(pad_token_id=0, bos_token_id=1, eos_token_id=2, **DEC)),
    "gpt_neox": lambda: tf.GPTNeoXModel(tf.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                         num_attention_heads=4, max_position_embeddings=64, **SMALL)),
    "bert": lambda: tf.BertModel(tf.BertConfig(**ENC)),
    "roberta": lambda: tf.RobertaModel(tf.RobertaConfig(**ENC)),
    "xlm-roberta": lambda: tf.XLMRobertaModel(tf.XLMRobertaConfig(**ENC)),
    "distilbert": lambda: tf.DistilBertModel(tf.DistilBertConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                                                                 max_position_embeddings=64, **SMALL)),
    "t5": lambda: tf.T5Model(tf.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, **SMALL)),
    "mt5": lambda: tf.MT5EncoderModel(  # the encoder-only class: the table's paths are in its .encoder
        tf.MT5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, **SMALL)),
    "m2m_100": lambda: tf.M2M100Model(tf.M2M100Config(d_model=32, encoder_layers=2, decoder_layers=1,
                                                      encoder_attention_heads=4, decoder_attention_heads=4,
                                                      encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                      max_position_embeddings=64, **SMALL)),
    # not in the table: the fallback rule must find decoder.layers and decoder.final_layer_norm
    "opt": lambda: tf.OPTModel(tf.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                            word_embed_proj_dim=32, max_position_embeddings=64, **SMALL)),
}


pytestmark = pytest.mark.usefixtures("one_thread")


class _Tok:
    """Minimal tokenizer stand-in: no special tokens, pad id 0."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False, **kw):
        return {"input_ids": [5, 6, 7]}


def _batch():
    torch.manual_seed(0)
    ids = torch.randint(3, V, (3, 7))  # (B, T)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return ids * mask, mask


def _reference(model, ids, mask):
    bb = model.get_encoder() if model.config.is_encoder_decoder and hasattr(model, "get_encoder") else model
    with torch.no_grad():
        return bb(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states


def test_every_table_row_has_a_parity_case():
    assert set(ARCHITECTURES) == set(CASES) - {"opt"}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_hook_matches_output_hidden_states(arch):
    torch.manual_seed(0)
    model = CASES[arch]().eval()
    assert model.config.model_type == arch and (arch in ARCHITECTURES) == (arch != "opt")
    ids, mask = _batch()
    ref = _reference(model, ids, mask)
    layers, norm, _ = hook_plan(model)
    n = len(layers)
    assert n == 2 and len(ref) == n + 1
    for layer in range(n + 1):
        enc = HiddenStateEncoder(model, _Tok(), layer=layer, pool="mean", special_tokens=False, name=arch)
        h = enc.hidden_states(ids, mask)  # (B, T, D)
        if layer < n or norm is None:
            assert torch.allclose(h, ref[layer], atol=1e-5), f"{arch} layer {layer}"
        else:  # the last HF state is after the final norm; the raw block output is not
            assert not torch.allclose(h, ref[layer], atol=1e-3)
            assert torch.allclose(norm(h), ref[layer], atol=1e-5)
    if norm is not None:
        enc = HiddenStateEncoder(model, _Tok(), layer=-1, final_norm=True, special_tokens=False)
        assert torch.allclose(enc.hidden_states(ids, mask), ref[-1], atol=1e-5)
    # negative indices count from the end
    a = HiddenStateEncoder(model, _Tok(), layer=-1, special_tokens=False).encode(ids, mask)
    b = HiddenStateEncoder(model, _Tok(), layer=n, special_tokens=False).encode(ids, mask)
    assert torch.equal(a, b)
    # the encoder names the rule it used (report.json's encoder.hooks)
    hooks = enc.describe()["hooks"]
    if arch == "opt":
        assert hooks["rule"] == "fallback" and "not in the table" in hooks["why"]
        assert (hooks["layers"], hooks["final_norm"]) == ("decoder.layers", "decoder.final_layer_norm")
    else:
        assert hooks == {"rule": "table", "model_type": arch, "layers": ARCHITECTURES[arch][0],
                         "final_norm": ARCHITECTURES[arch][1]}


def test_table_row_with_other_module_names_falls_back():
    model = CASES["llama"]().eval()
    model.config.model_type = "gpt2"  # the gpt2 row names h / ln_f, which a Llama lacks
    layers, norm, hooks = hook_plan(model)
    assert layers is model.layers and norm is model.norm
    assert hooks["rule"] == "fallback" and hooks["model_type"] == "gpt2" and "'gpt2'" in hooks["why"]
    assert (hooks["layers"], hooks["final_norm"]) == ("layers", "norm")


def test_fallback_rule_on_custom_module():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(8, 2)])  # smaller list: not the blocks
            self.norm_before = nn.LayerNorm(8)
            self.blocks = nn.ModuleList([Block() for _ in range(3)])
            self.final_norm = nn.LayerNorm(8)

    net = Net()
    layers, norm = find_layers(net)
    assert layers is net.blocks and norm is net.final_norm


@pytest.mark.parametrize("pool", ["last", "second_last", "mean", "first"])
def test_pooling_ignores_padding(pool):
    model = CASES["llama"]().eval()
    enc = HiddenStateEncoder(model, _Tok(), layer=1, pool=pool, special_tokens=False)
    ids, mask = _batch()
    z = enc.encode(ids, mask)  # (B, D)
    for i in range(3):
        n = int(mask[i].sum())
        zi = enc.encode(ids[i : i + 1, :n], mask[i : i + 1, :n])
        assert torch.allclose(zi[0], z[i], atol=1e-5), f"row {i}"
    # left padding is moved to the right first
    left_ids = torch.stack([torch.roll(ids[i], int((mask[i] == 0).sum())) for i in range(3)])
    left_mask = torch.stack([torch.roll(mask[i], int((mask[i] == 0).sum())) for i in range(3)])
    assert torch.allclose(enc.encode(left_ids, left_mask), z, atol=1e-5)


def test_pool_states_values():
    h = torch.arange(2 * 4 * 1, dtype=torch.float).view(2, 4, 1)  # (B, T, D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert pool_states(h, mask, "last").flatten().tolist() == [2.0, 7.0]
    assert pool_states(h, mask, "second_last").flatten().tolist() == [1.0, 6.0]
    assert pool_states(h, mask, "first").flatten().tolist() == [0.0, 4.0]
    assert pool_states(h, mask, "mean").flatten().tolist() == [1.0, 5.5]


def test_wrap_special_and_right_pad():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    ids, mask = right_pad(ids, mask)
    assert ids[0, :2].tolist() == [5, 6] and mask[0].tolist() == [1, 1, 0, 0]
    out, m = wrap_special(ids, mask, [101], [102], pad_id=0)
    assert out[0].tolist() == [101, 5, 6, 102, 0, 0] and m[0].tolist() == [1, 1, 1, 1, 0, 0]
    assert out[1].tolist() == [101, 7, 8, 9, 4, 102] and m[1].tolist() == [1] * 6


def test_bad_layer_and_too_long():
    model = CASES["gpt2"]().eval()
    with pytest.raises(MemlabError, match="out of range"):
        HiddenStateEncoder(model, _Tok(), layer=3)
    with pytest.raises(MemlabError, match="out of range"):
        HiddenStateEncoder(model, _Tok(), layer=-4)
    enc = HiddenStateEncoder(model, _Tok(), layer=-1)
    ids = torch.randint(3, V, (1, 65))
    with pytest.raises(MemlabError, match="longer than"):
        enc.encode(ids, torch.ones_like(ids))
    with pytest.raises(MemlabError, match="pooling"):
        HiddenStateEncoder(model, _Tok(), pool="no-such-pool")
