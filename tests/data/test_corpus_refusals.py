"""A corpus that cannot be read is one line that says where: a saved folder whose ``.arrow`` bytes are damaged (the
row), a saved folder without ``state.json`` (not a missing field), a JSON lines file with a broken line (the file and
the line number, and no line of ``datasets`` beside memlab's), a path that is not there (before torch is imported)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memlab.data.corpus import load_corpus
from memlab.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    import datasets

    datasets.disable_progress_bars()
    out = tmp_path_factory.mktemp("saved") / "corpus"
    datasets.Dataset.from_dict({"text": [f"Sentence {i} of a saved corpus, long enough to hold some bytes. " * 4
                                         for i in range(40)]}).save_to_disk(str(out))
    return out


def test_a_saved_folder_reads_whole_before_it_is_damaged(saved):
    assert len(load_corpus(str(saved))) == 40


def test_damaged_arrow_bytes_are_one_line_naming_the_row(saved, tmp_path):
    bad = tmp_path / "damaged"
    shutil.copytree(saved, bad)
    f = next(bad.glob("data-*.arrow"))
    b = bytearray(f.read_bytes())
    for j in range(len(b) // 2, len(b) // 2 + 64):  # inside the text buffer: the schema still reads
        b[j] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(DataError, match=r"damaged: row \d+ cannot be read, its bytes are damaged") as e:
        load_corpus(str(bad))
    assert "\n" not in str(e.value)


def test_a_saved_folder_without_state_json_says_so(saved, tmp_path):
    bad = tmp_path / "partial"
    shutil.copytree(saved, bad)
    (bad / "state.json").unlink()
    with pytest.raises(DataError, match="whose state.json is missing") as e:
        load_corpus(str(bad))
    assert "field" not in str(e.value)


@pytest.mark.parametrize("name,text,phrase", [
    ("broken.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": oops}\n', "broken.jsonl: line 3 is not a JSON object"),
    ("listed.jsonl", '{"text": "a"}\n[1, 2]\n', "listed.jsonl: line 2 is a JSON list, not an object"),
    ("array.json", '[{"text": "a"},\n {"text": ]\n', "array.json: not valid JSON at line 2"),
])
def test_a_broken_json_file_names_its_line(tmp_path, name, text, phrase):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(DataError, match=phrase):
        load_corpus(str(f))


def test_the_command_says_the_broken_line_once_and_nothing_of_datasets(tmp_path, capfd):
    from memlab.app.cli import main

    f = tmp_path / "broken.jsonl"
    f.write_text('{"text": "It was a truth universally acknowledged."}\n{"text": oops}\n')
    out = tmp_path / "run"
    rc = main(["probe", "--model", "synthetic:concat", "--corpus", str(f), "--out", str(out), "--n-train", "8",
               "--n-eval", "2", "--seq-len", "4"])
    err = capfd.readouterr().err  # every line written to the descriptor, a library's logger's included
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert lines == [f"memlab: error: {f}: line 2 is not a JSON object (Expecting value at column 10); each line of "
                     "a JSON lines file holds one record"], err
    assert not out.exists()
