"""A trained probe's run folder as ``memlab invert --probe RUN`` reads it, before anything heavy is imported.

``memlab probe --out RUN`` writes ``probe.json`` (how its encoder was built: model, layer, pooling, final norm,
special tokens, dtype) and ``report.json`` (every option, the encoder as loaded: the layer resolved, the pooling,
the model's blocks). :func:`read_probe_run` reads the settings both instruments must share; :func:`reconcile` fills
the inversion's unset flags from them and refuses, in one line, a flag that contradicts the run.

Only JSON is read here (no torch): the command checks its flags before it imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memlab.errors import ConfigError
from memlab.probes.catalog import POOLINGS
from memlab.probes.report.recorded import check_recorded, read_json, resolved_layer

POOL_TO_STATES = {p: p for p in POOLINGS}
"""The probe's pooling -> the inversion's ``--states`` that reads the same vector (every built-in pooling,
:data:`memlab.probes.catalog.POOLINGS`: each is read by the ``--states`` of its name)."""

TEXT_FLAGS = ("seq_len", "chunk_by", "corpus", "eval_split", "seed", "n_eval")
"""The flags that choose the chunks: read from the run, never contradicting it."""


@dataclass(frozen=True)
class ProbeRunSettings:
    """What a probe run fixes for an inversion beside it."""

    path: str
    model: str
    layer: int
    """The layer as the probe's encoder resolved it (0 = embeddings, k = output of block k - 1)."""
    num_layers: int
    pool: str
    final_norm: bool
    random_init: bool
    encoder_dtype: str
    text: dict
    """seq_len, chunk_by, corpus, eval_split, seed, n_eval: how the run cut its held-out chunks."""
    cache_dir: str | None
    """Where the run kept its control (None: it kept none on disk)."""


NO_WEIGHTS = ("synthetic:", "space:")
"""Model specs whose encoder is no transformers model: nothing for a white-box inversion to search with."""


def read_probe_run(folder: str) -> ProbeRunSettings:
    """The settings of the probe run in ``folder`` (one ConfigError line when it is not a single probe's run, when
    its files disagree about its settings, or when its encoder is not a model the inversion can search)."""
    p = Path(folder)
    if not p.is_dir():
        raise ConfigError(f"--probe {folder}: no such folder (give the --out folder of a memlab probe run)")
    spec = read_json(p / "probe.json", "a probe's encoder description")
    rep = read_json(p / "report.json", "a probe report")
    opts, enc = rep.get("options"), rep.get("encoder")
    if not isinstance(opts, dict) or not isinstance(enc, dict) or "model" not in spec:
        raise ConfigError(f"--probe {folder}: report.json is not a single probe's report (a sweep's folder? give "
                          "one probe's run folder)")
    if isinstance(opts.get("seq_len"), list):
        raise ConfigError(f"--probe {folder}: a length sweep; give the run folder of one of its lengths")
    if not (p / "decoder").is_dir():
        raise ConfigError(f"--probe {folder}: the run kept no decoder (run memlab probe with a sequence decoder)")
    check_recorded(p)
    model = str(spec["model"])
    if model.startswith(NO_WEIGHTS) or enc.get("layer") is None or enc.get("num_layers") is None:
        raise ConfigError(f"--probe {folder}: the run read {model!r}, an encoder without a transformers model's "
                          "layers; the inversion searches with the model's own weights (give a run of a transformers "
                          "model)")
    try:
        return ProbeRunSettings(
            path=str(p), model=model, layer=int(enc["layer"]), num_layers=int(enc["num_layers"]),
            pool=str(enc["pool"]), final_norm=bool(spec.get("final_norm", False)),
            random_init=bool(spec.get("random_init", False)), encoder_dtype=str(spec.get("dtype", "float32")),
            text={k: opts[k] for k in TEXT_FLAGS}, cache_dir=opts.get("cache_dir"))
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"--probe {folder}: its report lacks a setting the inversion needs ({e})") from None


def reconcile(opts, given: set[str], run: ProbeRunSettings):
    """``opts`` (the inversion's checked :class:`~memlab.probes.invert.options.InvertOptions`; ``given``: the field
    names the user set) with the run's settings filled in; one ConfigError line for a flag that contradicts the
    run or a run the inversion cannot read beside."""
    from dataclasses import replace

    where = f"the probe run {run.path}"
    model, text = opts.model, opts.text
    if run.random_init:
        raise ConfigError(f"{where} read a randomly initialised model; the inversion searches with the model's own "
                          "weights, so its states are not these")
    if run.final_norm:
        raise ConfigError(f"{where} read its layer after the final norm; the inversion reads the raw block output "
                          "(run the probe without --final-norm)")
    if "model" in given and model.model != run.model:
        raise ConfigError(f"--model {model.model} contradicts {where} (model {run.model}); leave --model out")
    if "layer" in given and resolved_layer(model.layer, run.num_layers) != run.layer:
        raise ConfigError(f"--layer {model.layer} contradicts {where} (layer {run.layer} of {run.num_layers}); "
                          "leave --layer out")
    states = POOL_TO_STATES.get(run.pool)
    if "states" in given and model.states != "positions" and model.states != states:
        raise ConfigError(f"--states {model.states} contradicts {where} (pooling {run.pool}: --states "
                          f"{states or 'positions'} reads the same chunks)")
    if "states" not in given and states is None:
        raise ConfigError(f"{where} pools by '{run.pool}', which no pooled search reads; give --states positions "
                          "to invert the same chunks from their per-position states")
    for k in TEXT_FLAGS:
        if k in given and getattr(text, k) != run.text[k]:
            flag = "--" + k.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(text, k)} contradicts {where} ({k} {run.text[k]}); leave {flag} out")
    n = text.n
    if "n" not in given:
        n = min(text.n, run.text["n_eval"])
    elif text.n > run.text["n_eval"]:
        raise ConfigError(f"--n {text.n} is more than the {run.text['n_eval']} held-out chunks of {where}")
    model = replace(model, model=run.model, layer=run.layer,
                    states=model.states if "states" in given else states)
    return replace(opts, model=model, text=replace(text, n=n, **run.text))
