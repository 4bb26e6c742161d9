"""The probe's parts: registries of the pieces a probe is composed of.

A probe is an encoder (what reads the text), a pooling (how its states become
one vector), a conditioning (how the decoder reads that vector), token inputs,
a decoder, read-outs besides the decoder and scorers of its reconstruction.
Each kind is a registry (:data:`PARTS`) of :class:`Part` objects; ProbeOptions
names the chosen one of each (``pool``, ``conditioning``, ``inputs``,
``decoder``, ``readouts``, ``scorers``; the encoder is chosen by the ``model``
spec). A new kind of any of them is one file that calls :func:`register_part`
(a plugin, see :mod:`memlab.registry`); ``tests/probes/test_probe_parts.py`` checks
every registered part against its kind's contract and adds one from outside
the tree.

A part declares its own options (``options_class``, a dataclass: each field a probe option under its own
name, typed, with its default); setting one of them while another part of its kind is chosen is refused by
name (``input_dropout`` with ``inputs=blank``, ``prefix_len`` with ``conditioning=unrolled``), and the part's
code gets them (:func:`part_options`). The registry is the dispatch: the chosen part's own code runs, and
nothing else names it. A part may check the options further (``check``), and may take an argument after a
colon (``argument``: ``decoder=pretrained:NAME`` chooses the part ``pretrained`` with argument ``NAME``).

Contracts (``impl``; ``options``: the part's options dataclass, given to a function that takes it):

* ``encoder``: :class:`EncoderKind` (``matches(spec)``, ``load(spec, **kw, options=)``; ``source`` for a
  transformers model, ``known_content`` for a calibration encoder);
* ``pool``: ``f(states (B, T, D), mask (B, T)[, options]) -> (B, D)``;
* ``conditioning``: :class:`Conditioning` (vectors per chunk, and how they join the token inputs; its options
  are in the decoder's config);
* ``inputs``: ``f(decoder_input_ids (B, T), config, training) -> (B, T)`` ids the decoder reads, or an
  :class:`InputMode` that says whether they hold the true tokens; its options are in the decoder's config;
* ``decoder``: ``f(config: ProbeDecoderConfig[, options]) -> nn.Module`` (the probe decoder's interface,
  :class:`memlab.probes.decoder.model.ProbeDecoderAPI`), or a :class:`DecoderKind` (a decoder with its own
  tokenizer, options and save format, e.g. ``pretrained:NAME``);
* ``readout``: ``f(z_train, train_ids, z_eval, eval_ids, seed, device[, context][, options]) -> dict`` (fitted on
  ``device``, the probe's) with ``recovered``, ``prior``, ``gain`` and ``_per_chunk`` (per held-out chunk:
  ``recovered`` and ``prior``; with ``nll`` and ``prior_nll``, nats over the same tokens, the intervals also give
  ``NAME_bits_per_chunk``; with ``tf1`` and ``prior_tf1``, ``NAME_token_set_f1_gain``). A read-out whose ``f``
  takes a ``context`` keyword is also given a :class:`ReadoutContext` (the chunk texts, the encoder's tokenizer
  and width, the options); a part's optional ``check_context(context)`` runs once the chunks are cut, before
  anything is encoded or fitted, and refuses what cannot be read in one line. A read-out trained by gradient
  also gives a ``member`` (:class:`Part`), trained in the probe's fit loop. It declares its summary line,
  interval lines, sweep columns and retention unit (:class:`Part`);
* ``scorer``: ``f(pred (N, T), true (N, T), hyps, refs[, options]) -> float``.
"""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable

from memlab.errors import ConfigError
from memlab.probes.sections import PART_OPTIONS
from memlab.registry import ALL, Registry
from memlab.probes.kinds import Conditioning, DecoderKind, EncoderKind, InputMode  # noqa: F401  (the part contract)

KINDS = ("encoder", "pool", "conditioning", "inputs", "decoder", "readout", "scorer")
PARTS: dict[str, Registry] = {k: Registry(f"probe {k}") for k in KINDS}
LISTED = {k: "probe_inputs" if k == "inputs" else f"probe_{k}s" for k in KINDS}
"""The name each kind's registry has in :data:`memlab.registry.ALL` (``memlab list probe_decoders``)."""
ALL.update({LISTED[k]: PARTS[k] for k in KINDS})

SELECTED_BY = {"pool": "pool", "conditioning": "conditioning", "inputs": "inputs", "decoder": "decoder",
               "readout": "readouts", "scorer": "scorers"}
"""The ProbeOptions field that names the chosen part(s) of each kind (readouts and scorers: a list)."""


