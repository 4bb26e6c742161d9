"""Experiment configs: dataclasses are the truth, YAML mirrors them.

* :func:`from_dict` builds a dataclass from a mapping, recursively, and
  rejects unknown keys with an error that names the key and the valid ones.
* :func:`apply_overrides` applies dotted command-line overrides such as
  ``train.lr=3e-4`` (values are parsed as YAML, then coerced to the field type).
* :func:`load_config` / :func:`save_config` read and write YAML.

An experiment has four fixed sections (``model``, ``data``, ``train`` and the
recipe's ``options``); ``options`` is checked against the dataclass that the
chosen recipe declares, and ``model`` against the model family's config.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from memlab.errors import ConfigError


@dataclass
class ModelConfig:
    """Which model to build."""

    family: str = "token_lm"
    """Registered model family (``memlab list``)."""
    preset: str = "toy"
    """Named preset of that family; every family has ``toy``."""
    overrides: dict = field(default_factory=dict)
    """Keys of the family's transformers config that replace the preset's values."""
    init_from: str | None = None
    """Optional path of a saved model (``save_pretrained`` folder or run directory) to start from."""


@dataclass
class DataConfig:
    """Where text comes from, how it is split and tokenized."""

    corpus: str = "austen"
    """``austen`` (bundled), a local file or folder (.txt, .jsonl/.json, .parquet, optionally .gz),
    or ``hf:NAME[:CONFIG]`` for a hub dataset (needs a network)."""
    text_field: str = "text"
    """Field that holds the text in json/parquet/hub records."""
    split_by: str = "chapter"
    """Held-out unit: ``chapter`` (documents are cut at chapter headings) or ``document``."""
    val_fraction: float = 0.05
    """Share of units held out for validation."""
    test_fraction: float = 0.05
    """Share of units held out for test."""
    split_seed: int = 0
    """Seed of the unit permutation that assigns splits."""
    max_documents: int | None = None
    """Keep only the first N documents of the corpus (quick runs)."""
    streaming: bool = False
    """Stream a hub dataset instead of downloading it whole."""
    hf_split: str = "train"
    """Split of a hub dataset to read."""
    tokenizer: str = "bpe"
    """``bpe`` trains a byte-level BPE on the training split (cached); anything else is an HF name or path."""
    vocab_size: int = 4096
    """Vocabulary size of the trained BPE."""
    seq_len: int = 128
    """Tokens per training example (chunk view)."""


@dataclass
class TrainConfig:
    """The training loop (accelerate): optimisation, logging, checkpoints."""

    max_steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 16
    """Global batch size in examples per optimizer step (all processes, all accumulation steps)."""
    grad_accum: int = 1
    """Gradient accumulation steps per optimizer step."""
    lr: float = 3e-4
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at ``lr * min_lr_ratio``."""
    warmup_steps: int = 50
    """Linear warmup steps."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and norms)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    eval_every: int = 200
    """Evaluate every N steps (and at the end)."""
    eval_batches: int = 20
    """Batches per evaluation."""
    save_every: int = 500
    """Checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (oldest deleted first)."""
    log_every: int = 10
    """Write a training record to metrics.jsonl every N steps."""
    seed: int = 0
    """Seed for initialisation, data order and dropout."""
    mixed_precision: str = "auto"
    """``auto`` (bf16 on GPUs that have it, else fp32), ``no``, ``bf16`` or ``fp16``."""
    cpu: bool = False
    """Force the CPU even when a GPU is present."""
    threads: int = 0
    """Intra-op CPU threads per process; 0 (auto): with N processes on a CPU host, cores / N each (the
    launchers' default ``OMP_NUM_THREADS=1`` is replaced; a larger ``OMP_NUM_THREADS`` is kept), one
    process keeps torch's default."""
    compile: bool = False
    """``torch.compile`` the model's forward in place (``nn.Module.compile``, dynamic shapes; saved weights keep
    their names). The first steps and the first evaluation pay the compilation (tens of seconds on a CPU); it
    pays off where Python and element-wise work weigh on a small model's step. Losses that call other
    methods or submodules than the model's own ``forward`` (the memory family's objectives, the token LM's
    block-wise loss through its base model) are not affected."""
    compile_backend: str = "inductor"
    """The ``torch.compile`` backend when ``compile`` is on: ``inductor`` (generated kernels, the fast one),
    ``aot_eager`` (traced forward and backward graphs run by eager kernels: no C++ or Triton compilation,
    for checking that a model compiles) or any other name ``torch._dynamo.list_backends`` knows."""
    progress: bool | None = None
    """Show a progress bar (default: only on a TTY)."""
    log_with: list[str] | str | None = None
    """Experiment trackers that receive every metrics.jsonl record and the resolved config: ``tensorboard``
    (offline, in RUN/tensorboard/), ``wandb``, ``mlflow``, a list of them, or none."""


@dataclass
class ExperimentConfig:
    """One experiment: a recipe trains a model family on data."""

    name: str = "experiment"
    """Run name (default run directory: runs/NAME-TIMESTAMP)."""
    recipe: str = "lm"
    """Registered training recipe (``memlab list``): what is trained on what objective."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    options: Any = None
    """Recipe-specific options, checked against the recipe's options dataclass."""


# ----------------------------------------------------------------------------- generic machinery


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Coerce a YAML value to a dataclass field type, or raise ConfigError."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        return _to_union(value, tp, key)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return from_dict(tp, _mapping(value, key), prefix=key + ".")
    if origin in (list, tuple):
        return _to_sequence(value, tp, key)
    if origin is dict or tp is dict:
        return dict(_mapping(value, key))
    scalar = _SCALARS.get(tp)
    return scalar(value, key) if scalar else value


def _to_union(value: Any, tp: Any, key: str) -> Any:
    """The first member type of ``tp`` (``X | None``, ``int | str``) that takes the value."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(value, a, key)
        except ConfigError:
            continue
    raise ConfigError(f"'{key}': {value!r} does not fit {tp}")


def _mapping(value: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"'{key}' must be a mapping, got {value!r}")
    return value


def _to_sequence(value: Any, tp: Any, key: str) -> list | tuple:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"'{key}' must be a list, got {value!r}")
    (inner,) = typing.get_args(tp)[:1] or (Any,)
    out = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    return out if typing.get_origin(tp) is list else tuple(out)


def _quoted(value: Any) -> bool:
    """Whether a YAML string is a number or boolean in quotes (``"2"``, ``"true"``): YAML would read it unquoted
    as that type. One rule for types: such a string is refused for a number or boolean field, as a list is;
    ``3e-4`` stays a string in YAML 1.1 and is read as the number it spells."""
    if not isinstance(value, str):
        return False
    try:
        return not isinstance(yaml.safe_load(value), str)
    except yaml.YAMLError:
        return False


def _quote_hint(value: Any) -> str:
    return f" (a quoted string: write {value} without quotes)" if _quoted(value) else ""


def _to_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"'{key}' must be true or false, got {value!r}{_quote_hint(value)}")


def _to_int(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    f = None
    if isinstance(value, float):
        f = value
    elif isinstance(value, str) and not _quoted(value):  # 1e3: a YAML 1.1 string that spells a number
        try:
            f = float(value)
        except ValueError:
            pass
    if f is not None and f.is_integer():
        return int(f)
    raise ConfigError(f"'{key}' must be an integer, got {value!r}{_quote_hint(value)}")


def _to_float(value: Any, key: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and not _quoted(value):  # PyYAML reads 3e-4 as a string (YAML 1.1)
        try:
            return float(value)
        except ValueError:
            pass
    raise ConfigError(f"'{key}' must be a number, got {value!r}{_quote_hint(value)}")


def _to_str(value: Any, key: str) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"'{key}' must be a string, got {value!r}")


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}
"""Field type -> its coercion from a YAML (or command-line) value."""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type, data: dict | None, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys raise ConfigError naming the valid ones."""
    data = dict(data or {})
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in names:
            raise ConfigError(f"unknown config key '{prefix}{k}'; valid keys: {', '.join(names)}")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Dataclass (nested) -> plain dict, suitable for YAML."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def field_docs(cls: type) -> dict[str, str]:
    """Field -> docstring (the string literal that follows each field in the source)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
            docs[a.target.id] = " ".join(str(b.value.value).split())  # type: ignore[attr-defined]
    return docs


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a nested mapping (in place) and return it."""
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override '{ov}' must look like section.key=value")
        path, raw = ov.split("=", 1)
        keys = path.strip().split(".")
        if not all(keys):
            raise ConfigError(f"override '{ov}' has an empty key")
        node = data
        for k in keys[:-1]:
            nxt = node.get(k)
            if nxt is None:
                nxt = node[k] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override '{ov}': '{k}' is not a section")
            node = nxt
        node[keys[-1]] = _parse_value(raw)
    return data


def experiment_from_dict(data: dict) -> ExperimentConfig:
    """Build and validate an ExperimentConfig (options against the recipe, model against the family)."""
    from memlab.registry import FAMILIES, config_recipe

    if not isinstance(data, dict):
        raise ConfigError("a config must be a YAML mapping")
    data = dict(data)
    options = data.pop("options", None)
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"'options' must be a mapping, got {options!r}")
    cfg = from_dict(ExperimentConfig, data)
    recipe = config_recipe(cfg.recipe)
    opt_cls = getattr(recipe, "options_class", None)
    if opt_cls is None:
        if options:
            raise ConfigError(f"recipe '{cfg.recipe}' takes no options, got: {', '.join(map(str, options))}")
        cfg.options = None
    else:
        cfg.options = from_dict(opt_cls, options or {}, prefix="options.")
    family = FAMILIES.get(cfg.model.family)
    built = family.make_config(cfg.model.preset, **cfg.model.overrides)  # validates keys and preset
    for key in sorted(built.to_dict()):
        value = getattr(built, key, None)
        if (key == "num_hidden_layers" or key.endswith("_layers")) and isinstance(value, int) and value < 1:
            raise ConfigError(f"'model.overrides.{key}' must be >= 1 (a model needs at least one layer), got {value}")
    check_sizes(family, cfg.model.preset, cfg.model.overrides)
    for frac in ("val_fraction", "test_fraction"):
        v = getattr(cfg.data, frac)
        if not 0.0 <= v < 1.0:
            raise ConfigError(f"'data.{frac}' must be in [0, 1), got {v}")
    if cfg.data.split_by not in ("chapter", "document"):
        raise ConfigError(f"'data.split_by' must be 'chapter' or 'document', got {cfg.data.split_by!r}")
    if cfg.train.mixed_precision not in ("auto", "no", "bf16", "fp16"):
        raise ConfigError(f"'train.mixed_precision' must be auto, no, bf16 or fp16, got {cfg.train.mixed_precision!r}")
    t = cfg.train
    for k in ("max_steps", "batch_size", "grad_accum", "eval_every", "eval_batches", "save_every", "log_every"):
        if getattr(t, k) < 1:
            raise ConfigError(f"'train.{k}' must be >= 1, got {getattr(t, k)}")
    if cfg.data.seq_len < 1:
        raise ConfigError(f"'data.seq_len' must be >= 1, got {cfg.data.seq_len}")
    if cfg.data.max_documents is not None and cfg.data.max_documents < 1:
        raise ConfigError(f"'data.max_documents' must be >= 1 (or null), got {cfg.data.max_documents}")
    import math

    if not (math.isfinite(t.lr) and t.lr > 0):
        raise ConfigError(f"'train.lr' must be a positive number, got {t.lr}")
    checks = {"warmup_steps": t.warmup_steps >= 0, "keep_checkpoints": t.keep_checkpoints >= 0, "threads": t.threads >= 0,
              "min_lr_ratio": 0.0 <= t.min_lr_ratio <= 1.0, "clip_grad": t.clip_grad >= 0,
              "weight_decay": t.weight_decay >= 0, "beta1": 0.0 <= t.beta1 < 1.0, "beta2": 0.0 <= t.beta2 < 1.0}
    for k, ok in checks.items():
        if not ok:
            raise ConfigError(f"'train.{k}' is out of range: {getattr(t, k)}")
    if t.compile_backend != "inductor":
        from torch._dynamo import list_backends  # deferred: importing dynamo takes seconds

        if t.compile_backend not in list_backends(exclude_tags=()):
            raise ConfigError(f"'train.compile_backend' {t.compile_backend!r} is not a torch.compile backend "
                              "(inductor, aot_eager, eager, ...)")
    from memlab.tracking import parse_log_with

    parse_log_with(t.log_with)
    if cfg.train.batch_size % cfg.train.grad_accum:
        raise ConfigError("'train.batch_size' must be a multiple of 'train.grad_accum'")
    return cfg


