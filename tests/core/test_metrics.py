"""Text metrics agree with the libraries they wrap, on fixed pairs, and with hand-computed values."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from memlab import metrics
from memlab.errors import MemlabError

ROOT = Path(__file__).resolve().parents[2]

HYPS = [
    "the cat sat on the mat",
    "a quick brown fox jumps over the lazy dog",
    "she walked home slowly in the rain",
    "completely unrelated words here",
]
REFS = [
    "the cat is on the mat",
    "the quick brown fox jumped over the lazy dog",
    "she walked slowly home in the heavy rain",
    "the weather was fine that morning",
]

needs_wordnet = pytest.mark.skipif(
    not metrics.wordnet_available(),
    reason="WordNet 3.0 not installed: run scripts/install_wordnet.sh (apt wordnet-base, wordnet-sense-index)",
)


def test_bleu_agrees_with_sacrebleu():
    import sacrebleu

    expected = sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert metrics.bleu(HYPS, REFS) == pytest.approx(expected)
    assert metrics.bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)
    assert 0 < metrics.bleu(HYPS, REFS) < 100


def test_sentence_bleu_agrees_with_nltk_method4():
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    sm = SmoothingFunction().method4
    expected = sum(sentence_bleu([r.split()], h.split(), smoothing_function=sm) for h, r in zip(HYPS, REFS)) / len(HYPS)
    assert metrics.sentence_bleu(HYPS, REFS) == pytest.approx(expected)
    assert metrics.sentence_bleu(["a b c d e"], ["a b c d e"]) == pytest.approx(1.0)
    assert metrics.sentence_bleu([""], ["a b"]) == 0.0


def test_rouge_l_agrees_with_rouge_score_and_by_hand():
    from rouge_score import rouge_scorer

    sc = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    expected = sum(sc.score(r, h)["rougeL"].fmeasure for h, r in zip(HYPS, REFS)) / len(HYPS)
    assert metrics.rouge_l(HYPS, REFS) == pytest.approx(expected)
    # LCS("the cat sat on the mat", "the cat is on the mat") = 5 of 6 words each way: F = 5/6.
    assert metrics.rouge_l(HYPS[:1], REFS[:1]) == pytest.approx(5 / 6)


def test_bad_input_is_a_clear_error():
    with pytest.raises(MemlabError, match="pair up"):
        metrics.bleu(["a"], ["a", "b"])
    with pytest.raises(MemlabError, match="no hypothesis"):
        metrics.rouge_l([], [])
    with pytest.raises(MemlabError, match="single string"):
        metrics.bleu("a b", "a b")
    with pytest.raises(MemlabError, match="unknown metric 'blue'"):
        metrics.text_metrics(["a"], ["a"], which=["blue"])


@needs_wordnet
def test_meteor_agrees_with_nltk():
    from nltk.translate.meteor_score import meteor_score

    wn = metrics.load_wordnet()
    expected = sum(meteor_score([r.split()], h.split(), wordnet=wn) for h, r in zip(HYPS, REFS)) / len(HYPS)
    assert metrics.meteor(HYPS, REFS) == pytest.approx(expected)


@needs_wordnet
def test_meteor_uses_real_wordnet_synonyms():
    wn = metrics.load_wordnet()
    assert wn.get_version() == "3.0"
    assert "ill" in {l.name() for s in wn.synsets("sick") for l in s.lemmas()}
    # All 4 words matched (3 exact + "sick"~"ill" through WordNet) in one chunk:
    # P = R = 1, penalty = 0.5 * (1/4)^3, so METEOR = 1 - 0.5/64 (with nltk's 0.9/3/0.5 parameters).
    syn = metrics.meteor(["the man ill home"], ["the man sick home"])
    assert syn == pytest.approx(1 - 0.5 / 64)
    # A word with no WordNet link leaves 3 of 4 matched in 2 chunks: F-mean 3/4 and penalty 0.5*(2/3)^3.
    none = metrics.meteor(["the man xyz home"], ["the man sick home"])
    assert none == pytest.approx(0.75 * (1 - 0.5 * (2 / 3) ** 3))
    assert metrics.text_metrics(["the man ill home"], ["the man sick home"])["meteor"] == pytest.approx(syn)


def test_meteor_without_wordnet_names_the_script(monkeypatch, tmp_path):
    monkeypatch.setattr(metrics, "find_wordnet", lambda: None)
    with pytest.raises(MemlabError, match="install_wordnet.sh"):
        metrics.meteor(["a"], ["a"])
    assert "meteor" not in metrics.text_metrics(["a b"], ["a b"])


@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(), reason="Debian wordnet-base not installed")
def test_install_script_builds_an_nltk_data_folder(tmp_path):
    env = {**os.environ, "MEMLAB_SKIP_APT": "1"}
    out = subprocess.run(["bash", str(ROOT / "scripts/install_wordnet.sh"), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    wn = tmp_path / "corpora" / "wordnet"
    lines = (wn / "lexnames").read_text().splitlines()
    assert len(lines) == 45 and lines[0] == "00\tadj.all\t3" and lines[18].split("\t")[1] == "noun.person"
    assert lines[44] == "44\tadj.ppl\t3"
    assert (wn / "index.sense").is_file() and (wn / "verb.exc").is_file()
    # nltk reads only files under NLTK_DATA: point it at the new folder alone.
    check = subprocess.run(
        ["python", "-c", "from nltk.corpus import wordnet as r; print(len(r.synsets('dog')), r.get_version())"],
        env={**os.environ, "NLTK_DATA": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    n, version = check.stdout.split()[-2:]
    assert int(n) >= 7 and version == "3.0"


def test_install_script_fails_cleanly_without_sources(tmp_path):
    if shutil.which("bash") is None:  # pragma: no cover
        pytest.skip("no bash")
    env = {**os.environ, "MEMLAB_SKIP_APT": "1", "WORDNET_SRC": str(tmp_path / "none")}
    out = subprocess.run(["bash", str(ROOT / "scripts/install_wordnet.sh"), str(tmp_path / "d")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "not found" in out.stderr
