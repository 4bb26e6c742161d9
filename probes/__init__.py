"""Inversion probes: hidden-state capture from any HF model, a trained decoder, and the report.

A probe is a composition of registered parts (:mod:`memlab.probes.parts`); the built-in ones register here, by
name (:mod:`memlab.probes.catalog`), and their code is imported when a probe runs: importing this package, and
building ``memlab probe``'s command line, imports neither torch nor transformers.
"""

from memlab.probes import catalog  # noqa: F401  (registers the probe's own parts)
from memlab.probes.options import ProbeOptions
from memlab.registry import SPACES, VERB_RECIPES, VerbRecipe


def load_probe(path=None, **kw):
    """A fitted probe from its run directory (:func:`memlab.probes.decoder.fitted.load_probe`)."""
    from memlab.probes.decoder.fitted import load_probe as load  # start-up: torch, when a probe is loaded

    return load(path, **kw)


def probe(model: str = "minilm", out=None, config=None, encoder=None, **options):
    """Probe ``model``: the experiment ``memlab probe`` runs for the same options (:func:`memlab.probes.experiment.probe`:
    one probe's report, or a layer sweep's, length sweep's, learning curve's or comparison's content)."""
    from memlab.probes.experiment import probe as run  # start-up: torch, when a probe runs

    return run(model, out=out, config=config, encoder=encoder, **options)


# memlab.probes.invert(model, layer, ...): the white-box inversion beside the probe, returning its report (the
# subpackage is callable, :func:`memlab.probes.invert.invert`; importing it imports no torch)
from memlab.probes import invert  # noqa: E402,F401  (the callable subpackage)

SPACES.register("probe", load_probe, description="a fitted inversion probe (its run directory)")


VERB_RECIPES.register("probe", VerbRecipe("probe", ProbeOptions, verb="probe", description=(
    "inversion probe of a frozen model: memlab probe --config (options: ProbeOptions)")))
