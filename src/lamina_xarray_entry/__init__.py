"""xarray's entry point for lamina files, light enough for xarray to load with every other backend.

xarray imports every registered backend's entry point when it lists its
engines (at the first ``open_dataset``, whatever the file).  Importing
``lamina`` starts MPI (mpi4py initializes it on import), which a program
reading a netCDF file should not pay for, and which fails on some
clusters outside a batch job.  This module imports only xarray: it
recognises ``.lam`` paths by name, and loads :mod:`lamina.xarray.backend`
when a lamina file is actually opened.
"""

from __future__ import annotations

import os
import sys

from xarray.backends import BackendEntrypoint

SUFFIX = ".lam"


def _backend() -> BackendEntrypoint:
    from lamina.xarray.backend import LaminaBackendEntrypoint

    return LaminaBackendEntrypoint()


class LaminaBackendEntrypoint(BackendEntrypoint):
    """``engine="lamina"`` (see :class:`lamina.xarray.backend.LaminaBackendEntrypoint`)."""

    description = "Open lamina files (.lam) lazily: blocks read on demand, steps as a dimension"
    url = ""
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "group", "step", "level")
    supports_groups = True

    def guess_can_open(self, filename_or_obj) -> bool:
        lamina = sys.modules.get("lamina")  # an open lamina File or Group: lamina is loaded
        if lamina is not None and isinstance(filename_or_obj, lamina.Group):
            return True
        try:
            path = os.fspath(filename_or_obj)
        except TypeError:
            return False
        return isinstance(path, str) and path.rstrip("/").endswith(SUFFIX)

    def open_dataset(self, filename_or_obj, **kwargs):
        return _backend().open_dataset(filename_or_obj, **kwargs)

    def open_groups_as_dict(self, filename_or_obj, **kwargs):
        return _backend().open_groups_as_dict(filename_or_obj, **kwargs)

    def open_datatree(self, filename_or_obj, **kwargs):
        return _backend().open_datatree(filename_or_obj, **kwargs)


__all__ = ["LaminaBackendEntrypoint"]
