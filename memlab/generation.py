"""Text generation shared by ``memlab generate`` and the evaluation adapters.

A family's generator (``memlab.registry.GENERATORS``) is ``gen(model_dir, prompts, opts) -> texts``
with ``opts`` a :class:`GenerationOptions`; a causal token LM without one goes through
:func:`causal_generate`.

**The one rule for over-long prompts** (every causal generation in memlab follows it): the model
reads at most ``window`` tokens, its ``max_position_embeddings``. A prompt longer than
``window - max_new_tokens`` tokens is cut from the left, keeping its end (the part the continuation
follows), so prompt and continuation together fit the window; asking for ``max_new_tokens >= window``
is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.errors import MemlabError


@dataclass
class GenerationOptions:
    """How to generate (the flags of ``memlab generate``; evaluation uses the greedy defaults)."""

    max_new_tokens: int = 64
    """Most new tokens per prompt (sentence models: per sentence)."""
    sample: bool = False
    """Sample instead of greedy decoding."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    num_beams: int = 1
    """Beam search with this many beams (1: greedy or sampling)."""
    max_sentences: int = 8
    """Sentence models: stop after this many sentences."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.num_beams < 1 or self.max_sentences < 1:
            raise MemlabError("max_new_tokens, num_beams and max_sentences must be >= 1")
        if self.sample and self.temperature <= 0:
            raise MemlabError("temperature must be > 0 when sampling")
        if not 0 < self.top_p <= 1:
            raise MemlabError("top_p must be in (0, 1]")


def fit_prompt(ids: list[int], window: int | None, max_new_tokens: int) -> list[int]:
    """``ids`` cut from the left to ``window - max_new_tokens`` tokens (the module's rule); unchanged
    when ``window`` is None (no positional limit)."""
    if window is None:
        return list(ids)
    room = int(window) - max_new_tokens
    if room < 1:
        raise MemlabError(f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the model's "
                          f"window of {window} tokens")
    return list(ids[-room:])


def causal_generate(model, tokenizer, prompts: list[str], opts: GenerationOptions) -> list[str]:
    """Continuations (text after the prompt) of a causal token LM through transformers' ``generate``."""
    import torch

    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    window = getattr(model.config, "max_position_embeddings", None)
    device = next(model.parameters()).device
    search = dict(do_sample=opts.sample, num_beams=opts.num_beams)
    if opts.sample:
        search.update(temperature=opts.temperature, top_p=opts.top_p)
    outs = []
    for prompt in prompts:
        ids = fit_prompt(tokenizer(prompt, add_special_tokens=False)["input_ids"], window, opts.max_new_tokens) or [pad]
        x = torch.tensor([ids], device=device)  # (1, T)
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=opts.max_new_tokens,
                               pad_token_id=pad, **search)  # (1, T + new)
        outs.append(tokenizer.decode(y[0, len(ids) :], skip_special_tokens=True))
    return outs
