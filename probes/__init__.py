"""Inversion probes: hidden-state capture from any HF model, a trained decoder, and the report."""

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
