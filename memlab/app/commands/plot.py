"""memlab plot RUN: redraw a run's metric curves into RUN/plots."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a run's metric curves (PNG) into RUN/plots")
    p.add_argument("run_dir", help="run directory holding metrics.jsonl")
    p.add_argument("--metrics", nargs="+", default=None, help="metric names (default: every numeric metric logged)")
    p.set_defaults(func=run)


def check(args) -> None:
    """A metric named twice, refused before anything is imported."""
    from memlab.errors import MemlabError

    names = args.metrics or []
    twice = sorted({m for m in names if names.count(m) > 1})
    if twice:
        raise MemlabError(f"--metrics names {twice[0]} twice")


def run(args) -> int:
    from memlab.errors import MemlabError
    from memlab.outdir import OutputFolder
    from memlab.plots import plot_metrics
    from memlab.rundir import read_metrics

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise MemlabError(f"{run_dir}: no such run directory" if not run_dir.exists() else
                          f"{run_dir} is a file; give the run directory that holds metrics.jsonl")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise MemlabError(f"{run_dir} holds no metrics.jsonl (not a training run, or it logged nothing yet)")
    records = read_metrics(path)
    if not records:
        raise MemlabError(f"{path}: no metrics to plot")
    keys = args.metrics or sorted({k for r in records for k, v in r.items()
                                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch")})
    logged = {k for r in records for k in r}
    unknown = [k for k in keys if k not in logged]
    if unknown:
        raise MemlabError(f"metric '{unknown[0]}' was never logged in {path}; logged: {', '.join(sorted(logged))}")
    # the run's lock: refused while a training process writes into it; a plots/ made here goes again on failure
    with OutputFolder.existing(run_dir, "run", busy_hint="wait for it to end (a run draws its plots when it ends)") as out:
        written = plot_metrics(path, out.subdir("plots"), tuple(keys), records=records)
    for f in written:
        print(f)
    return 0
