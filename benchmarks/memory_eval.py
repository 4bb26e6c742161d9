"""Evaluate a trained memory model on held-out text, another domain and random tokens.

    python benchmarks/memory_eval.py runs/ae-small [--n 256] [--objectives blank_copy copy]

Prints one JSON object and writes it to RUN/memory_eval.json. See
memlab.models.memory.evaluation for the sets (the other domain is Python's
bundled documentation topics, pydoc_data.topics).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    from memlab.errors import MemlabError
    from memlab.models.memory.evaluation import evaluate_run

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="run directory of a memory-recipe run")
    p.add_argument("--n", type=int, default=256, help="examples per evaluation set")
    p.add_argument("--objectives", nargs="*", default=None, help="objectives to score (default: the run's eval_objectives)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        res = evaluate_run(args.run, n=args.n, objectives=tuple(args.objectives) if args.objectives else None, seed=args.seed)
    except MemlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=2)
    print(text)
    (Path(args.run) / "memory_eval.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
