"""The probe's options: :class:`ProbeOptions` (made of the sections and part options of :mod:`memlab.probes.
sections`), their checks, and how YAML, ``key=value`` overrides and CLI flags are read (:func:`load_options`, the
one place all three resolve).

An option of a part that is not chosen (``prefix_len`` without ``conditioning=prefix``, ``hidden_size`` with
``decoder=pretrained:NAME``, ``lora_r`` without it) is refused by name (:func:`memlab.probes.parts.check_parts`),
as are ``plain_input_dropout`` with ``select_decoder=false`` and ``layers_sequence`` without ``layers``.
:func:`validate` runs once and returns a new, resolved object (:class:`ResolvedOptions`: the device resolved, the
options the user set, and with ``compare`` every method's resolved options); its input is not changed. A
``recipe: probe`` experiment file holds its probe in ``options:`` (flat names, or the sections as mappings); its
``name`` names the run; any other section is refused by name. The options' own checks (ranges, lengths, sizes) are
:mod:`memlab.probes.checks`; :func:`precheck` runs those that need no registry of parts before torch is imported.
"""

from __future__ import annotations

import ast
import copy
import functools
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from memlab import registry
from memlab.config import apply_overrides, field_docs, from_dict, read_yaml
from memlab.errors import ConfigError
from memlab.probes.checks import (  # noqa: F401  (the checks, also importable from here)
    CACHE_DTYPES, CHUNK_BY, EXPERIMENTS, check_lengths, check_range, check_together, check_model_spec, comma_items,
    experiment, parse_lengths, parse_sizes, seq_lens, train_sizes)
from memlab.probes.parts import PARTS, SELECTED_BY, check_parts, chosen, get_part, split_name, unhonoured
from memlab.probes.sections import (PART_OPTIONS, SECTIONS, AlignOptions, BowOptions, DecoderSection,
                                    EncoderSection, FitSection, LlamaOptions, PrefixOptions, PretrainedOptions,
                                    ReadoutSection, RunSection, TeacherOptions, TextSection)

EXPERIMENT_KEYS = ("name", "recipe", "options")
"""The sections a ``recipe: probe`` experiment file may hold."""


@dataclass
class ProbeOptions(RunSection, ReadoutSection, DecoderSection, FitSection, TextSection, EncoderSection, AlignOptions,
                   BowOptions, PretrainedOptions, LlamaOptions, TeacherOptions, PrefixOptions):
    """One probe run (YAML: configs/probes/*.yaml; ``key=value``; the CLI flags of ``memlab probe``): the sections
    and the built-in parts' options of :mod:`memlab.probes.sections`, under their flat names, plus the options of
    parts registered from outside the tree (``part_options``, read as attributes too)."""

    part_options: dict = field(default_factory=dict)
    """Options of parts registered outside memlab (name -> value), each typed by its part's options class."""

    def __getattr__(self, name: str):  # only called for names that are not fields: a plugin part's option
        if name.startswith("__") or name == "part_options":
            raise AttributeError(name)
        mine = self.__dict__.get("part_options") or {}
        if name in mine:
            return mine[name]
        cls = option_class(name)
        if cls is None:
            raise AttributeError(f"'ProbeOptions' has no option '{name}'")
        return getattr(cls(), name)

    def section(self, name: str):
        """The section ``name`` of :data:`memlab.probes.sections.SECTIONS` as its own dataclass (a copy)."""
        cls = SECTIONS[name]
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})


def option_class(name: str) -> type | None:
    """The options class of the registered part (of any kind) that declares option ``name`` (None: none does)."""
    for kind in PARTS:
        for n in PARTS[kind].names():
            cls = PARTS[kind].get(n).options
            if cls is not None and name in {f.name for f in fields(cls)}:
                return cls
    return None


@dataclass
class ResolvedOptions(ProbeOptions):
    """ProbeOptions that :func:`validate` checked, with the device resolved (``auto`` -> the best one present), and
    what the check found (:data:`RESOLVED`: not options, left out of :func:`option_values`)."""

    checked_from: ClassVar[type] = ProbeOptions
    """The class of options not yet checked (what options derived from these are built as)."""
    explicit: frozenset = field(default=frozenset(), repr=False, compare=False)
    """The options the user set: a ``seq_len`` set is refused when the encoder cannot read its chunks whole, the
    default one keeps the words that fit (:func:`memlab.probes.chunks.cut.probe_data`)."""
    methods: tuple = field(default=(), repr=False, compare=False)
    """With ``compare``: (method, its resolved options) of every compared method (:func:`compared`), checked once."""


