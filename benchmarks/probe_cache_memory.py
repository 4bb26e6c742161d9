"""The probe's resident memory against its number of chunks, with a cache killed mid-write and resumed.

Writes a corpus large enough for the largest size (Austen's sentences, shuffled, as jsonl records), then for each
``--sizes`` N runs ``memlab probe`` in a process of its own with ``--cache-dir``: the first run of the largest size
is killed (``kill -9``) as soon as the cache has a finished piece, and run again, which resumes the cache at its
last finished piece and fits. Each run's peak resident memory is its own process's (``ru_maxrss`` of that child).

    python benchmarks/probe_cache_memory.py --sizes 10000 100000 --model synthetic:bag --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_corpus(path: Path, words_needed: int, seed: int = 0) -> int:
    """Austen's sentences shuffled into records of about 400 words until ``words_needed``; returns the words written."""
    from memlab.data.corpus import load_corpus

    sentences = [s for d in load_corpus("austen") for s in re.split(r"(?<=[.!?])\s+", " ".join(d.text.split()))]
    rng, words, rec, n = random.Random(seed), 0, [], 0
    with open(path, "w") as f:
        while words < words_needed:
            rng.shuffle(sentences)
            for s in sentences:
                rec.append(s)
                n += len(s.split())
                if n >= 400:
                    f.write(json.dumps({"text": " ".join(rec)}) + "\n")
                    words, rec, n = words + n, [], 0
                    if words >= words_needed:
                        break
    return words


def run(argv: list[str], kill_when: Path | None = None) -> dict:
    """``memlab probe argv`` in a child process: its seconds, peak RSS (MB) and exit status; killed with SIGKILL
    once ``kill_when`` (a cache's progress file) shows a finished piece."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from memlab.app.cli import main; "
                             "sys.exit(main(sys.argv[1:]))", "probe", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = False
    if kill_when is not None:
        while proc.poll() is None:
            hits = list(kill_when.parent.glob(kill_when.name))
            if any(json.loads(h.read_text() or "{}").get("done", 0) > 0 for h in hits if h.stat().st_size):
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.005)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    return {"seconds": time.perf_counter() - t, "peak_rss_mb": usage.ru_maxrss / 1024, "killed": killed,
            "status": os.waitstatus_to_exitcode(status), "resumed": "resuming at row" in err,
            "note": next((ln for ln in err.splitlines() if "resuming" in ln), "")}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--model", default="synthetic:bag")
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60, help="decoder steps at every size (the fit's memory, not its "
                                                         "reading, is measured)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", help="folder for the corpus, caches and runs (default: a temporary one)")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="probe-cache-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    words = write_corpus(corpus, int(max(args.sizes) * args.seq_len * 1.3))
    rows = []
    for n in args.sizes:
        cache = work / f"cache-{n}"
        common = ["--model", args.model, "--corpus", str(corpus), "--seq-len", str(args.seq_len), "--n-train",
                  str(n), "--n-eval", "256", "--epochs", f"{args.steps * 32 / n:.6g}", "--threads",
                  str(args.threads), "--cache-dir", str(cache), "--no-bow"]
        row = {"n_train": n}
        if n == max(args.sizes):  # killed mid-write, then resumed
            row["killed_run"] = run([*common, "--out", str(work / f"run-{n}-killed")],
                                    kill_when=cache / "emb-*.part.json")
        row["run"] = run([*common, "--out", str(work / f"run-{n}")])
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["run"]["peak_rss_mb"]
    print(f"corpus: {words} words; model {args.model}, seq_len {args.seq_len}, {args.steps} steps a size")
    print("| chunks | peak RSS (MB) | vs the smallest | seconds | note |")
    print("|---|---|---|---|---|")
    for r in rows:
        note = r["run"]["note"] or ("killed at its first finished piece, then resumed" if "killed_run" in r else "")
        print(f"| {r['n_train']} | {r['run']['peak_rss_mb']:.0f} | {r['run']['peak_rss_mb'] / base:.2f}x | "
              f"{r['run']['seconds']:.0f} | {note} |")
    return {"rows": rows, "corpus_words": words}


if __name__ == "__main__":
    main()
