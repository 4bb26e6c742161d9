"""Packaging: every package folder is listed in pyproject, and the code folders install under memlab."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = conf["package-dir"]
    found = set()
    for pkg, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if any(part.startswith((".", "__")) for part in rel.parts):
                continue
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert found <= listed, f"packages missing from pyproject: {sorted(found - listed)}"


def test_code_folders_are_subpackages():
    import memlab.curricula
    import memlab.models
    import memlab.probes

    for mod, folder in ((memlab.models, "models"), (memlab.probes, "probes"), (memlab.curricula, "curricula")):
        assert Path(mod.__file__).parent == ROOT / folder


def test_bundled_corpus_ships_with_provenance():
    from memlab.data.corpus import bundled_corpus_dir

    d = bundled_corpus_dir("austen")
    assert len(list(d.glob("*.txt.gz"))) == 6
    assert "Gutenberg" in (d / "README.md").read_text()
