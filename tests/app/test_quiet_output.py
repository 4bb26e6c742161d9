"""What a memlab command prints: its own lines only. The libraries' bars are drawn as memlab's progress, their
warnings are one memlab line or dropped as noise, and all of it only for the command's duration."""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import types
import warnings

import pytest
import transformers as tf
from transformers.utils import logging as hf_logging

from memlab import progress
from memlab.app import quickstart, quiet
from memlab.app.cli import main
from memlab.errors import MemlabError
from memlab.probes.encoders.sources import load_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _no_open_line():
    yield
    progress.end_line()  # a test that failed with its work line open leaves nothing behind

LIBRARY_TEXT = re.compile(r"Loading weights|Writing|de-quantiz|%\||warn", re.IGNORECASE)
"""What no line of a quickstart may hold: the libraries' bars and warnings."""


class Terminal(io.StringIO):
    """stdout and stderr of a terminal: one screen for both."""

    def isatty(self) -> bool:
        return True


def screen(text: str) -> list[str]:
    """The lines a terminal shows at the end of ``text``: carriage returns overwrite, ESC[K erases to the end of
    the line, ESC[nA moves up."""
    rows, row, col = [[]], 0, 0
    for token in re.findall(r"\x1b\[\d*[A-Za-z]|\r|\n|[^\x1b\r\n]", text):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            rows.extend([] for _ in range(row + 1 - len(rows)))
        elif token.startswith("\x1b"):
            if token.endswith("K"):
                del rows[row][col:]
            elif token.endswith("A"):
                row = max(0, row - int(token[2:-1] or 1))
        else:
            line = rows[row]
            line.extend(" " * (col - len(line)))
            line[col:col + 1] = [token]
            col += 1
    return ["".join(r).rstrip() for r in rows]


def _memlab_line(line: str, entries: tuple[str, ...]) -> bool:
    return (line == "" or line.startswith(("memlab: ", "|", "run: ", "note: "))
            or any(line.startswith(f"[{e}] ") for e in entries))


# ---------------------------------------------------------------------------------------------- the quickstart
def test_quickstart_in_a_log_prints_only_memlab_lines(tmp_path, capsys):
    entries = ("token_lm", "synthetic:constant")  # token_lm's load and its decoder's save run transformers' bars
    assert main(["quickstart", "--fast", "--only", *entries, "--out", str(tmp_path / "qs")]) == 0
    cap = capsys.readouterr()
    for line in cap.out.splitlines() + cap.err.splitlines():
        assert _memlab_line(line, entries) and not LIBRARY_TEXT.search(line), line
    assert all(line.startswith("memlab: ") for line in cap.err.splitlines())  # progress as plain lines
    assert "\r" not in cap.out + cap.err
    for e in entries:  # off a terminal: the start line, then the result line
        assert [x.split(" ", 2)[1] for x in cap.out.splitlines() if x.startswith(f"[{e}] ")] == ["loading", "no"]


def test_quickstart_on_a_terminal_shows_one_line_per_entry_and_the_table(tmp_path, monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["quickstart", "--fast", "--only", "token_lm", "--out", str(tmp_path / "qs")]) == 0
    assert sys.stdout is tty and sys.stderr is tty  # the work line's streams are put back
    raw = tty.getvalue()
    assert "[token_lm] encode train" in raw  # its bars were drawn on the entry's line
    shown = [x for x in screen(raw) if x]
    assert [x for x in shown if x.startswith("[")] == [next(x for x in shown if x.startswith("[token_lm] no "))]
    assert shown[0].startswith("[token_lm] no evidence of retention")
    assert [x[0] for x in shown[1:-1]] == ["|"] * (len(shown) - 2) and shown[-1].startswith("run: ")
    assert not any(LIBRARY_TEXT.search(x) for x in shown)


# ---------------------------------------------------------------------------------------------- the filter
def test_warning_lines_drop_noise_and_keep_one_line():
    assert quiet.warning_line("transformers", "Loading a GGUF checkpoint with its weights packed is fastest in "
                              "float32, and this one was asked for in torch.bfloat16.") is None
    assert quiet.is_noise("Detected kernel version 4.4.0, which is below the recommended minimum of 5.5.0")
    line = quiet.warning_line("transformers", "\n  Could not load   the weights of x.safetensors\nTraceback: ...")
    assert line == "memlab: warning: transformers: Could not load the weights of x.safetensors"
    assert len(quiet.warning_line("torch", "y" * 1000)) < 340


