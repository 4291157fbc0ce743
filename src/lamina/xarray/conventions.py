"""How lamina files and xarray objects map onto each other: the attributes both sides agree on.

Pure (numpy only) so that the reader, the writer and the docs say the same
thing (docs/xarray.md):

- ``dims`` on a dataset: its dimension names, one per axis
  (``["z", "y", "x"]``); without it, ``dim_0``, ``dim_1``, ...
- ``static`` on a dataset: written once (in its first step) and valid for
  every step: read without the ``step`` dimension.
- ``coordinates`` on a group: the names of its datasets that are xarray
  coordinates (besides those named like their only dimension, which always
  are).
- ``time``: a 0-D dataset of that name in a group or any of its parents,
  written in every step, becomes the coordinate ``time(step)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

#: dataset attribute: dimension names
DIMS = "dims"
#: dataset attribute: the same in every step (read without the step dimension)
STATIC = "static"
#: group attribute: the datasets of the group that are coordinates
COORDINATES = "coordinates"
#: the dimension that counts committed steps
STEP = "step"
#: the 0-D dataset whose value per step becomes the ``time`` coordinate
TIME = "time"
#: attributes of the mapping, not handed to xarray as attrs
DATASET_KEYS = frozenset({DIMS, STATIC})
GROUP_KEYS = frozenset({COORDINATES})


def names(value) -> list[str]:
    """An attribute holding names (a string, a list of strings, an array of str) as a list of str."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in np.ravel(np.asarray(value, dtype=object))]


def default_dims(ndim: int) -> list[str]:
    return [f"dim_{i}" for i in range(ndim)]


def dims_of(attrs: Mapping, shape: tuple[int, ...], what: str) -> tuple[list[str], str | None]:
    """Dimension names of a dataset from its ``dims`` attribute; (names, problem or None).

    A ``dims`` attribute that does not give one distinct name per axis is
    ignored (the problem says why) and the defaults are used.
    """
    given = names(attrs.get(DIMS))
    if DIMS not in attrs or not shape and not given:
        return default_dims(len(shape)), None
    if len(given) != len(shape):
        return default_dims(len(shape)), (
            f"{what}: attribute dims = {given} names {len(given)} dimensions, the dataset has "
            f"{len(shape)} (shape {shape}); using dim_0 ..."
        )
    if len(set(given)) != len(given) or STEP in given:
        return default_dims(len(shape)), (
            f"{what}: attribute dims = {given} repeats a name or uses {STEP!r}; using dim_0 ..."
        )
    return given, None


def is_static(attrs: Mapping) -> bool:
    """Whether attribute ``static`` says true: a number or bool not 0, or a string spelling
    true ("true", "yes", "1"; "false" was taken for true, as any string but '' was)."""
    v = attrs.get(STATIC)
    if v is None:
        return False
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes")
    return bool(np.asarray(v).any())


def plain_attrs(attrs: Mapping, reserved: Iterable[str]) -> dict:
    """*attrs* less the mapping's own keys."""
    skip = set(reserved)
    return {k: v for k, v in attrs.items() if k not in skip}
