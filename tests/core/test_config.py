from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from memlab.config import (ConfigError, ExperimentConfig, TrainConfig, apply_overrides, experiment_from_dict,
                           field_docs, from_dict, load_config, save_config, to_dict)

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_key_names_key_and_valid_ones():
    with pytest.raises(ConfigError) as e:
        experiment_from_dict({"train": {"lrr": 1e-3}})
    msg = str(e.value)
    assert "train.lrr" in msg and "max_steps" in msg and "lr" in msg


def test_unknown_top_level_and_model_keys():
    with pytest.raises(ConfigError, match="unknown config key 'trian'"):
        experiment_from_dict({"trian": {}})
    with pytest.raises(Exception, match="model.hidden_sise"):
        experiment_from_dict({"model": {"family": "token_lm", "overrides": {"hidden_sise": 3}}})


def test_types_are_checked_and_coerced():
    cfg = from_dict(TrainConfig, {"lr": "3e-4", "max_steps": 10.0, "cpu": True})
    assert cfg.lr == pytest.approx(3e-4) and cfg.max_steps == 10 and cfg.cpu is True
    with pytest.raises(ConfigError, match="train.max_steps"):
        from_dict(TrainConfig, {"max_steps": "many"}, prefix="train.")
    with pytest.raises(ConfigError):
        from_dict(TrainConfig, {"max_steps": 2.5})


def test_dotted_overrides():
    data = apply_overrides({"train": {"lr": 1.0}}, ["train.lr=3e-4", "data.seq_len=64", "name=x"])
    cfg = experiment_from_dict(data)
    assert cfg.train.lr == pytest.approx(3e-4) and cfg.data.seq_len == 64 and cfg.name == "x"
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides({}, ["train.lr"])


def test_yaml_round_trip(tmp_path):
    cfg = experiment_from_dict({"name": "rt", "train": {"lr": 0.01}})
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert to_dict(again) == to_dict(cfg)


def test_invalid_values_rejected():
    with pytest.raises(ConfigError, match="val_fraction"):
        experiment_from_dict({"data": {"val_fraction": 1.5}})
    with pytest.raises(ConfigError, match="grad_accum"):
        experiment_from_dict({"train": {"batch_size": 10, "grad_accum": 3}})
    with pytest.raises(Exception, match="unknown recipe"):
        experiment_from_dict({"recipe": "nope"})


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_fields_are_documented():
    from memlab.config import DataConfig, ModelConfig

    for cls in (TrainConfig, DataConfig, ModelConfig):
        docs = field_docs(cls)
        from dataclasses import fields

        missing = [f.name for f in fields(cls) if f.name not in docs]
        assert not missing, f"{cls.__name__} fields without docstrings: {missing}"


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")))
def test_every_shipped_config_loads(path):
    if path.startswith("configs/scaling/"):  # sweeps over experiments: each base experiment must load too
        from memlab.analysis.scaling import load_sweep_config

        from memlab.analysis.scaling import experiment_for

        sweep = load_sweep_config(ROOT / path)
        assert sweep.families and all(len(f.sizes) >= sweep.min_sizes for f in sweep.families)
        for fam in sweep.families:  # every size is its base experiment with the size's model keys
            for i, size in enumerate(fam.sizes):
                cfg = experiment_for(sweep, fam, i)
                assert isinstance(cfg, ExperimentConfig)
                assert {k: cfg.model.overrides[k] for k in size} == size
        return
    cfg = load_config(ROOT / path)
    assert isinstance(cfg, ExperimentConfig)
