"""memlab quickstart: probe a memory autoencoder, small causal LMs, MiniLM (trained and random) and SmolLM2
beside the calibration encoders, on the same held-out text."""

from __future__ import annotations

from memlab.app.commands import check_threads, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("quickstart", help="the README's first command: compare what models remember (offline, minutes)",
                       description="Probe a memory autoencoder, a small causal LM and its random-weight twin, the "
                                   "packaged MiniLM and a random-weight MiniLM (and SmolLM2 where installed) on the "
                                   "same held-out text, beside the calibration encoders synthetic:concat|bag|constant; "
                                   "print a table and write summary.json, table.md, a plot and one probe run per "
                                   "entry into the run directory.")
    p.add_argument("--out", help="run directory (default runs/quickstart-TIMESTAMP)")
    p.add_argument("--retrain", action="store_true",
                   help="train the memory autoencoder and the causal LM from scratch instead of using the shipped checkpoints")
    p.add_argument("--only", nargs="+", metavar="ENTRY", help="probe only these entries")
    p.add_argument("--skip", nargs="+", metavar="ENTRY", default=[], help="skip these entries (e.g. smollm2)")
    p.add_argument("--fast", action="store_true", help="a much smaller run (tests, smoke checks)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="change a probe option for every entry (ProbeOptions field, e.g. --set epochs=30); repeatable")
    p.add_argument("--invert", type=int, default=0, metavar="N",
                   help="also invert each entry's vector with its weights in the loop (memlab invert's pooled search) "
                        "on the first N of the same held-out chunks, beside its control; an extra table (default 0: off)")
    p.add_argument("--invert-gflops", type=float, default=2000.0, metavar="G",
                   help="the inversion's budget per chunk in GFLOP-equivalents (default 2000)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's own)")
    p.add_argument("--progress", action="store_true", default=None, help="progress bars even when not on a TTY")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from memlab.app.quickstart import run_quickstart

    check_threads(args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)

    run_quickstart(out=args.out, retrain=args.retrain, only=args.only, skip=args.skip, fast=args.fast,
                   progress=args.progress, overrides=args.overrides,
                   invert=args.invert, invert_gflops=args.invert_gflops)
    return 0
