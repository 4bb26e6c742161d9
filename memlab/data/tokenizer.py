"""Tokenizers: any Hugging Face tokenizer by name or path, or a byte-level BPE
trained with ``tokenizers`` on the training split (the offline default).

Trained BPEs are cached under ``$MEMLAB_CACHE`` (default ``~/.cache/memlab``)
by a hash of their training text and vocabulary size, and saved into each run
directory, so a run can be reloaded without the cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable

from memlab.cachecheck import folder_problem, seal_folder
from memlab.errors import DataError
from memlab.outdir import save_files, save_folder

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "mask_token": "<mask>"}


def cache_dir() -> Path:
    return Path(os.environ.get("MEMLAB_CACHE", Path.home() / ".cache" / "memlab"))


def train_bpe(texts: list[str] | Callable[[], Iterable[str]], vocab_size: int, out_dir: str | Path | None = None):
    """Train (or fetch from cache) a byte-level BPE on ``texts``; returns a PreTrainedTokenizerFast.

    ``texts`` is a list, or a function that returns a fresh iterator of the texts (it is read twice: once for
    the cache key, once to train), so a corpus larger than memory streams through."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise DataError(f"a byte-level BPE needs vocab_size >= {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    read = texts if callable(texts) else (lambda: iter(texts))
    h = hashlib.sha256()
    h.update(str(vocab_size).encode())
    any_text = False
    for t in read():
        any_text = any_text or bool(t.strip())
        h.update(hashlib.sha256(t.encode()).digest())
    if not any_text:
        raise DataError("cannot train a tokenizer on an empty corpus")
    key = h.hexdigest()[:16]
    cached = cache_dir() / "tokenizers" / f"bpe-{vocab_size}-{key}"
    made = {"format": "memlab-bpe-tokenizer", "name": cached.name}
    if (cached / "tokenizer.json").is_file() and (problem := folder_problem(cached, made)) is not None:
        import shutil
        import sys

        print(f"memlab: warning: tokenizer cache {cached} is damaged ({problem}); rebuilding it", file=sys.stderr)
        shutil.rmtree(cached, ignore_errors=True)
    if not (cached / "tokenizer.json").is_file():
        tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS.values()),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(read(), trainer=trainer)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
        # whole or not at all: a temporary folder renamed into the cache (another process's copy wins a race)
        save_folder(cached, lambda tmp: (fast.save_pretrained(str(tmp)), seal_folder(tmp, made)),
                    f"the tokenizer cache {cached}")
    tok = load_tokenizer(str(cached))
    if out_dir is not None:
        save_tokenizer(tok, out_dir)
    return tok


def save_tokenizer(tok, out_dir: str | Path) -> None:
    """``tok.save_pretrained(out_dir)`` with each file replaced whole; a storage failure is one line naming it."""
    save_files(Path(out_dir), lambda tmp: tok.save_pretrained(str(tmp)), f"the tokenizer in {out_dir}")


def load_tokenizer(name_or_path: str):
    """Load an HF tokenizer by local path or hub name (hub only with a network or a warm cache).

    ``trust_remote_code`` stays off. A tokenizer without a pad token gets its
    EOS token as pad.
    """
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        where = "local path" if Path(name_or_path).exists() else "name"
        raise DataError(
            f"tokenizer '{name_or_path}' could not be loaded ({where}; offline, only local paths and cached hub names work): "
            f"{str(e).splitlines()[0][:200]}"
        ) from None
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise DataError(f"tokenizer '{name_or_path}' has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    return tok


def build_tokenizer(spec: str, train_texts: Iterable[str] | Callable[[], Iterable[str]], vocab_size: int,
                    out_dir: str | Path | None = None):
    """``bpe`` -> train a byte-level BPE on ``train_texts`` (see :func:`train_bpe`); else load ``spec`` as an
    HF tokenizer."""
    if spec == "bpe":
        return train_bpe(train_texts if callable(train_texts) else list(train_texts), vocab_size, out_dir)
    tok = load_tokenizer(spec)
    if out_dir is not None:
        save_tokenizer(tok, out_dir)
    return tok
