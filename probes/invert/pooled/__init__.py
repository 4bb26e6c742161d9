"""The pooled search (``--states last|mean|first|second_last|space``): propose text with a language model,
correct it with the encoder's weights in the loop, verify, and its report.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "correct": ("CorrectOptions", "Corrected", "apply", "order_edits", "correct"),
    "propose": ("ProposeOptions", "Proposal", "Proposer"),
    "recover": ("METHODS", "RecoverResult", "perturb", "Recoverer"),
    "report": ("PooledChunk", "sentence_bleu", "same_text", "pooled_chunk", "pooled_totals", "PooledReport",
               "search_line", "pooled_summary"),
    "run": ("PooledRun",),
    "searcher": ("POOLS", "INITS", "PooledResult", "pool_rows", "blind_spot", "LanguageHead", "PooledLayer", "SPACE",
                 "PooledSearcher"),
})
