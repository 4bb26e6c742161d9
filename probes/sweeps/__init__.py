"""Many probes from one set of options: a layer sweep and learning curve, a length sweep, a comparison of methods.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "compare": ("SHARED", "Method", "split_top", "parse_method", "parse_methods", "owners", "applies",
                "method_options", "methods", "readout_name", "Cells", "cells", "table", "plot"),
    "layers": ("SCORES", "SweepRow", "encode_layers", "run_layer_sweep", "run_learning_curve"),
    "lengths": ("SAME_TEXT", "check_limit", "cut_lengths", "length_row", "run_length_sweep"),
})
