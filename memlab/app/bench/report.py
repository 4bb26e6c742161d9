"""The bench run's README: one table per part, targets beside the measured figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memlab.rundir import write_atomic


def _f(v, fmt="{:.3g}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def _device(res: dict[str, Any]) -> str:
    """The device the parts ran on, with the GPU's name where it differs from the device's."""
    name = res.get("device_name")
    return res["device"] if not name or name == res["device"].split(":")[0] else f"{res['device']} ({name})"


def write_readme(res: dict[str, Any], path: str | Path) -> None:
    P = res["parts"]
    lines = ["# memlab bench", "", f"Command: `{res.get('command') or 'memlab bench'}`", "",
             f"Device: {_device(res)} ({res['threads']} threads), torch {res['torch']}, {res['machine']}, "
             f"started {res['started']}.", "",
             "Timings on a shared machine are noisy: read the ratios measured side by side in this run.", ""]
    if "flops" in P:
        r = P["flops"]
        lines += ["## Analytic inference FLOPs (SONAR-LLM paper settings)", "",
                  f"SONAR-LLM becomes cheaper per generated token than the token LM beyond "
                  f"**{_f(r['crossover_tokens'], '{:,.0f}')} tokens** (paper: about 4,096); sentence length "
                  f"{r['sentence_len']} tokens. Plot: `plots/flops.png`.", ""]
    if "prefill" in P:
        r = P["prefill"]
        kept = {"last": "next-token logits of the last position only", "all": "logits of every position"}
        lines += ["## (a) Prefill: memory model vs full attention (same width and depth)", "",
                  f"Both models compute {kept.get(r.get('logits', 'all'), r.get('logits'))}.", "",
                  "| tokens | full attention s | memory s | speedup | full peak MiB | memory peak MiB |", "|---|---|---|---|---|---|"]
        for row in r["rows"]:
            f, m = row["full_attention"], row.get("memory", {})
            lines.append(f"| {row['tokens']} | {_f(f.get('seconds'))} | {_f(m.get('seconds'))} | {_f(row.get('speedup'))} "
                         f"| {_f(f.get('peak_mb'))} | {_f(m.get('peak_mb'))} |")
        lines += ["", f"Cost exponents (time ~ T^k): full attention {_f(r.get('full_attention_exponent'))}, "
                      f"memory model {_f(r.get('memory_exponent'))} (target <= 1.4); speedup at "
                      f"{r.get('speedup_at_tokens', '-')} tokens: {_f(r.get('speedup_at_max'))}x (target >= 10x at 32k). "
                      f"Model: {r['model']}. Plot: `plots/prefill.png`.", ""]
        errs = [f"{row['tokens']}: {row[s]['error']}" for row in r["rows"] for s in ("full_attention", "memory")
                if "error" in row.get(s, {})]
        if errs:
            lines += ["Errors: " + "; ".join(errs), ""]
    if "generation" in P:
        r = P["generation"]
        lines += ["## (b) Generation per token: SONAR-LLM vs token LM (KV caches on both)", "",
                  "| context tokens | token LM ms/token | SONAR-LLM ms/token | LM / SONAR |", "|---|---|---|---|"]
        for row in r["rows"]:
            lines.append(f"| {row['context_tokens']} | {row['token_lm_s_per_token'] * 1e3:.3g} | "
                         f"{row['sonar_llm_s_per_token'] * 1e3:.3g} | {row['ratio_lm_over_sonar']:.3g} |")
        lines += ["", f"SONAR-LLM first cheaper at a context of **{r.get('crossover_context') or 'not reached'}** tokens "
                      f"(target: at most 4,096). Sentence model: {r['sentence_model']}; shape {r['shape']}. "
                      "Plot: `plots/generation.png`.", ""]
    if "mfu" in P:
        lines += ["## (c) Training MFU against a matmul timed in the same run", "",
                  "| family | config | steady MFU | whole-run MFU | matmul GFLOP/s | tokens/s |", "|---|---|---|---|---|---|"]
        for label, r in P["mfu"].items():
            if not isinstance(r, dict) or label == "seconds":
                continue
            if "error" in r or "skipped" in r:
                lines.append(f"| {label} | {r.get('config', '-')} | {r.get('error') or r.get('skipped')} | | | |")
                continue
            mm = r.get("matmul_flops_per_s")
            lines.append(f"| {label} | {r['config']} | {_f(r['mfu_steady'], '{:.1%}')} | {_f(r['mfu_run'], '{:.1%}')} "
                         f"| {_f(mm / 1e9 if mm else None)} | {_f(r.get('tokens_per_s'))} |")
        lines += ["", "Target: >= 60% on small configs for every family.", ""]
    if "probe" in P:
        r = P["probe"]
        lines += ["## (d) Inversion probe time split", ""]
        if "skipped" in r or "error" in r:
            lines += [r.get("skipped") or r.get("error"), ""]
        else:
            lines += ["| phase | seconds | share of encode + training |", "|---|---|---|"]
            keys = ("encode_s", "decoder_train_s", "control_train_s")
            tot = sum(r[k] for k in keys) or 1.0
            for k in keys:
                lines.append(f"| {k[:-2].replace('_', ' ')} | {r[k]:.3g} | {r[k] / tot:.1%} |")
            lines += ["", f"Probe of `{r['model']}` with {r['options']}; model load {r['load_s']:.3g}s, "
                          f"total {r['total_s']:.3g}s.", ""]
        if r.get("decoder_mfu"):
            lines += ["| decoders' compute | MFU | decoder GFLOP/s | fp32 matmul GFLOP/s | s per step | threads |",
                      "|---|---|---|---|---|---|"]
            for m in r["decoder_mfu"].values():
                lines.append(f"| {m['dtype']} | {m['mfu']:.2f} | {m['decoder_flops_per_s'] / 1e9:.1f} | "
                             f"{m['matmul_flops_per_s'] / 1e9:.1f} | {m['seconds_per_step']:.3g} | {m['threads']} |")
            m = next(iter(r["decoder_mfu"].values()))
            sh = m["shape"]
            lines += ["", f"The probe's decoders training as one group of {m['members']} (a step: forward, backward, "
                          f"AdamW; batch {sh['batch_size']}, {sh['seq_len']} tokens, {sh['kept_vocab']} kept ids, "
                          f"embedding width {sh['embed_dim']}, {sh['num_layers']} blocks of width "
                          f"{sh['hidden_size']}) against a float32 {m['matmul_n']} x {m['matmul_n']} matmul timed in "
                          "the same run. Target: >= 0.5 in float32.", ""]
    write_atomic(path, "\n".join(lines) + "\n")  # whole or not at all
