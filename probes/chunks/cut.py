"""The probe's text: chunks cut once as text, then encoded in each model's tokenizer.

``chunk_by="words"`` (the default): the held-out and training text is cut into
chunks of ``seq_len`` words, the same strings for every model, so two models
of a comparison read the same text and their bits per chunk compare. Each
model's tokenizer then renders each chunk in its own tokens; the chunks of one
model are right-padded to the longest one with :data:`PAD` (a chunk is never
cut short unless the model cannot read that many tokens: the report counts
those). ``chunk_by="tokens"``: ``seq_len`` tokens of the model's own
tokenizer (the text then differs from model to model; no padding).

A chunk tensor ``(N, T)`` holds token ids with :data:`PAD` after each chunk's
last token; :func:`mask_of` gives its real positions and :func:`fill_pad` the
ids a model reads (pads replaced by a real id, masked out).

Everything that cuts the probe's text lives here: the corpus's splits, the
chunks of words (or tokens) drawn from them, their cap in tokens, their ids in
each tokenizer (:func:`probe_data`, the first step of a probe run after the
encoder is loaded) and how the report describes them.

Then what the decoder rebuilds (:func:`make_targets`): the chunks in the
tokenizer of its targets. The scratch decoder (``decoder=llama``) rebuilds each
chunk in the encoder's own tokens. A decoder with its own tokenizer (a
:class:`~memlab.probes.kinds.DecoderKind`, ``decoder=pretrained:NAME``) rebuilds
the same chunk *texts* in its tokenizer: every encoder read with that decoder is
then scored over the same target tokens, and the bits per chunk of two encoders
compare directly. Its tokenizer must encode the corpus's text: at most
:data:`MAX_UNK_SHARE` of the target tokens may be its unknown token, and at
least :data:`MIN_ROUND_TRIP` of the chunks must decode back to their text
(whitespace and case aside).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from memlab.config import DataConfig
from memlab.data.stream import CorpusStream, picked_texts, split_lengths
from memlab.data.views import token_chunks
from memlab.errors import DataError, MemlabError
from memlab.probes.encoders.sources import load_tokenizer
from memlab.probes.chunks.batch import PAD, mask_of, rows


TEXT_FIELDS = ("chunk_by", "per_chunk", "mean_chars", "mean_tokens", "max_tokens", "truncated_chunks", "rendering")


@dataclass
class TextAccounting:
    """How the text was cut and rendered (report.json's ``text``): words or tokens per chunk, characters and tokens
    per held-out chunk, the rendering the bits are counted over and the decoder's targets."""

    chunk_by: str
    per_chunk: Any
    mean_chars: float
    mean_tokens: float
    max_tokens: int
    truncated_chunks: int
    rendering: str
    targets: dict | None = None
    """The decoder's targets (:meth:`memlab.probes.chunks.targets.Targets.describe`)."""

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in TEXT_FIELDS}
        return {**out, **({"targets": self.targets} if self.targets is not None else {})}

    @property
    def target_rendering(self) -> str:
        """The rendering the bits are counted over: the targets' when they have one, else the text's."""
        return (self.targets or {}).get("rendering", self.rendering)


@dataclass
class ProbeText:
    """The probe's text as :func:`memlab.probes.chunks.cut.probe_data` cut it: how (``accounting``, report.json's
    ``text``), the training and held-out chunk texts, the characters of each held-out chunk and the token cap the
    chunks were cut to."""

    accounting: TextAccounting
    train_texts: list
    eval_texts: list
    chars: list
    """Characters of each held-out chunk's text (bits per character divide by their sum)."""
    cap: int | None = None
    """The ``max_chunk_tokens`` the chunks were cut to: the option's, or the encoder's limit when chunks of the
    default length do not fit it whole (None: none)."""

    @property
    def texts(self) -> tuple[list, list]:
        """(training texts, held-out texts)."""
        return self.train_texts, self.eval_texts


def pick_texts(texts: list[str], need_chars: int, seed: int) -> list[str]:
    """Units of a split in a seeded order until they hold ``need_chars`` characters."""
    order = np.random.default_rng(seed).permutation(len(texts))
    chosen, n = [], 0
    for i in order:
        chosen.append(texts[i])
        n += len(texts[i])
        if n >= need_chars:
            break
    return chosen


def word_chunks(texts: list[str], words: int, n: int, seed: int, what: str, at_most: bool = False) -> list[str]:
    """``n`` chunks of ``words`` whitespace-separated words from ``texts``, drawn in a seeded order (``at_most``:
    all there are when ``texts`` hold fewer; none at all is an error either way)."""
    chunks: list[str] = []
    for text in texts:
        w = text.split()
        chunks.extend(" ".join(w[i : i + words]) for i in range(0, len(w) - words + 1, words))
    if not chunks:
        raise DataError(f"{what} holds no chunk of {words} words")
    if len(chunks) < n and not at_most:
        raise DataError(f"{what} holds only {len(chunks)} chunks of {words} words; {n} asked")
    pick = np.random.default_rng(seed + 1).permutation(len(chunks))[:n]
    return [chunks[i] for i in pick]


