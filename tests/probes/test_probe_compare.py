"""probe --compare (memlab.probes.sweeps.compare): the scratch decoder, a pretrained decoder and the alignment read-out on
one encoder pass, over a learning curve; each row as a probe of that one method gives it; the table names each
row's targets; the plot is written; bad methods refused in one line."""

from __future__ import annotations

import json

import pytest

from memlab.app.cli import main
from memlab.paths import resource
from tests.conftest import one_line_error

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = resource("checkpoints") / "token_lm-toy"
"""A tiny pretrained causal LM in memlab's BPE (the tokenizer of the synthetic encoders and the memory autoencoder)."""
SPECS = ["llama", f"pretrained:{TOY}[conditioning=prefix,prefix_len=2]", "align"]
METHODS = ",".join(SPECS)
COMMON = ["--model", "synthetic:bag", "--seq-len", "8", "--n-eval", "16", "--epochs", "0.5", "--batch-size", "16",
          "--threads", "1", "max_chunk_tokens=32", f"chunk_tokenizer={TOY}", "n_examples=1", "ci_resamples=200",
          "select_decoder=false"]


@pytest.fixture
def encoded(monkeypatch):
    """Chunks the probed (synthetic) encoder embeds, call by call."""
    from memlab.probes.encoders.synthetic import SyntheticEncoder

    rows, real = [], SyntheticEncoder.encode

    def counted(self, input_ids, attention_mask):
        rows.append(int(input_ids.shape[0]))
        return real(self, input_ids, attention_mask)

    monkeypatch.setattr(SyntheticEncoder, "encode", counted)
    return rows


def _rows(out):
    return json.loads((out / "curve.json").read_text())["rows"]


def test_a_comparison_reads_every_method_from_one_encoder_pass(tmp_path, encoded):
    cfg = tmp_path / "compare.yaml"  # a comparison in YAML: the methods as a list
    cfg.write_text("recipe: probe\noptions:\n  compare:\n    - llama\n"
                   f"    - \"pretrained:{TOY}[conditioning=prefix,prefix_len=2]\"\n    - align\n")
    out = tmp_path / "cmp"
    assert main(["probe", "--config", str(cfg), "--n-train", "24,48", "--out", str(out), *COMMON]) == 0
    assert sum(encoded) == 48 + 16  # the largest size's training chunks and the held-out ones, once
    rows = _rows(out)
    specs = SPECS
    assert [(r["n_train"], r["method"]) for r in rows] == [(n, s) for n in (24, 48) for s in specs]
    for r in rows:
        assert r["bits"]["low"] <= r["bits"]["value"] <= r["bits"]["high"]
        assert 0 <= r["tf1"]["value"] <= 1 and r["target_tokens"] > 0
    by = {r["method"]: r for r in rows if r["n_train"] == 48}
    assert by["llama"]["targets"] == "the encoder's" and by[specs[1]]["targets"] == str(TOY)
    assert "memory_ae" in by["align"]["targets"] and 0 <= by["align"]["own"]["recovered"] <= 1  # its ceiling
    # the align read-out's labels hold each chunk's end token: more held-out targets than the decoders'
    assert by["align"]["target_tokens"] == by["llama"]["target_tokens"] + 16
    md = (out / "curve.md").read_text()
    assert all(s in md for s in specs) and "targets" in md
    png = out / "plots" / "compare.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    from memlab.probes.sweeps.compare import plot

    one = plot([r for r in rows if r["n_train"] == 48], tmp_path / "one.png", "one size")  # error bars
    assert one.read_bytes()[:4] == b"\x89PNG"


def test_each_row_is_the_probe_of_that_method_alone(tmp_path, encoded):
    out = tmp_path / "cmp"
    assert main(["probe", "--compare", METHODS, "--n-train", "24,48", "--out", str(out), *COMMON]) == 0
    got = {r["method"]: r for r in _rows(out) if r["n_train"] == 48}
    alone = [("llama", ["--decoder", "llama", "--no-bow"]),
             (SPECS[1], ["--decoder", f"pretrained:{TOY}", "--no-bow", "conditioning=prefix", "prefix_len=2"]),
             ("align", ["readouts=[align]", "sequence=false"])]
    for spec, extra in alone:
        single = tmp_path / f"one-{SPECS.index(spec)}"
        assert main(["probe", "--n-train", "48", "--out", str(single), *COMMON, *extra]) == 0
        readings = json.loads((single / "report.json").read_text())["readings"]
        row = got[spec]
        assert set(row["readings"]) == set(readings)
        for k, v in readings.items():
            assert row["readings"][k] == pytest.approx(v, abs=1e-9), (spec, k)
        key = "bits_per_chunk" if spec != "align" else "align_bits_per_chunk"
        assert row["bits"] == readings[key]


def test_a_global_part_option_goes_to_the_methods_it_concerns():
    from memlab.probes.options import compared, load_options

    opts = load_options(None, [f"compare={METHODS}", f"target_tokenizer={TOY}", "seq_len=8", "epochs=2"],
                        model="synthetic:bag")
    got = {m.spec: o for m, o in compared(opts)}
    assert list(got) == SPECS
    assert got["llama"].target_tokenizer == str(TOY) and got[SPECS[1]].target_tokenizer is None  # llama's alone
    assert got[SPECS[1]].conditioning == "prefix" and got["llama"].conditioning == "unrolled"  # its brackets
    assert all(o.epochs == 2 and o.compare is None for o in got.values())  # a general option: every method's
    assert got["align"].readouts == ["align"] and not got["align"].sequence and got["llama"].readouts == []


@pytest.mark.parametrize("extra, says", [
    (["--compare", "llama,nope"], "unknown method 'nope'"),
    (["--compare", "llama,pretrained"], "needs an argument"),
    (["--compare", "llama[lora_r=8],align"], "'lora_r' applies to decoder=pretrained"),
    (["--compare", "llama,align", "lora_r=8"], "'lora_r' applies to none of the compared methods"),
    (["--compare", "llama,align[epochs=3]"], "'epochs' does not apply to the read-out 'align'"),
    (["--compare", "llama[seq_len=4],align"], "'seq_len' is the comparison's"),
    (["--compare", "llama,align", "--decoder", "llama"], "'decoder' and 'compare' both choose"),
    (["--compare", "llama[conditioning=prefix,align"], "unbalanced '['"),
    (["--compare", "llama,llama"], "names 'llama' twice"),
])
def test_bad_comparisons_are_refused_in_one_line(tmp_path, capsys, extra, says):
    out = tmp_path / "bad"
    assert main(["probe", "--n-train", "24,48", "--out", str(out), *COMMON, *extra]) == 2
    line = one_line_error(capsys)
    assert says in line, line
    assert not out.exists()
