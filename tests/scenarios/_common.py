"""Shared by the scenario scripts: datasets, values that encode their index, uneven decompositions.

Everything here is a pure function of its arguments, so a writer and a
reader launched separately (with different rank counts) agree on what
was written where: the reader recomputes the writer's decomposition of
every step from the writer's rank count and seed, and every value from its
global index and step.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from lamina.geometry import Box, prime_factors

# name -> (shape, dtype, fill, compression)
DATASETS: dict[str, tuple[tuple[int, ...], str, object, object]] = {
    "d1/f32": ((53,), "float32", -1.5, None),
    "d1/i64": ((41,), "int64", -7, None),
    "d1/c128": ((29,), "complex128", 1 + 2j, None),
    "d1/bool": ((47,), "bool", True, None),
    "d2/f32": ((11, 13), "float32", -1.5, None),
    "d2/i64": ((9, 17), "int64", -7, None),
    "d2/c128": ((7, 10), "complex128", 1 + 2j, None),
    "d2/bool": ((12, 5), "bool", True, None),
    "d2/i64z": ((10, 12), "int64", 3, "zlib"),
    "d3/f32": ((5, 6, 7), "float32", -1.5, None),
    "d3/i64": ((4, 7, 5), "int64", -7, None),
    "d3/c128": ((6, 3, 5), "complex128", 1 + 2j, None),
    "d3/bool": ((3, 5, 6), "bool", True, None),
}
NAMES = list(DATASETS)

# a dataset whose blocks span several 256 KiB checksum segments (with checksum_segment=1<<18),
# so partial reads verify only some segments of a block; not in NAMES (opt in with --big)
DATASETS["big/f64"] = ((96, 1024), "float64", -0.5, None)
BIG = "big/f64"


def values(name: str, box: Box, step: int) -> np.ndarray:
    """The values written to *box* of dataset *name* at *step*: a function of the global index."""
    return values_for(shape_of(name), dtype_of(name), box, step)


def values_for(shape, dtype, box: Box, step: int) -> np.ndarray:
    grids = np.meshgrid(
        *[np.arange(a, b, dtype=np.int64) for a, b in zip(box.start, box.stop, strict=True)],
        indexing="ij",
    )
    if shape:
        idx = (
            np.ravel_multi_index(grids, shape) if box.size else np.zeros(box.shape, dtype=np.int64)
        )
    else:
        idx = np.zeros((), dtype=np.int64)
    idx = np.asarray(idx, dtype=np.int64).reshape(box.shape)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return (idx * 7 + step) % 3 == 0
    if dt.kind == "c":
        return (idx + 1000 * step + 1j * (idx - step)).astype(dt)
    return (idx + 1000 * step).astype(dt)


# datasets an append session adds (name -> (shape, dtype, fill))
EXTRA: dict[str, tuple[tuple[int, ...], str, object]] = {
    "late/i64": ((6, 9), "int64", -3),
}


def fill_of(name: str):
    if name in DATASETS:
        return DATASETS[name][2]
    return EXTRA[name][2]


def shape_of(name: str) -> tuple[int, ...]:
    if name in DATASETS:
        return DATASETS[name][0]
    return EXTRA[name][0]


def dtype_of(name: str) -> np.dtype:
    if name in DATASETS:
        return np.dtype(DATASETS[name][1])
    return np.dtype(EXTRA[name][1])


def random_grid(region: Box, nparts: int, rng: np.random.Generator) -> list[Box]:
    """*nparts* disjoint boxes tiling *region*: a random process grid, random cut points (some pieces may be empty)."""
    nd = region.ndim
    dims = [1] * nd
    for p in prime_factors(nparts):
        dims[int(rng.integers(nd))] *= p
    cuts = []
    for d in range(nd):
        lo, hi = region.start[d], region.stop[d]
        inner = (
            np.sort(rng.integers(lo, hi + 1, size=dims[d] - 1))
            if dims[d] > 1
            else np.zeros(0, dtype=np.int64)
        )
        cuts.append([lo, *map(int, inner), hi])
    boxes = []
    for idx in np.ndindex(*dims):
        start = tuple(cuts[d][idx[d]] for d in range(nd))
        stop = tuple(cuts[d][idx[d] + 1] for d in range(nd))
        boxes.append(Box(start, stop))
    order = rng.permutation(len(boxes))
    return [boxes[i] for i in order]


def split_in_two(box: Box, rng: np.random.Generator) -> list[Box]:
    """Cut *box* in two along its longest dimension at a random point (both halves non-empty)."""
    if box.empty or max(box.shape) < 2:
        return [box]
    d = int(np.argmax(box.shape))
    c = int(rng.integers(box.start[d] + 1, box.stop[d]))
    a_stop = list(box.stop)
    a_stop[d] = c
    b_start = list(box.start)
    b_start[d] = c
    return [Box(box.start, tuple(a_stop)), Box(tuple(b_start), box.stop)]


def write_plan(name: str, step: int, nranks: int, seed: int) -> list[list[Box]]:
    """The boxes each writer rank puts for dataset *name* at *step* (a list per rank).

    Uneven and different at every step: random grid, random cuts.  At some
    steps the last slab of dimension 0 is left unwritten (it must read as the
    fill value), at some steps one rank writes nothing, and some ranks
    put their piece as two blocks.
    """
    shape = shape_of(name)
    di = (list(DATASETS) + list(EXTRA)).index(name)
    rng = np.random.default_rng([seed, di, step, nranks])
    stop = list(shape)
    if (step + di) % 2 == 0 and stop and stop[0] > 1:
        stop[0] -= 1  # a hole: never written at this step
    region = Box((0,) * len(shape), tuple(stop))
    idle = nranks > 1 and (step + di) % 3 == 0  # one rank (aggregator or not) writes nothing
    pieces = random_grid(region, nranks - 1 if idle else nranks, rng)
    if idle:
        pieces.insert((step + di) % nranks, Box((0,) * len(shape), (0,) * len(shape)))
    plan = []
    for b in pieces:
        plan.append(split_in_two(b, rng) if rng.random() < 0.4 else [b])
    return plan


def written_boxes(name: str, step: int, nranks: int, seed: int) -> list[Box]:
    return [
        b for rank_boxes in write_plan(name, step, nranks, seed) for b in rank_boxes if not b.empty
    ]


def expected(name: str, step: int, nranks: int, seed: int, box: Box | None = None) -> np.ndarray:
    """What a reader must see in *box* (default: everything) of *name* at *step*."""
    shape = shape_of(name)
    box = Box.from_shape(shape) if box is None else box
    out = np.full(box.shape, fill_of(name), dtype=dtype_of(name))
    for b in written_boxes(name, step, nranks, seed):
        inter = b.intersect(box)
        if inter is not None and not inter.empty:
            out[inter.relative_to(box)] = values(name, inter, step)
    return out


def write_step(f, step: int, rank: int, nranks: int, seed: int, names=None) -> int:
    """Independent: this rank's puts of one step, through several write paths.  Returns cells written."""
    n = 0
    for name in names or NAMES:
        ds = f[name]
        for j, b in enumerate(write_plan(name, step, nranks, seed)[rank]):
            if b.empty:
                continue
            v = values(name, b, step)
            how = (step + j + rank) % 3
            if how == 0:
                ds[b.slices] = v
            elif how == 1:
                ds.write(v, offset=b.start)
            else:
                ds.write(np.ascontiguousarray(v), offset=b.start, copy=False)
            n += b.size
    return n


