"""CLI verbs: one module per verb, each with ``add_parser`` and ``run``."""
