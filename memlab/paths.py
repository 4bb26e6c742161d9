"""Where the files memlab reads at run time live, in a source checkout and in an installed wheel.

Everything the program reads at run time ships inside the package: ``memlab/resources/``
(the bundled corpus, shipped checkpoints, the small eval task sets) and the experiment
configs. The configs have one source, the repository's ``configs/`` folder; the wheel
installs it as the package data ``memlab/configs/`` (``pyproject.toml``).
"""

from __future__ import annotations

from pathlib import Path

from memlab.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent
RESOURCES = PACKAGE / "resources"
"""``memlab/resources``: bundled corpora, shipped checkpoints, eval task sets."""


def resource(*parts: str) -> Path:
    """A path under ``memlab/resources`` (it may not exist; callers say what is missing)."""
    return RESOURCES.joinpath(*parts)


def configs_dir() -> Path:
    """The shipped experiment configs: ``memlab/configs`` in a wheel install, the repository's ``configs/``
    in a source checkout (an editable install maps the package there too)."""
    for d in (PACKAGE / "configs", PACKAGE.parent / "configs"):
        if (d / "token_lm").is_dir():
            return d
    raise ConfigError(f"no shipped configs next to {PACKAGE} (a broken install?)")


def shipped_config(name: str) -> Path:
    """A shipped config by its path under ``configs/``, e.g. ``token_lm/toy.yaml``."""
    path = configs_dir() / name
    if not path.is_file():
        raise ConfigError(f"no shipped config '{name}' in {configs_dir()}")
    return path
