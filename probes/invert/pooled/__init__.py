"""The pooled search (``--states last|mean|first|second_last|logits|space``): start from text a language model
proposes or from a continuous relaxation of the input descended through the weights, correct it with the
encoder's weights in the loop, verify, and its report.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "correct": ("CorrectOptions", "Corrected", "apply", "order_edits", "correct"),
    "nexttoken": ("NextTokenVector",),
    "propose": ("ProposeOptions", "Proposal", "Proposer"),
    "recover": ("METHODS", "RecoverResult", "perturb", "Recoverer"),
    "report": ("PooledChunk", "sentence_bleu", "same_text", "pooled_chunk", "pooled_totals", "PooledReport",
               "search_line", "pooled_summary", "relax_summary_line"),
    "relax": ("RelaxOptions", "RelaxJob", "Relaxed", "Relaxer"),
    "relaxed": ("groups", "relaxed_chunks"),
    "run": ("PooledRun",),
    "searcher": ("POOLS", "INITS", "PooledResult", "pool_rows", "blind_spot", "LanguageHead", "PooledLayer", "LOGITS", "SPACE",
                 "PooledSearcher"),
})
