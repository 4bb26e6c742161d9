"""SONAR-LLM: the toy space contract, the loss against a direct computation, generation and its
stop rule, bad input, and a toy config trained end to end through the CLI."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from toy_spaces import SENTENCES, document_batch, fitted_space, random_space

from memlab.errors import MemlabError
from memlab.models.sentence.data import make_documents, windows, with_end_sentence
from memlab.models.sentence.generation import generate_sentences, prompt_sentences
from memlab.models.sonar_llm.training import SonarLLMLoss
from memlab.models.sentence.spaces import SpaceHandle
from memlab.registry import FAMILIES
from memlab.testing import check_embedding_space


pytestmark = pytest.mark.usefixtures("one_thread")




@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A toy space fitted briefly on a few sentences: (space, spec)."""
    return fitted_space(tmp_path_factory.mktemp("space"))


DOCS = [SENTENCES[:3] + ["End of sequence."], SENTENCES[3:8] + ["End of sequence."]]


def test_toy_space_honours_the_protocol():
    check_embedding_space(random_space())


def test_loss_equals_direct_cross_entropy(fitted):
    torch.manual_seed(0)
    space, spec = fitted
    handle = SpaceHandle(space, spec)
    model = FAMILIES.get("sonar_llm").make_model("toy", embed_dim=32).eval()
    batch = document_batch(handle, DOCS)
    got = SonarLLMLoss(handle)(model, batch)
    # direct: every predicted embedding decoded alone, teacher forced on the true next sentence
    total, count = 0.0, 0
    for b, doc in enumerate(DOCS):
        emb = handle.encode_text(doc)  # (n, E)
        pred = model(emb[None, :-1]).predictions[0]  # (n-1, E)
        for i, sent in enumerate(doc[1:]):
            ids = torch.tensor([space.tokenizer(sent, add_special_tokens=False)["input_ids"]])
            dec_in, labels = space.decoder_inputs(ids, torch.ones_like(ids))
            logits = space.decode_logits(pred[i : i + 1], dec_in)
            total += F.cross_entropy(logits[0], labels[0], ignore_index=-100, reduction="sum").item()
            count += int((labels != -100).sum())
    assert got.weight == count
    assert got.loss.item() == pytest.approx(total / count, rel=1e-4)
    # and it trains: a few steps on the batch lower the loss, through the frozen decoder only
    model.train()
    model.backbone.normalizer.fit(batch["embeddings"][batch["sentence_mask"].bool()])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(20):
        loss = SonarLLMLoss(handle)(model, batch).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.95 * first, (first, loss.item())
    assert all(p.grad is None for p in space.parameters()), "the space must stay frozen"


class _Fixed(torch.nn.Module):
    """A stand-in model that always predicts one embedding (to test the stop rule)."""

    def __init__(self, z):
        super().__init__()
        self.z = torch.nn.Parameter(z.clone())
        self.config = type("C", (), {"embed_dim": z.shape[-1], "stop_cosine": 0.98, "end_sentence": "End of sequence.",
                                     "max_position_embeddings": 64})()

    def predict_next(self, emb, mask=None):
        return self.z.expand(emb.shape[0], -1)


def test_generation_stops_at_the_end_sentence_or_the_limit():
    handle = SpaceHandle(random_space(), "toy_ae")
    end = handle.encode_text(["End of sequence."])[0]
    assert generate_sentences(_Fixed(end), handle, [["Hello there.", "Who is it?"]]) == [[]]
    other = handle.encode_text(["A completely different sentence, long and odd."])[0]
    out = generate_sentences(_Fixed(other), handle, [["Hello there."], ["One.", "Two."]], max_sentences=3,
                             max_new_tokens=6)
    assert [len(o) for o in out] == [3, 3] and all(isinstance(s, str) for o in out for s in o)


def test_bad_input_gets_clear_errors():
    with pytest.raises(MemlabError, match="empty"):
        with_end_sentence([], "End of sequence.")
    with pytest.raises(MemlabError, match="one sentence"):
        with_end_sentence(["Only this."], "End of sequence.")
    with pytest.raises(MemlabError, match="one sentence"):
        make_documents([["A.", "B."], ["Alone."]], 8, "End.", short="error")
    docs, dropped = make_documents([["A.", "B.", "C."], ["Alone."], []], 2, "End.")
    assert dropped == 2 and docs == [["A.", "B.", "C.", "End."]]  # the 1-sentence tail joined its window
    assert windows(list("abcdefg"), 3) == [list("abc"), list("defg")]
    with pytest.raises(MemlabError, match="no sentence"):
        prompt_sentences("   \n  ")
    handle = SpaceHandle(random_space(dim=32), "toy_ae")
    model = FAMILIES.get("sonar_llm").make_model("toy", embed_dim=48)
    with pytest.raises(MemlabError, match="width 32.*width 48"):
        generate_sentences(model, handle, [["Hello."]])
    with pytest.raises(MemlabError, match="width"):
        model(torch.zeros(1, 2, 32))


def test_save_load_round_trip(tmp_path):
    model = FAMILIES.get("sonar_llm").make_model("toy", embed_dim=32, space="toy_ae").eval()
    model.backbone.normalizer.fit(torch.randn(100, 32) * 3 + 1)
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path).eval()
    x = torch.randn(2, 5, 32)
    assert torch.allclose(model(x).predictions, again(x).predictions, atol=1e-6)
    assert torch.equal(model.backbone.normalizer.scale, again.backbone.normalizer.scale)
    assert again.config.space == "toy_ae"


