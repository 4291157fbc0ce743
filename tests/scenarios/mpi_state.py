"""lamina where MPI is not in the state a file needs, on 1-4 ranks: errors, not a dead process.

Usage: mpi_state.py CASE PATH
  not-initialized     mpi4py.rc.initialize = False and lamina.open before MPI.Init: an
                      MPIStateError saying so (MPICH ended the process with no Python error);
                      after MPI.Init the same open works
  comm-null           comm=MPI.COMM_NULL (what Create_group gives a rank outside the group, and
                      a freed communicator is): a ValueError naming comm
  intercomm           comm= an intercommunicator (2+ ranks): a TypeError on every rank (one
                      rank raised a bare AssertionError and the others waited forever)
  finalize-async      io="async", 3 steps ended, then MPI.Finalize() called by the program
                      without close: the 3 steps are written (the background thread met a
                      finalized MPI: a segfault, the steps lost), and a close afterwards is an
                      MPIStateError (MPICH ended the process)
  finalize-sync       the same with io="sync"
"""

from __future__ import annotations

import sys

import mpi4py

case, path = sys.argv[1], sys.argv[2]
if case == "not-initialized":
    mpi4py.rc.initialize = False

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import lamina  # noqa: E402


def say(text: str) -> None:
    print(text, flush=True)


def expect(kind: type, words: str, fn) -> None:
    try:
        fn()
    except kind as e:
        if words not in str(e):
            raise AssertionError(f"{kind.__name__} without {words!r}: {e}") from e
    else:
        raise AssertionError(f"no {kind.__name__} ({words!r})")


if case == "not-initialized":
    expect(lamina.MPIStateError, "MPI is not initialized", lambda: lamina.open(path, "w"))
    MPI.Init()
    with lamina.open(path, "w") as f:
        f.create_dataset("u", data=np.arange(4.0))
    MPI.Finalize()
    say("OK not-initialized")
elif case == "comm-null":
    expect(ValueError, "comm is MPI.COMM_NULL", lambda: lamina.open(path, "w", comm=MPI.COMM_NULL))
    MPI.COMM_WORLD.Barrier()
    say("OK comm-null")
elif case == "intercomm":
    world = MPI.COMM_WORLD
    half = world.Split(int(world.rank == 0), world.rank)
    inter = half.Create_intercomm(0, world, 1 if world.rank == 0 else 0)
    expect(TypeError, "intercommunicator", lambda: lamina.open(path, "w", comm=inter))
    inter.Free()
    half.Free()
    world.Barrier()
    say("OK intercomm")
elif case.startswith("finalize-"):
    io = case.split("-", 1)[1]
    world = MPI.COMM_WORLD
    f = lamina.open(path, "w", io=io)
    ds = f.create_dataset("u", shape=(8 * world.size,))
    mine = slice(8 * world.rank, 8 * world.rank + 8)
    for s in range(3):
        with f.step():
            ds[mine] = s * 100 + np.arange(mine.start, mine.stop, dtype=float)
    MPI.Finalize()
    expect(lamina.MPIStateError, "MPI was finalized", f.close)
    say(f"OK {case}")
else:
    raise SystemExit(f"unknown case {case!r}")
