"""What the relaxation's logarithm buys: chunks certified with the loss as ``memlab invert`` descends it (the
logarithm of the divergence) against the divergence itself, on a tiny random Llama (the test suite's shape), for
the last-token state, the mean pool and the next-token distribution.

    python benchmarks/invert_relax_loss.py --seeds 5 6 --chunks 6 --steps 600

Prints one row per target: certified chunks of ``len(seeds) x chunks`` with each loss, and the steps they took
(a certified chunk leaves the batch, so fewer steps is faster).
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoConfig, AutoModel


def main(argv=None) -> None:
    from memlab.probes.invert.layer import LayerReader
    from memlab.probes.invert.options import PooledOptions
    from memlab.probes.invert.pooled.relax import RelaxJob, Relaxer, RelaxOptions
    from memlab.probes.invert.pooled.searcher import LanguageHead, PooledSearcher

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[5, 6])
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--length", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=args.vocab, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               tie_word_embeddings=True)
    model = AutoModel.from_config(cfg).eval()

    class Plain(Relaxer):
        def _loss(self, z, t):
            return self._divergence(z, t)

    print("| target | loss | certified | steps |\n|---|---|---|---|")
    for pool in ("last", "mean", "logits"):
        for name, cls in (("log of the divergence (memlab)", Relaxer), ("the divergence", Plain)):
            hit = steps = total = 0
            for seed in args.seeds:
                reader = LayerReader(model, 2)
                s = PooledSearcher(reader, pool, PooledOptions(), LanguageHead.of(reader))
                seqs = torch.randint(0, args.vocab, (args.chunks, args.length),
                                     generator=torch.Generator().manual_seed(seed))
                targets = s.pooled(seqs)
                out = cls(s, RelaxOptions(steps=args.steps, rows=4, loss="log")).run(
                    [RelaxJob(targets[i], args.length, i) for i in range(args.chunks)], 1e9)
                hit += sum(o.certified and o.ids == seqs[i].tolist() for i, o in enumerate(out))
                steps += sum(o.steps for o in out)
                total += args.chunks
            print(f"| {pool} | {name} | {hit}/{total} | {steps} |", flush=True)


if __name__ == "__main__":
    main()
