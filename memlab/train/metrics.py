"""``metrics.jsonl``: one JSON record a line, appended by the loop.

A crash in the middle of a write leaves a torn last line: it is dropped with
a warning (the record is logged again when the run resumes). A damaged line
elsewhere is an error that names it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from memlab.errors import MemlabError


def read_metrics(path: Path, warn: bool = True) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line is dropped (with one warning line)."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    out = []
    for i, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError("not a record")
        except ValueError:
            if i == len(lines) - 1:
                if warn:
                    print(f"memlab: warning: {path}: the last line is incomplete (a write was cut short); dropped",
                          file=sys.stderr)
                break
            raise MemlabError(f"{path}: line {i + 1} is not a JSON record; fix or delete that line") from None
        out.append(rec)
    return out


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records up to ``step`` (a resumed run writes the later ones again), atomically."""
    path = Path(path)
    if not path.is_file():
        return
    keep = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
