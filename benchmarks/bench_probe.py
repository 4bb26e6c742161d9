"""Benchmark part 'probe' alone: python benchmarks/bench_probe.py [--out DIR] [other memlab bench flags].

Same as `memlab bench --parts probe`; results (bench.json, plots/, README.md) go to --out.
"""

import sys

from memlab.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--parts", "probe", *sys.argv[1:]]))
