"""``memlab invert``, top-down, one sequence for both searches: load the model -> cut the probe's chunks -> the
chosen search checks it applies -> take the observed states -> anything shared across chunks -> search each
chunk -> report.

The chunks are the probe's held-out chunks (:mod:`memlab.probes.chunks`): with the same ``seq_len``, ``chunk_by``,
``corpus``, split, ``seed`` and ``n_eval``, ``memlab probe`` scores the same chunk texts, and ``memlab invert``
inverts the first ``n`` of them. Each chunk is read as the probe's encoder reads it (the tokenizer's special tokens
before it, e.g. a BOS token, are the fixed prefix the search starts from).

The searches (:class:`~memlab.probes.invert.run_positions.PositionsRun` for ``--states positions``,
:class:`~memlab.probes.invert.run_pooled.PooledRun` for ``--states last|mean``) each provide ``check(opts)``
(before the model loads), ``units``, ``targets``, ``prepare``, ``chunk``, ``report`` and ``summary``.
"""

from __future__ import annotations

from pathlib import Path

from memlab.probes.invert.options import InvertOptions
from memlab.probes.invert.run_pooled import PooledRun
from memlab.probes.invert.run_positions import PositionsRun
from memlab.probes.invert.setup import machine_facts, setup


def beside_probe(report, side, lines: list[str]) -> list[str]:
    """``report.table`` (the probe run's side by side with the inversion, :mod:`memlab.probes.invert.table`) and
    the summary lines with the table after them; the lines unchanged without a probe run."""
    if side is None:
        return lines
    from memlab.probes.invert.table import build_table, table_lines

    table = build_table(side, report.chunks, report.states, report.layer, seed=report.text.get("seed") or 0)
    report.table = table.to_dict()
    return lines + table_lines(table)


def run_invert(opts: InvertOptions, out: Path):
    """Invert the chunks ``opts`` names (the checked options of ``memlab invert``) into ``out``; (report, summary
    lines)."""
    from memlab.outdir import OutputFolder
    from memlab.progress import progress_bar

    kind = PooledRun if opts.pooled_search else PositionsRun
    kind.check(opts)
    device, enc, reader, texts, chunks, side = setup(opts)
    search = kind(opts, enc, reader, device, chunks)
    machine = machine_facts()
    show = opts.output.progress or None
    with OutputFolder.new(out, "inversion") as folder:
        targets = search.targets(chunks)
        search.prepare(targets)
        bar = progress_bar(search.units(chunks), f"invert: {search.label}", show=show)
        results = [search.chunk(i, text, ids, targets, bar.update) for i, (text, ids) in enumerate(zip(texts, chunks))]
        bar.close()
        text = {k: getattr(opts.text, k) for k in ("corpus", "chunk_by", "seq_len", "seed", "n_eval")}
        common = dict(model=opts.model.model, states_from=search.src, layer=reader.layer,
                      num_layers=reader.num_layers, states=opts.model.states, hooks=dict(reader.hooks),
                      text=text | {"split": opts.text.eval_split, "prefix": list(enc.prefix)},
                      noise=opts.model.noise, machine=machine)
        report = search.report(results, common)
        lines = beside_probe(report, side, search.summary(report))
        folder.write_json("report.json", report.to_dict())
        folder.write("summary.txt", "\n".join(lines) + "\n")
    return report, lines
