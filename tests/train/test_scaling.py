"""Scaling-law fit on synthetic data with known parameters, the sweep config, and a tiny sweep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from memlab.analysis import scaling
from memlab.errors import ConfigError, MemlabError

ROOT = Path(__file__).resolve().parents[2]


def test_fit_recovers_known_parameters_exactly():
    N = np.geomspace(1e4, 1e8, 8)
    L = 400.0 * N**-0.45 + 1.7
    f = scaling.fit_power_law(N, L)
    assert f["alpha"] == pytest.approx(0.45, rel=1e-3)
    assert f["a"] == pytest.approx(400.0, rel=1e-2)
    assert f["b"] == pytest.approx(1.7, abs=1e-3)
    assert f["r2"] > 0.999999


def test_bootstrap_interval_covers_truth_under_noise():
    rng = np.random.default_rng(3)
    N = np.geomspace(1e5, 1e8, 10)
    L = 2000.0 * N**-0.6 + 2.0 + rng.normal(0, 0.005, size=N.shape)
    f = scaling.bootstrap_fit(N, L, n_boot=200, seed=1)
    lo, hi = f["ci"]["alpha"]
    assert lo <= 0.6 <= hi and hi - lo < 0.3
    blo, bhi = f["ci"]["b"]
    assert blo <= 2.0 <= bhi
    assert f["n_boot"] >= 150
    # A different exponent gives a clearly different fit: the fit is not a constant.
    g = scaling.fit_power_law(N, 2000.0 * N**-0.3 + 2.0)
    assert g["alpha"] == pytest.approx(0.3, rel=1e-2)


def test_fit_rejects_bad_input():
    with pytest.raises(MemlabError, match="at least 3"):
        scaling.fit_power_law([1, 2], [3, 2])
    with pytest.raises(MemlabError, match="positive"):
        scaling.fit_power_law([0, 1, 2], [3, 2, 1])


def test_shipped_sweep_config_loads(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = scaling.load_sweep_config(ROOT / "configs/scaling/token_lm_cpu.yaml")
    assert len(cfg.families) >= 1 and all(len(f.sizes) >= 4 for f in cfg.families)
    exps = [scaling.experiment_for(cfg, cfg.families[0], i) for i in range(len(cfg.families[0].sizes))]
    assert exps[0].train.max_steps == 80 and exps[0].model.overrides["hidden_size"] == 16
    # the same experiments through memlab.config.load_config (every shipped config is loaded by a test)
    from memlab.config import load_config

    base = load_config(ROOT / cfg.families[0].base, list(cfg.families[0].overrides))
    assert base.train.max_steps == 80


@pytest.mark.parametrize("path", sorted((ROOT / "configs/scaling").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sweep_loads(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = scaling.load_sweep_config(path)  # builds and validates every size's experiment config
    for fam in cfg.families:
        exps = [scaling.experiment_for(cfg, fam, i) for i in range(len(fam.sizes))]
        assert len({str(e.model.overrides) for e in exps}) == len(exps) >= 4


def test_sweep_config_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "s.yaml"
    bad.write_text(yaml.safe_dump({"families": [{"label": "x", "base": "configs/token_lm/toy.yaml", "sizes": [{}]}]}))
    with pytest.raises(ConfigError, match="at least 4"):
        scaling.load_sweep_config(bad)
    bad.write_text(yaml.safe_dump({"familes": []}))
    with pytest.raises(ConfigError, match="familes"):
        scaling.load_sweep_config(bad)
    sizes = [{"hidden_sise": 8}] * 4
    bad.write_text(yaml.safe_dump({"families": [{"label": "x", "base": "configs/token_lm/toy.yaml", "sizes": sizes}]}))
    with pytest.raises(Exception, match="hidden_sise"):
        scaling.load_sweep_config(bad)


def test_tiny_sweep_end_to_end(tmp_path, small_corpus):
    from tests.conftest import write_config

    base = write_config(tmp_path / "base.yaml", small_corpus, train={"max_steps": 2, "eval_every": 2, "save_every": 2,
                                                                     "log_every": 1, "batch_size": 4, "eval_batches": 1})
    sizes = [{"hidden_size": h, "intermediate_size": 2 * h, "num_attention_heads": 2, "num_key_value_heads": 2}
             for h in (8, 16, 24, 32)]
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": "t", "bootstrap": 20,
                                          "families": [{"label": "token_lm", "base": str(base), "sizes": sizes}]}))
    sweep = scaling.load_sweep_config(sweep_file)
    res = scaling.run_sweep(sweep, tmp_path / "out")
    pts = res["families"]["token_lm"]["points"]
    assert [p["params"] for p in pts] == sorted(p["params"] for p in pts) and len(set(p["params"] for p in pts)) == 4
    assert all(np.isfinite(p["eval_loss"]) for p in pts)
    assert "fit" in res["families"]["token_lm"] or "fit_error" in res["families"]["token_lm"]
    assert (tmp_path / "out/scaling.png").stat().st_size > 1000
    assert json.loads((tmp_path / "out/scaling.json").read_text())["name"] == "t"
    assert "token_lm" in scaling.format_table(res)
