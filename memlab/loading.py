"""Load what a run saved: a model (and tokenizer) from a run directory or checkpoint."""

from __future__ import annotations

from pathlib import Path

from memlab.errors import ModelError


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
    """Load a model saved by memlab (safetensors; ``trust_remote_code`` stays off).

    Without ``model_class`` the class comes from the registered family whose
    model class name matches the saved ``architectures`` entry.
    """
    from memlab.registry import FAMILIES

    d = resolve_model_dir(path)
    if model_class is None:
        model_class = FAMILIES.get(family_of(d)).model_class
    try:
        return model_class.from_pretrained(str(d))
    except Exception as e:  # SafetensorError, JSONDecodeError, OSError: a damaged save
        if type(e).__name__ not in ("SafetensorError", "JSONDecodeError") and not isinstance(e, OSError):
            raise
        raise ModelError(f"{d}: the saved model cannot be read ({' '.join(str(e).split())[:160]})") from None


def family_of(model_dir: str | Path) -> str:
    """Name of the registered family whose model class built the saved model (``architectures`` in config.json)."""
    import json

    from memlab.registry import FAMILIES

    d = Path(model_dir)
    arch = (json.loads((d / "config.json").read_text()).get("architectures") or [None])[0]
    for name in FAMILIES.names():
        if FAMILIES.get(name).model_class.__name__ == arch:
            return name
    raise ModelError(f"{d}: no registered model family builds '{arch}'")


def load_run_tokenizer(path: str | Path):
    from memlab.data.tokenizer import load_tokenizer

    return load_tokenizer(str(resolve_model_dir(path)))
