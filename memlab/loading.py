"""Load what a run saved: a model (and tokenizer) from a run directory or checkpoint."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from memlab.errors import ModelError
from memlab.progress import fold_bars


def resolve_model_dir(path: str | Path) -> Path:
    """A run directory -> its latest checkpoint; a ``save_pretrained`` folder -> itself."""
    from memlab.train.checkpoint import newest_intact_checkpoint

    p = Path(path)
    if (p / "config.json").is_file():
        return p
    if (p / "checkpoints").is_dir():
        last = newest_intact_checkpoint(p)  # a damaged newer checkpoint is named in one line and skipped
        if last is not None:
            return last
    raise ModelError(f"{p}: neither a saved model (config.json) nor a run directory with a checkpoint")


def load_pretrained(path: str | Path, model_class=None):
    """Load a model saved by memlab (safetensors; ``trust_remote_code`` stays off), strictly.

    Without ``model_class`` the class comes from the registered family whose
    model class name matches the saved ``architectures`` entry. Weights that do
    not fit the class's own keys are one ModelError (:func:`strict_from_pretrained`).
    """
    from memlab.registry import FAMILIES

    d = resolve_model_dir(path)
    if model_class is None:
        model_class = FAMILIES.get(family_of(d)).model_class
    else:
        check_saved_class(d, model_class)
    from memlab.train.checkpoint import weights_are_finite

    model = strict_from_pretrained(model_class, d)
    if not weights_are_finite(model):  # a diverged model is refused, not run to print nothing
        raise ModelError(f"{d}: the saved weights hold NaN or infinite values; the model diverged (use an earlier "
                         "checkpoint or retrain with a lower train.lr)")
    from memlab.devices import place

    return place(model)  # on the device of an enclosing memlab.devices.running_on (--device), else as loaded


def safetensors_files(folder: str | Path) -> list[Path]:
    """The weight files of a local ``save_pretrained`` folder (its index's shards, or ``model.safetensors``);
    empty when it has neither (a hub name, ``.bin`` weights)."""
    import json

    d = Path(folder)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []  # transformers' own reader names what is wrong with it
        return [d / f for f in shards]
    return [d / "model.safetensors"] if (d / "model.safetensors").is_file() else []


PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth", "model.ckpt")
"""Weight files of a saved folder that are Python pickles: never read (unpickling a file can run its code)."""


def check_safetensors_weights(folder: str | Path) -> None:
    """A ModelError naming the file when a local folder holds its weights only as a pickle
    (``pytorch_model.bin``, sharded or not): memlab reads safetensors and never unpickles weights."""
    d = Path(folder)
    if not d.is_dir() or safetensors_files(d):
        return
    pickled = [d / n for n in PICKLED_WEIGHTS if (d / n).is_file()] or sorted(d.glob("pytorch_model-*.bin"))
    if pickled:
        raise ModelError(f"{pickled[0]}: pickled weights, which memlab does not read (unpickling can run code); "
                         "save the model as safetensors (save_pretrained with safe_serialization=True, where you "
                         "trust the file) and give that folder")


@contextmanager
def _own_load_report() -> Iterator[None]:
    """transformers' warnings held back during a load whose loading info memlab checks itself (its "LOAD REPORT"
    of missing and unexpected keys would repeat, as a warning, what :func:`strict_from_pretrained` refuses or
    allows); a user who asked for transformers' logs (``TRANSFORMERS_VERBOSITY``) keeps them."""
    from transformers.utils import logging as hf_logging  # deferred: transformers is heavy to import

    if os.environ.get("TRANSFORMERS_VERBOSITY"):
        yield
        return
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _from_pretrained(model_class, folder: str | Path, read_by_tensor: bool, **kw):
    """``model_class.from_pretrained`` of ``folder``; with ``read_by_tensor`` (a local safetensors folder, a
    ``config`` in ``kw``) each tensor is read from its file (``pread``, no memory map), cast and placed before the
    next: host memory holds the model in its load dtype plus one tensor, where a memory-mapped read keeps every
    mapped page of the files resident until the end (the file's size again when the dtype changes)."""
    check_safetensors_weights(folder)
    files = safetensors_files(folder) if read_by_tensor and kw.get("config") is not None else []
    if not files:
        if not kw.get("gguf_file"):  # a hub name's cached pickle is refused by transformers itself
            kw.setdefault("use_safetensors", True)
            return model_class.from_pretrained(str(folder), **kw)
        from transformers import modeling_gguf_pytorch_utils as gguf_reader  # deferred: needs gguf, read only here

        with fold_bars(gguf_reader):  # its de-quantisation bar, drawn as memlab's progress in a memlab command
            return model_class.from_pretrained(str(folder), **kw)
    from safetensors import safe_open

    cls = model_class
    if hasattr(model_class, "_model_mapping"):  # an Auto class: the concrete class of the config
        from transformers.models.auto.auto_factory import _get_model_class

        cls = _get_model_class(kw["config"], model_class._model_mapping)
    readers = []
    try:
        for f in files:
            readers.append(safe_open(str(f), framework="pt", device="cpu", backend="pread"))
        state = {k: r.get_slice(k) for r in readers for k in r.keys()}  # lazy: read when loaded
        return cls.from_pretrained(None, state_dict=state, **kw)
    finally:
        for r in readers:
            r.__exit__(None, None, None)


