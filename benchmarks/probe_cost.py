"""Probe cost = one pass of the frozen encoder + decoder training.

The frozen encoder runs once per chunk and its embeddings are cached; the
decoder then trains on the cache for E epochs. This benchmark measures, side
by side in one run: the encoder pass, decoder training for several epoch
counts, and what re-encoding every epoch would have cost instead. The
encoder's time does not grow with E; its share of the probe's cost falls.

    nice -n 10 python benchmarks/probe_cost.py --model minilm --n-train 500 --epochs 1 2 4
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv: list[str] | None = None) -> dict:
    from memlab.probes.chunks.cut import probe_chunks
    from memlab.probes.decoder.fitloop import train_decoder
    from memlab.probes.encoders.sources import load_encoder
    from memlab.probes.options import load_options
    from memlab.probes.report.report import peak_memory_mb
    from memlab.probes.encoders.encode import encode_all
    from memlab.probes.decoder.fit import build_decoder

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--pool", default=None)
    ap.add_argument("--n-train", type=int, default=500)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--corpus", default="austen")
    ap.add_argument("--epochs", type=float, nargs="+", default=[1, 2, 4])
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    opts = load_options(None, None, model=args.model, seq_len=args.seq_len, n_train=args.n_train)
    t = time.perf_counter()
    enc = load_encoder(args.model, pool=args.pool)
    load_s = time.perf_counter() - t
    ids = probe_chunks(enc.tokenizer, args.seq_len, args.n_train, "train", args.corpus)  # (N, T)
    t = time.perf_counter()
    z = encode_all(enc, ids, batch_size=opts.encode_batch_size)  # (N, D)
    encode_s = time.perf_counter() - t
    rows = []
    for e in args.epochs:
        o = load_options(None, None, model=args.model, seq_len=args.seq_len, n_train=args.n_train, epochs=e,
                         hidden_size=args.hidden_size, num_layers=args.num_layers, val_fraction=0.0)
        dec = build_decoder(enc.dim, enc.tokenizer, ids, o)
        dec.set_normalization(z)
        t = time.perf_counter()
        train_decoder(dec, z, ids, o, progress=False)
        train_s = time.perf_counter() - t
        rows.append({"epochs": e, "encode_s": encode_s, "train_s": train_s,
                     "encoder_share": encode_s / (encode_s + train_s),
                     "without_cache_s": e * encode_s + train_s,
                     "speedup_from_cache": (e * encode_s + train_s) / (encode_s + train_s)})
    result = {"model": args.model, "n_train": args.n_train, "seq_len": args.seq_len, "load_s": load_s,
              "threads": torch.get_num_threads(), "rows": rows, "memory": peak_memory_mb()}
    print(f"model {args.model}: load {load_s:.1f}s, one encoder pass over {args.n_train} x {args.seq_len} tokens "
          f"{encode_s:.1f}s")
    print("| epochs | encoder pass (s) | decoder training (s) | encoder share | re-encoding each epoch (s) | cache speedup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['epochs']:g} | {r['encode_s']:.1f} | {r['train_s']:.1f} | {r['encoder_share']:.2f} | "
              f"{r['without_cache_s']:.1f} | {r['speedup_from_cache']:.2f}x |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
