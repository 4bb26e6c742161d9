"""Inversion probes: hidden-state capture from any HF model, a trained decoder, and the report.

A probe is a composition of registered parts (:mod:`memlab.probes.parts`); the built-in ones register here.
"""

from memlab.probes import builtin_parts  # noqa: F401  (registers the probe's own parts)
from memlab.probes import pretrained  # noqa: F401  (registers decoder=pretrained:NAME)
from memlab.registry import SPACES


def _load_probe_space(spec=None, **kw):
    from memlab.probes.space import load_probe

    return load_probe(spec, **kw)


SPACES.register("probe", _load_probe_space, description="a fitted inversion probe (its run directory)")


def _register_recipe():
    from memlab.probes.inversion import ProbeOptions
    from memlab.registry import VERB_RECIPES, VerbRecipe

    VERB_RECIPES.register("probe", VerbRecipe("probe", ProbeOptions, verb="probe", description=(
        "inversion probe of a frozen model: memlab probe --config (options: ProbeOptions)")))


_register_recipe()


def probe(*args, **kwargs):
    """Probe a model: see :func:`memlab.probes.inversion.probe`."""
    from memlab.probes.inversion import probe as _probe

    return _probe(*args, **kwargs)
