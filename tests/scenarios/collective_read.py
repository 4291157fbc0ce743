"""Collective reads (``ds.read(box, collective=True)``): any boxes, every value checked; misuse and damage.

``collective_read.py DIR W`` under ``mpiexec -n N``: ranks ``0..W-1`` write
(each its uneven axis-0 slab of a 3-D float64 dataset, and its blocks of
a 2-D int32 dataset cut along both axes, 2 steps); then all N ranks read
collectively, each with its own box, and compare every value:

- axis-1 slabs (every rank needs a part of every block), uneven;
- random boxes (seeded by rank), some overlapping between ranks, one
  rank's empty;
- everything on every rank, and a step read with a non-contiguous ``out``;
- a dataset written only in part: what no block covers reads as its fill value;
- the names or steps differ between ranks: CollectiveMismatchError on every rank;
- one rank's box leaves the dataset: the same error on every rank;
- a byte of a block flipped on disk: FormatError on every rank.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from _common import check_equal, log
from mpi4py import MPI

import lamina
from lamina.errors import BoundsError, CollectiveMismatchError, FormatError
from lamina.geometry import Box

A = (24, 20, 12)  # float64, axis-0 slabs
B = (30, 21)  # int32, a grid of blocks
H = (16, 10)  # float32, fill -7, only its top half written (rank 0, two blocks)


def value_a(box: Box, step: int) -> np.ndarray:
    g = np.meshgrid(
        *[np.arange(a, b) for a, b in zip(box.start, box.stop, strict=True)], indexing="ij"
    )
    return np.ravel_multi_index(g, A).astype(np.float64) + 0.5 + 1e4 * step


def value_b(box: Box, step: int) -> np.ndarray:
    g = np.meshgrid(
        *[np.arange(a, b) for a, b in zip(box.start, box.stop, strict=True)], indexing="ij"
    )
    return (np.ravel_multi_index(g, B) * 3 + step).astype(np.int32)


def cuts(n: int, parts: int) -> list[int]:
    """Uneven cuts of ``range(n)`` into *parts* pieces (the first ones longer)."""
    w = np.arange(parts, 0, -1, dtype=np.float64)
    return [0, *np.round(np.cumsum(w) / w.sum() * n).astype(int).tolist()]


def write(path: str, comm) -> None:
    with lamina.open(path, "w", comm=comm, durable=False) as f:
        a = f.create_dataset("a", A, "f8")
        b = f.create_dataset("g/b", B, "i4")
        c = cuts(A[0], comm.size)
        h = f.create_dataset("h", H, "f4", fill=-7)
        rows, cols = cuts(B[0], 3), cuts(B[1], 2 * comm.size)
        for step in range(2):
            with f.step():
                if comm.rank == 0 and step == 0:
                    h.write(np.full((H[0] // 2, H[1] // 2), 1, np.float32), offset=(0, 0))
                    h.write(np.full((H[0] // 2, H[1] // 2), 2, np.float32), offset=(0, H[1] // 2))
                box = Box((c[comm.rank], 0, 0), (c[comm.rank + 1], *A[1:]))
                if not box.empty:
                    a.write(value_a(box, step), offset=box.start)
                for i in range(3):
                    for j in range(2 * comm.size):
                        if j % comm.size != comm.rank:
                            continue
                        box = Box((rows[i], cols[j]), (rows[i + 1], cols[j + 1]))
                        b.write(value_b(box, step), offset=box.start)


def random_box(rng, shape) -> Box:
    lo = [int(rng.integers(0, n)) for n in shape]
    hi = [int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, shape, strict=True)]
    return Box(tuple(lo), tuple(hi))


def expect_everywhere(comm, fn, kind, what: str) -> None:
    """*fn* raises *kind* on this rank (every rank runs this)."""
    try:
        fn()
    except kind as e:
        log(comm, f"{what}: {type(e).__name__}: {e}")
        return
    raise AssertionError(f"{what}: no {kind.__name__} on rank {comm.rank}")


def main() -> None:
    comm = MPI.COMM_WORLD
    path, writers = sys.argv[1], int(sys.argv[2])
    sub = comm.Split(0 if comm.rank < writers else MPI.UNDEFINED, comm.rank)
    if sub != MPI.COMM_NULL:
        write(path, sub)
        sub.Free()
    comm.Barrier()
    n, r = comm.size, comm.rank
    rng = np.random.default_rng(1000 + r)
    with lamina.open(path, "r") as f:
        a, b = f["a"], f["g/b"]
        c = cuts(A[1], n)
        for step in range(2):
            slab = Box((0, c[r], 0), (A[0], c[r + 1], A[2]))
            before = f.engine.bytes_read
            check_equal(
                a.read(slab, step=step, collective=True), value_a(slab, step), "axis-1 slab"
            )
            # counted as this rank's box read alone, whichever rank read each block
            counted = f.engine.bytes_read - before
            if counted != slab.size * 8:
                raise AssertionError(f"a collective read of {slab} counted {counted} bytes")
            for k in range(3):
                box = Box((0, 0), (0, 0)) if (r == n - 1 and k == 1) else random_box(rng, B)
                got = b.read(box, step=step, collective=True)
                check_equal(got, value_b(box, step), f"random box {box}")
                box = random_box(rng, A)
                check_equal(
                    a.read(box, step=step, collective=True), value_a(box, step), f"box {box}"
                )
            full = Box.from_shape(B)
            out = np.zeros((B[1], B[0]), dtype=np.int32).T  # not C-contiguous
            b.read(full, step=step, out=out, collective=True)
            check_equal(out, value_b(full, step), "everything, Fortran-ordered out")
        # unwritten parts: the fill value, also where a rank's box touches no block at all
        want = np.full(H, -7, dtype=np.float32)
        want[: H[0] // 2, : H[1] // 2], want[: H[0] // 2, H[1] // 2 :] = 1, 2
        hb = Box((0, 0), H) if r % 2 == 0 else Box((H[0] // 2 - r % 3, 1), (H[0], H[1] - 1))
        got = f["h"].read(hb, step=0, collective=True)
        check_equal(got, want[hb.slices], f"fill around the written part, box {hb}")
        # misuse: different names or steps, a box outside the dataset on one rank
        expect_everywhere(
            comm,
            lambda: f["a" if r else "g/b"].read(None, step=0, collective=True),
            CollectiveMismatchError,
            "different datasets",
        )
        expect_everywhere(
            comm,
            lambda: a.read(None, step=r % 2, collective=True),
            CollectiveMismatchError,
            "different steps",
        )
        # each rank says which step it read; one that does not exist is said to be so
        try:
            a.read(None, step=99 if r == n - 1 else 0, collective=True)
        except CollectiveMismatchError as e:
            said = str(e)
            assert f"rank {r} read it at step {99 if r == n - 1 else 0}" in said, said
            assert ("which does not exist" in said) == (r == n - 1), said
        else:
            raise AssertionError(f"a read of step 99 on one rank went on, rank {r}")
        bad = Box((0, 0, 0), (A[0] + (1 if r == n - 1 else 0), *A[1:]))
        expect_everywhere(
            comm, lambda: a.read(bad, step=0, collective=True), BoundsError, "a box outside"
        )
        frozen = np.zeros(A)
        frozen.flags.writeable = r != n - 1  # read-only on one rank
        expect_everywhere(
            comm,
            lambda: a.read(None, step=0, out=frozen, collective=True),
            ValueError,
            "a read-only out on one rank",
        )
        # the file is still usable collectively afterwards
        check_equal(a.read(None, step=1, collective=True), value_a(Box.from_shape(A), 1), "after")
    comm.Barrier()
    # damage: one byte of the data of dataset a, step 1
    if r == 0:
        with lamina.open(path, "r", comm=MPI.COMM_SELF) as f:
            info = f.at(1)["a"].blocks()[0]
            name, offset = info.subfile, info.offset
        with open(os.path.join(path, name), "r+b") as fh:
            fh.seek(offset + 17)
            byte = fh.read(1)
            fh.seek(offset + 17)
            fh.write(bytes([byte[0] ^ 0xFF]))
    comm.Barrier()
    with lamina.open(path, "r") as f:
        slab = Box((0, c[r], 0), (A[0], c[r + 1], A[2]))
        expect_everywhere(
            comm,
            lambda: f["a"].read(slab, step=1, collective=True),
            FormatError,
            "a damaged block",
        )
        check_equal(f["a"].read(slab, step=0, collective=True), value_a(slab, 0), "step 0 intact")
    comm.Barrier()
    if r == 0:
        print(f"OK collective reads on {n} ranks of a file written by {writers}", flush=True)


if __name__ == "__main__":
    main()