RESOLVED = ("explicit", "methods")
"""What :class:`ResolvedOptions` holds besides the options."""


def option_values(opts: ProbeOptions) -> dict:
    """The options of ``opts`` by name (what the report and a control run's key read), without :data:`RESOLVED`."""
    return {k: v for k, v in vars(opts).items() if k not in RESOLVED}


def compared(opts: ProbeOptions, explicit: set[str] = frozenset()) -> list[tuple]:
    """(method, its options) of every method of ``opts.compare`` (:mod:`memlab.probes.sweeps.compare`), each checked as a
    probe of that method alone would be (one ConfigError naming the method)."""
    from memlab.probes.sweeps.compare import methods  # start-up: plots and torch, only when a comparison is asked for

    out = []
    for m, mine, given in methods(opts, explicit):
        try:
            out.append((m, validate(mine, given)))
        except ConfigError as e:
            raise ConfigError(f"'compare': method {m.spec!r}: {e}") from None
    return out


def validate(opts: ProbeOptions, explicit: set[str] = frozenset()) -> ResolvedOptions:
    """Check every option (one ConfigError naming it) and return the resolved options (a new object: the device
    resolved, ``auto`` -> the best one present, a missing one refused; with ``compare``, every method's resolved
    options); ``opts`` is not changed. ``explicit``: the options the user set (their parts must be chosen)."""
    from memlab.devices import resolve_device  # start-up: torch, imported when options are checked
    from memlab.probes.encoders import placement  # start-up: accelerate and transformers, likewise
    from memlab.probes.sweeps.compare import owners  # start-up: the comparison's plots and torch, likewise

    if opts.pool is not None:
        get_part("pool", opts.pool)
    check_lengths(opts)
    given, methods = frozenset(explicit), ()
    if opts.compare is not None:  # each method checked as a probe of it alone; their part options are theirs
        if opts.layers is not None:
            raise ConfigError("'compare' and 'layers' are separate sweeps; run them one at a time")
        methods = tuple(compared(opts, explicit))
        explicit = {k for k in explicit if not owners(k)}
    check_parts(opts, explicit)
    off = unhonoured(opts)  # the generic settings the chosen decoder does not read, switched off (never explicit)
    if any(v is not None for v in (opts.device_map, opts.max_memory, opts.offload_dir)):  # unset: chosen at load
        placement.check(placement.Placement(opts.device_map, opts.max_memory, opts.offload_dir), opts.model)
    check_range(opts)
    check_together(opts, set(explicit))
    values = {f.name: copy.deepcopy(getattr(opts, f.name)) for f in fields(opts) if f.name not in RESOLVED}
    lens = seq_lens(opts)  # a length sweep's lengths sorted; a list of one is that length
    values["seq_len"] = lens if len(lens) > 1 else lens[0]
    values.update(off)
    return ResolvedOptions(**{**values, "device": str(resolve_device(opts.device))}, explicit=given, methods=methods)


def resolved(opts: ProbeOptions) -> ResolvedOptions:
    """``opts`` when :func:`validate` already resolved it, else :func:`validate` of it."""
    return opts if isinstance(opts, ResolvedOptions) else validate(opts)


SECTION_PARTS = {"encoder": ("encoder", "pool"), "decoder": ("decoder", "conditioning", "inputs", "scorer"),
                 "readouts": ("readout",)}
"""The kinds of part whose own options each section holds, besides its own fields."""
SECTION_NAMES = {"decoder": {"kind": "decoder"}}
"""Other spellings of a section's fields: ``decoder: {kind: gru, ...}`` names the decoder part."""


def home(name: str) -> str | None:
    """Where option ``name`` belongs, as a user would write it (``the fit section``, ``decoder=llama``), or None."""
    for sec, cls in SECTIONS.items():
        if name in {f.name for f in fields(cls)}:
            return f"the {sec} section"
    owners = [(kind, n) for kind in PARTS for n in PARTS[kind].names() if name in PARTS[kind].get(n).option_names]
    if not owners:
        return None
    sec = next(s for s, kinds in SECTION_PARTS.items() if owners[0][0] in kinds)
    them = " or ".join(f"{'the model' if kind == 'encoder' else SELECTED_BY[kind]}={n}" for kind, n in owners)
    return f"{them} (in the {sec} section)"


