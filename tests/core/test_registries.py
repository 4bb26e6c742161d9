"""Registries as the application sees them: `memlab list` shows every registry, families register
their own eval adapters and generators, and a probe config is not a trainable recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from memlab.errors import ConfigError
from memlab.registry import ALL, EVAL_ADAPTERS, GENERATORS, RECIPES, VERB_RECIPES

ROOT = Path(__file__).resolve().parents[2]


def test_memlab_list_shows_every_registry(capsys):
    from memlab.app.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for kind in ALL:
        assert f"{kind}:" in out
    assert main(["list", "generators"]) == 0
    gens = capsys.readouterr().out
    assert all(f"  {n} " in gens for n in GENERATORS.names()) and "sonar_llm" in gens
    assert main(["list", "eval_adapters"]) == 0
    ads = capsys.readouterr().out
    assert {"token_lm", "memory", "sonar_llm"} <= set(EVAL_ADAPTERS.names())
    assert all(f"  {n} " in ads for n in EVAL_ADAPTERS.names())
    assert main(["list", "tasks"]) == 0
    assert "hellaswag" in capsys.readouterr().out  # the application registers its tasks before listing


def test_probe_is_not_a_trainable_recipe(tmp_path):
    from memlab.config import load_config
    from memlab.train.experiment import run_experiment

    assert "probe" not in RECIPES.names() and "probe" in VERB_RECIPES.names()
    cfg = load_config(ROOT / "configs" / "probes" / "minilm.yaml")  # the options still validate
    assert cfg.recipe == "probe"
    with pytest.raises(ConfigError, match=r"memlab probe --config"):
        run_experiment(cfg, tmp_path / "run")
