"""Benchmark part 'prefill' alone: python benchmarks/bench_prefill.py [--out DIR] [other memlab bench flags].

Same as `memlab bench --parts prefill`; results (bench.json, plots/, README.md) go to --out.
"""

import sys

from memlab.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--parts", "prefill", *sys.argv[1:]]))
