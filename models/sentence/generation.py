"""Sentence-by-sentence generation for SONAR-LLM and the LCM baselines.

Loop (batched over prompts): predict the next embedding from the context,
decode it to text with the space's decoder, re-encode the text, append the
re-encoded embedding to the context. A prompt stops when the cosine of the
predicted or the re-encoded embedding to the end sentence's embedding reaches
``stop_cosine`` (default 0.98), or after ``max_sentences`` sentences.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from memlab.data.views import split_sentences
from memlab.errors import DataError


def prompt_sentences(prompt: str) -> list[str]:
    sentences = split_sentences(prompt)
    if not sentences:
        raise DataError(f"the prompt {prompt[:60]!r} holds no sentence")
    return sentences


@torch.no_grad()
def generate_sentences(model, handle, prompts: list[list[str]], max_sentences: int = 8, max_new_tokens: int = 64,
                       stop_cosine: float | None = None, **search) -> list[list[str]]:
    """Continue each prompt (a list of sentences) with up to ``max_sentences`` sentences."""
    if not prompts:
        return []
    for i, p in enumerate(prompts):
        if not p:
            raise DataError(f"prompt {i} holds no sentence")
    handle.check_width(model.config.embed_dim)
    model.eval()
    dev = next(model.parameters()).device
    thr = model.config.stop_cosine if stop_cosine is None else stop_cosine
    end = handle.encode_text([model.config.end_sentence]).to(dev)  # (1, E)
    ctx = [handle.encode_text(p).to(dev) for p in prompts]  # each (n_i, E)
    max_pos = model.config.max_position_embeddings
    out: list[list[str]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    for _ in range(max_sentences):
        if not active:
            break
        for i in active:  # keep the most recent sentences when the context outgrows the model
            ctx[i] = ctx[i][-max_pos:]
        S = max(ctx[i].shape[0] for i in active)
        E = end.shape[1]
        emb = torch.zeros(len(active), S, E, device=dev)  # (A, S, E)
        mask = torch.zeros(len(active), S, dtype=torch.long, device=dev)  # (A, S)
        for r, i in enumerate(active):
            emb[r, : ctx[i].shape[0]] = ctx[i]
            mask[r, : ctx[i].shape[0]] = 1
        z = model.predict_next(emb, mask).float()  # (A, E)
        stop_pred = F.cosine_similarity(z, end, dim=-1) >= thr  # (A,)
        texts = handle.generate(z, max_new_tokens=max_new_tokens, **search)
        z2 = handle.encode_text([t if t.strip() else "." for t in texts]).to(dev)  # (A, E)
        stop_re = F.cosine_similarity(z2, end, dim=-1) >= thr  # (A,)
        still = []
        for r, i in enumerate(active):
            if bool(stop_pred[r]) or bool(stop_re[r]):
                continue
            out[i].append(texts[r])
            ctx[i] = torch.cat([ctx[i], z2[r : r + 1]], 0)
            still.append(i)
        active = still
    return out


def load_sentence_model(model_dir: str | Path):
    """Load a saved sentence model and rebuild its space (with a trained decoder when there is one)."""
    from memlab.loading import load_pretrained, resolve_model_dir
    from memlab.models.sentence.spaces import load_space_for_model

    d = resolve_model_dir(model_dir)
    model = load_pretrained(d).eval()
    if getattr(model.config, "decoder_trained", False):
        from safetensors.torch import load_file

        state = {}
        for f in sorted(d.glob("model*.safetensors")):
            state.update({k[len("space."):]: v for k, v in load_file(str(f)).items() if k.startswith("space.")})
        model._space_state = state
    handle = load_space_for_model(model)
    dev = handle.device()
    model.to(dev)
    return model, handle


def sentence_generator(model_dir, prompts: list[str], opts) -> list[str]:
    """``memlab generate`` for sentence models: the generated continuation of each prompt
    (``opts``: :class:`memlab.generation.GenerationOptions`)."""
    model, handle = load_sentence_model(model_dir)
    sents = [prompt_sentences(p) for p in prompts]
    search = {}
    if opts.sample:
        search.update(do_sample=True, temperature=opts.temperature, top_p=opts.top_p)
    if opts.num_beams > 1:
        search["num_beams"] = opts.num_beams
    outs = generate_sentences(model, handle, sents, max_sentences=opts.max_sentences,
                              max_new_tokens=opts.max_new_tokens, **search)
    return [" ".join(o) for o in outs]
