"""lamina files in xarray: the ``lamina`` backend and :func:`to_lamina`.

::

    import xarray as xr
    ds = xr.open_dataset("run.lam", group="fields", chunks={})   # lazy, dask chunks = blocks
    tree = xr.open_datatree("run.lam")                            # groups become nodes
    lamina.xarray.to_lamina(ds, "copy.lam")                       # or ds.lamina.to_lamina(...)

Needs the extra ``lamina[xarray]`` (xarray, dask).  The mapping of
dimensions, coordinates and steps is described in docs/xarray.md and
:mod:`lamina.xarray.conventions`.
"""

from __future__ import annotations

import xarray as xr

from .backend import LaminaArray, LaminaBackendEntrypoint, group_dataset
from .write import to_lamina


@xr.register_dataset_accessor("lamina")
class DatasetAccessor:
    """``ds.lamina.to_lamina(path, ...)``: :func:`to_lamina` as a method."""

    def __init__(self, obj: xr.Dataset):
        self._obj = obj

    def to_lamina(self, path, **kwargs) -> None:
        to_lamina(self._obj, path, **kwargs)


@xr.register_datatree_accessor("lamina")
class DataTreeAccessor:
    """``tree.lamina.to_lamina(path, ...)``: every node as a group."""

    def __init__(self, obj: xr.DataTree):
        self._obj = obj

    def to_lamina(self, path, **kwargs) -> None:
        to_lamina(self._obj, path, **kwargs)


__all__ = ["LaminaArray", "LaminaBackendEntrypoint", "group_dataset", "to_lamina"]
