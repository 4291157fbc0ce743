"""Reads of many small blocks against numpy.

Blocks back to back in a subfile are read as one run, in pieces of whole
blocks (``READ_PIECE`` bytes) that are checked and put in place while they
are in the cache: a slab of the grid per piece where blocks of one shape
tile a box of the output in C order, otherwise one fancy-indexed copy, one
scatter or a copy per block.  A run of many blocks of one length is checked
with one CRC over all of its pieces.  Whatever the path, a read gives what
numpy gives on the array the blocks were cut from: here with grids in any
order, grids with holes, blocks off the grid's phase, blocks of several
shapes, read boxes that cut blocks, and pieces of one block to the whole run.
"""

from __future__ import annotations

import os
import tempfile
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_corruption import flip

import lamina
from lamina.derived import _parallel
from lamina.engines.native import engine as native
from lamina.engines.placement import grid_plan_for, grid_view
from lamina.errors import ChecksumError

pytestmark = pytest.mark.usefixtures("fast_native")

FILL = -1.0


def write_grid(path: str, edge: tuple, grid: tuple, seed: int) -> np.ndarray:
    """A step of dataset ``u``: a grid of *grid* blocks of shape *edge*, written in C order of
    their cells, one ``write`` each; the array they were cut from."""
    full = tuple(e * g for e, g in zip(edge, grid, strict=True))
    truth = np.random.default_rng(seed).random(full)
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", full, "f8")
        with f.step():
            for c in np.ndindex(*grid):
                key = tuple(slice(k * e, (k + 1) * e) for k, e in zip(c, edge, strict=True))
                ds.write(truth[key], offset=tuple(s.start for s in key))
    return truth


@st.composite
def tilings(draw):
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    grid = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    phase = tuple(draw(st.integers(0, 3)) for _ in range(nd))
    extra = tuple(draw(st.integers(0, 3)) for _ in range(nd))
    cells = list(np.ndindex(*grid))
    order = draw(st.permutations(range(len(cells))))
    holes = draw(st.sets(st.integers(0, len(cells) - 1), max_size=max(0, len(cells) - 2)))
    odd = draw(st.booleans())  # one block cut in two along axis 0 (a block of another shape)
    seed = draw(st.integers(0, 2**32 - 1))
    return shape, grid, phase, extra, [cells[i] for i in order if i not in holes], odd, seed


@settings(deadline=None)  # example counts from the profile (conftest.py)
@given(
    tilings(),
    st.sampled_from([1, 40, 300, native.READ_PIECE]),
    st.sampled_from([0, native.ROW_PIECE]),
    st.data(),
)
def test_reads_match_numpy(tiling, piece, row, data):
    """*piece*: bytes read at a time (1: a block per piece; the default: whole runs here);
    *row*: a grid's pieces a row of cells at least (0: not)."""
    with (
        mock.patch.object(native, "READ_PIECE", piece),
        mock.patch.object(native, "ROW_PIECE", row),
    ):
        _reads_match_numpy(tiling, data)


def _reads_match_numpy(tiling, data):
    shape, grid, phase, extra, cells, odd, seed = tiling
    nd = len(shape)
    full = tuple(p + g * s + x for p, g, s, x in zip(phase, grid, shape, extra, strict=True))
    rng = np.random.default_rng(seed)
    truth = np.full(full, FILL)
    boxes = []
    for cell in cells:
        lo = tuple(p + c * s for p, c, s in zip(phase, cell, shape, strict=True))
        hi = tuple(a + s for a, s in zip(lo, shape, strict=True))
        if odd and cell == cells[0] and shape[0] > 1:  # this block as two of other shapes
            mid = lo[0] + 1
            boxes += [(lo, (mid, *hi[1:])), ((mid, *lo[1:]), hi)]
        else:
            boxes.append((lo, hi))
    for lo, hi in boxes:
        truth[tuple(map(slice, lo, hi))] = rng.random(
            tuple(b - a for a, b in zip(lo, hi, strict=True))
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "runs.lam")
        later = np.where(truth == FILL, FILL, 2 * truth + 1)  # a second step written alike
        with lamina.open(path, "w", engine="native") as f:
            ds = f.create_dataset("u", full, "f8", fill=FILL)
            for values in (truth, later):
                with f.step():
                    for lo, hi in boxes:
                        ds.write(values[tuple(map(slice, lo, hi))], offset=lo)
        with lamina.open(path, "r", engine="native") as f:
            ds = f["u"]
            out = np.empty(full)
            for step, values in ((0, truth), (1, later), (0, truth)):  # one plan, each step's own
                ds.read(step=step, out=out)
                np.testing.assert_array_equal(out, values)
            np.testing.assert_array_equal(ds[...], later)
            for _ in range(3):  # boxes that cut blocks, hold some whole, or miss them all
                lo = [data.draw(st.integers(0, n - 1)) for n in full]
                hi = [data.draw(st.integers(a + 1, n)) for a, n in zip(lo, full, strict=True)]
                key = tuple(map(slice, lo, hi))
                np.testing.assert_array_equal(ds.read(key, step=0), truth[key])
                np.testing.assert_array_equal(ds.read(key, step=1), later[key])
            if nd > 1:  # into a strided output (not C-contiguous)
                out = np.zeros(full[::-1]).T
                ds.read(out=out, step=0)
                np.testing.assert_array_equal(out, truth)


