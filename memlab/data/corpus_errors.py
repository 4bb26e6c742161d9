"""What a corpus file that cannot be read says: the line of a JSON lines file that is not a record, the row of a
damaged ``.arrow`` file, and no log line of ``datasets`` beside memlab's one line (:mod:`memlab.data.corpus`)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

from memlab.errors import DataError


@contextlib.contextmanager
def library_errors_quiet():
    """``datasets``' own error log lines silenced while a file is read: its failure becomes one memlab line."""
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


OPENERS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}
"""Compressed corpus files ``datasets`` reads, and the module that opens each."""


def bad_json_line(f: Path) -> str | None:
    """Where ``f`` stops being JSON, as a phrase that names the line (JSON lines: the first line that is not one
    JSON object; one JSON document: where it breaks); None when it cannot be read line by line here."""
    import importlib
    import json

    opener = OPENERS.get(f.suffix)
    if opener is None and f.suffix == ".zst":
        return None
    try:
        fh = open(f, encoding="utf-8") if opener is None else importlib.import_module(opener).open(
            f, "rt", encoding="utf-8")
        with fh:
            head = fh.read(4096).lstrip()
            fh.seek(0)
            if head.startswith("["):  # one JSON document: a list of records
                try:
                    json.load(fh)
                except json.JSONDecodeError as e:
                    return f"not valid JSON at line {e.lineno} ({e.msg} at column {e.colno})"
                return None
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    return (f"line {n} is not a JSON object ({e.msg} at column {e.colno}); each line of a JSON "
                            "lines file holds one record")
                if not isinstance(rec, dict):
                    return f"line {n} is a JSON {type(rec).__name__}, not an object (one record a line)"
    except (OSError, UnicodeDecodeError, EOFError, ValueError):
        return None
    return None


def readable_rows(ds, where: str) -> Iterator[dict]:
    """The rows of ``ds``; a row whose bytes cannot be decoded (a damaged ``.arrow`` file) is one DataError line."""
    rows = iter(ds)
    i = 0
    while True:
        try:
            rec = next(rows)
        except StopIteration:
            return
        except Exception as e:  # pyarrow's or the codec's error on damaged bytes
            raise DataError(f"{where}: row {i + 1} cannot be read, its bytes are damaged ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:120]}); write the dataset again") from None
        yield rec
        i += 1
