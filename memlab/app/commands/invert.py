"""memlab invert --model NAME --layer L --states positions|last|mean|first|second_last|logits (or --model
space:memory_ae:PATH, --states space): recover the input from a model's states.

The flags are made from the option dataclasses of :mod:`memlab.probes.invert.options` (one section each: model,
text, the per-position search, the pooled search, output; a flag the two searches share is one flag), read as text
and checked (types, ranges, the search they belong to, a ``--probe`` run's settings) before anything heavy is
imported; :func:`memlab.probes.invert.run.run_invert` does the work.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import fields

SHARED_TITLE = "both searches"
"""The help group of the flags both searches take (the chosen search reads them)."""


def _sections():
    from memlab.probes.invert.options import SECTIONS

    return SECTIONS


def _shared() -> set[str]:
    """Field names both searches have: one flag each, read by the chosen search."""
    from memlab.probes.invert.options import PooledOptions, PositionsOptions

    return {f.name for f in fields(PositionsOptions)} & {f.name for f in fields(PooledOptions)}


@functools.lru_cache(maxsize=None)
def _docs(section: str) -> dict[str, str]:
    """A section's field docstrings, read from its source once (not once per flag: the parser answers in time)."""
    from memlab.probes.options import class_docs

    return class_docs(_sections()[section])


def _help(section: str, name: str) -> str:
    from memlab.probes.invert.options import default_text

    text = _docs(section).get(name, "").rstrip(".")
    return f"{text} (default {default_text(section, name)})".replace("%", "%%")


def _add(group, section: str, f, dest: str, hlp: str) -> None:
    from memlab.probes.invert.options import flag_name

    flag = flag_name(section, f.name)
    if f.default is True:
        group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=hlp)
    elif f.default is False:
        group.add_argument(flag, dest=dest, action="store_true", default=None, help=hlp)
    else:
        group.add_argument(flag, dest=dest, default=None, metavar=_metavar(f), help=hlp)


def _metavar(f) -> str:
    """N for an integer, X for a number, {a,b} for a choice, the field's name for the rest."""
    if f.metadata.get("choices"):
        return "{" + ",".join(f.metadata["choices"]) + "}"
    kind = str(f.type)
    return "N" if kind.startswith("int") else "X" if kind.startswith("float") else {
        "out": "DIR", "probe": "RUN", "cache_dir": "DIR", "states_from": "MODEL"}.get(f.name, f.name.upper())


def add_parser(sub) -> None:
    p = sub.add_parser(
        "invert", help="white-box inversion: recover the input exactly from a causal model's per-position states",
        description="Recover held-out chunks token by token from a causal model's states at one layer, with the "
                    "model's own weights and no training: rank candidates by the gradient of the distance, verify "
                    "them through the blocks up to the layer with the prefix's key-value cache, search the whole "
                    "vocabulary when no ranked candidate matches. With a pooled --states (last, mean, first, "
                    "second_last: the trained probe's poolings; logits: a causal model's next-token distribution; "
                    "space: a memory model's memory vector, --model space:memory_ae:PATH), search the token "
                    "sequence whose vector matches (proposals, or with --method relax-correct a continuous "
                    "relaxation of the input, then corrections), beside a control search from another chunk's "
                    "vector. "
                    "Writes report.json into --out and prints a summary.")
    shared = _shared()
    for section, cls in _sections().items():
        group = p.add_argument_group(f"{section} options", (cls.__doc__ or "").strip().replace("%", "%%"))
        for f in fields(cls):
            if section in ("positions", "pooled") and f.name in shared:
                continue
            _add(group, section, f, f"{section}.{f.name}", _help(section, f.name))
        if section == "pooled":
            both = p.add_argument_group(f"{SHARED_TITLE} options", "read by the search --states chooses")
            for f in fields(cls):
                if f.name in shared:
                    _add(both, section, f, f"search.{f.name}",
                         f"positions: {_help('positions', f.name)}; pooled: {_help('pooled', f.name)}")
    p.set_defaults(func=run)


def _given(args: argparse.Namespace) -> dict[tuple[str, str], object]:
    """(section, field) -> the text (or switch) given on the command line, for every flag that was given."""
    out = {}
    for dest, value in vars(args).items():
        if "." in dest and value is not None:
            section, name = dest.split(".", 1)
            out[(section, name)] = value
    return out