def check_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(
            f"{what}: got {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
        )
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)
        i = tuple(bad[0])
        raise AssertionError(
            f"{what}: {len(bad)} wrong values; first at {i}: got {got[i]!r}, expected {want[i]!r}"
        )


def check_stats(ds, step: int, nranks: int, seed: int, name: str) -> None:
    """Coverage equals the boxes written; each block's statistics match its values."""
    got = sorted((b.start, b.stop) for b in ds.coverage(step))
    want = sorted((b.start, b.stop) for b in written_boxes(name, step, nranks, seed))
    if got != want:
        raise AssertionError(f"{name} step {step}: coverage {got} != written {want}")
    for blk in ds.blocks(step):
        v = values(name, blk.box, step)
        st = blk.stats
        if st is None:
            continue
        if st.count != v.size:
            raise AssertionError(
                f"{name} step {step} block {blk.box}: count {st.count} != {v.size}"
            )
        if v.dtype.kind in "iuf":
            if st.min != v.min() or st.max != v.max():
                raise AssertionError(
                    f"{name} step {step} block {blk.box}: min/max {st.min}/{st.max} != {v.min()}/{v.max()}"
                )
            if not np.isclose(st.sum, v.sum(dtype=np.float64)):
                raise AssertionError(
                    f"{name} step {step} block {blk.box}: sum {st.sum} != {v.sum()}"
                )
        elif v.dtype.kind == "c":
            a = np.abs(v)
            if not (np.isclose(st.min, a.min()) and np.isclose(st.max, a.max())):
                raise AssertionError(
                    f"{name} step {step} block {blk.box}: |z| min/max {st.min}/{st.max} != {a.min()}/{a.max()}"
                )
            if not np.isclose(st.sum, v.sum()):
                raise AssertionError(
                    f"{name} step {step} block {blk.box}: sum {st.sum} != {v.sum()}"
                )


