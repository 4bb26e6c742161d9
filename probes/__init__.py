"""Inversion probes: hidden-state capture from any HF model, a trained decoder, and the report.

A probe is a composition of registered parts (:mod:`memlab.probes.parts`); the built-in ones register here.
"""

from memlab.probes import builtin_parts  # noqa: F401  (registers the probe's own parts)
from memlab.probes import pretrained  # noqa: F401  (registers decoder=pretrained:NAME)
from memlab.probes.lengths import probe  # noqa: F401  (the Python API: a probe, or a length sweep)
from memlab.probes.options import ProbeOptions
from memlab.probes.space import load_probe
from memlab.registry import SPACES, VERB_RECIPES, VerbRecipe


SPACES.register("probe", load_probe, description="a fitted inversion probe (its run directory)")


VERB_RECIPES.register("probe", VerbRecipe("probe", ProbeOptions, verb="probe", description=(
    "inversion probe of a frozen model: memlab probe --config (options: ProbeOptions)")))
