"""White-box inversion: recover a model's input from its states, with the model's own weights.

The package is callable: ``memlab.probes.invert(model, layer, ...)`` runs ``memlab invert`` from Python and
returns its report (:func:`invert`). Importing it imports neither torch nor transformers.
"""

from __future__ import annotations

import sys
import types


def invert(model: str, layer: int | None, out=None, resume=None, **options):
    """Invert the probe's held-out chunks from ``model``'s states at ``layer`` (None for a space's vector,
    ``model="space:memory_ae:PATH"``) into the run folder ``out`` (default
    ``runs/invert-MODEL-TIME``), as ``memlab invert`` does; returns the report (``InvertReport`` for
    ``states="positions"``, ``PooledReport`` for a pooled one). ``options``: any option of
    :mod:`memlab.probes.invert.options` by its field name (``states="last"``, ``seq_len=8``, ``n=4``,
    ``budget=512``, ``prior=False``, ``threads=1``, ...; a name both searches have goes to the chosen one), checked
    as the command checks its flags. ``resume``: a stopped run's folder to continue (its own settings; only
    ``threads``, ``device`` and ``progress`` may be given)."""
    import time
    from dataclasses import fields
    from pathlib import Path

    from memlab.errors import ConfigError
    from memlab.probes.invert.options import (RESUME_MAY_CHANGE, SECTIONS, InvertOptions, from_dict,
                                              parse_value, settle_space)

    if resume is not None:
        from memlab.probes.invert.chunklog import read_settings

        opts = from_dict(read_settings(resume))
        bad = [k for k in options if not any((s, k) in RESUME_MAY_CHANGE for s in SECTIONS)]
        if bad:
            raise ConfigError(f"resume continues a run with its own settings: give no {bad[0]}")
    else:
        opts = InvertOptions()
        opts.model.model, opts.model.layer = model, layer
    states = options.pop("states", None)
    if states is not None:
        opts.model.states = parse_value("model", "states", states)
    if resume is None:
        settle_space(opts.model, {"states"} if states is not None else set())  # a space: --states space, no layer
    chosen = "pooled" if opts.pooled_search else "positions"
    for name, value in options.items():
        where = [s for s in ("model", "text", chosen, "output") if name in {f.name for f in fields(SECTIONS[s])}]
        if not where:
            raise TypeError(f"memlab.probes.invert: no option named {name!r} (for --states {opts.model.states})")
        section = where[0]
        typed = value if isinstance(value, bool) or value is None else parse_value(section, name, str(value))
        setattr(getattr(opts, section), name, typed)
    if resume is None:
        settle_space(opts.model, {"states"})  # again, with every option set (states_from, device_map)
    if resume is not None:
        opts.output.resume = opts.output.out = str(resume)
        out = resume
    elif out is None:
        out = Path("runs") / f"invert-{Path(model).name or model}-{time.strftime('%Y%m%d-%H%M%S')}"
    opts.output.out = str(out)
    if opts.text.n > opts.text.n_eval:
        raise ConfigError(f"n {opts.text.n} is more than the n_eval {opts.text.n_eval} chunks it is drawn from")
    from memlab.probes.invert.run import run_invert

    report, _ = run_invert(opts, Path(out), resume=resume is not None)
    return report


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`invert` (its submodules stay importable as usual)."""

    def __call__(self, *args, **kwargs):
        return invert(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
