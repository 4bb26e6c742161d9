"""Small spaces for the sentence-model tests: the registered ``toy_ae`` space, random or briefly fitted."""

from __future__ import annotations

from pathlib import Path

import torch

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
