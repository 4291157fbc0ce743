"""Engines and layers by name, and the one place that builds a file's stack of them.

``lamina.open(path, mode, engine=None, layers=None, transport=None, **options)``
asks :func:`build` for the stack: the engine that moves the bytes, with the
layers over it (innermost first), each given only the options it declares.

Names come from three places:

* the built-in engines, registered by :mod:`lamina.engines` (``native``,
  ``memory``, ``mpi``, ``both``), and the built-in layers, registered by
  :mod:`lamina.layers` (``derived``);
* :func:`register_engine` / :func:`register_layer` calls of a program;
* entry points of installed packages, loaded the first time a name is not
  found: group ``lamina.engines`` names :class:`~lamina.engines.base.Engine`
  subclasses, group ``lamina.layers`` names
  :class:`~lamina.layers.base.Layer` subclasses (as zarr and xarray find
  outside stores and backends).  Their ``OPTIONS`` class attribute says which
  options they take.

Which engine serves a path, unless ``engine=`` names one: the in situ
transport's choice first (``transport=``, else ``$LAMINA_TRANSPORT``; see
:func:`lamina.workflow.routes.engine_for`), else ``$LAMINA_ENGINE``, else
``native``.  So that one program runs unchanged whatever the environment
routes it through, an engine may *ignore* the options of the engines it can
stand in for (the file engines ignore the transport's ``timeout``, say);
an option no registered engine or layer knows is a TypeError.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import ConfigError, suggest
from ..workflow import routes
from .base import Engine, durable_flag

ENGINE_ENV = "LAMINA_ENGINE"
DEFAULT_ENGINE = "native"
#: ``lamina.open(io=...)``, else this variable: synchronous or background I/O
IO_ENV = "LAMINA_IO"
IO_MODES = ("sync", "async", "auto")
#: the layer ``io='async'`` puts at the top of a writer's stack (registered by lamina.layers)
BACKGROUND_LAYER = "background"
#: its options, accepted and ignored under ``io='sync'`` so that one program runs both ways
BACKGROUND_OPTIONS = frozenset({"max_inflight_bytes", "io"})

#: the arguments of ``lamina.open`` that make a path a native file on disk, read and written
#: in the calling thread, whatever ``$LAMINA_ENGINE``, ``$LAMINA_TRANSPORT`` and ``$LAMINA_IO``
#: say (for the programs of a job): the ``lamina`` commands and the conversions open files so
ON_DISK = {"engine": DEFAULT_ENGINE, "transport": "file", "io": "sync"}

ENGINE_GROUP = "lamina.engines"
LAYER_GROUP = "lamina.layers"


def inflight_bytes(value: object) -> int:
    """``max_inflight_bytes`` as given: any integer > 0 (numpy's too, as numpy takes sizes),
    else ConfigError.  Checked under ``io='sync'`` too, where it is ignored: a program runs
    both ways (:data:`IO_ENV`) and fails alike."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy's bool is not
        raise ConfigError(f"max_inflight_bytes must be an int > 0, got {value!r}")
    if int(value) <= 0:
        raise ConfigError(f"max_inflight_bytes must be an int > 0, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine."""

    name: str
    #: ``factory(mode)`` -> a new, unopened engine (an engine may differ by role: producer, consumer)
    factory: Callable[[str], Engine]
    #: the options it takes
    options: frozenset[str]
    #: options it accepts and ignores: those of the engines a program may be routed to instead
    ignores: frozenset[str] = frozenset()
    description: str = ""


@dataclass(frozen=True)
class LayerEntry:
    """A registered layer."""

    name: str
    #: ``factory(inner)`` -> the layer over the engine (or layer) *inner*
    factory: Callable[[Engine], Engine]
    options: frozenset[str]
    #: part of every stack unless ``layers=`` says otherwise
    default: bool = False
    description: str = ""


_ENGINES: dict[str, EngineEntry] = {}
_LAYERS: dict[str, LayerEntry] = {}
_LOADED: set[str] = set()  # entry point groups already loaded


def register_engine(
    name: str,
    factory: Callable[[str], Engine],
    options: Iterable[str] = (),
    ignores: Iterable[str] = (),
    description: str = "",
    replace: bool = False,
) -> EngineEntry:
    """Make an engine available to ``lamina.open(engine=name)``; ValueError if *name* is taken (unless *replace*)."""
    _check_name(name, _ENGINES, "engine", replace)
    entry = EngineEntry(name, factory, frozenset(options), frozenset(ignores), description)
    _ENGINES[name] = entry
    return entry


def register_layer(
    name: str,
    factory: Callable[[Engine], Engine],
    options: Iterable[str] = (),
    default: bool = False,
    description: str = "",
    replace: bool = False,
) -> LayerEntry:
    """Make a layer available to ``lamina.open(layers=[..., name])``; *default* layers wrap every stack."""
    _check_name(name, _LAYERS, "layer", replace)
    entry = LayerEntry(name, factory, frozenset(options), bool(default), description)
    _LAYERS[name] = entry
    return entry


def _check_name(name: str, table: dict, kind: str, replace: bool) -> None:
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(
            f"a {kind} name is a non-empty string without surrounding blanks, got {name!r}"
        )
    if name in table and not replace:
        raise ValueError(f"{kind} {name!r} is already registered")


def _entry_points(group: str) -> list:
    """The entry points of *group* in the installed packages.

    importlib.metadata takes 20 ms to import: it is imported only when a
    name is not built in (or every name is listed).
    """
    from importlib.metadata import entry_points

    return list(entry_points(group=group))


def _load_entry_points(group: str) -> None:
    """Register the engines (or layers) that installed packages declare, once per process."""
    if group in _LOADED:
        return
    _LOADED.add(group)
    for ep in _entry_points(group):
        table = _ENGINES if group == ENGINE_GROUP else _LAYERS
        if ep.name in table:
            continue  # built-in or registered by the program: those win
        try:
            obj = ep.load()
        except Exception as e:  # a broken plug-in must not break lamina
            warnings.warn(
                f"cannot load {group} entry point {ep.name!r} ({ep.value}): {e}", stacklevel=3
            )
            continue
        opts = getattr(obj, "OPTIONS", ())
        is_engine = isinstance(obj, type) and issubclass(obj, Engine)
        if group == ENGINE_GROUP and is_engine and not obj.is_layer:
            register_engine(ep.name, _instantiate(obj), opts, description=f"from {ep.value}")
        elif group == LAYER_GROUP and is_engine and obj.is_layer:
            register_layer(ep.name, obj, opts, description=f"from {ep.value}")
        else:
            kind = "Engine" if group == ENGINE_GROUP else "Layer"
            warnings.warn(
                f"{group} entry point {ep.name!r} ({ep.value}) is not a lamina {kind} subclass",
                stacklevel=3,
            )


def _instantiate(cls: type[Engine]) -> Callable[[str], Engine]:
    """An engine factory for an engine class from an entry point (the same engine for every mode)."""

    def factory(mode: str) -> Engine:
        return cls()

    return factory


def engine_entry(name: str) -> EngineEntry:
    """The engine registered as *name*; ValueError naming the engines there are (and close ones)."""
    if name not in _ENGINES:
        _load_entry_points(ENGINE_GROUP)
    try:
        return _ENGINES[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown engine {name!r}; available: {sorted(_ENGINES)}.{suggest(str(name), _ENGINES)}"
        ) from None


def layer_entry(name: str) -> LayerEntry:
    """The layer registered as *name*; ValueError naming the layers there are (and close ones)."""
    if name not in _LAYERS:
        _load_entry_points(LAYER_GROUP)
    try:
        return _LAYERS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown layer {name!r}; available: {sorted(_LAYERS)}.{suggest(str(name), _LAYERS)}"
        ) from None


def engine_names() -> list[str]:
    """Every engine name: built-in, registered, and from installed packages."""
    _load_entry_points(ENGINE_GROUP)
    return sorted(_ENGINES)


def layer_names() -> list[str]:
    """Every layer name: built-in, registered, and from installed packages."""
    _load_entry_points(LAYER_GROUP)
    return sorted(_LAYERS)


def default_layers() -> list[str]:
    """The layers every stack gets unless ``layers=`` says otherwise, innermost first."""
    return [n for n, e in _LAYERS.items() if e.default]


def choose_engine(
    path: str, mode: str, engine: str | None = None, transport: str | None = None
) -> str:
    """The engine name for *path*: *engine*, else the transport's choice, else ``$LAMINA_ENGINE``, else native.

    ValueError for a transport that does not exist (argument or environment).
    """
    return engine_choice(path, mode, engine, transport)[0]


def engine_choice(
    path: str, mode: str, engine: str | None = None, transport: str | None = None
) -> tuple[str, str]:
    """:func:`choose_engine`'s name and, in words, what chose it (``"$LAMINA_ENGINE"``,
    ``"transport 'memory' from $LAMINA_TRANSPORT"``, ...): ``lamina.open`` names both
    where ranks chose different engines."""
    if transport is not None:  # checked where an engine is named too
        routes.transport_choice(transport)
    if engine == "":  # (io='' is refused too: an empty argument is no default)
        raise ConfigError(
            f"engine='' names no engine; give a name (one of {sorted(_ENGINES)}) or None for "
            "the default"
        )
    if engine:
        return engine, "engine="
    routed = routes.engine_for(path, mode, transport)
    if routed:
        where = "transport=" if transport else f"${routes.TRANSPORT_ENV}"
        return routed, f"transport {routes.transport_choice(transport)!r} from {where}"
    env = os.environ.get(ENGINE_ENV)
    if env and env not in _ENGINES:
        _load_entry_points(ENGINE_GROUP)
        if env not in _ENGINES:
            raise ConfigError(
                f"${ENGINE_ENV}={env!r} names no engine; available: {sorted(_ENGINES)}.{suggest(env, _ENGINES)}"
            )
    return (env, f"${ENGINE_ENV}") if env else (DEFAULT_ENGINE, "the default")


def resolve_io(io: str | None = None) -> str:
    """The I/O mode: *io* (the argument) wins over ``$LAMINA_IO``; default ``'sync'``.

    ConfigError (a ValueError) for any other value, naming the allowed ones.
    ``'auto'``: the background layer, whose model picks sync or async per step.
    """
    for value, where in ((io, "io"), (os.environ.get(IO_ENV), f"${IO_ENV}")):
        if value is None or (value == "" and where != "io"):  # an empty variable is unset
            continue
        if value not in IO_MODES:
            raise ConfigError(f"{where}={value!r} is not an I/O mode; allowed: {list(IO_MODES)}")
        return value
    return "sync"


def layers_of(top: Engine) -> list[str]:
    """The names of the layers in *top*'s stack, innermost first, but for the background
    layer (the I/O mode's): their registered names (a class's name for one not registered)."""
    names = {e.factory: e.name for e in _LAYERS.values()}
    bg = _LAYERS.get(BACKGROUND_LAYER)
    return [
        names.get(type(e), type(e).__name__)
        for e in reversed(top.stack())
        if e.is_layer and (bg is None or type(e) is not bg.factory)
    ]


def split_options(entry: EngineEntry, layers: list[LayerEntry], options: dict) -> dict:
    """The options *entry* and *layers* take, without those the engine ignores; TypeError for unknown ones.

    An option is unknown when neither the engine nor a layer of the stack
    takes or ignores it.
    """
    taken = set(entry.options).union(*(e.options for e in layers))
    unknown = set(options) - taken - entry.ignores
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)} for engine {entry.name!r}"
            + (f" with layers {[e.name for e in layers]}" if layers else "")
            + f"; accepted: {sorted(taken)}"
        )
    return {k: v for k, v in options.items() if k in taken}