def strict_from_pretrained(model_class, folder: str | Path, allow_unexpected: bool = False, what: str | None = None,
                           read_by_tensor: bool = False, **kw):
    """``model_class.from_pretrained(folder, **kw)`` that refuses weights which do not fit the model's keys.

    transformers initialises missing weights at random and only logs it; here
    any missing or reshaped key (and, unless ``allow_unexpected``, any key the
    model does not have) is one ModelError naming the first ones. A damaged
    file (a truncated or oversized safetensors header) is one ModelError too.
    ``allow_unexpected`` is for a base model read from a checkpoint with a
    task head (``lm_head.weight`` of a causal LM is not read by its encoder).
    ``read_by_tensor`` reads a local folder's safetensors a tensor at a time into host memory (see
    :func:`_from_pretrained`; for a model loaded on the CPU).
    """
    from memlab.errors import is_read_error
    from memlab.train.checkpoint import check_weights_fit

    what = what or str(folder)
    try:
        with _own_load_report():
            model, info = _from_pretrained(model_class, folder, read_by_tensor, output_loading_info=True, **kw)
    except Exception as e:  # SafetensorError, JSONDecodeError, OSError: a damaged save
        if not is_read_error(e):
            raise
        files = safetensors_files(folder) if Path(folder).is_dir() else []
        where = what if len(files) != 1 else str(files[0]) if what == str(folder) else f"{what}: {files[0]}"
        raise ModelError(f"{where}: the saved model cannot be read ({' '.join(str(e).split())[:160]})") from None
    check_weights_fit(what, model_class.__name__ if model_class.__name__ != "AutoModel" else type(model).__name__,
                      info.get("missing_keys") or (), () if allow_unexpected else info.get("unexpected_keys") or (),
                      info.get("mismatched_keys") or ())
    if info.get("error_msgs"):
        raise ModelError(f"{what}: the saved weights do not fit {type(model).__name__}: {info['error_msgs'][0]}")
    return model


def saved_architecture(model_dir: str | Path) -> str | None:
    """The model class named in a save's ``config.json`` (``architectures``); None when unreadable."""
    import json

    try:
        return (json.loads((Path(model_dir) / "config.json").read_text()).get("architectures") or [None])[0]
    except (OSError, ValueError, AttributeError):
        return None


def family_of(model_dir: str | Path) -> str:
    """Name of the registered family whose model class built the saved model (``architectures`` in config.json)."""
    from memlab.registry import FAMILIES

    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise ModelError(f"{d}: no config.json (not a saved model)")
    arch = saved_architecture(d)
    for name in FAMILIES.names():
        model_class = FAMILIES.get(name).model_class
        if model_class.__name__ == arch:
            check_model_type(d, model_class, name)
            return name
    raise ModelError(f"{d}: no registered model family builds '{arch}'")


