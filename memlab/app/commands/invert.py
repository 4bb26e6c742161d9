"""memlab invert --model NAME --layer L --states positions|last|mean: recover the input from a model's states.

argparse only at import time: the flags are read as text and checked (types, ranges) before anything heavy is
imported; :func:`memlab.probes.invert.run.run_invert` does the work.
"""

from __future__ import annotations

import argparse

STATES = ("positions", "last", "mean")
"""What the states are: one per position (a causal model's hidden state at every position of the chunk), or one
pooled state per chunk (the last position's state, or the mean over positions)."""

POOLED_ONLY = ("--forwards", "--seconds", "--topk", "--restarts", "--prior-weight", "--init", "--no-control")
POSITIONS_ONLY = ("--budget", "--exhaustive-batch", "--tol", "--min-gap", "--accept-gap", "--cache-dir",
                  "--no-exhaustive", "--no-relinearize")

# flag -> (type, least value or None, default, help)
NUMBERS = {
    "--layer": (int, None, None, "hidden state: 0 = embeddings, k = output of block k-1, negative from the end "
                                 "(the probe's numbering); required"),
    "--seq-len": (int, 2, 16, "words per chunk (chunk_by=words, as memlab probe cuts them) or tokens (chunk_by=tokens)"),
    "--n": (int, 1, 16, "chunks inverted: the first N of the probe's held-out chunks"),
    "--n-eval": (int, 1, 256, "held-out chunks the probe draws (memlab probe's n_eval); the N inverted are the first "
                              "of them, so both instruments read the same chunks"),
    "--seed": (int, None, 0, "seed of the chunk draw (memlab probe's seed)"),
    "--batch-size": (int, 1, 64, "ranked candidates verified per batch (positions); token swaps evaluated per step "
                                 "(last, mean)"),
    "--forwards": (int, 1, 2048, "last/mean: candidate sequences evaluated per chunk (the compute budget)"),
    "--seconds": (float, 0.0, None, "last/mean: wall-time budget per chunk in seconds (unset: none)"),
    "--topk": (int, 1, 64, "last/mean: tokens per position kept from the gradient ranking"),
    "--restarts": (int, 1, 2, "last/mean: searches from different starts sharing the budget"),
    "--prior-weight": (float, 0.0, 0.0, "last/mean: weight of the model's mean next-token NLL (nats per token) in "
                                        "the objective (causal models)"),
    "--budget": (int, 1, 2048, "ranked candidates tried at a position before the exhaustive search"),
    "--exhaustive-batch": (int, 1, 512, "candidates per batch of the exhaustive search"),
    "--tol": (float, 0.0, 1e-3, "relative distance |h - h*| / |h*| within which a candidate matches"),
    "--min-gap": (float, 1.0, 2.0, "least ratio of the runner-up's distance to the best one's for a certificate"),
    "--accept-gap": (float, 1.0, 10.0, "accept a best candidate outside --tol without the exhaustive search when "
                                       "every other verified one is this many times farther (inf: never)"),
    "--noise": (float, 0.0, 0.0, "Gaussian noise added to each observed state, its norm this share of the state's"),
    "--threads": (int, 1, None, "torch CPU threads (unset: torch's)"),
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "invert", help="white-box inversion: recover the input exactly from a causal model's per-position states",
        description="Recover held-out chunks token by token from a causal model's states at one layer, with the "
                    "model's own weights and no training: rank candidates by the gradient of the distance, verify "
                    "them through the blocks up to the layer with the prefix's key-value cache, search the whole "
                    "vocabulary when no ranked candidate matches. With --states last or mean, search the token "
                    "sequence whose pooled state matches by gradient-guided token swaps within a budget, beside a control search "
                    "from another chunk's state. Writes report.json into --out and prints a summary.")
    p.add_argument("--model", help="causal model: shortcut (smollm2, memlab-lm), local folder/run, FILE.gguf or hub "
                                   "name")
    p.add_argument("--states", default=None,
                   help="which states are inverted: positions (every position's state at the layer, a causal "
                        "model; default), last (the last position's state) or mean (the mean over positions; for "
                        "bidirectional encoders, last and mean are the settings that apply); with --probe, the "
                        "probe's pooling unless positions is given")
    p.add_argument("--probe", default=None, metavar="RUN",
                   help="a trained probe's run folder (memlab probe --out RUN): invert the first --n of its held-out "
                        "chunks with its model, layer and pooling, read the same chunks with its saved decoder (and "
                        "its control, when the run kept one in its --cache-dir), and report both instruments in one "
                        "table; a flag that contradicts the run is refused")
    p.add_argument("--init", default=None,
                   help="last/mean: first start of the search: greedy (the model's own text; default), sample, or "
                        "random (bidirectional models: random)")
    p.add_argument("--no-control", action="store_true",
                   help="last/mean: skip the control search (from the next chunk's pooled state)")
    p.add_argument("--states-from", default=None,
                   help="take the states from this model instead (same tokenizer and width): other weights, e.g. a "
                        "float copy of a quantised model; the certificate then shows the mismatch")
    for flag, (_, _, default, hlp) in NUMBERS.items():
        p.add_argument(flag, default=None, help=hlp + (f" (default {default})" if default is not None else ""))
    p.add_argument("--chunk-by", default=None, help="words (default, the probe's) or tokens")
    p.add_argument("--corpus", default=None, help="corpus of the held-out text (default austen)")
    p.add_argument("--eval-split", default=None, help="test (default) or validation")
    p.add_argument("--no-exhaustive", action="store_true",
                   help="never search the whole vocabulary: keep the best ranked candidate (uncertified)")
    p.add_argument("--no-relinearize", action="store_true",
                   help="rank once at the mean embedding instead of re-ranking from the best verified token")
    p.add_argument("--cache-dir", default=None,
                   help="keep the first-position states of every token here (keyed by the weights, layer and prefix) "
                        "and reuse them: later runs skip the first position's pass over the vocabulary")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    p.add_argument("--progress", action="store_true", help="progress bar even when not on a TTY")
    p.add_argument("--out", help="run directory (default runs/invert-MODEL-TIMESTAMP); must be new or empty")
    p.set_defaults(func=run)


