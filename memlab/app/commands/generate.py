"""memlab generate --run RUN --prompt TEXT: continue text with a trained model.

Families can provide their own generation (SONAR-LLM generates sentence by
sentence) by registering a function in ``memlab.registry.GENERATORS`` under
their family name; causal token LMs use transformers' ``generate``
(:func:`memlab.generation.causal_generate`: a prompt longer than the window
minus ``--max-new-tokens`` is cut from the left).
"""

from __future__ import annotations

from memlab.app.commands import check_device, fraction, non_negative_int, positive_float, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a trained run's model")
    p.add_argument("--run", required=True, help="run directory or saved model folder")
    p.add_argument("--prompt", required=True, action="append", help="prompt text (repeat for several)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=positive_float, default=1.0, help="with --sample: softmax temperature, > 0")
    p.add_argument("--top-p", type=fraction, default=1.0, help="with --sample: nucleus share, in (0, 1]")
    p.add_argument("--num-beams", type=positive_int, default=1,
                   help="beam search with this many beams (sentence models: in the space's decoder; 1: greedy)")
    p.add_argument("--max-sentences", type=positive_int, default=8, help="sentence models: stop after this many sentences")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--device", default="auto",
                   help="where the models run: auto (the best present: CUDA, MPS, else CPU), cpu, cuda, cuda:N, mps")
    p.set_defaults(func=run)


def check(args) -> None:
    """Flags that do nothing, refused before anything is imported."""
    from memlab.errors import MemlabError

    check_device(args.device)
    if any(not p.strip() for p in args.prompt):
        raise MemlabError("a prompt must hold some text")
    if not args.sample:
        changed = [f for f, v in (("--temperature", args.temperature), ("--top-p", args.top_p)) if v != 1.0]
        if changed:
            raise MemlabError(f"{changed[0]} applies to sampling; add --sample (greedy and beam decoding ignore it)")


def run(args) -> int:
    import torch

    from memlab.devices import resolve_device, running_on
    from memlab.generation import GenerationOptions
    from memlab.loading import family_of, resolve_model_dir
    from memlab.registry import GENERATORS

    device = resolve_device(args.device)  # an absent device: one error before anything is loaded
    opts = GenerationOptions(max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                             top_p=args.top_p, num_beams=args.num_beams, max_sentences=args.max_sentences)
    d = resolve_model_dir(args.run)
    torch.manual_seed(args.seed)
    family = family_of(d)
    with running_on(device):
        if family in GENERATORS:
            for text in GENERATORS.get(family)(d, args.prompt, opts):
                print(text)
            return 0
        for prompt, text in zip(args.prompt, causal_continuations(d, args.prompt, opts)):
            print(f"{prompt}{text}")
    return 0


def causal_continuations(model_dir, prompts: list[str], opts) -> list[str]:
    """Continue prompts with a causal token LM saved with its tokenizer (an over-long prompt is cut from
    the left: :func:`memlab.generation.fit_prompt`)."""
    from memlab.generation import causal_generate
    from memlab.loading import load_pretrained, load_run_tokenizer

    return causal_generate(load_pretrained(model_dir), load_run_tokenizer(model_dir), prompts, opts)
