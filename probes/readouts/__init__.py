"""Stage 4, read: the read-outs beside the decoder (bag of words, alignment to another space), the learning curve
inside the run with its verdict, the online code (description length) and the pointwise information per chunk.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "align": ("DEFAULT_TARGET", "ALPHAS", "MIN_PAIRS", "MAX_WEIGHTS", "target_spec", "load_target", "target_ids",
              "decoder_tokenizer", "label_ids", "check_target", "check_fits", "RidgeMap", "standardise", "fit_ridge",
              "decode_stats", "greedy_tf1", "fit_align", "align_readout", "align_summary", "align_columns"),
    "bow": ("multi_hot", "recovered_per_chunk", "BagHeadMember", "fit_bow", "bow_readout", "bow_member",
            "bow_summary", "bow_columns"),
    "online_code": ("Block", "online_code", "uniform_block", "readings_of"),
    "pointwise": ("pointwise",),
    "saturation": ("MIN_CHUNKS", "Point", "curve_sizes", "limit_note", "power_limit", "verdict", "learning_curve"),
})
