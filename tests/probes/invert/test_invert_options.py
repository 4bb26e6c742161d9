"""memlab invert's options: one dataclass per section, the docs' tables and the grouped help made from them."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from memlab.probes.invert.options import SECTIONS, InvertOptions, default_text, flag_name, parse_value

DOC = Path(__file__).resolve().parents[3] / "docs" / "invert_reference.md"


def _doc_tables() -> list[dict[str, str]]:
    """The docs' option tables, in order: flag -> default (a boolean's row is written ``--x, --no-x``)."""
    text = DOC.read_text()
    part = text[text.index("## Options\n"):text.index("## Exit codes\n")]
    tables, cur = [], None
    for line in part.splitlines():
        if line.startswith("| flag |"):
            cur = {}
            tables.append(cur)
        elif line.startswith("| `") and cur is not None:
            flag, default = (c.strip() for c in line.strip("|").split("|")[:2])
            cur[flag.strip("`").split(",")[0]] = default
        elif not line.startswith("|"):
            cur = None
    return tables


def test_docs_tables_match_the_dataclasses():
    tables = _doc_tables()
    assert len(tables) == len(SECTIONS)
    for table, (section, cls) in zip(tables, SECTIONS.items()):
        want = {flag_name(section, f.name): default_text(section, f.name) for f in fields(cls)}
        assert table == want, section


def test_help_is_grouped_by_section():
    out = subprocess.run([sys.executable, "-m", "memlab.app.cli", "invert", "--help"], capture_output=True,
                         text=True, check=True).stdout
    heads = [m.group(1) for m in re.finditer(r"^(\w[\w ]*) options:$", out, flags=re.M)]
    assert heads == ["model", "text", "positions", "pooled", "both searches", "output"]
    positions = out[out.index("positions options:"):out.index("pooled options:")]
    assert "--budget" in positions and "--forwards" not in positions
    both = out[out.index("both searches options:"):out.index("output options:")]
    assert "--batch-size" in both and "--tol" in both and "default 0.001" in both and "default 1e-05" in both


def test_defaults_are_written_once():
    """The searches take their section's dataclass: no second copy of a default in the search modules."""
    from memlab.probes.invert.pooled import searcher as pooled
    from memlab.probes.invert.positions import searcher as positions

    assert positions.PositionsOptions is SECTIONS["positions"] and pooled.PooledOptions is SECTIONS["pooled"]
    opts = InvertOptions()
    assert opts.search() is opts.positions and not opts.pooled_search
    opts.model.states = "mean"
    assert opts.search() is opts.pooled


@pytest.mark.parametrize("section, name, text, says", [
    ("pooled", "seconds", "nan", "finite"), ("positions", "tol", "inf", "finite"), ("text", "seed", "-1", ">= 0"),
    ("text", "chunk_by", "lines", "takes words or tokens"), ("positions", "budget", "1.5", "an integer"),
    ("pooled", "propose_share", "1.5", "<= 1"), ("positions", "secant_after", "1", ">= 2"),
])
def test_bad_values_refused(section, name, text, says):
    from memlab.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_value(section, name, text)


def test_values_typed():
    assert parse_value("positions", "accept_gap", "inf") == float("inf")
    assert parse_value("pooled", "forwards", "12") == 12 and parse_value("model", "states", "last") == "last"
