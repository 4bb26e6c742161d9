"""Every registered model family: toy config builds, one batch lowers the loss, save/load round trips."""

from __future__ import annotations

import pytest
import torch

from memlab.registry import FAMILIES


def _families():
    return FAMILIES.names()


@pytest.mark.parametrize("name", _families())
def test_family_contract(name, tmp_path):
    check_family_contract(name, tmp_path)


def check_family_contract(name: str, tmp_path) -> None:
    """The registry-wide checks of one family: toy config, one batch lowers the loss, save/load round trip."""
    fam = FAMILIES.get(name)
    assert "toy" in fam.presets
    assert fam.example_inputs is not None, f"family '{name}' must provide example_inputs"
    assert getattr(fam.config_class, "model_type", ""), "config class needs a model_type"
    torch.manual_seed(0)
    config = fam.make_config("toy")
    model = fam.model_class(config)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0 < n_params < 5_000_000, f"toy model has {n_params} parameters"
    inputs = fam.example_inputs(config, 2)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(8):
        torch.manual_seed(1)  # same noise (diffusion timesteps, dropout) every step: only the weights change
        out = model(**inputs)
        assert out.loss.dim() == 0 and torch.isfinite(out.loss)
        losses.append(out.loss.item())
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < losses[0], f"{name}: one batch repeated did not lower the loss: {losses}"
    model.eval()
    model.save_pretrained(tmp_path / name)
    assert (tmp_path / name / "model.safetensors").is_file()
    again = fam.model_class.from_pretrained(tmp_path / name).eval()
    assert type(again.config) is type(model.config)
    sd1, sd2 = model.state_dict(), again.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k], sd2[k]), k
    with torch.no_grad():
        torch.manual_seed(2)
        l1 = model(**inputs).loss
        torch.manual_seed(2)
        l2 = again(**inputs).loss
    assert torch.allclose(l1, l2), f"{name}: reloaded model computes a different loss"
