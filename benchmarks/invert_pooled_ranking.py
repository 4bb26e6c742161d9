"""How far down each ranking puts the true token when one token of a chunk is wrong: the gradient's (first-order
change through every block, as the correction's swaps are ranked) and the token table's (every token's pooled
state alone, the change a swap makes estimated from the two tokens' states).

    python benchmarks/invert_pooled_ranking.py --n 3 --trials 4

MiniLM's mean pool at layer 6 of 16-word chunks of ``--corpus``; per trial a random position of a chunk takes a
random word-piece, and the rank (0: first of the vocabulary) of the true token at that position is printed for
both rankings, with the relative distance the one wrong token makes.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--corpus", default="/tmp/corpus/britannica-shakespeare.txt")
    args = p.parse_args(argv)
    import torch

    from memlab.probes.invert.options import InvertOptions, PooledOptions
    from memlab.probes.invert.pooled.searcher import PooledSearcher
    from memlab.probes.invert.start import setup

    torch.set_num_threads(1)
    o = InvertOptions()
    o.model.model, o.model.layer, o.model.states, o.model.threads = "minilm", 6, "mean", 1
    o.text.corpus, o.text.seq_len, o.text.n = args.corpus, 16, args.n
    _, enc, reader, _, chunks, _ = setup(o)
    s = PooledSearcher(reader, "mean", PooledOptions(), None, list(enc.prefix), list(getattr(enc, "suffix", [])))
    gen = torch.Generator().manual_seed(0)
    for i, ids in enumerate(chunks):
        true = torch.tensor(ids)
        z = s.pooled(true[None])[0]
        for _ in range(args.trials):
            wrong = true.clone()
            t = int(torch.randint(0, len(wrong), (1,), generator=gen))
            wrong[t] = int(torch.randint(2000, reader.vocab_size, (1,), generator=gen))
            d = float(s.objective(wrong[None], z)[1][0])
            ranks = []
            for sc in (s.scores(wrong, z)[t], s.table_scores(wrong, z)[t]):
                ranks.append(int((sc < sc[true[t]]).sum()))
            word = enc.tokenizer.convert_ids_to_tokens([int(true[t])])[0]
            print(f"chunk {i} position {t} {word!r}: distance {d:.3f}, true token's rank: gradient {ranks[0]}, "
                  f"table {ranks[1]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
