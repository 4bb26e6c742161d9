"""Markdown results tables: the one writer every report, sweep, quickstart, evaluation and benchmark table uses."""

from __future__ import annotations

from collections.abc import Iterable


def markdown_row(cells: Iterable[str], width: int | None = None) -> str:
    """One line of a markdown table; a row of fewer cells than ``width`` ends with empty ones (``" |"`` each)."""
    cells = [str(c) for c in cells]
    return "| " + " | ".join(cells) + " |" + " |" * max(0, (width or len(cells)) - len(cells))


def markdown_table(head: list[str], rows: Iterable[Iterable[str]] = ()) -> str:
    """A markdown table: the header ``head``, its rule, a line per row of ``rows`` (a short row padded with empty
    cells to the header's width)."""
    return "\n".join([markdown_row(head), "|" + "---|" * len(head), *(markdown_row(r, len(head)) for r in rows)])
