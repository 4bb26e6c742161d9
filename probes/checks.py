"""The probe's options' own checks, made without the model and without torch: each option's range, the chunk
lengths and training sizes as written (``8,16``; an empty or repeated item refused), options that need another, and
a model path that is not there. :mod:`memlab.probes.options` runs them when the options are read, and
``memlab probe`` runs the ones that need no registry of parts before anything heavy is imported
(:func:`memlab.probes.options.precheck`).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from memlab import assets
from memlab.errors import ConfigError, ModelError
from memlab.probes.parts import get_part
from memlab.probes.sections import TOKEN_TABLES

CHUNK_BY = ("words", "tokens")
CACHE_DTYPES = ("float32", "float16", "bfloat16")  # memlab.data.mmapcache.STORAGE, named here without numpy or torch


def train_sizes(opts) -> list[int]:
    """``n_train`` as a list of sizes: one, or a learning curve's (its largest is the number of chunks read)."""
    n = opts.n_train
    return list(n) if isinstance(n, (list, tuple)) else [n]


EXPERIMENTS = {"probe": "probe", "layers": "layer sweep", "lengths": "length sweep",
               "curve": "learning curve or comparison"}
"""The experiments a probe's options ask for, each in words: one probe, a layer sweep (``layers``), a length sweep (a
list of ``seq_len``), a learning curve or comparison (a list of ``n_train``, or ``compare``)."""


def experiment(opts) -> str:
    """Which of :data:`EXPERIMENTS` ``opts`` ask for: a layer sweep first, then a length sweep, then a learning curve
    or a comparison, else one probe (the order ``memlab probe`` has always chosen in)."""
    if opts.layers is not None:
        return "layers"
    if len(seq_lens(opts)) > 1:
        return "lengths"
    if len(parse_sizes(opts.n_train)) > 1 or opts.compare is not None:
        return "curve"
    return "probe"


def comma_items(text: str, what: str) -> list[int]:
    """``"8,16"`` -> [8, 16]: integers separated by commas, as written; an empty item (``8,,16``, ``64,``), a
    non-integer or a value given twice is one ConfigError naming ``what``."""
    items = [x.strip() for x in str(text).split(",")]
    if "" in items:
        raise ConfigError(f"{what}: an empty item in {text!r}; give integers separated by commas")
    try:
        got = [int(x) for x in items]
    except ValueError:
        raise ConfigError(f"{what} takes an integer or a comma list of integers, got {text!r}") from None
    twice = sorted({x for x in got if got.count(x) > 1})
    if twice:
        raise ConfigError(f"{what}: {twice[0]} is given twice in {text!r}")
    return got


