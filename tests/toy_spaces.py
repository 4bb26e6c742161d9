"""Small spaces for tests: :class:`ToySpace` (a minimal EmbeddingSpace for testing the contract itself and
code that runs over any space) and the registered ``toy_ae`` sentence space, random or briefly fitted."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from memlab.models.sentence.toy_space import ToySentenceAE, byte_tokenizer, fit_toy_space, load_toy_space, save_toy_space

SENTENCES = [
    "It is a truth universally acknowledged.", "Mr. Darcy said nothing.", "Elizabeth laughed.",
    "The weather was fine.", "They walked to the village.", "Jane was ill.", "Mrs. Bennet was delighted.",
    "He bowed and left the room.", "She read the letter again.", "The ball was a success.",
]


def random_space(dim: int = 32, seed: int = 0) -> ToySentenceAE:
    """A seeded, untrained toy space of width ``dim`` (byte-level tokenizer)."""
    return load_toy_space(None, dim=dim, seed=seed)


def fitted_space(out_dir: str | Path, steps: int = 100, dim: int = 32, lr: float = 1e-2) -> tuple[ToySentenceAE, str]:
    """A toy space trained briefly on :data:`SENTENCES`, saved to ``out_dir``; returns it and its spec."""
    torch.manual_seed(0)
    space = ToySentenceAE(byte_tokenizer(), dim=dim, width=48)
    fit_toy_space(space, SENTENCES + ["End of sequence."], steps=steps, batch_size=16, lr=lr)
    save_toy_space(space, out_dir)
    return load_toy_space(str(out_dir)), f"toy_ae:{Path(out_dir).resolve()}"


def document_batch(handle, docs: list[list[str]]) -> dict:
    """Documents (lists of sentences) -> the collated batch the sentence models train on."""
    from memlab.models.sentence.data import collate_documents

    tok = handle.tokenizer
    items = []
    for d in docs:
        ids = [tok(s, add_special_tokens=False)["input_ids"] for s in d]
        t = torch.zeros(len(d), max(map(len, ids)), dtype=torch.long)  # (S, L)
        for i, x in enumerate(ids):
            t[i, : len(x)] = torch.tensor(x)
        items.append({"embeddings": handle.encode_text(d), "input_ids": t, "lengths": torch.tensor([len(x) for x in ids])})
    return collate_documents(items)


class ToySpace(nn.Module):
    """Mean-pooled embedding encoder + a GRU decoder started from the embedding."""

    def __init__(self, tokenizer, dim: int = 16, causal: bool = True, pad_invariant: bool = True):
        super().__init__()
        self.tokenizer, self.dim = tokenizer, dim
        self.causal, self.pad_invariant = causal, pad_invariant
        v = len(tokenizer)
        self.emb = nn.Embedding(v, dim)
        self.dec_emb = nn.Embedding(v, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, v)

    def encode(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float() if self.pad_invariant else torch.ones_like(attention_mask).unsqueeze(-1).float()
        return (self.emb(input_ids) * m).sum(1) / m.sum(1).clamp(min=1)  # (B, D)

    def decoder_inputs(self, input_ids, attention_mask):
        bos = torch.full_like(input_ids[:, :1], self.tokenizer.bos_token_id)
        dec_in = torch.cat([bos, input_ids], 1)  # (B, T+1)
        eos = torch.full_like(input_ids[:, :1], self.tokenizer.eos_token_id)
        labels = torch.cat([input_ids, eos], 1).masked_fill(torch.cat([attention_mask, attention_mask[:, :1]], 1) == 0, -100)
        lengths = attention_mask.sum(1)
        labels[torch.arange(len(lengths)), lengths] = self.tokenizer.eos_token_id
        return dec_in, labels

    def decode_logits(self, z, decoder_input_ids):
        x = self.dec_emb(decoder_input_ids)  # (B, T, D)
        if not self.causal:
            x = x + x.mean(1, keepdim=True)
        out, _ = self.gru(x, z.unsqueeze(0).contiguous())
        return self.head(out)  # (B, T, V)

    @torch.no_grad()
    def generate(self, z, max_new_tokens: int = 64, **search):
        ids = torch.full((z.shape[0], 1), self.tokenizer.bos_token_id, dtype=torch.long)
        for _ in range(max_new_tokens):
            nxt = self.decode_logits(z, ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
        return [self.tokenizer.decode(r[1:], skip_special_tokens=True) for r in ids]

    def encode_text(self, sentences):
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])


def toy_tokenizer():
    from memlab.data.corpus import load_corpus
    from memlab.data.tokenizer import train_bpe

    return train_bpe([load_corpus("austen")[3].text[:50000]], 400)
