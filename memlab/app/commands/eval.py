"""memlab eval: run evaluation tasks on trained models (one table), or a scaling sweep.

    memlab eval --run RUN_A --run RUN_B --task hellaswag --task needle --out runs/eval
    memlab eval --scaling configs/scaling/token_lm_cpu.yaml --out runs/scaling
"""

from __future__ import annotations

import shlex
import sys

from memlab.app.commands import check_device, int_list, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate trained models on tasks, or run a scaling sweep",
                       description="Evaluate one or more trained runs on registered tasks (memlab list tasks) and "
                                   "write eval.json / eval.md; or, with --scaling, train a sweep of sizes and fit "
                                   "L(N) = a N^-alpha + b.")
    p.add_argument("--run", action="append", default=[], help="run directory or saved model (repeat to compare)")
    p.add_argument("--task", action="append", default=[], help="task name (repeat); default: all tasks")
    p.add_argument("--data", default=None, help="'local' (default: small local sets), 'hub' (datasets, needs a "
                                                "network) or a .jsonl file")
    p.add_argument("--limit", type=positive_int, default=None, help="at most this many examples per task")
    p.add_argument("--max-new-tokens", type=positive_int, default=48)
    p.add_argument("--needle-lengths", type=int_list, default=[256, 448], help="comma-separated haystack lengths (tokens)")
    p.add_argument("--judge-url", default=None, help="OpenAI-compatible endpoint for the LLM judge (off by default; "
                                                     "key from MEMLAB_JUDGE_API_KEY)")
    p.add_argument("--judge-model", default="gpt-4o")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto",
                   help="where the models run: auto (the best present: CUDA, MPS, else CPU), cpu, cuda, cuda:N, mps")
    p.add_argument("--scaling", metavar="SWEEP", help="run a scaling sweep config (configs/scaling/*.yaml) instead")
    p.add_argument("--out", default=None, help="output directory (default runs/eval-TIMESTAMP)")
    p.set_defaults(func=run)


def check(args) -> None:
    """Flags that do nothing together, refused before anything is imported."""
    from memlab.errors import MemlabError

    check_device(args.device)
    for flag, values in (("--task", args.task), ("--run", args.run)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise MemlabError(f"{flag} {twice[0]} is given twice")
    if args.scaling and (args.run or args.task):
        raise MemlabError("--scaling runs a sweep of its own; it takes no --run or --task")
    if not args.scaling and not args.run:
        raise MemlabError("give at least one --run (or --scaling SWEEP)")


def run(args) -> int:
    import time
    from pathlib import Path

    from memlab.devices import resolve_device, running_on
    from memlab.errors import MemlabError
    from memlab.outdir import OutputFolder

    device = resolve_device(args.device)  # an absent device: one error before anything is loaded or written
    command = "memlab " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[0].endswith(("memlab", "memlab/app/cli.py")) else ""
    out = Path(args.out or f"runs/{'scaling' if args.scaling else 'eval'}-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.scaling:
        from memlab.analysis.scaling import format_table, load_sweep_config, run_sweep

        sweep = load_sweep_config(args.scaling)
        with OutputFolder.new(out, "scaling") as folder:  # a new folder; a sweep that fails leaves none
            res = run_sweep(sweep, out)
            table = format_table(res)
            folder.write("scaling.md", table + "\n")
        print(table)
        print(f"wrote {out / 'scaling.json'} and {out / 'scaling.png'}")
        return 0
    if not args.run:
        raise MemlabError("give at least one --run (or --scaling SWEEP)")
    from memlab.app.eval.adapters import load_adapter
    from memlab.app.eval.runner import evaluate_models, format_table, write_results
    from memlab.app.eval.tasks import TaskOptions
    from memlab.registry import TASKS

    import memlab.app.eval  # noqa: F401  (registers the tasks)

    lengths = tuple(args.needle_lengths)
    opts = TaskOptions(data=args.data, limit=args.limit, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       needle_lengths=lengths, judge_url=args.judge_url, judge_model=args.judge_model)
    tasks = args.task or TASKS.names()
    for t in tasks:
        TASKS.get(t)  # unknown names: one clear error before loading any model
    check_data_is_read(args.data, tasks)
    with OutputFolder.new(out, "eval") as folder:  # a new folder, locked; an eval that fails leaves none
        with running_on(device):
            adapters = [load_adapter(r) for r in args.run]
            results = evaluate_models(adapters, tasks, opts, log=lambda s: print(s, file=sys.stderr))
        path = write_results(results, folder, command)
    print(format_table(results))
    print(f"wrote {path}")
    return 0


def check_data_is_read(data: str | None, tasks: list[str]) -> None:
    """A MemlabError when ``--data`` asks for a source (hub, a file) that one of ``tasks`` would not read."""
    from memlab.errors import MemlabError
    from memlab.registry import TASKS

    if data in (None, "local"):
        return
    ignored = [t for t in tasks if not getattr(TASKS.get(t), "reads_data", True)]
    if ignored:
        readers = [t for t in TASKS.names() if getattr(TASKS.get(t), "reads_data", True)]
        raise MemlabError(f"--data {data} is not read by task {', '.join(ignored)} (it makes its own examples); "
                          f"give --task for the tasks that read it: {', '.join(readers)}")
