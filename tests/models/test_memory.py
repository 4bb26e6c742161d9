"""Memory model family: parallel encoding, memory modes, padding invariance, save/load, the recipe,
the ``memory_ae`` space contract, the frozen-encoder strategy and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import write_config
from memlab.config import load_config
from memlab.errors import MemlabError
from memlab.models.memory import MemoryConfig, MemoryModel
from memlab.registry import FAMILIES, RECIPES, SPACES
from memlab.testing import check_embedding_space
from memlab.train.experiment import run_experiment

ROOT = Path(__file__).resolve().parents[2]


def _config(path: Path, corpus: Path, overrides: dict | None = None, **sections) -> Path:
    """A toy ``memory`` recipe config on ``corpus`` (vocab 300) with section overrides."""
    model = {"family": "memory", "preset": "toy", "overrides": overrides or {}}
    return write_config(path, corpus, recipe="memory", model=model, **sections)


def _tiny(**kw) -> MemoryModel:
    base = dict(vocab_size=97, chunk_len=8, encoder_hidden_size=32, hidden_size=32, encoder_intermediate_size=64,
                intermediate_size=64, encoder_heads=2, num_attention_heads=2, max_chunks=4)
    torch.manual_seed(0)
    return MemoryModel(MemoryConfig(**{**base, **kw})).eval()


@pytest.mark.parametrize("encoder_type", ["transformer", "mixer"])
@pytest.mark.parametrize("pooling,k", [("mean", 1), ("last", 2), ("query", 3), ("flatten", 2)])
def test_parallel_encoding_and_padding_invariance(encoder_type, pooling, k):
    m = _tiny(encoder_type=encoder_type, pooling=pooling, num_memories=k, memory_dim=16)
    ids = torch.randint(5, 97, (2, 3, 8))
    mem = m.encode_chunks(ids)  # (B, C, K, M)
    assert mem.shape == (2, 3, k, 16)
    one = torch.stack([m.encode(ids[:, c]) for c in range(3)], 1)  # chunk by chunk
    assert torch.allclose(mem, one, atol=1e-5)
    # a short sequence alone == the same sequence right-padded inside a batch
    short = ids[0, 0, :5][None]
    padded = torch.cat([short, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    assert torch.allclose(m.encode(short), m.encode(padded, mask), atol=1e-5)
    # different chunks give different memories
    assert not torch.allclose(mem[:, 0], mem[:, 1])


def test_memory_modes_see_only_what_they_should():
    m = _tiny(num_memories=2, memory_injection="unrolled")
    ids = torch.randint(5, 97, (2, 4, 8))
    mem = m.encode_chunks(ids)
    base = m.decode(mem, ids, "previous")  # (B, C, L, V)
    assert base.shape == (2, 4, 8, 97)
    changed = mem.clone()
    changed[:, 2] += 1.0
    diff = (m.decode(changed, ids, "previous") - base).abs().amax(dim=(0, 2, 3))  # per chunk
    assert diff[:3].max() == 0 and diff[3] > 0  # only chunks after 2 read memory 2
    own = m.decode(mem, ids, "own")
    diff_own = (m.decode(changed, ids, "own") - own).abs().amax(dim=(0, 2, 3))
    assert diff_own[2] > 0 and diff_own[[0, 1, 3]].max() == 0
    # no memory: the decoder is a plain causal LM
    none = m.decode(None, ids, "none")
    later = ids.clone()
    later[..., 5:] = 3
    assert torch.allclose(m.decode(None, later, "none")[..., :5, :], none[..., :5, :], atol=1e-5)


@pytest.mark.parametrize("injection", ["prefix", "unrolled"])
def test_previous_mode_all_at_once_equals_row_by_row(injection):
    m = _tiny(num_memories=2, memory_injection=injection)
    ids = torch.randint(5, 97, (2, 4, 8))
    mem = m.encode_chunks(ids)  # (B, C, K, M)
    with torch.no_grad():
        full = m.decode(mem, ids, "previous")  # (B, C, L, V)
        for c in range(4):  # chunk c decoded alone with only the memories of chunks < c
            row = m.decode(mem[:, : c + 1], ids[:, : c + 1], "previous")[:, c]
            assert torch.allclose(row, full[:, c], atol=1e-5), c


def test_previous_mode_output_ignores_memories_of_same_and_later_chunks():
    m = _tiny(num_memories=2, memory_injection="unrolled")
    ids = torch.randint(5, 97, (2, 4, 8))
    mem = m.encode_chunks(ids)
    with torch.no_grad():
        base = m.decode(mem, ids, "previous")
        for c in range(4):
            changed = mem.clone()
            changed[:, c:] = torch.randn_like(changed[:, c:]) * 3.0  # chunks >= c get other memories
            out = m.decode(changed, ids, "previous")
            assert torch.equal(out[:, : c + 1], base[:, : c + 1]), c  # chunk c and earlier: unchanged
            if c + 1 < 4:
                assert (out[:, c + 1:] - base[:, c + 1:]).abs().amax() > 0


@pytest.mark.parametrize("mode", ["previous", "own"])
def test_logits_to_keep_equals_the_tail_of_the_full_logits(mode):
    m = _tiny(num_memories=2)
    ids = torch.randint(5, 97, (2, 3, 8))  # (B, C, L)
    with torch.no_grad():
        full = m(input_ids=ids, decoder_input_ids=ids, labels=ids, memory_mode=mode)
        flat = full.logits.reshape(2, 3 * 8, 97)  # (B, C*L, V) chunk-major
        last = m(input_ids=ids, decoder_input_ids=ids, memory_mode=mode, logits_to_keep=1).logits  # (B, 1, V)
        assert last.shape == (2, 1, 97)
        assert torch.allclose(last[:, 0], full.logits[:, -1, -1], atol=1e-5)
        for n in (5, 8, 11, 24):  # within the last chunk, exactly it, across chunks, every position
            out = m(input_ids=ids, decoder_input_ids=ids, labels=ids, memory_mode=mode, logits_to_keep=n)
            assert out.logits.shape == (2, n, 97)
            assert torch.allclose(out.logits, flat[:, -n:], atol=1e-5), n
            ref = torch.nn.functional.cross_entropy(flat[:, -n:].flatten(0, 1), ids.reshape(2, 24)[:, -n:].flatten())
            assert torch.allclose(out.loss, ref, atol=1e-5), n  # the loss covers the kept positions only
        out = m(input_ids=ids, decoder_input_ids=ids, labels=ids, memory_mode=mode, logits_to_keep=24)
        assert torch.allclose(out.loss, full.loss, atol=1e-6)
        # 2-D input (one chunk): (B, n, V) like transformers; the decoder entry point agrees
        one = m(input_ids=ids[:, 0], decoder_input_ids=ids[:, 0], memory_mode=mode)
        assert torch.allclose(m(input_ids=ids[:, 0], decoder_input_ids=ids[:, 0], memory_mode=mode,
                                logits_to_keep=1).logits[:, 0], one.logits[:, -1], atol=1e-5)
        mem = m.encode_chunks(ids)
        assert torch.allclose(m.decode(mem, ids, mode, logits_to_keep=1)[:, 0], full.logits[:, -1, -1], atol=1e-5)
    for bad in (-1, 25, 1.0, True, torch.tensor([1])):
        with pytest.raises(MemlabError, match="logits_to_keep"):
            m(input_ids=ids, decoder_input_ids=ids, memory_mode=mode, logits_to_keep=bad)


def test_loss_drops_and_round_trip(tmp_path):
    m = _tiny(num_memories=1).train()
    ids = torch.randint(5, 97, (8, 2, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=5e-3)
    first = None
    for _ in range(15):
        loss = m(input_ids=ids).loss  # blank copy by default
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 0.3
    m.eval().save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    m2 = MemoryModel.from_pretrained(tmp_path).eval()
    assert torch.allclose(m2(input_ids=ids).logits, m(input_ids=ids).logits, atol=1e-6)


def test_family_presets_and_bad_model_input():
    fam = FAMILIES.get("memory")
    assert fam.make_model("toy").config.hidden_size <= 64
    with pytest.raises(MemlabError, match="num_memories"):
        _tiny(num_memories=9)  # K larger than the chunk
    with pytest.raises(MemlabError, match="pooling"):
        _tiny(pooling="max")
    m = _tiny()
    with pytest.raises(MemlabError, match="does not fit"):
        m.encode(torch.randint(5, 97, (1, 9)))  # chunk longer than the model
    with pytest.raises(MemlabError, match="max_chunks"):
        m.decode(torch.zeros(1, 5, 1, 32), torch.ones(1, 5, 8, dtype=torch.long), "own")  # 5 chunks > max_chunks=4


def test_shipped_configs_load():
    paths = sorted((ROOT / "configs" / "memory").glob("*.yaml"))
    assert len(paths) >= 12
    for p in paths:
        cfg = load_config(p)
        assert cfg.recipe == "memory" and cfg.model.family == "memory", p
        RECIPES.get("memory").build_loss(cfg.options)  # every phase's objective and options are valid
        over = {k: v for k, v in cfg.model.overrides.items()}
        FAMILIES.get("memory").make_config(cfg.model.preset, vocab_size=cfg.data.vocab_size, **over).validate_memory()


@pytest.fixture(scope="module")
def ae_run(tmp_path_factory, small_corpus):
    """The shipped toy config (blank copy), on the small test corpus with 2 chunks of 48 tokens."""
    tmp = tmp_path_factory.mktemp("ae")
    cfg = load_config(ROOT / "configs" / "memory" / "toy.yaml", [
        f"data.corpus={small_corpus}", "data.vocab_size=300", "data.seq_len=96", "data.max_documents=null",
        "model.overrides.chunk_len=48", "train.max_steps=12", "train.eval_every=6", "train.save_every=12",
        "train.log_every=3", "train.lr=3e-3"])
    run = tmp / "run"
    run_experiment(cfg, run)
    return run


def test_toy_config_trains_and_is_a_space(ae_run, tmp_path):
    recs = [json.loads(x) for x in (ae_run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r["split"] == "eval"]
    assert evals and {"blank_copy_accuracy", "copy_accuracy", "next_token_accuracy"} <= set(evals[-1])
    train = [r["loss"] for r in recs if r["split"] == "train"]
    assert train[-1] < train[0]
    summary = json.loads((ae_run / "summary.json").read_text())
    assert summary["mfu"] > 0 and summary["tokens_per_s"] > 0
    space = SPACES.get("memory_ae")(str(ae_run))
    assert space.dim == space.model.config.space_dim
    check_embedding_space(space)
    # a save_pretrained folder with the tokenizer beside it loads the same space
    space.model.save_pretrained(tmp_path / "saved")
    space.tokenizer.save_pretrained(tmp_path / "saved")
    again = SPACES.get("memory_ae")(str(tmp_path / "saved"))
    s = ["It was a fine day."]
    assert torch.allclose(again.encode_text(s), space.encode_text(s))


def test_mixer_space_with_several_memories_passes_contract(ae_run):
    from memlab.loading import load_run_tokenizer
    from memlab.models.memory.space import MemorySpace

    tok = load_run_tokenizer(ae_run)
    cfg = dict(FAMILIES.get("memory").presets["toy"], vocab_size=len(tok), encoder_type="mixer", num_memories=2,
               pooling="query", copy_inputs="shifted", pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id, chunk_len=48)
    torch.manual_seed(0)
    space = MemorySpace(MemoryModel(MemoryConfig(**cfg)), tok)
    check_embedding_space(space)
    assert space.encode_text(["A short one.", "A longer sentence than the first."]).shape == (2, 2, space.dim)


def test_frozen_encoder_is_loaded_cached_and_unchanged(ae_run, small_corpus, tmp_path):
    from safetensors.torch import load_file

    from memlab.loading import resolve_model_dir

    cfg = _config(tmp_path / "c.yaml", small_corpus, data={"vocab_size": 300, "seq_len": 96},
                       overrides={"chunk_len": 48},
                       train={"max_steps": 4, "eval_every": 4, "save_every": 4, "log_every": 2},
                       options={"objective": "next_token", "encoder_from": str(ae_run)})
    summary = run_experiment(load_config(cfg), tmp_path / "run")
    assert summary["frozen_encoder"]
    src = load_file(str(resolve_model_dir(ae_run) / "model.safetensors"))
    out = load_file(str(tmp_path / "run" / "checkpoints" / "step-00000004" / "model.safetensors"))
    enc = [k for k in src if k.startswith("encoder.")]
    assert enc and all(torch.equal(src[k], out[k]) for k in enc)
    dec = [k for k in src if k.startswith("decoder.layers")]
    assert not all(torch.equal(src[k], out[k]) for k in dec)  # the decoder trained
    # a frozen encoder whose width does not match: a clear error before training
    bad = _config(tmp_path / "bad.yaml", small_corpus, data={"vocab_size": 300, "seq_len": 96},
                       overrides={"chunk_len": 48, "memory_dim": 24},
                       options={"objective": "next_token", "encoder_from": str(ae_run)})
    with pytest.raises(MemlabError, match="memory width"):
        run_experiment(load_config(bad), tmp_path / "run-bad")
    assert not (tmp_path / "run-bad" / "metrics.jsonl").exists()


def test_bad_recipe_input_fails_before_training(small_corpus, tmp_path):
    cfg = _config(tmp_path / "c.yaml", small_corpus, data={"vocab_size": 300, "seq_len": 40})
    with pytest.raises(MemlabError, match="whole number of model chunks"):
        run_experiment(load_config(cfg), tmp_path / "r1")
    cfg = _config(tmp_path / "c2.yaml", small_corpus, data={"vocab_size": 300, "seq_len": 32},
                       options={"curriculum": "phases", "phases": [{"objective": "blank_copy", "steps": 2},
                                                                  {"objective": "telepathy"}]})
    with pytest.raises(MemlabError, match="unknown objective 'telepathy'"):
        run_experiment(load_config(cfg), tmp_path / "r2")
    cfg = _config(tmp_path / "c3.yaml", small_corpus, data={"vocab_size": 300, "seq_len": 32},
                       overrides={"num_memories": 17})
    with pytest.raises(MemlabError, match="num_memories"):
        run_experiment(load_config(cfg), tmp_path / "r3")


def test_sentence_view_trains_a_sentence_space(small_corpus, tmp_path):
    cfg = _config(tmp_path / "c.yaml", small_corpus, overrides={"chunk_len": 48},
                  data={"vocab_size": 300, "seq_len": 48},
                  train={"max_steps": 4, "eval_every": 4, "save_every": 4, "log_every": 2},
                  options={"view": "sentences", "objective": "blank_copy", "eval_objectives": ["blank_copy"]})
    summary = run_experiment(load_config(cfg), tmp_path / "run")
    assert summary["train_examples"] > 50 and summary["chunks_per_example"] == 1
    space = SPACES.get("memory_ae")(str(tmp_path / "run"))
    check_embedding_space(space)


def test_evaluation_suite(ae_run):
    from memlab.models.memory.evaluation import evaluate_run, other_domain_texts

    assert sum(len(t) for t in other_domain_texts()) > 100_000  # pydoc topics: a real other-domain corpus
    res = evaluate_run(ae_run, n=4, objectives=("blank_copy", "next_token"))
    for name in ("heldout", "other_domain", "random"):
        assert res[name]["examples"] == 4
        assert 0 <= res[name]["blank_copy_accuracy"] <= 1 and res[name]["next_token_loss"] > 0
    # a barely trained model predicts frequent tokens: random tokens must score lower than real text
    assert res["random"]["blank_copy_accuracy"] <= res["heldout"]["blank_copy_accuracy"]


def test_train_offsets_cut_the_stream_at_shifted_boundaries():
    from memlab.errors import ConfigError
    from memlab.models.memory.data import chunk_view

    class Tok:
        eos_token_id = 0

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [list(range(1, 41))]}

    one = chunk_view(["x"], Tok(), 8, 4)  # (5, 2, 4): tokens 1..40
    two = chunk_view(["x"], Tok(), 8, 4, offsets=2)
    assert one.shape == (5, 2, 4) and two.shape == (9, 2, 4)
    assert torch.equal(two[:5], one)
    assert two[5, 0].tolist() == [3, 4, 5, 6]  # the second cut starts half a chunk later
    with pytest.raises(ConfigError, match="train_offsets"):
        chunk_view(["x"], Tok(), 8, 4, offsets=5)


def test_memory_noise_acts_only_in_training_and_scales_with_the_memory():
    from memlab.models.memory.modeling_memory import add_memory_noise

    model = _tiny(memory_noise=0.5)
    ids = torch.randint(3, 97, (4, 2, 8))
    mem = model.encode_chunks(ids)  # (B, C, K, M)
    dec = torch.full_like(ids, model.config.blank_id)
    clean = model.decode(mem, dec)
    assert torch.equal(model.decode(mem, dec), clean)  # eval mode: deterministic, no noise
    model.train()
    torch.manual_seed(1)
    noisy = model.decode(mem, dec)
    assert not torch.allclose(noisy, clean, atol=1e-4)
    model.config.memory_noise = 0.0
    assert torch.allclose(model.decode(mem, dec), clean, atol=1e-5)  # off: train mode equals eval (no dropout)
    # the noise is sigma * rms(m) per vector: scale-free, and its relative size is sigma
    m = torch.randn(20000, 1, 64) * torch.logspace(-3, 3, 20000)[:, None, None]
    rel = (add_memory_noise(m, 0.3) - m).pow(2).mean(-1).sqrt() / m.pow(2).mean(-1).sqrt()
    assert abs(rel.mean().item() - 0.3) < 0.01
    # uniform sampling: each vector's relative noise is spread over (0, sigma), mean sigma / 2
    rel = (add_memory_noise(m, 0.8, "uniform") - m).pow(2).mean(-1).sqrt() / m.pow(2).mean(-1).sqrt()
    assert abs(rel.mean().item() - 0.4) < 0.02 and rel.min() < 0.05 and 0.7 < rel.max() < 1.1
    with pytest.raises(MemlabError, match="memory_noise"):
        MemoryConfig(memory_noise=-0.1).validate_memory()
    with pytest.raises(MemlabError, match="memory_noise_sampling"):
        MemoryConfig(memory_noise_sampling="gaussian").validate_memory()


def test_init_from_keeps_the_architecture_and_changes_only_training_keys(ae_run, small_corpus, tmp_path):
    from memlab.loading import load_pretrained

    base = {"data": {"vocab_size": 300, "seq_len": 96},
            "train": {"max_steps": 2, "eval_every": 2, "save_every": 2, "log_every": 1},
            "options": {"objective": "blank_copy", "eval_objectives": ["blank_copy"]}}
    cfg = load_config(_config(tmp_path / "c.yaml", small_corpus, overrides={"memory_noise": 0.25}, **base),
                      [f"model.init_from={ae_run}"])
    run_experiment(cfg, tmp_path / "run")
    saved = load_pretrained(tmp_path / "run")
    assert saved.config.memory_noise == 0.25 and saved.config.chunk_len == 48  # chunk_len from the loaded model
    bad = load_config(_config(tmp_path / "b.yaml", small_corpus, overrides={"hidden_size": 16}, **base),
                      [f"model.init_from={ae_run}"])
    with pytest.raises(MemlabError, match="hidden_size.*only memory_noise, memory_noise_sampling, copy_inputs"):
        run_experiment(bad, tmp_path / "run-bad")
    assert not (tmp_path / "run-bad" / "metrics.jsonl").exists()


def test_separate_own_memory_path_keeps_next_token_off_the_copy_weights():
    m = _tiny(memory_injection="unrolled", own_memory_path="separate").train()
    ids = torch.randint(5, 97, (2, 3, 8))
    mem = m.encode_chunks(ids).detach()
    m.decode(mem, ids, "previous").float().logsumexp(-1).mean().backward()  # a next-token pass
    own = [n for n, p in m.named_parameters() if n.split(".")[1].startswith("own_")]
    assert sorted(own) == ["decoder.own_norm.bias", "decoder.own_norm.weight", "decoder.own_proj.weight",
                           "decoder.own_unroll.weight", "decoder.own_unroll_norm.bias", "decoder.own_unroll_norm.weight"]
    grads = dict(m.named_parameters())
    assert all(grads[n].grad is None for n in own) and grads["decoder.unroll.weight"].grad is not None
    m.zero_grad()
    m.decode(mem, ids, "own").float().logsumexp(-1).mean().backward()  # a copy pass
    assert all(grads[n].grad is not None for n in own) and grads["decoder.unroll.weight"].grad is None
    assert m.decoder.own_unroll_norm.weight[0].item() == m.config.injection_scale
    with pytest.raises(MemlabError, match="own_memory_path"):
        _tiny(own_memory_path="private")
