"""How the pooled distance falls as a chunk's tokens come right: the landscape a search from one vector climbs.

    python benchmarks/invert_pooled_landscape.py --model smollm2 --layers 15,30 --states last --chunk-by tokens \\
        --seq-len 8 --n 4 --draws 32 --corpus $C --out runs/landscape-smollm2
    python benchmarks/invert_pooled_landscape.py --model minilm --layers 6 --states mean --seq-len 16 --n 4 \\
        --draws 32 --corpus $C --out runs/landscape-minilm

For each chunk and each ``k`` from 0 to the chunk's length, ``--draws`` times: ``k`` of its positions (drawn at
random) keep the true token and every other takes the token of another chunk at that position (``--fill other``:
real text, as a search's hypotheses are) or a random token (``--fill random``); the relative distance ``|pool(h) - z*| / |z*|``
of that sequence to the chunk's own pooled state at the layer. A search that edits a few tokens at a time can
only climb where the distance falls steadily as tokens come right; where it stays at the level of random text
until nearly every token is right, no local search finds the way (the true chunk is a hole in a flat plain).

Also, at up to 4 positions of each chunk: with every other position filled, the rank of the right token there by
exact distance among ``--candidates`` random tokens (0: nearest), i.e. whether one right edit is visible from
random text at all; and with every other position right, the median distance a random token there leaves (how
narrow the hole is, for a random token and for the other chunk's). ``--whiten K``: the distance is the whitened
one ``memlab invert --whiten K`` descends (the pooled states of 1,000 training chunks), not the plain one.

Writes landscape.json and landscape.png into ``--out`` and prints a markdown table: per layer, the median and
quartiles of the distance at each share of tokens right.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--layers", default="15,30")
    p.add_argument("--states", default="last", choices=("last", "mean"))
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--chunk-by", default="tokens", choices=("words", "tokens"))
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--draws", type=int, default=32)
    p.add_argument("--candidates", type=int, default=255)
    p.add_argument("--whiten", type=float, default=0.0,
                   help="measure the whitened distance the correction descends (memlab invert --whiten; 0: the plain one)")
    p.add_argument("--fill", default="other", choices=("other", "random"),
                   help="what the wrong positions hold: another chunk's tokens there (real text) or random tokens")
    p.add_argument("--corpus", default="austen")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import torch

    from memlab.probes.invert.options import InvertOptions, PooledOptions
    from memlab.probes.invert.pooled.searcher import PooledSearcher
    from memlab.probes.invert.start import machine_facts, setup, train_chunk_ids

    torch.set_num_threads(args.threads)
    machine = machine_facts()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(["python", "benchmarks/invert_pooled_landscape.py", *sys.argv[1:]]),
           "machine": machine, "model": args.model, "states": args.states, "fill": args.fill,
           "whiten": args.whiten, "layers": {}}
    t0 = time.perf_counter()
    for layer in [int(x) for x in args.layers.split(",")]:
        o = InvertOptions()
        o.model.model, o.model.layer, o.model.states, o.model.threads = args.model, layer, args.states, args.threads
        o.text.corpus, o.text.seq_len, o.text.n, o.text.chunk_by = args.corpus, args.seq_len, args.n, args.chunk_by
        _, enc, reader, texts, chunks, _ = setup(o)
        s = PooledSearcher(reader, args.states, PooledOptions(), None, list(enc.prefix),
                           list(getattr(enc, "suffix", []) or []))
        if args.whiten:  # the distance the correction descends: whitened by the training chunks' pooled states
            s.set_metric(*s.whitening(train_chunk_ids(o.text, enc.tokenizer, 1000), args.whiten))

        def dist(seqs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            return torch.cat([s.objective(seqs[i:i + 128], z)[0].sqrt() for i in range(0, len(seqs), 128)])

        gen = torch.Generator().manual_seed(0)
        curve, ranks = {}, []
        for ci, ids in enumerate(chunks):
            true = torch.tensor(ids)
            T, z = len(ids), s.pooled(true[None])[0]
            other = chunks[(ci + 1) % len(chunks)]
            other = torch.tensor((other * (T // len(other) + 1))[:T])  # another chunk's tokens, cut to T

            def fill() -> torch.Tensor:
                if args.fill == "other":
                    return other.clone()
                return torch.randint(0, reader.vocab_size, (T,), generator=gen)

            seqs, right = [], []
            for k in range(T + 1):
                for _ in range(args.draws if k < T else 1):
                    keep = torch.randperm(T, generator=gen)[:k]
                    seq = fill()
                    seq[keep] = true[keep]
                    seqs.append(seq), right.append(int((seq == true).sum()))
            d = dist(torch.stack(seqs), z)
            for r, x in zip(right, d.tolist()):
                curve.setdefault(round(r / T, 2), []).append(x)
            for t in torch.randperm(T, generator=gen)[: min(T, 4)].tolist():  # one wrong token: is the right one seen
                cand = torch.cat([true[t:t + 1], torch.randint(0, reader.vocab_size, (args.candidates,),
                                                               generator=gen)])
                cand = cand[(cand != true[t]) | (torch.arange(len(cand)) == 0)]
                b = true.repeat(len(cand), 1)
                b[:, t] = cand
                dd = dist(b[1:], z)
                one = true.clone()
                one[t] = int(other[t]) if int(other[t]) != int(true[t]) else int(cand[1])
                d_other = float(dist(one[None], z)[0])
                ranks.append({"median_distance_one_wrong": float(dd.median()), "distance_other_token": d_other})
                # every other position filled instead: the right token at t among random ones there
                b2 = fill().repeat(len(cand), 1)
                b2[:, t] = cand
                d2 = dist(b2, z)
                ranks[-1]["rank_among_random_when_the_rest_is_random"] = int((d2[1:] < d2[0]).sum())
                ranks[-1]["candidates"] = len(cand) - 1
        q = {str(k): {"median": float(torch.tensor(v).median()), "q1": float(torch.tensor(v).quantile(0.25)),
                      "q3": float(torch.tensor(v).quantile(0.75)), "n": len(v)} for k, v in sorted(curve.items())}
        res["layers"][str(layer)] = {"curve": q, "one_token": ranks, "chunks": len(chunks), "num_layers":
                                     reader.num_layers, "seconds": time.perf_counter() - t0}
        (out / "landscape.json").write_text(json.dumps(res, indent=2))
    _plot(res, out / "landscape.png")
    print(_markdown(res))
    print(f"wrote {out / 'landscape.json'} and {out / 'landscape.png'} in {time.perf_counter() - t0:.0f} s "
          f"({machine['matmul_gflops']:.0f} GFLOP/s fp32 matmul, {machine['threads']} threads)")
    return 0


def _markdown(res: dict) -> str:
    which = f"whitened ({res['whiten']:g}) relative distance" if res.get("whiten") else "relative distance"
    lines = [f"| layer | share of tokens right (the rest: {FILLS[res['fill']]}) | {which}: median [q1, q3] |",
             "|---|---|---|"]
    for layer, r in res["layers"].items():
        for k, v in r["curve"].items():
            lines.append(f"| {layer} | {float(k):.2f} | {v['median']:.3f} [{v['q1']:.3f}, {v['q3']:.3f}] |")
        rk = [x["rank_among_random_when_the_rest_is_random"] for x in r["one_token"]]
        c = r["one_token"][0]["candidates"] if r["one_token"] else 0
        walls = sorted(x["median_distance_one_wrong"] for x in r["one_token"])
        lines.append(f"| {layer} | one token right, the rest filled: its rank among {c} random tokens at its place "
                     f"(0: nearest) | median {sorted(rk)[len(rk) // 2]} (all: {rk}) |")
        lines.append(f"| {layer} | every token right but one (a random token there) | median "
                     f"{walls[len(walls) // 2]:.3f} (range {walls[0]:.3f}-{walls[-1]:.3f}) |")
        oth = sorted(x["distance_other_token"] for x in r["one_token"])
        lines.append(f"| {layer} | every token right but one (the other chunk's token there) | median "
                     f"{oth[len(oth) // 2]:.3f} (range {oth[0]:.3f}-{oth[-1]:.3f}) |")
    return "\n".join(lines)


FILLS = {"other": "another chunk's tokens", "random": "random tokens"}


def _plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (layer, r) in enumerate(res["layers"].items()):
        xs = [float(k) for k in r["curve"]]
        ax.plot(xs, [v["median"] for v in r["curve"].values()], "-o", color=f"C{i}",
                label=f"layer {layer} of {r['num_layers']}")
        ax.fill_between(xs, [v["q1"] for v in r["curve"].values()], [v["q3"] for v in r["curve"].values()],
                        color=f"C{i}", alpha=0.2)
    ax.set_xlabel(f"share of the chunk's tokens right (the rest: {FILLS[res['fill']]})")
    ax.set_ylabel("relative distance to the chunk's pooled state" + (f" (whitened, {res['whiten']:g})"
                                                                      if res.get("whiten") else ""))
    ax.set_title(f"{res['model']}, {res['states']} state: the landscape a search climbs", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
