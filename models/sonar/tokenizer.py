"""Tokenizers for the SONAR space.

Real SONAR uses the NLLB SentencePiece vocabulary (256k pieces + language
tokens), loaded with ``transformers.AutoTokenizer`` from a local folder or a
hub name, or built by :func:`nllb_tokenizer` from the SentencePiece model file
alone (``sentencepiece.bpe.model``, as fairseq2 checkpoints ship it; needs the
``sentencepiece`` package). Offline tests cannot download it, so :func:`build_toy_tokenizer`
trains a tiny byte-level BPE with the same layout of special tokens:
``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3, the pieces, then
language tokens (``eng_Latn`` ...) and ``<mask>`` at the end.
"""

from __future__ import annotations

from pathlib import Path

from memlab.errors import DataError, ModelError

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
TOY_LANGS = ("eng_Latn", "fra_Latn", "deu_Latn")

_TOY_TEXT = """It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.
However little known the feelings or views of such a man may be on his first entering a neighbourhood, this truth is so well fixed.
Mr. Darcy said nothing. The weather was fine, and the party set out early for the abbey.
She was the youngest of the two daughters of a most affectionate, indulgent father.
The sun rose over the hills, and the village woke slowly to the sound of bells.
A sentence embedding maps a whole sentence to one vector; a decoder turns the vector back into words.
Numbers like 1, 2, 3, 10, 42 and 2024 appear in text too; so do questions? And exclamations!"""


def build_toy_tokenizer(texts: list[str] | None = None, vocab_size: int = 512, langs: tuple[str, ...] = TOY_LANGS):
    """Train a tiny byte-level BPE with SONAR's special-token layout (any text is encodable).

    ``vocab_size`` counts everything (specials, pieces, language tokens and
    ``<mask>``); the result may be a little smaller when ``texts`` is short.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = texts or _TOY_TEXT.splitlines()
    n_extra = len(langs) + 1
    if vocab_size < 256 + len(SPECIALS) + n_extra:
        raise DataError(f"a byte-level SONAR toy tokenizer needs vocab_size >= {256 + len(SPECIALS) + n_extra}, got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_extra, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": list(langs)})
    fast.add_special_tokens({"mask_token": "<mask>"})
    fast.padding_side = "right"
    return fast


SPM_NAMES = ("sentencepiece.bpe.model", "sentencepiece.source.256000.model")
"""SentencePiece model file names looked for in a tokenizer folder without a ``tokenizer.json``."""
VOCAB_SLACK = 8
"""A checkpoint's vocabulary may hold up to this many rows more than its tokenizer (fairseq2's SONAR: 256206 rows
for the 256204 tokens of the NLLB tokenizer); a larger gap means the tokenizer is not the checkpoint's."""


def spm_file(path) -> Path | None:
    """The SentencePiece model to build an NLLB tokenizer from: ``path`` itself (a ``.model`` file), or one in the
    folder ``path`` when it has no ``tokenizer.json``; else None (load ``path`` with AutoTokenizer)."""
    p = Path(path)
    if p.is_file() and p.suffix == ".model":
        return p
    if p.is_dir() and not (p / "tokenizer.json").is_file():
        found = [p / n for n in SPM_NAMES if (p / n).is_file()] or sorted(p.glob("*.model"))
        return found[0] if found else None
    return None


def nllb_tokenizer(model_file, langs: tuple[str, ...] | None = None):
    """The NLLB tokenizer (transformers' ``NllbTokenizer``) built from a SentencePiece model file, in the layout
    of the Hugging Face NLLB tokenizer: ``<s> <pad> </s> <unk>``, the pieces (SentencePiece id + 1), the
    language tokens (``langs``, default NLLB's 202 codes), then ``<mask>``."""
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        raise ModelError("building the NLLB tokenizer from a SentencePiece model needs the 'sentencepiece' package "
                         "(pip install sentencepiece, or memlab's 'sonar' extra)") from None
    import shutil
    import tempfile

    from transformers import NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    src = Path(model_file)
    with tempfile.TemporaryDirectory() as d:  # NllbTokenizer reads 'sentencepiece.bpe.model' from a folder
        shutil.copyfile(src, Path(d) / "sentencepiece.bpe.model")
        try:
            tok = NllbTokenizer.from_pretrained(d, extra_special_tokens=list(langs or FAIRSEQ_LANGUAGE_CODES),
                                                mask_token=None)
        except Exception as e:  # a file that is not a SentencePiece model
            raise ModelError(f"{src}: not a SentencePiece model ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    tok.add_special_tokens({"mask_token": "<mask>"})
    return tok


def check_matches_checkpoint(tokenizer, vocab_size: int, where: str) -> None:
    """A tokenizer given beside SONAR weights must be theirs: SONAR's special ids (:func:`check_layout`) and
    within :data:`VOCAB_SLACK` tokens of the checkpoint's vocabulary."""
    check_layout(tokenizer, vocab_size)
    if len(tokenizer) < vocab_size - VOCAB_SLACK:
        raise ModelError(f"the tokenizer has {len(tokenizer)} tokens but the SONAR checkpoint {where} has a vocabulary "
                         f"of {vocab_size}: it is not this checkpoint's tokenizer (real SONAR uses the NLLB tokenizer)")


def lang_token_id(tokenizer, lang: str) -> int:
    """Id of a language token (``eng_Latn``; fairseq2's ``__eng_Latn__`` spelling is accepted too)."""
    for name in (lang, f"__{lang.strip('_')}__", lang.strip("_")):
        i = tokenizer.convert_tokens_to_ids(name)
        if i is not None and i != tokenizer.unk_token_id:
            return int(i)
    known = [t for t in getattr(tokenizer, "additional_special_tokens", []) or [] if "_" in t][:8]
    raise ModelError(f"language '{lang}' is not in the SONAR tokenizer (e.g. {', '.join(known) or 'eng_Latn'})")


def check_layout(tokenizer, vocab_size: int) -> None:
    """The tokenizer must use SONAR's special ids and fit the model's vocabulary."""
    want = {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "unk_token_id": 3}
    got = {k: getattr(tokenizer, k, None) for k in want}
    if got != want:
        raise ModelError(f"the tokenizer's special ids {got} differ from SONAR's {want}")
    if len(tokenizer) > vocab_size:
        raise ModelError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary of {vocab_size}")
