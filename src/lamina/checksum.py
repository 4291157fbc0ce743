"""CRC-32C of small buffers: the ``crc32c`` package's C function, loaded without its ``__init__``.

``crc32c``'s ``__init__`` reads the package's own version through
``importlib.metadata``, which imports ``email``, ``zipfile``, ``socket`` and more:
40-50 ms of the start of every process that imports lamina, where a job of a
thousand ranks starts a thousand of them (and lamina's test suite a few
thousand).  The C extension module ``crc32c._crc32c`` holds the whole
function; it is loaded here from the package's directory by Python's own
extension loader (0.7 ms), and the package is imported the usual way wherever
that does not work (another layout in a later release): the function, and so
every checksum, is the same either way.  Large buffers are checksummed by
awscrt (:func:`lamina.stats.crc`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections.abc import Callable
from typing import Any

__all__ = ["crc32c"]


def _load() -> Callable[..., int]:
    try:
        spec = importlib.util.find_spec("crc32c")  # finds the package without running it
        for directory in (spec and spec.submodule_search_locations) or ():
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(directory, "_crc32c" + suffix)
                if not os.path.isfile(path):
                    continue
                loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
                found = importlib.util.spec_from_file_location(
                    "crc32c._crc32c", path, loader=loader
                )
                if found is None:
                    continue
                module: Any = importlib.util.module_from_spec(found)
                loader.exec_module(module)
                fn = module.crc32c
                if fn(b"123456789") == 0xE3069283:  # the CRC-32C check value
                    return fn
    except Exception:  # noqa: S110 - any failure: the package's own import below
        pass
    from crc32c import crc32c as fn

    return fn


#: ``crc32c(data, value=0)``: the CRC-32C of a bytes-like object, continuing from *value*
crc32c: Callable[..., int] = _load()