def _part_option_names(kinds, light: bool) -> set[str]:
    """The options of the parts of ``kinds``: the registered ones (``light``: only the built-in parts', read from
    :data:`memlab.probes.sections.PART_OPTIONS` without loading the registries)."""
    if light:
        return {f.name for (kind, _), cls in PART_OPTIONS.items() if kind in kinds for f in fields(cls)}
    return {o for kind in kinds for n in PARTS[kind].names() for o in PARTS[kind].get(n).option_names}


def _flatten(data: dict, where: str, light: bool = False) -> dict:
    """Sections given as mappings (``fit: {epochs: 3}``, ``decoder: {kind: gru, hidden: 64}``) -> their flat names;
    a flat name stays as it is. A key that its section does not hold (its own fields and the options of the parts
    it chooses) is refused with where it belongs (``light``: left out, for the registries to judge later)."""
    out: dict = {}
    for k, v in data.items():
        if k in SECTIONS and isinstance(v, dict):
            own = {f.name for f in fields(SECTIONS[k])} | set(SECTION_NAMES.get(k, {}))
            parts = _part_option_names(SECTION_PARTS.get(k, ()), light)
            for kk, vv in v.items():
                if kk not in own | parts and light:  # left to the registries (a plugin part's option?)
                    continue
                if kk not in own | parts:
                    there = home(kk)
                    raise ConfigError(f"{where}: '{k}.{kk}' is not an option of the {k} section; "
                                      + (f"it belongs to {there}" if there else
                                         f"it holds {', '.join(sorted(own))} and its parts' options"))
                out[SECTION_NAMES.get(k, {}).get(kk, kk)] = vv
        else:
            out[k] = v
    return out


def _typed(data: dict, prefix: str) -> ProbeOptions:
    """ProbeOptions of flat ``data``: its fields typed by :func:`memlab.config.from_dict`, a plugin part's option
    by that part's options class; an unknown name is refused with the valid ones."""
    names = {f.name for f in fields(ProbeOptions)} - {"part_options"}
    flat, extra = {}, {}
    for k, v in data.items():
        if k in names:
            flat[k] = v
        elif (cls := option_class(k)) is not None:
            extra[k] = getattr(from_dict(cls, {k: v}, prefix=prefix), k)
        else:
            plugin = sorted({f.name for kind in PARTS for n in PARTS[kind].names()
                             if (c := PARTS[kind].get(n).options) is not None for f in fields(c)} - names)
            raise ConfigError(f"unknown config key '{prefix}{k}'; valid keys: {', '.join(sorted(names))}"
                              + (f", and the parts' {', '.join(plugin)}" if plugin else ""))
    opts = from_dict(ProbeOptions, flat, prefix=prefix)
    opts.part_options = extra
    return opts


def _read_experiment(p: Path, data: dict, overrides: list[str], light: bool = False) -> tuple[dict, list[str]]:
    """An experiment file (recipe: probe): its options section (with its ``name``), with overrides (``options.``
    optional)."""
    extra = [k for k in data if k not in EXPERIMENT_KEYS]
    if extra:
        raise ConfigError(f"{p}: section{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} "
                          f"{'are' if len(extra) > 1 else 'is'} not used by recipe: probe (it reads "
                          f"{', '.join(EXPERIMENT_KEYS)}; data and training options go in options:)")
    if data.get("recipe") != "probe":
        raise ConfigError(f"{p}: recipe '{data.get('recipe')}' is not a probe (recipe: probe)")
    opts = data.get("options") or {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{p}: 'options' must be a mapping")
    opts = _flatten(opts, str(p), light)
    if data.get("name") is not None:
        opts.setdefault("name", data["name"])
    over = [o.split("=", 1)[0].removeprefix("options.") + "=" + o.split("=", 1)[1] if "=" in o else o
            for o in overrides]
    return opts, over


def _read(path, overrides, kw: dict, light: bool = False) -> tuple[dict, str]:
    """The flat option values of a YAML file (strict keys), ``key=value`` overrides, then keyword values (None:
    unset), and the prefix their keys are named with in errors."""
    data: dict = {}
    overrides, prefix = list(overrides or []), ""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"probe config not found: {p}")
        data = read_yaml(p) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: a probe config must be a YAML mapping")
        if "recipe" in data:
            (data, overrides), prefix = _read_experiment(p, data, overrides, light), "options."
        else:
            data = _flatten(data, str(p), light)
    apply_overrides(data, overrides)
    data = _flatten({**data, **{k: v for k, v in kw.items() if v is not None}}, "overrides", light)
    if "seq_len" in data:  # "8,16,32" (key=value, --seq-len): a length sweep
        data["seq_len"] = parse_lengths(data["seq_len"])
    return data, prefix