def build(
    path: str,
    mode: str,
    engine: str | Engine | None = None,
    layers: Iterable[str] | None = None,
    transport: str | None = None,
    options: dict | None = None,
    io: str | None = None,
) -> tuple[Engine, dict]:
    """The stack of engines for ``lamina.open`` and the options to open it with: ``(top, options)``.

    Independent (no messages): every rank builds its own stack alike.
    *engine* is a name or an engine object; an object that already is a
    :class:`~lamina.layers.base.Layer` is taken as the whole stack, any other
    gets the layers.  *layers*: names, innermost first (default:
    :func:`default_layers`).  *io* (:func:`resolve_io`): ``'async'`` puts
    the background layer at the top of the stack (writers commit steps on
    its thread, readers may read ahead); under ``'sync'`` its options are
    ignored.
    Calling ``top.open(path, mode, comm, options)``
    then opens every level, each layer taking its own options and passing
    the rest inward.
    """
    options = dict(options or {})
    if mode not in ("r", "w", "a"):
        raise ValueError(f"mode must be 'r', 'w' or 'a', got {mode!r}")
    names = default_layers() if layers is None else list(layers)
    how = resolve_io(io)
    if how in ("async", "auto") and BACKGROUND_LAYER not in names:
        names.append(BACKGROUND_LAYER)  # outermost: the whole stack below runs on its thread
    if how in ("async", "auto"):
        options["io"] = how  # the layer's own option: async, or the model's choice per step
    elif how == "sync" and io is not None and BACKGROUND_LAYER in names:
        raise ConfigError(
            f"io='sync' contradicts layers={names}: the {BACKGROUND_LAYER!r} layer is async I/O"
        )
    if BACKGROUND_LAYER not in names:
        if "max_inflight_bytes" in options:
            inflight_bytes(options["max_inflight_bytes"])
        for k in BACKGROUND_OPTIONS:
            options.pop(k, None)
    if isinstance(engine, Engine):
        if engine.is_layer:
            bg = layer_entry(BACKGROUND_LAYER)
            if BACKGROUND_LAYER in names and not any(type(e) is bg.factory for e in engine.stack()):
                return bg.factory(engine), options
            return engine, options
        top: Engine = engine
        for name in names:
            top = layer_entry(name).factory(top)
        return top, options
    if engine is not None and not isinstance(engine, str):
        raise TypeError(f"engine must be a name or an Engine, got {type(engine).__name__}")
    entry = engine_entry(choose_engine(path, mode, engine, transport))
    lays = [layer_entry(n) for n in names]
    given, options = options, split_options(entry, lays, options)
    if "durable" in given:  # known here: checked where the engine ignores it too (mpi)
        durable_flag(given["durable"], "lamina.open()")
    top = entry.factory(mode)
    taken = set(
        top.OPTIONS
    )  # what this role of the engine takes; the other roles' options are dropped
    for lay in lays:
        top = lay.factory(top)
        taken |= top.OPTIONS
    return top, {k: v for k, v in options.items() if k in taken}


__all__ = [
    "BACKGROUND_LAYER",
    "ON_DISK",
    "DEFAULT_ENGINE",
    "ENGINE_ENV",
    "IO_ENV",
    "IO_MODES",
    "EngineEntry",
    "LayerEntry",
    "build",
    "choose_engine",
    "default_layers",
    "engine_choice",
    "engine_entry",
    "engine_names",
    "layer_entry",
    "layer_names",
    "layers_of",
    "register_engine",
    "register_layer",
    "resolve_io",
    "split_options",
]