def options(args: argparse.Namespace):
    """The flags as one checked :class:`~memlab.probes.invert.options.InvertOptions` (no heavy import): one
    ConfigError line for the first bad flag."""
    from memlab.errors import ConfigError
    from memlab.probes.invert.options import InvertOptions, flag_name, is_space, parse_value, pooled_names, settle_space

    given = _given(args)
    if ("output", "resume") in given:
        return _resumed(given)
    opts = InvertOptions()
    for (section, name), value in given.items():  # what is inverted, the chunks, the output
        if section in ("model", "text", "output"):
            setattr(getattr(opts, section), name, value if isinstance(value, bool) else
                    parse_value(section, name, value))
    names = {name for (_, name) in given}
    if opts.model.probe is not None:  # the run's model, layer, pooling and chunks (JSON only: no torch yet)
        from memlab.probes.invert.beside.probe_run import read_probe_run, reconcile

        opts = reconcile(opts, names, read_probe_run(opts.model.probe))
        for flag, value in (("--states-from", opts.model.states_from), ("--noise", opts.model.noise)):
            if value:
                raise ConfigError(f"{flag} does not go with --probe: the table reads both instruments on the "
                                  "states the probe read")
    settle_space(opts.model, names)  # a space: --states space, no layer
    chosen = "pooled" if opts.pooled_search else "positions"
    for (section, name), value in given.items():  # the chosen search's flags; the other's are refused
        if section in ("positions", "pooled") and section != chosen:
            raise ConfigError(f"{flag_name(section, name)} applies to --states "
                              f"{'positions' if section == 'positions' else pooled_names()}, not to --states "
                              f"{opts.model.states}")
        if section in ("positions", "pooled", "search"):
            setattr(getattr(opts, chosen), name, value if isinstance(value, bool) else
                    parse_value(chosen, name, value))
    if not opts.model.model:
        raise ConfigError("give --model NAME_OR_PATH (a causal model), or --probe RUN")
    if opts.model.states == "logits":  # the next-token distribution: after the last block, at no other layer
        if opts.model.layer not in (None, -1):
            raise ConfigError(f"--states logits reads the next-token distribution after the last block: leave "
                              f"--layer out (or give -1), not {opts.model.layer}")
        opts.model.layer = -1
    if opts.model.layer is None and not is_space(opts.model.model):
        raise ConfigError("give --layer L (0 = embeddings, k = output of block k-1, negative from the end)")
    if opts.text.n > opts.text.n_eval:
        raise ConfigError(f"--n {opts.text.n} is more than the --n-eval {opts.text.n_eval} chunks it is drawn from")
    from memlab.app.commands import check_threads

    check_threads(opts.model.threads)
    return opts


def _resumed(given: dict):
    """``--resume RUN``: the run's own options (its ``invert.json``), with only --threads, --device and --progress
    taken anew (and --device-map); one ConfigError line for another flag or a folder that is not a stopped run."""
    from memlab.errors import ConfigError
    from memlab.probes.invert.chunklog import read_settings
    from memlab.probes.invert.options import RESUME_MAY_CHANGE, flag_name, from_dict, parse_value

    run = given[("output", "resume")]
    other = [k for k in given if k not in RESUME_MAY_CHANGE]
    if other:
        section, name = other[0]
        raise ConfigError(f"--resume continues a run with its own settings: give no {flag_name(section, name)} "
                          "(only --threads, --device, --device-map and --progress may change)")
    try:
        opts = from_dict(read_settings(run))
    except (KeyError, TypeError) as e:
        raise ConfigError(f"--resume {run}: its settings are not this memlab's ({e})") from None
    from pathlib import Path

    if (Path(run) / "report.json").is_file():
        raise ConfigError(f"--resume {run}: the run has finished (its report.json is there)")
    for (section, name), value in given.items():
        if (section, name) != ("output", "resume"):
            setattr(getattr(opts, section), name, value if isinstance(value, bool) else
                    parse_value(section, name, value))
    opts.output.resume, opts.output.out = run, run
    from memlab.app.commands import check_threads

    check_threads(opts.model.threads)
    return opts


def check(args: argparse.Namespace) -> None:
    """Every flag checked while the arguments are read, before torch is imported (memlab.app.cli); the folders
    and threads as the CLI's generic checks read them (``args.out``, ``args.cache_dir``, ``args.threads``); a model
    or corpus path that is not there, a --cache-dir that cannot be made or written and an --out already used,
    refused now rather than after the model loads."""
    from memlab.app.commands import check_new_out, check_writable_dir
    from memlab.data.corpus import check_corpus_spec
    from memlab.probes.options import check_model_spec

    opts = options(args)
    args.out, args.cache_dir, args.threads = opts.output.out, opts.positions.cache_dir, opts.model.threads
    for spec in (opts.model.model, opts.model.states_from):  # a path that is not there, before the model loads
        check_model_spec(spec)
    check_corpus_spec(opts.text.corpus)
    if opts.positions.cache_dir:
        check_writable_dir(opts.positions.cache_dir, "--cache-dir")
    from memlab.app.launched import rank

    if not opts.output.resume and rank() == 0:  # a resumed run writes into its own folder, which holds files; the
        check_new_out(opts.output.out, "inversion")  # other processes of a launch find the one the first is filling


def run(args) -> int:
    import time
    from pathlib import Path

    opts = options(args)  # every flag checked before torch is imported
    from memlab.probes.invert.run import run_invert
    from memlab.rundir import safe_name

    model = opts.model.model
    out = Path(opts.output.out) if opts.output.out else Path("runs") / (
        f"invert-{safe_name(Path(model).name or model)}-{time.strftime('%Y%m%d-%H%M%S')}")
    report, lines = run_invert(opts, out, resume=bool(opts.output.resume))
    if report is None:  # a launched process other than the main one: the main one reports
        return 0
    for line in lines:
        print(line)
    print(f"run: {out}")
    return 0
