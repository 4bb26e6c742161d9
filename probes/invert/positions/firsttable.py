"""The first-position table, kept and verified: every token's state at the first position after an empty prefix.

A model that reads no BOS token starts every chunk at its attention sink, where the gradient ranks poorly; one pass
over the vocabulary gives every token's state there, and all chunks (of this run and of later ones) read their
first token off it. The table is kept in a cache folder as a safetensors file whose metadata holds the sha256 of
the table's bytes and the sha256 of its key (the weights' fingerprint, the layer, the prefix, the vocabulary size,
the weights' dtype). Both are checked when the file is read: a file whose bytes or key do not match (a damaged
file, another model's table under this name) gives one warning and is computed again.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import torch


def digest(table: torch.Tensor) -> str:
    """sha256 of a table's bytes (float32, C order)."""
    return hashlib.sha256(table.float().contiguous().numpy().tobytes()).hexdigest()


def table_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / f"invert-first-{hashlib.sha1(key.encode()).hexdigest()[:20]}.safetensors"


def read_table(path: Path, key: str) -> torch.Tensor | None:
    """The kept table at ``path`` when its bytes and its key check out; None (and one warning) when not; None when
    there is no file."""
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            table = f.get_tensor("states")
    except Exception as e:  # noqa: BLE001  (a file that is not a safetensors file at all)
        warnings.warn(f"the kept first-position table {path} cannot be read ({str(e)[:80]}); computing it again",
                      stacklevel=2)
        return None
    want_key = hashlib.sha256(key.encode()).hexdigest()
    if meta.get("key_sha256") != want_key:
        warnings.warn(f"the kept first-position table {path} was made for other weights, layer or prefix; "
                      "computing it again", stacklevel=2)
        return None
    if meta.get("sha256") != digest(table):
        warnings.warn(f"the kept first-position table {path} is damaged (its sha256 does not match); computing it "
                      "again", stacklevel=2)
        return None
    return table


def write_table(path: Path, key: str, table: torch.Tensor) -> None:
    """Keep ``table`` ``(V, D)`` at ``path`` (written whole: a temporary name, then renamed) with its checks."""
    from safetensors.torch import save

    from memlab.rundir import write_atomic

    table = table.float().contiguous()
    meta = {"sha256": digest(table), "key_sha256": hashlib.sha256(key.encode()).hexdigest(), "key": key}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, save({"states": table}, metadata=meta))
