"""Part (b): generation time per token against context length, SONAR-LLM vs the token LM,
both with KV caches, measured side by side in one run.

- **token LM**: ``LlamaForCausalLM``; the context is prefilled into the KV cache (not timed),
  then ``new_tokens`` tokens are generated one step at a time (timed).
- **SONAR-LLM**: a sentence model over ``context / sentence_len`` sentence vectors (the
  registered ``sonar_llm`` family's backbone when installed, else a Llama stack of the same
  shape), prefilled into its KV cache. Each new sentence costs one cached sentence-model step,
  a sentence decoder generating ``sentence_len`` tokens with its own KV cache while reading
  the predicted vector as a one-slot prefix, and a sentence encoder pass (mean-pooled) whose
  vector becomes the next sentence-model input. Time per token = time / generated tokens.

The sentence encoder and decoder are Llama stacks of the token LM's shape (configurable),
standing in for SONAR's encoder/decoder so that the comparison measures the architecture on
this machine; :mod:`memlab.analysis.flops_model` gives the analytic counterpart with the
paper's sizes.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from memlab.app.bench.measure import sync


def _llama_cfg(width, layers, heads, ff, vocab, max_len):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=width, intermediate_size=ff, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=max_len, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return cfg


def _sentence_model(width, layers, heads, ff, max_sent):
    """(module with .step(x_new, cache) -> (h_last, cache), label)."""
    from transformers import LlamaModel

    from memlab.registry import FAMILIES

    if "sonar_llm" in FAMILIES:
        m = FAMILIES.get("sonar_llm").make_model("toy", embed_dim=width, hidden_size=width, intermediate_size=ff,
                                                   num_hidden_layers=layers, num_attention_heads=heads,
                                                   max_position_embeddings=max_sent).eval()
        return m.backbone.decoder, m.backbone.in_proj, m.out_proj, "sonar_llm family backbone"
    lm = LlamaModel(_llama_cfg(width, layers, heads, ff, 8, max_sent)).eval()
    return lm, torch.nn.Linear(width, width), torch.nn.Linear(width, width), "Llama stand-in"


@torch.inference_mode()
def run_generation(contexts: list[int], device: torch.device, width: int = 256, layers: int = 4, heads: int = 4,
                   ff: int = 704, vocab: int = 4096, sentence_len: int = 60, new_tokens: int = 16,
                   new_sentences: int = 1, log=print) -> dict[str, Any]:
    from transformers import LlamaForCausalLM, LlamaModel

    max_len = max(contexts) + new_tokens + sentence_len + 8
    lm = LlamaForCausalLM(_llama_cfg(width, layers, heads, ff, vocab, max_len)).to(device).eval()
    enc = LlamaModel(_llama_cfg(width, layers, heads, ff, vocab, sentence_len + 2)).to(device).eval()
    dec = LlamaForCausalLM(_llama_cfg(width, layers, heads, ff, vocab, sentence_len + 2)).to(device).eval()
    smodel, in_proj, out_proj, smodel_label = _sentence_model(width, layers, heads, ff, max(contexts) // sentence_len + 8)
    for m in (smodel, in_proj, out_proj):
        m.to(device)
    g = torch.Generator().manual_seed(0)
    rows = []
    for T in contexts:
        # ---- token LM
        ids = torch.randint(3, vocab, (1, T), generator=g).to(device)  # (1, T)
        out = lm(input_ids=ids, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)  # (1, 1)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            out = lm(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync(device)
        lm_tok = (time.perf_counter() - t0) / new_tokens
        del cache, out
        # ---- SONAR-LLM
        S = max(1, T // sentence_len)
        ctx = torch.randn(1, S, width, generator=g).to(device)  # (1, S, D) sentence vectors
        o = smodel(inputs_embeds=in_proj(ctx), use_cache=True)
        scache, h = o.past_key_values, o.last_hidden_state[:, -1:]  # (1, 1, H)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(new_sentences):
            z = out_proj(h)  # (1, 1, D) predicted sentence vector
            d = dec(inputs_embeds=z, use_cache=True)  # the vector is the decoder's one-slot prefix
            dcache, tok = d.past_key_values, d.logits[:, -1:].argmax(-1)
            toks = [tok]
            for _ in range(sentence_len - 1):
                d = dec(input_ids=tok, past_key_values=dcache, use_cache=True)
                dcache, tok = d.past_key_values, d.logits[:, -1:].argmax(-1)
                toks.append(tok)
            e = enc(input_ids=torch.cat(toks, 1)).last_hidden_state.mean(1, keepdim=True)  # (1, 1, D) re-encoded
            o = smodel(inputs_embeds=in_proj(e), past_key_values=scache, use_cache=True)
            scache, h = o.past_key_values, o.last_hidden_state[:, -1:]
        sync(device)
        sonar_tok = (time.perf_counter() - t0) / (new_sentences * sentence_len)
        rows.append({"context_tokens": T, "context_sentences": S, "token_lm_s_per_token": lm_tok,
                     "sonar_llm_s_per_token": sonar_tok, "ratio_lm_over_sonar": lm_tok / sonar_tok})
        log(f"generation T={T}: token LM {lm_tok * 1e3:.2f} ms/token, SONAR-LLM {sonar_tok * 1e3:.2f} ms/token")
    cross = next((r["context_tokens"] for r in rows if r["ratio_lm_over_sonar"] > 1.0), None)
    return {"rows": rows, "crossover_context": cross, "sentence_model": smodel_label,
            "shape": {"width": width, "layers": layers, "heads": heads, "ff": ff, "vocab": vocab,
                      "sentence_len": sentence_len, "new_tokens": new_tokens, "new_sentences": new_sentences}}


def plot_generation(res: dict[str, Any], path) -> None:
    from memlab.plots import finish_axes, pyplot, save_figure

    plt = pyplot()

    t = [r["context_tokens"] for r in res["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(t, [r["token_lm_s_per_token"] * 1e3 for r in res["rows"]], "o-", label="token LM")
    ax.loglog(t, [r["sonar_llm_s_per_token"] * 1e3 for r in res["rows"]], "o-", label="SONAR-LLM")
    if res.get("crossover_context"):
        ax.axvline(res["crossover_context"], color="grey", ls="--", lw=1, label=f"first cheaper at {res['crossover_context']}")
    finish_axes(ax, "context (tokens)", "ms per generated token", log=True, legend_fontsize=8)
    save_figure(fig, path, dpi=120)
