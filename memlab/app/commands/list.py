"""memlab list: what the registries hold."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="list what the registries hold (families, recipes, spaces, tasks, generators, ...)")
    p.add_argument("kind", nargs="?", help="one registry (families, spaces, objectives, curricula, corpora, recipes, "
                                          "tasks, generators, eval_adapters)")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlab.errors import MemlabError
    import memlab.app.eval  # noqa: F401  (registers the evaluation tasks)
    from memlab.registry import ALL, FAMILIES

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
            print(f"  {name:<22} {doc}{extra}")
    return 0
