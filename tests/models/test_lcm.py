"""LCM baselines: the MSE loss against a direct computation, the diffusion model's training pass,
sampling (determinism, guidance, causality), save/load, and both toy configs through the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from toy_spaces import SENTENCES, document_batch, fitted_space, random_space

from memlab.models.lcm.recipe import LCMLoss
from memlab.models.sentence.spaces import SpaceHandle
from memlab.registry import FAMILIES


pytestmark = pytest.mark.usefixtures("one_thread")




DOCS = [SENTENCES[:3] + ["End of sequence."], SENTENCES[3:8] + ["End of sequence."]]


def test_mse_loss_equals_direct_computation_and_trains():
    torch.manual_seed(0)
    handle = SpaceHandle(random_space(), "toy_ae")
    batch = document_batch(handle, DOCS)
    model = FAMILIES.get("lcm_mse").make_model("toy", embed_dim=32)
    model.backbone.normalizer.fit(batch["embeddings"][batch["sentence_mask"].bool()])
    norm = model.backbone.normalizer
    got = LCMLoss(handle, diffusion=False)(model, batch)
    sq, n = 0.0, 0
    for doc in DOCS:
        emb = handle.encode_text(doc)  # (n, E)
        pred = norm.normalize(model(emb[None, :-1]).predictions[0])  # (n-1, E)
        sq += ((pred - norm.normalize(emb[1:])) ** 2).sum().item()
        n += pred.numel()
    assert got.loss.item() == pytest.approx(sq / n, rel=1e-4)
    model.eval()
    groups = LCMLoss(handle, diffusion=False).evaluate(model, batch)
    assert set(groups["loss"].metrics) == {"cosine"} and {"next_sentence_ce", "token_accuracy"} <= set(groups["decoder"].metrics)
    assert groups["loss"].loss.item() == pytest.approx(sq / n, rel=1e-4)
    assert groups["loss"].weight.item() == sum(len(d) - 1 for d in DOCS)  # the MSE is a mean over the predicted sentences
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = LCMLoss(handle, diffusion=False)(model, batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_diffusion_trains_and_samples():
    torch.manual_seed(0)
    handle = SpaceHandle(random_space(), "toy_ae")
    batch = document_batch(handle, DOCS)
    model = FAMILIES.get("lcm_diffusion").make_model("toy", embed_dim=32, num_timesteps=50, ddim_steps=5)
    model.backbone.normalizer.fit(batch["embeddings"][batch["sentence_mask"].bool()])
    # AdaLN-Zero: every denoiser block starts as the identity
    blk = model.denoiser.blocks[0]
    assert torch.count_nonzero(blk.mod.weight) == 0 and torch.count_nonzero(model.denoiser.mod_out.weight) == 0
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = LCMLoss(handle, diffusion=True)(model, batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])
    model.eval()
    emb, mask = batch["embeddings"], batch["sentence_mask"]
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    a = model.sample(emb, mask, generator=g())
    assert a.shape == (2, 32) and torch.isfinite(a).all()
    assert torch.equal(a, model.sample(emb, mask, generator=g()))
    # causality: the sample for a prefix ignores what comes after it
    short = model.sample(emb[:1, :2], generator=g())
    changed = emb[:1].clone()
    changed[:, 2:] += 5.0
    m1 = torch.tensor([[1, 1, 0, 0]])
    assert torch.allclose(short, model.sample(changed[:, :4], m1, generator=g()), atol=1e-5)
    # guidance: scale 0 is the unconditional model, which ignores the context entirely
    u1 = model.sample(emb[:1, :2], guidance_scale=0.0, generator=g())
    u2 = model.sample(emb[:1, :2] + 3.0, guidance_scale=0.0, generator=g())
    assert torch.allclose(u1, u2, atol=1e-5)
    assert not torch.allclose(model.sample(emb[:1, :2] + 3.0, generator=g()), short)
    ev = LCMLoss(handle, diffusion=True).evaluate(model, batch)["decoder"]
    assert torch.isfinite(ev.metrics["next_sentence_ce"])


def test_diffusion_save_load_round_trip(tmp_path):
    model = FAMILIES.get("lcm_diffusion").make_model("toy", embed_dim=32, ddim_steps=4).eval()
    model.backbone.normalizer.fit(torch.randn(64, 32))
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path).eval()
    x = torch.randn(1, 3, 32)
    s1 = model.sample(x, generator=torch.Generator().manual_seed(0))
    s2 = again.sample(x, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(s1, s2, atol=1e-6) and again.config.ddim_steps == 4


@pytest.mark.parametrize("config", ["configs/lcm/mse_toy.yaml", "configs/lcm/diffusion_toy.yaml"])
def test_toy_configs_train_and_generate(config, tmp_path_factory, small_corpus, capsys):
    from memlab.app.cli import main

    tmp = tmp_path_factory.mktemp("lcm")
    _, spec = fitted_space(tmp / "space", steps=30)
    run = tmp / "run"
    args = ["train", config, f"data.corpus={small_corpus}", "data.max_documents=null", f"options.space={spec}",
            "options.window_sentences=6", "options.max_sentence_tokens=24", f"options.cache_dir={tmp / 'cache'}",
            "train.max_steps=16", "train.batch_size=4", "train.eval_every=16", "train.eval_batches=1",
            "train.log_every=4", "train.save_every=16", "--out", str(run)]
    assert main(args) == 0
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in recs if r["split"] == "train"]
    assert train[-1] < train[0], train
    ev = [r for r in recs if r["split"] == "eval"][-1]
    assert ev["next_sentence_ce"] > 0
    capsys.readouterr()
    assert main(["generate", "--run", str(run), "--prompt", "Jane was ill. Elizabeth laughed.",
                 "--max-sentences", "2", "--max-new-tokens", "10"]) == 0


def test_recipe_rejects_a_family_mismatch_and_unfrozen_lcm_decoder(tmp_path, small_corpus):
    from memlab.config import load_config
    from memlab.errors import ConfigError
    from memlab.registry import RECIPES

    cfg = load_config("configs/lcm/mse_toy.yaml", ["model.family=sonar_llm"])
    with pytest.raises(ConfigError, match="trains family 'lcm_mse'"):
        RECIPES.get("lcm_mse").setup(cfg, tmp_path)
    model = FAMILIES.get("lcm_mse").make_model("toy")
    with pytest.raises(ConfigError, match="does not apply to lcm_mse"):
        RECIPES.get("lcm_mse").attach_trainable_space(model, SpaceHandle(random_space(), "toy_ae"))