SIZE_KEY = re.compile(r"(size|layers|heads|dim|d_model|positions|embeddings|length|_len$|^num_|steps|^max_)")
"""Model config keys that count something (a width, a number of layers, heads or positions)."""


def check_sizes(family, preset: str | None, overrides: dict) -> None:
    """A ConfigError for an override of a count (:data:`SIZE_KEY`) below what it can be: >= 1 where the preset's
    value is positive, >= 0 where it is 0 (a part turned off), so that torch never meets a negative width."""
    if not overrides:
        return
    defaults = family.make_config(preset).to_dict()
    for key, value in overrides.items():
        if not (SIZE_KEY.search(key) and isinstance(value, int) and not isinstance(value, bool)):
            continue
        low = 1 if isinstance(defaults.get(key), int) and defaults[key] >= 1 else 0
        if value < low:
            raise ConfigError(f"'model.overrides.{key}' must be >= {low} (it counts {key.replace('_', ' ')}), "
                              f"got {value}")


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a syntax error becomes one ConfigError line naming the file, line and column."""
    p = Path(path)
    try:
        text = p.read_text()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot be read ({e.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(problem).split())})") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML experiment, apply dotted overrides, validate strictly."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    data = read_yaml(p)
    if data is None:
        raise ConfigError(f"{p}: config file is empty (it holds no keys; start from a file in configs/)")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config must be a YAML mapping")
    apply_overrides(data, overrides or [])
    return experiment_from_dict(data)


def config_text(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (what ``RUN/config.yaml`` holds)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    from memlab.rundir import write_atomic

    write_atomic(path, config_text(cfg))
