"""Two ranks write overlapping boxes in one step: OverlapError on every rank, earlier steps intact.

``overlap.py PATH [AGGREGATORS]`` under ``mpiexec -n N`` (N >= 2).  Steps 0
and 1 are written correctly; in step 2 rank 0 and the last rank both write a
box covering cell (0, 1) of a 2-D dataset (and everybody else writes its
proper piece).  Every rank must get OverlapError from ``end_step``; steps 0
and 1 must stay readable (by the writer, and by a reader after close); the
writer can then write step 2 again correctly.  On one rank alone, two puts
of the same rank that overlap fail at once, in ``put``.  Lent with
``copy=False``, small blocks are checked when the step is committed: two
such puts of one rank that overlap are accepted, and ``end_step`` raises
OverlapError on every rank, naming both boxes and the rank, and drops the
step.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import check_equal, log
from mpi4py import MPI

import lamina
from lamina.errors import LaminaError, OverlapError
from lamina.geometry import Box, decompose

SHAPE = (8, 10)


def value(box: Box, step: int) -> np.ndarray:
    g = np.meshgrid(
        *[np.arange(a, b) for a, b in zip(box.start, box.stop, strict=True)], indexing="ij"
    )
    return (np.ravel_multi_index(g, SHAPE) + 1000 * step).astype(np.int64)


def good_step(f, comm, step: int) -> None:
    ds = f["grid"]
    boxes = decompose(SHAPE, comm.size)
    with f.step() as k:
        assert k == step, (k, step)
        b = boxes[comm.rank]
        if not b.empty:
            ds[b.slices] = value(b, step)


def check_steps(f, nsteps: int) -> None:
    """Steps 0..nsteps-1 hold the good values (at least *nsteps* steps exist)."""
    if f.steps < nsteps:
        raise AssertionError(f"{f.steps} steps, expected {nsteps}")
    full = Box.from_shape(SHAPE)
    for k in range(nsteps):
        check_equal(f.at(k)["grid"][...], value(full, k), f"step {k}")


def lent_overlap(f, comm, steps: int) -> None:
    """The last rank lends two small blocks that overlap (copy=False): accepted at the
    write, refused by end_step on every rank; the file still holds *steps* steps, the
    first two of them good."""
    last = comm.size - 1
    row = np.arange(4, dtype=np.int64)
    k = f.begin_step()
    assert k == steps, (k, steps)
    if comm.rank == last:
        f["grid"].write(row.reshape(1, 4), offset=(1, 0), copy=False)
        f["grid"].write(row.reshape(2, 2), offset=(0, 2), copy=False)  # meets (1, 2) and (1, 3)
    try:
        f.end_step()
    except OverlapError as e:
        msg = str(e)
        want = ("[1:2, 0:4]", "[0:2, 2:4]", f"rank {last}", "copy=False")
        if not all(w in msg for w in want):
            raise AssertionError(f"rank {comm.rank}: message lacks {want}: {msg}") from None
    else:
        raise AssertionError(f"rank {comm.rank}: overlapping lent blocks were committed")
    if f.engine.in_step or f.steps != steps:
        raise AssertionError(
            f"after the refused lent blocks: {f.steps} steps, in step {f.engine.in_step}"
        )
    check_steps(f, 2)


def main() -> None:
    comm = MPI.COMM_WORLD
    path = sys.argv[1]
    aggs = int(sys.argv[2]) if len(sys.argv) > 2 else comm.size
    last = comm.size - 1
    with lamina.open(path, "w", aggregators=aggs) as f:
        f.create_dataset("grid", SHAPE, "i8", fill=-1)
        good_step(f, comm, 0)
        good_step(f, comm, 1)

        # same rank, two overlapping puts: fails immediately, on this rank only (independent)
        k = f.begin_step()
        assert k == 2
        r = comm.rank
        f["grid"][r, 0:2] = 5  # row r: disjoint from the other ranks' rows
        try:
            f["grid"][r, 1:3] = 6
        except OverlapError:
            pass
        else:
            raise AssertionError("overlapping puts of one rank were accepted")
        if comm.size == 1:
            # the rejected put changed nothing: the step commits with the first block only
            f.end_step()
            check_steps(f, 2)
            want = np.full(SHAPE, -1, dtype=np.int64)
            want[0, 0:2] = 5
            check_equal(f.at(2)["grid"][...], want, "step 2 after a rejected put")
            lent_overlap(f, comm, 3)
            log(
                comm, "OK single-rank overlap rejected at put (lent: at end_step); the step went on"
            )
            return
        # still in step 2 on every rank (the rejected put did not end it): finish it with a
        # cross-rank overlap.  Rank 0 holds [0, 0:2]; the last rank writes a box over (0, 1).
        if comm.rank == last:
            f["grid"][0:1, 1:5] = 7
        errors = 0
        try:
            f.end_step()
        except OverlapError as e:
            errors = 1
            msg = str(e)
            if "overlap" not in msg:
                raise AssertionError(f"unhelpful message: {msg}") from None
        except LaminaError as e:
            raise AssertionError(
                f"rank {comm.rank}: expected OverlapError, got {type(e).__name__}: {e}"
            ) from None
        if comm.allreduce(errors) != comm.size:
            raise AssertionError(f"OverlapError on {comm.allreduce(errors)} of {comm.size} ranks")
        if f.engine.in_step:
            raise AssertionError("the failed step is still open")
        if f.steps != 2:
            raise AssertionError(f"{f.steps} steps after the failed step 2")
        check_steps(f, 2)  # nothing of the failed step is visible

        # a second failure through the context manager, ranks 0 and last again, larger boxes
        try:
            with f.step() as k:
                assert k == 2, k
                if comm.rank in (0, last):
                    f["grid"][2 * comm.rank // last : 6, 3:7] = comm.rank
        except OverlapError:
            errors += 1
        if comm.allreduce(errors) != 2 * comm.size:
            raise AssertionError("the second overlapping step did not fail on every rank")
        check_steps(f, 2)
        lent_overlap(f, comm, 2)

        # the writer goes on: step 2 again, correctly, then step 3
        good_step(f, comm, 2)
        good_step(f, comm, 3)
        check_steps(f, 4)
        with f.step() as k:  # a step in which no rank writes anything
            assert k == 4, k
    with lamina.open(path, "r") as f:
        if f.steps != 5:
            raise AssertionError(f"reader: {f.steps} steps")
        check_steps(f, 4)
        if f.at(4)["grid"].coverage() != []:
            raise AssertionError("the empty step has blocks")
        check_equal(
            f.at(4)["grid"][...], np.full(SHAPE, -1, dtype=np.int64), "empty step 4 reads as fill"
        )
        # no trace of the failed steps' blocks
        for k in range(4):
            boxes = sorted((b.start, b.stop) for b in f["grid"].coverage(k))
            want = sorted((b.start, b.stop) for b in decompose(SHAPE, comm.size) if not b.empty)
            if boxes != want:
                raise AssertionError(f"step {k}: coverage {boxes} != {want}")
    log(
        comm,
        f"OK overlap rejected on all {comm.size} ranks; steps 0..3 intact, empty step 4 reads as fill",
    )


if __name__ == "__main__":
    main()
