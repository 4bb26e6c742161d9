"""Choose the evaluation adapter of a trained model (the adapters themselves: :mod:`memlab.adapters`).

A family registers ``factory(model_dir) -> ModelAdapter`` in ``memlab.registry.EVAL_ADAPTERS``
under its name (token_lm, memory and sonar_llm do, in their own folders). A family without one is
adapted generically: a ``*ForCausalLM`` by :class:`~memlab.adapters.CausalLMAdapter`, a family with a
``GENERATORS`` entry by :class:`~memlab.adapters.GeneratorAdapter` (generation only).
"""

from __future__ import annotations

from pathlib import Path

from memlab.adapters import CausalLMAdapter, GeneratorAdapter, ModelAdapter
from memlab.errors import MemlabError


def load_adapter(path: str | Path, name: str | None = None) -> ModelAdapter:
    """An adapter for a run directory or saved model folder, chosen by its family."""
    from memlab.loading import family_of, load_pretrained, load_run_tokenizer, resolve_model_dir
    from memlab.registry import EVAL_ADAPTERS, GENERATORS

    d = resolve_model_dir(path)
    fam = family_of(d)
    label = name or f"{fam}:{Path(path).name}"
    if fam in EVAL_ADAPTERS:
        adapter = EVAL_ADAPTERS.get(fam)(d)
    elif fam in GENERATORS:
        try:
            tok = load_run_tokenizer(d)
        except MemlabError:
            tok = None
        adapter = GeneratorAdapter(d, GENERATORS.get(fam), label, tok)
    else:
        model = load_pretrained(d)
        if not (hasattr(model, "generate") and "ForCausalLM" in type(model).__name__):
            raise MemlabError(f"{d}: family '{fam}' has no evaluation adapter (register one in "
                              "memlab.registry.EVAL_ADAPTERS)")
        adapter = CausalLMAdapter(model, load_run_tokenizer(d))
    adapter.name = label
    return adapter