def _place_grid(out, corner, shape, values) -> bool:
    """Blocks of one *shape* (values back to back, block k at ``corner[k]``) into *out* through
    the view the grid's plan gives; False (nothing written) when they do not tile a box of it."""
    plan = grid_plan_for(out, corner, shape)
    if plan is None:
        return False
    view = grid_view(out, plan)
    src = np.asarray(values).reshape(len(corner), *(int(v) for v in shape))
    if plan.order is not None:
        src = src[plan.order]
    view[...] = src.reshape(view.shape)
    return True


def test_place_grid_refuses_what_is_not_a_tiling():
    out = np.zeros((8, 8))
    shape = np.array([2, 2])
    vals = np.arange(16.0)
    # four blocks of a 2 x 2 grid in reverse order: one copy, each block in its cell
    corners = np.array([[2, 2], [2, 0], [0, 2], [0, 0]])
    assert _place_grid(out, corners, shape, vals)
    for k, (i, j) in enumerate(corners):
        np.testing.assert_array_equal(out[i : i + 2, j : j + 2].ravel(), vals[4 * k : 4 * k + 4])
    before = out.copy()
    # a hole (three blocks of a 2 x 2 grid), the same cell twice, blocks off the phase,
    # a grid reaching past the output: nothing written
    assert not _place_grid(out, corners[:3], shape, vals[:12])
    assert not _place_grid(out, np.array([[0, 0], [0, 0], [2, 0], [2, 2]]), shape, vals)
    assert not _place_grid(out, np.array([[0, 0], [0, 3]]), shape, vals[:8])
    assert not _place_grid(out, np.array([[6, 6], [6, 8]]), shape, vals[:8])
    np.testing.assert_array_equal(out, before)


def test_grid_found_again_for_the_same_corners_is_the_new_output_s():
    """The search is kept for the next call with the same corners, shape and output shape
    (a reader of one region step after step): the view is always into the output given,
    and an output of another shape or other corners are searched again."""
    shape = np.array([2, 2])
    corners = np.array([[2, 2], [2, 0], [0, 2], [0, 0]])
    vals = np.arange(16.0)
    outs = [np.zeros((4, 4)), np.zeros((4, 4)), np.zeros((8, 4)).T[:, :4]]
    for out in outs + outs[:1]:
        assert _place_grid(out, corners, shape, vals)
        for k, (i, j) in enumerate(corners):
            np.testing.assert_array_equal(
                out[i : i + 2, j : j + 2].ravel(), vals[4 * k : 4 * k + 4]
            )
    assert not _place_grid(np.zeros((3, 4)), corners, shape, vals)  # past the output's end
    assert _place_grid(np.zeros((4, 4)), corners, shape, vals)
    moved = corners + np.array([0, 1])  # other corners, same bytes length: searched again
    out = np.zeros((4, 5))
    assert _place_grid(out, moved, shape, vals)
    np.testing.assert_array_equal(out[0:2, 1:3].ravel(), vals[12:16])
    assert not _place_grid(np.zeros((4, 4)), moved, shape, vals)


