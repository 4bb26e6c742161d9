"""memlab list: what the registries hold."""

from __future__ import annotations

from dataclasses import MISSING, fields


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="list what the registries hold (families, recipes, spaces, tasks, generators, ...)")
    p.add_argument("kind", nargs="?", help="one registry (families, spaces, objectives, curricula, corpora, recipes, "
                                          "tasks, generators, eval_adapters, and the probe's parts: probe_encoders, "
                                          "probe_pools, probe_conditionings, probe_inputs, probe_decoders, "
                                          "probe_readouts, probe_scorers)")
    p.set_defaults(func=run)


def _options(obj) -> str:
    """`` [options: a=1, b=x]`` of an entry that declares an options dataclass (``options_class``), else ``""``."""
    cls = getattr(obj, "options_class", None)
    if cls is None:
        return ""
    shown = [f"{f.name}={f.default}" if f.default is not MISSING else
             f"{f.name}={f.default_factory()}" if f.default_factory is not MISSING else f.name for f in fields(cls)]
    return " [options: " + ", ".join(shown) + "]"


def run(args) -> int:
    from memlab.errors import MemlabError
    import memlab.app.eval  # noqa: F401  (registers the evaluation tasks)
    from memlab.registry import ALL, FAMILIES, load_plugins

    load_plugins()  # plugins add their own registries (the probe's parts) to ALL
    kinds = [args.kind] if args.kind else list(ALL)
    for k in kinds:
        if k not in ALL:
            raise MemlabError(f"unknown registry '{k}'; known: {', '.join(ALL)}")
        print(f"{k}:")
        names = ALL[k].names()
        if not names:
            print("  (none)")
        for name, doc in ALL[k].describe():
            extra = ""
            if k == "families":
                extra = f" [presets: {', '.join(sorted(FAMILIES.get(name).presets))}]"
            print(f"  {name:<22} {doc}{extra}{_options(ALL[k].get(name))}")
    return 0