def read_check_step(
    view,
    step: int,
    history,
    rank: int,
    nreaders: int,
    seed: int,
    rseed: int,
    names=None,
    full: bool = False,
) -> int:
    """Check one step through a reader's own uneven decomposition.  Returns values compared.

    *history* is a list of (nranks, wseed, nsteps) writer sessions, in order:
    which writer wrote *step* decides what the reader expects.
    """
    nw, wseed = session_of(history, step)
    rng = np.random.default_rng([rseed, step, nreaders, 99])
    n = 0
    for name in names or NAMES:
        ds = view[name]
        if ds.shape != shape_of(name) or ds.dtype != dtype_of(name):
            raise AssertionError(f"{name}: shape/dtype {ds.shape} {ds.dtype}")
        mine = random_grid(Box.from_shape(ds.shape), nreaders, rng)[rank]
        if not mine.empty:
            got = ds[mine.slices]
            check_equal(
                got,
                expected(name, step, nw, wseed, mine),
                f"{name} step {step} box {mine} (reader rank {rank}/{nreaders})",
            )
            n += mine.size
            # the same box through read(box, step=...) on the file's latest view
            got2 = view.file[name].read(mine, step=step)
            check_equal(
                got2, expected(name, step, nw, wseed, mine), f"{name} step {step} read() {mine}"
            )
        if full or rank == 0:
            whole = expected(name, step, nw, wseed)
            check_equal(ds[...], whole, f"{name} step {step} (whole dataset)")
            n += whole.size
            # strided and integer selections
            sl = tuple(slice(None, None, 2) for _ in ds.shape)
            check_equal(ds[sl], whole[sl], f"{name} step {step} strided")
            idx = tuple(int(rng.integers(s)) for s in ds.shape)
            got = ds[idx]
            if got != whole[idx]:
                raise AssertionError(f"{name} step {step} [{idx}]: {got!r} != {whole[idx]!r}")
            check_stats(ds, step, nw, wseed, name)
    return n


def session_of(history, step: int) -> tuple[int, int]:
    k = 0
    for nw, wseed, nsteps in history:
        if step < k + nsteps:
            return nw, wseed
        k += nsteps
    raise AssertionError(f"step {step} is beyond the writer history {history}")


def parse_history(text: str) -> list[tuple[int, int, int]]:
    """'2:11:5,3:12:4' -> [(2, 11, 5), (3, 12, 4)]: (writer ranks, seed, steps) per session."""
    out = []
    for part in text.split(","):
        a, b, c = part.split(":")
        out.append((int(a), int(b), int(c)))
    return out


def log(comm, *msg) -> None:
    if comm.rank == 0:
        print(*msg, flush=True)


def wait_for(cond, timeout: float, what: str, poll: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


def fail(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()
    raise AssertionError(msg)
