"""Failures on one rank inside collective calls: every rank must learn of them, nobody hangs.

Usage: faults.py CASE PATH
  disk     the aggregator's data write fails during end_step (a full disk): every
           rank raises, the next step commits intact (no stale messages matched)
  implicit one rank writes outside a step; close (and end_step) commit it on all ranks
  define   ranks' catalogs differ, create_dataset fails on one rank only: all raise
"""

import sys

import numpy as np
from mpi4py import MPI

import lamina
import lamina.engines.native.engine as native

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
case, path = sys.argv[1], sys.argv[2]


def disk() -> None:
    for n in (1000, 5_000_000):  # an eager-protocol message, then a rendezvous one (40 MB)
        real = native._pwrite_all
        state = {"fail": False}

        def flaky(fd, buf, off, state=state, real=real):
            if state["fail"]:
                state["fail"] = False
                raise OSError(28, "No space left on device (injected)")
            return real(fd, buf, off)

        native._pwrite_all = flaky
        try:
            with lamina.open(path, "w", aggregators=1, durable=False) as f:
                d = f.create_dataset("x", (size * n,))
                with f.step():
                    d[rank * n : (rank + 1) * n] = 1.0 + rank
                f.begin_step()
                d[rank * n : (rank + 1) * n] = 100.0 + rank
                state["fail"] = rank == 0  # the aggregator's first write in end_step fails
                try:
                    f.end_step()
                except OSError as e:
                    assert "No space left" in str(e), e
                else:
                    raise AssertionError("the failed step committed")
                with f.step():
                    d[rank * n : (rank + 1) * n] = 200.0 + rank
        finally:
            native._pwrite_all = real
        with lamina.open(path, comm=MPI.COMM_SELF) as f:
            assert f.steps == 2, f.steps
            v = f.at(1)["x"][...]
            assert np.array_equal(v, np.repeat(200.0 + np.arange(size), n)), np.unique(v)
            assert np.array_equal(f.at(0)["x"][...], np.repeat(1.0 + np.arange(size), n))


def implicit() -> None:
    with lamina.open(path, "w") as f:
        d = f.create_dataset("x", (size * 2,), fill=-1)
        with f.step():
            pass
        if rank == 0:
            d[0:2] = 1.0  # an implicit step on rank 0 only
        f.end_step()  # collective on every rank, though only rank 0 opened the step
        if rank == size - 1:
            d[2 * rank : 2 * rank + 2] = 7.0
        # close commits the implicit step of the last rank on every rank
    with lamina.open(path, comm=MPI.COMM_SELF) as f:
        assert f.steps == 3, f.steps
        assert np.array_equal(f.at(1)["x"][0:2], [1.0, 1.0])
        assert f.at(2)["x"][2 * (size - 1)] == 7.0


def define() -> None:
    f = lamina.open(path, "w")
    f.create_group("a" if rank == 0 else "b")  # ranks disagree (detected at commit)
    try:
        f.create_dataset("a", (4,))  # fails on rank 0 only: 'a' is a group there
    except lamina.ExistsError as e:
        assert "'a'" in str(e)
    else:
        raise AssertionError("create_dataset succeeded")
    try:
        f.close()
    except lamina.CollectiveMismatchError:
        pass  # the differing create_group calls are found when close commits
    else:
        raise AssertionError("close did not report the differing create_group calls")


{"disk": disk, "implicit": implicit, "define": define}[case]()
if rank == 0:
    print("OK", case)
