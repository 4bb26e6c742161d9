"""A probe run read again: its recorded settings checked against each other, and any decoder part read back.

``memlab invert --probe RUN`` (and reloading the probe) reads a run's ``probe.json``, ``report.json`` and saved
decoder's config; a run whose files disagree (a layer edited by hand) is refused in one line, not read at one layer
by the inversion and at another by the decoder. A run made with a decoder part from an installed package (found
through its ``memlab.plugins`` entry point, installed into a temporary folder here) is read back without its
switched-off generic settings handed back as set. A synthetic encoder's run is one line too.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from memlab.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1] / "plugins" / "probe_rnn_package"

pytestmark = pytest.mark.usefixtures("one_thread")


def install(package: Path, site: Path) -> str:
    """What an installer lays down for ``package`` (no build, no network): its modules, and a ``.dist-info`` folder
    with the name, version and entry points of its ``pyproject.toml``. Returns the distribution's name."""
    meta = tomllib.loads((package / "pyproject.toml").read_text())
    project = meta["project"]
    for module in meta["tool"]["setuptools"]["packages"]:
        shutil.copytree(package / module, site / module, ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
        for group, items in project["entry-points"].items()))
    (info / "INSTALLER").write_text("tests\n")
    return project["name"]


@pytest.fixture(scope="module")
def rnn_plugin(tmp_path_factory):
    """The package installed into a temporary site folder on sys.path, its part registered by memlab's own plugin
    loading (the entry points of the installed distributions); removed afterwards."""
    import memlab.registry as registry
    from importlib.metadata import entry_points

    from memlab.probes.parts import PARTS

    site = tmp_path_factory.mktemp("site")
    install(PACKAGE, site)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    assert [ep.value for ep in entry_points(group=registry.ENTRY_POINT_GROUP) if ep.name == "probe_rnn"] == [
        "memlab_probe_rnn"]
    registry._plugins_loaded = False
    registry.load_plugins()
    assert "rnn" in PARTS["decoder"].names() and "memlab_probe_rnn" in sys.modules
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("memlab_probe_rnn", None)
    PARTS["decoder"]._items.pop("rnn", None)
    PARTS["decoder"]._docs.pop("rnn", None)
    importlib.invalidate_caches()


def _main(*argv, capsys):
    from memlab.app.cli import main

    code = main(list(argv))
    return code, capsys.readouterr()


PROBE = ("--model", "memlab-lm", "--seq-len", "4", "--n-train", "24", "--n-eval", "4", "--epochs", "1", "--no-bow",
         "--threads", "1", "chunk_by=tokens", "n_examples=2", "ci_resamples=50")
INVERT = ("--n", "2", "--forwards", "4", "--batch-size", "4", "--no-control", "--threads", "1")


@pytest.fixture(scope="module")
def rnn_run(rnn_plugin, tmp_path_factory):
    from memlab.app.cli import main

    run = tmp_path_factory.mktemp("rnn") / "run"
    assert main(["probe", *PROBE, "decoder=rnn", "rnn_width=8", "--out", str(run)]) == 0
    return run


def test_a_run_of_an_installed_plugins_decoder_is_read_beside_the_inversion(rnn_run, tmp_path, capsys):
    rep = json.loads((rnn_run / "report.json").read_text())
    assert rep["decoder"]["kind"] == "rnn" and rep["options"]["bag_head"] is False  # switched off by the probe
    out = tmp_path / "inv"
    code, cap = _main("invert", "--probe", str(rnn_run), *INVERT, "--out", str(out), capsys=capsys)
    assert code == 0, cap.err
    table = json.loads((out / "report.json").read_text())["table"]
    assert list(table["rows"]) == ["inversion", "trained probe"]
    probe = table["rows"]["trained probe"]  # the saved RNN read the same chunks again: the run's own accuracy
    run_acc = json.loads((rnn_run / "report.json").read_text())["probe"]["token_accuracy"]
    assert probe["token_accuracy"]["value"] == pytest.approx(run_acc, abs=1e-9) or len(table["chunks"]) < 4


def _edited(run: Path, dest: Path, file: str, **changes) -> Path:
    """A copy of ``run`` with entries of one of its JSON files changed (``section__key`` for a nested one)."""
    shutil.copytree(run, dest)
    data = json.loads((dest / file).read_text())
    for k, v in changes.items():
        section, _, key = k.partition("__")
        (data[section] if key else data)[key or section] = v
    (dest / file).write_text(json.dumps(data))
    return dest


@pytest.mark.parametrize("file,changes,says", [
    ("report.json", {"encoder__layer": 2}, "probe.json has layer -1 (layer 4 of 4) but report.json's encoder was read "
                                           "at layer 2"),
    ("probe.json", {"layer": 2}, "probe.json has layer 2 but report.json's options have layer -1"),
    ("probe.json", {"pool": "mean"}, "probe.json has pool 'mean' but report.json's options have pool None"),
    ("decoder/config.json", {"probe_part": {"name": "llama", "options": {}}},
     "decoder/config.json was saved by decoder part 'llama' but report.json's options have decoder 'rnn'"),
    ("decoder/config.json", {"probe_part": {"name": "rnn", "options": {"rnn_width": 12}}},
     "decoder/config.json has rnn_width 12 but report.json's options have rnn_width 8"),
])
def test_a_run_whose_files_disagree_is_refused_in_one_line(rnn_run, tmp_path, capsys, file, changes, says):
    edited = _edited(rnn_run, tmp_path / "edited", file, **changes)
    out = tmp_path / "inv"
    code, cap = _main("invert", "--probe", str(edited), *INVERT, "--out", str(out), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "recorded settings disagree" in lines[0] and says in lines[0], cap.err
    assert not out.exists()
    from memlab.probes.decoder.fitted import load_probe  # reloading the probe itself refuses it too

    with pytest.raises(ConfigError, match="recorded settings disagree"):
        load_probe(edited)


def test_a_synthetic_encoders_run_is_one_line(tmp_path, capsys):
    run = tmp_path / "syn"
    code, cap = _main("probe", "--model", "synthetic:concat", "--seq-len", "4", "--n-train", "16", "--n-eval", "4",
                      "--epochs", "1", "--no-bow", "--threads", "1", "n_examples=1", "ci_resamples=20", "--out",
                      str(run), capsys=capsys)
    assert code == 0, cap.err
    code, cap = _main("invert", "--probe", str(run), "--out", str(tmp_path / "inv"), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "'synthetic:concat', an encoder without a transformers model's layers" in \
        lines[0], cap.err
    assert not (tmp_path / "inv").exists()
