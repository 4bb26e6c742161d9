"""Packaging: every package folder is listed in pyproject, and the code folders install under memlab."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_run_time_files_live_inside_the_package():
    """What the program reads at run time is package data, so a wheel install has it (CI installs the wheel
    and runs quickstart and eval from outside the tree: scripts/wheel_check.sh)."""
    import memlab
    from memlab.app.eval.tasks import LOCAL_DIR
    from memlab.paths import shipped_config
    from memlab.app.quickstart import CHECKPOINTS

    pkg = Path(memlab.__file__).resolve().parent
    for d in (LOCAL_DIR, CHECKPOINTS):
        assert d.is_dir() and d.is_relative_to(pkg), d
    assert sorted(p.name for p in LOCAL_DIR.glob("*.jsonl")) == [
        "hellaswag.jsonl", "multidoc_qa.jsonl", "next_sentence.jsonl", "summarization.jsonl"]
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert conf["package-dir"]["memlab.configs"] == "configs" and "memlab.configs" in conf["packages"]
    assert "**/*.yaml" in conf["package-data"]["memlab.configs"]
    assert "resources/**/*" in conf["package-data"]["memlab"]
    assert shipped_config("token_lm/toy.yaml") == ROOT / "configs" / "token_lm" / "toy.yaml"


def test_unknown_shipped_config_is_a_config_error():
    import pytest

    from memlab.errors import ConfigError
    from memlab.paths import shipped_config

    with pytest.raises(ConfigError, match="no shipped config 'token_lm/nope.yaml'"):
        shipped_config("token_lm/nope.yaml")


def test_no_code_reaches_into_the_source_tree():
    """A wheel has no tests/ or repository root: package code must not climb out of the package to read files."""
    import re

    pattern = re.compile(r"__file__\)?(\.resolve\(\))?\.parents\[\d\]")
    offenders = []
    for folder in ("memlab", "models", "probes", "curricula"):
        for f in (ROOT / folder).rglob("*.py"):
            if pattern.search(f.read_text()):
                offenders.append(str(f.relative_to(ROOT)))
    assert not offenders, f"files that read from the source tree by a path above the package: {offenders}"
