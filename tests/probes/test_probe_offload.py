"""A probed model bigger than its device: accelerate places its blocks in host memory and on disk, and the probe
reads the same embeddings and gives the same readings as with the model whole in memory."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from conftest import one_line_error
from memlab.app.cli import main
from memlab.errors import ConfigError
from memlab.probes.encoders import placement
from memlab.probes.run import load_options, run_probe
from memlab.probes.encoders.sources import load_encoder

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=6", "n_train=32", "n_eval=8",
        "readouts=[]", "scorers=[]", "epochs=1", "n_examples=2", "select_decoder=false", "ci_resamples=200",
        "device=cpu", "encoder_dtype=float32"]


@pytest.fixture(scope="module")
def six_blocks(tmp_path_factory, tokenizer):
    """A saved 6-block random Llama causal LM and a host-memory budget that holds its embeddings and about half of
    its blocks (the rest must go to disk)."""
    d = tmp_path_factory.mktemp("llama6")
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                               num_attention_heads=4, num_key_value_heads=4,
                                               vocab_size=len(tokenizer), max_position_embeddings=48))
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    block = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    embed = model.model.embed_tokens.weight.numel() * 4
    return d, embed + 4 * block  # accelerate keeps room for one block on the main device besides what it places


def _batch(tokenizer):
    enc = tokenizer(["It was a truth universally acknowledged.", "Mr. Darcy walked.", "They set out at dawn."],
                    add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def test_offloaded_encoder_reads_the_same_states(six_blocks, tokenizer, tmp_path):
    folder, budget = six_blocks
    whole = load_encoder(str(folder), layer=4, device="cpu", dtype="float32")
    spread = load_encoder(str(folder), layer=4, device="cpu", dtype="float32", max_memory=f"cpu:{budget}",
                          offload_dir=str(tmp_path / "offload"))
    assert "placement" not in whole.describe()
    blocks = spread.describe()["placement"]["blocks"]
    assert len(blocks) == 6 and "disk" in blocks and "cpu" in blocks  # the hooked block 3 and later lie on disk
    ids, mask = _batch(tokenizer)
    torch.testing.assert_close(spread.encode(ids, mask), whole.encode(ids, mask))
    layers = [0, 2, 4, 6]  # embeddings, a block in memory, blocks on disk
    torch.testing.assert_close(spread.encode_layers(ids, mask, layers), whole.encode_layers(ids, mask, layers))
    disk = [b for b, where in zip(spread.layers, blocks) if where == "disk"]
    assert all(p.device.type == "meta" for b in disk for p in b.parameters())  # read, then dropped: no copy kept


def test_default_places_a_model_that_does_not_fit(six_blocks, monkeypatch, tokenizer):
    folder, _ = six_blocks
    config = tf.AutoConfig.from_pretrained(folder)
    size = placement.weights_bytes(str(folder), None, config, torch.float32)
    loaded = tf.AutoModel.from_pretrained(folder)
    assert size == sum(p.numel() * 4 for p in loaded.parameters())  # the headers count the encoder's weights
    assert placement.weights_bytes(str(folder / "absent"), None, config, torch.float32) == size  # the config's
    monkeypatch.setattr(placement, "free_bytes", lambda device: 4 * size)
    assert "placement" not in load_encoder(str(folder), device="cpu", dtype="float32").describe()
    monkeypatch.setattr(placement, "free_bytes", lambda device: size)  # weights above FIT_SHARE of what is free
    enc = load_encoder(str(folder), device="cpu", dtype="float32")
    assert "disk" in enc.describe()["placement"]["blocks"]
    ids, mask = _batch(tokenizer)
    whole = load_encoder(str(folder), device="cpu", dtype="float32", device_map="none")
    torch.testing.assert_close(enc.encode(ids, mask), whole.encode(ids, mask))


def test_probe_readings_equal_in_memory_and_offloaded(six_blocks, small_corpus, tmp_path):
    folder, budget = six_blocks
    common = [*FAST, f"corpus={small_corpus}"]
    whole = run_probe(load_options(None, [*common, "device_map=none"], model=str(folder)), tmp_path / "whole")
    spread = run_probe(load_options(None, [*common, f"max_memory=cpu:{budget}",
                                           f"offload_dir={tmp_path / 'offload'}"], model=str(folder)),
                       tmp_path / "spread")
    assert "disk" in spread.encoder["placement"]["blocks"] and "placement" not in whole.encoder
    assert "bits_per_chunk" in whole.readings
    for name, reading in whole.readings.items():
        assert spread.readings[name]["value"] == pytest.approx(reading["value"], rel=1e-4, abs=1e-6), name
    assert spread.probe["token_accuracy"] == pytest.approx(whole.probe["token_accuracy"])
    assert spread.probe["ce"] == pytest.approx(whole.probe["ce"], rel=1e-5)


def test_recipe_space_of_a_fitted_probe_places_its_encoder(six_blocks, small_corpus, tmp_path, monkeypatch):
    """A sentence recipe's frozen space (a fitted probe) whose encoder does not fit is placed by default."""
    from memlab.models.sentence.spaces import SpaceHandle, load_space

    folder, _ = six_blocks
    run = tmp_path / "fitted"
    run_probe(load_options(None, [*FAST, f"corpus={small_corpus}", "control=false"],
                           model=str(folder)), run)
    spec = f"probe:{run}"
    whole = SpaceHandle(load_space(spec), spec)
    assert "placement" not in whole.space.encoder.describe()
    size = placement.weights_bytes(str(folder), None, tf.AutoConfig.from_pretrained(folder), torch.float32)
    monkeypatch.setattr(placement, "free_bytes", lambda device: size)  # the host cannot hold it with room to run
    spread = SpaceHandle(load_space(spec), spec).to("cpu")
    assert "disk" in spread.space.encoder.describe()["placement"]["blocks"]
    sentences = ["It was a fine day.", "Mr. Darcy walked."]
    torch.testing.assert_close(spread.encode_text(sentences), whole.encode_text(sentences))


@pytest.mark.parametrize("flags, says", [
    (["--max-memory", "cpu:lots"], "max_memory"),
    (["--max-memory", "cpu=200MB"], "DEVICE:SIZE"),
    (["--max-memory", "tpu:1GB"], "unknown device"),
    (["--max-memory", "cpu:1GB,cpu:2GB"], "twice"),
    (["--device-map", "sometimes"], "device_map"),
    (["--device-map", "none", "--max-memory", "cpu:1GB"], "device_map=none"),
])
def test_placement_options_refused_in_one_line(six_blocks, tmp_path, capsys, flags, says):
    out = tmp_path / "run"
    assert main(["probe", "--model", str(six_blocks[0]), "--out", str(out), *flags]) == 2
    assert says in one_line_error(capsys)
    assert not out.exists()


def test_placement_checks():
    assert placement.parse_max_memory("cpu:200MB, 0:1GiB" if torch.cuda.is_available() else "cpu:200MB") \
        == ({"cpu": 200 * 10**6, 0: 2**30} if torch.cuda.is_available() else {"cpu": 200 * 10**6})
    assert placement.parse_max_memory({"cpu": "1.5KiB"}) == {"cpu": 1536}
    if torch.cuda.device_count() < 8:
        with pytest.raises(ConfigError, match="GPU 7 is not on this machine"):
            placement.parse_max_memory("cuda:7:1GB")
    with pytest.raises(ConfigError, match="not synthetic encoders"):
        placement.check(placement.Placement(device_map="auto"), "synthetic:concat")
    placement.check(placement.Placement(device_map="none"), "synthetic:concat")  # what they do anyway
