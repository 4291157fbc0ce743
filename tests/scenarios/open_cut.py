"""Ranks open a file whose last steps lost their data, and see the same steps.

Usage: open_cut.py write PATH    (one rank: three steps of "u"; "late" is created for the third)
       open_cut.py read PATH     (any number of ranks)
       open_cut.py append PATH   (any number of ranks, after read)

``write`` writes steps 0-2 of dataset ``u`` (one block each, ``aggregators=1``),
creating dataset ``late`` for step 2 only, then truncates the subfile so that
step 2's block is cut short.  ``read`` opens the file on every rank: rank 0
finds step 2's data missing and keeps steps 0-1 (a LaminaWarning says what
was left out); every other rank, which decoded every record rank 0 read
while rank 0 checked them, must drop step 2 and dataset ``late`` with it,
and every rank reads steps 0 and 1 back, and says that two records were left out (step 2
and the writer's close: ``records_left_out``).  ``append`` opens it in mode 'a' on every
rank (the same two steps), writes a new step 2, and every rank reads it back.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
from mpi4py import MPI

import lamina
from lamina.errors import LaminaWarning

comm = MPI.COMM_WORLD
mode, path = sys.argv[1], sys.argv[2]
N = 1000


def step_values(s: int) -> np.ndarray:
    return np.arange(N, dtype=np.float64) + 1000 * s


if mode == "write":
    assert comm.size == 1
    with lamina.open(path, "w", comm=MPI.COMM_SELF, aggregators=1) as f:
        u = f.create_dataset("u", (N,), "f8")
        for s in range(3):
            if s == 2:
                late = f.create_dataset("late", (4,), "i8")
            with f.step():
                u[...] = step_values(s)
                if s == 2:
                    late[...] = np.arange(4)
    data = [n for n in os.listdir(path) if n.startswith("data.")]
    assert len(data) == 1, data
    sub = os.path.join(path, data[0])
    os.truncate(sub, os.path.getsize(sub) - 8)  # step 2's last block ends past the end now
    print("OK write")
elif mode == "append":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaminaWarning)
        f = lamina.open(path, "a")
    with f:
        seen = comm.allgather((f.steps, sorted(f.keys()), f.engine.records_left_out))
        assert all(x == (2, ["u"], 0) for x in seen), seen  # (dropped from the logs)
        lo, hi = comm.rank * N // comm.size, (comm.rank + 1) * N // comm.size
        with f.step():
            f["u"][lo:hi] = -step_values(2)[lo:hi]
    with lamina.open(path, "r") as f:
        assert f.steps == 3
        assert np.array_equal(f["u"].read(step=2), -step_values(2)), comm.rank
        assert np.array_equal(f["u"].read(step=1), step_values(1)), comm.rank
    if comm.rank == 0:
        print(f"OK append: {comm.size} ranks")
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LaminaWarning)
        f = lamina.open(path, "r")
    with f:
        names = sorted(f.keys())
        seen = comm.allgather((f.steps, names, f.engine.records_left_out))
        assert all(x == seen[0] for x in seen), seen
        assert seen[0] == (2, ["u"], 2), seen[0]  # left out: step 2 and the writer's close
        for s in range(2):
            got = f["u"].read(step=s)
            assert np.array_equal(got, step_values(s)), (comm.rank, s)
        warned = [str(w.message) for w in caught if issubclass(w.category, LaminaWarning)]
        if comm.rank == 0:
            assert any("left out" in m for m in warned), warned
        ok = comm.allreduce(1)
    if comm.rank == 0:
        print(f"OK read: {ok} ranks see steps 0-1 alike")
