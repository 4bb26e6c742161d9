"""Model adapters: the two things every evaluation task asks of a model.

- ``score(contexts, continuations) -> list[(logprob_sum, n_tokens)]``: the log-likelihood
  (nats) of each continuation given its context, summed over the continuation's tokens;
- ``generate(prompts, max_new_tokens) -> list[str]``: continuations of the prompts (greedy).

A causal token LM (family ``token_lm``, or any ``*ForCausalLM``) is adapted by
:class:`CausalLMAdapter`. Another family plugs in by registering a factory
``factory(model_dir) -> ModelAdapter`` with :func:`register_adapter` under its family
name; without one, a family that registered a ``GENERATORS`` entry gets a
generation-only adapter (tasks that need scores then say so). Contexts longer than
the model's window are cut from the left, keeping the end that the continuation follows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import torch

from memlab.errors import MemlabError

ADAPTERS: dict[str, Callable[[Path], "ModelAdapter"]] = {}
"""Family name -> factory(model_dir) building its adapter."""


def register_adapter(family: str, factory: Callable[[Path], "ModelAdapter"]) -> None:
    ADAPTERS[family] = factory


@runtime_checkable
class ModelAdapter(Protocol):
    name: str
    """Label in result tables (family and run)."""
    max_context: int
    """Longest context (tokens) the model reads; longer prompts are cut from the left."""

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

    def __init__(self, model, tokenizer, name: str = "causal_lm", max_context: int | None = None, batch_size: int = 8):
        self.model = model.eval()
        self.tok = tokenizer
        self.name = name
        self.max_context = int(max_context or getattr(model.config, "max_position_embeddings", 2048))
        self.batch_size = batch_size

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

    @torch.no_grad()
    def generate(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        outs = []
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        for p in prompts:
            ids = self._ids(p)[-max(1, self.max_context - max_new_tokens) :] or [pad]
            x = torch.tensor([ids], device=self.device)  # (1, T)
            y = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=pad)
            outs.append(self.tok.decode(y[0, len(ids) :], skip_special_tokens=True))
        return outs


class GeneratorAdapter:
    """Generation through a family's ``GENERATORS`` entry; no scores."""

    can_score = False

    def __init__(self, model_dir: Path, gen: Callable, name: str, tokenizer=None, max_context: int = 2048):
        self.model_dir, self.gen, self.name, self.tok, self.max_context = model_dir, gen, name, tokenizer, max_context

    def count_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"]) if self.tok is not None else len(text.split())

    def score(self, contexts, continuations):
        raise MemlabError(f"model '{self.name}' has no log-likelihood scorer; register an adapter for its family "
                          "(memlab.app.eval.adapters.register_adapter) to run scored tasks")

    def generate(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        from types import SimpleNamespace

        args = SimpleNamespace(max_new_tokens=max_new_tokens, sample=False, temperature=1.0, top_p=1.0, num_beams=1,
                               max_sentences=max(1, max_new_tokens // 16), seed=0)
        return list(self.gen(self.model_dir, prompts, args))


def load_adapter(path: str | Path, name: str | None = None) -> ModelAdapter:
    """An adapter for a run directory or saved model folder, chosen by its family."""
    from memlab.loading import family_of, load_pretrained, load_run_tokenizer, resolve_model_dir
    from memlab.registry import GENERATORS

    d = resolve_model_dir(path)
    fam = family_of(d)
    label = name or f"{fam}:{Path(path).name}"
    _wire_known_families()
    if fam in ADAPTERS:
        adapter = ADAPTERS[fam](d)
        adapter.name = label
        return adapter
    model = load_pretrained(d)
    if hasattr(model, "generate") and "ForCausalLM" in type(model).__name__:
        return CausalLMAdapter(model, load_run_tokenizer(d), name=label)
    if fam in GENERATORS:
        try:
            tok = load_run_tokenizer(d)
        except MemlabError:
            tok = None
        return GeneratorAdapter(d, GENERATORS.get(fam), label, tok)
    raise MemlabError(f"{d}: family '{fam}' has no evaluation adapter (see memlab.app.eval.adapters.register_adapter)")


def _wire_known_families() -> None:
    """Import the adapters that live next to this module for families built elsewhere (if present)."""
    from memlab.app.eval import family_adapters  # noqa: F401  (registers what it can)
