"""Held-out splits over whole units, decided one unit at a time.

A unit's split depends only on the seed and its own id (:func:`unit_draw`), so
a :class:`SplitPlan` can be built while a corpus streams past and keeps only
counters: :func:`make_splits` (a list in memory) and :mod:`memlab.data.stream`
(a corpus read lazily) share it and give the same splits.
"""

from __future__ import annotations

import hashlib
import heapq
import re
from dataclasses import dataclass, field
from typing import Iterable, Protocol, TypeVar

from memlab.errors import DataError


class Unit(Protocol):
    """What splitting reads of a unit (a :class:`memlab.data.corpus.Document`, which imports this module)."""

    id: str
    text: str
    group: str


Document = TypeVar("Document", bound=Unit)

SPLITS = ("train", "validation", "test")
BLOCK_ID = "/b"
"""A paragraph block's id is ``DOC/bNNNN`` (:func:`memlab.data.corpus.paragraph_blocks`)."""


def unit_draw(seed: int, unit_id: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, unit id) alone."""
    h = hashlib.sha256(f"{seed}:{unit_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


class SplitPlan:
    """Which split each unit goes to; :meth:`add` every unit id once, then :meth:`finish`.

    Validation takes the units whose draw is below ``val_fraction``, test those below
    ``val_fraction + test_fraction``. With at least three units, each non-zero held-out
    fraction gets at least one unit (the units with the lowest draws above the threshold),
    so the plan keeps the two lowest draws of the rest; memory does not grow with the corpus.
    """

    def __init__(self, val_fraction: float, test_fraction: float, seed: int):
        self.val_fraction, self.test_fraction, self.seed = val_fraction, test_fraction, seed
        self.n = self.n_val = self.n_test = 0
        self._lowest: list[tuple[float, str]] = []  # max-heap (negated) of the two lowest (draw, id) of the rest
        self._extra: dict[str, str] = {}
        self.finished = False

    def _draw_split(self, draw: float) -> str:
        if draw < self.val_fraction:
            return "validation"
        return "test" if draw < self.val_fraction + self.test_fraction else "train"

    def add(self, unit_id: str) -> None:
        draw = unit_draw(self.seed, unit_id)
        self.n += 1
        where = self._draw_split(draw)
        self.n_val += where == "validation"
        self.n_test += where == "test"
        if where == "train":
            item = (-draw, _Rev(unit_id))
            if len(self._lowest) < 2:
                heapq.heappush(self._lowest, item)
            elif item > self._lowest[0]:
                heapq.heapreplace(self._lowest, item)

    def finish(self) -> "SplitPlan":
        if self.n >= 3:
            rest = [str(r) for _, r in sorted(self._lowest, reverse=True)]  # lowest draw first
            if self.val_fraction > 0 and not self.n_val:
                self._extra[rest.pop(0)] = "validation"
                self.n_val += 1
            if self.test_fraction > 0 and not self.n_test:
                self._extra[rest.pop(0)] = "test"
                self.n_test += 1
        if self.n_val + self.n_test >= self.n:
            raise DataError(
                f"cannot hold out {self.n_val}+{self.n_test} of {self.n} units and keep any for training; "
                "use a larger corpus or smaller fractions"
            )
        self.finished = True
        return self

    def split_of(self, unit_id: str) -> str:
        """``train``, ``validation`` or ``test``."""
        return self._extra.get(unit_id) or self._draw_split(unit_draw(self.seed, unit_id))

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": self.n - self.n_val - self.n_test, "validation": self.n_val, "test": self.n_test}


@dataclass
class _Rev:
    """An id that sorts in reverse, so the max-heap of negated draws breaks ties as a sort by id would."""

    s: str

    def __lt__(self, other: "_Rev") -> bool:
        return self.s > other.s

    def __str__(self) -> str:
        return self.s


def make_splits(
    docs: list[Document], val_fraction: float, test_fraction: float, seed: int
) -> dict[str, list[Document]]:
    """Assign whole units to train/validation/test (:class:`SplitPlan`), keeping the units' order.

    Each unit's split depends only on the seed and its own id, so adding or removing other
    documents never moves a unit between training and held-out data.
    """
    seen: set[str] = set()
    for d in docs:
        if d.id in seen:
            raise DataError(f"document ids must be unique to split a corpus; '{d.id}' appears twice")
        seen.add(d.id)
    plan = SplitPlan(val_fraction, test_fraction, seed)
    for d in docs:
        plan.add(d.id)
    plan.finish()
    out: dict[str, list[Document]] = {k: [] for k in SPLITS}
    for d in docs:
        out[plan.split_of(d.id)].append(d)
    return out


@dataclass
class UnitCounts:
    """Counters of how units were cut (for :meth:`describe`), filled one unit at a time."""

    units: int = 0
    chapters: int = 0
    blocks: int = 0
    block_chars: int = 0
    block_sources: set = field(default_factory=set)

    def add(self, d: Document) -> None:
        self.units += 1
        if BLOCK_ID in d.id and d.id.rsplit(BLOCK_ID, 1)[1].isdigit():
            self.blocks += 1
            self.block_chars += len(d.text)
            self.block_sources.add(d.group)
        elif re.search(r"/ch\d{3}$", d.id):
            self.chapters += 1

    def describe(self) -> str:
        parts = []
        if self.chapters:
            parts.append(f"{self.chapters} chapters (cut at chapter headings)")
        if self.blocks:
            parts.append(f"{self.blocks} paragraph blocks of about {self.block_chars // self.blocks} characters (cut "
                         f"from {len(self.block_sources)} document(s) without chapter headings)")
        rest = self.units - self.chapters - self.blocks
        if rest:
            parts.append(f"{rest} whole documents")
        return f"{self.units} units: " + ", ".join(parts)


def describe_units(docs: Iterable[Document]) -> str:
    """How a corpus was cut into held-out units, in words (for run summaries and probe reports)."""
    counts = UnitCounts()
    for d in docs:
        counts.add(d)
    return counts.describe()


def split_line(counts: UnitCounts, sizes: dict[str, int]) -> str:
    """One line: how units were made and how many each split holds."""
    return f"{counts.describe()}; {', '.join(f'{k} {v}' for k, v in sizes.items())} (whole units per split)"


def describe_splits(splits: dict[str, list[Document]]) -> str:
    """One line: how units were made and how many each split holds."""
    counts = UnitCounts()
    for d in (d for v in splits.values() for d in v):
        counts.add(d)
    return split_line(counts, {k: len(v) for k, v in splits.items()})


def require_split(splits: dict[str, list[Document]], name: str, corpus: str) -> list[Document]:
    """The units of split ``name``, or a DataError that names the empty split and how the corpus was cut."""
    if splits.get(name):
        return splits[name]
    raise DataError(f"the {name} split of corpus '{corpus}' is empty ({describe_splits(splits)}); "
                    "use a larger corpus, more documents, or larger data.val_fraction / data.test_fraction")
