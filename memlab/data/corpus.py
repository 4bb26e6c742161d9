"""Corpora -> documents, and held-out splits.

Every corpus is read through ``datasets``: the bundled Austen novels (gzipped
text shipped in the package), local text/jsonl/json/parquet/arrow files or folders
of them, a folder saved with ``datasets``' ``save_to_disk`` (a Dataset, or one
split of a DatasetDict, chosen as a hub dataset's is), and hub datasets by name (``hf:NAME[:CONFIG]``, streamed when asked) where a
network is there. A corpus becomes a list of :class:`Document`; documents can
be cut into chapters, and splits are made over whole units (chapters or
documents), never over lines, reproducibly from a seed.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Iterator

from memlab.data.splits import (  # noqa: F401  (the held-out splits, also importable from here)
    BLOCK_ID, SplitPlan, UnitCounts, describe_splits, describe_units, make_splits, require_split,
)
from memlab.data.corpus_errors import bad_json_line, library_errors_quiet, readable_rows
from memlab.errors import DataError
from memlab.registry import CORPORA

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)


@dataclass
class Document:
    """One unit of text: ``id`` is unique, ``group`` names the source (book, file)."""

    id: str
    text: str
    group: str = ""


def bundled_corpus_dir(name: str = "austen") -> Path:
    return Path(str(resources.files("memlab") / "resources" / "corpora" / name))


def _check_text(text: str, where: str) -> str:
    if "\x00" in text:
        raise DataError(f"{where}: contains NUL bytes; is it a binary file?")
    return text


def _suffix(path: Path) -> str:
    s = path.suffixes
    if s and s[-1] in (".gz", ".bz2", ".xz", ".zst"):
        s = s[:-1]
    return s[-1] if s else ""


def _doc_stem(f: Path, root: Path | None) -> str:
    """Id of a file's documents: its path below the corpus root, without suffixes."""
    rel = f.relative_to(root) if root is not None and root in f.parents else Path(f.name)
    name = rel.name
    for suf in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(suf)
    name = name.rsplit(".", 1)[0] if "." in name else name
    return str(rel.with_name(name).as_posix())


def _kind(f: Path) -> str:
    """How a corpus file is read: text, json, parquet or arrow (a DataError for any other suffix)."""
    suf = _suffix(f)
    for kind, sufs in (("text", TEXT_SUFFIXES), ("json", JSON_SUFFIXES), ("parquet", PARQUET_SUFFIXES),
                       ("arrow", ARROW_SUFFIXES)):
        if suf in sufs:
            return kind
    raise DataError(f"{f}: unsupported corpus file type '{suf}' (use .txt, .jsonl/.json, .parquet or .arrow, "
                    "or a folder saved with datasets' save_to_disk)")


def _read_file(f: Path, kind: str):
    """One local file as a ``datasets.Dataset`` (memory-mapped on disk; an ``.arrow`` file is mapped where it lies)."""
    import datasets

    if f.stat().st_size == 0:
        raise DataError(f"{f}: the file is empty")
    try:
        with library_errors_quiet():  # the reason is memlab's one line below, not the library's log line too
            if kind == "text":
                return datasets.load_dataset("text", data_files=[str(f)], sample_by="document", split="train")
            if kind == "arrow":
                return _arrow_file(f)
            return datasets.load_dataset(kind, data_files=[str(f)], split="train")
    except UnicodeDecodeError as e:
        raise DataError(f"{f}: not valid UTF-8 text ({e.reason} at byte {e.start})") from None
    except DataError:
        raise
    except Exception as e:  # datasets wraps decoding and parse errors
        cause = e
        while cause.__cause__ is not None or cause.__context__ is not None:
            nxt = cause.__cause__ or cause.__context__
            if nxt is None or nxt is cause:
                break
            cause = nxt
        if isinstance(cause, UnicodeDecodeError):
            raise DataError(f"{f}: not valid UTF-8 text ({cause.reason} at byte {cause.start})") from None
        bad = bad_json_line(f) if kind == "json" else None
        if bad is not None:
            raise DataError(f"{f}: {bad}") from None
        raise DataError(f"{f}: could not be read as {kind} ({type(cause).__name__}: {cause})") from None


