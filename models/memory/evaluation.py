"""Held-out evaluation of a memory model: token accuracy and CE of its objectives on

* ``heldout``: the run's own test split (chunks, or sentences for a sentence autoencoder);
* ``other_domain``: English text of another domain that ships with every CPython install, the
  Python documentation topics of ``pydoc_data.topics`` (technical prose, code and markup);
* ``random``: uniform random tokens (non-special ids): a memory that generalises rebuilds new
  text and fails on noise.

``evaluate_run(run_dir)`` is the whole suite; ``benchmarks/memory_eval.py`` is its command line.
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.errors import DataError


def other_domain_texts() -> list[str]:
    """Python's documentation topics (``pydoc_data.topics``), bundled with CPython: an offline other domain."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def random_chunks(n: int, chunks: int, chunk_len: int, tokenizer, seed: int = 0) -> torch.Tensor:
    """``(n, C, T)`` uniform random non-special token ids."""
    special = set(tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    g = torch.Generator().manual_seed(seed)
    return allowed[torch.randint(len(allowed), (n, chunks, chunk_len), generator=g)]


def random_sentences(n: int, max_len: int, tokenizer, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random-token 'sentences' with random lengths in ``[4, max_len]``: ``(n, 1, T)`` ids and mask."""
    ids = random_chunks(n, 1, max_len, tokenizer, seed)
    g = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(4, max_len + 1, (n,), generator=g)
    mask = (torch.arange(max_len)[None] < lengths[:, None]).long()[:, None]  # (n, 1, T)
    return ids.masked_fill(mask == 0, tokenizer.pad_token_id), mask


@torch.no_grad()
def evaluate_sets(model, sets: dict[str, tuple[torch.Tensor, torch.Tensor | None]], objectives=("blank_copy",),
                  batch: int = 32) -> dict[str, dict[str, float]]:
    """``{set: (ids (N, C, T), mask or None)}`` -> ``{set: {<objective>_loss, <objective>_accuracy, examples}}``."""
    from memlab.curricula.objectives import evaluate_objectives

    model.eval()
    out = {}
    for name, (ids, mask) in sets.items():
        def batches():
            for i in range(0, ids.shape[0], batch):
                b = {"input_ids": ids[i: i + batch]}
                if mask is not None:
                    b["attention_mask"] = mask[i: i + batch]
                yield b

        out[name] = {**evaluate_objectives(model, batches(), objectives), "examples": int(ids.shape[0])}
    return out


def evaluate_run(run_dir: str | Path, n: int = 256, objectives: tuple[str, ...] | None = None, seed: int = 0) -> dict:
    """The suite on a trained run (or checkpoint's run): held-out, other domain, random tokens."""
    from memlab.config import load_config
    from memlab.data.views import clean_text, prepare_corpus
    from memlab.loading import load_pretrained, load_run_tokenizer
    from memlab.models.memory.data import chunk_view, sentence_view

    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.yaml")
    model = load_pretrained(run_dir).eval()
    tok = load_run_tokenizer(run_dir)
    opts = cfg.options
    objectives = tuple(objectives or opts.eval_objectives)
    corpus = prepare_corpus(cfg.data, None)
    t, seq = model.config.chunk_len, cfg.data.seq_len
    split = "test" if corpus.splits.get("test") else "validation"
    if opts.view == "sentences":
        from memlab.data.corpus import Document

        ids, mask, _ = sentence_view(corpus.splits[split], tok, seq)
        other = [Document(id=f"pydoc{i}", text=x) for i, x in enumerate(other_domain_texts())]
        o_ids, o_mask, _ = sentence_view(other, tok, seq)
        sets = {"heldout": (ids[:n], mask[:n]), "other_domain": (o_ids[:n], o_mask[:n]),
                "random": random_sentences(n, min(seq, 32), tok, seed)}
    else:
        ids = chunk_view(corpus.texts(split), tok, seq, t)
        other = chunk_view([clean_text(x) for x in other_domain_texts()], tok, seq, t)
        g = torch.Generator().manual_seed(seed)
        other = other[torch.randperm(other.shape[0], generator=g)[:n]]
        c = seq // t
        sets = {"heldout": (ids[:n], None), "other_domain": (other, None),
                "random": (random_chunks(n, c, t, tok, seed), None)}
    if any(v[0].shape[0] == 0 for v in sets.values()):
        raise DataError("an evaluation set is empty")
    return {"run": str(run_dir), "split": split, "objectives": list(objectives),
            "other_domain_source": "pydoc_data.topics (Python documentation bundled with CPython)",
            **evaluate_sets(model, sets, objectives)}
