"""Names of a package imported from its modules at their first use (PEP 562).

A package's ``__init__`` that imports every module below it makes a process
that needs one of them import them all: ``lamina.derived``'s parser and
kernels for a writer that only asks how many threads to use, ``lamina.perf``'s
command line (argparse) for a file's background model.  Such a package lists
where each name lives, imports those modules only under ``TYPE_CHECKING``
(for mypy and readers), and answers the rest through :func:`attribute`::

    _WHERE = {"parse": ".parser", ...}

    def __getattr__(name: str) -> object:
        return lazy.attribute(__name__, _WHERE, name, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
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