def _arrow_file(f: Path):
    """An Arrow file as a ``datasets.Dataset`` mapped in place: the streaming format ``datasets`` writes (its
    caches, ``save_to_disk``), or the Arrow IPC file format (``pyarrow.feather``/``ipc.new_file``)."""
    import datasets
    import pyarrow as pa

    try:
        return datasets.Dataset.from_file(str(f))
    except (pa.ArrowInvalid, OSError):
        pass
    with pa.memory_map(str(f)) as src:  # the IPC file format: mapped, not copied
        table = pa.ipc.open_file(src).read_all()
    return datasets.Dataset(table)


def _dataset_documents(ds, field: str, where: str, stem: str, fill: bool = False) -> Iterator[Document]:
    """The documents of a ``datasets.Dataset``: one a row, its text in ``field`` (one DataError line naming the
    fields present when it has none). ``fill``: a row's missing text is an empty document (plain-text files)."""
    if field not in ds.column_names:
        raise DataError(f"{where}: no field '{field}' (fields: {', '.join(ds.column_names)}); "
                        "set the text field (--text-field, data.text_field)")
    n = len(ds)
    for i, rec in enumerate(readable_rows(ds.select_columns([field]), where)):
        text = rec[field]
        if text is None and not fill:  # datasets fills a field that a record lacks with None
            raise DataError(f"{where}: missing field '{field}' in row {i + 1}; every record needs it "
                            "(set the text field to the one that holds the text)")
        if not isinstance(text, str):
            raise DataError(f"{where}: row {i + 1} field '{field}' is not text (got {type(text).__name__})")
        yield Document(id=f"{stem}/{i}" if n > 1 else stem, text=_check_text(text, where), group=stem)


def _iter_files(files: list[Path], text_field: str, root: Path | None = None) -> Iterator[Document]:
    """The documents of local files, one at a time (``datasets`` keeps each file memory-mapped on disk)."""
    import datasets

    datasets.disable_progress_bars()
    by_kind: dict[str, list[Path]] = {}
    for f in files:
        by_kind.setdefault(_kind(f), []).append(f)
    for kind, fs in by_kind.items():
        for f in sorted(fs):
            ds = _read_file(f, kind)
            field = "text" if kind == "text" else text_field
            yield from _dataset_documents(ds, field, str(f), _doc_stem(f, root), fill=kind == "text")


def saved_dataset(p: Path) -> str | None:
    """What a folder saved with ``datasets``' ``save_to_disk`` holds: ``"dataset"``, ``"dict"`` (a DatasetDict) or
    None (not such a folder)."""
    if (p / "dataset_dict.json").is_file():
        return "dict"
    if (p / "state.json").is_file() and (p / "dataset_info.json").is_file():
        return "dataset"
    if (p / "dataset_info.json").is_file() and any(p.glob("data-*.arrow")):
        raise DataError(f"{p}: a folder saved with datasets' save_to_disk whose state.json is missing (a partial "
                        "copy or an interrupted save?); save the dataset again or copy the whole folder")
    return None


def _iter_saved(p: Path, text_field: str, split: str) -> Iterator[Document]:
    """The documents of a folder saved with ``save_to_disk``, memory-mapped: a Dataset whole, or one split of a
    DatasetDict (``split``, as a hub dataset's; a missing one is a DataError naming those there are)."""
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as e:  # a damaged or partial folder
        raise DataError(f"{p}: could not be read as a saved dataset ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:160]})") from None
    where = str(p)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{p}: no split '{split}' in the saved dataset (splits: {', '.join(ds)}); "
                            "set data.hf_split")
        ds, where = ds[split], f"{p} (split {split})"
    yield from _dataset_documents(ds, text_field, where, p.name)


def _load_files(files: list[Path], text_field: str, root: Path | None = None) -> list[Document]:
    return list(_iter_files(files, text_field, root))


def _iter_hub(spec: str, text_field: str, split: str, streaming: bool, max_documents: int | None) -> Iterator[Document]:
    """A hub dataset's documents, one at a time: downloaded once and memory-mapped, or streamed (``streaming``)."""
    import datasets

    name, _, config = spec.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split=split, streaming=streaming)
    except Exception as e:
        raise DataError(
            f"hub dataset '{name}' could not be loaded ({type(e).__name__}); it needs a network or a local cache"
        ) from None
    try:
        for i, rec in enumerate(ds):
            if max_documents is not None and i >= max_documents:
                break
            if text_field not in rec:
                raise DataError(f"hub dataset '{name}': no field '{text_field}' (fields: {', '.join(rec)})")
            yield Document(id=f"{name}/{i}", text=rec[text_field] or "", group=name)
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"hub dataset '{name}' failed while reading ({type(e).__name__}: {str(e)[:200]})") from None


