"""Several ranks write one xarray Dataset with ``lamina.xarray.to_lamina``, each its part.

``xarray_write.py PATH`` under ``mpiexec -n N``: every rank builds the same
Dataset (:func:`expected`, two steps of a 3-D field of 4 MiB per step, a
coordinate, a time per step, attributes) and calls ``to_lamina`` on it;
the field is cut into one block per rank.  The test reads the file back in
its own process and compares it with :func:`expected`.
"""

from __future__ import annotations

import sys

import numpy as np
import xarray as xr
from mpi4py import MPI

from lamina.xarray import to_lamina

SHAPE = (2, 32, 32, 64)  # step, z, y, x


def expected() -> xr.Dataset:
    T = np.arange(np.prod(SHAPE), dtype="f8").reshape(SHAPE) / 3.0
    return xr.Dataset(
        {"T": (("step", "z", "y", "x"), T, {"units": "K"})},
        coords={
            "x": ("x", np.linspace(0.0, 2.0, SHAPE[3])),
            "time": ("step", [0.0, 0.5]),
        },
        attrs={"title": "written by several ranks"},
    )


def main() -> None:
    comm = MPI.COMM_WORLD
    to_lamina(expected(), sys.argv[1], comm=comm)
    if comm.rank == 0:
        print(f"OK {comm.size} ranks wrote the Dataset", flush=True)


if __name__ == "__main__":
    main()
