"""The decoder's output layer as a map of the encoder's token table (``token_table``): which table it reads, that its
class vectors start where the encoder put the tokens, that it is saved and keyed, and its refusals."""

import json

import pytest
import torch

from memlab.errors import ConfigError
from memlab.probes.decoder.build import build_decoder, load_decoder, save_decoder
from memlab.probes.decoder.table import TableHead, encoder_table, table_key
from memlab.probes.options import ProbeOptions

TINY = ["--n-train", "48", "--n-eval", "8", "--seq-len", "12", "--epochs", "1", "--batch-size", "16", "--no-bow",
        "hidden_size=32", "num_heads=4", "num_layers=1", "chunk_by=tokens", "curve_shares=[]", "progress=false",
        "select_decoder=false", "race=false"]


class _Tok:
    def __len__(self):
        return 40

    bos_token_id = 1


class _WithTable:
    name = "toy"
    tokenizer = _Tok()

    def __init__(self, table):
        self._t = table

    def token_table(self):
        return self._t


def _opts(**kw):
    return ProbeOptions(hidden_size=16, num_heads=2, num_layers=1, seq_len=8, epochs=1, batch_size=4, **kw)


def test_class_vectors_start_as_a_map_of_the_table():
    torch.manual_seed(0)
    table = torch.randn(40, 6)
    table[7] = table[3] * 1.0001  # two tokens the encoder puts in one place
    ids = torch.randint(2, 30, (12, 8))
    ids[0, 0], ids[0, 1] = 3, 7
    dec = build_decoder(5, _Tok(), ids, _opts(), table=table)
    assert isinstance(dec.lm_head, TableHead) and dec.config.token_table_dim == 6
    kept = dec.to_full.tolist()
    rows = dec.lm_head.table
    assert rows.shape == (len(kept) + int(dec.has_other), 6)
    # standardised per dimension over the kept rows (and the other class), each row of unit scale on average
    assert torch.allclose(rows.mean(0), torch.zeros(6), atol=1e-5)
    assert torch.allclose(rows.std(0) * 6 ** 0.5, torch.ones(6), atol=1e-4)
    # the other class's row is the mean of the rows not kept, standardised as the rest
    unseen = sorted(set(range(40)) - set(kept))
    raw = torch.cat([table[kept], table[unseen].mean(0, keepdim=True)])
    expect = (raw - raw.mean(0)) / raw.std(0) / 6 ** 0.5
    assert torch.allclose(rows, expect, atol=1e-5)
    # tokens the encoder placed together get the same output vector at the start, others do not
    h = torch.randn(3, 16)
    lg = dec.lm_head(h)
    a, b = kept.index(3), kept.index(7)
    assert torch.allclose(lg[:, a], lg[:, b], atol=1e-3)
    assert not torch.allclose(lg[:, a], lg[:, kept.index(ids[1, 0].item())], atol=1e-3)
    # a scratch head has no table
    assert not isinstance(build_decoder(5, _Tok(), ids, _opts()).lm_head, TableHead)
    assert not isinstance(build_decoder(5, _Tok(), ids, _opts(token_table="none"), table=None).lm_head, TableHead)


def test_table_head_trains_its_map_and_own_vectors_and_is_saved(tmp_path):
    torch.manual_seed(0)
    table = torch.randn(40, 6)
    ids = torch.randint(2, 30, (12, 8))
    dec = build_decoder(5, _Tok(), ids, _opts(), table=table)
    z = torch.randn(12, 5)
    dec.set_normalization(z)
    loss = torch.nn.functional.cross_entropy(dec(z, ids).flatten(0, 1), dec.compact_targets(ids).flatten())
    loss.backward()
    assert dec.lm_head.map.weight.grad.abs().sum() > 0 and dec.lm_head.own.grad.abs().sum() > 0
    assert "lm_head.table" in dict(dec.named_buffers())
    save_decoder(dec, tmp_path / "d")
    back, _ = load_decoder(tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["token_table_dim"] == 6
    assert torch.equal(back.lm_head.table, dec.lm_head.table)
    with torch.no_grad():
        assert torch.allclose(back(z, ids), dec.eval()(z, ids))


def test_which_table_and_refusals():
    table = torch.randn(40, 6)
    assert encoder_table("none", _WithTable(table), True) is None
    assert torch.equal(encoder_table("auto", _WithTable(table), True), table)
    assert encoder_table("auto", _WithTable(None), True) is None  # a synthetic encoder: learned from scratch
    assert encoder_table("auto", _WithTable(table), False) is None  # targets in another tokenizer
    with pytest.raises(ConfigError, match="no token embedding table"):
        encoder_table("encoder", _WithTable(None), True)
    with pytest.raises(ConfigError, match="another tokenizer"):
        encoder_table("encoder", _WithTable(table), False)
    with pytest.raises(ConfigError, match="'token_table' must be one of auto, encoder, none"):
        encoder_table("yes", _WithTable(table), True)
    assert table_key(table) != table_key(table + 1e-3) and table_key(None) is None


def test_probe_reads_its_encoders_table_and_keys_the_control(tiny_llama, small_corpus, tmp_path):
    from memlab.app.cli import main
    from memlab.probes.encoders.sources import load_encoder
    from memlab.probes.run import control_key

    reports = {}
    for choice in ("auto", "none"):
        out = tmp_path / choice
        assert main(["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), "--out", str(out), *TINY,
                     f"token_table={choice}"]) == 0
        reports[choice] = json.loads((out / "report.json").read_text())
    assert reports["auto"]["decoder"]["token_table_dim"] == 32  # the tiny Llama's embedding width
    assert reports["none"]["decoder"]["token_table_dim"] == 0
    assert reports["auto"]["probe"]["ce"] != reports["none"]["probe"]["ce"]
    enc = load_encoder(str(tiny_llama))
    ids = torch.randint(0, 300, (4, 12))
    t = enc.token_table()
    assert t.shape == (300, 32)
    o = ProbeOptions()
    assert control_key(o, enc.tokenizer, ids, ids, t) != control_key(o, enc.tokenizer, ids, ids, None)


def test_cli_refuses_a_bad_token_table(tiny_llama, small_corpus, tmp_path, capsys):
    from memlab.app.cli import main

    base = ["probe", "--model", str(tiny_llama), "--corpus", str(small_corpus), *TINY]
    assert main([*base, "--out", str(tmp_path / "a"), "token_table=maybe"]) == 2
    assert "'token_table' must be one of auto, encoder, none" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    # a synthetic encoder has no table: encoder refuses, auto learns from scratch
    assert main(["probe", "--model", "synthetic:concat", "--corpus", str(small_corpus), "--out", str(tmp_path / "b"),
                 *TINY, "token_table=encoder"]) == 2
    assert "no token embedding table" in capsys.readouterr().err
