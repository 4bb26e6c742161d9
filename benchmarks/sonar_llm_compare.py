"""Next-sentence generation on held-out documents: SONAR-LLM vs LCM-MSE vs LCM diffusion (vs a token LM).

For every held-out document (the test split of the first sentence run's data config, cut into the
same windows), each position ``i >= 1`` that is not the end sentence gives a prompt (the up to
``--context`` sentences before it) and a reference (sentence ``i``). Every model continues every
prompt with ONE sentence, greedily (``--num-beams K``: beam search, ``--sample``: nucleus sampling,
in the space's decoder and in the token LM alike): the sentence models predict an embedding and
decode it with the space's decoder (an empty string when they predict the end sentence); the token
LM continues the prompt text and its first Punkt sentence is kept. Scores: ``memlab.metrics``
(corpus BLEU with sacrebleu, sentence BLEU, ROUGE-L F1, METEOR with WordNet when installed).

    python benchmarks/sonar_llm_compare.py --run sonar_llm=runs/sl --run lcm_mse=runs/mse \\
        --run lcm_diffusion=runs/diff --token-lm runs/lm --prompts 300 --out results.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch


def heldout_pairs(run: str | Path, split: str, context: int, n: int, seed: int) -> list[tuple[list[str], str]]:
    """(prompt sentences, reference sentence) pairs from a run's own data config, split and windows."""
    from memlab.config import load_config
    from memlab.models.sentence.recipe import corpus_documents
    from memlab.registry import load_plugins

    load_plugins()  # the sentence families and their recipes

    cfg = load_config(Path(run) / "config.yaml")
    docs, _ = corpus_documents(cfg, cfg.options)
    if split not in docs:
        raise SystemExit(f"split '{split}' is empty for {run}")
    pairs = [(d[max(0, i - context): i], d[i]) for d in docs[split] for i in range(1, len(d) - 1)]
    random.Random(seed).shuffle(pairs)
    return pairs[:n]


def sentence_model_outputs(run: str, prompts: list[list[str]], max_new_tokens: int, batch: int, seed: int,
                           **search) -> list[str]:
    from memlab.models.sentence.generation import generate_sentences, load_sentence_model

    model, handle = load_sentence_model(run)
    torch.manual_seed(seed)
    out: list[str] = []
    for a in range(0, len(prompts), batch):
        gen = generate_sentences(model, handle, prompts[a : a + batch], max_sentences=1, max_new_tokens=max_new_tokens,
                                 **search)
        out.extend(g[0] if g else "" for g in gen)
    return out


@torch.no_grad()
def token_lm_outputs(run: str, prompts: list[list[str]], max_new_tokens: int, **search) -> list[str]:
    from memlab.data.views import split_sentences
    from memlab.loading import load_pretrained, load_run_tokenizer

    model = load_pretrained(run).eval()
    tok = load_run_tokenizer(run)
    out = []
    max_ctx = getattr(model.config, "max_position_embeddings", 512) - max_new_tokens
    for p in prompts:
        ids = tok(" ".join(p) + " ", return_tensors="pt", add_special_tokens=False)["input_ids"][:, -max_ctx:]
        gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                             **search)
        text = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
        sents = split_sentences(text)
        out.append(sents[0] if sents else "")
    return out


def score(hyps: list[str], refs: list[str]) -> dict[str, float]:
    from memlab.metrics import text_metrics

    m = text_metrics(hyps, refs)
    m["empty"] = sum(not h.strip() for h in hyps) / len(hyps)
    return m


