"""Evaluation adapters: what every evaluation task asks of a model.

- ``score(contexts, continuations) -> list[(logprob_sum, n_tokens)]``: the log-likelihood
  (nats) of each continuation given its context, summed over the continuation's tokens;
- ``generate(prompts, max_new_tokens) -> list[str]``: greedy continuations of the prompts;
- ``count_tokens(text)``, ``max_context`` and ``can_score`` (False: ``score`` raises, and tasks
  that need scores are skipped with an error entry).

A family that wants to be evaluated registers ``factory(model_dir) -> ModelAdapter`` in
``memlab.registry.EVAL_ADAPTERS`` under its family name (token_lm registers
:class:`CausalLMAdapter`). Without one, ``memlab eval`` adapts any ``*ForCausalLM`` with
:class:`CausalLMAdapter` and any family with a ``GENERATORS`` entry with :class:`GeneratorAdapter`
(generation only). Contexts longer than the model's window are cut from the left, keeping the end
that the continuation follows (:func:`memlab.generation.fit_prompt` for generation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import torch

from memlab.errors import MemlabError
from memlab.generation import GenerationOptions, causal_generate


@runtime_checkable
class ModelAdapter(Protocol):
    name: str
    """Label in result tables (family and run)."""
    max_context: int
    """Longest context (tokens) the model reads; longer prompts are cut from the left."""
    can_score: bool
    """``score`` works (tasks with ``needs_scores`` run only on adapters that can score)."""

    def score(self, contexts: list[str], continuations: list[str]) -> list[tuple[float, int]]:
        """``(sum of log p(continuation tokens | context), number of continuation tokens)`` per pair."""
        ...

    def generate(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        """Greedy continuations (text after the prompt)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's tokenizer (tasks size contexts with it)."""
        ...


class CausalLMAdapter:
    """Adapter for a Hugging Face causal LM plus its tokenizer."""

    can_score = True

    def __init__(self, model, tokenizer, name: str = "causal_lm", max_context: int | None = None, batch_size: int = 8):
        self.model = model.eval()
        self.tok = tokenizer
        self.name = name
        self.max_context = int(max_context or getattr(model.config, "max_position_embeddings", 2048))
        self.batch_size = batch_size

    @classmethod
    def from_dir(cls, model_dir: Path) -> "CausalLMAdapter":
        """The adapter of a saved causal LM and its tokenizer (the ``EVAL_ADAPTERS`` factory form)."""
        from memlab.loading import load_pretrained, load_run_tokenizer

        return cls(load_pretrained(model_dir), load_run_tokenizer(model_dir))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def count_tokens(self, text: str) -> int:
        return len(self._ids(text))

    @torch.no_grad()
    def score(self, contexts: list[str], continuations: list[str]) -> list[tuple[float, int]]:
        if len(contexts) != len(continuations):
            raise MemlabError("score needs as many contexts as continuations")
        out: list[tuple[float, int]] = []
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        for s in range(0, len(contexts), self.batch_size):
            rows, spans = [], []
            for ctx, cont in zip(contexts[s : s + self.batch_size], continuations[s : s + self.batch_size]):
                c_ids, x_ids = self._ids(ctx), self._ids(cont)
                if not x_ids:
                    raise MemlabError(f"empty continuation after tokenization: {cont!r}")
                ids = (c_ids + x_ids)[-self.max_context :]
                if len(ids) < 2:
                    ids = [pad] + ids  # something to condition the first token on
                n = min(len(x_ids), len(ids) - 1)
                rows.append(ids)
                spans.append(n)
            width = max(len(r) for r in rows)
            inp = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T) right-padded
            mask = torch.zeros_like(inp)
            for i, r in enumerate(rows):
                inp[i, : len(r)] = torch.tensor(r)
                mask[i, : len(r)] = 1
            logits = self.model(input_ids=inp.to(self.device), attention_mask=mask.to(self.device)).logits.float()  # (B, T, V)
            logp = torch.log_softmax(logits, dim=-1)
            for i, (r, n) in enumerate(zip(rows, spans)):
                L = len(r)
                tgt = torch.tensor(r[L - n :], device=self.device)  # (n,)
                lp = logp[i, L - n - 1 : L - 1].gather(-1, tgt[:, None]).sum().item()
                out.append((float(lp), n))
        return out

    def generate(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        return causal_generate(self.model, self.tok, prompts, GenerationOptions(max_new_tokens=max_new_tokens))


class GeneratorAdapter:
    """Generation through a family's ``GENERATORS`` entry; no scores."""

    can_score = False

    def __init__(self, model_dir: Path, gen: Callable, name: str, tokenizer=None, max_context: int = 2048):
        self.model_dir, self.gen, self.name, self.tok, self.max_context = model_dir, gen, name, tokenizer, max_context

    def count_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"]) if self.tok is not None else len(text.split())

    def score(self, contexts, continuations):
        raise MemlabError(f"model '{self.name}' has no log-likelihood scorer; its family registers no scoring "
                          "adapter in memlab.registry.EVAL_ADAPTERS")

    def generate(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        opts = GenerationOptions(max_new_tokens=max_new_tokens, max_sentences=max(1, max_new_tokens // 16))
        return list(self.gen(self.model_dir, prompts, opts))
