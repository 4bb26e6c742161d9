"""memlab probe --model NAME_OR_PATH [--layer -1 --pool last --seq-len 32 ...]: an inversion probe.

The parser is built from the option dataclasses (the sections and the built-in parts' options of
:mod:`memlab.probes.sections`), one argument group per section and per part, and imports neither torch nor
transformers: ``memlab probe --help`` and a malformed flag answer at once.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, fields
from pathlib import Path

from memlab.app.commands import check_threads
from memlab.probes.options import docs
from memlab.probes.sections import PART_OPTIONS, SECTIONS, ReadoutSection

FLAGS = {  # flag -> (option, type, help): the hand-written flags; every other option gets --its-name
    "--layer": ("layer", int, "hidden state: 0 = embeddings, k = block k-1 output, negative from the end"),
    "--pool": ("pool", str, "a registered pooling: last, second_last, mean or first (unset: the shortcut's, else last)"),
    "--seq-len": ("seq_len", str, "words per chunk (with chunk_by=tokens: tokens of the model's tokenizer); a comma "
                                  "list (8,16,32,64,128) fits each length on one model load and writes the "
                                  "retention-against-length curve"),
    "--n-train": ("n_train", str, "training chunks; a comma list (1000,4000,16000) fits each size on one encoder pass "
                                  "and writes the learning curve"),
    "--n-eval": ("n_eval", int, "held-out chunks (all there are, with a warning, when the split holds fewer)"),
    "--epochs": ("epochs", float, "most decoder epochs over the cached embeddings, > 0 (early stopping: patience)"),
    "--batch-size": ("batch_size", int, "decoder batch size"),
    "--lr": ("lr", float, "decoder learning rate, > 0"),
    "--conditioning": ("conditioning", str, "unrolled (added per position) or prefix (memory prefix)"),
    "--inputs": ("inputs", str, "decoder token inputs: teacher (true previous tokens) or blank (blank copy)"),
    "--val-fraction": ("val_fraction", float, "share of training chunks held back for early stopping"),
    "--decoder": ("decoder", str, "llama (a small decoder trained from scratch) or pretrained:NAME (a causal LM: "
                                  "shortcut, folder, run, GGUF file or hub name, reading the embedding through a "
                                  "trained map; targets in its own tokenizer), or a decoder registered by a plugin"),
    "--compare": ("compare", str, "methods read from one encoder pass, as a comparison: decoders (llama, "
                                  "pretrained:NAME) and read-outs (align, bow), comma-separated, each with its own "
                                  "options in brackets (pretrained:memlab-lm[conditioning=prefix]); every method at "
                                  "every --n-train size: curve.md/json and plots/compare.png"),
    "--hidden-size": ("hidden_size", int, "decoder width"),
    "--num-layers": ("num_layers", int, "decoder blocks"),
    "--corpus": ("corpus", str, "corpus of the held-out text: a bundled name, a file or folder (.txt, .jsonl, "
                                ".parquet, .arrow, a folder saved with datasets' save_to_disk) or hf:NAME"),
    "--text-field": ("text_field", str, "the field of each record that holds the text (.jsonl, .parquet, .arrow, "
                                        "saved datasets)"),
    "--cache-dir": ("cache_dir", str, "cache embeddings and trained controls on disk here and reuse them"),
    "--cache-dtype": ("cache_dtype", str, "how --cache-dir stores embeddings: float32, float16 or bfloat16 (half "
                                          "the disk)"),
    "--device": ("device", str, "auto (the best present, a GPU if there is one), cpu, cuda, cuda:N or mps"),
    "--seed": ("seed", int, "seed"),
    "--dtype": ("encoder_dtype", str, "encoder weights: auto (bf16 where the device multiplies it natively, else "
                                      "float32), float32, bfloat16 or float16"),
    "--device-map": ("device_map", str, "encoder placement: auto (accelerate: blocks over the GPUs, then host memory, "
                                        "then disk) or none (whole on --device); unset: auto only when the model "
                                        "does not fit the device"),
    "--max-memory": ("max_memory", str, "with device_map auto: memory budget per device, e.g. cpu:200MB,0:20GiB "
                                        "(the disk takes the rest)"),
    "--offload-dir": ("offload_dir", str, "with device_map auto: folder of the weights offloaded to disk (unset: a "
                                          "temporary folder)"),
    "--threads": ("threads", int, "torch CPU threads (unset: torch's)"),
}
SWITCHES = {  # option -> (flag, help): on/off flags written by hand
    "final_norm": ("--final-norm", "read the last layer after the final norm"),
    "random_init": ("--random-init", "same architecture, random weights (floor)"),
    "calibrate": ("--calibrate", "also fit the positive controls (synthetic concat/bag codes of the same chunks) and "
                                 "report them"),
    "layers_sequence": ("--layers-sequence", "with --layers: also fit the sequence probe per layer"),
    "progress": ("--progress", "progress bars even when not on a TTY"),
}
PART_GROUPS = {"conditioning": "conditioning", "inputs": "inputs", "decoder": "decoder", "readout": "readouts"}
"""Kind -> the option that chooses the part (how a part's group is titled: ``decoder=llama``)."""
OWN = "option_"
"""Prefix of the argparse names of the flags made from the options' fields."""


def _default(cls: type, name: str):
    f = next(f for f in fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _help(cls: type, name: str, text: str | None = None) -> str:
    """``text`` (else the first sentence of the field's docstring) and its default (none shown for an unset one)."""
    text = text or re.split(r"\.\s+(?=[A-Z])", docs(cls).get(name, "").replace("``", ""))[0].rstrip(".")
    default = _default(cls, name)
    if default is None:
        return text.replace("%", "%%")
    if isinstance(default, float) and default == int(default) and default > 1:
        default = int(default)
    return f"{text} (default {default})".replace("%", "%%")


def _add_own(group, name: str, cls: type, taken: set) -> None:
    """``--its-name`` for option ``name`` of ``cls`` (on/off for a bool), unless a flag already sets it."""
    if name in taken:
        return
    taken.add(name)
    flag = "--" + name.replace("_", "-")
    if isinstance(_default(cls, name), bool):
        group.add_argument(flag, dest=OWN + name, action=argparse.BooleanOptionalAction, default=None,
                           help=_help(cls, name))
    else:
        group.add_argument(flag, dest=OWN + name, default=None, metavar="VALUE", help=_help(cls, name))


def add_parser(sub) -> None:
    p = sub.add_parser("probe", help="inversion probe: how much of its input a frozen model keeps",
                       description="Freeze a model, embed held-out chunks once, train a decoder to rebuild the tokens "
                                   "from each embedding (and a control decoder on a constant embedding); write "
                                   "report.json, plots/*.png and the decoder into the run directory.",
                       epilog="Every option is also key=value (prefix_len=8) and a YAML key, flat or under its "
                              "section (decoder: {kind: llama, hidden_size: 64}). Options of parts from plugins are "
                              "key=value or YAML keys of their section; `memlab list probe_decoders` (and the other "
                              "probe_* registries) lists them.")
    p.add_argument("--config", help="YAML of probe options (configs/probes/*.yaml)")
    p.add_argument("--out", help="run directory (default runs/NAME-TIMESTAMP, NAME the config's name or probe-MODEL); "
                                 "must be new or empty")
    p.add_argument("--log-with", help="also log the report to trackers: tensorboard, wandb, mlflow (comma-separated)")
    p.add_argument("overrides", nargs="*", help="option overrides key=value (e.g. prefix_len=8)")
    by_field = {field: (flag, tp, hlp) for flag, (field, tp, hlp) in FLAGS.items()}
    taken = {"name"}  # the run's name: --out names the folder, name= the config's
    for sec, cls in SECTIONS.items():
        group = p.add_argument_group(f"{sec} options", (cls.__doc__ or "").strip().split("\n")[0])
        for f in fields(cls):
            if f.name == "model":
                group.add_argument("--model", help="shortcut (minilm, smollm2, memlab-lm), space:NAME[:PATH], local "
                                                   "folder/run, FILE.gguf, or hub name")
            elif f.name in by_field:
                flag, tp, hlp = by_field[f.name]
                group.add_argument(flag, type=tp, default=None, help=_help(cls, f.name, hlp))
            elif f.name in SWITCHES:
                flag, hlp = SWITCHES[f.name]
                group.add_argument(flag, action="store_true", default=None, help=hlp)
            elif f.name == "control":
                group.add_argument("--no-control", action="store_true", help="skip the control decoder")
            elif f.name == "readouts":
                group.add_argument("--no-readouts", "--no-bow", dest="no_readouts", action="store_true",
                                   help="skip every read-out (readouts=[]; default: "
                                        f"{', '.join(ReadoutSection().readouts)}); --no-bow is its old name")
            elif f.name == "layers":
                group.add_argument("--layers", help="'all' or a comma list: capture these layers in one pass and fit "
                                                    "a bag-of-words read-out per layer (retention by depth)")
            else:
                _add_own(group, f.name, cls, taken)
            taken.add(f.name)
    for (kind, name), cls in PART_OPTIONS.items():
        title = (f"readouts=[{name}]" if kind == "readout" else
                 f"{PART_GROUPS[kind]}={name}" + (":NAME" if name == "pretrained" else ""))
        group = p.add_argument_group(f"{title} options", f"refused with any other {kind}")
        for f in fields(cls):
            if f.name in by_field:
                flag, tp, hlp = by_field[f.name]
                group.add_argument(flag, type=tp, default=None, help=_help(cls, f.name, hlp))
                taken.add(f.name)
            else:
                _add_own(group, f.name, cls, taken)
    p.set_defaults(func=run)


def flag_overrides(args) -> list[str]:
    """The options set by the flags made from the options' fields, as ``key=value`` overrides (typed as key=value
    is; an on/off flag as true/false)."""
    out = []
    for k, v in vars(args).items():
        if k.startswith(OWN) and v is not None:
            out.append(f"{k[len(OWN):]}={str(v).lower() if isinstance(v, bool) else v}")
    return out


def run(args) -> int:
    import time

    from memlab.errors import ConfigError
    from memlab.probes.experiment import run_experiment
    from memlab.probes.options import experiment, load_options
    from memlab.probes.report.report import format_summary

    check_threads(args.threads)
    kw = flag_values(args)
    if not args.model and not args.config:
        raise ConfigError("give --model NAME_OR_PATH (or --config with a model)")
    opts = load_options(args.config, [*args.overrides, *flag_overrides(args)], **kw)
    from memlab.rundir import safe_name

    safe = safe_name(Path(opts.model).name or opts.model)
    stem = safe_name(opts.name) if opts.name else f"probe-{safe}"  # the config's name names the run
    out = Path(args.out) if args.out else Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.log_with:
        from memlab.tracking import check_available, parse_log_with

        check_available(parse_log_with(args.log_with))
    if opts.cache_dir:
        from memlab.data.chunkcache import check_cache_dir

        check_cache_dir(opts.cache_dir)
    from memlab.rundir import holds

    from memlab.devices import launched

    if launched():  # a launch of several processes runs one probe, no sweep
        from memlab.probes.encoders.shards import check_launch

        check_launch(opts)
    held_before = holds(out)  # a folder an earlier probe of this process holds is never removed here
    try:
        report = run_experiment(opts, out)  # the one dispatch, as memlab.probes.probe runs it
        if experiment(opts) != "probe":  # a sweep prints its own table
            print(f"run: {out}")
            return 0
    except BaseException as e:
        abandon_out(out, e, held_before)
        raise
    if report is None:  # a process of a launch other than the main one: the main one reports
        return 0
    if args.log_with:
        from memlab.tracking import log_report

        log_report(report.to_dict(), out, args.log_with, name=f"probe-{safe}")
    print(format_summary(report))
    print(f"run: {out}")
    return 0


def abandon_out(out: Path, e: BaseException, held_before=None) -> None:
    """A probe that failed after claiming ``out`` removes what it made there (the folder it created, or what it
    wrote into an empty one); a storage failure (a full disk) becomes one line."""
    from memlab.errors import MemlabError
    from memlab.rundir import holds, storage_failure

    claim = holds(out)
    if claim is not None and claim is not held_before:
        claim.abandon()
    reason = None if isinstance(e, MemlabError) else storage_failure(e, writes_only=True)
    if reason is not None:
        raise MemlabError(f"could not write the probe into {out} ({reason}); nothing of it was kept") from None


def flag_values(args) -> dict:
    """The options the hand-written flags set (None: unset), as :func:`memlab.probes.options.load_options` takes
    them."""
    from memlab.probes.options import parse_sizes

    kw = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in FLAGS.items()}
    kw.update(model=args.model, final_norm=args.final_norm, random_init=args.random_init, progress=args.progress,
              calibrate=args.calibrate, layers=args.layers, layers_sequence=args.layers_sequence or None)
    if kw["n_train"] is not None:
        sizes = parse_sizes(kw["n_train"])
        kw["n_train"] = sizes if len(sizes) > 1 else sizes[0]
    if args.no_control:
        kw["control"] = False
    if args.no_readouts:  # --no-readouts, or its old name --no-bow
        kw["readouts"] = []
    return kw


def check(args) -> None:
    """Every refusal that needs no model, before anything heavy is imported (under a second): the options' types
    and ranges as the config, ``key=value`` and the flags give them (:func:`memlab.probes.options.precheck`), a
    model or corpus path that is not there, a --cache-dir that cannot be written, an --out already used. The
    options of parts and what only the loaded registries can judge are checked when the probe runs."""
    from memlab.app.commands import check_new_out, check_writable_dir
    from memlab.app.launched import rank
    from memlab.data.corpus import check_corpus_spec
    from memlab.errors import ConfigError
    from memlab.probes.options import check_model_spec, precheck

    check_threads(args.threads)
    kw = flag_values(args)
    if not args.model and not args.config:
        raise ConfigError("give --model NAME_OR_PATH (or --config with a model)")
    opts = precheck(args.config, [*args.overrides, *flag_overrides(args)], **kw)
    check_model_spec(opts.model)
    check_corpus_spec(opts.corpus)
    for flag, value in (("--cache-dir", opts.cache_dir), ("--offload-dir", opts.offload_dir)):
        if value:
            check_writable_dir(value, flag)
    if rank() == 0:  # the other processes of a launch find the folder the first one is filling
        check_new_out(args.out, "probe")
