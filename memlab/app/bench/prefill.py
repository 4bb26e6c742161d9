"""Part (a): prefill time and peak memory, memory model vs a full-attention Transformer of the
same width and depth, from 1k to 32k tokens, with the fitted cost exponents.

The full-attention twin is a transformers ``LlamaForCausalLM`` (SDPA attention, causal)
with the memory model's decoder width, depth, heads, MLP width and vocabulary. Both read
one sequence (batch 1) in one forward call. The memory model reads the sequence as
``T / chunk_len`` chunks, encodes all of them in one call and decodes every chunk reading
the memories of the chunks before it (``memory_mode="previous"``).

``logits`` chooses what both sides return:

* ``"last"`` (default): prefill in the ordinary sense (what transformers' ``generate`` does):
  both run every layer on every position but apply the output head to the last position
  only (``logits_to_keep=1`` on both models);
* ``"all"``: logits for every position (the shared output head, vocabulary x width per
  token, then is a large per-token cost at toy widths and bounds the speed ratio).

The choice is recorded in the result (``"logits"``) and the plot title.
"""

from __future__ import annotations

from typing import Any

import torch

from memlab.app.bench.measure import PeakMemory, cost_exponent, time_call


def full_attention_twin(width: int, layers: int, heads: int, ff: int, vocab: int, max_len: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=width, intermediate_size=ff, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=max_len,
                      tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def memory_model(preset: str, chunk_len: int, max_len: int, overrides: dict | None = None):
    """The registered ``memory`` family's model for sequences up to ``max_len`` tokens, or None."""
    from memlab.registry import FAMILIES

    if "memory" not in FAMILIES:
        return None
    fam = FAMILIES.get("memory")
    kw = {"chunk_len": chunk_len, "max_chunks": max(1, max_len // chunk_len), **(overrides or {})}
    return fam.make_model(preset, **kw).eval()


def _measure(fn, device, repeats: int) -> dict[str, Any]:
    try:
        with PeakMemory(device) as pm:
            fn()
        t = time_call(fn, repeats=repeats, warmup=0, device=device)
        return {"seconds": t, "peak_mb": pm.peak_bytes / 2**20}
    except (RuntimeError, MemoryError) as e:  # out of memory at a long length: record and go on
        return {"error": f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]}"}


LOGITS = ("last", "all")
"""``logits`` choices: the last position only (prefill) or every position."""


def run_prefill(lengths: list[int], device: torch.device, preset: str = "toy", chunk_len: int = 64,
                overrides: dict | None = None, repeats: int = 1, logits: str = "last", log=print) -> dict[str, Any]:
    from memlab.errors import MemlabError

    if logits not in LOGITS:
        raise MemlabError(f"unknown prefill logits {logits!r}; choose one of {', '.join(LOGITS)}")
    keep = 1 if logits == "last" else 0  # transformers' logits_to_keep: 0 = every position
    max_len = max(lengths)
    mem = memory_model(preset, chunk_len, max_len, overrides)
    if mem is not None:
        c = mem.config
        width, layers, heads, ff, vocab = c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size, c.vocab_size
    else:  # the memory family is not installed: measure the full-attention side alone (toy widths)
        width, layers, heads, ff, vocab = 48, 2, 4, 96, 4096
    full = full_attention_twin(width, layers, heads, ff, vocab, max_len)
    full.to(device)
    if mem is not None:
        mem.to(device)
    rows = []
    g = torch.Generator().manual_seed(0)
    for T in lengths:
        ids = torch.randint(3, vocab, (1, T), generator=g).to(device)  # (1, T)
        row: dict[str, Any] = {"tokens": T}
        with torch.inference_mode():
            row["full_attention"] = _measure(lambda: full(input_ids=ids, use_cache=False, logits_to_keep=keep),
                                             device, repeats)  # logits (1, T, V) or (1, 1, V)
            if mem is not None:
                if T % chunk_len:
                    row["memory"] = {"error": f"{T} is not a multiple of chunk_len {chunk_len}"}
                else:
                    x = ids.view(1, T // chunk_len, chunk_len)  # (1, C, T_c)
                    row["memory"] = _measure(lambda: mem(input_ids=x, decoder_input_ids=x, memory_mode="previous",
                                                         logits_to_keep=keep),
                                             device, repeats)  # logits (1, C, T_c, V) or (1, 1, V)
        f, m = row["full_attention"], row.get("memory", {})
        if "seconds" in f and "seconds" in m:
            row["speedup"] = f["seconds"] / m["seconds"]
        log(f"prefill T={T}: full {f.get('seconds', f.get('error'))}  memory {m.get('seconds', m.get('error', '-'))}")
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out: dict[str, Any] = {"logits": logits, "logits_to_keep": keep, "rows": rows,
                           "model": {"width": width, "layers": layers, "heads": heads, "ff": ff,
                                     "vocab": vocab, "chunk_len": chunk_len, "memory_preset": preset,
                                     "memory_overrides": overrides or {}},
                           "memory_family": mem is not None}
    for side in ("full_attention", "memory"):
        pts = [(r["tokens"], r[side]["seconds"]) for r in rows if "seconds" in r.get(side, {})]
        if len(pts) >= 2:
            out[f"{side}_exponent"] = cost_exponent(*zip(*pts))
    last = [r for r in rows if "speedup" in r]
    if last:
        out["speedup_at_max"] = last[-1]["speedup"]
        out["speedup_at_tokens"] = last[-1]["tokens"]
    return out


def plot_prefill(res: dict[str, Any], path) -> None:
    from memlab.plots import finish_axes, pyplot, save_figure

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for side, label in (("full_attention", "full attention"), ("memory", "memory model")):
        pts = [(r["tokens"], r[side]["seconds"], r[side]["peak_mb"]) for r in res["rows"] if "seconds" in r.get(side, {})]
        if not pts:
            continue
        t, s, m = zip(*pts)
        exp = res.get(f"{side}_exponent")
        axes[0].loglog(t, s, "o-", label=f"{label} (exponent {exp:.2f})" if exp is not None else label)
        axes[1].loglog(t, [max(v, 1e-3) for v in m], "o-", label=label)
    axes[0].set_ylabel("prefill seconds")
    axes[1].set_ylabel("peak memory (MiB)")
    what = {"last": "last-position logits (logits_to_keep=1)", "all": "logits for every position"}
    fig.suptitle(f"prefill, memory model vs full attention: {what.get(res.get('logits', 'all'), res.get('logits'))}",
                 fontsize=10)
    for ax in axes:
        finish_axes(ax, "tokens", log=True, legend_fontsize=8)
    save_figure(fig, path, dpi=120)