def parse_sizes(text) -> list[int]:
    """``"1000,4000"`` or ``[1000, 4000]`` -> [1000, 4000] (sorted, distinct, each >= 1); a text with an empty item
    or a size given twice is refused."""
    items = list(text) if isinstance(text, (list, tuple)) else comma_items(text, "--n-train")
    try:
        sizes = sorted({int(x) for x in items})
    except (TypeError, ValueError):
        raise ConfigError(f"--n-train takes an integer or a comma list of integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"--n-train sizes must be >= 1, got {text!r}")
    return sizes


def seq_lens(opts) -> list[int]:
    """``seq_len`` as a list of lengths: one, or a length sweep's (sorted, distinct)."""
    n = opts.seq_len
    return sorted(set(n)) if isinstance(n, (list, tuple)) else [n]


def parse_lengths(value):
    """``seq_len`` as written: ``"8,16,32"`` (``key=value``, ``--seq-len``) -> [8, 16, 32], ``"16"`` -> 16; a number
    or a list is left to the option's type. A non-integer, an empty item or a length given twice is refused in one
    line."""
    if not isinstance(value, str):
        return value
    got = comma_items(value, "'seq_len'")
    return got if len(got) != 1 else got[0]


def check_lengths(opts) -> None:
    """A length sweep (a list of ``seq_len``) is one sweep: not with a layer sweep, a learning curve, a comparison
    or ``max_chunk_tokens`` (one ConfigError naming the other)."""
    if len(seq_lens(opts)) < 2:
        return
    other = ("'layers' (a layer sweep)" if opts.layers is not None
             else "'compare' (a comparison)" if opts.compare is not None
             else "a list of 'n_train' sizes (a learning curve)" if len(train_sizes(opts)) > 1 else None)
    if other:
        raise ConfigError(f"a list of 'seq_len' lengths (a length sweep) and {other} are separate sweeps; run them "
                          "one at a time")
    if opts.max_chunk_tokens is not None:
        raise ConfigError("'max_chunk_tokens' caps a chunk of one length; a length sweep cuts every length whole: drop "
                          "it, or sweep token lengths (chunk_by=tokens)")


def check_range(opts, parts: bool = True) -> None:
    """Each option's own range (one ConfigError naming it). ``parts``: also the checks that ask the registries of
    parts (False: those are left out, nothing heavy is imported)."""
    if opts.chunk_by not in CHUNK_BY:
        raise ConfigError(f"'chunk_by' must be one of {', '.join(CHUNK_BY)}, got {opts.chunk_by!r}")
    if opts.eval_split not in ("test", "validation"):
        raise ConfigError(f"'eval_split' must be test or validation, got {opts.eval_split!r}")
    if opts.cache_dtype not in CACHE_DTYPES:
        raise ConfigError(f"'cache_dtype' must be one of {', '.join(CACHE_DTYPES)}, got {opts.cache_dtype!r}")
    for k in ("input_dropout", "cond_dropout", "plain_input_dropout", "beta1", "beta2", "warmup_fraction",
              "val_fraction"):
        if not 0.0 <= getattr(opts, k) < 1.0:
            raise ConfigError(f"'{k}' must be in [0, 1), got {getattr(opts, k)}")
    for k in ("epochs", "lr", "bow_lr", "contained_lr"):
        v = getattr(opts, k)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ConfigError(f"'{k}' must be a finite number > 0, got {v}")
    if not 0.0 <= opts.min_lr_ratio <= 1.0:
        raise ConfigError(f"'min_lr_ratio' must be in [0, 1], got {opts.min_lr_ratio}")
    for k in ("weight_decay", "repeat_penalty", "clip_grad", "bow_weight_decay"):
        v = getattr(opts, k)
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"'{k}' must be a finite number >= 0, got {v}")
    if not 0.5 <= opts.ci_level < 1.0:
        raise ConfigError(f"'ci_level' must be in [0.5, 1), got {opts.ci_level}")
    for k in ("n_eval", "hidden_size", "num_layers", "num_heads", "batch_size", "prefix_len",
              "patience", "ci_resamples", "encode_batch_size"):
        if getattr(opts, k) < 1:
            raise ConfigError(f"'{k}' must be >= 1, got {getattr(opts, k)}")
    if not isinstance(opts.seed, int) or isinstance(opts.seed, bool) or not 0 <= opts.seed < 2**32:
        raise ConfigError(f"'seed' must be an integer in [0, 2**32), got {opts.seed}")
    if opts.threads is not None and opts.threads < 1:
        raise ConfigError(f"'threads' must be >= 1 (torch CPU threads; unset: torch's own), got {opts.threads}")
    if not train_sizes(opts) or min(train_sizes(opts)) < 1:
        raise ConfigError(f"'n_train' sizes must be >= 1, got {opts.n_train}")
    if parts and "num_heads" in get_part("decoder", opts.decoder).option_names and opts.hidden_size % opts.num_heads:
        raise ConfigError("'hidden_size' must be a multiple of 'num_heads'")
    if parts and "token_table" in get_part("decoder", opts.decoder).option_names and \
            opts.token_table not in TOKEN_TABLES:
        raise ConfigError(f"'token_table' must be one of {', '.join(TOKEN_TABLES)}, got {opts.token_table!r}")
    if not seq_lens(opts) or min(seq_lens(opts)) < 2:
        raise ConfigError(f"'seq_len' must be >= 2 (each length of a length sweep too), got {opts.seq_len}")


def check_together(opts, explicit: set[str]) -> None:
    """Options that need another option (one ConfigError naming both)."""
    if "plain_input_dropout" in explicit and not (opts.select_decoder and opts.bag_head):
        off = "select_decoder=false" if not opts.select_decoder else "bag_head=false (nothing to select from)"
        raise ConfigError(f"'plain_input_dropout' applies to the plain decoder of select_decoder=true, not to "
                          f"{off}; drop it")
    if "contained_lr" in explicit and not (opts.sequence and opts.control and opts.val_fraction > 0):
        off = ("sequence=false" if not opts.sequence else "control=false (--no-control)" if not opts.control
               else "val_fraction=0")
        raise ConfigError(f"'contained_lr' trains the probe started as its control, which {off} does not fit; "
                          "drop it")
    if "layers_sequence" in explicit and opts.layers is None:
        raise ConfigError("'layers_sequence' applies to a layer sweep; set layers (all or a list) or drop it")
    if opts.max_chunk_tokens is not None and (opts.chunk_by != "words" or opts.max_chunk_tokens < 1):
        raise ConfigError("'max_chunk_tokens' must be >= 1 and applies to chunk_by=words")
    if opts.chunk_tokenizer is not None and opts.max_chunk_tokens is None:
        raise ConfigError("'chunk_tokenizer' counts max_chunk_tokens; set max_chunk_tokens too")
    if opts.target_tokenizer is not None and opts.chunk_by != "words":
        raise ConfigError("'target_tokenizer' rebuilds the chunk texts: it needs chunk_by=words")
    if not opts.sequence and not opts.readouts:
        raise ConfigError("'sequence=false' leaves only the read-outs, and 'readouts' is empty: nothing to fit")
    if opts.layers is not None and len(train_sizes(opts)) > 1:
        raise ConfigError("'layers' and a list of 'n_train' sizes are separate sweeps; run them one at a time")


def check_model_spec(spec) -> None:
    """A model ``spec`` that names a local path (it starts with ``.``, ``/`` or ``~``, or holds more than one
    ``/``) which is not there: the encoders' own ModelError line, told without loading them. A shortcut, a
    ``kind:`` spec and a hub name are left to the encoder kinds."""
    s = str(spec or "")
    if not s or s in assets.ASSETS or re.match(r"[A-Za-z][\w.+-]*:", s) or Path(os.path.expanduser(s)).exists():
        return
    if s.startswith((".", "/", "~")) or s.count("/") > 1:
        raise ModelError(f"model path '{s}' does not exist")
