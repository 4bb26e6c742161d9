"""Benchmark part 'generation' alone: python benchmarks/bench_generation.py [--out DIR] [other memlab bench flags].

Same as `memlab bench --parts generation`; results (bench.json, plots/, README.md) go to --out.
"""

import sys

from memlab.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--parts", "generation", *sys.argv[1:]]))