def load_options(path: str | Path | None = None, overrides: list[str] | None = None, **kw) -> ResolvedOptions:
    """The one place a probe's options are read: a YAML file (strict keys), ``key=value`` overrides, then keyword
    values (the CLI flags; None: unset); checked once (:func:`validate`)."""
    data, prefix = _read(path, overrides, kw)
    return validate(_typed(data, prefix), explicit={k for k in data if k not in ("model", "name")})


def precheck(path: str | Path | None = None, overrides: list[str] | None = None, **kw) -> ProbeOptions:
    """What :func:`load_options` refuses without the registries of parts, read as it reads them and importing
    nothing heavy (neither torch nor a plugin): the options' types and ranges, the chunk lengths and sizes. The
    options of parts are left to :func:`load_options`; so is what it alone can judge (a part's name, options that
    go together). Returns the options read (the built-in fields only)."""
    data, prefix = _read(path, overrides, kw, light=True)
    names = {f.name for f in fields(ProbeOptions)} - {"part_options"}
    opts = from_dict(ProbeOptions, {k: v for k, v in data.items() if k in names}, prefix=prefix)
    if parts_complete():  # every part there will be is registered: unknown names are refused now too
        check_known(data, opts, prefix)
    check_lengths(opts)
    check_range(opts, parts=False)
    return opts


def parts_complete() -> bool:
    """Whether the parts registered so far are all the parts there will be, told without loading the plugins: they
    were loaded, or no installed package names a ``memlab.plugins`` entry point (memlab's own parts are registered
    by :mod:`memlab.probes.catalog` when the package is imported; a test checks that loading the plugin packages
    adds none)."""
    return registry._plugins_loaded or not list(registry.entry_points(group=registry.ENTRY_POINT_GROUP))


def _registered(kind: str) -> dict:
    """The parts of ``kind`` registered so far (the registry's own listing would load the plugins first)."""
    return PARTS[kind]._items


def check_known(data: dict, opts: ProbeOptions, prefix: str = "") -> None:
    """An option name no registered part has, or a part name not registered, refused in the words of
    :func:`load_options` (:func:`_typed`, :func:`memlab.probes.parts.get_part`), from the parts registered so far;
    only when those are all there will be (:func:`parts_complete`)."""
    names = {f.name for f in fields(ProbeOptions)} - {"part_options"}
    theirs = {f.name for kind in PARTS for part in _registered(kind).values()
              if (c := part.options) is not None for f in fields(c)}
    for k in data:
        if k not in names | theirs:
            plugin = sorted(theirs - names)
            raise ConfigError(f"unknown config key '{prefix}{k}'; valid keys: {', '.join(sorted(names))}"
                              + (f", and the parts' {', '.join(plugin)}" if plugin else ""))
    for kind in SELECTED_BY:
        for name in chosen(opts, kind):
            if split_name(name)[0] not in _registered(kind):
                raise ConfigError(f"unknown probe {kind} '{name}'; registered: {', '.join(sorted(_registered(kind)))}")


@functools.lru_cache(maxsize=None)
def _module_docs(module: str) -> dict[str, dict[str, str]]:
    """Class name -> field -> docstring of every top-level class of ``module``, its source parsed once."""
    try:
        tree = ast.parse(Path(sys.modules[module].__file__).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, KeyError, AttributeError, TypeError):
        return {}
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body, got = node.body, {}
            for a, b in zip(body, body[1:]):
                if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                        and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                    got[a.target.id] = " ".join(b.value.value.split())
            out[node.name] = got
    return out


def class_docs(cls: type) -> dict[str, str]:
    """Field -> docstring of the dataclass ``cls`` itself (its module's source parsed once for all its classes)."""
    if "__dataclass_fields__" not in vars(cls):
        return {}
    found = _module_docs(cls.__module__).get(cls.__qualname__)
    return found if found is not None else field_docs(cls)


def docs(cls: type) -> dict[str, str]:
    """Field -> docstring of an options class and of every options class it is made of (each class's source read
    once: ``memlab probe --help`` and its refusals answer in well under a second)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        out.update(class_docs(base))
    return out
