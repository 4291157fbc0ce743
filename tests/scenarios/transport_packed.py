"""Small pieces of a read travel packed, many in one message; large ones each in their own.

    transport_packed.py produce NAME STEPS   two ranks write, each step, datasets of every kind
                                            of piece a read asks for (below)
    transport_packed.py check NAME STEPS     reads each step whole and in parts, against the
                                            values written

A consumer asks a producer rank for every small piece it holds in one
``Request.GETS`` (at most :data:`.wire.PACKED_PIECES` pieces and
:data:`.wire.CHUNK` bytes a message); larger pieces come one message each,
straight into the output.  The datasets:

- ``u``: float32 3-D, blocks of 1 x 2 x 5: many small pieces, parts of them in a read of a box;
- ``m``: float64 2-D, rank 0 one block of 40 x 2048 (above :data:`.wire.PACKED`), rank 1 forty
  rows: one read takes large and packed pieces together;
- ``e``: big-endian int32, 5,000 one-element blocks a rank: more pieces than one message takes;
- ``w``: float64, ten blocks of 60 KiB a rank, with :data:`.wire.CHUNK` set to 256 KiB on both
  sides: more bytes than one message takes;
- ``s``: a 0-D float64, written by rank 0.
"""

from __future__ import annotations

import sys

import numpy as np
from transport_common import say

import lamina
from lamina.engines.transport import wire

wire.CHUNK = 1 << 18  # (both sides cut boxes alike: set in every program of the launch)

U = (4, 12, 10)  # each rank's slab of "u"
UB = (1, 2, 5)
M = (40, 2048)
E = 5000
W = 7680  # float64 elements of a block of "w": 60 KiB
WN = 10


def want(name: str, step: int, ranks: int) -> np.ndarray:
    """The whole of *name* at *step* as *ranks* producer ranks wrote it."""
    if name == "u":
        n = U[0] * ranks * U[1] * U[2]
        return (np.arange(n, dtype=np.float32) + step).reshape(U[0] * ranks, *U[1:])
    if name == "m":
        return np.arange(M[0] * ranks * M[1], dtype=np.float64).reshape(-1, M[1]) * (step + 1)
    if name == "e":
        return (np.arange(E * ranks, dtype=">i4") - 7 * step).astype(">i4")
    if name == "w":
        return np.arange(W * WN * ranks, dtype=np.float64) + 0.5 * step
    return np.array(3.25 + step)


def produce(name: str, steps: int) -> None:
    with lamina.open(name, "w") as f:
        size, rank = f.comm.size, f.comm.rank
        u = f.create_dataset("u", (U[0] * size, *U[1:]), np.float32)
        m = f.create_dataset("m", (M[0] * size, M[1]), np.float64)
        e = f.create_dataset("e", (E * size,), ">i4")
        w = f.create_dataset("w", (W * WN * size,), np.float64)
        s = f.create_dataset("s", (), np.float64)
        for k in range(steps):
            with f.step():
                a = want("u", k, size)[U[0] * rank : U[0] * (rank + 1)]
                corners = np.array(
                    [
                        (U[0] * rank + i, j, m0)
                        for i in range(0, U[0], UB[0])
                        for j in range(0, U[1], UB[1])
                        for m0 in range(0, U[2], UB[2])
                    ]
                )
                blocks = np.stack(
                    [
                        a[i - U[0] * rank : i - U[0] * rank + 1, j : j + 2, c : c + 5]
                        for i, j, c in corners
                    ]
                )
                u.write_blocks(blocks, corners)
                rows = want("m", k, size)[M[0] * rank : M[0] * (rank + 1)]
                if rank == 0:
                    m.write(rows, offset=(0, 0))
                else:
                    m.write_blocks(rows[:, None, :], [(M[0] * rank + r, 0) for r in range(M[0])])
                ev = want("e", k, size)[E * rank : E * (rank + 1)]
                e.write_blocks(ev[:, None], np.arange(E * rank, E * (rank + 1))[:, None])
                wv = want("w", k, size)[W * WN * rank : W * WN * (rank + 1)]
                w.write_blocks(wv.reshape(WN, W), (W * WN * rank + W * np.arange(WN))[:, None])
                if rank == 0:
                    s[()] = want("s", k, size)
        if rank == 0:
            say(f"OK produce: {steps} steps")


def same(got, expect, what: str) -> None:
    if got.dtype != expect.dtype or not np.array_equal(got, expect):
        raise AssertionError(f"{what}: {got!r} ({got.dtype}), wrote {expect!r} ({expect.dtype})")


def check(name: str, steps: int) -> None:
    seen = 0
    with lamina.open(name, "r") as f:
        rank = f.comm.rank
        for view in f.iter_steps(timeout=60):
            k = view.index
            ranks = view["e"].shape[0] // E
            for n in ("u", "m", "e", "w", "s"):
                same(view[n][...], want(n, k, ranks), f"step {k}: {n}[...]")
            u, m = want("u", k, ranks), want("m", k, ranks)
            same(view["u"][1:7, 3:10, 2:9], u[1:7, 3:10, 2:9], f"step {k}: a box of u")
            same(view["u"][:, ::3, 1], u[:, ::3, 1], f"step {k}: a strided part of u")
            same(view["m"][30:50, 100:2000:7], m[30:50, 100:2000:7], f"step {k}: m across ranks")
            e = want("e", k, ranks)
            same(view["e"][4990:5010], e[4990:5010], f"step {k}: e across ranks")
            seen += 1
    if seen != steps:
        raise AssertionError(f"read {seen} steps, expected {steps}")
    if rank == 0:
        say(f"OK check: {seen} steps")


def main() -> None:
    role, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "produce":
        produce(name, steps)
    elif role == "check":
        check(name, steps)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
