"""memlab bench: performance measured side by side in one run (see docs/evaluation.md).

    memlab bench --out runs/bench                      # every part, full sizes
    memlab bench --parts prefill,mfu --out runs/b      # some parts
    memlab bench --quick --out /tmp/b                  # tiny sizes: checks the harness only
"""

from __future__ import annotations

import shlex
import sys

from memlab.app.bench import PARTS
from memlab.app.commands import check_device, choice_list, int_list, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure performance side by side (prefill, generation, MFU, probe, FLOPs)",
                       description="Benchmarks measured side by side in one run; writes bench.json, plots/ and a "
                                   "README.md table into --out. Parts: " + ", ".join(PARTS) + ".")
    p.add_argument("--parts", type=choice_list(PARTS), default=list(PARTS), help="comma-separated parts (default: all)")
    p.add_argument("--out", default=None, help="run directory (default runs/bench-TIMESTAMP); must be new")
    p.add_argument("--device", default=None, help="where the parts run: auto (default: the best present: CUDA, MPS, "
                                                 "else CPU), cpu, cuda, cuda:N or mps; bench.json records it")
    p.add_argument("--quick", action="store_true", help="tiny sizes: check the harness, numbers mean nothing")
    p.add_argument("--prefill-lengths", type=int_list, default=None, help="comma-separated token counts (default 1k..32k)")
    p.add_argument("--prefill-logits", default="last", choices=["last", "all"],
                   help="prefill: logits of the last position only (logits_to_keep=1, as generate does; default) "
                        "or of every position")
    p.add_argument("--generation-contexts", type=int_list, default=None, help="comma-separated context lengths (default 256..16k)")
    p.add_argument("--mfu-steps", type=positive_int, default=12, help="training steps per family for MFU")
    p.set_defaults(func=run)


def check(args) -> None:
    """The device's name, checked before anything is imported."""
    check_device(args.device)


def run(args) -> int:
    import time
    from pathlib import Path

    from memlab.app.bench.runner import run_bench

    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith(("memlab", "memlab/app/cli.py")) else ["bench"] + [a for a in _argv(args)]
    command = "memlab " + " ".join(shlex.quote(a) for a in argv)
    run_bench(out, list(args.parts), device=args.device, quick=args.quick,
              prefill_lengths=args.prefill_lengths, generation_contexts=args.generation_contexts,
              mfu_steps=args.mfu_steps, prefill_logits=args.prefill_logits, command=command,
              log=lambda s: print(s, file=sys.stderr))
    print((out / "README.md").read_text())
    print(f"wrote {out / 'bench.json'}")
    return 0


def _argv(args) -> list[str]:
    """A reconstruction of the command line (when called through main(argv) in tests)."""
    out = ["--parts", ",".join(args.parts)]
    if args.out:
        out += ["--out", args.out]
    if args.quick:
        out.append("--quick")
    if args.prefill_logits != "last":
        out += ["--prefill-logits", args.prefill_logits]
    for flag, v in (("--device", args.device), ("--prefill-lengths", args.prefill_lengths),
                    ("--generation-contexts", args.generation_contexts)):
        if v:
            out += [flag, v if isinstance(v, str) else ",".join(map(str, v))]
    if args.mfu_steps != 12:
        out += ["--mfu-steps", str(args.mfu_steps)]
    return out
