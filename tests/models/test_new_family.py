"""A new family touches only its own folder: the throwaway family in tests/plugins/throwaway_family
(config, model, toy preset, registration, evaluation adapter) registers by being imported, passes the
registry-wide family checks, shows in `memlab list` and runs through `memlab eval`'s runner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memlab.registry import EVAL_ADAPTERS, FAMILIES
from tests.models.test_families import check_family_contract
from tests.core.test_layering import imports_of, layer, module_files

FOLDER = Path(__file__).resolve().parents[1] / "plugins" / "throwaway_family"


@pytest.fixture(scope="module")
def family():
    import tests.plugins.throwaway_family as plugin  # noqa: F401  (registers the family and its adapter)

    return FAMILIES.get("throwaway")


def test_the_plugin_imports_only_the_core():
    files = module_files({"tests/plugins/throwaway_family": "throwaway"}, FOLDER.parents[2])
    assert len(files) == 4
    for name, f in files.items():
        deps = imports_of(name, f, set(files))
        assert all(layer(d) == "core" for d in deps), (name, deps)


def test_registry_wide_checks(family, tmp_path):
    assert family.presets["toy"]["hidden_size"] == 16
    check_family_contract("throwaway", tmp_path)


def test_listed(family, capsys):
    from memlab.app.cli import main

    assert main(["list", "families"]) == 0
    assert "throwaway bigram LM (a test plugin) [presets: toy]" in capsys.readouterr().out
    assert main(["list", "eval_adapters"]) == 0
    assert "throwaway" in capsys.readouterr().out


def test_evaluated_through_its_adapter(family, tmp_path):
    from memlab.app.eval.adapters import load_adapter
    from memlab.app.eval.runner import evaluate_models
    from memlab.app.eval.tasks import TaskOptions
    from memlab.models.sentence.toy_space import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(0)
    model = family.make_model("toy", vocab_size=len(tok))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ad = load_adapter(tmp_path)
    assert type(ad).__name__ == "BigramAdapter" and "throwaway" in EVAL_ADAPTERS.names()
    (lp, n), = ad.score(["ab"], ["cd"])
    with torch.no_grad():  # the same number from the model directly: log p(c | b) + log p(d | c)
        ids = tok("bcd", add_special_tokens=False)["input_ids"]
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)  # (3, V)
    assert n == 2 and lp == pytest.approx(float(logp[0, ids[1]] + logp[1, ids[2]]), abs=1e-5)
    res = evaluate_models([ad], ["hellaswag"], TaskOptions(limit=2), log=lambda s: None)
    assert res[ad.name]["hellaswag"]["n"] == 2 and 0.0 <= res[ad.name]["hellaswag"]["acc"] <= 1.0


def test_an_installed_plugin_loads_through_its_entry_point(monkeypatch):
    """A family in a package of its own declares `[project.entry-points."memlab.plugins"]`; load_plugins
    imports it (here a fake entry point stands for the installed metadata)."""
    from importlib.metadata import EntryPoint

    import memlab.registry as registry
    from memlab.errors import MemlabError

    seen = []
    fake = EntryPoint(name="throwaway", value="tests.plugins.throwaway_family", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: seen.append(group) or [fake])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    loaded = []
    monkeypatch.setattr(EntryPoint, "load", lambda self: loaded.append(self.value))
    registry.load_plugins()
    assert seen == ["memlab.plugins"] and loaded == ["tests.plugins.throwaway_family"]
    monkeypatch.undo()  # the real EntryPoint.load again, for a plugin that cannot be imported
    broken = EntryPoint(name="broken", value="no_such_module_xyz", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with pytest.raises(MemlabError, match="plugin 'broken' .* failed to load: ModuleNotFoundError"):
        registry.load_plugins()