@pytest.mark.parametrize("kind", ["fortran", "sliced"])
def test_place_grid_writes_into_strided_outputs(kind):
    """The copy goes into the caller's array whatever its strides (never into a copy of it)."""
    base = np.zeros((10, 12)) if kind == "sliced" else np.zeros((12, 8)).T
    out = base[1:9, 2:10] if kind == "sliced" else base
    corners = np.array([[0, 0], [0, 4], [4, 0], [4, 4]])
    vals = np.arange(64.0)
    assert _place_grid(out, corners, np.array([4, 4]), vals)
    for k, (i, j) in enumerate(corners):
        np.testing.assert_array_equal(out[i : i + 4, j : j + 4].ravel(), vals[16 * k : 16 * k + 16])


def test_runs_of_larger_blocks_and_the_run_buffer_used_again(tmp_path):
    """Blocks above the scatter size (8 x 8 x 9 = 576 elements) in shuffled order with holes,
    read in runs through one buffer that the next run uses again: reads of different sizes
    in turn give what numpy gives, and a byte flipped after a clean read is still caught."""
    edge = (8, 8, 9)
    grid = (4, 3, 5)
    full = tuple(g * e for g, e in zip(grid, edge, strict=True))
    rng = np.random.default_rng(7)
    truth = np.full(full, FILL)
    cells = [c for k, c in enumerate(np.ndindex(*grid)) if k % 7 != 3]  # some holes
    path = str(tmp_path / "runs.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", full, "f8", fill=FILL)
        with f.step():
            for k in rng.permutation(len(cells)).tolist():
                lo = tuple(c * e for c, e in zip(cells[k], edge, strict=True))
                key = tuple(slice(a, a + e) for a, e in zip(lo, edge, strict=True))
                truth[key] = rng.random(edge)
                ds.write(truth[key], offset=lo)
    with lamina.open(path) as f:
        ds = f["u"]
        eng = f.engine.inner
        keys = [
            (slice(0, 8), slice(0, 8), slice(0, 18)),  # two blocks: a short run
            (slice(None),) * 3,  # every block: runs up to the whole step
            (slice(3, 29), slice(5, 20), slice(1, 44)),  # cuts blocks: a copy each
            (slice(8, 16), slice(0, 24), slice(0, 9)),
        ]
        for key in keys + keys[::-1]:
            np.testing.assert_array_equal(ds[key], truth[key])
        kept = eng._run_bufs
        assert len(kept) == 1 and len(kept[0]) <= native.COALESCE_RUN
        victim = ds.blocks()[len(cells) // 2]
        flip(os.path.join(path, victim.subfile), victim.offset + 11)
        with pytest.raises(ChecksumError, match="checksum mismatch"):
            ds[...]
        sub = tuple(slice(a, b) for a, b in zip(victim.box.start, victim.box.stop, strict=True))
        with pytest.raises(ChecksumError):
            ds[sub]


@pytest.mark.parametrize("order", ["c", "reversed", "holes"])
@pytest.mark.parametrize("piece,threads", [(1, 1), (1000, 1), (1 << 20, 1), (1, 3), (1000, 2)])
def test_a_run_of_many_blocks_checked_with_one_crc(tmp_path, monkeypatch, order, piece, threads):
    """A run of more blocks than ``CONCAT_MIN`` (24 x 24 blocks of 2 x 3) is checked with one
    CRC over all its pieces: read in pieces of one block, of a few rows of the grid, or whole,
    on one thread or several, with the grid in C order (slabs), reversed (one fancy-indexed
    copy per piece) or with holes (one scatter per piece), it gives what numpy gives; a byte
    flipped in one block is caught after the run and the error names that block."""
    monkeypatch.setattr(native, "PARALLEL_READ_MIN", 0)
    monkeypatch.setattr(_parallel, "THREADS", threads)
    run, used = _parallel.run_blocks, []

    def counted(items, work, states):
        used.append(len(states))
        return run(items, work, states)

    monkeypatch.setattr(_parallel, "run_blocks", counted)
    edge, grid = (2, 3), (24, 24)
    full = (edge[0] * grid[0], edge[1] * grid[1])
    cells = list(np.ndindex(*grid))
    if order == "reversed":
        cells = cells[::-1]
    elif order == "holes":
        cells = [c for k, c in enumerate(cells) if k % 11 != 5]
    assert len(cells) > lamina.stats.CONCAT_MIN
    rng = np.random.default_rng(3)
    truth = np.full(full, FILL)
    path = str(tmp_path / "many.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", full, "f8", fill=FILL)
        with f.step():
            for c in cells:
                lo = (c[0] * edge[0], c[1] * edge[1])
                key = (slice(lo[0], lo[0] + edge[0]), slice(lo[1], lo[1] + edge[1]))
                truth[key] = rng.random(edge)
                ds.write(truth[key], offset=lo)
    with mock.patch.object(native, "READ_PIECE", piece), lamina.open(path) as f:
        ds = f["u"]
        np.testing.assert_array_equal(ds[...], truth)
        np.testing.assert_array_equal(ds[4:30, :], truth[4:30, :])
        assert max(used) == (threads if piece < 1 << 20 else 1)  # the whole run: one piece
        assert 1 <= len(f.engine.inner._run_bufs) <= threads
        victim = ds.blocks()[len(cells) * 2 // 3]
        flip(os.path.join(path, victim.subfile), victim.offset + 5)
        with pytest.raises(ChecksumError, match="checksum mismatch") as err:
            ds[...]
        assert str(victim.box) in str(err.value)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_runs_of_one_read_share_one_set_of_threads(tmp_path, monkeypatch, threads):
    """A read whose blocks make several runs (runs cut at ``COALESCE_RUN`` bytes) hands the
    pieces of all of them to one set of threads, once per read; every run checked with one CRC
    is still checked, and a byte flipped in a block of the last run is named after the read."""
    monkeypatch.setattr(native, "PARALLEL_READ_MIN", 0)
    monkeypatch.setattr(native, "COALESCE_RUN", 48 * 400)  # runs of 400 blocks
    monkeypatch.setattr(native, "READ_PIECE", 48 * 70)  # pieces of 70 blocks
    monkeypatch.setattr(_parallel, "THREADS", threads)
    run, calls = _parallel.run_blocks, []

    def counted(items, work, states):
        calls.append((len(list(items)), len(states)))
        return run(items, work, states)

    monkeypatch.setattr(_parallel, "run_blocks", counted)
    edge, grid = (2, 3), (40, 50)  # 2,000 blocks of 48 bytes: 5 runs of 400
    full = (edge[0] * grid[0], edge[1] * grid[1])
    truth = np.random.default_rng(5).random(full)
    path = str(tmp_path / "runs.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", full, "f8")
        with f.step():
            for c in np.ndindex(*grid):
                lo = (c[0] * edge[0], c[1] * edge[1])
                ds.write(truth[lo[0] : lo[0] + edge[0], lo[1] : lo[1] + edge[1]], offset=lo)
    assert 400 > lamina.stats.CONCAT_MIN  # each run is checked as a whole
    with lamina.open(path) as f:
        ds = f["u"]
        np.testing.assert_array_equal(ds[...], truth)
        # one call for the whole read: 5 runs of 400 blocks (8 rows of the grid), each read a
        # row of 50 blocks at a time (the slabs that fit in a piece of 70 blocks)
        assert calls == [(40, threads)]
        victim = ds.blocks()[-3]  # in the last run
        flip(os.path.join(path, victim.subfile), victim.offset + 17)
        with pytest.raises(ChecksumError, match="checksum mismatch") as err:
            ds[...]
        assert str(victim.box) in str(err.value)


@pytest.mark.parametrize(
    "row,threads,big,pieces",
    [
        (native.ROW_PIECE, 1, True, 6),  # a row of 4 cells (2 KiB) a piece: rows of the output
        (2048, 6, True, 6),  # a row that fits exactly, a row for each of 6 threads
        (2047, 1, True, 24),  # a row larger than the bound: a block a piece
        (0, 1, True, 24),
        (native.ROW_PIECE, 7, True, 24),  # fewer rows than threads: a block a piece
        (native.ROW_PIECE, 7, False, 6),  # a read too small for threads: rows
    ],
)
def test_a_grid_is_read_a_row_of_cells_at_a_time(tmp_path, monkeypatch, row, threads, big, pieces):
    """Blocks of a grid fill whole rows of the output where pieces hold a row of cells along
    the last axis (up to ``ROW_PIECE`` bytes), even when ``READ_PIECE`` asks for less, unless
    that would leave some of the read's threads without a piece (a read of fewer than
    ``PARALLEL_READ_MIN`` bytes takes one)."""
    monkeypatch.setattr(native, "READ_PIECE", 1)
    monkeypatch.setattr(native, "ROW_PIECE", row)
    if big:
        monkeypatch.setattr(native, "PARALLEL_READ_MIN", 0)
    monkeypatch.setattr(_parallel, "THREADS", threads)
    run, calls = _parallel.run_blocks, []

    def counted(items, work, states):
        calls.append(len(list(items)))
        return run(items, work, states)

    monkeypatch.setattr(_parallel, "run_blocks", counted)
    path = str(tmp_path / "rows.lam")
    truth = write_grid(path, (4, 4, 4), (2, 3, 4), 9)  # 24 blocks of 512 bytes
    with lamina.open(path) as f:
        np.testing.assert_array_equal(f["u"][...], truth)
    assert calls == [pieces]


@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.integers(1, 64),
    st.integers(1, 2000),
)
def test_slabs_cut_a_grid_into_boxes_of_consecutive_cells(extent, block, limit):
    """``_slabs`` cuts a grid of cells (C order) into pieces that each cover consecutive cells
    forming the box they name, every cell once, each piece within *limit* bytes unless it is
    a single cell."""
    from lamina.engines.native.engine import _slabs

    n = int(np.prod(extent))
    lin = np.arange(n).reshape(extent)
    seen = []
    for a, b, key in _slabs(extent, block, limit):
        assert b > a
        assert (b - a) * block <= limit or b - a == 1
        assert lin[key].reshape(-1).tolist() == list(range(a, b))
        seen.append((a, b))
    assert [a for a, _ in seen] == [0] + [b for _, b in seen[:-1]] and seen[-1][1] == n


def test_a_read_planned_once_for_steps_written_alike(tmp_path, monkeypatch):
    """A reader of one region step after step plans the read once: steps whose blocks lie
    alike (boxes, lengths, subfiles, offsets from the first block's) are read with the plan
    of the first, each with its own offsets and checksums, also after the file is opened
    again.  A step laid out otherwise, an output of other strides or a box that cuts blocks
    is planned again; the plans kept are bounded (the least recently used goes); a byte
    flipped in a later step is caught and the error names its block."""
    planned = []
    lay_out = native.NativeEngine._lay_out

    def counted(self, *args):
        planned.append(1)
        return lay_out(self, *args)

    monkeypatch.setattr(native.NativeEngine, "_lay_out", counted)
    monkeypatch.setattr(native, "_plans", {})  # none kept from other tests
    edge, grid = (2, 3), (6, 6)
    full = (edge[0] * grid[0], edge[1] * grid[1])
    cells = list(np.ndindex(*grid))
    rng = np.random.default_rng(11)
    truths = [rng.random(full) for _ in range(4)]
    path = str(tmp_path / "steps.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", full, "f8")
        for s, truth in enumerate(truths):
            order = rng.permutation(len(cells)).tolist() if s == 2 else range(len(cells))
            with f.step():
                for k in order:
                    lo = (cells[k][0] * edge[0], cells[k][1] * edge[1])
                    ds.write(truth[lo[0] : lo[0] + edge[0], lo[1] : lo[1] + edge[1]], offset=lo)
    with lamina.open(path) as f:
        ds = f["u"]
        out = np.empty(full)
        for s in (0, 1, 3):  # written alike: one plan
            ds.read(step=s, out=out)
            np.testing.assert_array_equal(out, truths[s])
        assert len(planned) == 1
        ds.read(step=2, out=out)  # put in another order: other offsets, planned again
        np.testing.assert_array_equal(out, truths[2])
        assert len(planned) == 2
        strided = np.empty(full[::-1]).T
        for s in (0, 1):
            ds.read(step=s, out=strided)
            np.testing.assert_array_equal(strided, truths[s])
        assert len(planned) == 3
        cut = (slice(1, 9), slice(2, 17))
        for s in (0, 1, 3):
            np.testing.assert_array_equal(ds.read(cut, step=s), truths[s][cut])
        assert len(planned) == 4
        with lamina.open(path) as again:  # opened again: the plans are the process's
            again["u"].read(step=2, out=out)
            np.testing.assert_array_equal(out, truths[2])
        assert len(planned) == 4
        for a in range(native.READ_PLANS + 2):  # other boxes: the plans kept are bounded
            ds.read((slice(a, full[0]), slice(None)), step=0)
        assert len(native._plans) == native.READ_PLANS
        regions = [(slice(a, full[0]), slice(None)) for a in range(native.READ_PLANS)]
        for key in regions:
            ds.read(key, step=0)
        before = len(planned)
        ds.read(regions[0], step=0)  # used again: the most recently used
        ds.read((slice(0, 5), slice(None)), step=0)  # a new one: the least recently used goes
        ds.read(regions[0], step=0)
        assert len(planned) == before + 1
        victim = ds.blocks(1)[len(cells) // 3]
        flip(os.path.join(path, victim.subfile), victim.offset + 3)
        ds.read(step=0, out=out)
        np.testing.assert_array_equal(out, truths[0])
        with pytest.raises(ChecksumError, match="checksum mismatch") as err:
            ds.read(step=1, out=out)
        assert str(victim.box) in str(err.value)


def _assigned(out_shape, values, lo, shapes) -> np.ndarray:
    """The pieces (corners *lo*, *shapes*; values one after another) put in a new array one
    slice assignment each: what place_pieces must give."""
    want = np.zeros(out_shape, values.dtype)
    k = 0
    for a, s in zip(lo.tolist(), shapes.tolist(), strict=True):
        n = int(np.prod(s))
        want[tuple(map(slice, a, np.add(a, s)))] = values[k : k + n].reshape(s)
        k += n
    return want


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix, on purpose
@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_place_pieces_is_a_slice_assignment_per_piece(data):
    """The in situ consumer's placement of packed pieces (grids, scatters, the rest one by
    one) gives what a slice assignment per piece gives, for any output layout."""
    from lamina.engines.placement import place_pieces

    nd = data.draw(st.integers(1, 3))
    out_shape = tuple(data.draw(st.integers(1, 9)) for _ in range(nd))
    # disjoint pieces: the cells of a random tiling of the output, a random subset, in a random order
    edges = []
    for n in out_shape:
        cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=3)) if n > 1 else []))
        edges.append([0, *cuts, n])
    cells = list(np.ndindex(*(len(e) - 1 for e in edges)))
    keep = data.draw(st.lists(st.booleans(), min_size=len(cells), max_size=len(cells)))
    chosen = [c for c, k in zip(cells, keep, strict=True) if k] or cells[:1]
    order = data.draw(st.permutations(range(len(chosen))))
    if data.draw(st.booleans()):  # in the output's order (as a producer holds its blocks)
        order = sorted(order)
    lo = np.array([[edges[d][c[d]] for d in range(nd)] for c in chosen], dtype=np.int64)[order]
    hi = np.array([[edges[d][c[d] + 1] for d in range(nd)] for c in chosen], dtype=np.int64)[order]
    shapes = hi - lo
    dtype = data.draw(st.sampled_from(["<f8", ">f8", ">i4", "<u2"]))
    values = np.arange(1, int(np.prod(shapes, axis=1).sum()) + 1).astype(dtype)
    want = _assigned(out_shape, values, lo, shapes)
    layout = data.draw(st.sampled_from(["c", "f", "strided", "reversed", "matrix"]))
    if layout == "c":
        out = np.zeros(out_shape, dtype)
    elif layout == "f":
        out = np.zeros(out_shape, dtype, order="F")
    elif layout == "strided":
        out = np.zeros(tuple(2 * v for v in out_shape), dtype)[(slice(None, None, 2),) * nd]
    elif layout == "reversed":
        out = np.zeros(out_shape, dtype)[::-1]
    else:  # an ndarray subclass that reshapes its own way
        out = np.asmatrix(np.zeros(out_shape, dtype)) if nd == 2 else np.zeros(out_shape, dtype)
    place_pieces(values, lo, shapes, out)
    np.testing.assert_array_equal(np.asarray(out), want)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix, on purpose
