"""A package's public names, re-exported from its modules the first time each is read.

A stage package of a plugin (``memlab.probes.decoder``, ...) lists which of its modules holds each public name;
importing the package imports none of them (so none of torch), and ``from memlab.probes.decoder import
ProbeDecoder`` imports only the module that defines it.
"""

from __future__ import annotations

from importlib import import_module


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]):
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose ``modules`` (submodule -> its public names)
    define the names it re-exports."""
    where = {name: module for module, names in modules.items() for name in names}
    if len(where) != sum(len(names) for names in modules.values()):
        raise ValueError(f"{package}: a name is re-exported from two modules")

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{where[name]}"), name)

    def __dir__() -> list[str]:
        return sorted(set(where) | set(modules))

    return __getattr__, __dir__, sorted(where)
