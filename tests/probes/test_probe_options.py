"""The probe's options: sections and part options hold every default once, the reference and ``--help`` show those
defaults, options of parts not chosen are refused by name, and validation runs once without changing its input."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from memlab.app.cli import main
from memlab.config import ConfigError
from memlab.probes.options import ProbeOptions, ResolvedOptions, docs, load_options, option_values, resolved, validate
from memlab.probes.parts import PARTS
from memlab.probes.sections import PART_OPTIONS, SECTIONS

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "probes_reference.md"


def test_every_option_has_one_home_and_a_docstring():
    homes: dict[str, list[str]] = {}
    for name, cls in [*SECTIONS.items(), *((f"{k}={p}", c) for (k, p), c in PART_OPTIONS.items())]:
        for f in fields(cls):
            homes.setdefault(f.name, []).append(name)
    assert {k: v for k, v in homes.items() if len(v) > 1} == {}
    assert set(homes) == {f.name for f in fields(ProbeOptions)} - {"part_options"}
    assert not [k for k in homes if not docs(ProbeOptions).get(k)]
    for (kind, part), cls in PART_OPTIONS.items():  # each built-in part names its own class
        assert PARTS[kind].get(part).options_class is cls


def _reference_defaults() -> dict[str, str]:
    """option -> its default cell in the reference's option tables (sections and parts)."""
    text = REFERENCE.read_text().split("## Options", 1)[1].split("## Encoder specs", 1)[0]
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`") and cells[0].startswith("`") and "=" in cells[0]:
            cells = cells[1:]  # a part's row: part, option, default, meaning
        if len(cells) >= 3 and cells[0].startswith("`"):
            names = re.findall(r"`([a-z_0-9]+)`", cells[0].split("(")[0])
            values = [v.strip() for v in cells[1].split(",")] if len(names) > 1 else [cells[1]]
            out.update(zip(names, values))
    return out


def _as_value(cell: str):
    if not (cell.startswith("`") and cell.endswith("`")):
        return None  # words: an unset default ("the shortcut's", "none", "torch's")
    v = yaml.safe_load(cell.strip("`"))
    try:
        return float(v) if isinstance(v, str) and re.fullmatch(r"[0-9.e+-]+", v) else v
    except ValueError:
        return v


def test_the_reference_shows_the_dataclasses_defaults():
    ref = _reference_defaults()
    defaults = ProbeOptions()
    for f in fields(ProbeOptions):
        if f.name == "part_options":
            continue
        assert f.name in ref, f"{f.name} is not in docs/probes_reference.md's option tables"
        assert _as_value(ref[f.name]) == getattr(defaults, f.name), f.name


