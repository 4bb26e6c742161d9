"""memlab: a research framework for memory in language models."""

__version__ = "0.1.0"