def check_model_type(model_dir: Path, model_class, family: str) -> None:
    """A ModelError when ``config.json``'s ``model_type`` is not the one ``model_class`` reads (a config edited
    by hand, or another library's): the weights would be read with a config that does not describe them."""
    import json

    try:
        saved = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return
    expected = getattr(getattr(model_class, "config_class", None), "model_type", None)
    if expected and saved != expected:
        raise ModelError(f"{model_dir}: config.json says model_type {saved!r}, but its architecture "
                         f"{model_class.__name__} (family {family}) reads model_type {expected!r}; no family knows "
                         f"{saved!r}")


def check_saved_class(model_dir: str | Path, model_class, asked: str | None = None) -> None:
    """A ModelError naming both families when ``model_dir`` was saved by another registered family's class
    than ``model_class`` (``asked``: how the user chose it, e.g. ``model.family: memory in RUN/config.yaml``)."""
    arch = saved_architecture(model_dir)
    if arch is None or arch == model_class.__name__:
        return
    try:
        saved = family_of(model_dir)
    except ModelError:
        return  # not one of ours: the key check decides
    from memlab.registry import FAMILIES

    wanted = next((n for n in FAMILIES.names() if FAMILIES.get(n).model_class is model_class), model_class.__name__)
    raise ModelError(f"{model_dir} holds a '{saved}' model ({arch}), not a '{wanted}' one ({model_class.__name__})"
                     + (f" as {asked} says; put back model.family: {saved}" if asked
                        else f"; use a run of family '{wanted}'"))


def load_run_tokenizer(path: str | Path):
    from memlab.data.tokenizer import load_tokenizer

    return load_tokenizer(str(resolve_model_dir(path)))


def run_dir_of(model_dir: str | Path) -> Path | None:
    """The run directory that saved ``model_dir``: a checkpoint ``RUN/checkpoints/NAME`` (the layout of
    :mod:`memlab.train.checkpoint`) -> ``RUN``; a run directory -> itself; None for a standalone folder."""
    d = Path(model_dir)
    if (d / "config.yaml").is_file() and (d / "checkpoints").is_dir():
        return d
    run = d.parent.parent
    if d.parent.name == "checkpoints" and (run / "config.yaml").is_file():
        return run
    return None


def run_config(model_dir: str | Path) -> dict:
    """The resolved experiment config (``RUN/config.yaml``) of the run that saved ``model_dir``, as a
    dict; empty for a standalone saved folder."""
    from memlab.config import read_yaml

    run = run_dir_of(model_dir)
    return (read_yaml(run / "config.yaml") or {}) if run is not None else {}


TOKENIZER_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
"""Special-token ids a model built for a tokenizer takes from it."""


def config_for_tokenizer(family, preset: str, overrides: dict, tokenizer, seq_len: int | None = None, **defaults):
    """The config of ``family``'s ``preset`` sized to ``tokenizer``: its vocabulary size and special ids
    (then ``defaults``, e.g. a family's own special ids) unless ``overrides`` set them; checked to fit."""
    over = {"vocab_size": len(tokenizer), **{k: getattr(tokenizer, k) for k in TOKENIZER_IDS}, **defaults,
            **overrides}
    config = family.make_config(preset, **over)
    check_fits_tokenizer(config, tokenizer, seq_len)
    return config


def check_fits_tokenizer(config, tokenizer, seq_len: int | None = None) -> None:
    """A ConfigError when the model has fewer embeddings than the tokenizer has tokens, or fewer positions
    than ``seq_len``."""
    from memlab.errors import ConfigError

    if config.vocab_size < len(tokenizer):
        raise ConfigError(f"the model has {config.vocab_size} embeddings for the tokenizer's {len(tokenizer)} tokens")
    max_pos = getattr(config, "max_position_embeddings", None)
    if seq_len is not None and max_pos is not None and seq_len > max_pos:
        raise ConfigError(f"data.seq_len={seq_len} is longer than the model allows (max_position_embeddings={max_pos})")
