"""Benchmark part 'flops' alone: python benchmarks/bench_flops.py [--out DIR] [other memlab bench flags].

Same as `memlab bench --parts flops`; results (bench.json, plots/, README.md) go to --out.
"""

import sys

from memlab.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--parts", "flops", *sys.argv[1:]]))
