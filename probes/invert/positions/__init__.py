"""The per-position search (``--states positions``): rank every token at a position (the model's prior, the
first-order score, the secant order), verify the best in batched passes, many chunks in lockstep, and certify
the result; the first-position table, the states read at a lower precision and the robustness checks.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "firsttable": ("digest", "table_path", "read_table", "write_table"),
    "lockstep": ("PASS_ROWS", "SECANT_REFIT", "SECANT_KEEP", "LockstepOptions", "Lockstep"),
    "precision": ("DTYPES", "read_as", "noise_floor", "measured_error"),
    "rank": ("NextTokenHead", "interleave", "best_untried", "rank_of", "fused"),
    "robust": ("quantized_copy", "relative_error", "recovery"),
    "run": ("check_applies", "observed_states", "fingerprint", "table_key", "first_table", "PositionsRun"),
    "searcher": ("Position", "Searcher", "ambiguous"),
    "secant": ("secant_scores",),
})
