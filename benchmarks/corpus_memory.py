"""Resident memory of tokenizing a large local corpus for training, against the corpus size.

    python benchmarks/corpus_memory.py --mb 200 --work /tmp/corpus-bench [--eager-mb 20]

Writes a folder of plain-text "novels" (the bundled Austen text, each copy with its words shuffled
per line so that copies differ) of about ``--mb`` megabytes, then, in a fresh process each, prepares
the token LM's training data as ``memlab train`` does: the streamed path
(:func:`memlab.data.stream.stream_corpus`: split plan, BPE trained on the training split, training
chunks written to a memory-mapped file) and, for contrast on ``--eager-mb`` megabytes, the in-memory
path (:func:`memlab.data.views.prepare_corpus` + ``token_chunks``). One JSON line per run: corpus
bytes, peak resident memory (``ru_maxrss``), seconds per phase, tokens. The target: under 2 GB of
resident memory for a 1 GB corpus. The machine may be shared: seconds are noisy, memory is not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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


def measure(corpus: str, mode: str, cache: str) -> dict:
    """Run in a fresh process: prepare training chunks; peak RSS and phase times."""
    import resource

    os.environ["MEMLAB_CACHE"] = cache
    from memlab.config import DataConfig

    import memlab.data.stream  # noqa: F401  (the imports' own memory, reported as baseline_rss_mb)
    import memlab.data.views  # noqa: F401

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    cfg = DataConfig(corpus=corpus, vocab_size=4096, seq_len=128)
    t0 = time.perf_counter()
    if mode == "stream":
        from memlab.data.stream import CorpusStream

        stream = CorpusStream(cfg)
        t1 = time.perf_counter()
        stream.with_tokenizer()
        t2 = time.perf_counter()
        chunks = stream.chunks("train", cfg.seq_len)  # (N, T) memory-mapped
    else:
        from memlab.data.views import split_corpus, corpus_tokenizer, clean_text, token_chunks

        splits = split_corpus(cfg)
        t1 = time.perf_counter()
        texts = [clean_text(d.text) for d in splits["train"]]
        tok = corpus_tokenizer(cfg, texts)
        t2 = time.perf_counter()
        chunks = token_chunks(texts, tok, cfg.seq_len)  # (N, T)
    t3 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"mode": mode, "split_s": round(t1 - t0, 1), "tokenizer_s": round(t2 - t1, 1),
            "tokenize_s": round(t3 - t2, 1), "train_tokens": int(chunks.shape[0] * chunks.shape[1]),
            "baseline_rss_mb": round(base / 2**20, 1), "peak_rss_mb": round(rss / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=200, help="size of the streamed corpus in MB")
    p.add_argument("--eager-mb", type=int, default=20, help="size of the in-memory run (0: skip it)")
    p.add_argument("--work", default="/tmp/memlab-corpus-bench", help="folder for the corpora and caches")
    p.add_argument("--child", nargs=3, metavar=("CORPUS", "MODE", "CACHE"), help=argparse.SUPPRESS)
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
        cache = str(work / f"cache-{mode}-{mb}")
        out = subprocess.run([sys.executable, __file__, "--child", str(folder), mode, cache], capture_output=True,
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