@CORPORA.register("austen", description="Jane Austen's six novels (bundled, public domain)")
def load_austen(**_: object) -> list[Document]:
    files = sorted(bundled_corpus_dir("austen").glob("*.txt.gz"))
    return _load_files(files, "text")


def check_corpus_spec(spec: str | None) -> None:
    """A corpus ``spec`` that names a local path (it starts with ``.``, ``/`` or ``~``, holds a ``/`` or ends in a
    corpus file's suffix) which is not there: one DataError line, told without reading anything (a command checks
    it before it imports torch). A registered name and ``hf:NAME`` are left to :func:`iter_documents`."""
    s = str(spec or "")
    if not s or s.startswith("hf:") or Path(os.path.expanduser(s)).exists():
        return
    suffixes = (*TEXT_SUFFIXES, *JSON_SUFFIXES, *PARQUET_SUFFIXES, *ARROW_SUFFIXES)
    if s.startswith((".", "/", "~")) or "/" in s or os.sep in s or _suffix(Path(s)) in suffixes:
        raise DataError(f"corpus '{spec}' not found: no such file or folder (a bundled corpus is named without a "
                        "path; use hf:NAME for a hub dataset)")


def local_files(spec: str) -> tuple[list[Path], Path | None]:
    """The files of a local corpus (a file, or a folder's files without hidden ones) and its root folder."""
    p = Path(os.path.expanduser(spec))
    if not p.exists():
        raise DataError(
            f"corpus '{spec}' not found: not a bundled corpus ({', '.join(CORPORA.names())}), "
            "not a local path; use hf:NAME for a hub dataset"
        )
    files = [p] if p.is_file() else sorted(
        q for q in p.rglob("*") if q.is_file() and not any(part.startswith(".") for part in q.relative_to(p).parts)
    )
    if not files:
        raise DataError(f"corpus folder {p} has no files")
    return files, (p if p.is_dir() else None)


def iter_documents(
    spec: str,
    text_field: str = "text",
    hf_split: str = "train",
    streaming: bool = False,
    max_documents: int | None = None,
) -> Iterator[Document]:
    """The documents of a corpus one at a time, empty ones skipped: memory does not grow with the corpus.

    ``spec`` is a registered name, a local file or folder, or ``hf:NAME[:CONFIG]``. Each call reads the
    corpus again (local files and downloaded hub datasets from their memory-mapped ``datasets`` cache)."""
    if spec.startswith("hf:"):
        docs: Iterable[Document] = _iter_hub(spec[3:], text_field, hf_split, streaming, max_documents)
    elif spec in CORPORA:
        docs = CORPORA.get(spec)()
    elif (p := Path(os.path.expanduser(spec))).is_dir() and saved_dataset(p):
        docs = _iter_saved(p, text_field, hf_split)
    else:
        files, root = local_files(spec)
        docs = _iter_files(files, text_field, root=root)
    if max_documents is not None:
        docs = itertools.islice(docs, max_documents)
    return (d for d in docs if d.text.strip())


def load_corpus(
    spec: str,
    text_field: str = "text",
    hf_split: str = "train",
    streaming: bool = False,
    max_documents: int | None = None,
) -> list[Document]:
    """Load a corpus into memory: a registered name, a local file or folder, or ``hf:NAME[:CONFIG]``
    (see :func:`iter_documents`; large corpora are read through :mod:`memlab.data.stream` instead)."""
    if spec.startswith("hf:") and streaming and max_documents is None:
        raise DataError("a streamed hub dataset needs data.max_documents to be held in memory "
                        "(the token-chunk view streams it whole)")
    docs = list(iter_documents(spec, text_field, hf_split, streaming, max_documents))
    if not docs:
        raise DataError(f"corpus '{spec}' is empty: no document has any text")
    return docs


# ----------------------------------------------------------------------------- chapters and splits

_CHAPTER_RE = re.compile(r"^[ \t]*(CHAPTER|Chapter)[ \t]+([0-9]+|[IVXLCDM]+)\b.*$", re.MULTILINE)
_VOLUME_RE = re.compile(r"^[ \t]*(VOLUME|Volume)[ \t]+([0-9]+|[IVXLCDM]+)[ \t]*$", re.MULTILINE)


