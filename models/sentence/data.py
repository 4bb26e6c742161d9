"""Documents of sentences for sentence models: windows, the end sentence, datasets and batches.

Every document ends with the end sentence (default ``"End of sequence."``),
so a model learns when a text is over. Long units (Austen chapters hold 100+
sentences) are cut into windows of ``window`` sentences; a last window of a
single sentence is merged into the one before, so no window is degenerate.
"""

from __future__ import annotations

import torch

from memlab.data.embcache import SentenceSplit
from memlab.errors import DataError


def with_end_sentence(doc: list[str], end_sentence: str, where: str = "document") -> list[str]:
    """A document of at least two sentences, plus the end sentence; an empty or one-sentence document is an error."""
    sentences = [s for s in doc if s.strip()]
    if not sentences:
        raise DataError(f"{where} is empty: it holds no sentence")
    if len(sentences) < 2:
        raise DataError(f"{where} holds one sentence ({sentences[0][:60]!r}); a sentence model needs at least two")
    return sentences + [end_sentence]


def windows(doc: list[str], size: int) -> list[list[str]]:
    """Cut a document into windows of ``size`` sentences (0 = whole); a 1-sentence tail joins the previous window."""
    if size <= 0 or len(doc) <= size:
        return [doc]
    out = [doc[i : i + size] for i in range(0, len(doc), size)]
    if len(out) > 1 and len(out[-1]) < 2:
        tail = out.pop()
        out[-1] = out[-1] + tail
    return out


def make_documents(sentence_docs: list[list[str]], window: int, end_sentence: str,
                   short: str = "drop") -> tuple[list[list[str]], int]:
    """Windows of every document, each ending with the end sentence.

    ``short`` says what to do with a unit of fewer than two sentences: ``drop`` it (counted
    in the second return value) or raise (``error``).
    """
    docs, dropped = [], 0
    for i, doc in enumerate(sentence_docs):
        doc = [s for s in doc if s.strip()]
        if len(doc) < 2:
            if short == "error":
                with_end_sentence(doc, end_sentence, where=f"document {i}")
            dropped += 1
            continue
        docs.extend(with_end_sentence(w, end_sentence, where=f"document {i}") for w in windows(doc, window))
    if not docs:
        raise DataError(f"no document of two or more sentences (of {len(sentence_docs)} documents)")
    return docs, dropped


class SentenceDocDataset(torch.utils.data.Dataset):
    """Documents of a cached split; an example is one document's embeddings and token ids."""

    def __init__(self, split: SentenceSplit):
        self.split = split

    def __len__(self) -> int:
        return self.split.num_documents

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        a, b = int(self.split.doc_offsets[i]), int(self.split.doc_offsets[i + 1])
        return {"embeddings": self.split.embeddings[a:b], "input_ids": self.split.input_ids[a:b],
                "lengths": self.split.lengths[a:b]}


def collate_documents(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad documents to ``S`` sentences and sentences to ``L`` tokens (the longest in the batch).

    ``embeddings (B, S, E)``, ``sentence_mask (B, S)``, ``input_ids (B, S, L)``, ``token_mask (B, S, L)``.
    """
    B = len(items)
    S = max(it["embeddings"].shape[0] for it in items)
    E = items[0]["embeddings"].shape[1]
    L = max(int(it["lengths"].max()) for it in items)
    emb = torch.zeros(B, S, E)  # (B, S, E)
    smask = torch.zeros(B, S, dtype=torch.long)  # (B, S)
    ids = torch.zeros(B, S, L, dtype=torch.long)  # (B, S, L)
    tmask = torch.zeros(B, S, L, dtype=torch.long)  # (B, S, L)
    for b, it in enumerate(items):
        n = it["embeddings"].shape[0]
        emb[b, :n] = it["embeddings"]
        smask[b, :n] = 1
        w = min(L, it["input_ids"].shape[1])
        ids[b, :n, :w] = it["input_ids"][:, :w]
        tmask[b, :n] = (torch.arange(L)[None] < it["lengths"][:, None]).long()
    return {"embeddings": emb, "sentence_mask": smask, "input_ids": ids, "token_mask": tmask}
