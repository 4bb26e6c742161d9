"""Adapters for the memory model and SONAR-LLM families (registered when those families exist).

**Memory model** (family ``memory``): the text is cut into chunks of ``chunk_len`` tokens from its
start; chunk ``c`` predicts its tokens teacher-forced (``[bos, x_0, ...]``) while reading the
memories of chunks ``< c`` (``memory_mode="previous"``, the ``next_token`` objective), or no memory
when the run was trained with ``causal_lm``. Scores sum ``log p`` over the continuation's
positions; generation is greedy, one full forward per token (no cache), inside the model's
window of ``max_chunks * chunk_len`` tokens.

**SONAR-LLM** (family ``sonar_llm``): text is split into sentences and encoded by the model's
space. The log-likelihood of a continuation is the SONAR-LLM training likelihood: each scored
sentence's tokens under the space's decoder reading the embedding the model predicts from the
sentences before it. A continuation that finishes the context's last (unterminated) sentence
scores that whole sentence (the same prefix for every candidate, so rankings are unaffected).
Generation is the family's registered sentence-by-sentence generator.
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.errors import MemlabError
from memlab.app.eval.adapters import ADAPTERS, GeneratorAdapter, register_adapter


class MemoryLMAdapter:
    """Scores and greedy generation for an encoder-decoder memory model read as a memory LM."""

    def __init__(self, model, tokenizer, name: str = "memory", mode: str = "previous"):
        self.model, self.tok, self.name, self.mode = model.eval(), tokenizer, name, mode
        c = model.config
        self.chunk = int(c.chunk_len)
        self.max_context = int(c.chunk_len * c.max_chunks)

    def count_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def _logprobs(self, ids: list[int]) -> torch.Tensor:
        """``log p(ids[i] | ids[<i])`` for every position: ``(len(ids),)``."""
        from memlab.curricula.objectives import shifted_targets

        pad = self.model.config.pad_token_id or 0
        n = len(ids)
        C = -(-n // self.chunk)
        x = torch.full((1, C * self.chunk), pad, dtype=torch.long)
        x[0, :n] = torch.tensor(ids)
        x = x.view(1, C, self.chunk).to(next(self.model.parameters()).device)  # (1, C, T)
        dec, _ = shifted_targets(self.model, x, None)  # (1, C, T)
        mem = self.model.encode_chunks(x) if self.mode != "none" else None  # (1, C, K, M)
        logits = self.model.decode(mem, dec, self.mode).float()  # (1, C, T, V)
        lp = torch.log_softmax(logits, -1).gather(-1, x[..., None])[..., 0]  # (1, C, T)
        return lp.flatten()[:n].cpu()

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
            ids = self.tok(p, add_special_tokens=False)["input_ids"][-(self.max_context - max_new_tokens) :]
            new: list[int] = []
            for _ in range(max_new_tokens):
                seq = (ids + new)[-self.max_context :]
                nxt = self._next_token(seq)
                if nxt == eos:
                    break
                new.append(nxt)
            outs.append(self.tok.decode(new, skip_special_tokens=True))
        return outs

    @torch.no_grad()
    def _next_token(self, ids: list[int]) -> int:
        """Greedy next token after ``ids``: append a placeholder and read the logits at its position."""
        from memlab.curricula.objectives import shifted_targets

        pad = self.model.config.pad_token_id or 0
        seq = ids + [pad]
        n = len(seq)
        C = -(-n // self.chunk)
        x = torch.full((1, C * self.chunk), pad, dtype=torch.long)
        x[0, :n] = torch.tensor(seq)
        x = x.view(1, C, self.chunk).to(next(self.model.parameters()).device)  # (1, C, T)
        dec, _ = shifted_targets(self.model, x, None)
        mem = self.model.encode_chunks(x) if self.mode != "none" else None
        logits = self.model.decode(mem, dec, self.mode)  # (1, C, T, V)
        return int(logits.flatten(1, 2)[0, n - 1].argmax())


def _run_objective(model_dir: Path) -> str | None:
    """The ``options.objective`` of the run that saved ``model_dir`` (checkpoint -> run dir)."""
    import yaml

    for p in (model_dir, *model_dir.parents[:3]):
        cfg = p / "config.yaml"
        if cfg.is_file():
            try:
                return ((yaml.safe_load(cfg.read_text()) or {}).get("options") or {}).get("objective")
            except yaml.YAMLError:
                return None
    return None


def memory_adapter(model_dir: Path) -> MemoryLMAdapter:
    from memlab.loading import load_pretrained, load_run_tokenizer

    mode = "none" if _run_objective(model_dir) == "causal_lm" else "previous"
    return MemoryLMAdapter(load_pretrained(model_dir), load_run_tokenizer(model_dir), mode=mode)


class SonarLLMAdapter(GeneratorAdapter):
    """SONAR-LLM: sentence-level likelihood through the space's decoder; sentence-by-sentence generation."""

    can_score = True

    def __init__(self, model_dir: Path, gen, name: str = "sonar_llm"):
        from memlab.models.sonar_llm.generation import load_sentence_model

        self.model, self.handle = load_sentence_model(model_dir)
        super().__init__(model_dir, gen, name, tokenizer=self.handle.tokenizer,
                         max_context=int(self.model.config.max_position_embeddings) * 32)

    @torch.no_grad()
    def _sentence_logprob(self, context: list[str], targets: list[str]) -> tuple[float, int]:
        from memlab.space import reconstruction_loss, tokenize

        sents = context + targets
        emb = self.handle.encode_text(sents)  # (S, E)
        dev = next(self.model.parameters()).device
        max_pos = self.model.config.max_position_embeddings
        total, count = 0.0, 0
        for j in range(len(context), len(sents)):
            ctx = emb[max(0, j - max_pos) : j].to(dev)[None]  # (1, S', E)
            if ctx.shape[1] == 0:  # nothing to condition on: the end-sentence embedding starts the text
                ctx = self.handle.encode_text([self.model.config.end_sentence]).to(dev)[None]
            z = self.model.predict_next(ctx).float()  # (1, E)
            ids, mask = tokenize(self.handle.space, [sents[j]])
            z = self.handle.unflatten(z.to(self.handle.device()))
            ce = reconstruction_loss(self.handle.space, z, ids.to(self.handle.device()), mask.to(self.handle.device()),
                                     reduction="sum")
            n = int(self.handle.space.decoder_inputs(ids, mask)[1].ne(-100).sum())
            total -= float(ce)
            count += n
        return total, count

    def score(self, contexts: list[str], continuations: list[str]) -> list[tuple[float, int]]:
        from memlab.data.sentences import split_sentences

        out = []
        for ctx, cont in zip(contexts, continuations):
            cs = split_sentences(ctx) or []
            if cs and not cs[-1].rstrip().endswith((".", "!", "?", '"', "'")):
                targets = split_sentences(cs[-1] + cont) or [cs[-1] + cont]
                cs = cs[:-1]
            else:
                targets = split_sentences(cont) or [cont.strip()]
            out.append(self._sentence_logprob(cs, [t for t in targets if t.strip()]))
        return out


def sonar_llm_adapter(model_dir: Path) -> SonarLLMAdapter:
    from memlab.registry import GENERATORS

    return SonarLLMAdapter(model_dir, GENERATORS.get("sonar_llm"))


def _register() -> None:
    from memlab.registry import FAMILIES

    if "memory" in FAMILIES and "memory" not in ADAPTERS:
        register_adapter("memory", memory_adapter)
    if "sonar_llm" in FAMILIES and "sonar_llm" not in ADAPTERS:
        register_adapter("sonar_llm", sonar_llm_adapter)


_register()
