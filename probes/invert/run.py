"""``memlab invert``, top-down, one sequence for both searches: load the model -> cut the probe's chunks -> the
chosen search checks it applies -> take the observed states -> anything shared across chunks -> search each
chunk -> report.

The chunks are the probe's held-out chunks (:mod:`memlab.probes.chunks.cut`): with the same ``seq_len``, ``chunk_by``,
``corpus``, split, ``seed`` and ``n_eval``, ``memlab probe`` scores the same chunk texts, and ``memlab invert``
inverts the first ``n`` of them. Each chunk is read as the probe's encoder reads it (the tokenizer's special tokens
before it, e.g. a BOS token, are the fixed prefix the search starts from).

The searches (:class:`~memlab.probes.invert.positions.run.PositionsRun` for ``--states positions``,
:class:`~memlab.probes.invert.pooled.run.PooledRun` for a pooled one) each provide ``check(opts)``
(before the model loads), ``units``, ``targets``, ``prepare`` (given the chunks to do and the machine's facts,
measured once), ``chunk``, ``report`` and ``summary``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from memlab.probes.invert.options import InvertOptions, check_space_states
from memlab.probes.invert.pooled.report import PooledChunk
from memlab.probes.invert.report import ChunkResult
from memlab.probes.invert.pooled.run import PooledRun
from memlab.probes.invert.positions.run import PositionsRun
from memlab.probes.invert.start import affixes, machine_facts, setup


def beside_probe(report, side, lines: list[str]) -> list[str]:
    """``report.table`` (the probe run's side by side with the inversion, :mod:`memlab.probes.invert.beside.table`) and
    the summary lines with the table after them; the lines unchanged without a probe run."""
    if side is None:
        return lines
    from memlab.probes.invert.beside.table import build_table, table_lines

    table = build_table(side, report.chunks, report.states, report.layer, seed=report.text.get("seed") or 0)
    report.table = table.to_dict()
    return lines + table_lines(table)


def _each(search, todo: list[int], texts, chunks, targets, step):
    """Each chunk of ``todo`` searched, its result yielded as it finishes (a search that advances many chunks
    together gives ``results``; the others are asked chunk by chunk)."""
    if hasattr(search, "results"):
        yield from search.results(todo, texts, chunks, targets, step)
        return
    for i in todo:
        yield search.chunk(i, texts[i], chunks[i], targets, step)


def _noter(log, bar):
    """A search's progress line: into the run's log and onto the terminal (beside the progress bar)."""

    def note(msg: str) -> None:
        log.note(msg)
        (bar.write if hasattr(bar, "write") else lambda m: print(m, file=sys.stderr, flush=True))(f"invert: {msg}")

    return note


def _write_report(opts, search, reader, enc, machine, side, share, folder, out, results, processes):
    """The run's report.json and summary.txt from every chunk's result (a launch: with each process's line);
    (report, summary lines)."""
    text = {k: getattr(opts.text, k) for k in ("corpus", "chunk_by", "seq_len", "seed", "n_eval")}
    common = dict(model=opts.model.model, states_from=search.src, layer=reader.layer,
                  num_layers=reader.num_layers, states=opts.model.states, hooks=dict(reader.hooks),
                  text=text | {"split": opts.text.eval_split, "prefix": affixes(enc)[0]},
                  noise=opts.model.noise, machine=machine)
    report = search.report(results, common)
    lines = beside_probe(report, side, search.summary(report))
    if share.launched:
        from memlab.probes.invert.merge import process_lines

        lines = lines + process_lines(processes)
    folder.write_json("report.json", report.to_dict() | ({"processes": processes} if share.launched else {}))
    share.clean(out)
    folder.write("summary.txt", "\n".join(lines) + "\n")
    return report, lines


def run_invert(opts: InvertOptions, out: Path, resume: bool = False):
    """Invert the chunks ``opts`` names (the checked options of ``memlab invert``) into ``out``; (report, summary
    lines). Each chunk's result is kept in ``out`` as it finishes (:mod:`memlab.probes.invert.chunklog`);
    ``resume``: ``out`` holds a stopped run of these options, whose finished chunks are read back, not searched
    again."""
    from dataclasses import asdict

    from memlab.probes.invert.chunklog import ChunkLog, write_settings
    from memlab.probes.invert.merge import Share, gather_share, open_share
    from memlab.probes.invert.trust import fingerprint
    from memlab.progress import progress_bar

    share = Share.of_launch()  # one process, or one of a launch's (memlab.probes.invert.merge)
    share.start(opts)
    check_space_states(opts.model)  # a space's vector and --states space go together
    kind = PooledRun if opts.pooled_search else PositionsRun
    kind.check(opts)
    device, enc, reader, texts, chunks, side = setup(opts)
    search = kind(opts, enc, reader, device, chunks)
    machine = machine_facts()
    show = opts.output.progress or None
    kind_of, fp, mine = PooledChunk if opts.pooled_search else ChunkResult, fingerprint(asdict(opts)), []
    folder = share.folder(out, resume)
    stopped = None
    with folder:
        if not resume and share.main:
            write_settings(folder, asdict(opts))
        targets = search.targets(chunks)
        kept = open_share(share, out, resume, kind_of, fp, search, texts, chunks, targets, enc, opts)  # checked
        todo = share.mine([i for i in range(len(chunks)) if i not in kept])
        search.prepare(targets, todo, machine)
        total = search.units(chunks)
        log = ChunkLog(out, total, 0, len(chunks))
        log.fingerprint = fp
        share.name_files(log)
        done_units = sum(log.units(r) for r in kept.values())
        log.done = log.at_start = done_units
        bar = progress_bar(total, f"invert: {search.label}", show=show, initial=done_units)

        search.note = _noter(log, bar)  # progress lines of a search that runs long between chunks
        if kept:
            log.note(f"resumed: {len(kept)} of {len(chunks)} chunks kept, {len(todo)} to search")
        units = [done_units]

        def step(n: int = 1):
            units[0] += n
            bar.update(n)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(left=log.eta(units[0]).split("about ")[-1].replace(" left", ""))
            log.tick(units[0])

        processes = None
        try:
            for res in _each(search, todo, texts, chunks, targets, step):
                kept[res.index] = res
                mine.append(res.index)
                log.add(res, len(kept), units[0])
            if share.launched:  # the main process gathers every process's records, checked
                kept, processes = gather_share(share, out, kept, mine, machine, opts.model.device, kind_of, fp,
                                               search, texts, chunks, targets, enc, opts)
        except BaseException as e:  # noqa: BLE001  (Ctrl-C, a signal, a failure: what was found is kept)
            stopped = e
        bar.close()
        if stopped is None and not share.main:
            return None, []
        if stopped is None:
            report, lines = _write_report(opts, search, reader, enc, machine, side, share, folder, out,
                                          [kept[i] for i in range(len(chunks))], processes)
    if stopped is not None:
        print(f"memlab: invert: stopped with {len(kept)} of {len(chunks)} chunks kept in {out}; "
              f"memlab invert --resume {out} continues the run", file=sys.stderr)
        raise stopped
    return report, lines