GENERIC: dict[str, tuple[str, ...]] = {
    "encoder": ("layer", "final_norm", "random_init", "special_tokens", "encoder_dtype", "device_map", "max_memory",
                "offload_dir"),
    "decoder": ("conditioning", "inputs", "bag_head", "select_decoder", "plain_input_dropout", "cond_dropout",
                "contained_lr"),
}
"""The generic settings of each kind: options every part of the kind is given, which each part states whether it
honours (:attr:`Part.honours`). One set explicitly while the chosen part does not honour it is refused in one line
(:func:`check_parts`); left at its default, it is switched off for that part (:func:`unhonoured`)."""

UNHONOURED = {"bag_head": False, "select_decoder": False}
"""The value a generic setting takes for a part that does not honour it (the others are then not read)."""


def resolve(ref: Any) -> Any:
    """``"module:attr"`` -> that object, imported now; anything else as it is."""
    if isinstance(ref, str) and ":" in ref:
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)
    return ref


LAZY = ("impl", "check", "check_context", "summary", "columns", "member", "save", "load")
"""The attributes of a :class:`Part` that may be given as ``"module:attr"`` and are imported on first use."""


class Part:
    """One registered choice of one kind of probe part: its code (``impl``), its own options (``options``, a
    dataclass: each field an option, typed, with its default and a docstring), the generic settings of its kind it
    honours (``honours``: names from :data:`GENERIC`, or ``"all"``) and, for a decoder, how it saves and loads its
    files (``save(decoder, folder)``, ``load(folder)``; default: :func:`memlab.probes.decoder.build.save_decoder` and a
    rebuild from the saved config and options).

    Its code and hooks (:data:`LAZY`) may be given as ``"module:attr"``: imported the first time they are used, so
    that registering a part, and building the probe's command line from its options, imports nothing heavy."""

    def __init__(self, name: str, impl: Any, options: type | None = None, description: str = "",
                 argument: str = "", check: Callable[[Any, Any, set], None] | str | None = None,
                 check_context: Callable[..., None] | str | None = None,
                 readings: tuple[tuple[str, str, bool, int], ...] = (),
                 summary: Callable[[dict], str] | str | None = None, gain_unit: str = "",
                 columns: Callable[[dict], dict] | str | None = None, member: Callable[..., Any] | str | None = None,
                 honours: tuple[str, ...] | str = (), save: Callable[[Any, Any], None] | str | None = None,
                 load: Callable[..., Any] | str | None = None, options_class: type | None = None):
        options = options if options is not None else options_class
        if options is not None and not is_dataclass(options):
            raise TypeError(f"part '{name}': options must be a dataclass of its options (fields with defaults), "
                            f"got {options!r}")
        self.name, self.options, self.description, self.argument = name, options, description, argument
        self.readings, self.gain_unit = tuple(readings), gain_unit
        self.honours = (honours,) if isinstance(honours, str) else tuple(honours)
        self._refs = dict(impl=impl, check=check, check_context=check_context, summary=summary, columns=columns,
                          member=member, save=save, load=load)

    def __getattr__(self, attr: str) -> Any:  # only for names that are not set: the lazy hooks
        refs = self.__dict__.get("_refs", {})
        if attr not in refs:
            raise AttributeError(attr)
        refs[attr] = resolve(refs[attr])
        return refs[attr]

    @property
    def options_class(self) -> type | None:
        """The part's options dataclass (what ``memlab list`` shows)."""
        return self.options

    @property
    def option_names(self) -> tuple[str, ...]:
        """The names of the part's own options."""
        return tuple(f.name for f in fields(self.options)) if self.options is not None else ()

    def honoured(self, kind: str) -> tuple[str, ...]:
        """The generic settings of ``kind`` this part honours."""
        return GENERIC.get(kind, ()) if "all" in self.honours else tuple(self.honours)

    def __repr__(self) -> str:
        return f"Part({self.name!r})"


def part_options(opts, part: Part):
    """``part``'s options dataclass, with the values ``opts`` holds (its defaults without ``opts``)."""
    cls = part.options
    if cls is None:
        return None
    if opts is None:
        return cls()
    explicit = getattr(opts, "explicit", None)
    given = {f.name: getattr(opts, f.name) for f in fields(cls)
             if explicit is None or f.name in explicit or not _also_elsewhere(f.name, cls)}
    return cls(**given)


def _also_elsewhere(name: str, cls: type) -> bool:
    """Whether option ``name`` of the part options ``cls`` is also a built-in part's option (``hidden_size`` of a
    plugin decoder and of ``llama``): unset, each part then gets its own default."""
    return any(c is not cls and name in {f.name for f in fields(c)} for c in PART_OPTIONS.values())


