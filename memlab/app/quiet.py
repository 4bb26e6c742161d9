"""What the libraries print during a memlab command.

A memlab command prints its own lines: progress (:mod:`memlab.progress`), its
results, its errors. The libraries it drives print too: transformers' bars
("Loading weights", "Writing model shards", GGUF de-quantisation), their log
warnings and Python warnings. Inside :func:`quiet_libraries` (the scope of one
command, set by :func:`memlab.app.cli.main`; nothing changes at import):

* the libraries' bars are drawn as memlab's progress
  (:func:`memlab.progress.library_bar`); the Hugging Face Hub's download bars
  stay its own (a download is long work, worth its bar);
* a library warning that says nothing to a memlab user (:data:`NOISE`) is
  dropped; any other is one line ``memlab: warning: LIBRARY: first line``;
* a library's logged error is printed whole, as ``memlab: error: LIBRARY: ...``;
  exceptions are untouched;
* ``TOKENIZERS_PARALLELISM`` is false unless set (tokenizers' warning on fork).

Everything is put back when the command ends. A library's logs asked for by
its own variable (``TRANSFORMERS_VERBOSITY``, ``TORCH_LOGS``, ...) are left as
the library has them.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path

from memlab import progress

NOISE = (
    # transformers, on its own internals or on memlab's choices
    r"`torch_dtype` is deprecated",
    r"The attention mask and the pad token id were not set",
    r"`use_cache=True` is incompatible with gradient checkpointing",
    r"Loading a GGUF checkpoint with its weights packed is fastest in float32",  # memlab's dtype (--dtype) decides
    # accelerate and torch, on the machine or on torch's internals rather than the run
    r"Detected kernel version .* below the recommended minimum",
    r"enable_nested_tensor is True, but self.use_nested_tensor is False",
    r"TypedStorage is deprecated",
    r"performance drop because we have not yet implemented the batching rule",  # torch's vmap of a batched group
)
"""Library warnings that say nothing a memlab user can act on (regular expressions, searched in the message)."""
_NOISE = re.compile("|".join(f"(?:{p})" for p in NOISE))

LIBRARIES = {"transformers": "TRANSFORMERS_VERBOSITY", "accelerate": "ACCELERATE_LOG_LEVEL",
             "huggingface_hub": "HF_HUB_VERBOSITY", "datasets": "DATASETS_VERBOSITY", "torch": "TORCH_LOGS",
             "tokenizers": None, "safetensors": None, "gguf": None}
"""Libraries whose log records memlab shows as its own lines, each with the variable by which a user asks for its
own logs (then they are left as the library has them); records of other loggers are left alone."""


def is_noise(message: str) -> bool:
    """Whether a library's warning ``message`` says nothing to a memlab user (:data:`NOISE`)."""
    return bool(_NOISE.search(message))


def first_line(message: str, limit: int = 300) -> str:
    """The first non-empty line of ``message``, spaces collapsed, cut to ``limit`` characters."""
    line = next((x for x in str(message).splitlines() if x.strip()), "")
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def warning_line(library: str, message: str) -> str | None:
    """The one line memlab prints for a library's warning, or None for noise."""
    if is_noise(message):
        return None
    return f"memlab: warning: {library}: {first_line(message)}"


def say(line: str) -> None:
    """Print ``line`` on stderr, clear of any bar drawn there."""
    with progress.tqdm.external_write_mode(file=sys.stderr):
        print(line, file=sys.stderr, flush=True)


class LibraryLog(logging.Handler):
    """A library's log records as memlab's lines: warnings one line each (noise dropped), errors whole."""

    def __init__(self):
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            library = record.name.partition(".")[0]
            message = record.getMessage()
            if record.levelno < logging.ERROR:
                line = warning_line(library, message)
                if line is not None:
                    say(line)
                return
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            say(f"memlab: error: {library}: {message}")
        except Exception:  # a handler never raises into the library's code
            self.handleError(record)


def _library_of(filename: str) -> str:
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1].removesuffix(".py")
    return Path(filename).stem


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = warning_line(_library_of(filename), f"{message}")
    if text is not None:
        say(text)


@contextmanager
def _logs(handler: logging.Handler):
    """``handler`` on the libraries' loggers (their own handlers, e.g. transformers' stderr one, set aside) for the
    block; a library whose logs the user asked for (:data:`LIBRARIES`) keeps its own."""
    saved = []
    for name, asked in LIBRARIES.items():
        if asked and asked in os.environ:
            continue
        log = logging.getLogger(name)
        saved.append((log, list(log.handlers), log.propagate))
        for h in list(log.handlers):
            log.removeHandler(h)
        log.addHandler(handler)
        log.propagate = False
    try:
        yield
    finally:
        for log, handlers, propagate in saved:
            log.removeHandler(handler)
            for h in handlers:
                log.addHandler(h)
            log.propagate = propagate


@contextmanager
def _transformers_bars():
    """transformers' own bars (its ``logging.tqdm``) drawn as memlab's, through its tqdm hook."""
    try:
        from transformers.utils import logging as hf_logging  # deferred: heavy, and optional for some verbs
    except ImportError:  # pragma: no cover
        yield
        return
    hook = getattr(hf_logging, "set_tqdm_hook", None)
    if hook is None:  # an older transformers: its bars are switched off instead
        was_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            if was_on:
                hf_logging.enable_progress_bar()
        return

    def fold(factory, args, kwargs):
        if factory is not hf_logging.tqdm_lib.tqdm:  # bars switched off: the library's empty bar
            return factory(*args, **kwargs)
        return progress.library_bar(*args, **kwargs)

    before = hook(fold)
    try:
        yield
    finally:
        hook(before)


@contextmanager
def quiet_libraries():
    """The scope of one memlab command: the libraries' bars as memlab's progress, their warnings as memlab's lines
    (see the module doc); everything as before once it ends. A work line still open when it ends (an error) is
    kept as a line, so that the error line follows it."""
    parallelism = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        with ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            warnings.showwarning = _show_warning
            stack.enter_context(_logs(LibraryLog()))
            stack.enter_context(_transformers_bars())
            stack.enter_context(progress.folding())
            try:
                yield
            finally:
                progress.end_line()
    finally:
        if parallelism is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
