"""What a per-position inversion keeps as it goes: each chunk's result the moment it is found, and its progress.

A run folder of ``memlab invert --states positions`` holds, while it runs:

* ``invert.json``: the run's settings (the checked flags), written before the first chunk: what ``--resume`` reads
  to continue the run with the same settings;
* ``chunks.jsonl``: one JSON object a line, one line per finished chunk (its :class:`ChunkResult`), appended and
  flushed to the disk as each chunk finishes; a line cut short by a killed process is ignored when read back;
* ``log.txt``: one line per finished chunk, with the time spent and an estimate of the time left.

At the end the run writes ``report.json`` and ``summary.txt`` from all the chunks, those of earlier attempts
included: a run resumed after a kill ends with the report an uninterrupted run gives (its timings aside).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, fields
from pathlib import Path

from memlab.errors import ConfigError

SETTINGS = "invert.json"
CHUNKS = "chunks.jsonl"
LOG = "log.txt"


def write_settings(folder, vals: dict) -> None:
    """The run's settings into ``folder`` (an :class:`~memlab.outdir.OutputFolder`), whole."""
    from memlab.probes.invert.trust import fingerprint

    folder.write_json(SETTINGS, {"kind": "memlab invert", "options": vals, "fingerprint": fingerprint(vals)})


def read_settings(run: str | Path) -> dict:
    """The settings of the run in ``run``; one ConfigError line when it is not a per-position inversion's folder."""
    path = Path(run) / SETTINGS
    if not Path(run).is_dir():
        raise ConfigError(f"--resume {run}: no such run folder")
    if not path.is_file():
        raise ConfigError(f"--resume {run}: not a run of memlab invert --states positions (no {SETTINGS})")
    try:
        got = json.loads(path.read_text())
        options = dict(got["options"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"--resume {run}: {SETTINGS} cannot be read") from None
    from memlab.probes.invert.trust import check_settings

    check_settings(run, got)  # the options against the run's fingerprint (an edited invert.json is refused)
    return options


def read_chunks(run: str | Path, kind: type | None = None) -> dict:
    """The finished chunks of ``run`` by index, each a ``kind`` (default ``ChunkResult``; a line cut short by a kill
    is skipped). A run reads its records back checked (:mod:`memlab.probes.invert.trust`)."""
    if kind is None:
        from memlab.probes.invert.report import ChunkResult as kind
    path = Path(run) / CHUNKS
    if not path.is_file():
        return {}
    names = {f.name for f in fields(kind)}
    out = {}
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
            c = kind(**{k: v for k, v in d.items() if k in names})
        except (ValueError, TypeError):
            continue
        out[c.index] = c
    return out


class ChunkLog:
    """Appends each finished chunk to ``chunks.jsonl`` (flushed and synced) and a progress line to ``log.txt``."""

    chunks_file, log_file = CHUNKS, LOG
    """The files written (a launched process writes its own, :mod:`memlab.probes.invert.merge`)."""
    fingerprint: str | None = None
    """The run's fingerprint, sealed into each record with its checksum (:mod:`memlab.probes.invert.trust`)."""

    def __init__(self, run: str | Path, total_tokens: int, done_tokens: int = 0, total_chunks: int = 0):
        self.run = Path(run)
        self.total, self.done, self.t0 = total_tokens, done_tokens, time.monotonic()
        self.at_start = done_tokens
        self.total_chunks = total_chunks
        self.last = self.t0

    def add(self, result: ChunkResult, finished: int, units_now: int | None = None) -> str:
        """Keep ``result``; the progress line (also appended to ``log.txt``). ``units_now``: the units done so far,
        unfinished chunks' positions included (the estimate of the time left reads them)."""
        from memlab.probes.invert.trust import append_line, seal

        append_line(self.run / self.chunks_file, json.dumps(seal(asdict(result), self.fingerprint)))
        self.done += self.units(result)
        msg = (f"chunk {result.index} {'exact' if result.exact else 'not exact'} "
               f"({finished}/{self.total_chunks} chunks, {self.done}/{self.total} units); {self.eta(units_now)}")
        self.note(msg)
        self.last = time.monotonic()
        return msg

    def tick(self, units_now: int, every: float = 60.0) -> None:
        """A progress line in ``log.txt`` when none was written for ``every`` seconds (long groups of chunks)."""
        if time.monotonic() - self.last >= every:
            self.note(f"{units_now}/{self.total} units; {self.eta(units_now)}")
            self.last = time.monotonic()

    def units(self, result) -> int:
        """Progress units of a finished chunk: its tokens (the per-position search), or its searches (pooled)."""
        if hasattr(result, "forwards"):
            return 2 if getattr(result, "control_of", None) is not None else 1
        return len(result.true_ids)

    def note(self, msg: str) -> None:
        """A line of its own in ``log.txt``."""
        with open(self.run / self.log_file, "a") as f:
            f.write(time.strftime("%H:%M:%S ") + msg + "\n")

    def eta(self, tokens_now: int | None = None) -> str:
        """Elapsed time and the time left, from the tokens done in this attempt."""
        done = (self.done if tokens_now is None else tokens_now) - self.at_start
        spent = time.monotonic() - self.t0
        left = self.total - (self.done if tokens_now is None else tokens_now)
        if done <= 0:
            return f"{_clock(spent)} spent"
        return f"{_clock(spent)} spent, about {_clock(spent * left / done)} left"


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
