"""memlab generate --run RUN --prompt TEXT: continue text with a trained model.

Families can provide their own generation (SONAR-LLM generates sentence by
sentence) by registering a function in ``memlab.registry.GENERATORS`` under
their family name; causal token LMs use transformers' ``generate``.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a trained run's model")
    p.add_argument("--run", required=True, help="run directory or saved model folder")
    p.add_argument("--prompt", required=True, action="append", help="prompt text (repeat for several)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--num-beams", type=int, default=1,
                   help="beam search with this many beams (sentence models: in the space's decoder; 1: greedy)")
    p.add_argument("--max-sentences", type=int, default=8, help="sentence models: stop after this many sentences")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from memlab.errors import MemlabError
    from memlab.loading import family_of, resolve_model_dir
    from memlab.registry import GENERATORS

    if args.max_new_tokens < 1 or args.num_beams < 1 or args.max_sentences < 1:
        raise MemlabError("--max-new-tokens, --num-beams and --max-sentences must be >= 1")
    if args.sample and args.temperature <= 0:
        raise MemlabError("--temperature must be > 0 when sampling")
    if not 0 < args.top_p <= 1:
        raise MemlabError("--top-p must be in (0, 1]")
    d = resolve_model_dir(args.run)
    from memlab.train.checkpoint import check_finite_files

    check_finite_files(d)  # a diverged (NaN) model is refused, not run to print the prompt alone
    torch.manual_seed(args.seed)
    family = family_of(d)
    if any(not p.strip() for p in args.prompt):
        raise MemlabError("a prompt must hold some text")
    gen = GENERATORS.get(family) if family in GENERATORS else causal_generate
    for prompt, text in zip(args.prompt, gen(d, args.prompt, args)):
        print(f"{prompt}{text}" if gen is causal_generate else text)
    return 0


def causal_generate(model_dir, prompts: list[str], args) -> list[str]:
    """Continue prompts with a causal token LM saved with its tokenizer."""
    import torch

    from memlab.errors import MemlabError
    from memlab.loading import load_pretrained, load_run_tokenizer

    model = load_pretrained(model_dir).eval()
    tok = load_run_tokenizer(model_dir)
    outs = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and ids.shape[1] + args.max_new_tokens > limit:
            raise MemlabError(f"prompt ({ids.shape[1]} tokens) + --max-new-tokens {args.max_new_tokens} exceed the model's "
                              f"{limit} positions")
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                                 temperature=args.temperature, top_p=args.top_p, num_beams=args.num_beams,
                                 pad_token_id=tok.pad_token_id)
        outs.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return outs
