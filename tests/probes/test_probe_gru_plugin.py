"""The guide's plugin example: a decoder with options of its own, from a package outside memlab's tree
(tests/plugins/probe_gru, loaded through a ``memlab.plugins`` entry point), is listed, trains, saves, loads again,
has a generic setting it does not honour refused, and its options stay out of the embedding cache's key."""

from __future__ import annotations

import json
import re
from importlib.metadata import EntryPoint

import pytest
import torch

from memlab.app.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gru_plugin():
    """The plugin loaded as an installed package's is: through its entry point."""
    import memlab.registry as registry

    mp = pytest.MonkeyPatch()
    fake = EntryPoint(name="probe_gru", value="tests.plugins.probe_gru", group=registry.ENTRY_POINT_GROUP)
    mp.setattr(registry, "entry_points", lambda group: [fake])
    mp.setattr(registry, "_plugins_loaded", False)
    registry.load_plugins()
    yield
    mp.undo()


def _base(corpus, out, *extra):
    return ["probe", "--model", "synthetic:concat", "--corpus", str(corpus), "--out", str(out), "--n-train", "48",
            "--n-eval", "8", "--seq-len", "4", "--epochs", "1", "--no-bow", "n_examples=1", "ci_resamples=50",
            "decoder=gru", *extra]


def test_a_decoder_from_an_installed_plugin_is_listed_trains_and_loads(gru_plugin, small_corpus, tmp_path, capsys):
    from memlab.probes.decoder.fitted import load_probe

    assert main(["list", "probe_decoders"]) == 0
    assert re.search(r"^  gru .*\[options: hidden_size=24, gru_layers=1\]$", capsys.readouterr().out, re.M)
    out, cache = tmp_path / "run", tmp_path / "cache"
    assert main(_base(small_corpus, out, "hidden_size=16", "--cache-dir", str(cache))) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["decoder"]["kind"] == "gru" and rep["timing"]["encode_cached"] is False
    saved = json.loads((out / "decoder" / "config.json").read_text())
    assert saved["probe_part"] == {"name": "gru", "options": {"hidden_size": 16, "gru_layers": 1}}
    assert rep["options"]["bag_head"] is False and rep["options"]["select_decoder"] is False
    fitted = load_probe(out)
    dec = fitted.decoder
    assert type(dec).__name__ == "GruDecoder" and dec.gru.hidden_size == 16
    # the reloaded decoder is the trained one: its weights are those saved, and it reads the chunk it was read on
    from safetensors.torch import load_file

    weights = load_file(str(out / "decoder" / "model.safetensors"))
    assert weights.keys() == dec.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in dec.state_dict().items())
    z = fitted.encode_text(["It was a truth"])  # (1, D)
    logp = fitted.decode_logits(z, torch.full((1, 3), int(dec.config.start_id)))  # (1, 3, V)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(1, 3), atol=1e-4)
    assert isinstance(fitted.generate(z, max_new_tokens=3)[0], str)
    # its own option changed: the embeddings are read from the cache, not encoded again
    again = tmp_path / "again"
    assert main(_base(small_corpus, again, "hidden_size=8", "--cache-dir", str(cache))) == 0
    rep2 = json.loads((again / "report.json").read_text())
    assert rep2["timing"]["encode_cached"] is True
    assert load_probe(again).decoder.gru.hidden_size == 8


@pytest.mark.parametrize("setting", ["--conditioning=prefix", "bag_head=true", "select_decoder=false",
                                     "cond_dropout=0.1", "plain_input_dropout=0.2"])
def test_a_generic_setting_the_plugin_decoder_does_not_honour_is_refused(gru_plugin, small_corpus, tmp_path, capsys,
                                                                        setting):
    out = tmp_path / "refused"
    assert main(_base(small_corpus, out, setting)) == 2  # the CLI's one line and exit 2
    err = capsys.readouterr().err.strip().splitlines()
    name = setting.lstrip("-").split("=")[0]
    assert len(err) == 1 and err[0].startswith("memlab: error:") and f"'{name}' is not read by decoder=gru" in err[0]
    assert not out.exists()


def test_a_saved_run_of_an_unregistered_decoder_part_says_so(gru_plugin, tmp_path):
    from memlab.errors import ModelError
    from memlab.probes.decoder.build import load_decoder

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "memlab_probe_decoder",
                                                      "probe_part": {"name": "no_such_part", "options": {}}}))
    with pytest.raises(ModelError, match="decoder part 'no_such_part' is not registered"):
        load_decoder(tmp_path)
