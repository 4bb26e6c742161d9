"""probe and invert: what the early check (before torch) refuses is what the full check refuses, in the same words;
unknown names are refused early only where no plugin package can add parts; and a run the corpus cannot give, or a
folder a full disk cannot hold, is refused in one line that says how many chunks there are or which folder. The
table of single bad inputs, timed in a fresh interpreter, is ``test_bad_input_sweep.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_options_checked_early_are_the_options_checked_late():
    """What the early check refuses, the full check refuses too (the same values, the same message)."""
    from memlab.errors import ConfigError
    from memlab.probes.options import load_options, precheck

    for over in (["epochs=0"], ["lr=nan"], ["cache_dtype=bogus"], ["seed=-1"], ["seq_len=8,,16"], ["n_eval=0"]):
        with pytest.raises(ConfigError) as early:
            precheck(None, over, model="synthetic:concat")
        with pytest.raises(ConfigError) as late:
            load_options(None, over, model="synthetic:concat")
        assert str(early.value) == str(late.value)


@pytest.mark.parametrize("over", [["no_such_key=1"], ["decoder=bogus"], ["pool=maxx"], ["readouts=[bow,nope]"],
                                  ["scorers=[no_such_scorer]"], ["conditioning=sideways"]])
def test_an_unknown_name_is_refused_early_in_the_words_of_the_full_check(over):
    from memlab.errors import ConfigError
    from memlab.probes.options import load_options, parts_complete, precheck

    assert parts_complete()  # no plugin package installed here, or the plugins are loaded
    with pytest.raises(ConfigError) as early:
        precheck(None, over, model="synthetic:concat")
    with pytest.raises(ConfigError) as late:
        load_options(None, over, model="synthetic:concat")
    assert str(early.value) == str(late.value)


def test_unknown_names_wait_for_the_plugins_when_a_plugin_package_is_installed(monkeypatch):
    from importlib.metadata import EntryPoint

    import memlab.registry as registry
    from memlab.probes.options import precheck

    fake = EntryPoint(name="elsewhere", value="no_such_package.parts", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [fake])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    precheck(None, ["decoder=gru", "gru_layers=2"], model="m")  # a plugin's part and option: judged once loaded


def test_the_parts_registered_before_the_plugins_load_are_all_of_memlabs_own():
    """The early check judges part and option names from the parts registered when memlab.probes is imported: loading
    memlab's plugin packages (model families, curricula) must add no probe part."""
    code = ("import memlab.probes\nfrom memlab.probes.parts import PARTS\nfrom memlab import registry\n"
            "before = {k: sorted(PARTS[k]._items) for k in PARTS}\n"
            "for name in registry.PLUGIN_PACKAGES:\n    __import__(name)\n"
            "after = {k: sorted(PARTS[k]._items) for k in PARTS}\n"
            "print(before == after, before, after)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.stdout.startswith("True"), p.stdout + p.stderr


@pytest.mark.usefixtures("one_thread")
def test_n_beyond_the_held_out_chunks_of_the_corpus_is_refused(small_corpus, tmp_path, capsys):
    from memlab.app.cli import main

    out = tmp_path / "inv"
    code = main(["invert", "--model", "memlab-lm", "--layer", "1", "--corpus", str(small_corpus), "--seq-len", "400",
                 "--n", "500", "--n-eval", "500", "--threads", "1", "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memlab: error")]
    assert code == 2 and len(err) == 1, err
    m = re.search(r"--n 500 is more than the (\d+) held-out chunks of 400 words that the test split of '.*' gives; "
                  r"give --n (\d+) or fewer", err[0])
    assert m and m.group(1) == m.group(2) and 0 < int(m.group(1)) < 500, err[0]
    assert not out.exists()


def test_a_full_disk_when_the_folder_is_claimed_names_it_and_leaves_nothing(tmp_path, monkeypatch):
    """The run's folder claimed on a disk that fills between the early check and the claim: the lock line cannot be
    written; one line names the folder, and the folder the claim made is gone."""
    import builtins
    import errno

    from memlab import rundir
    from memlab.errors import MemlabError

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir, "open", lambda *a, **k: Full(builtins.open(*a, **k)), raising=False)
    out = tmp_path / "new" / "inv"
    with pytest.raises(MemlabError, match=rf"cannot write into {re.escape(str(out))}: the disk is full"):
        rundir.claim(out, fresh=True, what="inversion")
    assert sorted(tmp_path.iterdir()) == []
