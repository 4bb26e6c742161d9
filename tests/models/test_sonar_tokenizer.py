"""Real SONAR from a config: the NLLB tokenizer built from a SentencePiece model (trained here, no download),
a tokenizer given in the space spec for fairseq2 checkpoints, SONAR's 512 positions kept from HF ports, and a
tokenizer that does not belong to a checkpoint refused with one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import sentencepiece as spm  # noqa: E402  (declared in the "test" and "sonar" extras)

from memlab.errors import ModelError  # noqa: E402
from memlab.models.sonar import SonarConfig, SonarModel  # noqa: E402
from memlab.models.sonar.configuration_sonar import PRESETS  # noqa: E402
from memlab.models.sonar.space import SonarSpace, parse_spec  # noqa: E402
from memlab.models.sonar.tokenizer import build_toy_tokenizer, nllb_tokenizer  # noqa: E402
from memlab.registry import SPACES  # noqa: E402
from memlab.space import build_space  # noqa: E402

from test_sonar import _to_fs2  # noqa: E402  (memlab keys -> fairseq2 keys, written independently)

LANGS = ("eng_Latn", "fra_Latn", "deu_Latn")


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    """A 400-piece SentencePiece BPE trained on bundled text, with SentencePiece's default ids (as NLLB's:
    <unk> 0, <s> 1, </s> 2)."""
    from memlab.data.corpus import load_corpus

    d = tmp_path_factory.mktemp("spm")
    (d / "text.txt").write_text(load_corpus("austen")[0].text[:200_000])
    spm.SentencePieceTrainer.train(input=str(d / "text.txt"), model_prefix=str(d / "sentencepiece.bpe"),
                                   vocab_size=400, model_type="bpe", minloglevel=2)
    return d / "sentencepiece.bpe.model"


def test_nllb_tokenizer_from_a_sentencepiece_model_has_the_nllb_layout(spm_model):
    proc = spm.SentencePieceProcessor(model_file=str(spm_model))
    tok = nllb_tokenizer(spm_model, langs=LANGS)
    assert [tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    n = proc.get_piece_size()
    assert len(tok) == 4 + (n - 3) + len(LANGS) + 1  # specials, pieces, languages, <mask>
    assert [tok.convert_tokens_to_ids(x) for x in LANGS] == list(range(n + 1, n + 1 + len(LANGS)))
    assert tok.mask_token_id == len(tok) - 1
    text = "It is a truth universally acknowledged, that a single man must be in want of a wife."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == [i + 1 for i in proc.encode(text)]  # the fairseq offset: piece id = SentencePiece id + 1
    assert tok.decode(ids) == text
    with pytest.raises(ModelError, match="not a SentencePiece model"):
        nllb_tokenizer(spm_model.with_name("text.txt"))


def _fairseq2_checkpoints(tmp_path: Path, vocab_size: int, seed: int = 0) -> tuple[Path, Path]:
    torch.manual_seed(seed)
    model = SonarModel(SonarConfig(**{**PRESETS["toy"], "vocab_size": vocab_size}))
    sd = model.state_dict()
    enc, dec = tmp_path / "enc.pt", tmp_path / "dec.pt"
    torch.save({"model": _to_fs2(sd, "encoder")}, enc)
    torch.save({"model": _to_fs2(sd, "decoder")}, dec)
    return enc, dec


def test_fairseq2_checkpoints_with_the_tokenizer_in_the_spec(spm_model, tmp_path):
    tok = nllb_tokenizer(spm_model)  # NLLB's 202 languages
    enc, dec = _fairseq2_checkpoints(tmp_path, len(tok) + 2)  # fairseq2's SONAR: 2 rows more than the tokenizer
    space = build_space(f"sonar:{enc},{dec},tokenizer={spm_model},num_heads=4,lang=fra_Latn")
    assert isinstance(space, SonarSpace) and len(space.tokenizer) == len(tok) and space.lang == "fra_Latn"
    assert space.model.config.max_position_embeddings == PRESETS["basic"]["max_position_embeddings"]
    z = space.encode_text(["A single sentence.", "Another one, a little longer."])  # (2, D)
    assert z.shape == (2, PRESETS["toy"]["d_model"]) and torch.isfinite(z).all()
    assert len(space.generate(z, max_new_tokens=4)) == 2
    # a folder holding only the SentencePiece model works as well
    assert len(build_space(f"sonar:{enc},{dec},tokenizer={spm_model.parent},num_heads=4").tokenizer) == len(tok)


def test_spec_options_are_checked():
    assert parse_spec("a.pt,b.pt,tokenizer=t,num_heads=16") == ("a.pt,b.pt", {"tokenizer": "t", "num_heads": 16})
    with pytest.raises(ModelError, match="unknown option 'tokeniser'"):
        parse_spec("a.pt,b.pt,tokeniser=t")


def test_a_tokenizer_that_is_not_the_checkpoints_is_refused(spm_model, tmp_path):
    toy = build_toy_tokenizer(vocab_size=PRESETS["toy"]["vocab_size"])
    (tmp_path / "toytok").mkdir()
    toy.save_pretrained(str(tmp_path / "toytok"))
    enc, dec = _fairseq2_checkpoints(tmp_path, len(nllb_tokenizer(spm_model)) + 2)
    with pytest.raises(ModelError, match="not this checkpoint's tokenizer"):
        SPACES.get("sonar")(f"{enc},{dec},tokenizer={tmp_path / 'toytok'},num_heads=4")
    big = nllb_tokenizer(spm_model)
    (tmp_path / "small").mkdir()
    small_enc, small_dec = _fairseq2_checkpoints(tmp_path / "small", PRESETS["toy"]["vocab_size"])
    with pytest.raises(ModelError, match="more than the model's vocabulary"):
        SPACES.get("sonar")(f"{small_enc},{small_dec},num_heads=4", tokenizer=big)


def test_cli_refuses_a_mismatched_tokenizer_with_one_line_and_touches_nothing(spm_model, tmp_path, capsys):
    from memlab.app.cli import main

    toy = build_toy_tokenizer(vocab_size=PRESETS["toy"]["vocab_size"])
    toy.save_pretrained(str(tmp_path / "toytok"))
    enc, dec = _fairseq2_checkpoints(tmp_path, len(nllb_tokenizer(spm_model)) + 2)
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (enc, dec)}
    run = tmp_path / "run"
    code = main(["train", "configs/sonar_llm/toy.yaml", "--out", str(run),
                 f"options.space=sonar:{enc},{dec},tokenizer={tmp_path / 'toytok'},num_heads=4", "train.max_steps=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("memlab: error:") and "not this checkpoint's" in err[0]
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (enc, dec)} == before
    assert not (run / "checkpoints").exists() and not (run / "summary.json").exists()


@pytest.mark.parametrize("declared, kept", [(1024, 512), (128, 128)])
def test_hf_port_keeps_sonar_positions(tmp_path, declared, kept):
    """An M2M100 port declares transformers' 1024 positions; SONAR reads 512 (a smaller declared limit stays)."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = SonarModel(SonarConfig(**PRESETS["toy"]))
    port = {}
    for k, v in model.state_dict().items():  # memlab keys are M2M100's, below 'model.'

        port[f"model.{k}"] = v.clone().contiguous()
    port["lm_head.weight"] = port["model.decoder.embed_tokens.weight"].clone()
    d = tmp_path / "port"
    d.mkdir()
    save_file(port, str(d / "model.safetensors"))
    cfg = {"model_type": "m2m_100", "d_model": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
           "max_position_embeddings": declared, "scale_embedding": True, "activation_function": "relu", "pad_token_id": 1}
    (d / "config.json").write_text(json.dumps(cfg))
    build_toy_tokenizer(vocab_size=PRESETS["toy"]["vocab_size"]).save_pretrained(str(d))
    space = SPACES.get("sonar")(str(d))
    assert space.model.config.max_position_embeddings == kept
