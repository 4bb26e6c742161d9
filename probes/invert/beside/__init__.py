"""The trained probe beside the inversion (``--probe RUN``): the probe run's folder read before anything heavy,
its saved decoder on the same chunks, and the one table of both.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "probe_run": ("POOL_TO_STATES", "TEXT_FLAGS", "ProbeRunSettings", "NO_WEIGHTS", "read_probe_run", "reconcile"),
    "side": ("DecoderReads", "ProbeSide", "run_options", "read_probe_side"),
    "table": ("COLUMNS", "HEADS", "ROWS", "ProbeTable", "build_table", "table_lines"),
})
