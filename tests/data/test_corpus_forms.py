"""Every form of text a user keeps: .jsonl, .parquet, .arrow (both Arrow formats), folders saved with
``save_to_disk`` (a Dataset, a DatasetDict) and a text field other than ``text``; all written here, none from a hub."""

from __future__ import annotations

import json
import shutil

import pytest

from memlab.app.cli import main
from memlab.data.corpus import load_corpus
from memlab.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def records():
    """Forty records of Austen prose in a field named ``body`` (and an ``id`` that is not text)."""
    text = " ".join(d.text for d in load_corpus("austen")[:1])
    words = text.split()[2000:2000 + 40 * 120]
    return [{"id": i, "body": " ".join(words[i * 120:(i + 1) * 120])} for i in range(40)]


def _forms(records, root):
    """The same records as each form, each named ``corpus`` (so their documents' ids agree): path by form."""
    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather

    ds = datasets.Dataset.from_list(records)
    out = {}
    (root / "jsonl").mkdir()
    out["jsonl"] = root / "jsonl" / "corpus.jsonl"
    out["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "parquet").mkdir()
    out["parquet"] = root / "parquet" / "corpus.parquet"
    ds.to_parquet(str(out["parquet"]))
    out["saved"] = root / "saved" / "corpus"
    ds.save_to_disk(str(out["saved"]))
    out["dict"] = root / "dict" / "corpus"
    datasets.DatasetDict({"train": ds, "extra": ds.select(range(3))}).save_to_disk(str(out["dict"]))
    (root / "arrow").mkdir()
    out["arrow"] = root / "arrow" / "corpus.arrow"  # the streaming format datasets writes
    shutil.copy(next(out["saved"].glob("*.arrow")), out["arrow"])
    (root / "ipc").mkdir()
    out["ipc"] = root / "ipc" / "corpus.arrow"  # the Arrow IPC file format
    feather.write_feather(pa.Table.from_pylist(records), str(out["ipc"]), compression="uncompressed")
    return out


@pytest.fixture(scope="module")
def forms(records, tmp_path_factory):
    return _forms(records, tmp_path_factory.mktemp("forms"))


def test_every_form_reads_the_same_documents(forms, records):
    want = [r["body"] for r in records]
    seen = {}
    for name, path in forms.items():
        docs = load_corpus(str(path), text_field="body")
        assert [d.text for d in docs] == want, name
        seen[name] = [d.id for d in docs]
    assert all(ids == seen["jsonl"] for ids in seen.values())  # same ids: the same held-out splits


def test_a_dataset_dict_gives_the_split_asked_like_a_hub_dataset(forms, records):
    assert len(load_corpus(str(forms["dict"]), text_field="body", hf_split="extra")) == 3
    with pytest.raises(DataError, match=r"no split 'validation'.*splits: train, extra"):
        load_corpus(str(forms["dict"]), text_field="body", hf_split="validation")


@pytest.mark.parametrize("form", ["saved", "dict", "arrow", "ipc", "parquet"])
def test_a_missing_field_is_one_line_naming_the_fields(forms, form):
    with pytest.raises(DataError) as e:
        load_corpus(str(forms[form]))
    assert "no field 'text'" in str(e.value) and "fields: id, body" in str(e.value) and "\n" not in str(e.value)


def test_a_damaged_saved_folder_is_one_line(forms, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(forms["saved"], bad)
    for f in bad.glob("*.arrow"):
        f.write_bytes(b"not arrow")
    with pytest.raises(DataError, match="could not be read as a saved dataset"):
        load_corpus(str(bad), text_field="body")


TINY = ["--seq-len", "8", "--n-train", "48", "--n-eval", "8", "--epochs", "1", "--no-control", "--no-bow",
        "--threads", "1", "ci_resamples=50"]


def test_the_probe_reads_a_saved_folder_with_text_field_as_it_reads_a_jsonl(forms, tmp_path, capsys):
    reports = {}
    for name in ("jsonl", "saved"):
        out = tmp_path / name
        assert main(["probe", "--model", "synthetic:concat", "--corpus", str(forms[name]), "--text-field", "body",
                     "--out", str(out), *TINY]) == 0
        reports[name] = json.loads((out / "report.json").read_text())
    a, b = reports["jsonl"], reports["saved"]
    assert a["probe"]["ce"] == pytest.approx(b["probe"]["ce"], rel=1e-6)  # the same chunks, the same fit
    assert a["data_split"] == b["data_split"] and b["options"]["text_field"] == "body"
    capsys.readouterr()
    out = tmp_path / "nofield"
    assert main(["probe", "--model", "synthetic:concat", "--corpus", str(forms["saved"]), "--out", str(out),
                 *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memlab: error:") and "fields: id, body" in err[0]


@pytest.mark.parametrize("need", [1, 5_000, 40_000, 10**9])
def test_the_probe_picks_from_the_stream_what_it_picked_from_the_whole_list(small_corpus, forms, need):
    """The probe's units are chosen while the corpus streams past (only the chosen texts held): the very texts, in
    the very order, that the in-memory list of every unit gave."""
    from memlab.data.corpus import make_splits, units
    from memlab.data.views import clean_text
    from memlab.probes.chunks.cut import _picked, pick_texts

    for corpus, field in ((str(small_corpus), "text"), (str(forms["saved"]), "body")):
        splits = make_splits(units(load_corpus(corpus, field), "chapter"), 0.05, 0.05, 0)
        for split in ("train", "test"):
            whole = [clean_text(d.text) for d in splits[split]]
            for seed in (0, 3):
                assert _picked(corpus, split, need, seed, field) == pick_texts(whole, need, seed), (corpus, split)
