"""Multiresolution datasets written by n ranks and read back by m, at every level.

Run under ``mpiexec -n N python -m mpi4py multires.py``::

    multires.py write DIR     # three files, each with "T" (multiresolution, float32, patches
                              # (16, 16, 8)) and "P" (plain): every rank writes a slab of
                              # uneven thickness as two boxes, so patches are shared between
                              # ranks; 2 steps.  The files differ in tolerance, order,
                              # distribution, aggregation and aggregator count.
    multires.py read DIR W    # W ranks wrote; this job's ranks read every level by slabs and
                              # at random boxes, progressively, and query it

The same two programs run as one MPMD launch (``mpiexec -n N ... write DIR :
-n M ... read DIR N``) under ``LAMINA_TRANSPORT=memory``: the reader then gets
the encoded bands from the writer's memory.

The reference is computed from the same values on every rank
(``compress.reference_array``), so every value read is checked against the
bound the layout promises.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import lamina
from lamina.comm import task_comm
from lamina.geometry import Box, split_range
from lamina.multires import compress

SHAPE = (50, 45, 37)
PATCH = (16, 16, 8)
STEPS = 2
FILES = {
    # name: (tolerance, order, distribution, aggregation, aggregators: "1" | "n-1" | "n")
    "a": (1e-2, "patch", "balanced", "balanced", "n-1"),
    "b": (0.0, "level", "greedy", "counts", "n"),
    "c": (1e-3, "patch", "balanced", "local", "n"),
}


def say(text: str) -> None:
    """One line with a single write: lines of programs sharing the launch's output never mix."""
    os.write(1, (text + "\n").encode())


def values(step: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    z, y, x = np.meshgrid(*(np.linspace(0, 3, n) for n in SHAPE), indexing="ij")
    smooth = np.sin(2 * z) * np.cos(3 * y) + x**2 / 4
    return (smooth + 0.01 * rng.standard_normal(SHAPE) + step).astype(np.float32)


def rows(n: int, r: int) -> tuple[int, int]:
    """Uneven slabs: rank r's rows (not aligned with the patches)."""
    cuts = (
        [0] + [min(SHAPE[0], (SHAPE[0] * k) // n + 3 * (k % 2)) for k in range(1, n)] + [SHAPE[0]]
    )
    return cuts[r], cuts[r + 1]


def write(d: str) -> None:
    comm = task_comm()
    r, n = comm.rank, comm.size
    for name, (tol, order, dist, agg, naggs) in FILES.items():
        aggs = {"1": 1, "n-1": max(1, n - 1), "n": n}[naggs]
        with lamina.open(f"{d}/{name}.lam", "w", comm=comm, aggregators=aggs) as f:
            layout = lamina.Multires(
                patch=PATCH, tolerance=tol, order=order, distribution=dist, aggregation=agg
            )
            t = f.create_dataset("T", SHAPE, np.float32, layout=layout)
            p = f.create_dataset("P", SHAPE, np.float32)
            for step in range(STEPS):
                v = values(step)
                a, b = rows(n, r)
                half = SHAPE[1] // 2 + 1
                with f.step():
                    if b > a:
                        t[a:b, :half] = v[a:b, :half]
                        t.write(v[a:b, half:], offset=(a, half, 0))
                        p[a:b] = v[a:b]
    if r == 0:
        say(f"OK write: {n} ranks, {len(FILES)} files x {STEPS} steps")


def check(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    if tol == 0:
        if not np.array_equal(got, want.astype(got.dtype)):
            raise AssertionError(f"{what}: not bit for bit")
        return
    err = float(np.abs(got.astype(np.float64) - want).max()) if got.size else 0.0
    if not err <= tol:
        raise AssertionError(f"{what}: error {err:g} above tolerance {tol:g}")


def coarsest_reads(view) -> dict[int, int]:
    """Reads per open subfile (file descriptor) of one read of the coarsest level, whole domain."""
    from lamina.engines.native import engine as native

    touched: dict[int, int] = {}
    plain = native._pread_into

    def counting(fd, mv, offset, what):
        touched[fd] = touched.get(fd, 0) + 1
        return plain(fd, mv, offset, what)

    native._pread_into = counting
    try:
        view.level(len(view.levels) - 1)[...]
    finally:
        native._pread_into = plain
    return touched


def read(d: str, writers: int) -> None:
    comm = task_comm()
    r, m = comm.rank, comm.size
    rng = np.random.default_rng(100 + r)
    for name, (tol, order, *_rest) in FILES.items():
        with lamina.open(f"{d}/{name}.lam", "r", comm=comm) as f:
            t = f["T"]
            levels = t.levels
            assert len(levels) == 4 and levels[0] == SHAPE, levels
            for step in range(STEPS):
                v = values(step)
                if not np.array_equal(f.at(step)["P"][...], v):
                    raise AssertionError(f"{name} step {step}: the plain dataset differs")
                for k, shape in enumerate(levels):
                    ref = compress.reference_array(v, PATCH, k, tol)
                    a, b = split_range(shape[0], m, r)
                    got = t.read(Box((a, 0, 0), (b, *shape[1:])), step=step, level=k)
                    check(got, ref[a:b], tol, f"{name} step {step} level {k} rows {a}:{b}")
                    for _ in range(5):
                        lo = [int(rng.integers(0, n)) for n in shape]
                        hi = [
                            int(rng.integers(x + 1, n + 1)) for x, n in zip(lo, shape, strict=True)
                        ]
                        box = Box(tuple(lo), tuple(hi))
                        got = f.at(step)["T"].level(k)[box.slices]
                        check(got, ref[box.slices], tol, f"{name} step {step} level {k} box {box}")
                view = f.at(step)["T"]
                for k, arr in view.progressive():
                    check(
                        arr,
                        compress.reference_array(v, PATCH, k, tol),
                        tol,
                        f"{name} progressive {k}",
                    )
                final = view.last_read_bytes
                if r == 0 and f.engine.stack()[-1].name == "native":
                    touched = coarsest_reads(view)
                    if order == "level" and max(touched.values()) > 1:
                        raise AssertionError(f"{name}: the coarsest level read {touched} per file")
                one = f.at(step)["T"]
                one.read()
                if final != one.last_read_bytes or final != one.stored_bytes():
                    raise AssertionError(
                        f"{name}: progressive read {final} bytes, one read {one.last_read_bytes}"
                    )
                top = float(v.max())
                res = f.at(step).query(f"T >= {top - 2 * tol - 1e-6!r}")
                want = int((f.at(step)["T"][...] >= top - 2 * tol - 1e-6).sum())
                if res.count != want or want == 0:
                    raise AssertionError(
                        f"{name} step {step}: query found {res.count}, expected {want}"
                    )
    if r == 0:
        say(f"OK read: {m} ranks, {writers} writers")


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        read(sys.argv[2], int(sys.argv[3]))
