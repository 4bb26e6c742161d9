"""``memlab invert`` on several processes: ``memlab launch --multi_gpu --num_processes N invert ...`` (``--multi_gpu``
starts the processes on the CPU too where there is no GPU).

The chunks are independent, so they are shared out: process ``r`` of ``N`` searches the chunks ``r, r+N, r+2N, ...``
that are not finished yet, each on its own device (``cuda:LOCAL_RANK`` on GPUs, unless ``--device-map`` places a
model larger than one device) and, without ``--threads``, its share of the host's cores. Every process loads the
model, cuts the same chunks and reads every chunk's observed states (a forward pass each), so every process's
targets, noise included, are the one-process run's. No process group is joined: the processes meet through the run
folder, so a share that takes hours waits on no collective's timeout.

* The main process (rank 0) claims the folder, writes ``invert.json`` (a fresh run) or checks and folds what the
  folder holds (``--resume``, :mod:`memlab.probes.invert.trust`), and then writes ``launch.json`` (this launch's id
  and size): the others start their share once they read it.
* Each process appends its finished chunks to its own ``chunks.R.jsonl`` (rank 0: ``chunks.jsonl``) and its
  progress to ``log.R.txt`` (rank 0: ``log.txt``), and when its share is done writes ``done.R.json``: its chunks,
  tokens, seconds and rate.
* The main process, its own share done, waits for every ``done.R.json`` of this launch, reads every process's
  records back under the checks of a resume (checksum, fingerprint, chunk, one forward pass), folds them into the
  one ``chunks.jsonl`` and writes the one report: the one-process run's (the same recovered tokens, certificates,
  readings and intervals), with ``processes`` listing each process's chunks, time and rate.

A worker or the launcher killed (``kill -9`` included: the processes end with their launcher,
:func:`memlab.app.launched.tie_to_launcher`) leaves every finished chunk in the folder; ``memlab invert --resume RUN``,
on one process or launched on any number, finishes it with the same report.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

LAUNCH = "launch.json"
POLL_S = 0.2
LAUNCHER_ENV = "MEMLAB_LAUNCHER_PID"
"""Set by ``memlab launch`` in every process it starts (:data:`memlab.app.launched.LAUNCHER_ENV`; read here by
name, as a plugin does not import the application layer): part of the launch's id."""


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


