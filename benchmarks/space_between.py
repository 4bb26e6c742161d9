"""How a sentence space decodes points between sentences: the token CE of rebuilding held-out sentences from

* ``true``: their own embeddings;
* ``noise_0.5`` / ``noise_1``: their embeddings plus Gaussian noise of 0.5 / 1 times each vector's RMS;
* ``half_other``: the midpoint between the sentence's embedding and another sentence's;
* ``other``: another sentence's embedding (a wrong guess);
* ``centroid``: the mean embedding of the set (where a next-embedding model starts, and where the
  mean-squared-error optimum lies when it knows nothing);

beside ``unigram``, the CE of the set's own token frequencies (a decoder that hedges completely). A
model that learns *through* the decoder (SONAR-LLM) needs the centroid and the midpoints near or below
``unigram``: above it, a vague prediction decodes to confident wrong tokens. Also prints the greedy
decoding of the centroid and of one midpoint.

    python benchmarks/space_between.py runs/sentence-ae runs/sentence-ae-copy [--n 512] [--out FILE]

Sentences: the validation split of the Austen sentence documents (configs/sonar_llm/austen_memory_ae.yaml's
data and windowing), end sentences left out. Each run is loaded as the ``memory_ae`` space.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]


def measure(space, sentences: list[str], seed: int = 0) -> dict:
    import torch

    from memlab.space import reconstruction_loss, tokenize

    g = torch.Generator().manual_seed(seed)
    ids, mask = tokenize(space, sentences, getattr(space, "max_tokens", None))
    with torch.no_grad():
        z = space.encode(ids, mask)  # (N, D) or (N, K, D)
        rms = z.pow(2).mean(-1, keepdim=True).sqrt()
        other = z[torch.randperm(z.shape[0], generator=g)]
        noise = torch.randn(z.shape, generator=g)
        points = {"true": z, "noise_0.5": z + 0.5 * rms * noise, "noise_1": z + rms * noise,
                  "half_other": 0.5 * (z + other), "other": other, "centroid": z.mean(0, keepdim=True).expand_as(z)}
        out = {k: round(reconstruction_loss(space, v, ids, mask).item(), 3) for k, v in points.items()}
        _, labels = space.decoder_inputs(ids, mask)
        lab = labels[labels != -100]
        counts = torch.bincount(lab, minlength=int(lab.max()) + 1).float()
        p = counts / counts.sum()
        out["unigram"] = round(-(p[lab].log()).mean().item(), 3)
        out["decoded_centroid"] = space.generate(z.mean(0, keepdim=True))[0]
        out["decoded_midpoint"] = {"a": sentences[0], "b": sentences[1], "decoded": space.generate(0.5 * (z[:1] + z[1:2]))[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    from memlab.errors import MemlabError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="memory sentence-autoencoder runs (or saved models)")
    ap.add_argument("--n", type=int, default=512, help="held-out sentences")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    try:
        from memlab.config import load_config
        from memlab.models.sentence.recipe import corpus_documents
        from memlab.registry import SPACES, load_plugins

        load_plugins()
        cfg = load_config(ROOT / "configs" / "sonar_llm" / "austen_memory_ae.yaml")
        docs, _ = corpus_documents(cfg, cfg.options)
        end = cfg.options.end_sentence
        sentences = [s for d in docs["validation"] for s in d if s != end][: args.n]
        results = {run: measure(SPACES.get("memory_ae")(run), sentences, args.seed) for run in args.runs}
    except MemlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps({"sentences": len(sentences), "results": results}, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
