"""An error raised on every rank out of ``with lamina.open(path, "w")``: the file is closed as
one rank closes it, on any number of ranks.

Usage: all_fail.py CASE[,CASE...] IO PATH   (several cases one after another, each on a
  file of its own next to PATH)
  between   the error comes between steps, after a dataset and an attribute were defined:
            both are committed by the close, and the file is closed (on 2 or more ranks
            each rank left the file, as a rank alone in its error does: both were lost, and
            the file had no close record)
  in-step   the error comes inside a step, after an attribute was set between steps: the
            step is dropped, the attribute committed, the file closed
  implicit  the error comes after writes outside a step (a step they opened): as in-step
  mixed     as between, each rank with an error of another class (rank 0 a ValueError)
"""

import sys

import numpy as np
from mpi4py import MPI

import lamina

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
cases, io, base = sys.argv[1].split(","), sys.argv[2], sys.argv[3]


class Failed(Exception):
    pass


def run(case: str, path: str) -> None:
    try:
        with lamina.open(path, "w", io=io, durable=False) as f:
            x = f.create_dataset("x", (size, 10), "f8")
            with f.step():
                x[rank] = 1.0
            f.create_dataset("late", (3,), "f8", fill=7.0)
            x.attrs["units"] = "K"
            if case == "in-step":
                with f.step():
                    x[rank] = 2.0
                    raise Failed("NaN in the solution")
            if case == "implicit":
                x[rank] = 2.0
            if case == "mixed" and rank == 0:
                raise ValueError("rank 0's own")
            raise Failed("NaN in the solution")
    except (Failed, ValueError) as e:
        assert type(e) is (ValueError if case == "mixed" and rank == 0 else Failed), e
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=MPI.COMM_SELF) as r:
            said = f"n={size}: steps={r.steps} keys={sorted(r.keys())} attrs={dict(r['x'].attrs)}"
            assert r.engine.writer_closed, f"not closed: {said}"
            assert r.steps == 1 and sorted(r.keys()) == ["late", "x"], said
            assert dict(r["x"].attrs) == {"units": "K"}, said
            np.testing.assert_array_equal(r["x"][...], 1.0)
            np.testing.assert_array_equal(r["late"][...], 7.0)
        print("OK", case, io, size, flush=True)


for k, case in enumerate(cases):
    run(case, f"{base}.{k}" if k else base)
    comm.Barrier()