class Share:
    """This process's place in a launch (rank 0 of 1 outside one)."""

    def __init__(self, rank: int = 0, world: int = 1, attempt: str = ""):
        self.rank, self.world, self.attempt = rank, world, attempt
        self.t0 = time.monotonic()
        self.started = time.time()

    @classmethod
    def of_launch(cls) -> "Share":
        world = _env_int("WORLD_SIZE", 1)
        if world <= 1:
            return cls()
        attempt = "-".join(os.environ.get(k, "") for k in (LAUNCHER_ENV, "TORCHELASTIC_RUN_ID", "MASTER_PORT"))
        return cls(_env_int("RANK", 0), world, attempt)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def launched(self) -> bool:
        return self.world > 1

    def start(self, opts) -> None:
        """In a launch: without ``--threads`` this process takes its share of the host's cores; on GPUs its own
        device (``cuda:LOCAL_RANK``) unless ``--device-map`` places the model."""
        if not self.launched:
            return
        import torch

        if not opts.model.threads:
            opts.model.threads = max(1, (os.cpu_count() or 1) // self.world)
        dev = opts.model.device or "auto"
        cuda = dev.startswith("cuda") or (dev == "auto" and torch.cuda.is_available())
        if cuda and opts.model.device_map in (None, "none"):
            opts.model.device = f"cuda:{_env_int('LOCAL_RANK', self.rank)}"

    def mine(self, todo: list[int]) -> list[int]:
        """The chunks of ``todo`` this process searches (chunk ``i`` goes to process ``i mod N``)."""
        return [i for i in todo if i % self.world == self.rank]

    def name_files(self, log) -> None:
        """A launched process other than the main one writes its own chunk records and log."""
        if self.launched and not self.main:
            log.chunks_file, log.log_file = f"chunks.{self.rank}.jsonl", f"log.{self.rank}.txt"

    # ---------------------------------------------------------------- meeting through the folder
    def folder(self, out: Path, resume: bool):
        """The run folder as this process writes it: claimed by the main process (new, or a stopped run's with
        ``resume``); the others write their own files into it, unclaimed."""
        if not self.main:
            import contextlib

            return contextlib.nullcontext()
        from memlab.outdir import OutputFolder

        return OutputFolder.existing(out, "inversion") if resume else OutputFolder.new(out, "inversion")

    def opened(self, out: Path) -> None:
        """The main process: the folder is ready for the others (its settings written, its records checked)."""
        if self.launched and self.main:
            _write(out / LAUNCH, {"attempt": self.attempt, "world": self.world})

    def wait_opened(self, out: Path) -> None:
        """A process other than the main one: wait until the main one has readied the folder for this launch."""
        while True:
            got = _read(out / LAUNCH)
            if got is not None and got.get("attempt") == self.attempt:
                return
            time.sleep(POLL_S)

    def finish(self, out: Path, chunks: list[int], tokens: int, machine: dict, device: str) -> dict:
        """This process's share is done: its line of the report's ``processes`` (written as ``done.R.json`` by a
        process other than the main one)."""
        seconds = time.monotonic() - self.t0
        me = {"rank": self.rank, "chunks": sorted(chunks), "tokens": int(tokens), "seconds": round(seconds, 3),
              "tokens_per_second": round(tokens / seconds, 4) if seconds > 0 else None,
              "threads": machine.get("threads"), "matmul_gflops": machine.get("matmul_gflops"),
              "device": str(device), "attempt": self.attempt}
        if self.launched and not self.main:
            _write(out / f"done.{self.rank}.json", me)
        return me

    def wait_done(self, out: Path) -> list[dict]:
        """The main process: every other process's ``done.R.json`` of this launch, in rank order."""
        got = {}
        while len(got) < self.world - 1:
            for r in range(1, self.world):
                if r not in got:
                    d = _read(out / f"done.{r}.json")
                    if d is not None and d.get("attempt") == self.attempt:
                        got[r] = d
            if len(got) < self.world - 1:
                time.sleep(POLL_S)
        return [got[r] for r in sorted(got)]

    def clean(self, out: Path) -> None:
        """The main process, the report written: the meeting files go (their content is in the report)."""
        for p in [out / LAUNCH, *out.glob("done.*.json")]:
            p.unlink(missing_ok=True)


def _write(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(obj))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def process_lines(processes: list[dict]) -> list[str]:
    """One summary line per process of a launch."""
    out = []
    for p in processes:
        rate = p.get("tokens_per_second")
        out.append(f"process {p['rank']} of {len(processes)}: {len(p['chunks'])} chunks, {p['tokens']} tokens in "
                   f"{p['seconds']:.1f} s" + (f" ({rate:.3g} tokens/s)" if rate else "")
                   + (f", {p['threads']} threads" if p.get("threads") else ""))
    return out


def trusted(out: Path, search, kept: dict, rejected: list, raw: dict, texts, chunks, targets, enc, opts,
            write: bool) -> dict:
    """The records ``kept`` (read by :func:`memlab.probes.invert.trust.read_records`) that are their chunk's and,
    for the per-position search, whose recovered tokens the states bear out; ``write``: the process that holds the
    folder settles it (rejected records moved aside with a warning each, the records folded into ``chunks.jsonl``)."""
    from memlab.probes.invert import trust

    decode = getattr(getattr(enc, "tokenizer", None), "decode", None)
    good, bad = trust.check_records(kept, texts, chunks, decode)
    if hasattr(search, "lockstep") and good:  # the per-position search: one forward pass per kept chunk
        bad += trust.reverify(good, search.reader, list(getattr(enc, "prefix", []) or []), targets,
                              opts.positions.tol, floors=getattr(search, "floors", None))
        good = {i: c for i, c in good.items() if i not in dict(bad)}
    if write:
        trust.settle(out, raw, kept, rejected, bad)
    return good


def open_share(share: Share, out: Path, resume: bool, kind: type, fp: str, search, texts, chunks, targets, enc,
               opts) -> dict:
    """The finished chunks this process starts from, checked (:func:`trusted`; none for a fresh run), once the
    folder is ready: the main process checks and settles it and tells the others; they then read it."""
    from memlab.probes.invert.trust import read_records

    if not share.main:
        share.wait_opened(out)
    kept = {}
    if resume:
        got, rejected, raw = read_records(out, kind, len(chunks), fp)
        kept = trusted(out, search, got, rejected, raw, texts, chunks, targets, enc, opts, write=share.main)
    share.opened(out)
    return kept


def gather_share(share: Share, out: Path, kept: dict, mine: list[int], machine: dict, device, kind: type, fp: str,
                 search, texts, chunks, targets, enc, opts) -> tuple[dict, list[dict]]:
    """This process's share is done: a process other than the main one says so (and is done); the main one waits
    for the others, reads every process's records back under the resume's checks and folds them into
    ``chunks.jsonl``: (every chunk's result by index, each process's line of the report)."""
    from memlab.errors import MemlabError
    from memlab.probes.invert.trust import read_records

    me = share.finish(out, mine, sum(len(kept[i].true_ids) for i in mine), machine, device)
    if not share.main:
        return kept, [me]
    others = share.wait_done(out)
    got, rejected, raw = read_records(out, kind, len(chunks), fp)
    every = trusted(out, search, got, rejected, raw, texts, chunks, targets, enc, opts, write=True)
    missing = [i for i in range(len(chunks)) if i not in every]
    if missing:
        raise MemlabError(f"the launch's processes left chunks {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                          f"without a trusted record; memlab invert --resume {out} searches them")
    return every, [me, *others]
