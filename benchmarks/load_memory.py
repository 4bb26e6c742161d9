"""Peak resident memory of the probe's loader on a big model, against the bytes of its weights.

    python benchmarks/load_memory.py [--work /tmp/memlab-load-bench] [--layers 18] [--file-dtype bfloat16]
                                     [--dtypes float32 bfloat16] [--tokenizer DIR]

Saves a random Llama-shaped causal LM (by default about 1B parameters: Llama-2's layout at TinyLlama's
width, 18 layers, the bundled corpus's 4096-token BPE) to ``--work``, one tensor at a time and one
safetensors shard at a time from a model built on the meta device, so that making the folder never holds
a second copy either (at most one shard, ``--shard-mb``). Then, in a fresh process per ``--dtypes``
entry, the probe's loader (:func:`memlab.probes.encoders.sources.load_encoder`, ``device=cpu``) reads it. One JSON
line per load: the weights' bytes in memory, peak resident memory (``VmHWM``, after every weight is read once;
memory-mapped pages of the files count while they are mapped), the imports' own baseline, and the ratios
``peak_over_weights`` and ``added_over_weights`` (the peak less the baseline); the target is a peak within
1.3x of the weights. The machine may be shared: seconds are noisy, memory is not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LLAMA_1B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=18, num_attention_heads=16,
                num_key_value_heads=16, max_position_embeddings=2048)
"""About 0.97B parameters with a 4096-token vocabulary (the shape ``scripts/gpu_check.py`` probes)."""
DTYPES = ("float32", "bfloat16", "float16")


def save_random_llama(folder: Path, tok, shape: dict, dtype: str = "bfloat16", shard_mb: int = 512,
                      seed: int = 0) -> int:
    """A random ``LlamaForCausalLM`` of ``shape`` with tokenizer ``tok`` saved in ``folder`` in ``dtype``, built
    on the meta device and written a shard at a time (host memory: one shard); returns its parameter count."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    cfg = tf.LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, dtype=dtype, architectures=["LlamaForCausalLM"], **shape)
    with torch.device("meta"):
        shapes = {k: t.shape for k, t in tf.LlamaForCausalLM(cfg).state_dict().items()}  # names and shapes only
    folder.mkdir(parents=True, exist_ok=True)
    gen, kind = torch.Generator().manual_seed(seed), getattr(torch, dtype)
    shards: list[list[str]] = []
    shard: dict = {}
    total = 0

    def flush():
        save_file(shard, str(folder / f"part-{len(shards)}.safetensors"), metadata={"format": "pt"})
        shards.append(list(shard))
        shard.clear()

    for name, size in shapes.items():
        if name.endswith("norm.weight"):
            shard[name] = torch.ones(size, dtype=kind)  # (D,)
        else:
            shard[name] = torch.empty(size).normal_(0.0, cfg.initializer_range, generator=gen).to(kind)
        total += shard[name].numel() * shard[name].element_size()
        if sum(t.numel() * t.element_size() for t in shard.values()) >= shard_mb * 2**20:
            flush()
    if shard:
        flush()
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (folder / f"part-{i}.safetensors").rename(folder / file)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    cfg.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return sum(s.numel() for s in shapes.values())


def peak_rss() -> int:
    """This process's peak resident memory in bytes (``VmHWM``: since its ``exec``, unlike ``ru_maxrss``, which
    keeps the parent's peak at the fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure(folder: str, dtype: str) -> dict:
    """Run in a fresh process: load the encoder as the probe does; peak RSS against the loaded weights' bytes."""
    import torch
    import transformers  # noqa: F401  (the imports' own memory, reported as baseline)

    from memlab.probes.encoders.sources import load_encoder

    base = peak_rss()
    t0 = time.perf_counter()
    enc = load_encoder(folder, dtype=dtype, device="cpu")
    secs = time.perf_counter() - t0
    tensors = [*enc.model.parameters(), *enc.model.buffers()]
    with torch.no_grad():
        for t in tensors:  # every weight read once, as a probe's first batch does (memory-mapped pages count)
            t.sum()
    peak = peak_rss()
    weights = sum(t.numel() * t.element_size() for t in tensors)
    got = {str(t.dtype).removeprefix("torch.") for t in enc.model.parameters()}
    return {"dtype": dtype, "param_dtypes": sorted(got), "params": sum(p.numel() for p in enc.model.parameters()),
            "weight_bytes": weights, "weights_mb": round(weights / 2**20, 1), "baseline_rss_mb": round(base / 2**20, 1),
            "peak_rss_mb": round(peak / 2**20, 1), "peak_rss_bytes": peak, "peak_over_weights": round(peak / weights, 3),
            "added_over_weights": round((peak - base) / weights, 3), "load_s": round(secs, 1),
            "threads": torch.get_num_threads()}


def _tokenizer(spec: str | None):
    if spec:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(spec)
    from memlab.data.corpus import load_corpus
    from memlab.data.tokenizer import train_bpe

    return train_bpe([d.text for d in load_corpus("austen")], 4096)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/memlab-load-bench", help="folder for the saved model")
    p.add_argument("--layers", type=int, default=LLAMA_1B["num_hidden_layers"], help="decoder layers (18: ~1B)")
    p.add_argument("--hidden-size", type=int, default=LLAMA_1B["hidden_size"])
    p.add_argument("--intermediate-size", type=int, default=LLAMA_1B["intermediate_size"])
    p.add_argument("--heads", type=int, default=LLAMA_1B["num_attention_heads"])
    p.add_argument("--file-dtype", choices=DTYPES, default="bfloat16", help="dtype of the saved weights")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["float32", "bfloat16"], help="load dtypes")
    p.add_argument("--shard-mb", type=int, default=512, help="size of one saved shard")
    p.add_argument("--tokenizer", help="a tokenizer folder (default: a 4096-token BPE of the bundled corpus)")
    p.add_argument("--child", nargs=2, metavar=("FOLDER", "DTYPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return []
    shape = {**LLAMA_1B, "num_hidden_layers": args.layers, "hidden_size": args.hidden_size,
             "intermediate_size": args.intermediate_size, "num_attention_heads": args.heads,
             "num_key_value_heads": args.heads}
    folder = Path(args.work) / (f"llama-{args.layers}x{args.hidden_size}-{args.file_dtype}")
    t0 = time.perf_counter()
    if not (folder / "model.safetensors.index.json").is_file():
        params = save_random_llama(folder, _tokenizer(args.tokenizer), shape, args.file_dtype, args.shard_mb)
        print(json.dumps({"saved": str(folder), "params": params, "file_dtype": args.file_dtype,
                          "save_s": round(time.perf_counter() - t0, 1),
                          "save_peak_rss_mb": round(peak_rss() / 2**20, 1)}), flush=True)
    rows = []
    for dtype in args.dtypes:
        out = subprocess.run([sys.executable, __file__, "--child", str(folder), dtype], capture_output=True,
                             text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if out.returncode:
            raise RuntimeError(out.stderr.strip()[-2000:])
        rows.append({"file_dtype": args.file_dtype, **json.loads(out.stdout.strip().splitlines()[-1])})
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
