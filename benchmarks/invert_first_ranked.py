"""The first position of a model without a BOS: the ranked rounds shared by the chunks against the full table.

For each kind of chunk (cut by words or by tokens from the test split of ``--corpus``, or random tokens), the first
states of ``--n`` chunks at ``--layer`` are searched by :func:`memlab.probes.invert.positions.firstranked.first_ranked`
(the model's prior of first tokens and the secant order) and, with ``--table``, by one pass over the vocabulary;
prints the tokens right, each chunk's verified candidates, the states computed and the time (and GFLOP-equivalents
at the fp32 matmul rate measured in the same process)::

    python benchmarks/invert_first_ranked.py --model smollm2 --layer 15 --n 16 --threads 1 --table
"""
import argparse
import time

import torch
ap = argparse.ArgumentParser()
ap.add_argument("--layer", type=int, default=15)
ap.add_argument("--model", default="smollm2")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--n", type=int, default=8)
ap.add_argument("--table", action="store_true", help="also the full table, to compare")
ap.add_argument("--kinds", default="words,tokens,random")
ap.add_argument("--corpus", default="austen")
a = ap.parse_args()
torch.set_num_threads(a.threads)
from memlab.probes.invert.start import load, machine_facts
from memlab.probes.invert.positions.searcher import Searcher
from memlab.probes.invert.positions.rank import NextTokenHead
from memlab.probes.invert.head import own_head
from memlab.probes.invert.positions.firstranked import first_prior, first_ranked
from memlab.probes.chunks.cut import probe_chunks, probe_texts
mf = machine_facts()
print("machine", mf, flush=True)
enc, rd = load(a.model, a.layer, "cpu")
tok, V = enc.tokenizer, rd.vocab_size
S = Searcher(rd)
t = time.time()
head = NextTokenHead.of(rd, own_head(a.model, rd))
prior = first_prior(head, tok, V)
tp = time.time() - t
print(f"prior {tp:.1f} s", flush=True)
sets = {}
if "words" in a.kinds:
    sets["words"] = [tok(x, add_special_tokens=False)["input_ids"][:16]
                     for x in probe_texts(16, a.n, "test", corpus=a.corpus)]
if "tokens" in a.kinds:
    sets["tokens"] = probe_chunks(tok, 16, a.n, "test", corpus=a.corpus).tolist()
if "random" in a.kinds:
    sets["random"] = torch.randint(0, V, (a.n, 16), generator=torch.Generator().manual_seed(5)).tolist()
for name, seqs in sets.items():
    with torch.no_grad():
        tg = torch.stack([rd.full_states(torch.tensor([s]))[0, 0].cpu() for s in seqs])
    tot = [0]
    t = time.time()
    got = first_ranked(S, [], tg, prior, on_batch=lambda k: tot.__setitem__(0, tot[0] + k))
    dt = time.time() - t
    ok = sum(p.token == s[0] for p, s in zip(got, seqs))
    print(f"{name}: {ok}/{len(seqs)} right, certificates {[p.certificate for p in got]}, verified per chunk "
          f"{[p.tried for p in got]}, states computed {tot[0]} of {V} ({tot[0] / V:.3f}), {dt:.1f} s = "
          f"{dt * mf['matmul_gflops']:.0f} GFLOP-eq", flush=True)
    if a.table:
        t = time.time()
        ref = S.first_positions([], tg)
        dt2 = time.time() - t
        same = sum(p.token == q.token and p.certificate == q.certificate for p, q in zip(got, ref))
        print(f"   table: {dt2:.1f} s = {dt2 * mf['matmul_gflops']:.0f} GFLOP-eq, same token and certificate "
              f"{same}/{len(seqs)}", flush=True)
