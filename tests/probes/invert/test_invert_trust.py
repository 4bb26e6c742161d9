"""A resume trusts nothing it reads: an edited ``invert.json`` is refused in one line (nothing saved touched), and a
chunk record that is not its chunk's (its text, ``recovered_ids`` or ``exact`` edited, with or without its
checksum made to match), a torn last line and a stray index never reach a report: the record is moved to
``chunks.rejected.jsonl`` with a warning, the chunk searched again, and the report is the uninterrupted run's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

ARGS = ["--model", "memlab-lm", "--layer", "2", "--seq-len", "6", "--n", "4", "--threads", "1", "--first-batch", "2"]
SAME = ("index", "text", "true_ids", "recovered_ids", "exact", "certificates", "tried", "exhaustive", "found_at")


def _cli(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


def _chunks(run):
    return [{k: c[k] for k in SAME} for c in json.loads((run / "report.json").read_text())["chunks"]]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    from memlab.app.cli import main

    run = tmp_path_factory.mktemp("trust") / "whole"
    assert main(["invert", *ARGS, "--out", str(run)]) == 0
    return run


def _cut(whole, tmp_path):
    """A copy of the finished run, as if stopped after its last chunk: its report gone."""
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    (cut / "report.json").unlink()
    (cut / "summary.txt").unlink()
    return cut


def _records(run):
    """The run's records, by index (the file holds them in the order the chunks finished)."""
    return sorted((json.loads(x) for x in (run / "chunks.jsonl").read_text().splitlines()), key=lambda r: r["index"])


def _write(run, recs, reseal: bool):
    from memlab.probes.invert.trust import seal

    lines = [json.dumps(seal({k: v for k, v in r.items() if k not in ("run", "sha")}, r["run"]) if reseal else r)
             for r in recs]
    (run / "chunks.jsonl").write_text("".join(x + "\n" for x in lines))


def _files(run):
    return {p.name: p.read_bytes() for p in run.iterdir()}


@pytest.mark.parametrize("section,name,value", [("model", "model", "memlab-lm-other"), ("text", "seq_len", 8),
                                                ("model", "states", "last"), ("model", "layer", 1)])
def test_an_edited_invert_json_is_refused_in_one_line_and_nothing_is_touched(whole, tmp_path, capsys, section,
                                                                              name, value):
    cut = _cut(whole, tmp_path)
    settings = json.loads((cut / "invert.json").read_text())
    settings["options"][section][name] = value
    (cut / "invert.json").write_text(json.dumps(settings))
    before = _files(cut)
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error:"), cap.err
    assert "names other options than the run was started with" in lines[0]
    assert _files(cut) == before  # nothing saved destroyed, nothing written


def test_an_edited_invert_json_with_its_fingerprint_remade_is_refused_by_the_records(whole, tmp_path, capsys):
    from memlab.probes.invert.trust import fingerprint

    cut = _cut(whole, tmp_path)
    settings = json.loads((cut / "invert.json").read_text())
    settings["options"]["text"]["seq_len"] = 8
    settings["fingerprint"] = fingerprint(settings["options"])
    (cut / "invert.json").write_text(json.dumps(settings))
    before = _files(cut)
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "made with other options than invert.json names" in lines[0], cap.err
    assert _files(cut) == before


