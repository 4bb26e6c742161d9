"""Evaluation adapter of the memory model (``EVAL_ADAPTERS['memory']``).

The text is cut into chunks of ``chunk_len`` tokens from its start; chunk ``c`` predicts its tokens
teacher-forced (``[bos, x_0, ...]``) while reading the memories of chunks ``< c``
(``memory_mode="previous"``, the ``next_token`` objective), or no memory when the run was trained
with ``causal_lm``. Scores sum ``log p`` over the continuation's positions; generation is greedy,
one full forward per token (no cache), inside the model's window of ``max_chunks * chunk_len``
tokens, with the prompt cut from the left as :func:`memlab.generation.fit_prompt` says.
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.errors import MemlabError
from memlab.generation import fit_prompt


class MemoryLMAdapter:
    """Scores and greedy generation for an encoder-decoder memory model read as a memory LM."""

    can_score = True

    def __init__(self, model, tokenizer, name: str = "memory", mode: str = "previous"):
        self.model, self.tok, self.name, self.mode = model.eval(), tokenizer, name, mode
        c = model.config
        self.chunk = int(c.chunk_len)
        self.max_context = int(c.chunk_len * c.max_chunks)

    def count_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def _logits(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids`` cut into padded chunks ``x (1, C, T)`` and the model's logits ``(1, C, T, V)`` at them."""
        from memlab.curricula.objectives import shifted_targets

        pad = self.model.config.pad_token_id or 0
        C = -(-len(ids) // self.chunk)
        x = torch.full((1, C * self.chunk), pad, dtype=torch.long)
        x[0, : len(ids)] = torch.tensor(ids)
        x = x.view(1, C, self.chunk).to(next(self.model.parameters()).device)  # (1, C, T)
        dec, _ = shifted_targets(self.model, x, None)  # (1, C, T)
        mem = self.model.encode_chunks(x) if self.mode != "none" else None  # (1, C, K, M)
        return x, self.model.decode(mem, dec, self.mode).float()  # (1, C, T, V)

    def _logprobs(self, ids: list[int]) -> torch.Tensor:
        """``log p(ids[i] | ids[<i])`` for every position: ``(len(ids),)``."""
        x, logits = self._logits(ids)
        lp = torch.log_softmax(logits, -1).gather(-1, x[..., None])[..., 0]  # (1, C, T)
        return lp.flatten()[: len(ids)].cpu()

    def _next_token(self, ids: list[int]) -> int:
        """Greedy next token after ``ids``: append a placeholder and read the logits at its position."""
        _, logits = self._logits(ids + [self.model.config.pad_token_id or 0])
        return int(logits.flatten(1, 2)[0, len(ids)].argmax())

    def score(self, contexts: list[str], continuations: list[str]) -> list[tuple[float, int]]:
        out = []
        for ctx, cont in zip(contexts, continuations):
            c_ids = self.tok(ctx, add_special_tokens=False)["input_ids"]
            x_ids = self.tok(cont, add_special_tokens=False)["input_ids"]
            if not x_ids:
                raise MemlabError(f"empty continuation after tokenization: {cont!r}")
            ids = (c_ids + x_ids)[-self.max_context :]
            n = min(len(x_ids), len(ids))
            out.append((float(self._logprobs(ids)[-n:].sum()), n))
        return out

    def generate(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        outs = []
        eos = self.model.config.eos_token_id
        for p in prompts:
            ids = fit_prompt(self.tok(p, add_special_tokens=False)["input_ids"], self.max_context, max_new_tokens)
            new: list[int] = []
            for _ in range(max_new_tokens):
                seq = (ids + new)[-self.max_context :]
                nxt = self._next_token(seq)
                if nxt == eos:
                    break
                new.append(nxt)
            outs.append(self.tok.decode(new, skip_special_tokens=True))
        return outs


def memory_adapter(model_dir: Path) -> MemoryLMAdapter:
    """``EVAL_ADAPTERS['memory']``: memories of the previous chunks, or none for a run trained with
    the ``causal_lm`` objective (read from the run's config.yaml)."""
    from memlab.loading import load_pretrained, load_run_tokenizer, run_config

    objective = (run_config(model_dir).get("options") or {}).get("objective")
    mode = "none" if objective == "causal_lm" else "previous"
    return MemoryLMAdapter(load_pretrained(model_dir), load_run_tokenizer(model_dir), mode=mode)
