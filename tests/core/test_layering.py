"""The three layers, checked on the source: every ``import`` (module level or inside a function) is
parsed with ``ast`` and must point downward.

- **core** (``memlab`` outside ``memlab.app``) imports no plugin (``memlab.models``,
  ``memlab.probes``, ``memlab.curricula``) and not the application layer;
- **plugins** never import the application layer (``memlab.app``);
- a **model family** (``memlab.models.<name>``) imports no other family; shared pieces live in a
  library package (``memlab.models.sentence``) that imports no family;
- no import cycles among memlab's modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"memlab": "memlab", "models": "memlab.models", "probes": "memlab.probes", "curricula": "memlab.curricula"}
"""Source folder -> the package it installs as (pyproject's package-dir)."""
PLUGINS = ("memlab.models", "memlab.probes", "memlab.curricula")
APP = "memlab.app"
LIBRARIES = {"memlab.models.sentence"}
"""Packages under ``models/`` that are shared code, not families."""


def module_files(folders: dict[str, str] = FOLDERS, root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file of the given folders."""
    out = {}
    for folder, package in folders.items():
        for f in sorted((root / folder).rglob("*.py")):
            parts = list(f.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = f
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The memlab modules that ``path`` (module ``name``) imports anywhere in its body.

    ``from a import b`` counts as importing ``a.b`` when that is a module, else ``a``; relative imports
    are resolved against the module's package.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m == "memlab" or m.startswith("memlab.")}


def layer(module: str) -> str:
    if module == APP or module.startswith(APP + "."):
        return "app"
    if any(module == p or module.startswith(p + ".") for p in PLUGINS):
        return "plugin"
    return "core"


def family(module: str) -> str | None:
    """``memlab.models.X...`` -> ``memlab.models.X`` (a family or a library); None elsewhere."""
    parts = module.split(".")
    return ".".join(parts[:3]) if module.startswith("memlab.models.") else None


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points the wrong way, as 'importer -> imported: rule'."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            lm, ld = layer(mod), layer(dep)
            if lm == "core" and ld != "core":
                bad.append(f"{mod} -> {dep}: the core imports the {ld} layer")
            elif lm == "plugin" and ld == "app":
                bad.append(f"{mod} -> {dep}: a plugin imports the application layer")
            fm, fd = family(mod), family(dep)
            if fm and fd and fm != fd and fd not in LIBRARIES:
                what = "a library" if fm in LIBRARIES else "a family"
                bad.append(f"{mod} -> {dep}: {what} imports another family")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graphs are small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph(folders: dict[str, str] = FOLDERS, root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(folders, root)
    known = set(files)
    return {name: (imports_of(name, f, known) & known) - {name} for name, f in files.items()}


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_tree_has_the_three_layers(graph):
    assert "memlab.app.cli" in graph and "memlab.registry" in graph and "memlab.models.memory" in graph
    assert {layer(m) for m in graph} == {"core", "plugin", "app"}


def test_imports_point_downward(graph):
    assert violations(graph) == []


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_registry_loads_only_plugins():
    from memlab.registry import PLUGIN_PACKAGES

    assert set(PLUGIN_PACKAGES) == set(PLUGINS)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_checks_catch_wrong_imports(tmp_path):
    """A core module importing a family, a family importing another, a probe importing the app and a
    function-level cycle are all reported."""
    _write(tmp_path, {
        "memlab/__init__.py": "",
        "memlab/core.py": "def f():\n    from memlab.models.a import thing\n",
        "memlab/app/__init__.py": "",
        "memlab/app/cli.py": "import memlab.core\n",
        "models/__init__.py": "",
        "models/a/__init__.py": "from memlab.models.b.mod import x\n",
        "models/b/__init__.py": "",
        "models/b/mod.py": "from memlab.models.sentence import shared\n",
        "models/sentence/__init__.py": "",
        "models/sentence/shared.py": "from . import other\n",
        "models/sentence/other.py": "def g():\n    from .shared import h\n",
        "probes/__init__.py": "",
        "probes/p.py": "from memlab.app import cli\n",
    })
    g = import_graph({"memlab": "memlab", "models": "memlab.models", "probes": "memlab.probes"}, tmp_path)
    bad = violations(g)
    assert "memlab.core -> memlab.models.a: the core imports the plugin layer" in bad
    assert "memlab.models.a -> memlab.models.b.mod: a family imports another family" in bad
    assert "memlab.probes.p -> memlab.app.cli: a plugin imports the application layer" in bad
    assert not any(b.startswith("memlab.models.b.mod") for b in bad)  # families may use the library
    assert cycles(g) == [["memlab.models.sentence.other", "memlab.models.sentence.shared"]]


# The probe's rooms (probes/: one folder a stage; probes/invert/: one folder a search), docs/architecture.md.
STAGES = ("chunks", "encoders", "decoder", "readouts", "report")
"""The probe's stage rooms: text, states, fit, read, report."""
ORCHESTRATION = ("memlab.probes.run", "memlab.probes.sweeps")
"""What runs the stages: the one probe and the many probes of a sweep."""
SEARCHES = ("memlab.probes.invert.positions", "memlab.probes.invert.pooled")


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import between the probe's rooms that points the wrong way, as 'importer -> imported: rule'."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if not inside(mod, "memlab.probes") or mod == "memlab.probes":
                continue
            for a in SEARCHES:
                for b in SEARCHES:
                    if a != b and inside(mod, a) and inside(dep, b):
                        bad.append(f"{mod} -> {dep}: one search imports the other")
            if inside(mod, "memlab.probes.invert.beside") and any(inside(dep, s) for s in SEARCHES):
                bad.append(f"{mod} -> {dep}: the probe beside the inversion imports a search")
            if not inside(mod, "memlab.probes.invert") and inside(dep, "memlab.probes.invert"):
                bad.append(f"{mod} -> {dep}: the probe imports the inversion")
            stage = any(inside(mod, f"memlab.probes.{s}") for s in STAGES)
            if stage and any(inside(dep, o) for o in ORCHESTRATION):
                bad.append(f"{mod} -> {dep}: a stage imports what runs the stages")
            if inside(mod, "memlab.probes.chunks") and any(inside(dep, f"memlab.probes.{s}") for s in
                                                            ("decoder", "readouts", "report")):
                bad.append(f"{mod} -> {dep}: the text imports a later stage")
    return bad


def test_the_probes_rooms_point_downward(graph):
    assert {m for m in graph if inside(m, "memlab.probes.invert.pooled")} and room_violations(graph) == []


def test_the_rooms_checks_catch_wrong_imports():
    g = {"memlab.probes.invert.pooled.run": {"memlab.probes.invert.positions.rank"},
         "memlab.probes.invert.beside.table": {"memlab.probes.invert.pooled.report"},
         "memlab.probes.decoder.fit": {"memlab.probes.sweeps.layers", "memlab.probes.invert.layer"},
         "memlab.probes.chunks.cut": {"memlab.probes.report.report"}}
    assert room_violations(g) == [
        "memlab.probes.chunks.cut -> memlab.probes.report.report: the text imports a later stage",
        "memlab.probes.decoder.fit -> memlab.probes.invert.layer: the probe imports the inversion",
        "memlab.probes.decoder.fit -> memlab.probes.sweeps.layers: a stage imports what runs the stages",
        "memlab.probes.invert.beside.table -> memlab.probes.invert.pooled.report: "
        "the probe beside the inversion imports a search",
        "memlab.probes.invert.pooled.run -> memlab.probes.invert.positions.rank: one search imports the other"]


MAX_MODULES, MAX_LINES, MAX_FUNCTION = 12, 400, 80


def test_the_rooms_stay_small():
    probes = ROOT / "probes"
    for folder in (probes, probes / "invert"):
        assert len(list(folder.glob("*.py"))) <= MAX_MODULES, folder
    long_modules, long_functions = [], set()
    for f in probes.rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        if text.count("\n") > MAX_LINES:
            long_modules.append(str(f.relative_to(probes)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION:
                long_functions.add((str(f.relative_to(probes)), node.name))
    assert long_modules == [] and long_functions == set(), (long_modules, long_functions)
