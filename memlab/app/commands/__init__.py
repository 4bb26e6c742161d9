"""CLI verbs: one module per verb, each with ``add_parser`` and ``run``."""

from memlab.errors import ConfigError


def check_threads(n: int | None) -> None:
    """``--threads``: unset (torch's own count) or a positive number, else one error before anything runs."""
    if n is not None and n < 1:
        raise ConfigError(f"--threads must be a positive number of CPU threads, got {n}")
