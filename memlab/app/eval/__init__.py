"""Evaluation: tasks (``memlab.registry.TASKS``), model adapters, the runner behind ``memlab eval``
and the optional LLM judge. Importing this package registers the tasks."""

from memlab.app.eval import longctx, tasks  # noqa: F401  (register the tasks)