def test_help_reads_its_defaults_from_the_dataclasses(monkeypatch, capsys):
    from memlab.probes.sections import FitSection

    monkeypatch.setattr(FitSection.__dataclass_fields__["epochs"], "default", 7.0)
    assert main(["probe", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 7)" in text and "(default 30)" not in text
    assert "(default 0.002)" in text  # lr, as the fit section holds it


def test_validation_runs_once_and_does_not_change_its_input():
    opts = ProbeOptions(model="synthetic:concat", device="auto")
    got = validate(opts)
    assert opts.device == "auto" and isinstance(got, ResolvedOptions) and got.device != "auto"
    assert got is not opts and resolved(got) is got
    assert isinstance(load_options(None, ["device=cpu"]), ResolvedOptions)


def test_sections_in_yaml_and_flat_names_read_the_same(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("name: mine\nrecipe: probe\noptions:\n  model: synthetic:concat\n  epochs: 3\n"
                    "  decoder: llama\n")
    sec = tmp_path / "sections.yaml"
    sec.write_text("name: mine\nrecipe: probe\noptions:\n  encoder: {model: synthetic:concat}\n"
                   "  fit: {epochs: 3, lr: 0.001}\n")
    a, b = load_options(flat), load_options(sec)
    assert a.name == b.name == "mine" and a.epochs == b.epochs == 3.0 and b.lr == 0.001
    assert b.section("fit").epochs == 3.0 and b.section("encoder").model == "synthetic:concat"
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: probe\noptions:\n  fit: {colour: red}\n")
    with pytest.raises(ConfigError, match="'fit.colour' is not an option of the fit section"):
        load_options(bad)


@pytest.mark.parametrize("argv,match", [
    (["--decoder", "pretrained:memlab-lm", "num_layers=3"], "'num_layers' applies to decoder=llama"),
    (["--decoder", "pretrained:memlab-lm", "--hidden-size", "64"], "'hidden_size' applies to "),
    (["contained_lr=0.5", "--no-control"], "'contained_lr' trains the probe started as its control, which "
                                           "control=false (--no-control) does not fit"),
    (["--contained-lr", "0.5", "val_fraction=0"], "which val_fraction=0 does not fit"),
    (["bag_head=false", "plain_input_dropout=0.2"], "'plain_input_dropout' applies to the plain decoder"),
    (["--layers-sequence"], "'layers_sequence' applies to a layer sweep"),
    (["select_decoder=false", "plain_input_dropout=0.2"], "'plain_input_dropout' applies to the plain decoder"),
    (["--no-bow", "bow_weight_decay=0.1"], "'bow_weight_decay' applies to readouts=bow"),
    (["--no-readouts", "bow_weight_decay=0.1"], "'bow_weight_decay' applies to readouts=bow"),
    (["bow_lr=fast"], "'bow_lr' must be a number"),
    (["colour=red"], "unknown config key 'colour'; valid keys: "),
])
def test_options_that_nothing_reads_are_one_line(argv, match, tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["probe", "--model", "synthetic:concat", "--out", str(out), *argv]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("memlab: error:")]
    assert len(err) == 1 and match in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("yaml,match", [
    ("fit:\n  hidden_size: 64\n", "'fit.hidden_size' is not an option of the fit section; it belongs to "),
    ("fit:\n  num_heads: 2\n", "it belongs to decoder=llama (in the decoder section)"),
    ("fit:\n  prefix_len: 2\n", "belongs to conditioning=prefix (in the decoder section)"),
    ("decoder:\n  epochs: 2\n", "'decoder.epochs' is not an option of the decoder section; it belongs to the fit "
                                  "section"),
    ("decoder:\n  kind: pretrained:memlab-lm\n  hidden_size: 64\n", "'hidden_size' applies to "),
])
def test_a_misplaced_or_ignored_yaml_key_says_where_it_belongs(yaml, match, tmp_path, capsys):
    cfg = tmp_path / "probe.yaml"
    cfg.write_text("model: synthetic:concat\n" + yaml)
    assert main(["probe", "--config", str(cfg), "--out", str(tmp_path / "never")]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("memlab: error:")]
    assert len(err) == 1 and match in err[0], err


def test_options_nested_by_part_read_as_their_flat_names():
    """``decoder: {kind: NAME, ...}`` names the decoder part and its options; the flags and key=value agree."""
    nested = load_options(None, model="synthetic:concat", decoder={"kind": "llama", "hidden_size": 64},
                          fit={"epochs": 2})
    flat = load_options(None, ["hidden_size=64", "epochs=2"], model="synthetic:concat")
    assert (nested.decoder, nested.hidden_size, nested.epochs) == ("llama", 64, 2.0)
    assert option_values(nested) == option_values(flat)


def test_a_configs_name_names_its_run_folder(tmp_path, monkeypatch, small_corpus):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(f"name: my-probe\nrecipe: probe\noptions:\n  model: synthetic:concat\n  corpus: {small_corpus}\n"
                   "  text: {seq_len: 4, n_train: 24, n_eval: 4}\n  fit: {epochs: 1}\n  readouts: {readouts: []}\n"
                   "  n_examples: 1\n  ci_resamples: 20\n")
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "--config", str(cfg), "--no-control", "hidden_size=16", "num_layers=1"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("my-probe-") and (run / "report.json").is_file()


LIGHT = """
import argparse, sys
from memlab.app.commands import probe
parser = argparse.ArgumentParser(prog="memlab")
probe.add_parser(parser.add_subparsers(dest="verb"))
assert "torch" not in sys.modules and "transformers" not in sys.modules, "the parser imported torch"
try:
    parser.parse_args(ARGV)
except SystemExit as e:
    print("exit", e.code)
assert "torch" not in sys.modules and "transformers" not in sys.modules, "answering imported torch"
"""


@pytest.mark.parametrize("argv", [["probe", "--help"], ["probe", "--epochs", "many"], ["probe", "--bag-head=3"]])
def test_the_probe_command_line_imports_no_torch(argv):
    """`memlab probe --help` and a malformed flag answer from the option dataclasses alone (a fresh interpreter)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LIGHT.replace("ARGV", repr(argv))], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == ("exit 0" if argv[-1] == "--help" else "exit 2")


@pytest.mark.parametrize("flag", ["--no-readouts", "--no-bow"])
def test_no_readouts_turns_off_every_readout_and_keeps_its_old_name(flag):
    """--no-readouts (old name --no-bow, still taken) sets readouts=[]: no read-out at all, not only the bag head."""
    import argparse

    from memlab.app.commands import probe as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["probe", "--model", "synthetic:concat", flag, "readouts=[bow,align]"])
    assert command.flag_values(args)["readouts"] == []
    assert "readouts" not in command.flag_values(parser.parse_args(["probe", "--model", "synthetic:concat"]))
