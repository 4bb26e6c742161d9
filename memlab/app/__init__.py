"""The application layer: the ``memlab`` command line (:mod:`memlab.app.cli`), its verbs
(:mod:`memlab.app.commands`), the quickstart, the benchmarks (:mod:`memlab.app.bench`) and the
evaluation runner (:mod:`memlab.app.eval`).

This is the one place that composes plugins (model families, probes, curricula) by name; the core
(``memlab`` outside this package) never imports it, and plugins never import it either
(``tests/core/test_layering.py`` checks both).
"""
