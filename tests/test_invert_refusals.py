"""memlab invert refuses, in one line and leaving nothing behind, a run it cannot do as asked: more chunks (``--n``)
than the corpus's held-out split gives is an error naming how many there are, never a smaller run without a word."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


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
