"""Benchmark part 'mfu' alone: python benchmarks/bench_mfu.py [--out DIR] [other memlab bench flags].

Same as `memlab bench --parts mfu`; results (bench.json, plots/, README.md) go to --out.
"""

import sys

from memlab.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--parts", "mfu", *sys.argv[1:]]))
