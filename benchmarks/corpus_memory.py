"""Resident memory of tokenizing a large local corpus for training, against the corpus size.

    python benchmarks/corpus_memory.py --mb 200 --work /tmp/corpus-bench [--eager-mb 20] [--recipe memory]

Writes a folder of plain-text "novels" (the bundled Austen text, each copy with its words shuffled
per line so that copies differ) of about ``--mb`` megabytes, then, in a fresh process each, prepares
a recipe's training data as ``memlab train`` does: the streamed path (:func:`memlab.data.stream.stream_corpus`:
split plan, BPE trained on the training split, training tokens written to a memory-mapped file) and, for
contrast on ``--eager-mb`` megabytes, the in-memory path (:func:`memlab.data.views.prepare_corpus` + the
recipe's in-memory view). ``--recipe lm`` (the token LM: ``(N, 128)`` chunks) or ``--recipe memory`` (the
memory recipe's setup on ``configs/memory/toy.yaml``'s model: examples of 4 chunks of 16 tokens, read
from the mapped stream; ``--view sentences``: one padded Punkt sentence of up to 16 tokens each). One JSON
line per run: corpus bytes, peak resident memory (``ru_maxrss``), seconds per phase, training tokens or
examples. The target: under 2 GB of resident memory for a 1 GB corpus. The machine may be shared: seconds
are noisy, memory is not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path


def write_corpus(folder: Path, mb: int, file_mb: int = 8, seed: int = 0) -> int:
    """About ``mb`` MB of text in files of about ``file_mb`` MB, with chapter headings; returns bytes written."""
    from memlab.data.corpus import load_corpus, split_chapters

    folder.mkdir(parents=True, exist_ok=True)
    chapters = [c.text for d in load_corpus("austen") for c in split_chapters(d)]
    rng = random.Random(seed)
    total, n_file = 0, 0
    while total < mb * 2**20:
        path = folder / f"novel{n_file:05d}.txt"
        size = 0
        with open(path, "w") as f:
            k = 0
            while size < file_mb * 2**20:
                lines = rng.choice(chapters).split("\n")
                body = "\n".join(" ".join(rng.sample(w, len(w))) for w in (ln.split() for ln in lines))
                piece = f"\n\nCHAPTER {k + 1}\n\n{body}"
                f.write(piece)
                size += len(piece.encode())
                k += 1
        total += size
        n_file += 1
    return total


def measure(corpus: str, mode: str, cache: str, recipe: str = "lm", view: str = "chunks") -> dict:
    """Run in a fresh process: prepare a recipe's training data; peak RSS and phase times."""
    import resource

    os.environ["MEMLAB_CACHE"] = cache
    from memlab.config import DataConfig

    import memlab.data.stream  # noqa: F401  (the imports' own memory, reported as baseline_rss_mb)
    import memlab.data.views  # noqa: F401

    if recipe == "memory":
        import memlab.models.memory.recipe  # noqa: F401

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    seq = 128 if recipe == "lm" else 64 if view == "chunks" else 16
    cfg = DataConfig(corpus=corpus, vocab_size=4096, seq_len=seq)
    t0 = time.perf_counter()
    if mode == "stream":
        from memlab.data.stream import CorpusStream

        stream = CorpusStream(cfg)
        t1 = time.perf_counter()
        stream.with_tokenizer()
        t2 = time.perf_counter()
        if recipe == "lm":
            out = {"train_tokens": int(stream.chunks("train", cfg.seq_len).size)}  # (N, T) memory-mapped
        else:
            out = {"train_examples": len(memory_examples(stream, view, cfg.seq_len))}
    else:
        from memlab.data.views import split_corpus, corpus_tokenizer, clean_text, token_chunks

        splits = split_corpus(cfg)
        t1 = time.perf_counter()
        texts = [clean_text(d.text) for d in splits["train"]]
        tok = corpus_tokenizer(cfg, texts)
        t2 = time.perf_counter()
        if recipe == "lm":
            out = {"train_tokens": int(token_chunks(texts, tok, cfg.seq_len).numel())}  # (N, T)
        else:
            from memlab.models.memory.data import chunk_view, sentence_view

            rows = chunk_view(texts, tok, seq, 16) if view == "chunks" else sentence_view(splits["train"], tok, seq)[0]
            out = {"train_examples": int(rows.shape[0])}  # (N, C, T)
    t3 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"recipe": recipe, "view": view, "mode": mode, "split_s": round(t1 - t0, 1),
            "tokenizer_s": round(t2 - t1, 1), "tokenize_s": round(t3 - t2, 1), **out,
            "baseline_rss_mb": round(base / 2**20, 1), "peak_rss_mb": round(rss / 2**20, 1)}


def memory_examples(stream, view: str, seq_len: int):
    """The memory recipe's training examples of ``stream`` (its setup's data step, on the toy model's shape)."""
    from memlab.models.memory.recipe import MemoryOptions, MemoryRecipe, Shape

    shape = Shape(chunk_len=16, seq_len=seq_len, chunks=seq_len // 16 if view == "chunks" else 1)
    data = MemoryRecipe.datasets(None, stream, MemoryOptions(view=view), shape, frozen=False)
    ds = data.train
    for i in range(0, len(ds), max(1, len(ds) // 1000)):  # read rows across the whole split
        ds[i]
    return ds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=200, help="size of the streamed corpus in MB")
    p.add_argument("--eager-mb", type=int, default=20, help="size of the in-memory run (0: skip it)")
    p.add_argument("--work", default="/tmp/memlab-corpus-bench", help="folder for the corpora and caches")
    p.add_argument("--recipe", choices=("lm", "memory"), default="lm", help="whose training data to prepare")
    p.add_argument("--view", choices=("chunks", "sentences"), default="chunks", help="--recipe memory: its view")
    p.add_argument("--child", nargs=5, metavar=("CORPUS", "MODE", "CACHE", "RECIPE", "VIEW"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    work = Path(args.work)
    runs = [("stream", args.mb)] + ([("eager", args.eager_mb), ("stream", args.eager_mb)] if args.eager_mb else [])
    for mode, mb in runs:
        folder = work / f"corpus-{mb}mb"
        if not folder.is_dir():
            write_corpus(folder, mb)
        size = sum(f.stat().st_size for f in folder.iterdir())
        cache = str(work / f"cache-{args.recipe}-{args.view}-{mode}-{mb}")
        shutil.rmtree(cache, ignore_errors=True)  # nothing reused from an earlier run
        child = ["--child", str(folder), mode, cache, args.recipe, args.view]
        out = subprocess.run([sys.executable, __file__, *child], capture_output=True,
                             text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "true", "HF_DATASETS_OFFLINE": "1",
                                                  "HF_DATASETS_CACHE": str(work / "hf-datasets")})
        if out.returncode:
            print(out.stderr[-2000:], file=sys.stderr)
            return out.returncode
        rec = {"corpus_mb": round(size / 2**20, 1), **json.loads(out.stdout.strip().splitlines()[-1])}
        rec["rss_over_corpus"] = round(rec["peak_rss_mb"] / rec["corpus_mb"], 2)
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
