"""What ``memlab invert --resume`` (and the merge of a launch's processes) trusts of what it reads back: nothing
unchecked.

A run's folder holds its options (``invert.json``) and one record a line per finished chunk (``chunks.jsonl``, and
``chunks.R.jsonl`` of each process R of a launch, :mod:`memlab.probes.invert.merge`). Everything read back is
checked before it reaches a report:

* **the options** against the run's **fingerprint** (:func:`fingerprint`: a digest of every option that defines
  what the run finds, written into ``invert.json`` when the run starts and into each chunk record): an
  ``invert.json`` edited after the start (another model, ``seq_len``, ``states``, layer, ...), or chunk records made
  with other options than the ones ``invert.json`` names, are refused in one line (:func:`check_settings`), before
  torch is imported; a run is never resumed with options other than those it was started with;
* **each record** against its **checksum** (``sha``: a digest of the record and the fingerprint,
  :func:`seal`), its **index** (one of the run's chunks: a stray record, index 99 of a run of 6, is dropped with a
  warning) and its **chunk** (:func:`check_records`: the text and token ids of the chunk the corpus cut gives at
  that index, ``exact`` and ``token_accuracy`` as the recovered ids give them, the per-position lists as long as the
  chunk, the certificates of the known kinds);
* **the recovered tokens themselves**, for the per-position search, by one forward pass per kept chunk
  (:func:`reverify`): each position's relative distance to the observed state, recomputed from the recovered
  prefix, must be the recorded one (a ``match`` within ``tol``), so edited ``recovered_ids`` or an ``exact`` flag
  that the states do not bear out never reach a report.

A record that fails a check is not kept: it is moved to ``chunks.rejected.jsonl`` (nothing saved is destroyed),
one warning line names the chunk and why, and the chunk is searched again. A line cut short by a killed process
(the torn last line of a file) is moved there too, and the file is cut back to its last whole line before anything
is appended (:func:`append_line`), so no record is ever written onto a torn one.

Only :func:`reverify` needs torch (it is given the search); the rest reads JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

CHUNKS = "chunks.jsonl"
REJECTED = "chunks.rejected.jsonl"
"""Where records that failed a check are moved (with why), never deleted."""

FREE = {("model", "threads"), ("model", "device"), ("model", "device_map"), ("output", "progress"),
        ("output", "resume"), ("output", "out")}
"""Options that do not define what a run finds (how fast it runs, where it is written): left out of the
fingerprint (the options a resume may change, :data:`memlab.probes.invert.options.RESUME_MAY_CHANGE`, and the
folder itself, which may be moved)."""


SINCE = {("positions", "states_dtype"): "float32"}
"""Options added after runs were first kept, with their defaults: left out of the fingerprint at that default, so
a run kept before them (whose ``invert.json`` does not name them) resumes under the fingerprint it was written with."""


def fingerprint(options: dict) -> str:
    """A digest of the options (``dataclasses.asdict`` of an ``InvertOptions``) that define what a run finds."""
    kept = {s: {k: v for k, v in sorted(vals.items()) if (s, k) not in FREE and SINCE.get((s, k), FREE) != v}
            for s, vals in sorted(options.items()) if isinstance(vals, dict)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _digest(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "sha"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def seal(record: dict, fp: str) -> dict:
    """``record`` (a chunk's result as a dict) with the run's fingerprint (``run``) and its checksum (``sha``)."""
    out = dict(record, run=fp)
    out["sha"] = _digest(out)
    return out


def chunk_files(run: str | Path) -> list[Path]:
    """The files of chunk records in ``run``: ``chunks.jsonl``, then each launched process's ``chunks.R.jsonl``."""
    run = Path(run)
    own = [run / CHUNKS] if (run / CHUNKS).is_file() else []
    ranks = sorted((p for p in run.glob("chunks.*.jsonl") if p.name.split(".")[1].isdigit()),
                   key=lambda p: int(p.name.split(".")[1]))
    return own + ranks


def _lines(path: Path) -> tuple[list[str], str]:
    """The whole lines of ``path`` and its torn tail ('' when it ends with a newline)."""
    text = path.read_text(errors="replace")
    whole, _, tail = text.rpartition("\n")
    return ([ln for ln in whole.split("\n") if ln.strip()] if whole or text.endswith("\n") else []), tail


def check_settings(run: str | Path, got: dict) -> None:
    """``invert.json`` of ``run`` (``got``, read) against the fingerprint it was written with and the fingerprint of
    each chunk record: one ConfigError line when they differ (an edited ``invert.json``, or records of another
    run). A run written before fingerprints were kept has none to check (its records are still checked one by
    one, :func:`check_records`)."""
    from memlab.errors import ConfigError

    options = got.get("options")
    if not isinstance(options, dict):
        raise ConfigError(f"--resume {run}: invert.json cannot be read (no options)")
    now = fingerprint(options)
    saved = got.get("fingerprint")
    if saved is not None and saved != now:
        raise ConfigError(f"--resume {run}: invert.json names other options than the run was started with (its "
                          f"fingerprint {saved} is not theirs, {now}: edited after the start?); a run resumes only "
                          "with its own options: start a new run with --out")
    for path in chunk_files(run):
        lines, _ = _lines(path)
        for n, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a damaged line: dropped when the run reads its records (check_records)
            fp = rec.get("run") if isinstance(rec, dict) else None
            if fp is not None and fp != now and rec.get("sha") == _digest(rec):
                raise ConfigError(f"--resume {run}: {path.name} line {n} was made with other options than "
                                  f"invert.json names (fingerprint {fp}, not {now}): invert.json was edited after "
                                  "the start; a run resumes only with its own options: start a new run with --out")


def warn(run, msg: str) -> None:
    """One warning line on stderr and in the run's log."""
    import time

    print(f"memlab: warning: {msg}", file=sys.stderr)
    try:
        with open(Path(run) / "log.txt", "a") as f:
            f.write(time.strftime("%H:%M:%S ") + "warning: " + msg + "\n")
    except OSError:
        pass


def read_records(run: str | Path, kind: type, n_chunks: int, fp: str | None) -> tuple[dict, list, dict]:
    """Every chunk record of ``run`` that reads whole, matches its checksum and the run's fingerprint ``fp`` and
    names one of the run's ``n_chunks`` chunks, as a ``kind`` by index (the first trusted record of each index);
    the rejected ones, ``(file name, line text, why)`` (torn tails included); each kept index's line as read."""
    from dataclasses import fields

    names = {f.name for f in fields(kind)}
    kept, raw, rejected = {}, {}, []
    for path in chunk_files(run):
        lines, tail = _lines(path)
        if tail.strip():
            rejected.append((path.name, tail, "a torn last line (cut short by a killed process)"))
        for line in lines:
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError
            except ValueError:
                rejected.append((path.name, line, "a line that is not a JSON record"))
                continue
            if "sha" in rec and rec["sha"] != _digest(rec):
                rejected.append((path.name, line, "its checksum does not match its content (edited or damaged)"))
                continue
            if fp is not None and rec.get("run") not in (None, fp):
                rejected.append((path.name, line, "it was made with other options than the run's"))
                continue
            idx = rec.get("index")
            if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < n_chunks:
                rejected.append((path.name, line, f"a stray record: index {idx!r} is not one of the run's "
                                                  f"{n_chunks} chunks"))
                continue
            try:
                c = kind(**{k: v for k, v in rec.items() if k in names})
            except TypeError:
                rejected.append((path.name, line, "a record that lacks fields of a chunk's result"))
                continue
            if idx not in kept:
                kept[idx], raw[idx] = c, line
    return kept, rejected, raw


def _why_not(c, text: str, ids: list[int], decode) -> str | None:
    """Why the record ``c`` is not the result of its chunk (``text``, ``ids`` as the corpus cut gives it); None when
    it is consistent."""
    from memlab.probes.invert.report import CERTIFICATES

    if c.text != text:
        return "its text is not the chunk's"
    if list(c.true_ids) != list(ids):
        return "its true_ids are not the chunk's"
    got = c.recovered_ids
    if not isinstance(got, list) or len(got) != len(ids) or not all(isinstance(t, int) for t in got):
        return "its recovered_ids are not one token per position"
    if bool(c.exact) != (list(got) == list(ids)):
        return "its exact flag is not what its recovered_ids give"
    acc = sum(a == b for a, b in zip(got, ids)) / max(len(ids), 1)
    if not isinstance(c.token_accuracy, (int, float)) or abs(c.token_accuracy - acc) > 1e-9:
        return "its token_accuracy is not what its recovered_ids give"
    if decode is not None and c.recovered_text != decode(got):
        return "its recovered_text is not its recovered_ids"
    if hasattr(c, "certificates"):
        for name in ("tried", "certificates", "distances", "runner_up", "exhaustive", "true_ranks"):
            v = getattr(c, name)
            if not isinstance(v, list) or len(v) != len(ids):
                return f"its {name} are not one per position"
        if any(x not in CERTIFICATES for x in c.certificates):
            return "it names an unknown certificate"
        if any(not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0 for d in c.distances):
            return "its distances are not finite and non-negative"
    return None


def check_records(kept: dict, texts: list[str], chunks: list[list[int]], decode) -> tuple[dict, list]:
    """The records of ``kept`` (index -> result) that are their chunk's (:func:`_why_not`), and the others as
    ``(index, why)``."""
    good, bad = {}, []
    for i, c in sorted(kept.items()):
        why = _why_not(c, texts[i], chunks[i], decode)
        if why is None:
            good[i] = c
        else:
            bad.append((i, why))
    return good, bad


TABLE_SLACK = 2e-3
"""How much farther than its recorded distance a position read off the first-position table may lie when
recomputed (the table's distances carry the float noise of a matmul expansion)."""


def reverify(kept: dict, reader, prefix: list[int], targets: list, tol: float, slack: float = 2e-4,
             floors: list | None = None) -> list:
    """Each kept per-position record's recovered tokens through ``reader`` (one forward pass of the prefix and the
    recovered ids per chunk): ``(index, why)`` for each whose recomputed relative distances to the observed states
    ``targets[i]`` (as read at ``--states-dtype``) are not the recorded ones (within ``slack`` plus 5 % of the
    recorded one: the full pass and the cached one the search ran differ by float noise), where a ``match`` lies
    farther than ``tol``, or whose noise floors and certificates are not what the states as read give
    (:func:`floors_why_not`; ``floors[i]``: the chunk's floors, recomputed from its states)."""
    import torch

    bad = []
    with torch.no_grad():
        for i, c in sorted(kept.items()):
            why = floors_why_not(c, None if floors is None else floors[i].tolist(), tol)
            if why is not None:
                bad.append((i, why))
                continue
            h = reader.full_states(torch.tensor([list(prefix) + list(c.recovered_ids)]))[0, len(prefix):].cpu()
            t = targets[i].float()
            d = ((h.float() - t).norm(dim=-1) / t.norm(dim=-1).clamp_min(1e-30)).tolist()
            table = list(c.from_table or []) + [False] * len(d)
            for pos, (now, rec, cert) in enumerate(zip(d, c.distances, c.certificates)):
                # a position read off the first-position table kept the table's distance, read through a matmul
                # expansion (torch.cdist) whose float noise is ~3e-4 of the state's norm: the exact pass may be nearer
                off = (now > rec + TABLE_SLACK) if table[pos] else abs(now - rec) > slack + 0.05 * rec
                if off or (cert == "match" and now > tol + slack):
                    bad.append((i, f"position {pos}'s recovered token lies at relative distance {now:.3g} from the "
                                   f"observed state, not the recorded {rec:.3g}"))
                    break
    return bad


def floors_why_not(c, floors: list[float] | None, tol: float) -> str | None:
    """Why a per-position record's noise floors or certificates are not what the states as read give (``floors``: the
    floors recomputed from them; None: not checked); None when they are. A record kept before the floors were has
    none (float32's 0): then no position may be ``ambiguous``."""
    from memlab.probes.invert.positions.searcher import ambiguous
    from memlab.probes.invert.report import CERTIFIED

    got = list(getattr(c, "noise", None) or [])
    if got and len(got) != len(c.certificates):
        return "its noise floors are not one per position"
    if floors is not None and (got or any(floors)):
        if len(got) != len(floors) or any(abs(a - b) > 1e-6 * max(abs(b), 1e-12) for a, b in zip(got, floors)):
            return "its noise floors are not those of the states as read"
    for pos, (d, r, x, f) in enumerate(zip(c.distances, c.runner_up, c.certificates, got or [0.0] * len(c.distances))):
        near = ambiguous(d, r, f, tol)
        if (x == "ambiguous") != near or (x in CERTIFIED and near):
            return (f"position {pos}'s certificate {x} is not what its distances give against its noise floor {f:.3g}")
    return None


def settle(run: str | Path, raw: dict, kept: dict, rejected: list, bad: list) -> None:
    """Write back what was trusted: the rejected lines and the records that failed their chunk's checks appended to
    ``chunks.rejected.jsonl`` (with why), one warning each, and ``chunks.jsonl`` rewritten whole (temporary file,
    synced, renamed) with the trusted records of ``kept`` alone (``raw``: each index's line as read). Run by the one
    process that holds the folder; a launch's other files (``chunks.R.jsonl``) are folded into it and removed."""
    run = Path(run)
    bad_idx = dict(bad)
    out = [{"file": f, "line": line, "why": why} for f, line, why in rejected]
    out += [{"file": "chunks", "line": raw[i], "why": why} for i, why in bad if i in raw]
    for f, _, why in rejected:
        warn(run, f"{run}/{f}: a record was dropped: {why}")
    for i, why in bad:
        warn(run, f"{run}: the kept record of chunk {i} was dropped ({why}); the chunk is searched again")
    if out:
        with open(run / REJECTED, "a") as fh:
            for r in out:
                fh.write(json.dumps(r) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    files = chunk_files(run)
    if not out and files in ([], [run / CHUNKS]):
        return  # nothing to change
    body = "".join(raw[i] + "\n" for i in sorted(kept) if i not in bad_idx and i in raw)
    tmp = run / (CHUNKS + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, run / CHUNKS)
    for p in files:
        if p.name != CHUNKS:
            p.unlink()


def append_line(path: Path, line: str) -> None:
    """Append ``line`` to ``path`` (flushed and synced) on a line of its own: a torn last line (a killed process's)
    is moved to ``chunks.rejected.jsonl`` and cut off first, so no record is written onto it."""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
        if last != b"\n":
            data = path.read_bytes()
            cut = data.rfind(b"\n") + 1
            with open(path.parent / REJECTED, "a") as fh:
                fh.write(json.dumps({"file": path.name, "line": data[cut:].decode(errors="replace"),
                                     "why": "a torn last line (cut short by a killed process)"}) + "\n")
            with open(path, "r+b") as fh:
                fh.truncate(cut)
    with open(path, "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())
