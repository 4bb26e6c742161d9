"""Stage 1, text: the probe's chunks cut from a corpus (by words or tokens, capped in tokens), how they were
cut (``TextAccounting``, ``ProbeText``) and the decoder's targets.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "cut": ("PAD", "TEXT_FIELDS", "TextAccounting", "ProbeText", "mask_of", "fill_pad", "rows", "pick_texts",
            "word_chunks", "cap_tokens", "tokenize_chunks", "chunk_chars", "rendering", "shift_right", "trim",
            "split_description", "probe_texts", "probe_chunks", "TextCut", "probe_data", "eval_note", "MAX_UNK_SHARE",
            "MIN_ROUND_TRIP", "SEEN_AT_LEAST", "Targets", "decoder_tokenizer", "target_name", "check_encodes",
            "make_targets"),
})
