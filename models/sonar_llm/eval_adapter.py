"""Evaluation adapter of SONAR-LLM (``EVAL_ADAPTERS['sonar_llm']``).

Text is split into sentences and encoded by the model's space. The log-likelihood of a
continuation is the SONAR-LLM training likelihood: each scored sentence's tokens under the space's
decoder reading the embedding the model predicts from the sentences before it. A continuation that
finishes the context's last (unterminated) sentence scores that whole sentence (the same prefix for
every candidate, so rankings are unaffected). Generation is the family's sentence-by-sentence
generator.
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.adapters import GeneratorAdapter


class SonarLLMAdapter(GeneratorAdapter):
    """SONAR-LLM: sentence-level likelihood through the space's decoder; sentence-by-sentence generation."""

    can_score = True

    def __init__(self, model_dir: Path, gen, name: str = "sonar_llm"):
        from memlab.models.sentence.generation import load_sentence_model

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
        from memlab.data.views import split_sentences

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
    """``EVAL_ADAPTERS['sonar_llm']``."""
    from memlab.models.sentence.generation import sentence_generator

    return SonarLLMAdapter(model_dir, sentence_generator)
