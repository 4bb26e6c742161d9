"""User-facing errors.

A :class:`MemlabError` is a mistake in what the user asked for (a bad config
key, a missing corpus, an unknown model offline). The CLI prints its message
as one line and exits with status 2, without a traceback; anything else is a
bug and keeps its traceback.
"""


class MemlabError(Exception):
    """A user error: printed as one line by the CLI, exit status 2."""

    quiet: bool = False
    """Set on the processes of a multi-process launch that did not report the error themselves (an error that
    every process meets, or one met on another process, is printed once, by one process)."""


class ConfigError(MemlabError):
    """A config file or override that does not fit the config dataclasses."""


class DataError(MemlabError):
    """A corpus, tokenizer or dataset that cannot be used as asked."""


class ModelError(MemlabError):
    """A model or space that cannot be built, loaded or combined as asked."""


READ_ERRORS = ("SafetensorError", "JSONDecodeError", "HeaderTooLarge", "UnicodeDecodeError")
"""Names of the exceptions (besides OSError and ValueError) that reading a damaged or foreign file raises."""


def is_read_error(e: BaseException) -> bool:
    """Whether ``e`` is what reading a damaged or foreign saved file raises (not a bug)."""
    return isinstance(e, (OSError, ValueError)) or type(e).__name__ in READ_ERRORS
