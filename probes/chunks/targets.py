"""The decoder's targets: the token ids it rebuilds (in the encoder's tokenizer, or a pretrained decoder's own), checked
to encode the text faithfully.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
import torch

from memlab.errors import DataError
from memlab.probes.chunks.cut import rendering, tokenize_chunks
from memlab.probes.chunks.batch import PAD, mask_of
from memlab.probes.encoders.sources import load_tokenizer
from memlab.probes.parts import get_part, split_name
from memlab.probes.kinds import DecoderKind


MAX_UNK_SHARE = 0.05


MIN_ROUND_TRIP = 0.5


SEEN_AT_LEAST = (1, 5, 20)
"""Occurrence counts at which the report gives the share of held-out target tokens seen that often in training."""


@dataclass
class Targets:
    """The decoder's targets: ``train_ids`` (N, T) and ``eval_ids`` (M, T) in ``tokenizer`` (PAD after each chunk)."""

    tokenizer: Any
    train_ids: torch.Tensor
    eval_ids: torch.Tensor
    name: str
    """Whose tokenizer: ``the encoder's`` or the decoder's spec."""
    table: torch.Tensor | None = None
    """The token table the decoder's output layer maps (``token_table``: the encoder's, in the targets' tokenizer;
    set by :func:`memlab.probes.decoder.table.with_table`), or None."""

    def first(self, n: int) -> "Targets":
        """The first ``n`` training chunks (a learning curve's size), the same held-out ones."""
        return replace(self, train_ids=self.train_ids[:n])

    def seen_in_training(self) -> dict[str, float]:
        """Share of the held-out target tokens whose id occurs at least k times among the training targets, for each
        k of :data:`SEEN_AT_LEAST`: a decoder learns each token's output from its occurrences, so a token seen
        rarely is one it can hardly name, however much the embedding holds."""
        tr, ev = self.train_ids[self.train_ids >= 0], self.eval_ids[self.eval_ids >= 0]  # (n,), (m,) real ids
        size = int(max(int(tr.max()) if tr.numel() else 0, int(ev.max()) if ev.numel() else 0)) + 1
        counts = torch.bincount(tr, minlength=size)[ev]  # (m,) training occurrences of each held-out target
        return {str(k): int((counts >= k).sum()) / ev.numel() if ev.numel() else 0.0 for k in SEEN_AT_LEAST}

    def describe(self, texts: list[str]) -> dict:
        """The report's ``text.targets``: whose tokenizer, its size, the held-out target tokens and their rendering,
        and how often the training targets hold them (``seen_in_training``)."""
        n = mask_of(self.eval_ids).sum(1).float()  # (M,)
        return {"tokenizer": self.name, "vocab_size": len(self.tokenizer), "n_tokens": int(n.sum()),
                "mean_tokens": float(n.mean()), "max_tokens": int(self.eval_ids.shape[1]),
                "rendering": rendering(texts, self.eval_ids, self.tokenizer),
                "seen_in_training": self.seen_in_training()}


def decoder_tokenizer(opts):
    """The tokenizer the chosen decoder's targets are in (its own, or ``target_tokenizer``), or None for the
    encoder's."""

    impl = get_part("decoder", opts.decoder).impl
    if isinstance(impl, DecoderKind):
        return impl.tokenizer(split_name(opts.decoder)[1])
    if getattr(opts, "target_tokenizer", None):

        return load_tokenizer(opts.target_tokenizer)
    return None


def target_name(opts) -> str:
    """Whose tokenizer the targets are in, for the report."""

    if isinstance(get_part("decoder", opts.decoder).impl, DecoderKind):
        return opts.decoder.partition(":")[2] or opts.decoder
    return opts.target_tokenizer


def check_encodes(tokenizer, texts: list[str], ids: list[list[int]], what: str) -> None:
    """Refuse a tokenizer that cannot encode ``texts`` (their ``ids``): too many unknown tokens or chunks that do
    not decode back (see the module doc)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    n = sum(len(x) for x in ids)
    if unk is not None and n:
        share = sum(t == unk for x in ids for t in x) / n
        if share > MAX_UNK_SHARE:
            raise DataError(f"{what}: its tokenizer cannot encode the corpus text ({share:.0%} of the target tokens "
                            f"are its unknown token {tokenizer.unk_token!r})")
    back = tokenizer.batch_decode(ids, skip_special_tokens=True)
    same = sum("".join(a.split()).lower() == "".join(b.split()).lower() for a, b in zip(back, texts))
    if texts and same / len(texts) < MIN_ROUND_TRIP:
        raise DataError(f"{what}: its tokenizer cannot encode the corpus text (only {same} of {len(texts)} chunks "
                        "decode back to their text)")


def make_targets(opts, encoder, train_ids, eval_ids, texts_tr: list[str] | None, texts_ev: list[str] | None,
                 ) -> Targets:
    """The decoder's targets: the encoder's chunks, or the chunk texts in the decoder's own tokenizer."""
    tok = decoder_tokenizer(opts)
    if tok is None:
        return Targets(encoder.tokenizer, train_ids, eval_ids, "the encoder's")
    what = f"decoder '{opts.decoder}'" if not opts.target_tokenizer else f"target_tokenizer '{opts.target_tokenizer}'"
    tr, _ = tokenize_chunks(texts_tr, tok)
    ev, _ = tokenize_chunks(texts_ev, tok)
    sample = texts_tr[:256]
    check_encodes(tok, sample, tok(sample, add_special_tokens=False)["input_ids"], what)
    t = max(tr.shape[1], ev.shape[1])
    pad = lambda x: torch.nn.functional.pad(x, (0, t - x.shape[1]), value=PAD)  # noqa: E731
    return Targets(tok, pad(tr), pad(ev), target_name(opts))