def test_toy_config_trains_and_generates(tmp_path, small_corpus, capsys, fitted):
    from memlab.app.cli import main

    space, spec = fitted
    run = tmp_path / "run"
    args = ["train", "configs/sonar_llm/toy.yaml", f"data.corpus={small_corpus}", "data.max_documents=null",
            f"options.space={spec}", "options.window_sentences=6", "options.max_sentence_tokens=24",
            f"options.cache_dir={tmp_path / 'cache'}", "train.max_steps=24", "train.batch_size=4",
            "train.eval_every=24", "train.log_every=4", "train.save_every=24", "--out", str(run)]
    assert main(args) == 0
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in recs if r["split"] == "train"]
    assert train[-1] < train[0], train
    assert json.loads((run / "space.json").read_text())["space"] == spec
    cfg = json.loads(next((run / "checkpoints").glob("step-*/config.json")).read_text())
    assert cfg["space"] == spec and cfg["embed_dim"] == 32
    # the cache is reused: a second run encodes nothing new
    caches = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert any(c.startswith("train-") for c in caches) and any(c.startswith("validation-") for c in caches)
    capsys.readouterr()
    assert main(["generate", "--run", str(run), "--prompt", "Jane was ill. Elizabeth laughed.",
                 "--max-sentences", "2", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out.strip()
    assert isinstance(out, str)
    model, handle = _load(run)
    assert handle.spec == spec
    # the comparison script scores held-out next sentences
    import importlib.util

    spec_ = importlib.util.spec_from_file_location("compare", "benchmarks/sonar_llm_compare.py")
    compare = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(compare)
    out_json = tmp_path / "cmp.json"
    assert compare.main(["--run", f"sonar_llm={run}", "--split", "validation", "--prompts", "4",
                         "--max-new-tokens", "8", "--out", str(out_json)]) == 0
    res = json.loads(out_json.read_text())["results"]["sonar_llm"]
    assert 0 <= res["rouge_l"] <= 1 and 0 <= res["bleu"] <= 100
    with pytest.raises(MemlabError, match="no sentence"):
        generate_sentences(model, handle, [["Hello."], []])


def _load(run):
    from memlab.models.sentence.generation import load_sentence_model

    return load_sentence_model(run)


def test_shipped_configs_load():
    from pathlib import Path

    from memlab.config import load_config

    files = sorted(Path("configs/sonar_llm").glob("*.yaml")) + sorted(Path("configs/lcm").glob("*.yaml"))
    assert files
    for f in files:
        cfg = load_config(f)
        assert cfg.recipe in ("sonar_llm", "lcm_mse", "lcm_diffusion") and cfg.model.family == cfg.recipe


def test_unfrozen_decoder_is_trained_saved_and_restored(tmp_path, small_corpus, fitted):
    from memlab.app.cli import main
    from memlab.models.sentence.generation import load_sentence_model

    space, spec = fitted
    before = {k: v.clone() for k, v in space.state_dict().items()}
    run = tmp_path / "run"
    assert main(["train", "configs/sonar_llm/toy.yaml", f"data.corpus={small_corpus}", "data.max_documents=null",
                 f"options.space={spec}", "options.window_sentences=6", "options.max_sentence_tokens=24",
                 "options.unfreeze_decoder=true", f"options.cache_dir={tmp_path / 'cache'}", "train.max_steps=3",
                 "train.batch_size=4", "train.eval_every=3", "train.eval_batches=1", "train.save_every=3",
                 "--out", str(run)]) == 0
    model, handle = load_sentence_model(run)
    assert model.config.decoder_trained
    after = handle.space.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(k.startswith(("dec.", "lm_head", "z_in")) for k in changed), "the decoder was not trained"
    assert not any(k.startswith(("enc.", "enc_out")) for k in changed), "the encoder must not change"


def test_step_flops_include_the_frozen_decoder(fitted):
    from memlab.flops import matrix_params, measured_step_flops, transformer_train_flops
    from memlab.train.setup import StepOutput

    # a frozen linear layer in the loss path costs its forward pass plus the gradient to its input
    lin, frozen = torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False).requires_grad_(False)
    x = {"x": torch.randn(4, 8)}
    trained_only = measured_step_flops(lambda m, b: StepOutput(loss=m(b["x"]).sum()), lin, x)
    through = measured_step_flops(lambda m, b: StepOutput(loss=frozen(m(b["x"])).sum()), lin, x)
    assert trained_only == 2 * 4 * 8 * 8 * 2  # forward + weight gradient (x needs no gradient)
    assert through == trained_only + 2 * (2 * 4 * 8 * 8)  # + the frozen layer's forward and its input gradient
    assert lin.weight.grad is None
    # SONAR-LLM: the counted step is larger than the sentence model's own analytic training FLOPs
    space, spec = fitted
    handle = SpaceHandle(space, spec)
    model = FAMILIES.get("sonar_llm").make_model("toy", embed_dim=32)
    batch = document_batch(handle, DOCS[:1])
    got = measured_step_flops(SonarLLMLoss(handle), model, batch)
    c, n_sent = model.config, len(DOCS[0]) - 1
    own = transformer_train_flops(matrix_params(model), c.num_hidden_layers, c.hidden_size, n_sent)
    assert got > 1.5 * own
