"""Thousands of small blocks per rank per step, written by n ranks and read back by m.

Run under ``mpiexec -n N python -m mpi4py many_blocks.py``::

    many_blocks.py write DIR     # every rank writes 2,048 blocks of 2^3 of "u" (float64) and 512
                                 # strips of "s" (uint16) per step, in a shuffled order, and one
                                 # large block of "w" (stored as it is put), 2 steps, into
                                 # DIR/agg1.lam (one aggregator) and DIR/aggn.lam (one per rank)
    many_blocks.py read DIR W    # W ranks wrote; this job's ranks read their own row slabs, a box
                                 # across many blocks, one block, the block list, and a query

Values encode the global index and the step, so every value read is checked.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import lamina
from lamina.geometry import Box, split_range
from lamina.testing.cases import check_extents

ROWS, COLS = 16, 32  # each writer's slab of "u": ROWS x COLS x COLS, in blocks of EDGE^3
EDGE = 2
STRIP = 4  # "s": each writer's ROWS x COLS*8 part in strips of 1 x STRIP
STEPS = 2
WIDE = (160, 1024)  # "w": each writer's one block, 1.25 MiB of float64


def u_values(box: Box, step: int) -> np.ndarray:
    i, j, k = np.ogrid[tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))]
    return ((i * COLS + j) * COLS + k + step * 1_000_000).astype(np.float64)


def s_values(box: Box, step: int) -> np.ndarray:
    i, j = np.ogrid[tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))]
    return ((i * 7 + j * 3 + step * 11) % 65521).astype(np.uint16)


def w_values(rank: int, step: int) -> np.ndarray:
    return np.arange(WIDE[0] * WIDE[1], dtype=np.float64).reshape(WIDE) + 10 * rank + step


def write(d: str) -> None:
    comm = MPI.COMM_WORLD
    r, n = comm.rank, comm.size
    rng = np.random.default_rng(r)
    ublocks = [
        Box((ROWS * r + i, j, k), (ROWS * r + i + EDGE, j + EDGE, k + EDGE))
        for i in range(0, ROWS, EDGE)
        for j in range(0, COLS, EDGE)
        for k in range(0, COLS, EDGE)
    ]
    sblocks = [
        Box((ROWS * r + i, j), (ROWS * r + i + 1, j + STRIP))
        for i in range(ROWS)
        for j in range(0, 8 * COLS, STRIP)
    ]
    for agg in ("1", "n"):
        path = f"{d}/agg{agg}.lam"
        aggs = 1 if agg == "1" else n
        with lamina.open(path, "w", comm=comm, aggregators=aggs) as f:
            u = f.create_dataset("u", (ROWS * n, COLS, COLS), np.float64)
            s = f.create_dataset("s", (ROWS * n, 8 * COLS), np.uint16)
            w = f.create_dataset("w", (WIDE[0] * n, WIDE[1]), np.float64)
            for step in range(STEPS):
                with f.step():
                    w[WIDE[0] * r : WIDE[0] * (r + 1)] = w_values(r, step)
                    for k in rng.permutation(len(ublocks)).tolist():
                        b = ublocks[k]
                        u.write(u_values(b, step), offset=b.start, copy=False)
                    for k in rng.permutation(len(sblocks)).tolist():
                        b = sblocks[k]
                        s[b.slices] = s_values(b, step)
                if step == 0:
                    f.flush()  # collective: every aggregator's subfile, then the logs
    if r == 0:
        print(f"OK write: {n} ranks x {len(ublocks)} + {len(sblocks)} blocks x {STEPS} steps")


def read(d: str, writers: int) -> None:
    comm = MPI.COMM_WORLD
    r, m = comm.rank, comm.size
    rng = np.random.default_rng(100 + r)
    shape = (ROWS * writers, COLS, COLS)
    for agg in ("1", "n"):
        with lamina.open(f"{d}/agg{agg}.lam", "r", comm=comm) as f:
            u, s = f["u"], f["s"]
            for step in range(STEPS):
                a, b = split_range(shape[0], m, r)  # this rank's rows: across writers' slabs
                mine = Box((a, 0, 0), (b, COLS, COLS))
                got = u.read(mine, step=step)
                if not np.array_equal(got, u_values(mine, step)):
                    raise AssertionError(f"agg{agg} step {step}: rows {a}:{b} of u differ")
                lo = [int(rng.integers(0, n - 1)) for n in shape]
                hi = [int(rng.integers(x + 1, n + 1)) for x, n in zip(lo, shape, strict=True)]
                box = Box(tuple(lo), tuple(hi))  # odd corners: many blocks read in part
                if not np.array_equal(u.read(box, step=step), u_values(box, step)):
                    raise AssertionError(f"agg{agg} step {step}: box {box} of u differs")
                sbox = Box((a, 0), (b, 8 * COLS))
                if not np.array_equal(s.read(sbox, step=step), s_values(sbox, step)):
                    raise AssertionError(f"agg{agg} step {step}: rows {a}:{b} of s differ")
                one = Box((EDGE, 2 * EDGE, 3 * EDGE), (2 * EDGE, 3 * EDGE, 4 * EDGE))
                if not np.array_equal(u.read(one, step=step), u_values(one, step)):
                    raise AssertionError(f"agg{agg} step {step}: block {one} of u differs")
                blocks = u.blocks(step)
                want = writers * ROWS * COLS * COLS // EDGE**3
                if len(blocks) != want or len(s.blocks(step)) != writers * ROWS * 8 * COLS // STRIP:
                    raise AssertionError(f"agg{agg} step {step}: {len(blocks)} blocks of u")
                b = blocks[len(blocks) // 2]  # its statistics: those of its values
                v = u_values(b.box, step)
                if (b.stats.min, b.stats.max, b.stats.count) != (v.min(), v.max(), v.size):
                    raise AssertionError(f"agg{agg} step {step}: statistics of {b.box}")
                top = float(u_values(Box((0, 0, 0), shape), step).max())
                res = f.at(step).query(f"u >= {top!r}")
                if res.count != 1 or len(res.candidates) != 1:
                    raise AssertionError(
                        f"agg{agg} step {step}: u >= max: {res.count} matches, "
                        f"{len(res.candidates)} candidate blocks"
                    )
                for k in range(writers):
                    wk = Box((WIDE[0] * k, 0), (WIDE[0] * (k + 1), WIDE[1]))
                    if not np.array_equal(f["w"].read(wk, step=step), w_values(k, step)):
                        raise AssertionError(f"agg{agg} step {step}: writer {k}'s block of w")
            check_extents(f, f"agg{agg}")
    if r == 0:
        print(f"OK read: {m} ranks, {writers} writers")


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        read(sys.argv[2], int(sys.argv[3]))
