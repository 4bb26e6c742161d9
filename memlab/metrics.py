"""Text-generation metrics, computed by the libraries that papers cite.

- **BLEU** (corpus): ``sacrebleu.corpus_bleu`` with its default 13a tokenizer,
  on a 0-100 scale.
- **Sentence BLEU** (as the SONAR-LLM paper's evaluation script): NLTK's
  ``sentence_bleu`` on whitespace tokens with ``SmoothingFunction().method4``,
  averaged over pairs, on a 0-1 scale.
- **ROUGE-L**: ``rouge_score`` F-measure of ``rougeL`` with the Porter stemmer,
  averaged over pairs, 0-1.
- **METEOR**: NLTK's ``meteor_score`` on whitespace tokens with real WordNet
  3.0 synonyms, averaged over pairs, 0-1. WordNet comes from Debian's
  ``wordnet-base`` / ``wordnet-sense-index`` through
  ``scripts/install_wordnet.sh``, which writes an NLTK_DATA folder; memlab
  looks in ``$NLTK_DATA`` and in :data:`DEFAULT_NLTK_DATA`. Nothing is ever
  downloaded at run time.

All functions take parallel lists of hypotheses and references (one reference
per hypothesis) and raise :class:`~memlab.errors.MemlabError` on bad input.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from statistics import mean
from typing import Sequence

from memlab.errors import MemlabError

DEFAULT_NLTK_DATA = Path.home() / ".cache" / "memlab" / "nltk_data"
"""Where ``scripts/install_wordnet.sh`` puts WordNet when ``NLTK_DATA`` is unset (not under
``MEMLAB_CACHE``, which tests point at a fresh folder)."""

METRICS = ("bleu", "sentence_bleu", "rouge_l", "meteor")
"""Names accepted by :func:`text_metrics`."""

INSTALL_HINT = "run scripts/install_wordnet.sh (apt packages wordnet-base and wordnet-sense-index) and set NLTK_DATA"


def _check_pairs(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if isinstance(hyps, str) or isinstance(refs, str):
        raise MemlabError("metrics take lists of strings (hypotheses, references), not a single string")
    if len(hyps) != len(refs):
        raise MemlabError(f"{len(hyps)} hypotheses but {len(refs)} references; they must pair up")
    if not hyps:
        raise MemlabError("no hypothesis/reference pairs to score")


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu, 13a tokenization, 0-100)."""
    import sacrebleu

    _check_pairs(hyps, refs)
    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def sentence_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Mean NLTK sentence BLEU on whitespace tokens, smoothing method 4 (0-1), as the SONAR-LLM paper."""
    from nltk.translate.bleu_score import SmoothingFunction
    from nltk.translate.bleu_score import sentence_bleu as nltk_sentence_bleu

    _check_pairs(hyps, refs)
    smooth = SmoothingFunction().method4
    scores = []
    for h, r in zip(hyps, refs):
        ht, rt = h.split(), r.split()
        scores.append(float(nltk_sentence_bleu([rt], ht, smoothing_function=smooth)) if ht and rt else 0.0)
    return mean(scores)


def rouge_l(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Mean ROUGE-L F-measure (rouge_score, Porter stemmer, 0-1)."""
    from rouge_score import rouge_scorer

    _check_pairs(hyps, refs)
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return mean(float(scorer.score(r, h)["rougeL"].fmeasure) for h, r in zip(hyps, refs))


def sentence_rouge(hyp: str, ref: str) -> tuple[float, float]:
    """ROUGE-1 and ROUGE-L F-measures (rouge_score, Porter stemmer, 0-1) of one hypothesis against one reference:
    what ALGEN and Zero2Text report for embedding inversion."""
    from rouge_score import rouge_scorer

    s = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True).score(ref, hyp)
    return float(s["rouge1"].fmeasure), float(s["rougeL"].fmeasure)


# ---------------------------------------------------------------------- WordNet
def nltk_data_dirs() -> list[Path]:
    """Candidate NLTK_DATA folders, in search order: ``$NLTK_DATA`` entries, the memlab cache, NLTK's defaults."""
    import nltk

    dirs = [Path(p) for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p]
    dirs.append(DEFAULT_NLTK_DATA)
    dirs += [Path(p) for p in nltk.data.path if isinstance(p, str)]
    return list(dict.fromkeys(dirs))


def find_wordnet() -> Path | None:
    """The first NLTK_DATA folder holding a usable ``corpora/wordnet`` (with ``lexnames``), or None."""
    for d in nltk_data_dirs():
        wn = d / "corpora" / "wordnet"
        if (wn / "lexnames").is_file() and (wn / "data.noun").is_file() and (wn / "index.noun").is_file():
            return d
    return None


def wordnet_available() -> bool:
    return find_wordnet() is not None


@lru_cache(maxsize=2)
def _wordnet_reader(root: str):
    import warnings

    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class _English30(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):  # English WordNet 3.0 only: skip building the OMW version map
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "multilingual functions are not available": no OMW, by design
        return _English30(str(Path(root) / "corpora" / "wordnet"), None)


def load_wordnet():
    """NLTK's WordNet reader over the installed Debian WordNet 3.0 (no download; cached)."""
    import nltk

    root = find_wordnet()
    if root is None:
        raise MemlabError(f"METEOR needs WordNet 3.0, which was not found in {[str(d) for d in nltk_data_dirs()]}; {INSTALL_HINT}")
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))  # nltk reads only files under its data path
    try:
        return _wordnet_reader(str(root))
    except (LookupError, OSError, AssertionError, ValueError) as e:  # a broken folder
        raise MemlabError(f"WordNet under {root} could not be read ({e.__class__.__name__}: {e}); {INSTALL_HINT}") from None


def meteor(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Mean NLTK METEOR on whitespace tokens with WordNet synonyms (0-1)."""
    from nltk.translate.meteor_score import meteor_score

    _check_pairs(hyps, refs)
    wn = load_wordnet()
    scores = []
    for h, r in zip(hyps, refs):
        ht, rt = h.split(), r.split()
        scores.append(float(meteor_score([rt], ht, wordnet=wn)) if ht and rt else 0.0)
    return mean(scores)


_FUNCS = {"bleu": bleu, "sentence_bleu": sentence_bleu, "rouge_l": rouge_l, "meteor": meteor}


def text_metrics(hyps: Sequence[str], refs: Sequence[str], which: Sequence[str] | None = None,
                 skip_missing_wordnet: bool = True) -> dict[str, float]:
    """Several metrics at once: ``{"bleu": ..., "sentence_bleu": ..., "rouge_l": ..., "meteor": ...}``.

    Without WordNet, METEOR is left out (``skip_missing_wordnet``) or is an error.
    """
    names = list(which) if which is not None else list(METRICS)
    unknown = [n for n in names if n not in _FUNCS]
    if unknown:
        raise MemlabError(f"unknown metric '{unknown[0]}'; known: {', '.join(METRICS)}")
    out: dict[str, float] = {}
    for n in names:
        if n == "meteor" and skip_missing_wordnet and not wordnet_available():
            continue
        out[n] = _FUNCS[n](hyps, refs)
    return out
