"""Evaluation adapter of the throwaway family: bigram log-likelihoods and greedy generation."""

from __future__ import annotations

import torch

from memlab.adapters import CausalLMAdapter


class BigramAdapter(CausalLMAdapter):
    """The core causal-LM adapter (tokenizer, window) with a bigram's own scoring and generation."""

    @torch.no_grad()
    def score(self, contexts: list[str], continuations: list[str]) -> list[tuple[float, int]]:
        out = []
        for ctx, cont in zip(contexts, continuations):
            c, x = self._ids(ctx) or [self.tok.pad_token_id], self._ids(cont)
            ids = torch.tensor([c[-1:] + x])  # (1, 1 + n): a bigram reads one token back
            logp = torch.log_softmax(self.model(ids).logits[0, :-1], -1)  # (n, V)
            out.append((float(logp.gather(-1, ids[0, 1:, None]).sum()), len(x)))
        return out

    @torch.no_grad()
    def generate(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        outs = []
        for p in prompts:
            last, new = (self._ids(p) or [self.tok.pad_token_id])[-1], []
            for _ in range(max_new_tokens):
                last = int(self.model(torch.tensor([[last]])).logits[0, -1].argmax())
                new.append(last)
            outs.append(self.tok.decode(new, skip_special_tokens=True))
        return outs


def bigram_adapter(model_dir) -> BigramAdapter:
    from memlab.loading import load_pretrained, load_run_tokenizer

    return BigramAdapter(load_pretrained(model_dir), load_run_tokenizer(model_dir), name="throwaway")