def split_chapters(doc: Document) -> list[Document]:
    """Cut a document at chapter headings ("CHAPTER IV", "Chapter 12").

    Text before the first heading (title page, preface) becomes chapter 0 if it
    holds more than a title; a document without headings stays whole.
    """
    starts = [m.start() for m in _CHAPTER_RE.finditer(doc.text)]
    if not starts:
        return [doc]
    pieces: list[tuple[int, str]] = []
    head = doc.text[: starts[0]]
    if len(head.split()) > 50:
        pieces.append((0, head))
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(doc.text)
        body = doc.text[s:end]
        body = body.split("\n", 1)[1] if "\n" in body else ""  # drop the heading line itself
        body = _VOLUME_RE.sub("", body)
        if body.strip():
            pieces.append((i + 1, body))
    return [Document(id=f"{doc.id}/ch{n:03d}", text=t, group=doc.group or doc.id) for n, t in pieces]


MIN_UNITS = 20
"""Below this many chapter units, documents without chapter headings are cut into paragraph blocks."""


def _windows(text: str, size: int) -> list[str]:
    """Cut text into pieces of about ``size`` characters at whitespace (fixed windows)."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def paragraph_blocks(doc: Document, block_chars: int) -> list[Document]:
    """Cut a document into blocks of whole paragraphs of about ``block_chars`` characters.

    Paragraphs are separated by blank lines; a paragraph longer than twice the
    block (a text without blank lines) is cut at line ends, then at spaces.
    """
    pieces: list[str] = []
    for para in re.split(r"\n[ \t]*\n", doc.text):
        if len(para) <= 2 * block_chars:
            pieces.append(para)
            continue
        for line in para.split("\n"):
            pieces.extend([line] if len(line) <= 2 * block_chars else _windows(line, block_chars))
    blocks, cur, size = [], [], 0
    for piece in pieces:
        if not piece.strip():
            continue
        cur.append(piece)
        size += len(piece)
        if size >= block_chars:
            blocks.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        if blocks and size < block_chars // 2:  # a short tail joins the block before it
            blocks[-1] += "\n\n" + "\n\n".join(cur)
        else:
            blocks.append("\n\n".join(cur))
    if len(blocks) <= 1:
        return [doc]
    return [Document(id=f"{doc.id}{BLOCK_ID}{n:04d}", text=t, group=doc.group or doc.id) for n, t in enumerate(blocks)]


def block_size(total_chars: int) -> int:
    """Characters per paragraph block: about a hundred blocks over ``total_chars`` of text, within [1,000, 20,000]."""
    return max(1000, min(20000, total_chars // 100))


def cut_size(docs: Iterable[Document], split_by: str) -> int:
    """How :func:`units` cuts a corpus: 0 = chapters (or whole documents), else the paragraph-block size
    of the documents without chapter headings. Reads only as many documents as it needs to decide
    (once :data:`MIN_UNITS` chapter units are seen, the rest is not read)."""
    if split_by == "document":
        return 0
    if split_by != "chapter":
        raise DataError(f"unknown split unit '{split_by}' (use chapter or document)")
    count, plain_chars, any_plain = 0, 0, False
    for d in docs:
        parts = split_chapters(d)
        count += len(parts)
        if count >= MIN_UNITS:
            return 0
        if len(parts) == 1 and parts[0] is d:  # no chapter headings
            any_plain, plain_chars = True, plain_chars + len(d.text)
    return block_size(plain_chars) if any_plain else 0


def iter_units(docs: Iterable[Document], split_by: str, size: int) -> Iterator[Document]:
    """Documents cut into held-out units one at a time, as :func:`cut_size` decided (``size``)."""
    for d in docs:
        if split_by == "document":
            yield d
            continue
        parts = split_chapters(d)
        if size and len(parts) == 1 and parts[0] is d:
            yield from paragraph_blocks(d, size)
        else:
            yield from parts


def units(docs: Iterable[Document], split_by: str) -> list[Document]:
    """Documents cut into the held-out unit: chapters or whole documents.

    With ``chapter``, when the corpus yields fewer than :data:`MIN_UNITS`
    units (one large plain-text file, a few files), documents that have no
    chapter headings are cut into paragraph blocks (:func:`paragraph_blocks`,
    :func:`block_size`), so that held-out splits exist.
    :func:`describe_units` says how a corpus was cut.
    """
    docs = list(docs)
    return list(iter_units(docs, split_by, cut_size(docs, split_by)))

__all__ = ["Document", "SplitPlan", "UnitCounts", "cut_size", "describe_splits", "describe_units", "iter_documents",
           "iter_units", "load_corpus", "make_splits", "paragraph_blocks", "require_split", "split_chapters", "units"]