@dataclass(frozen=True)
class ReadoutContext:
    """What a read-out may know besides the embeddings and the token ids: the texts of the training and held-out
    chunks (in the order of their ids; a learning curve's sizes take a prefix), the encoder's tokenizer and width,
    and the probe's options (None outside a probe: :meth:`option` then gives the defaults)."""

    texts_train: list[str] | None = None
    texts_eval: list[str] | None = None
    tokenizer: Any = None
    dim: int | None = None
    opts: Any = None

    def option(self, name: str, default=None):
        """The probe option ``name``, or ``default`` without options."""
        return getattr(self.opts, name, default) if self.opts is not None else default


def takes(impl, keyword: str) -> bool:
    """Whether a part's ``f`` accepts ``keyword`` (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(impl).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def takes_context(impl) -> bool:
    """Whether a read-out's ``f`` accepts the ``context`` keyword."""
    return takes(impl, "context")


def own_options(part: Part, opts) -> dict:
    """``{"options": the part's options}`` when the part has options and its ``f`` takes them, else ``{}``."""
    return {"options": part_options(opts, part)} if part.options is not None and takes(part.impl, "options") \
        else {}


def readout_context(opts, tok, texts, dim: int | None = None) -> ReadoutContext:
    """The :class:`ReadoutContext` of chunks whose texts are ``texts`` (train, held-out; None: unknown)."""
    tr, ev = texts if texts is not None else (None, None)
    return ReadoutContext(texts_train=tr, texts_eval=ev, tokenizer=tok, dim=dim, opts=opts)


def fit_readout(train_ids, eval_ids, z_train, z_eval, name: str, seed: int = 0, context=None,
                device: str = "cpu") -> dict:
    """The registered read-out ``name`` fitted on ``device`` and scored, with its seconds;
    a read-out that takes a ``context`` keyword gets ``context`` (:class:`ReadoutContext`)."""
    part = get_part("readout", name)
    impl = part.impl
    kw = {"context": context} if takes_context(impl) else {}
    kw.update(own_options(part, context.opts if context is not None else None))
    t0 = time.perf_counter()
    out = impl(z_train, train_ids, z_eval, eval_ids, seed=seed, device=device, **kw)
    out["seconds"] = time.perf_counter() - t0
    return out


def readout_lines(name: str) -> tuple[tuple[str, str, bool, int], ...]:
    """The read-out ``name``'s interval lines, its reading keys in full (``NAME_...``)."""
    own = PARTS["readout"].get(name).readings if name in PARTS["readout"] else ()
    own = own or (("recovered", f"{name} read-out", False, 3), ("gain", f"{name} read-out over its prior", True, 3))
    return tuple((f"{name}_{key}", label, gain, digits) for key, label, gain, digits in own)


def readout_gains(names) -> dict[str, str]:
    """``NAME_gain`` -> how the retention line names it, for each read-out of ``names``."""
    parts = {n: PARTS["readout"].get(n) if n in PARTS["readout"] else None for n in names}
    return {f"{n}_gain": (p.gain_unit if p is not None and p.gain_unit else f"of the {n} read-out over its prior")
            for n, p in parts.items()}


def readout_summary(name: str, result: dict) -> str:
    """The read-out ``name``'s line in the summary, from its fitted ``result``."""
    part = PARTS["readout"].get(name) if name in PARTS["readout"] else None
    if part is not None and part.summary is not None:
        return part.summary(result)
    return f"{name} read-out: recovered {result['recovered']:.3f} (prior {result['prior']:.3f})"


def readout_columns(name: str, result: dict) -> dict:
    """The read-out ``name``'s columns of a sweep's table, from its fitted ``result``."""
    part = PARTS["readout"].get(name) if name in PARTS["readout"] else None
    if part is not None and part.columns is not None:
        return part.columns(result)
    return {f"{name}_recovered": result["recovered"], f"{name}_prior": result["prior"]}


def check_readouts(opts, context: ReadoutContext) -> None:
    """Each chosen read-out's ``check_context`` (see :class:`Part`)."""
    for name in chosen(opts, "readout"):
        part = get_part("readout", name)
        if part.check_context is not None:
            part.check_context(context)


def reads_tokens(config) -> bool:
    """Whether the input mode a decoder ``config`` names feeds it the true previous tokens (a plain function: yes)."""
    return bool(getattr(get_part("inputs", config.inputs).impl, "reads_tokens", True))


_ENCODER_ORDER: list[str] = []


def register_part(kind: str, part: Part) -> Part:
    """Add ``part`` to the registry of ``kind`` (one of :data:`KINDS`)."""
    if kind not in PARTS:
        raise ValueError(f"unknown probe part kind '{kind}'; kinds: {', '.join(KINDS)}")
    PARTS[kind].register(part.name, part, description=part.description)
    if kind == "encoder" and part.name not in _ENCODER_ORDER:
        _ENCODER_ORDER.append(part.name)
    return part