def fit_space(out_dir: str, steps: int, dim: int, seed: int) -> int:
    """Fallback space when no memory autoencoder is trained: a ``toy_ae`` fitted on the Austen training
    sentences (default data config: chapters, seed 0; the 4096-BPE of the token LM), saved to ``out_dir``."""
    from memlab.config import DataConfig, load_config
    from memlab.data.views import prepare_corpus
    from memlab.models.sentence.recipe import corpus_documents
    from memlab.models.sentence.toy_space import ToySentenceAE, fit_toy_space, save_toy_space

    corpus = prepare_corpus(DataConfig())  # the 4096-BPE of the token LM (cached)
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs/sonar_llm/austen_memory_ae.yaml")
    docs, _ = corpus_documents(cfg, cfg.options)  # the same training sentences (Punkt output is cached)
    sentences = sorted({s for d in docs["train"] for s in d})
    torch.manual_seed(seed)
    space = ToySentenceAE(corpus.tokenizer, dim=dim, width=dim, layers=2, heads=4, max_len=48)
    t0 = time.perf_counter()
    losses = fit_toy_space(space, sentences, steps=steps, batch_size=64, lr=2e-3, seed=seed, log_every=50)
    save_toy_space(space, out_dir)
    print(f"fitted toy_ae on {len(sentences)} sentences, {steps} steps, {time.perf_counter() - t0:.0f}s: "
          f"loss {losses[0]:.3f} -> {sum(losses[-20:]) / 20:.3f}; spec toy_ae:{Path(out_dir).resolve()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", default=[], metavar="NAME=RUN", help="a sentence-model run (repeat)")
    ap.add_argument("--token-lm", help="a token LM run (recipe lm) to compare with")
    ap.add_argument("--split", default="test")
    ap.add_argument("--context", type=int, default=4, help="prompt sentences before the target")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams (1: greedy)")
    ap.add_argument("--length-penalty", type=float, default=1.0, help="beam scores: sum log p / length ** this")
    ap.add_argument("--sample", action="store_true", help="sample the tokens (nucleus sampling, seeded by --seed)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--examples", type=int, default=3, help="example generations to print")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--fit-toy-space", metavar="DIR", help="only fit the fallback toy_ae space on Austen into DIR")
    ap.add_argument("--fit-steps", type=int, default=600)
    ap.add_argument("--fit-dim", type=int, default=128)
    args = ap.parse_args(argv)
    if args.fit_toy_space:
        return fit_space(args.fit_toy_space, args.fit_steps, args.fit_dim, args.seed)
    runs = dict(r.split("=", 1) for r in args.run)
    if not runs:
        ap.error("give at least one --run NAME=RUN")
    pairs = heldout_pairs(next(iter(runs.values())), args.split, args.context, args.prompts, args.seed)
    prompts, refs = [p for p, _ in pairs], [r for _, r in pairs]
    results, outputs = {}, {}
    if args.sample and args.num_beams > 1:
        ap.error("choose --sample or --num-beams, not both")
    search = {"num_beams": args.num_beams, "length_penalty": args.length_penalty} if args.num_beams > 1 else {}
    if args.sample:
        search = {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p}
    for name, run in runs.items():
        t0 = time.perf_counter()
        outputs[name] = sentence_model_outputs(run, prompts, args.max_new_tokens, args.batch, args.seed, **search)
        results[name] = dict(score(outputs[name], refs), seconds=time.perf_counter() - t0, run=run)
    if args.token_lm:
        t0 = time.perf_counter()
        torch.manual_seed(args.seed)
        outputs["token_lm"] = token_lm_outputs(args.token_lm, prompts, args.max_new_tokens, **search)
        results["token_lm"] = dict(score(outputs["token_lm"], refs), seconds=time.perf_counter() - t0, run=args.token_lm)
    keys = [k for k in ("bleu", "sentence_bleu", "rouge_l", "meteor", "empty") if any(k in r for r in results.values())]
    how = (f"beam search, {args.num_beams} beams" if args.num_beams > 1 else
           f"sampling, temperature {args.temperature}, top-p {args.top_p}" if args.sample else "greedy")
    print(f"{len(pairs)} held-out next-sentence prompts ({args.split} split, context {args.context} sentences, {how})")
    print(f"{'model':<16}" + "".join(f"{k:>15}" for k in keys))
    for name, r in results.items():
        print(f"{name:<16}" + "".join(f"{r.get(k, float('nan')):>15.4f}" for k in keys))
    for i in range(min(args.examples, len(pairs))):
        print(f"\nprompt: {' '.join(prompts[i])[-200:]}\nref:    {refs[i]}")
        for name in outputs:
            print(f"{name + ':':<15} {outputs[name][i]}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, "examples": [
            {"prompt": prompts[i], "reference": refs[i], **{n: o[i] for n, o in outputs.items()}}
            for i in range(min(20, len(pairs)))]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
