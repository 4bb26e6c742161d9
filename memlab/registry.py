"""Name -> object registries (model families, spaces, objectives, curricula,
corpora, recipes, tasks, generators, evaluation adapters).

memlab core never imports a model family by name: families register
themselves when their package is imported, and :func:`load_plugins` imports
the three plugin packages (``memlab.models``, ``memlab.probes``,
``memlab.curricula``) the first time a registry is asked for a name, then every
module that an installed distribution names in the ``memlab.plugins`` entry-point
group (a family in a package of its own declares it in its ``pyproject.toml``)::

    [project.entry-points."memlab.plugins"]
    my_family = "my_package.my_family"
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Generic, Iterator, TypeVar

from memlab.errors import ConfigError, MemlabError

T = TypeVar("T")

PLUGIN_PACKAGES = ("memlab.models", "memlab.probes", "memlab.curricula")
ENTRY_POINT_GROUP = "memlab.plugins"
_plugins_loaded = False


def load_plugins() -> None:
    """Import the plugin packages and the entry-point plugins once, so that their registrations run."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for name in PLUGIN_PACKAGES:
        importlib.import_module(name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # a broken third-party plugin: one clear line, not a traceback
            raise MemlabError(f"plugin '{ep.name}' ({ep.value}) failed to load: {e.__class__.__name__}: {e}") from None


class Registry(Generic[T]):
    """A named collection of objects of one kind, with a one-line description each."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._docs: dict[str, str] = {}

    def register(self, name: str, obj: T | None = None, *, description: str = "") -> Any:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator."""

        def _add(o: T) -> T:
            if name in self._items and self._items[name] is not o:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._items[name] = o
            doc = description or (getattr(o, "__doc__", None) or "").strip().split("\n")[0]
            self._docs[name] = doc
            return o

        return _add(obj) if obj is not None else _add

    def get(self, name: str) -> T:
        load_plugins()
        if name not in self._items:
            valid = ", ".join(sorted(self._items)) or "(none)"
            raise MemlabError(f"unknown {self.kind} '{name}'; known: {valid}")
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        load_plugins()
        return name in self._items

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._items)

    def describe(self) -> Iterator[tuple[str, str]]:
        for n in self.names():
            yield n, self._docs.get(n, "")


@dataclass
class ModelFamily:
    """A transformers-style model family: a config class, a model class and
    named presets (every family has ``toy``)."""

    name: str
    config_class: type
    model_class: type
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    description: str = ""
    example_inputs: Callable[[Any, int], dict] | None = None
    """``example_inputs(config, batch_size)`` -> keyword arguments for which ``model(**kwargs).loss``
    is a training loss; the registry-wide tests use it (shapes, one-batch loss drop, save/load)."""

    def __post_init__(self) -> None:
        if "toy" not in self.presets:
            raise ValueError(f"model family '{self.name}' must define a 'toy' preset")
        self.__doc__ = self.description

    def make_config(self, preset: str = "toy", **overrides: Any):
        """Build a config from a preset plus overrides; unknown keys are an error."""
        if preset not in self.presets:
            raise MemlabError(
                f"model family '{self.name}' has no preset '{preset}'; presets: {', '.join(sorted(self.presets))}"
            )
        valid = set(self.config_class().to_dict())
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise MemlabError(
                f"unknown key 'model.{unknown[0]}' for family '{self.name}'; valid keys: {', '.join(sorted(valid))}"
            )
        try:
            return self.config_class(**{**self.presets[preset], **overrides})
        except Exception as e:  # TypeError/ValueError, or huggingface_hub's strict-dataclass validation errors
            detail = " ".join(str(e).split())[:300]
            raise MemlabError(f"model config of family '{self.name}' rejects these values: {detail}") from None

    def make_model(self, preset: str = "toy", **overrides: Any):
        return self.model_class(self.make_config(preset, **overrides))


FAMILIES: Registry[ModelFamily] = Registry("model family")
SPACES: Registry[Callable[..., Any]] = Registry("embedding space")
OBJECTIVES: Registry[Any] = Registry("objective")
CURRICULA: Registry[Any] = Registry("curriculum")
CORPORA: Registry[Callable[..., Any]] = Registry("corpus")
RECIPES: Registry[Any] = Registry("recipe")
"""Trainable recipes (``memlab train``): name -> object with ``setup(cfg, run_dir)`` and ``options_class``."""
VERB_RECIPES: Registry[Any] = Registry("recipe run by another verb")
"""Experiment-config recipes that another verb runs, not ``memlab train`` (``recipe: probe`` ->
``memlab probe --config``): name -> :class:`VerbRecipe`."""
TASKS: Registry[Any] = Registry("evaluation task")
"""Filled by the application layer when ``memlab.app.eval`` is imported (not a plugin package)."""
GENERATORS: Registry[Callable[..., Any]] = Registry("generator")
"""Family name -> ``gen(model_dir, prompts, opts: memlab.generation.GenerationOptions) -> texts``."""
EVAL_ADAPTERS: Registry[Callable[..., Any]] = Registry("evaluation adapter")
"""Family name -> ``factory(model_dir) -> memlab.adapters.ModelAdapter`` (what ``memlab eval`` runs)."""

ALL = {
    "families": FAMILIES,
    "spaces": SPACES,
    "objectives": OBJECTIVES,
    "curricula": CURRICULA,
    "corpora": CORPORA,
    "recipes": RECIPES,
    "verb_recipes": VERB_RECIPES,
    "tasks": TASKS,
    "generators": GENERATORS,
    "eval_adapters": EVAL_ADAPTERS,
}


def register_family(family: ModelFamily) -> ModelFamily:
    """Register a model family (and its config/model with the transformers Auto classes)."""
    from transformers import AutoConfig, AutoModel
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    FAMILIES.register(family.name, family, description=family.description)
    model_type = getattr(family.config_class, "model_type", "")
    if model_type and model_type not in CONFIG_MAPPING:  # built-in transformers types are known already
        AutoConfig.register(model_type, family.config_class)
        AutoModel.register(family.config_class, family.model_class)
    return family


@dataclass
class VerbRecipe:
    """A recipe whose experiment configs another verb runs: its options are validated like a trainable
    recipe's, but ``memlab train`` refuses it."""

    name: str
    options_class: type
    verb: str
    """The ``memlab`` verb that runs these configs with ``--config``."""
    description: str = ""

    def __post_init__(self) -> None:
        self.__doc__ = self.description


def config_recipe(name: str) -> Any:
    """The recipe an experiment config names: a trainable one or a :class:`VerbRecipe`."""
    load_plugins()
    return VERB_RECIPES.get(name) if name in VERB_RECIPES else RECIPES.get(name)


def trainable_recipe(name: str) -> Any:
    """The trainable recipe ``name``; a clear error for one that another verb runs."""
    if name in VERB_RECIPES:
        verb = VERB_RECIPES.get(name).verb
        raise ConfigError(f"recipe '{name}' configs run with `memlab {verb} --config PATH`, not with `memlab train`")
    return RECIPES.get(name)
