"""The one dispatch of a probe's options: the experiment they ask for, the same from the command line and Python.

``memlab probe`` and :func:`memlab.probes.probe` both call :func:`run_experiment`, so the same options run the same
experiment (:func:`memlab.probes.checks.experiment` chooses it):

* one probe (:func:`memlab.probes.run.run_probe`): its report;
* a layer sweep, ``layers`` (:func:`memlab.probes.sweeps.layers.run_layer_sweep`): layers.json's content;
* a length sweep, a list of ``seq_len`` (:func:`memlab.probes.sweeps.lengths.run_length_sweep`): curve.json's;
* a learning curve, a list of ``n_train``, or a comparison, ``compare``
  (:func:`memlab.probes.sweeps.layers.run_learning_curve`): curve.json's.

It sits above :mod:`memlab.probes.run` and the sweeps: the sweeps call the run's steps, so the run cannot call them.
"""

from __future__ import annotations

from pathlib import Path

from memlab.probes.options import ProbeOptions, experiment, load_options, parse_sizes
from memlab.probes.run import run_probe
from memlab.probes.sweeps.layers import run_layer_sweep, run_learning_curve
from memlab.probes.sweeps.lengths import run_length_sweep


def run_experiment(opts: ProbeOptions, out: str | Path | None = None, encoder=None):
    """Run the experiment ``opts`` ask for (:func:`memlab.probes.checks.experiment`) into ``out``; ``encoder``: an
    encoder already loaded (else ``opts.model``'s). Returns the probe's report (None on a launch's other processes)
    or the sweep's content."""
    kind = experiment(opts)
    if kind == "layers":
        return run_layer_sweep(opts, opts.layers, out, sequence=opts.layers_sequence, encoder=encoder)
    if kind == "lengths":
        return run_length_sweep(opts, out, encoder=encoder)
    if kind == "curve":
        return run_learning_curve(opts, parse_sizes(opts.n_train), out, encoder=encoder)
    return run_probe(opts, out, encoder=encoder)


def probe(model: str = "minilm", out: str | Path | None = None, config: str | Path | None = None, encoder=None,
          **options):
    """Python API (``memlab.probes.probe``): the experiment ``memlab probe`` runs for the same options (ProbeOptions
    fields as keywords, ``config`` a YAML file): one probe's typed report (``report.fitted`` is the fitted probe, an
    EmbeddingSpace), or with ``layers=``, a list of ``seq_len`` or of ``n_train``, or ``compare=``, the sweep's
    content (:func:`run_experiment`)."""
    return run_experiment(load_options(config, model=model, **options), out, encoder=encoder)
