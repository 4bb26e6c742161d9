import gzip
import json

import pytest
import torch

from memlab.data.corpus import Document, load_corpus, make_splits, split_chapters, units
from memlab.data.tokenizer import load_tokenizer, train_bpe
from memlab.data.views import sentence_documents, split_sentences, token_chunks
from memlab.errors import DataError


def test_punkt_keeps_titles_inside_sentences():
    text = ("Mr. Darcy bowed to Mrs. Bennet, and Dr. Grant smiled. Miss Bingley\nwas not pleased. "
            "St. James's was crowded; Mr. and Mrs. Gardiner came at 3 p.m. on Tuesday.")
    sents = split_sentences(text)
    assert sents == [
        "Mr. Darcy bowed to Mrs. Bennet, and Dr. Grant smiled.",
        "Miss Bingley was not pleased.",
        "St. James's was crowded; Mr. and Mrs. Gardiner came at 3 p.m. on Tuesday.",
    ]


def test_punkt_on_bundled_text_never_ends_on_a_title():
    doc = load_corpus("austen")[4]  # Pride and Prejudice
    sents = split_sentences(doc.text[:200_000])
    assert len(sents) > 1000
    for s in sents:
        assert not s.endswith((" Mr.", " Mrs.", " Dr.")), s


def test_bundled_corpus_and_chapters():
    docs = load_corpus("austen")
    assert len(docs) == 6 and {d.id for d in docs} >= {"emma", "persuasion", "prideprejudice"}
    chapters = units(docs, "chapter")
    assert len(chapters) > 250
    assert all("CHAPTER" not in c.text[:40] and "Chapter" not in c.text[:40] for c in chapters)
    assert {c.group for c in chapters} == {d.id for d in docs}


def test_split_by_chapter_is_whole_units_and_reproducible():
    chapters = units(load_corpus("austen"), "chapter")
    a = make_splits(chapters, 0.1, 0.1, seed=3)
    b = make_splits(chapters, 0.1, 0.1, seed=3)
    c = make_splits(chapters, 0.1, 0.1, seed=4)
    ids = {k: {d.id for d in v} for k, v in a.items()}
    assert ids == {k: {d.id for d in v} for k, v in b.items()}
    assert ids["validation"] != {d.id for d in c["validation"]}
    assert not (ids["train"] & ids["validation"]) and not (ids["train"] & ids["test"]) and not (ids["validation"] & ids["test"])
    assert sum(len(v) for v in ids.values()) == len(chapters)
    assert 0.05 < len(ids["validation"]) / len(chapters) < 0.15
    # no line of a held-out chapter appears in a training chapter
    train_text = "\n".join(d.text for d in a["train"])
    held = a["test"][0].text.strip().splitlines()
    long_lines = [ln for ln in held if len(ln) > 60]
    assert long_lines and not any(ln in train_text for ln in long_lines[:20])


def test_split_by_document():
    docs = load_corpus("austen")
    s = make_splits(units(docs, "document"), 0.2, 0.2, seed=0)
    assert len(s["validation"]) >= 1 and len(s["test"]) >= 1 and len(s["train"]) >= 2
    assert sum(len(v) for v in s.values()) == 6
    with pytest.raises(DataError, match="cannot hold out"):
        make_splits(docs[:2], 0.5, 0.5, seed=0)


def test_split_of_a_unit_does_not_depend_on_the_other_units():
    chapters = units(load_corpus("austen"), "chapter")
    full = {d.id: k for k, v in make_splits(chapters, 0.1, 0.1, seed=1).items() for d in v}
    fewer = [c for c in chapters if c.group != "emma"]
    part = {d.id: k for k, v in make_splits(fewer, 0.1, 0.1, seed=1).items() for d in v}
    assert all(full[i] == part[i] for i in part)


def test_duplicate_ids_are_named():
    with pytest.raises(DataError, match="'a' appears twice"):
        make_splits([Document("a", "x"), Document("a", "y"), Document("b", "z")], 0.3, 0.3, seed=0)


def test_split_chapters_without_headings_keeps_document():
    d = Document(id="x", text="No headings here. Just text.")
    assert split_chapters(d) == [d]


def test_local_formats(tmp_path):
    (tmp_path / "a.txt").write_text("Hello there. General Kenobi.")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "One."}) + "\n" + json.dumps({"body": "Two."}) + "\n")
    with gzip.open(tmp_path / "c.txt.gz", "wt") as fh:
        fh.write("Compressed text.")
    docs = load_corpus(str(tmp_path / "a.txt"))
    assert docs[0].text.startswith("Hello")
    docs = load_corpus(str(tmp_path / "b.jsonl"), text_field="body")
    assert [d.text for d in docs] == ["One.", "Two."]
    assert load_corpus(str(tmp_path / "c.txt.gz"))[0].text == "Compressed text."
    import datasets

    datasets.Dataset.from_dict({"text": ["Parquet row."]}).to_parquet(str(tmp_path / "d.parquet"))
    assert load_corpus(str(tmp_path / "d.parquet"))[0].text == "Parquet row."
    with pytest.raises(DataError, match="no field 'text'"):
        load_corpus(str(tmp_path / "b.jsonl"))


def test_folder_ids_are_relative_paths(tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "part.v1.txt").write_text(f"Text of {sub}.")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    docs = load_corpus(str(tmp_path))
    assert sorted(d.id for d in docs) == ["a/part.v1", "b/part.v1"]


def test_bad_corpora(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_corpus(str(tmp_path / "missing"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="empty"):
        load_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "blank.txt").write_text("   \n\n  ")
    with pytest.raises(DataError, match="empty"):
        load_corpus(str(tmp_path / "blank.txt"))
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe\xfa bytes")
    with pytest.raises(DataError, match="UTF-8"):
        load_corpus(str(tmp_path / "bad.txt"))
    (tmp_path / "x.docx").write_text("?")
    with pytest.raises(DataError, match="unsupported"):
        load_corpus(str(tmp_path / "x.docx"))


def test_bpe_train_cache_and_chunks(tmp_path):
    texts = [d.text for d in load_corpus("austen")[:1]]
    tok = train_bpe(texts, 512, tmp_path / "tok")
    assert len(tok) == 512 and tok.pad_token == "<pad>" and tok.eos_token == "</s>"
    again = load_tokenizer(str(tmp_path / "tok"))
    s = "Emma Woodhouse, handsome, clever, and rich."
    assert again(s)["input_ids"] == tok(s)["input_ids"]
    assert tok.decode(tok(s, add_special_tokens=False)["input_ids"]) == s
    chunks = token_chunks(["a b c " * 50, "d e f " * 50], tok, 16)
    assert chunks.dtype == torch.long and chunks.shape[1] == 16
    assert (chunks == tok.eos_token_id).sum() >= 1
    with pytest.raises(DataError, match="fewer than one chunk"):
        token_chunks(["tiny"], tok, 1000)
    with pytest.raises(DataError, match="empty"):
        train_bpe(["  "], 512)


def test_unknown_tokenizer_offline():
    with pytest.raises(DataError, match="could not be loaded"):
        load_tokenizer("no-such-org/no-such-tokenizer-xyz")


def test_sentence_documents():
    docs = [Document("a", "One sentence. Two sentences."), Document("b", "Only one.")]
    assert sentence_documents(docs, min_sentences=2) == [["One sentence.", "Two sentences."]]


def test_hub_dataset_offline_is_a_clear_error():
    with pytest.raises(DataError, match="needs a network"):
        load_corpus("hf:no-such-org/no-such-dataset")
