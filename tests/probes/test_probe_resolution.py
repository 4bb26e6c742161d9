"""What validation resolves once and carries: the compared methods (each checked one time), the options the user set
(a length they chose is refused when the encoder cannot read it whole, the default one is cut to fit, the options
never changed); and function-level imports in probes/ only where each says why."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import one_line_error
from memlab.app.cli import main
from memlab.errors import MemlabError
from memlab.paths import resource
from memlab.probes.chunks import cut as chunks
from memlab.probes.sweeps import compare
from memlab.probes.encoders.sources import load_tokenizer
from memlab.probes.options import load_options, option_values

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = resource("checkpoints") / "token_lm-toy"
PROBES = Path(__file__).resolve().parents[2] / "probes"


def test_each_compared_method_is_checked_once_and_its_options_travel_on_the_resolved_options(tmp_path, monkeypatch):
    calls, real = [], compare.method_options
    monkeypatch.setattr(compare, "method_options", lambda opts, m, explicit: calls.append(m.spec) or
                        real(opts, m, explicit))
    out = tmp_path / "cmp"
    assert main(["probe", "--model", "synthetic:bag", "--compare", "bow", "--n-train", "16,32", "--seq-len", "8",
                 "--n-eval", "8", "--threads", "1", "ci_resamples=50", "--out", str(out)]) == 0
    assert calls == ["bow"]  # validated once, in load_options; the curve reads what validation resolved
    rows = json.loads((out / "curve.json").read_text())["rows"]
    assert [(r["method"], r["n_train"]) for r in rows] == [("bow", 16), ("bow", 32)]
    opts = load_options(None, ["compare=bow"], model="synthetic:bag")
    (method, mine), = opts.methods
    assert method.spec == "bow" and mine.readouts == ["bow"] and not mine.sequence
    assert "methods" not in option_values(opts) and "explicit" not in option_values(opts)
    assert "compare" in opts.explicit and "model" not in opts.explicit


class _Short:
    """An encoder that reads at most 6 tokens of the toy tokenizer (fixed length: not resizable)."""

    name, max_length = "a six-token encoder", 6

    def __init__(self):
        self.tokenizer = load_tokenizer(str(TOY))


def test_the_default_length_is_cut_to_fit_and_the_cap_returned_with_the_text(capsys):
    opts = load_options(None, ["n_train=8", "n_eval=4"], model="synthetic:bag")
    assert "seq_len" not in opts.explicit
    train_ids, eval_ids, text = chunks.probe_data(opts, _Short(), cap_to_fit=True)
    assert text.cap == 6 and max(train_ids.shape[1], eval_ids.shape[1]) <= 6
    assert "dropped to fit 6 tokens" in text.accounting.per_chunk and "memlab: note:" in capsys.readouterr().err
    assert opts.max_chunk_tokens is None  # the options are not changed
    assert len(text.chars) == eval_ids.shape[0] and len(text.train_texts) == train_ids.shape[0]
    with pytest.raises(MemlabError, match="lower seq_len"):  # not cut to fit: refused
        chunks.probe_data(opts, _Short())


def test_a_length_the_user_sets_is_refused_when_the_encoder_cannot_read_it(tmp_path, capsys):
    out = tmp_path / "probe"
    assert main(["probe", "--model", "space:memory_ae", "--seq-len", "32", "--n-train", "32", "--n-eval", "8",
                 "--epochs", "0.5", "--no-control", "--no-bow", "--out", str(out)]) == 2
    assert "lower seq_len" in one_line_error(capsys) and not out.exists()


def _function_imports(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text().splitlines()
    found = set()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= {sub.lineno for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}
    return [(n, lines[n - 1]) for n in sorted(found)]


def test_function_level_imports_in_probes_say_why():
    bare = [f"{p.name}:{n}: {line.strip()}" for p in sorted(PROBES.glob("*.py")) for n, line in _function_imports(p)
            if "# optional" not in line and "# cycle" not in line and "(optional" not in line
            and "# start-up:" not in line]
    assert not bare, bare