def cap_tokens(texts: list[str], tokenizer, max_tokens: int) -> list[str]:
    """Each chunk text with its trailing words dropped until ``tokenizer`` reads it in at most ``max_tokens`` tokens
    (no special tokens); a chunk whose first word alone is longer is an error."""
    out = []
    for text, ids in zip(texts, tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
        words = text.split()
        lo, hi = 0, len(words)  # the longest prefix of words that fits (token counts grow with the prefix)
        if len(ids) <= max_tokens:
            lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(tokenizer(" ".join(words[:mid]), add_special_tokens=False)["input_ids"]) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            raise DataError(f"the word {words[0][:40]!r} alone is longer than max_chunk_tokens={max_tokens} tokens")
        out.append(" ".join(words[:lo]))
    return out


def tokenize_chunks(texts: list[str], tokenizer, max_tokens: int | None = None) -> tuple[torch.Tensor, int]:
    """Chunk texts -> ``(N, T)`` ids in ``tokenizer`` (no special tokens), right-padded with :data:`PAD` to the
    longest chunk (at most ``max_tokens``), and how many chunks were cut at ``max_tokens``."""
    enc = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    if any(not e for e in enc):
        raise DataError("a chunk has no tokens in this tokenizer")
    longest = max(len(e) for e in enc)
    t = min(longest, max_tokens) if max_tokens else longest
    out = torch.full((len(enc), t), PAD, dtype=torch.long)  # (N, T)
    for i, e in enumerate(enc):
        out[i, : min(len(e), t)] = torch.tensor(e[:t], dtype=torch.long)
    return out, sum(len(e) > t for e in enc)


def chunk_chars(ids: torch.Tensor, tokenizer) -> list[int]:
    """Characters of each chunk as the tokenizer renders its tokens (token-cut chunks have no text of their own)."""
    return [len(s) for s in tokenizer.batch_decode(rows(ids), skip_special_tokens=True)]


def rendering(texts: list[str], ids: torch.Tensor, tokenizer) -> str:
    """How the tokenizer renders the chunks the bits are counted over: as written, lowercased or normalised."""
    back = ["".join(s.split()) for s in tokenizer.batch_decode(rows(ids), skip_special_tokens=True)]
    orig = ["".join(s.split()) for s in texts]  # spacing aside: tokenizers differ in how they join pieces
    if back == orig:
        return "as written"
    if back == [s.lower() for s in orig]:
        return "lowercased (the tokenizer drops case: the bits do not count it)"
    same = sum(a == b for a, b in zip(back, orig)) / max(len(orig), 1)
    return f"normalised by the tokenizer ({same:.0%} of the chunks decode to their text exactly)"


def _most_chunks(opts) -> int:
    """The training chunks read: ``n_train``, or a learning curve's largest size."""
    n = opts.n_train
    return max(n) if isinstance(n, (list, tuple)) else n


@lru_cache(maxsize=2)
def _stream(corpus: str, text_field: str = "text"):
    """The probe's units of a corpus (chapters, or paragraph blocks of a chapterless text), split 90/5/5 with
    seed 0: memlab's default data settings, decided once per process while the corpus streams past
    (:class:`memlab.data.stream.CorpusStream`: the splits of the in-memory path; no list of documents is held)."""
    return CorpusStream(DataConfig(corpus=corpus, text_field=text_field, split_by="chapter", val_fraction=0.05,
                                   test_fraction=0.05, split_seed=0))


@lru_cache(maxsize=6)
def _lengths(corpus: str, split: str, text_field: str = "text") -> np.ndarray:
    return split_lengths(_stream(corpus, text_field), split)  # (n,)


def split_description(corpus: str, text_field: str = "text") -> str:
    """How the probe's corpus was cut into units and split (for the report: ``report["data_split"]``)."""
    return _stream(corpus, text_field).split_description


def _picked(corpus: str, split: str, need_chars: int, seed: int, text_field: str = "text") -> list[str]:
    """:func:`pick_texts` of one split's cleaned texts, read from the corpus as it streams past: only the chosen
    units' texts are held."""
    if split not in ("train", "validation", "test"):
        raise DataError(f"unknown split '{split}'; use train, validation or test")
    stream = _stream(corpus, text_field)
    if not stream.plan.sizes[split]:  # names the empty split and how the corpus was cut
        raise DataError(f"the {split} split of corpus '{corpus}' is empty ({stream.split_description}); "
                        "use a larger corpus, more documents, or larger data.val_fraction / data.test_fraction")
    return picked_texts(stream, split, need_chars, seed, _lengths(corpus, split, text_field))


def probe_texts(words: int, n: int, split: str, corpus: str = "austen", seed: int = 0,
                at_most: bool = False, text_field: str = "text") -> list[str]:
    """``n`` chunks of ``words`` words from one split of the corpus, as text: the same for every tokenizer
    (``at_most``: all there are when the split holds fewer than ``n``)."""
    chosen = _picked(corpus, split, 7 * words * n * 2, seed, text_field)  # about 6 characters a word, twice
    return word_chunks(chosen, words, n, seed, f"the {split} split of '{corpus}'", at_most=at_most)


def probe_chunks(tokenizer, seq_len: int, n: int, split: str, corpus: str = "austen", seed: int = 0,
                 at_most: bool = False, text_field: str = "text") -> torch.Tensor:
    """``n`` chunks of ``seq_len`` tokens ``(n, T)`` from one split of the corpus, in ``tokenizer``
    (``at_most``: all there are when the split holds fewer than ``n``).

    Splits are memlab's (chapter units, 5 % validation and 5 % test, seed 0),
    so ``test`` is text no model trained by ``memlab train`` on the default
    data settings has seen. Units are read in a seeded order until there are
    enough tokens, and ``n`` chunks are drawn from them.
    """
    chosen = _picked(corpus, split, 8 * seq_len * n * 2, seed, text_field)  # about 4 characters a token, twice
    try:
        chunks = token_chunks(chosen, tokenizer, seq_len)  # (M, T)
    except DataError as e:  # not one chunk: nothing to score or train on
        raise DataError(f"the {split} split of '{corpus}' holds no chunk of {seq_len} tokens ({e})") from None
    if chunks.shape[0] < n and not at_most:
        raise DataError(f"the {split} split of '{corpus}' holds only {chunks.shape[0]} chunks of {seq_len} tokens; "
                        f"{n} asked")
    pick = torch.from_numpy(np.random.default_rng(seed + 1).permutation(chunks.shape[0])[:n])
    return chunks[pick]  # (n, T)


@dataclass(frozen=True)
class TextCut:
    """What decides the probe's chunk texts: their length in words, how many of each split, the corpus and its text
    field, the seed, and the cap in tokens (None: uncapped)."""

    seq_len: int
    n_train: int
    n_eval: int
    eval_split: str
    corpus: str
    seed: int
    max_chunk_tokens: int | None
    text_field: str = "text"


def _cut(cut: TextCut, counter) -> tuple[list[str], list[str]]:
    """The training and held-out chunk texts, each capped at ``cut.max_chunk_tokens`` of ``counter`` when given."""
    source = dict(corpus=cut.corpus, seed=cut.seed, text_field=cut.text_field)
    texts_tr = probe_texts(cut.seq_len, cut.n_train, "train", **source)
    texts_ev = probe_texts(cut.seq_len, cut.n_eval, cut.eval_split, at_most=True, **source)
    if cut.max_chunk_tokens is not None:  # every chunk fits max_chunk_tokens of the counting tokenizer
        texts_tr, texts_ev = (cap_tokens(x, counter, cut.max_chunk_tokens) for x in (texts_tr, texts_ev))
    return texts_tr, texts_ev


@lru_cache(maxsize=4)
def _cut_by_name(cut: TextCut, chunk_tokenizer: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """:func:`_cut` with the counting tokenizer named (``chunk_tokenizer``), once per process: the entries of a
    comparison (``memlab quickstart``) read the same chunk texts, so they are cut once."""
    counter = load_tokenizer(chunk_tokenizer) if cut.max_chunk_tokens is not None else None
    tr, ev = _cut(cut, counter)
    return tuple(tr), tuple(ev)


def _words_data(opts, encoder, cap_to_fit: bool = False, cap: int | None = None):
    """Word chunks in the encoder's tokenizer: (training ids, held-out ids, training texts, held-out texts, chunks
    cut at the encoder's limit, the ``max_chunk_tokens`` cap they were cut to). ``cap``: the cap (default the
    option's); ``cap_to_fit``: chunks the encoder cannot read whole keep the words that fit, with a note (else they
    are refused)."""
    cap = opts.max_chunk_tokens if cap is None else cap
    cut = TextCut(opts.seq_len, _most_chunks(opts), opts.n_eval, opts.eval_split, opts.corpus, opts.seed, cap,
                  opts.text_field)
    if cap is None or opts.chunk_tokenizer:
        texts_tr, texts_ev = (list(x) for x in _cut_by_name(cut, opts.chunk_tokenizer))
    else:  # capped in the encoder's own tokenizer
        texts_tr, texts_ev = _cut(cut, encoder.tokenizer)
    limit = None if getattr(encoder, "resizable", False) else encoder.max_length
    tr, cut_tr = tokenize_chunks(texts_tr, encoder.tokenizer, limit)
    ev, cut_ev = tokenize_chunks(texts_ev, encoder.tokenizer, limit)
    if cut_tr + cut_ev and cap is None and limit and cap_to_fit:  # the encoder's cap, as a note
        print(f"memlab: note: {cut_tr + cut_ev} chunks of {opts.seq_len} words are longer than {encoder.name} allows "
              f"({limit} tokens); each keeps the words that fit (max_chunk_tokens={limit}; lower seq_len to keep "
              "whole chunks)", file=sys.stderr)
        return _words_data(opts, encoder, cap=limit)  # the report's options and text say how the chunks were cut
    if cut_tr + cut_ev:
        raise MemlabError(f"{cut_tr + cut_ev} chunks of {opts.seq_len} words are longer than {encoder.name} allows "
                          f"({encoder.max_length} tokens besides its special tokens); lower seq_len")
    t = max(tr.shape[1], ev.shape[1])
    pad = lambda x: torch.nn.functional.pad(x, (0, t - x.shape[1]), value=PAD)  # noqa: E731
    return pad(tr), pad(ev), texts_tr, texts_ev, cut_tr + cut_ev, cap


def probe_data(opts, encoder, cap_to_fit: bool = False) -> tuple[torch.Tensor, torch.Tensor, ProbeText]:
    """Training (N, T) and held-out (M, T) chunks in the encoder's tokenizer (PAD after each chunk's tokens) and the
    text (:class:`~memlab.probes.report.report.ProbeText`: how it was cut, the chunk texts, the characters of each held-out
    chunk, the token cap). ``cap_to_fit`` (a probe run whose user did not set ``seq_len``): chunks of words that the
    encoder cannot read whole keep the words that fit, with a note, and ``text.cap`` says so (False: refused, as a
    length the user chose is)."""
    tok, cap = encoder.tokenizer, None
    if opts.chunk_by == "tokens":
        if encoder.max_length is not None and opts.seq_len > encoder.max_length:
            raise MemlabError(f"seq_len={opts.seq_len} is longer than {encoder.name} allows ({encoder.max_length} "
                              "tokens besides its special tokens)")
        train_ids = probe_chunks(tok, opts.seq_len, _most_chunks(opts), "train", opts.corpus, opts.seed,
                                 text_field=opts.text_field)
        eval_ids = probe_chunks(tok, opts.seq_len, opts.n_eval, opts.eval_split, opts.corpus, opts.seed,
                                  at_most=True, text_field=opts.text_field)
        texts, cut = tok.batch_decode(rows(eval_ids), skip_special_tokens=True), 0
        texts_tr = tok.batch_decode(rows(train_ids), skip_special_tokens=True)
        chars = chunk_chars(eval_ids, tok)
        render = "the model's own tokens (chunk_by=tokens: each model reads other text)"
    else:
        train_ids, eval_ids, texts_tr, texts, cut, cap = _words_data(opts, encoder, cap_to_fit)
        chars, render = [len(x) for x in texts], rendering(texts, eval_ids, tok)
    note = eval_note(opts, eval_ids)  # fewer held-out chunks than asked: all are scored, and the report says so
    if note:
        print(f"memlab: warning: {note}", file=sys.stderr)
    n_tok = mask_of(eval_ids).sum(1).float()  # (M,)
    per_chunk = f"{opts.seq_len} {opts.chunk_by}"
    if cap is not None:
        per_chunk += (f", trailing words dropped to fit {cap} tokens of "
                      f"{opts.chunk_tokenizer or 'its own tokenizer'}")
    text = TextAccounting(chunk_by=opts.chunk_by, per_chunk=per_chunk, mean_chars=sum(chars) / len(chars),
                          mean_tokens=float(n_tok.mean()), max_tokens=int(eval_ids.shape[1]),
                          truncated_chunks=int(cut), rendering=render)
    return train_ids, eval_ids, ProbeText(text, texts_tr, texts, chars, cap)  # (N, T), (M, T)


def eval_note(opts, eval_ids: torch.Tensor) -> str | None:
    """What the report says when the held-out split holds fewer chunks than ``n_eval`` (None when it does not)."""
    m = int(eval_ids.shape[0])
    if m >= opts.n_eval:
        return None
    return (f"n_eval={opts.n_eval} asked, but the {opts.eval_split} split of '{opts.corpus}' holds {m} chunks of "
            f"{opts.seq_len} {opts.chunk_by}: all {m} are scored")


