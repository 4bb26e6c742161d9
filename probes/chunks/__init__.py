"""Stage 1, text: the probe's chunks cut from a corpus (by words or tokens, capped in tokens), how they were
cut (``TextAccounting``, ``ProbeText``) and the decoder's targets.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "batch": ("PAD", "mask_of", "fill_pad", "rows", "shift_right", "trim"),
    "cut": ("TEXT_FIELDS", "TextAccounting", "ProbeText", "pick_texts", "word_chunks", "cap_tokens",
            "tokenize_chunks", "chunk_chars", "rendering", "split_description", "probe_texts", "probe_chunks",
            "TextCut", "probe_data", "eval_note"),
    "targets": ("MAX_UNK_SHARE", "MIN_ROUND_TRIP", "SEEN_AT_LEAST", "Targets", "decoder_tokenizer", "target_name",
                "check_encodes", "make_targets"),
})
