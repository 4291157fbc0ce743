"""Names of a package imported from its modules at their first use (PEP 562).

A package's ``__init__`` that imports every module below it makes a process
that needs one of them import them all: ``lamina.derived``'s parser and
kernels for a writer that only asks how many threads to use, ``lamina.perf``'s
command line (argparse) for a file's background model.  Such a package lists
where each name lives, imports those modules only under ``TYPE_CHECKING``
(for mypy and readers), and answers the rest through :func:`getattr_for`::

    _WHERE = {"parse": ".parser", ...}
    __getattr__ = lazy.getattr_for(__name__, _WHERE, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def attribute(package: str, where: Mapping[str, str], name: str, namespace: dict[str, Any]) -> Any:
    """*name* of *package*, imported from the module ``where[name]`` (relative to *package*)
    and kept in the package's *namespace*, so that this runs once a name."""
    module = where.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, package), name)
    namespace[name] = value
    return value


def getattr_for(
    package: str, where: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The module ``__getattr__`` of *package*: :func:`attribute` of its names *where* lists."""

    def __getattr__(name: str) -> Any:
        return attribute(package, where, name, namespace)

    return __getattr__
