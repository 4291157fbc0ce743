"""Shared by the transport scenarios: the LowFive benchmark data and its uneven decompositions.

Every value is a function of its global index and the step, so a consumer
checks every value it reads without knowing how many producers wrote it:

- ``grid``: uint64, each cell holds its row-major global index (+ step);
  producers write row slabs of uneven height, consumers read column slabs
  of uneven width; at odd steps the last row is not written (fill value);
- ``particles``: n x 3 float32, particle p holds ``4 p + c`` (+ step) in
  column c; uneven counts per producer and per consumer;
- ``fields/z``: a 3-D complex128 field written and read through random
  uneven process grids on both sides;
- ``pscaled``: a derived quantity (``particles * 2 + 1``) kept as statistics.
"""

from __future__ import annotations

import os

import numpy as np
from _common import check_equal, random_grid, values_for

from lamina.geometry import Box

GRID = (23, 17)
GRID_FILL = 7777777
NPART = 61
FIELD = (7, 6, 5)
STEP_OFFSET = 100_000


def say(text: str) -> None:
    """Print one line with a single write, so lines of programs sharing the launch's output never mix."""
    os.write(1, (text + "\n").encode())


def cuts(n: int, weights: list[int]) -> list[tuple[int, int]]:
    """Split range(n) into len(weights) pieces of sizes proportional to *weights* (uneven)."""
    w = np.asarray(weights, dtype=np.float64)
    edges = np.floor(np.concatenate([[0.0], np.cumsum(w)]) / w.sum() * n + 0.5).astype(int)
    edges[-1] = n
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def grid_rows(step: int) -> int:
    return GRID[0] - (step % 2)


def grid_values(box: Box, step: int) -> np.ndarray:
    return values_for(GRID, np.uint64, box, 0).astype(np.uint64) + np.uint64(step * STEP_OFFSET)


def particle_values(a: int, b: int, step: int) -> np.ndarray:
    p = np.arange(a, b, dtype=np.float32)[:, None]
    return (4 * p + np.arange(3, dtype=np.float32)[None, :] + step * 1000).astype(np.float32)


def field_values(box: Box, step: int) -> np.ndarray:
    return values_for(FIELD, np.complex128, box, step)


def define(f, nsteps: int) -> None:
    """Collective: the datasets, groups and attributes a producer creates."""
    g = f.create_dataset("grid", GRID, np.uint64, fill=GRID_FILL)
    g.attrs["units"] = "index"
    f.create_dataset("particles", (NPART, 3), np.float32, fill=-1.0)
    f.create_dataset("fields/z", FIELD, np.complex128, fill=0)
    f.attrs["title"] = "lowfive benchmark"
    meta = f.create_group("meta/run")
    meta.attrs["nsteps"] = nsteps
    # a derived quantity kept as statistics: its definition travels as an extension record,
    # its values are computed by the consumer from the particles it receives
    f.derive("pscaled", "particles * 2 + 1", "stats")


def write_step(f, step: int, rank: int, size: int) -> None:
    """Independent: producer *rank*'s part of *step*: grid rows, particles, a piece of the field."""
    a, b = cuts(grid_rows(step), [r + 1 for r in range(size)])[rank]
    if b > a:
        box = Box((a, 0), (b, GRID[1]))
        f["grid"][box.slices] = grid_values(box, step)
    a, b = cuts(NPART, [(r * 3 + step) % 4 + 1 for r in range(size)])[rank]
    if b > a:
        f["particles"].write(particle_values(a, b, step), offset=(a, 0))
    rng = np.random.default_rng([11, step, size])
    mine = random_grid(Box.from_shape(FIELD), size, rng)[rank]
    if not mine.empty:
        f["fields/z"].write(field_values(mine, step), offset=mine.start, copy=False)


def check_step(view, step: int, rank: int, size: int) -> int:
    """Independent: consumer *rank* of *size* checks its uneven share of *step*; returns values compared."""
    f = view.file
    if f.attrs["title"] != "lowfive benchmark" or f["meta/run"].attrs["nsteps"] < 1:
        raise AssertionError(f"attributes: {dict(f.attrs)} {dict(f['meta/run'].attrs)}")
    if f["grid"].attrs["units"] != "index" or "fields" not in f:
        raise AssertionError("dataset attributes or groups missing")
    n = 0
    # grid: column slabs of uneven width, every row
    a, b = cuts(GRID[1], [size - r + 2 for r in range(size)])[rank]
    box = Box((0, a), (GRID[0], b))
    want = np.full(box.shape, GRID_FILL, dtype=np.uint64)
    rows = grid_rows(step)
    want[:rows] = grid_values(Box((0, a), (rows, b)), step)
    check_equal(view["grid"][:, a:b], want, f"grid step {step} columns {a}:{b}")
    n += want.size
    # particles: uneven ranges
    a, b = cuts(NPART, [(r + step) % 3 + 1 for r in range(size)])[rank]
    check_equal(
        view["particles"][a:b], particle_values(a, b, step), f"particles step {step} {a}:{b}"
    )
    n += (b - a) * 3
    if "pscaled" not in f.derived:
        raise AssertionError(f"derived definitions: {sorted(f.derived)}")
    want = particle_values(a, b, step) * 2 + 1
    check_equal(view["pscaled"][a:b], want, f"pscaled step {step} {a}:{b}")
    n += want.size
    # field: a random uneven grid of the consumer ranks
    rng = np.random.default_rng([23, step, size])
    mine = random_grid(Box.from_shape(FIELD), size, rng)[rank]
    check_equal(
        view["fields/z"][mine.slices], field_values(mine, step), f"fields/z step {step} {mine}"
    )
    n += mine.size
    if rank == 0:  # one rank also reads everything at once
        check_equal(
            view["particles"][...], particle_values(0, NPART, step), f"particles step {step} (all)"
        )
        n += NPART * 3
    return n