def test_place_pieces_takes_each_kind_of_group():
    """Many equal pieces tiling the output (the grid), many equal pieces that do not tile it
    (the scatter), large ones (one by one) and a mix: each equal to slice assignments."""
    from lamina.engines import placement

    def check(out_shape, lo, shape_rows):
        lo = np.asarray(lo, dtype=np.int64)
        shapes = np.asarray(shape_rows, dtype=np.int64)
        values = np.random.default_rng(1).random(int(np.prod(shapes, axis=1).sum()))
        want = _assigned(out_shape, values, lo, shapes)
        out = np.zeros(out_shape)
        placement.place_pieces(values, lo, shapes, out)
        np.testing.assert_array_equal(out, want)

    grid = [(i, j) for j in range(0, 16, 4) for i in range(0, 16, 4)]  # not in C order
    check((16, 16), grid, [(4, 4)] * 16)
    checker = [(i, j) for i in range(0, 16, 4) for j in range(0, 16, 4) if (i + j) % 8 == 0]
    check((16, 16), checker, [(4, 4)] * len(checker))  # holes: the scatter
    big = [(0, 0), (0, 32), (32, 0), (32, 32)]
    check((64, 64), big, [(32, 32)] * 4)  # over SCATTER_ELEMENTS, no tiling of a box... a grid
    check((64, 80), [(0, 0), (0, 40), (32, 0)], [(32, 40)] * 3)  # too few: one by one
    mixed_lo = [*grid, (16, 0), (16, 8), (16, 16)]
    check((20, 20), mixed_lo, [(4, 4)] * 16 + [(4, 8), (4, 8), (4, 4)])
    # whole rows of uneven counts (a particle array cut in blocks): stretches of memory
    starts = [0, 3, 7, 10, 14, 17, 21, 24, 28, 31]
    counts = [b - a for a, b in zip(starts, [*starts[1:], 35], strict=True)]
    check((35, 3), [(a, 0) for a in starts], [(c, 3) for c in counts])  # in order: one copy
    order = [0, 1, 2, 3, 4, 9, 5, 6, 7, 8]  # one out of order: two stretches
    check((35, 3), [(starts[k], 0) for k in order], [(counts[k], 3) for k in order])
    order = [9, 3, 6, 0, 8, 2, 5, 1, 7, 4]  # shuffled: by shape
    check((35, 3), [(starts[k], 0) for k in order], [(counts[k], 3) for k in order])
    check((35,), [(a,) for a in starts], [(c,) for c in counts])
    # many shapes, few pieces of each, shuffled (groups and the rest one by one)
    rows = [1 + k % 9 for k in range(60)] + [4] * 12
    firsts = np.cumsum([0, *rows[:-1]])
    mix = np.random.default_rng(3).permutation(len(rows))
    check((sum(rows), 3), [(int(firsts[k]), 0) for k in mix], [(rows[k], 3) for k in mix])
    check((sum(rows), 5), [(int(firsts[k]), 1) for k in mix], [(rows[k], 3) for k in mix])
    # into an np.matrix (an ndarray subclass whose reshape keeps two dimensions)
    for lo, shape_rows in (
        ([(a, 0) for a in starts], [(c, 3) for c in counts]),  # whole rows in order
        (checker, [(4, 4)] * len(checker)),  # the scatter
    ):
        lo = np.asarray(lo, dtype=np.int64)
        shapes = np.asarray(shape_rows, dtype=np.int64)
        full = (int((lo + shapes)[:, 0].max()), int((lo + shapes)[:, 1].max()))
        values = np.arange(1.0, int(np.prod(shapes, axis=1).sum()) + 1)
        out = np.asmatrix(np.zeros(full))
        placement.place_pieces(values, lo, shapes, out)
        np.testing.assert_array_equal(np.asarray(out), _assigned(full, values, lo, shapes))


def test_pieces_of_many_shapes_are_grouped_once(monkeypatch):
    """Pieces of many shapes (a particle array cut in blocks of every row count) are sorted
    into groups once and the pieces of small groups placed in one pass, not a pass over every
    piece for each shape (which made 4,096 pieces of distinct shapes take seconds)."""
    from lamina.engines import placement

    passes = []
    real = placement._one_by_one

    def counted(values, at, shapes, ends, rows, out):
        passes.append(len(rows))
        real(values, at, shapes, ends, rows, out)

    monkeypatch.setattr(placement, "_one_by_one", counted)
    rng = np.random.default_rng(5)
    counts = rng.permutation(np.arange(1, 513))
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    at = np.stack([firsts, np.zeros_like(firsts)], 1).astype(np.int64)
    shapes = np.stack([counts, np.full_like(counts, 3)], 1).astype(np.int64)
    order = rng.permutation(len(counts))
    at, shapes = at[order], shapes[order]
    values = rng.random(int(counts.sum()) * 3)
    out = np.zeros((int(counts.sum()), 3))
    placement.place_pieces(values, at, shapes, out)
    assert passes == [len(counts)]
    np.testing.assert_array_equal(out, _assigned(out.shape, values, at, shapes))