def test_inside_a_command_library_output_is_memlab_lines_and_put_back_after(monkeypatch, capsys):
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    log = logging.getLogger("transformers.modeling_utils")
    own_handlers = list(logging.getLogger("transformers").handlers)
    library = types.ModuleType("somelib")
    library.tqdm = object()
    with quiet.quiet_libraries():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
        log.warning("Detected kernel version 4.4.0, which is below the recommended minimum of 5.5.0")  # noise
        log.warning("Some weights could not be read:\n  a.weight\n  b.weight")  # matters: one line
        log.error("the file is damaged\ndetail on its second line")  # an error: whole
        warnings.warn_explicit("a library's advice\nover two lines", FutureWarning, "/x/site-packages/lib/a.py", 3)
        bar = hf_logging.tqdm(range(3), desc="Loading weights")  # transformers' bar: memlab's (plain lines here)
        assert isinstance(bar, progress.PlainProgress) and list(bar) == [0, 1, 2]
        with progress.fold_bars(library):
            assert library.tqdm is progress.library_bar
        with pytest.raises(ValueError):  # exceptions pass untouched
            raise ValueError("kept")
    err = capsys.readouterr().err.splitlines()
    assert err == ["memlab: warning: transformers: Some weights could not be read:",
                   "memlab: error: transformers: the file is damaged", "detail on its second line",
                   "memlab: warning: lib: a library's advice"]
    # after the command: the libraries as they were
    assert "TOKENIZERS_PARALLELISM" not in os.environ
    assert logging.getLogger("transformers").handlers == own_handlers
    assert not isinstance(hf_logging.tqdm(range(1), desc="Loading weights"), progress.PlainProgress)
    with progress.fold_bars(library):  # outside a command a library's bar is its own
        assert library.tqdm is not progress.library_bar
    assert warnings.showwarning is not quiet._show_warning


def test_logs_a_user_asked_for_stay_the_library_s_own(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    own = list(logging.getLogger("transformers").handlers)
    with quiet.quiet_libraries():
        assert logging.getLogger("transformers").handlers == own
        assert isinstance(logging.getLogger("accelerate").handlers[0], quiet.LibraryLog)


def test_a_command_that_fails_keeps_its_entry_line_above_the_error(tmp_path, monkeypatch):
    def broken(ctx):
        raise MemlabError("cannot read the model")

    monkeypatch.setattr(quickstart, "default_entries", lambda: [quickstart.Entry("bad", "nothing", broken)])
    tty = Terminal()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["quickstart", "--fast", "--out", str(tmp_path / "qs")]) == 2
    assert [x for x in screen(tty.getvalue()) if x] == ["[bad] loading and probing (nothing)...",
                                                        "memlab: error: cannot read the model"]


# ---------------------------------------------------------------------------------------------- progress
def test_library_bars_are_quiet_in_a_log_unless_long(capsys):
    assert list(progress.library_bar(range(4), desc="Loading weights")) == [0, 1, 2, 3]
    assert capsys.readouterr().err == ""  # a short library stage: nothing in a log
    bar = progress.library_bar(range(2), desc="Converting and de-quantizing GGUF tensors...")
    bar.every = 0
    assert list(bar) == [0, 1]
    assert capsys.readouterr().err.splitlines() == [
        "memlab: de-quantize GGUF tensors: 1/2 (50%), 0 s", "memlab: de-quantize GGUF tensors: 2/2 (100%), 0 s",
        "memlab: de-quantize GGUF tensors: done 2/2, 0 s"]


def test_a_work_line_on_a_terminal(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(sys, "stderr", tty)
    line = progress.WorkLine("[a]", "loading...")
    assert screen(tty.getvalue()) == ["[a] loading..."]
    bar = progress.progress_bar(2, "encode train")
    bar.update(1)
    bar.refresh()
    assert screen(tty.getvalue())[-1].startswith("[a] encode train:  50%")
    print("memlab: note: something to know")  # printed meanwhile: on a line of its own
    bar.update(1)
    bar.close()
    assert screen(tty.getvalue()) == ["memlab: note: something to know", "[a] loading..."]
    line.done("kept 3 bits")
    assert [x for x in screen(tty.getvalue()) if x] == ["memlab: note: something to know", "[a] kept 3 bits"]
    assert sys.stdout is tty and sys.stderr is tty
    progress.WorkLine("[b]", "loading...")
    progress.end_line()  # an error ends it: the start stays as a line
    assert [x for x in screen(tty.getvalue()) if x][-1] == "[b] loading..."


def test_gguf_dequantisation_is_drawn_as_memlab_progress(tmp_path, tokenizer, capsys):
    """A GGUF load runs transformers' de-quantisation bar: inside a command it is memlab's (nothing in a log for a
    short one), outside a command it is the library's own."""
    pytest.importorskip("gguf")
    from test_probe_gguf import write_llama_gguf  # a tiny Llama as a GGUF file (needs gguf: imported here)

    model = tf.LlamaModel(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
                                         max_position_embeddings=64))
    path = str(write_llama_gguf(model, tokenizer, tmp_path / "tiny.gguf"))
    with quiet.quiet_libraries():
        assert load_encoder(path).dim == 32
    assert capsys.readouterr().err == ""
    load_encoder(path)
    assert "de-quantizing GGUF tensors" in capsys.readouterr().err