def _number(flag: str, text: str | None):
    """A flag's value, typed and range-checked, or its default; a bad one is one ConfigError line."""
    from memlab.errors import ConfigError

    tp, least, default, _ = NUMBERS[flag]
    if text is None:
        return default
    try:
        value = tp(text)
    except ValueError:
        kind = "an integer" if tp is int else "a number"
        raise ConfigError(f"{flag} takes {kind}, got {text!r}") from None
    if tp is float and value != value:
        raise ConfigError(f"{flag} takes a number, got {text!r}")
    if least is not None and value < least:
        raise ConfigError(f"{flag} must be >= {least}, got {text}")
    return value


def options(args: argparse.Namespace) -> dict:
    """The flags as checked values (no heavy import): one ConfigError line for the first bad one."""
    from memlab.errors import ConfigError

    vals = {flag[2:].replace("-", "_"): _number(flag, getattr(args, flag[2:].replace("-", "_")))
            for flag in NUMBERS}
    given = {k for k in (*vals, "model", "states", "chunk_by", "corpus", "eval_split")
             if getattr(args, k, None) is not None}
    if args.states is not None and args.states not in STATES:
        raise ConfigError(f"--states takes positions, last or mean, got {args.states!r}")
    vals.update(model=args.model, states=args.states or "positions", chunk_by=args.chunk_by or "words",
                corpus=args.corpus or "austen", eval_split=args.eval_split or "test", probe=args.probe)
    if args.probe is not None:  # the run's model, layer, pooling and chunks (JSON only: no torch yet)
        from memlab.probes.invert.probe_run import read_probe_run, reconcile

        vals = reconcile(vals, given, read_probe_run(args.probe))
        for flag, value in (("--states-from", args.states_from), ("--noise", vals["noise"])):
            if value:
                raise ConfigError(f"{flag} does not go with --probe: the table reads both instruments on the "
                                  "states the probe read")
    if not vals["model"]:
        raise ConfigError("give --model NAME_OR_PATH (a causal model), or --probe RUN")
    if vals["layer"] is None:
        raise ConfigError("give --layer L (0 = embeddings, k = output of block k-1, negative from the end)")
    pooled = vals["states"] != "positions"
    for flag in POSITIONS_ONLY if pooled else POOLED_ONLY:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value not in (None, False):
            raise ConfigError(f"{flag} applies to --states {'positions' if pooled else 'last or mean'}, not to "
                              f"--states {vals['states']}")
    init = args.init or "greedy"
    if init not in ("greedy", "sample", "random"):
        raise ConfigError(f"--init takes greedy, sample or random, got {args.init!r}")
    if vals["chunk_by"] not in ("words", "tokens"):
        raise ConfigError(f"--chunk-by takes words or tokens, got {vals['chunk_by']!r}")
    if vals["eval_split"] not in ("test", "validation"):
        raise ConfigError(f"--eval-split takes test or validation, got {vals['eval_split']!r}")
    if vals["n"] > vals["n_eval"]:
        raise ConfigError(f"--n {vals['n']} is more than the --n-eval {vals['n_eval']} chunks it is drawn from")
    vals.update(states_from=args.states_from, exhaustive=not args.no_exhaustive,
                relinearize=not args.no_relinearize, init=init, control=not args.no_control,
                device=args.device, cache_dir=args.cache_dir,
                progress=args.progress or None)
    return vals


def check(args: argparse.Namespace) -> None:
    """Every flag checked while the arguments are read, before torch is imported (memlab.app.cli)."""
    options(args)


def run(args) -> int:
    import time
    from pathlib import Path

    vals = options(args)  # every flag checked before torch is imported
    from memlab.probes.invert.run import run_invert
    from memlab.rundir import safe_name

    out = Path(args.out) if args.out else Path("runs") / (
        f"invert-{safe_name(Path(vals['model']).name or vals['model'])}-{time.strftime('%Y%m%d-%H%M%S')}")
    report, lines = run_invert(vals, out)
    for line in lines:
        print(line)
    print(f"run: {out}")
    return 0