def split_name(name: str) -> tuple[str, str | None]:
    """``"pretrained:smollm2"`` -> ``("pretrained", "smollm2")``; ``"llama"`` -> ``("llama", None)``."""
    base, sep, arg = str(name).partition(":")
    return base, (arg if sep else None)


def get_part(kind: str, name: str) -> Part:
    """The part ``name`` of ``kind`` (``NAME:ARG`` for a part that takes an argument), or a ConfigError naming the
    registered ones."""
    base, arg = split_name(name)
    if base not in PARTS[kind]:
        raise ConfigError(f"unknown probe {kind} '{name}'; registered: {', '.join(PARTS[kind].names())}")
    part = PARTS[kind].get(base)
    if part.argument and not arg:
        raise ConfigError(f"probe {kind} '{base}' needs an argument: {SELECTED_BY.get(kind, kind)}={base}:"
                          f"{part.argument.split(':')[0]} ({part.argument})")
    if arg is not None and not part.argument:
        raise ConfigError(f"probe {kind} '{base}' takes no argument, got '{name}'")
    return part


def chosen(opts, kind: str) -> list[str]:
    """Names of the parts of ``kind`` that ``opts`` chooses."""
    v = getattr(opts, SELECTED_BY[kind])
    return [] if v is None else list(v) if isinstance(v, (list, tuple)) else [v]


def _chosen_parts(opts, kind: str) -> list[tuple[str, Part]]:
    """(name as chosen, part) of every part of ``kind`` that ``opts`` chooses (the encoder kind: by ``model``)."""
    if kind == "encoder":
        part = encoder_kind(opts.model) if getattr(opts, "model", None) else None
        return [(part.name, part)] if part is not None else []
    return [(n, get_part(kind, n)) for n in chosen(opts, kind)]


def _spelled(kind: str, part: Part) -> str:
    if kind == "encoder":
        return f"a model of the {part.name} encoder kind"
    return f"{SELECTED_BY[kind]}={part.name}" + (f":{part.argument.split(':')[0]}" if part.argument else "")


def check_parts(opts, explicit: set[str] = frozenset()) -> None:
    """Every chosen part is registered; no option in ``explicit`` belongs only to a part that is not chosen, and no
    generic setting in ``explicit`` (:data:`GENERIC`) is one the chosen part of its kind does not honour."""
    for kind in ("encoder", *SELECTED_BY):
        picked = _chosen_parts(opts, kind)
        mine = {o for _, p in picked for o in p.option_names}
        now = ", ".join(p.name for _, p in picked) or "none"
        where = "model" if kind == "encoder" else SELECTED_BY[kind]
        owners: dict[str, list[str]] = {}  # an option set that only parts not chosen have -> those parts
        for name in PARTS[kind].names():
            other = PARTS[kind].get(name)
            for o in set(other.option_names) - mine:
                if o in explicit:
                    owners.setdefault(o, []).append(_spelled(kind, other))
        for o, them in sorted(owners.items()):
            raise ConfigError(f"'{o}' applies to {' or '.join(them)}, not to {where}={now}; drop it or choose "
                              f"{' or '.join(them)}")
        for _, p in picked:
            ignored = [g for g in GENERIC.get(kind, ()) if g in explicit and g not in p.honoured(kind)]
            if ignored:
                says = ", ".join(p.honoured(kind)) or "none of them"
                raise ConfigError(f"'{ignored[0]}' is not read by {where}={p.name} (of the generic {kind} settings "
                                  f"it honours {says}); drop it")
        for n, p in picked:
            if p.check is not None and kind != "encoder":
                p.check(opts, split_name(n)[1], set(explicit))


def unhonoured(opts) -> dict:
    """The generic settings the chosen decoder does not honour, at the value that switches each off
    (:data:`UNHONOURED`): what :func:`memlab.probes.options.validate` sets, so that nothing is fitted for a setting
    its part does not read (a plain decoder beside a bag-head one that has no bag head)."""
    (_, part), = _chosen_parts(opts, "decoder")
    return {k: v for k, v in UNHONOURED.items() if k not in part.honoured("decoder") and getattr(opts, k) != v}


def encoder_kind(spec: str) -> Part | None:
    """The first registered encoder kind (newest registrations first) whose ``matches`` takes ``spec``."""
    PARTS["encoder"].names()  # the plugins' registrations run first
    for name in reversed(_ENCODER_ORDER):
        part = PARTS["encoder"].get(name)
        if part.impl.takes(spec):
            return part
    return None
