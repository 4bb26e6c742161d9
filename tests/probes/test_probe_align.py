"""The alignment read-out (memlab.probes.readouts.align): the closed-form ridge map, the memory autoencoder read through
the map into its own space, a constant embedding, and bad targets refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from memlab.app.cli import main
from memlab.paths import resource
from memlab.probes.readouts.align import fit_align, fit_ridge
from memlab.probes.parts import ReadoutContext

pytestmark = pytest.mark.usefixtures("one_thread")

AE = resource("checkpoints") / "memory_ae-small"
COUNTER = resource("checkpoints") / "token_lm-toy"  # memlab's BPE, the memory autoencoder's tokenizer
FIT = ["seq_len=32", "max_chunk_tokens=32", f"chunk_tokenizer={COUNTER}"]  # chunks fit the autoencoder's 32 tokens


def _probe(tmp_path, model: str, *extra: str, control: bool = False) -> tuple[int, dict | None]:
    out = tmp_path / "run"
    rc = main(["probe", "--model", model, "--out", str(out), "--n-train", "160", "--n-eval", "40", "--epochs", "0.2",
               *([] if control else ["--no-control"]), "--threads", "1", "readouts=[align]", "select_decoder=false",
               "ci_resamples=300",
               *extra])
    report = out / "report.json"
    return rc, json.loads(report.read_text()) if report.is_file() else None


def test_ridge_is_the_least_squares_solution_of_the_augmented_system():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 7, generator=g, dtype=torch.float64) * torch.linspace(0.5, 3, 7, dtype=torch.float64) + 2
    y = z @ torch.randn(7, 4, generator=g, dtype=torch.float64) + 0.3 * torch.randn(50, 4, generator=g,
                                                                                      dtype=torch.float64)
    alpha = 0.05
    m = fit_ridge(z, y, alphas=(alpha,))
    x = ((z - z.mean(0)) / z.std(0)).numpy()  # (N, D) standardised
    lam = alpha * z.shape[0]
    aug_x = np.vstack([x, np.sqrt(lam) * np.eye(7)])  # ridge = least squares on [x; sqrt(lam) I] -> [y_c; 0]
    aug_y = np.vstack([(y - y.mean(0)).numpy(), np.zeros((7, 4))])
    ref = np.linalg.lstsq(aug_x, aug_y, rcond=None)[0]  # (D, D')
    assert np.abs(m.weight.numpy() - ref).max() < 1e-5
    assert np.abs(m.predict(z).double().numpy() - (x @ ref + y.mean(0).numpy())).max() < 1e-5


def test_leave_one_out_error_is_the_refit_one():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(25, 5, generator=g, dtype=torch.float64)
    y = z[:, :3] * 2 + torch.randn(25, 3, generator=g, dtype=torch.float64)
    alpha = 0.1
    m = fit_ridge(z, y, alphas=(alpha, 10.0))
    x = (z - z.mean(0)) / z.std(0)  # the map's standardisation, fixed across the folds
    lam, errs = alpha * z.shape[0], []
    for i in range(z.shape[0]):
        keep = torch.arange(z.shape[0]) != i
        xk, yk = x[keep], y[keep]
        xm, ym = xk.mean(0), yk.mean(0)  # the intercept refits on the fold; the penalty stays lam
        gram = (xk - xm).T @ (xk - xm) + lam * torch.eye(5, dtype=torch.float64)  # (D, D)
        w = torch.linalg.solve(gram, (xk - xm).T @ (yk - ym))  # (D, D')
        errs.append(((y[i] - ((x[i] - xm) @ w + ym)) ** 2).mean())
    assert m.loo_mse[alpha] == pytest.approx(float(torch.stack(errs).mean()), rel=1e-6)


def test_memory_autoencoder_read_through_the_map_into_itself_matches_its_own_decoder(tmp_path):
    rc, rep = _probe(tmp_path, f"space:memory_ae:{AE}", *FIT)
    assert rc == 0
    a = rep["readouts"]["align"]
    assert a["own"]["recovered"] > 0.8  # the chunks fit the autoencoder: its own decoder reads them
    assert abs(a["recovered"] - a["own"]["recovered"]) <= 0.05
    assert a["recovered"] - a["prior"] > 0.5
    bits = rep["readings"]["align_bits_per_chunk"]
    assert bits["low"] > 0 and bits["low"] <= bits["value"] <= bits["high"]
    assert 0 <= rep["readings"]["align_token_set_f1"]["value"] <= 1


def test_a_constant_embedding_reads_nothing_through_the_map(tmp_path):
    rc, rep = _probe(tmp_path, "synthetic:constant", *FIT, control=True)  # its calibration reads the control
    assert rc == 0
    a, r = rep["readouts"]["align"], rep["readings"]
    assert a["recovered"] == pytest.approx(a["prior"])
    for k in ("align_gain", "align_bits_per_chunk"):
        assert r[k]["low"] <= 0.0 <= r[k]["high"]
    assert "no evidence" in rep["retention"] or "bits" in rep["retention"]
    checks = {c["metric"]: c for c in rep["calibration"]["checks"]}
    assert checks["align gain"]["passed"] and rep["calibration"]["status"] == "passed"


def test_random_embeddings_add_no_bits():
    from memlab.probes.chunks import cut as T
    from memlab.probes.chunks.cut import cap_tokens
    from memlab.probes.encoders.sources import load_tokenizer
    from memlab.probes.readings import readings

    tok = load_tokenizer(str(COUNTER))
    tr = cap_tokens(T.probe_texts(32, 150, "train", "austen", 0), tok, 32)
    ev = cap_tokens(T.probe_texts(32, 48, "test", "austen", 0), tok, 32)
    g = torch.Generator().manual_seed(0)
    out = fit_align(torch.randn(150, 48, generator=g), torch.randn(48, 48, generator=g), ReadoutContext(tr, ev),
                    own=False)
    r = readings(None, None, None, readouts={"align": out["_per_chunk"]}, n_resamples=500)
    assert r["align_bits_per_chunk"]["low"] <= 0.0 <= r["align_bits_per_chunk"]["high"]
    assert abs(out["gain"]) < 0.02


@pytest.fixture
def bad_spaces():
    """Two test spaces, registered for the test and removed after it."""
    from memlab.registry import SPACES

    names = _register_bad_spaces()
    yield names
    for n in names:
        SPACES._items.pop(n, None)
        SPACES._docs.pop(n, None)


def _register_bad_spaces():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from memlab.models.sentence.toy_space import ToySentenceAE, byte_tokenizer
    from memlab.registry import SPACES

    def words_only(spec=None, **kw):  # a tokenizer that knows five words: the corpus is mostly unknown to it
        vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "the": 4, "of": 5, "and": 6}
        t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        t.pre_tokenizer = pre_tokenizers.Whitespace()
        tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                      unk_token="<unk>")
        return ToySentenceAE(tok, dim=8, width=16, layers=1).eval()

    SPACES.register("align_words_only", words_only, description="test: a five-word tokenizer")
    SPACES.register("align_short", lambda spec=None, **kw: ToySentenceAE(byte_tokenizer(), dim=8, width=16,
                                                                         layers=1, max_len=8).eval(),
                    description="test: reads 8 bytes")
    return ["align_words_only", "align_short"]


@pytest.mark.parametrize("extra, says", [
    (["readouts=[align]", "align_target=space:no_such_space"], "unknown embedding space 'no_such_space'"),
    (["align_target=space:toy_ae"], "'align_target' applies to readouts=align"),
    (["readouts=[align]", "align_target=toy_ae"], "align_target must be space:NAME[:PATH]"),
    (["readouts=[align]", "align_target=space:align_words_only"], "its tokenizer cannot encode the corpus text"),
    (["readouts=[align]", "align_target=space:align_short"], "more than the space reads (8)"),
    (["readouts=[align]", "--n-train", "5"], "5 is fewer than 10; raise n_train"),
])
def test_bad_alignment_targets_are_refused_in_one_line(tmp_path, capsys, bad_spaces, extra, says):
    out = tmp_path / "bad"
    rc = main(["probe", "--model", "synthetic:constant", "--out", str(out), "--n-train", "40", "--n-eval", "16",
               "--epochs", "0.2", "--no-control", *FIT, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("memlab: error: ") and says in err[0], err
    assert not out.exists()  # refused before anything was written


def test_a_learning_curve_reads_the_alignment_at_each_size(tmp_path):
    out = tmp_path / "curve"
    rc = main(["probe", "--model", "synthetic:bag", "--out", str(out), "--n-train", "40,80", "--n-eval", "24",
               "--epochs", "0.2", "--no-control", "readouts=[align]", "ci_resamples=200", *FIT])
    assert rc == 0
    rows = json.loads((out / "curve.json").read_text())["rows"]
    assert [r["n_train"] for r in rows] == [40, 80]
    for r in rows:
        assert 0 <= r["align_recovered"] <= 1 and "align_bits_per_chunk" in r["readings"]


def test_align_into_a_probe_of_concat_is_scored_in_its_decoders_tokenizer_and_calibrated(tmp_path, tokenizer,
                                                                                        small_corpus):
    """A fitted probe as the target space: its memories are its encoder's (concat codes in a 300-token BPE), its
    decoder rebuilds the texts in memlab's BPE (target_tokenizer; a pretrained decoder's targets take the same
    path): the read-out is scored over those tokens. The same codes on both sides (the map can be exact) keep the
    target's own reading, and the calibration passes; into the memory autoencoder (not a linear function of
    concat's codes) it fails."""
    enc_tok = tmp_path / "bpe300"
    tokenizer.save_pretrained(enc_tok)
    common = ["--model", f"synthetic:concat:{enc_tok}", "--corpus", str(small_corpus), "--seq-len", "2",
              "--n-train", "400", "--n-eval", "40", "--threads", "1", "--no-control", "select_decoder=false",
              "ci_resamples=200"]
    target = tmp_path / "target"
    assert main(["probe", *common, "--out", str(target), "--epochs", "3", f"target_tokenizer={COUNTER}",
                 "readouts=[]"]) == 0
    own = json.loads((target / "report.json").read_text())
    out = tmp_path / "align"
    assert main(["probe", *common, "--out", str(out), "readouts=[align]", "sequence=false",
                 f"align_target=space:probe:{target}"]) == 0
    rep = json.loads((out / "report.json").read_text())
    a, cal = rep["readouts"]["align"], rep["calibration"]
    from memlab.probes.encoders.sources import load_tokenizer

    assert len(load_tokenizer(str(COUNTER))) != len(tokenizer)
    assert a["n_tokens"] == own["probe"]["n_tokens"]  # the decoder's targets: the held-out texts in memlab's BPE
    # its decoder reading its own memories of the held-out chunks is the probe's own held-out reading
    assert a["own"]["ce"] == pytest.approx(own["probe"]["ce"], rel=1e-4)
    assert a["own"]["recovered"] > a["prior"] + 0.02  # the target reads some of concat at this budget
    assert a["own"]["r2"] > 0.9 and a["recovered"] == pytest.approx(a["own"]["recovered"], abs=0.02)
    assert a["recovered"] - a["prior"] > 0.5 * (a["own"]["recovered"] - a["prior"])  # the map keeps its gain
    assert cal["status"] == "passed" and cal["checks"][0]["own"] == pytest.approx(a["own"]["recovered"])
    rc, rep = _probe(tmp_path, "synthetic:concat", *FIT, "sequence=false")
    assert rc == 0
    a, cal = rep["readouts"]["align"], rep["calibration"]
    assert a["own"]["recovered"] > 0.8 and a["recovered"] < a["own"]["recovered"] - 0.05
    assert cal["status"] == "failed" and "align read-out" in cal["checks"][0]["control"]