def test_a_resume_refusal_comes_before_torch_is_imported(whole, tmp_path):
    cut = _cut(whole, tmp_path)
    settings = json.loads((cut / "invert.json").read_text())
    settings["options"]["text"]["seq_len"] = 8
    (cut / "invert.json").write_text(json.dumps(settings))
    code = ("import sys, time; t = time.monotonic(); from memlab.app.cli import main; rc = main(['invert', "
            f"'--resume', {str(cut)!r}]); print(rc, 'torch' in sys.modules, time.monotonic() - t)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    rc, torch_loaded, seconds = r.stdout.split()
    assert rc == "2" and torch_loaded == "False", r.stdout + r.stderr
    assert float(seconds) < 1.0


def _edit_text(r):
    r["text"] = r["text"] + " and more"


def _edit_recovered(r):
    """Another token at the second position, with everything the ids give made consistent (``exact``, the accuracy,
    the text): only the states can tell."""
    from memlab.app.cli import main  # noqa: F401  (the tokenizer below is memlab's)
    from memlab.probes.encoders import load_transformers

    ids = list(r["recovered_ids"])
    ids[1] = (ids[1] + 7) % 4096
    r["recovered_ids"] = ids
    r["exact"] = ids == r["true_ids"]
    r["token_accuracy"] = sum(a == b for a, b in zip(ids, r["true_ids"])) / len(ids)
    r["recovered_text"] = load_transformers("memlab-lm", layer=2, device="cpu").tokenizer.decode(ids)


def _edit_exact(r):
    r["exact"] = not r["exact"]


@pytest.mark.parametrize("reseal", [False, True], ids=["checksum-left", "checksum-remade"])
@pytest.mark.parametrize("edit", [_edit_text, _edit_recovered, _edit_exact], ids=["text", "recovered_ids", "exact"])
def test_an_edited_chunk_record_never_reaches_the_report(whole, tmp_path, capsys, edit, reseal):
    cut = _cut(whole, tmp_path)
    recs = _records(cut)
    original = json.dumps(recs[2])
    edit(recs[2])
    _write(cut, recs, reseal)
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    assert code == 0, cap.err
    warnings = [ln for ln in cap.err.splitlines() if ln.startswith("memlab: warning:")]
    assert len(warnings) == 1 and ("chunk 2" in warnings[0] or "checksum" in warnings[0]), cap.err
    assert _chunks(cut) == _chunks(whole)  # the chunk searched again: the uninterrupted run's report
    assert "resumed: 3 of 4 chunks kept, 1 to search" in (cut / "log.txt").read_text()
    rejected = [json.loads(x) for x in (cut / "chunks.rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 1 and json.loads(rejected[0]["line"]) != json.loads(original)  # kept aside, not lost
    assert sorted(r["index"] for r in _records(cut)) == [0, 1, 2, 3]


def test_a_torn_last_line_is_cut_off_before_anything_is_appended(whole, tmp_path, capsys):
    cut = _cut(whole, tmp_path)
    text = (cut / "chunks.jsonl").read_text()
    lines = text.splitlines()
    torn = lines[3][: len(lines[3]) // 2]
    (cut / "chunks.jsonl").write_text("".join(x + "\n" for x in lines[:3]) + torn)  # killed mid-write
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    assert code == 0, cap.err
    recs = _records(cut)  # every line a whole record: none written onto the torn one
    assert sorted(r["index"] for r in recs) == [0, 1, 2, 3]
    assert _chunks(cut) == _chunks(whole)
    rejected = [json.loads(x) for x in (cut / "chunks.rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejected] == [torn] and "torn" in rejected[0]["why"]


def test_the_next_record_is_never_written_onto_a_torn_line(tmp_path):
    from memlab.probes.invert.trust import append_line

    path = tmp_path / "chunks.jsonl"
    path.write_text('{"index": 0}\n{"index": 1, "te')
    append_line(path, '{"index": 1}')
    assert path.read_text() == '{"index": 0}\n{"index": 1}\n'
    assert json.loads((tmp_path / "chunks.rejected.jsonl").read_text())["line"] == '{"index": 1, "te'


def test_a_stray_record_is_dropped_with_a_warning(whole, tmp_path, capsys):
    from memlab.probes.invert.trust import seal

    cut = _cut(whole, tmp_path)
    recs = _records(cut)
    stray = seal({k: v for k, v in dict(recs[0], index=99).items() if k not in ("run", "sha")}, recs[0]["run"])
    _write(cut, recs + [stray], reseal=False)
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    assert code == 0, cap.err
    warnings = [ln for ln in cap.err.splitlines() if ln.startswith("memlab: warning:")]
    assert len(warnings) == 1 and "stray record: index 99" in warnings[0], cap.err
    assert sorted(r["index"] for r in _records(cut)) == [0, 1, 2, 3]  # gone from the run's records
    assert json.loads(json.loads((cut / "chunks.rejected.jsonl").read_text())["line"])["index"] == 99  # kept aside
    assert _chunks(cut) == _chunks(whole)


def test_a_trusted_resume_keeps_every_record_and_searches_nothing(whole, tmp_path, capsys):
    cut = _cut(whole, tmp_path)
    t = time.monotonic()
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    assert code == 0, cap.err
    assert "memlab: warning" not in cap.err and not (cut / "chunks.rejected.jsonl").exists()
    assert "resumed: 4 of 4 chunks kept, 0 to search" in (cut / "log.txt").read_text()
    assert _chunks(cut) == _chunks(whole) and time.monotonic() - t < 120
