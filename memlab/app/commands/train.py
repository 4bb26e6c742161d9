"""memlab train CONFIG [key=value ...]: train an experiment into a run directory."""

from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train an experiment from a YAML config",
                       description="Train an experiment from a YAML config into a run directory "
                                   "(config.yaml, metrics.jsonl, summary.json, checkpoints/, plots/).")
    p.add_argument("config", nargs="?", help="YAML experiment (configs/...); optional with --resume")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4 data.seq_len=64")
    p.add_argument("--out", help="run directory (default runs/NAME-TIMESTAMP); must be new or empty")
    p.add_argument("--resume", metavar="RUN", help="continue RUN from its latest checkpoint (exactly)")
    p.add_argument("--restart", action="store_true",
                   help="with --resume: train RUN again from step 0 when it has no checkpoint left "
                        "(its metrics.jsonl and summary.json are replaced); never done without this flag")
    p.set_defaults(func=run)


def check(args) -> None:
    """What to train, checked before anything is imported."""
    from memlab.errors import ConfigError

    if args.resume:
        if args.config and "=" not in args.config:
            raise ConfigError("with --resume the config is the run's own config.yaml; pass only overrides")
        if args.out:
            raise ConfigError("with --resume the run is written where it is; --out applies to a new run")
    else:
        if not args.config:
            raise ConfigError("give a config file (e.g. configs/token_lm/toy.yaml) or --resume RUN")
        if args.restart:
            raise ConfigError("--restart applies to --resume RUN (a run to train again from step 0)")


def run(args) -> int:
    from memlab.config import load_config
    from memlab.errors import ConfigError
    from memlab.train.experiment import run_experiment

    overrides = list(args.overrides)
    if args.resume:
        run_dir = Path(args.resume)
        if args.config and "=" in args.config:  # `train --resume RUN key=value`
            overrides.insert(0, args.config)
        elif args.config:
            raise ConfigError("with --resume the config is the run's own config.yaml; pass only overrides")
        from memlab.train.experiment import check_resumable, check_resume_overrides

        check_resume_overrides(overrides)
        check_resumable(run_dir)  # a missing folder or one still being set up by another run, named as such
        cfg = load_config(run_dir / "config.yaml", overrides)
        summary = run_experiment(cfg, run_dir, resume=True, restart=args.restart)
    else:
        if not args.config:
            raise ConfigError("give a config file (e.g. configs/token_lm/toy.yaml) or --resume RUN")
        if args.restart:
            raise ConfigError("--restart applies to --resume RUN (a run to train again from step 0)")
        cfg = load_config(args.config, overrides)
        summary = run_experiment(cfg, Path(args.out) if args.out else None)
    from accelerate import PartialState

    if not PartialState().is_main_process:
        return 0
    ev = summary.get("eval") or {}
    shown = ", ".join(f"{k}={v:.4g}" for k, v in ev.items() if isinstance(v, (int, float)))
    print(f"run: {summary['run_dir']}  steps: {summary['steps']}  eval: {shown or 'none'}")
    print(json.dumps({k: summary[k] for k in ("tokens_per_s", "mfu") if k in summary}))
    return 0
