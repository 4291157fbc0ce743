"""Many blocks per call (``Dataset.write_blocks``, ``Engine.put_many``).

The round trips (every engine, 2 writers and 3 readers under mpiexec) are
the ``WriteBlocks`` cases of :mod:`lamina.testing.cases`.  Here: the
overlap index against a brute-force oracle, a batch stores exactly what
single writes store, and the layers (background I/O, derived quantities).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import lamina
from lamina.catalog import DatasetSpec
from lamina.catalog.blocks import stat_dtype, sum_dtype
from lamina.engines import staging
from lamina.engines.staging import BoxIndex, enter_box, enter_boxes
from lamina.errors import OverlapError
from lamina.geometry import Box
from lamina.testing.cases import check_extents

pytestmark = pytest.mark.usefixtures("fast_native")

SHAPE = (12, 10)


def _meets(a: tuple, b: tuple) -> bool:
    return all(s < u and t < e for s, e, t, u in zip(a[0], a[1], b[0], b[1], strict=True))


def _enter_one(idx: dict, spec: DatasetSpec, box: tuple, entered: list) -> None:
    """Enter one box; it must be refused exactly when it meets a box of *entered* (the oracle)."""
    clash = any(_meets(box, e) for e in entered)
    try:
        enter_box(idx, spec, Box(*box), 0)
    except OverlapError:
        assert clash
    else:
        assert not clash
        entered.append(box)


@st.composite
def boxes(draw, aligned: bool):
    if aligned:  # the cells of a grid of 2 x 2 boxes (what programs write), sometimes smaller
        x, y = draw(st.integers(0, 5)) * 2, draw(st.integers(0, 4)) * 2
        w, h = draw(st.sampled_from([(2, 2), (2, 2), (1, 2), (2, 1)]))
        return (x, y), (x + w, y + h)
    x, y = draw(st.integers(0, 11)), draw(st.integers(0, 9))
    return (x, y), (draw(st.integers(x + 1, 12)), draw(st.integers(y + 1, 10)))


@st.composite
def programs(draw):
    """A step's puts: single boxes and batches, aligned or not."""
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        aligned = draw(st.booleans())
        if draw(st.booleans()):
            ops.append(("one", [draw(boxes(aligned))]))
        else:
            ops.append(("many", draw(st.lists(boxes(aligned), min_size=1, max_size=30))))
    return ops


@settings(max_examples=300, deadline=None)
@given(prog=programs(), lazy=st.sampled_from([1, 3, 256]))
def test_overlap_index_agrees_with_brute_force(prog, lazy):
    """A batch is entered whole or not at all; it is refused exactly when a box of it meets an
    entered box or an earlier box of the batch, and the pair named does meet."""
    _agrees_with_brute_force(prog, lazy)


@st.composite
def slabs(draw):
    """A first batch of slabs of uneven widths across the domain along one axis, in any order
    (a particle array cut in blocks), sometimes with one slab stretched into the next."""
    axis = draw(st.integers(0, 1))
    n = SHAPE[axis]
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=n - 1))))
    edges = [0, *cuts, n]
    out = []
    for a, b in zip(edges, edges[1:], strict=False):
        lo, hi = [0, 0], list(SHAPE)
        lo[axis], hi[axis] = a, b
        out.append((tuple(lo), tuple(hi)))
    if len(out) > 1 and draw(st.booleans()):  # one slab reaches into the next: refused
        k = draw(st.integers(0, len(out) - 2))
        lo, hi = out[k]
        hi = list(hi)
        hi[axis] += 1
        out[k] = (lo, tuple(hi))
    return draw(st.permutations(out))


@settings(max_examples=200, deadline=None)
@given(first=slabs(), prog=programs(), lazy=st.sampled_from([1, 3]))
def test_a_first_batch_found_apart_by_a_sweep_agrees_with_brute_force(first, prog, lazy):
    """The step's first batch of uneven slabs is kept as arrays once a sweep finds them apart
    along an axis; what comes after it meets them exactly as brute force says."""
    _agrees_with_brute_force([("many", list(first)), *prog], lazy)


def _agrees_with_brute_force(prog, lazy) -> None:
    old = staging.BoxIndex.LAZY_BATCH
    staging.BoxIndex.LAZY_BATCH = lazy  # small: the numpy path sees hypothesis-sized batches
    try:
        spec = DatasetSpec(path="d", shape=SHAPE, dtype=np.dtype("f8"), id=0)
        idx: dict[int, BoxIndex] = {}
        entered: list[tuple] = []
        for kind, bs in prog:
            if kind == "one":
                _enter_one(idx, spec, bs[0], entered)
                continue
            starts = np.array([s for s, _ in bs], dtype=np.int64)
            stops = np.array([e for _, e in bs], dtype=np.int64)
            clash = any(
                any(_meets(bs[k], e) for e in entered)
                or any(_meets(bs[k], bs[j]) for j in range(k))
                for k in range(len(bs))
            )
            try:
                enter_boxes(idx, spec, starts, stops, 0)
            except OverlapError as e:
                assert clash, e
                assert "overlaps box" in str(e)
            else:
                assert not clash
                entered.extend(bs)
            assert idx[0].n == len(entered)
        # what was entered is what later puts meet: every entered box is refused again
        for a, b in entered:
            with pytest.raises(OverlapError):
                enter_box(idx, spec, Box(a, b), 0)
        # and popping takes the last ones out again
        index = idx.get(0)
        if index is not None and entered:
            index.pop()
            enter_box(idx, spec, Box(*entered[-1]), 0)
    finally:
        staging.BoxIndex.LAZY_BATCH = old


@st.composite
def boxes_nd(draw, ndim: int):
    """A box of a small domain of *ndim* dimensions, often on a grid of 3-cell edges."""
    start, stop = [], []
    for _ in range(ndim):
        if draw(st.booleans()):
            a = draw(st.integers(0, 3)) * 3
            b = a + draw(st.sampled_from([3, 3, 1, 5]))
        else:
            a = draw(st.integers(0, 11))
            b = draw(st.integers(a + 1, 14))
        start.append(a)
        stop.append(b)
    return tuple(start), tuple(stop)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), ndim=st.sampled_from([1, 3, 4]))
def test_overlap_index_of_one_three_and_four_dimensions_agrees_with_brute_force(data, ndim):
    """Single puts in 1-D, 3-D and 4-D (each with its own way of numbering cells): refused
    exactly when they meet an entered box."""
    spec = DatasetSpec(path="d", shape=(14,) * ndim, dtype=np.dtype("f8"), id=0)
    idx: dict[int, BoxIndex] = {}
    entered: list[tuple] = []
    for box in data.draw(st.lists(boxes_nd(ndim), min_size=1, max_size=40)):
        _enter_one(idx, spec, box, entered)


def test_a_batch_like_the_last_steps_is_entered_as_it_was(monkeypatch):
    """The first batch of a step that holds the boxes of the step before's (a new index each
    step) is entered with the cells found then; the index then refuses what it would have
    refused, and a batch that differs in one box is judged on its own."""
    monkeypatch.setattr(staging, "_lazy_last", None)
    spec = DatasetSpec(path="d", shape=(16, 16, 16), dtype=np.dtype("f8"), id=0)
    starts = _grid((16, 16, 16), (4, 4, 4))
    stops = starts + 4
    first: dict[int, BoxIndex] = {}
    enter_boxes(first, spec, starts.copy(), stops.copy(), 0)
    kept = staging._lazy_last
    assert kept is not None and first[0].keys is kept[1]
    again: dict[int, BoxIndex] = {}
    enter_boxes(again, spec, starts.copy(), stops.copy(), 1)
    assert again[0].keys is kept[1] and again[0].n == len(starts)
    with pytest.raises(OverlapError, match="overlaps box"):
        enter_box(again, spec, Box((5, 5, 5), (6, 6, 6)), 1)
    moved = starts.copy()
    moved[7] = moved[6] + (0, 0, 1)  # block 7 now meets block 6
    with pytest.raises(OverlapError, match="overlaps box"):
        enter_boxes({}, spec, moved, moved + 4, 2)


def _grid(shape, edge):
    idx = np.stack(
        np.meshgrid(*(np.arange(0, n, e) for n, e in zip(shape, edge, strict=True)), indexing="ij"),
        -1,
    )
    return idx.reshape(-1, len(shape))


@pytest.mark.parametrize("edge", [(2, 3, 4), (32, 24, 16)])  # staged in chunks; stored on their own
def test_a_batch_stores_what_single_writes_store(tmp_path, rng, edge):
    shape = (32, 48, 64)
    a = rng.standard_normal(shape)
    a[3, 4, 5] = np.nan
    corners = _grid(shape, edge)
    stacked = np.stack(
        [a[x : x + edge[0], y : y + edge[1], z : z + edge[2]] for x, y, z in corners]
    )
    tables = []
    for how in ("write", "write_blocks", "lent", "list"):
        path = str(tmp_path / f"{how}.lam")
        with lamina.open(path, "w", checksum_segment=262144) as f:
            ds = f.create_dataset("u", shape=shape, dtype="f8")
            for step in range(2):
                with f.step():
                    if how in ("write", "lent"):  # lent: small blocks staged at the commit
                        for b, c in zip(stacked + step, corners, strict=True):
                            ds.write(b, offset=c, copy=how == "write")
                    elif how == "list":  # separate arrays of one shape: staged like stacked ones
                        ds.write_blocks(list(stacked + step), corners)
                    else:
                        ds.write_blocks(stacked + step, corners)
        with lamina.open(path) as f:
            np.testing.assert_array_equal(f["u"].read(step=1), a + 1)
            check_extents(f, how)  # small blocks: one stream of a step's staged blocks
            blocks = f["u"].blocks(1)
            tables.append(
                [(b.box, b.stats, b.nbytes, b.offset, b.subfile, b.codec) for b in blocks]
            )
    assert tables[0] == tables[1] == tables[2] == tables[3]


def test_a_batch_of_small_blocks_of_uneven_shapes_stores_what_single_writes_store(tmp_path, rng):
    """Small blocks of several shapes in one call (a particle array cut in uneven blocks) are
    staged as many to a copy as a chunk holds: over several chunks (a step of 7 MiB), the same
    blocks, statistics, offsets and values as one write each."""
    shape = (96, 96, 96)
    cuts = [0]
    while cuts[-1] < shape[0]:
        cuts.append(min(shape[0], cuts[-1] + int(rng.integers(1, 3))))
    ycuts = [0, 40, 41, 96]
    a = rng.standard_normal(shape)
    a[3, 4, 5] = np.nan
    boxes = [
        ((x0, y0, z), (x1, y1, z + 32))
        for x0, x1 in zip(cuts, cuts[1:], strict=False)
        for y0, y1 in zip(ycuts, ycuts[1:], strict=False)
        for z in (0, 32, 64)
    ]
    order = rng.permutation(len(boxes))
    boxes = [boxes[k] for k in order]
    tables = []
    for how in ("write", "list"):
        path = str(tmp_path / f"{how}.lam")
        with lamina.open(path, "w") as f:
            ds = f.create_dataset("u", shape=shape, dtype="f8")
            for step in range(2):
                blocks = [a[tuple(map(slice, lo, hi))] + step for lo, hi in boxes]
                with f.step():
                    if how == "write":
                        for (lo, _), b in zip(boxes, blocks, strict=True):
                            ds.write(b, offset=lo)
                    else:
                        ds.write_blocks(blocks, [lo for lo, _ in boxes])
        with lamina.open(path) as f:
            np.testing.assert_array_equal(f["u"].read(step=1), a + 1)
            got = f["u"].blocks(1)
            tables.append([(b.box, b.stats, b.nbytes, b.offset, b.subfile, b.codec) for b in got])
    assert tables[0] == tables[1]


def test_lent_blocks_of_many_shapes_dtypes_and_datasets(tmp_path, rng):
    """Small blocks written with copy=False are kept until the commit, then entered and staged
    by dataset and shape: interleaved with copied, cast and large blocks, every value and
    statistic is what copied writes give, and the caller's arrays are not modified."""
    shape = (40, 36)
    a = rng.standard_normal(shape)
    a[5, 7] = np.nan
    b = rng.integers(-1000, 1000, size=shape).astype(np.int32)
    pieces = []  # (dataset, corner, block shape): rows of 2, 3 and 4, and one large block
    for x in range(0, 24, 4):
        for y in range(0, 36, 6):
            pieces.append(("a", (x, y), (4, 6)))
    for x in range(24, 40, 2):
        for y in range(0, 36, 3):
            pieces.append(("a", (x, y), (2, 3)))
    pieces.append(("b", (0, 0), (40, 36)))
    order = rng.permutation(len(pieces)).tolist()
    big = rng.standard_normal((200, 100))  # 160 KB: stored on its own even when lent
    tables = {}
    for how in ("copied", "lent"):
        path = str(tmp_path / f"{how}.lam")
        with lamina.open(path, "w") as f:
            da = f.create_dataset("a", shape=shape, dtype="f8")
            db = f.create_dataset("b", shape=shape, dtype="i8")
            f.create_dataset("big", shape=(200, 100), dtype="f8")
            kept = [a.copy(), b.copy()]
            with f.step():
                for n, k in enumerate(order):
                    name, (x, y), (h, w) = pieces[k]
                    src = a if name == "a" else b
                    blk = src[x : x + h, y : y + w]  # a view: not contiguous, copied by the cast
                    if n % 3 == 0:
                        blk = np.ascontiguousarray(blk)  # lent as it is
                    if name == "a" and n % 5 == 0:
                        blk = blk.astype("f4").astype("f8")
                        a[x : x + h, y : y + w] = blk
                    (da if name == "a" else db).write(blk, offset=(x, y), copy=how == "copied")
                    if n == len(order) // 2:
                        f["big"].write(big, copy=how == "copied")
            np.testing.assert_array_equal(b, kept[1])
        with lamina.open(path) as f:
            np.testing.assert_array_equal(f["a"][...], a)
            np.testing.assert_array_equal(f["b"][...], b)
            np.testing.assert_array_equal(f["big"][...], big)
            tables[how] = {
                name: sorted(
                    (bl.box.start, bl.box.stop, bl.stats, bl.nbytes) for bl in f[name].blocks(0)
                )
                for name in ("a", "b", "big")
            }
    assert tables["copied"] == tables["lent"]
    assert len(tables["lent"]["a"]) == len(pieces) - 1


def test_lent_blocks_overlap_is_found_at_end_step_and_the_step_dropped(tmp_path):
    """Lent blocks are checked for bounds at the write, for overlap at the commit: end_step
    raises OverlapError naming both boxes, the step is not committed, the file goes on."""
    path = str(tmp_path / "a.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", shape=(8, 8), dtype="f8", fill=-1.0)
        with f.step():
            ds.write(np.zeros((8, 8)), copy=False)
        f.begin_step()
        with pytest.raises(lamina.BoundsError, match=r"dataset 'u'"):
            ds.write(np.ones((2, 2)), offset=(7, 0), copy=False)  # at the write, lent or not
        with pytest.raises(
            lamina.BoundsError, match=r"dataset '/u' of shape \(8, 8\): offset \(-1, 0\)"
        ):
            ds.write(np.ones((2, 2)), offset=(-1, 0), copy=False)
        ds.write(np.ones((2, 2)), offset=(0, 0), copy=False)
        ds.write(np.ones((4, 4)), offset=(4, 4))  # copied: entered at once
        ds.write(np.ones((2, 2)), offset=(5, 5), copy=False)  # meets the copied block
        with pytest.raises(OverlapError, match=r"\[5:7, 5:7\] overlaps box \[4:8, 4:8\].*rank 0"):
            f.end_step()
        assert f.steps == 1 and not f.engine.in_step
        with f.step():  # nothing of the dropped step is left: the same boxes go in again
            ds.write(np.full((2, 2), 2.0), offset=(0, 0), copy=False)
            ds.write(np.full((2, 2), 3.0), offset=(5, 5), copy=False)
        with pytest.raises(RuntimeError):  # a step abandoned by an error forgets its lent blocks
            with f.step():
                ds.write(np.full((2, 2), 9.0), offset=(2, 2), copy=False)
                raise RuntimeError("the program fails inside the step")
        with f.step():
            ds.write(np.full((2, 2), 4.0), offset=(2, 2), copy=False)
    with lamina.open(path) as f:
        assert f.steps == 3
        want = np.full((8, 8), -1.0)
        want[0:2, 0:2], want[5:7, 5:7] = 2.0, 3.0
        np.testing.assert_array_equal(f["u"].read(step=1), want)
        want = np.full((8, 8), -1.0)
        want[2:4, 2:4] = 4.0
        np.testing.assert_array_equal(f["u"].read(step=2), want)


def test_a_single_lent_block_overlap_names_the_lent_write(tmp_path):
    """The one lent block of a dataset in a step is entered on its own at the commit: its
    overlap with a copied block is raised by end_step, saying it was written with copy=False."""
    path = str(tmp_path / "one.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", shape=(8, 8), dtype="f8", fill=-1.0)
        v = f.create_dataset("v", shape=(4,), dtype="f8")
        f.begin_step()
        ds.write(np.ones((4, 4)), offset=(4, 4))  # copied: entered at once
        v.write(np.ones(4), copy=False)  # another dataset's single lent block: no overlap
        ds.write(np.ones((2, 3)), offset=(5, 5), copy=False)  # the only lent block of u
        with pytest.raises(
            OverlapError, match=r"\[5:7, 5:8\] overlaps box \[4:8, 4:8\].*rank 0.*copy=False"
        ):
            f.end_step()
        assert f.steps == 0
        with f.step():
            ds.write(np.full((2, 3), 2.0), offset=(5, 5), copy=False)
    with lamina.open(path) as f:
        want = np.full((8, 8), -1.0)
        want[5:7, 5:8] = 2.0
        np.testing.assert_array_equal(f["u"].read(step=0), want)


@pytest.mark.parametrize("count", [2, 3, 15, 16, 40])
def test_a_few_lent_blocks_of_one_shape_that_overlap_are_refused(tmp_path, count):
    """Lent blocks of one shape, fewer than a batch entered with numpy or more: the last
    meets the first, and end_step raises OverlapError naming both; the step is dropped and
    the same blocks placed apart go in."""
    path = str(tmp_path / "few.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", shape=(2 * count, 4), dtype="f4", fill=-1)
        f.begin_step()
        for k in range(count - 1):
            ds.write(np.full((2, 4), k, "f4"), offset=(2 * k, 0), copy=False)
        ds.write(np.full((2, 4), 99, "f4"), offset=(1, 0), copy=False)  # meets blocks 0 and 1
        with pytest.raises(OverlapError, match=r"box \[1:3, 0:4\] overlaps box \[0:2, 0:4\]"):
            f.end_step()
        assert f.steps == 0
        with f.step():
            for k in range(count):
                ds.write(np.full((2, 4), k, "f4"), offset=(2 * k, 0), copy=False)
    with lamina.open(path) as f:
        assert f.steps == 1
        got = f["u"][...]
        np.testing.assert_array_equal(
            got, np.repeat(np.arange(count, dtype="f4"), 2)[:, None] + 0 * got
        )
        assert [b.stats.max for b in f["u"].blocks(0)] == list(range(count))


def test_lent_blocks_of_two_shapes_that_overlap_are_refused(tmp_path):
    """Two lent blocks of one dataset, of different shapes (each the only one of its shape),
    that overlap: end_step raises OverlapError naming both; a dataset's single lent block
    beside them goes in unchecked and is dropped with the step."""
    path = str(tmp_path / "two.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", shape=(4, 4), dtype="i8", fill=-1)
        v = f.create_dataset("v", shape=(4,), dtype="i8", fill=-1)
        f.begin_step()
        v.write(np.arange(4), copy=False)
        ds.write(np.arange(4).reshape(1, 4), offset=(1, 0), copy=False)
        ds.write(np.arange(4).reshape(2, 2), offset=(0, 2), copy=False)
        with pytest.raises(
            OverlapError, match=r"\[1:2, 0:4\].*\[0:2, 2:4\]|\[0:2, 2:4\].*\[1:2, 0:4\]"
        ):
            f.end_step()
        assert f.steps == 0
        with f.step():
            ds.write(np.arange(4).reshape(1, 4), offset=(1, 0), copy=False)
            ds.write(np.arange(4).reshape(2, 2), offset=(2, 2), copy=False)
    with lamina.open(path) as f:
        assert f.steps == 1
        want = np.full((4, 4), -1)
        want[1], want[2:4, 2:4] = np.arange(4), np.arange(4).reshape(2, 2)
        np.testing.assert_array_equal(f["u"][...], want)
        np.testing.assert_array_equal(f["v"][...], np.full(4, -1))


def test_batch_under_background_io_is_copied_or_frozen(tmp_path):
    path = str(tmp_path / "a.lam")
    stacked = np.arange(4 * 2 * 3, dtype="f8").reshape(4, 2, 3)
    corners = np.array([[0, 0], [2, 0], [4, 0], [6, 0]])
    with lamina.open(path, "w", io="async") as f:
        ds = f.create_dataset("x", (8, 3), "f8")
        with f.step():
            ds.write_blocks(stacked, corners)  # copied: the program may change its array at once
        stacked += 100
        with f.step():
            ds.write_blocks(stacked, corners, copy=False)  # lent: read-only until written
            assert not stacked.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                stacked[0, 0, 0] = -1
        f.wait()
        assert stacked.flags.writeable
        with f.step():
            with pytest.raises(OverlapError, match="block 1 of 2"):
                ds.write_blocks(np.zeros((2, 2, 3)), [[0, 0], [1, 0]])
            ds.write_blocks(
                np.zeros((2, 4, 3)), [[0, 0], [4, 0]]
            )  # the refused boxes may be written
    with lamina.open(path) as f:
        np.testing.assert_array_equal(f["x"].read(step=0), stacked.reshape(8, 3) - 100)
        np.testing.assert_array_equal(f["x"].read(step=1), stacked.reshape(8, 3))
        np.testing.assert_array_equal(f["x"].read(step=2), np.zeros((8, 3)))


@pytest.mark.parametrize("strategy", ["store", "stats", "expression"])
def test_derived_quantities_of_batched_inputs(tmp_path, rng, strategy):
    path = str(tmp_path / "d.lam")
    shape, edge = (8, 8, 8), (2, 4, 4)
    corners = _grid(shape, edge)
    comps = [rng.standard_normal(shape) for _ in range(3)]
    with lamina.open(path, "w") as f:
        for name in "xyz":
            f.create_dataset("v" + name, shape=shape, dtype="f8")
        f.derive("speed", "magnitude(vx, vy, vz)", strategy=strategy)
        with f.step():
            for name, c in zip("xyz", comps, strict=True):
                blocks = np.stack([c[x : x + 2, y : y + 4, z : z + 4] for x, y, z in corners])
                f["v" + name].write_blocks(blocks, corners)
    want = np.sqrt(sum(c * c for c in comps))
    with lamina.open(path) as f:
        np.testing.assert_allclose(f["speed"][...], want, rtol=1e-12)
        assert len(f["speed"].blocks()) == (0 if strategy == "expression" else len(corners))


def test_writing_a_derived_quantity_with_a_batch_is_refused(tmp_path):
    with lamina.open(str(tmp_path / "d.lam"), "w") as f:
        f.create_dataset("a", shape=(4,), dtype="f8")
        f.derive("b", "a * 2", strategy="store")
        with f.step():
            with pytest.raises(lamina.ModeError, match="derived"):
                f["b"].write_blocks(np.ones((2, 2)), [[0], [2]])
            f["a"].write_blocks(np.ones((2, 2)), [[0], [2]])


def test_read_only_file_refuses_a_batch(tmp_path):
    path = str(tmp_path / "r.lam")
    with lamina.open(path, "w") as f:
        f.create_dataset("a", shape=(4,), dtype="f8")
        with f.step():
            f["a"][...] = 1
    with lamina.open(path) as f, pytest.raises(lamina.ModeError):
        f["a"].write_blocks(np.ones((1, 4)), [[0]])


def test_empty_batches_and_empty_blocks(tmp_path):
    path = str(tmp_path / "e.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("a", shape=(6, 4), dtype="i2")
        with f.step():
            ds.write_blocks(np.zeros((0, 2, 4), "i2"), np.zeros((0, 2), "i8"))
            ds.write_blocks([], [])
            ds.write_blocks([np.ones((0, 4), "i2"), np.full((3, 4), 7, "i2")], [[0, 0], [3, 0]])
            ds.write_blocks(np.ones((3, 0, 4), "i2"), [[0, 0], [1, 0], [2, 0]])
    with lamina.open(path) as f:
        assert len(f["a"].blocks()) == 1
        np.testing.assert_array_equal(f["a"][3:], 7)
    # empty blocks at corners out of bounds: refused stacked as listed and as write() does
    # (the stacked form dropped them before the check)
    with lamina.open(path, "a") as f:
        ds = f["a"]
        for call in (
            lambda: ds.write_blocks(np.zeros((2, 0, 4), "i2"), [[7, 0], [0, 0]]),
            lambda: ds.write_blocks([np.zeros((0, 4), "i2")] * 2, [[7, 0], [0, 0]]),
            lambda: ds.write(np.zeros((0, 4), "i2"), offset=(7, 0)),
        ):
            with pytest.raises(lamina.BoundsError, match="out of bounds"):
                with f.step():
                    call()


def test_corners_near_the_int64_limit_are_refused_before_anything_is_stored(tmp_path):
    """A corner of 2^63 - 2 plus a block of 4 wrapped around int64 and passed the bounds
    check: the step committed a block table no read could take.  Now a BoundsError naming
    the dataset and the block (stacked or listed), and nothing committed is lost."""
    path = tmp_path / "o.lam"
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("d", (10,), "f8")
        with f.step():
            ds.write(np.full(10, 7.0))
        for blocks in (np.ones((1, 4)), [np.ones(4)]):
            with pytest.raises(lamina.BoundsError, match=r"dataset '/?d' \(block 0 of 1\)"):
                with f.step():
                    ds.write_blocks(blocks, np.array([[2**63 - 2]]))
        with pytest.raises(
            lamina.BoundsError, match=r"\(block 1 of 2\): corner \(-1,\) is negative"
        ):
            with f.step():
                ds.write_blocks(np.ones((2, 2)), [[0], [-1]])
        for bad in ([[0], [2, 3]], None, 0):
            with pytest.raises(lamina.ShapeError, match="block offsets must be an array of shape"):
                with f.step():
                    ds.write_blocks(np.ones((2, 2)), bad)
    with lamina.open(path) as f:
        assert f.steps == 1
        np.testing.assert_array_equal(f["d"][...], np.full(10, 7.0))


def test_zero_dim_dataset_and_bad_offsets(tmp_path):
    path = str(tmp_path / "z.lam")
    with lamina.open(path, "w") as f:
        s = f.create_dataset("s", shape=(), dtype="f8")
        v = f.create_dataset("v", shape=(4,), dtype="f8")
        with f.step():
            s.write_blocks(np.array([3.5]), [[]])  # one 0-D block at the only corner there is
            with pytest.raises(lamina.ShapeError, match="2 blocks but no offsets"):
                v.write_blocks(np.ones((2, 2)), [])
            with pytest.raises(lamina.ShapeError, match="2 blocks but 3 offsets"):
                v.write_blocks(np.ones((2, 2)), [[0], [2], [3]])
            with pytest.raises(TypeError, match="must be integers"):
                v.write_blocks(np.ones((2, 2)), [[0.5], [2]])
            with pytest.raises(TypeError, match="sequence of arrays"):
                v.write_blocks("ab", [[0]])
    with lamina.open(path) as f:
        assert f["s"][()] == 3.5 and f["s"].blocks(0)[0].stats.count == 1


@pytest.mark.parametrize("layout", ["mixed", "staged", "gap"])
def test_log_views_give_each_rows_bytes_in_order(rng, layout):
    """The bytes a commit sends for a set of rows: staged batches, staged single blocks, blocks
    kept apart (payloads) and two datasets interleaved, whole or in part, in row order.
    "staged": every row in a chunk, in order (one view per chunk, no look at each row);
    "gap": a block kept apart between two chunks."""
    log = staging.PutLog()
    want: dict[int, bytes] = {}
    chunk = staging.Chunk(1 << 12)
    log.chunks.append(chunk)

    def batch(did: int, n: int, c: staging.Chunk) -> None:
        data = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        starts = np.zeros((n, 1), dtype=np.int64)
        first = log.add_many(did, starts, starts + 16, 16, 0)
        log.stage_run(first, n, 16, np.dtype("u1"), data.reshape(-1), c)
        for k in range(n):
            want[first + k] = data[k].tobytes()

    def single(did: int, staged: bool) -> None:
        arr = rng.integers(0, 256, 8, dtype=np.uint8)
        row = len(log)
        if staged:
            log.add_staged(did, (0,), (8,), arr, chunk)
        else:
            log.add(did, (0,), (8,), 8, 0, payload=arr)
        want[row] = arr.tobytes()

    batch(0, 5, chunk)
    if layout == "gap":
        single(0, False)
        chunk = staging.Chunk(1 << 12)
        log.chunks.append(chunk)
    single(0, True)
    if layout == "mixed":
        single(0, False)  # kept apart: the rows around it are in one chunk, not one run of bytes
    batch(0, 3, chunk)
    later = staging.Chunk(1 << 12)
    log.chunks.append(later)
    batch(0, 4, later)
    if layout == "mixed":
        batch(1, 2, later)  # another dataset between
    batch(0, 2, later)
    n = len(log)
    rows_of = {d: [r for r in range(n) if log.ds[r] == d] for d in (0, 1)}
    cases = [list(range(n)), rows_of[0], rows_of[1], list(range(0, 6)), list(range(7, 14))]
    cases += [list(range(9, n)), list(range(6, 7)), [0, 2, 9]]
    for rows in cases:
        views = log.views(rows)
        got = b"".join(bytes(v) for v in views)
        assert got == b"".join(want[r] for r in rows), rows
        if layout == "staged" and rows == list(range(n)):
            assert len(views) == 2  # one per chunk


def _same_columns(a, b, what: str) -> None:
    a = a if isinstance(a, tuple) else tuple(getattr(a, f) for f in a.__slots__)
    b = b if isinstance(b, tuple) else tuple(getattr(b, f) for f in b.__slots__)
    assert len(a) == len(b), what
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if x is None or y is None:
            assert x is None and y is None, f"{what}: column {k}"
            continue
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what}: column {k}"
        assert np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"), f"{what}: column {k}"


def test_one_rank_commit_hands_over_what_other_ranks_decode(tmp_path):
    """On one rank the commit skips the bytes between ranks: the heads and trailer it keeps
    must be exactly what packing and unpacking them gives (dtypes included)."""
    rng = np.random.default_rng(7)
    f = lamina.open(tmp_path / "h.lam", "w", durable=False)
    u = f.create_dataset("u", (64, 8), np.float32)
    v = f.create_dataset("v", (4, 4, 40000), np.float64)
    w = f.create_dataset("w", (), np.int32)  # 0-D
    z = f.create_dataset("z", (64,), np.float64, compression="zstd")  # encoded blocks
    f.create_dataset("none", (0, 5), np.float32)  # nothing written
    u.attrs["units"] = "m"
    f.begin_step()
    w.write(np.int32(5))
    z.write(np.zeros(64))
    u.write_blocks(rng.random((8, 4, 8), dtype=np.float32), np.arange(8)[:, None] * [4, 0])
    u.write(np.full((4, 8), np.nan, np.float32), offset=(40, 0))
    v.write(rng.random((1, 4, 40000)), offset=(0, 0, 0))  # large: placed at put, a job of its own
    v.write(rng.random((1, 1, 5)), offset=(3, 3, 0))
    eng = f._engine
    while hasattr(eng, "inner"):
        eng = eng.inner
    digest, attrs, mine = eng._local_heads()
    d2, a2, m2 = eng._unpack_heads(0, eng._pack_heads(digest, attrs, mine))
    assert (d2, a2) == (digest, attrs) and len(set(mine.did.tolist())) == 4
    assert mine.start.shape == (len(mine.did), 3)  # the widest dataset's boxes
    _same_columns(mine, m2, "heads")
    bases = [(0, 1, 2, 3)]
    placed, cols = eng._local_trailer(bases)
    p2, c2 = eng._unpack_trailer(0, eng._pack_trailer(placed, cols))
    assert p2 == placed == bases
    _same_columns(cols, c2, "trailer")
    f.end_step()
    f.close()
    with lamina.open(tmp_path / "h.lam") as r:
        assert r["u"].attrs["units"] == "m"
        assert np.isnan(r["u"][40:44]).all() and r["v"].read(step=0)[3, 3, :5].size == 5
        assert int(r["w"][()]) == 5 and not r["z"][...].any()
        check_extents(r)  # staged blocks, one placed at put, encoded ones


def test_heads_and_trailers_that_cannot_be_this_steps_are_errors(tmp_path):
    """Another rank's heads naming a dataset this rank does not know, boxes narrower than
    their dataset, cut bytes, or a trailer whose checksum counts do not add up: each a clear
    error (the commit then fails on every rank), never a wrong record."""
    from lamina.catalog.wire import Decoder, Encoder
    from lamina.errors import CollectiveMismatchError, FormatError

    f = lamina.open(tmp_path / "b.lam", "w", durable=False)
    u = f.create_dataset("u", (64, 8), np.float32)
    f.begin_step()
    u.write(np.ones((4, 8), np.float32), offset=(0, 0))
    u.write(np.ones((4, 8), np.float32), offset=(8, 0))
    eng = f._engine
    while hasattr(eng, "inner"):
        eng = eng.inner
    digest, attrs, mine = eng._local_heads()
    good = eng._pack_heads(digest, attrs, mine)
    eng._unpack_heads(1, good)
    d = Decoder(good)
    d.u64(), d.blob(), d.u32(), d.u32()  # digest (and step count), attributes, blocks, width
    at = d.pos  # the dataset column
    bad = bytearray(good)
    bad[at : at + 8] = np.int64(7).tobytes()
    with pytest.raises(CollectiveMismatchError, match="rank 1 wrote dataset id 7, unknown"):
        eng._unpack_heads(1, bytes(bad))
    narrow = bytearray(good)
    narrow[at - 4 : at] = np.uint32(1).tobytes()  # boxes of 1 dimension for a 2-D dataset
    with pytest.raises(FormatError, match="narrower than their datasets"):
        eng._unpack_heads(1, bytes(narrow))
    with pytest.raises(FormatError, match="step heads from rank 1"):
        eng._unpack_heads(1, good[:-3])
    with pytest.raises(FormatError, match="trailing bytes"):
        eng._unpack_heads(1, good + b"x")
    placed, cols = eng._local_trailer([])
    raw = eng._pack_trailer(placed, cols)
    eng._unpack_trailer(1, raw)
    e = Encoder()
    e.u32(0)
    e.u32(2)
    e.u64(3)  # three checksums claimed, the counts say two
    bogus = e.getvalue() + raw[len(e.getvalue()) :] + np.uint32(0).tobytes()
    with pytest.raises(FormatError, match="checksum counts do not add up"):
        eng._unpack_trailer(1, bogus)
    f.end_step()
    f.close()
    with lamina.open(tmp_path / "b.lam") as r:
        assert r["u"][0:4].sum() == 32 and r["u"][8:12].sum() == 32


def test_statistics_of_a_step_by_dataset_match_those_of_each_dataset(tmp_path):
    """The commit takes the statistics and checksums of every block of the step from one
    pass (``step_stats``: min and max as their 8 bytes, sums complex where any dataset is):
    each dataset's rows hold the columns ``stats_columns`` gives it alone, for staged,
    lent, batched, encoded, 0-D and large blocks of several checksum segments, of float,
    integer, bool and complex dtypes."""
    rng = np.random.default_rng(11)
    f = lamina.open(tmp_path / "s.lam", "w", durable=False, checksum_segment=1 << 20)
    u = f.create_dataset("u", (64, 8), np.float32)
    big = f.create_dataset("big", (2, 400000), np.float64)  # 3.2 MB a block: 4 segments
    i = f.create_dataset("i", (32,), np.int16)
    b = f.create_dataset("b", (16,), np.bool_)
    c = f.create_dataset("c", (8,), np.complex64)
    w = f.create_dataset("w", (), np.uint8)  # 0-D
    z = f.create_dataset("z", (64,), np.float64, compression="zstd")  # encoded
    f.begin_step()
    u.write_blocks(rng.random((8, 4, 8), dtype=np.float32), np.arange(8)[:, None] * [4, 0])
    u.write(np.full((4, 8), np.nan, np.float32), offset=(40, 0), copy=False)
    big.write(rng.random((1, 400000)), offset=(0, 0))
    big.write(rng.random((1, 400000)), offset=(1, 0), copy=False)
    i.write(np.arange(-8, 8, dtype=np.int16), offset=(16,), copy=False)
    i.write(np.arange(16, dtype=np.int16))
    b.write(np.arange(16) % 3 == 0, copy=False)
    c.write((rng.random(8) + 1j * rng.random(8)).astype(np.complex64), copy=False)
    w.write(np.uint8(200))
    z.write(np.zeros(64))
    eng = f._engine
    while hasattr(eng, "inner"):
        eng = eng.inner
    eng._local_heads()  # stages the lent blocks, starts the last chunk's statistics
    log = eng._log
    specs = eng.catalog.specs
    for checksum, stats in ((True, True), (True, False), (False, True)):
        step = log.step_stats(
            {did: specs[did].dtype for did in log.rows}, eng.segment, checksum, stats
        )
        segs, ncrc, crcs, has, smin, smax, ssum, count = step
        assert len(log.rows) == 7 and all(len(c) == len(log) for c in step if c is not crcs)
        ptr = np.concatenate(([0], np.cumsum(ncrc)))
        for did, rows in log.rows.items():
            dt = specs[did].dtype
            sd, md = stat_dtype(dt), sum_dtype(dt)
            mine = (
                segs[rows],
                ncrc[rows],
                np.concatenate([crcs[int(ptr[r]) : int(ptr[r + 1])] for r in rows]),
                has[rows],
                smin[rows].view(sd),
                smax[rows].view(sd),
                ssum[rows].astype(md) if md.kind == "c" else ssum[rows].real.astype(md),
                count[rows],
            )
            want = log.stats_columns(did, dt, eng.segment, checksum, stats)
            _same_columns(mine, want, f"dataset {specs[did].path} ({checksum=}, {stats=})")
        big = log.rows[eng.catalog.datasets["big"].id]
        assert ncrc[big].tolist() == ([4, 4] if checksum else [1, 1])  # 3.2 MB in 1 MiB segments
    f.end_step()
    f.close()
    with lamina.open(tmp_path / "s.lam") as r:
        assert r["i"][16:].tolist() == list(range(-8, 8)) and r["b"][...].sum() == 6


@given(st.integers(1, 12), st.integers(1, 3), st.integers(0, 2**31))
def test_hulls_apart_against_brute_force(nranks, nd, seed):
    """The commit skips the cross-rank sweep only when the boxes around each rank's blocks
    are pairwise disjoint (ranks without blocks count for nothing); few ranks are compared
    pair by pair, many by the sweep."""
    from lamina.engines.block import _hulls_apart

    rng = np.random.default_rng(seed)
    heads, hulls = [], []
    for _ in range(nranks):
        # a few blocks or more than 16 (their hulls: cols_min and cols_max)
        n = int(rng.integers(0, 4)) if rng.random() < 0.8 else int(rng.integers(17, 24))
        if rng.random() < 0.5:  # cells of a grid: hulls that touch without meeting
            lo = rng.integers(0, 4, (n, nd)) * 5
            hi = lo + 5
        else:
            lo = rng.integers(0, 20, (n, nd))
            hi = lo + rng.integers(1, 6, (n, nd))
        heads.append((lo, hi))
        if n:
            hulls.append((lo.min(axis=0), hi.max(axis=0)))
    meet = any(
        bool(np.all(a0 < b1) and np.all(b0 < a1))
        for i, (a0, a1) in enumerate(hulls)
        for b0, b1 in hulls[:i]
    )
    assert _hulls_apart(heads) == (not meet)


def test_hulls_apart_touching_is_apart_and_empty_ranks_count_for_nothing():
    from lamina.engines.block import _hulls_apart

    def head(*boxes):
        lo = np.array([b[0] for b in boxes], dtype=np.int64).reshape(len(boxes), -1)
        hi = np.array([b[1] for b in boxes], dtype=np.int64).reshape(len(boxes), -1)
        return lo, hi

    left, right = head(((0, 0), (4, 4)), ((0, 4), (4, 8))), head(((4, 0), (8, 8)))
    empty = np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64)
    assert _hulls_apart([left, right, empty])
    assert _hulls_apart([right, left])
    assert not _hulls_apart([left, head(((3, 7), (5, 9)))])
    # interleaved blocks: the hulls meet though no block does (the sweep decides then)
    assert not _hulls_apart([head(((0, 0), (1, 1)), ((2, 2), (3, 3))), head(((1, 1), (2, 2)))])


def test_lent_arrays_are_read_only_until_the_step_is_committed(tmp_path):
    """A lent array cannot be changed before its step is committed (a change would be stored
    silently otherwise); it is writeable again after the commit, a failed commit or a
    discarded step; one that was read-only stays so; a cast copy leaves the array alone."""
    path = str(tmp_path / "a.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", shape=(8, 8), dtype="f8")
        a, b = np.ones((2, 2)), np.full((2, 2), 2.0)
        ro = np.full((2, 2), 3.0)
        ro.flags.writeable = False
        f32 = np.full((2, 2), 4.0, dtype="f4")  # cast: lamina lends its own copy
        with f.step():
            ds.write(a, offset=(0, 0), copy=False)
            ds.write(a, offset=(2, 2), copy=False)  # the same array twice
            ds.write(ro, offset=(4, 4), copy=False)
            ds.write(f32, offset=(6, 6), copy=False)
            with pytest.raises(ValueError, match="read-only"):
                a[0, 0] = 9.0
            f32[0, 0] = 5.0  # not lent itself: stored as it was at the write
        assert a.flags.writeable and not ro.flags.writeable and f32.flags.writeable
        f.begin_step()
        ds.write(b, offset=(0, 0), copy=False)
        ds.write(a, offset=(1, 1), copy=False)  # overlaps b: the commit fails
        with pytest.raises(OverlapError):
            f.end_step()
        assert a.flags.writeable and b.flags.writeable
        with pytest.raises(RuntimeError), f.step():
            ds.write(b, offset=(0, 0), copy=False)
            raise RuntimeError("the program fails inside the step")
        assert b.flags.writeable
    with lamina.open(path) as f:
        got = f["u"].read(step=0)
        np.testing.assert_array_equal(got[0:2, 0:2], 1.0)
        np.testing.assert_array_equal(got[2:4, 2:4], 1.0)
        np.testing.assert_array_equal(got[4:6, 4:6], 3.0)
        np.testing.assert_array_equal(got[6:8, 6:8], 4.0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.booleans(), st.integers(1, 3)), min_size=1, max_size=30
    )
)
def test_log_boxes_of_every_row_are_each_datasets_boxes(puts):
    """The commit takes every row's box at once (datasets of single puts joined by ndim,
    then placed), padded to the widest dataset; each dataset's rows hold what ``boxes``
    alone gives, in put order, and zeros past its own dimensions, whatever mix of single
    puts and batches, of datasets of 1-3 dimensions, came."""
    ndim = {did: 1 + did % 3 for did in range(5)}
    logs = (staging.PutLog(), staging.PutLog())
    for k, (did, batched, n) in enumerate(puts):
        nd = ndim[did]
        starts = np.arange(n * nd, dtype=np.int64).reshape(n, nd) + 100 * k
        for log in logs:
            if batched:
                log.add_many(did, starts, starts + 2, 8, 0)
            else:
                for s in starts:
                    log.add(did, tuple(s.tolist()), tuple((s + 1).tolist()), 8, 0)
    asked = {did: ndim[did] for did in logs[0].rows}
    width = max(asked.values())
    start, stop = logs[0].boxes_by_row(asked, width)
    assert start.dtype == stop.dtype == np.int64
    assert start.shape == stop.shape == (len(logs[0]), width)
    for did, nd in asked.items():
        rows = logs[1].rows[did]
        want = logs[1].boxes(did, nd)
        np.testing.assert_array_equal(start[rows, :nd], want[0])
        np.testing.assert_array_equal(stop[rows, :nd], want[1])
        assert not start[rows, nd:].any() and not stop[rows, nd:].any()
    # and asked again (a commit that is retried): the same
    again = logs[0].boxes_by_row(asked, width)
    np.testing.assert_array_equal(again[0], start)
    np.testing.assert_array_equal(again[1], stop)


def _innermost(f) -> lamina.engines.base.Engine:
    return f.engine.stack()[-1]


def _noting(put, boxes: list):
    """*put*, noting the box of every call in *boxes*."""

    def noted(name, box, array, copy=True):
        boxes.append(box)
        put(name, box, array, copy)

    return noted


@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_lent_writes_are_kept_without_put_and_store_what_put_stores(tmp_path, rng, ndim):
    """A small raw block lent at a corner of ints (a tuple or a list) is kept by the engine
    without going through ``put`` (``Engine.lend``); corners of numpy ints, arrays of another
    dtype and the first write of a dataset go through ``put``.  Both store the same values,
    statistics and boxes as copied writes."""
    edge = 2
    shape = (4,) * ndim
    data = rng.standard_normal(shape)
    corners = [tuple(edge * v for v in c) for c in np.ndindex(*(n // edge for n in shape))]
    kinds = [tuple, list, tuple, np.array, lambda c: tuple(np.int64(v) for v in c)]
    tables = {}
    for how in ("copied", "lent"):
        path = str(tmp_path / f"{how}.lam")
        with lamina.open(path, "w") as f:
            ds = f.create_dataset("u", shape=shape, dtype="f8")
            inner = _innermost(f)
            puts: list[Box] = []
            inner.put = _noting(inner.put, puts)
            with f.step():
                for k, c in enumerate(corners):
                    blk = np.ascontiguousarray(data[tuple(slice(a, a + edge) for a in c)])
                    if k % 7 == 3:
                        blk = blk.astype("f4")  # cast by put: not lent
                    ds.write(blk, offset=kinds[k % len(kinds)](c), copy=how == "copied")
            through = range(len(corners))  # copied: every write
            if how == "lent":  # the first write and those lend cannot keep
                through = [
                    k
                    for k in through
                    if k == 0 or k % 7 == 3 or k % len(kinds) in (3, 4)  # cast, numpy corners
                ]
            assert [b.start for b in puts] == [corners[k] for k in through]
        data32 = data.copy()
        for k, c in enumerate(corners):
            if k % 7 == 3:
                sel = tuple(slice(a, a + edge) for a in c)
                data32[sel] = data32[sel].astype("f4")
        with lamina.open(path) as f:
            np.testing.assert_array_equal(f["u"][...], data32)
            tables[how] = sorted(
                (b.box.start, b.box.stop, b.stats, b.nbytes) for b in f["u"].blocks(0)
            )
    assert tables["copied"] == tables["lent"]


def test_no_block_is_lent_past_a_layer_that_changes_writes(tmp_path, rng):
    """The derived layer with a quantity defined, and background I/O while it is active, take
    every write through their own ``put``: the quantity is computed, the array is frozen
    until its step is on disk; without them, lent blocks reach the engine directly."""
    shape = (4, 4)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    path = str(tmp_path / "d.lam")
    with lamina.open(path, "w") as f:
        for n in ("a", "b"):
            f.create_dataset(n, shape=shape, dtype="f8")
        f.derive("s", "a + b", strategy="store")
        assert not f.engine.lend("a", (0, 0), a[:2].copy())
        with f.step():
            for x in (0, 2):
                f["a"].write(np.ascontiguousarray(a[x : x + 2]), offset=(x, 0), copy=False)
                f["b"].write(np.ascontiguousarray(b[x : x + 2]), offset=(x, 0), copy=False)
    with lamina.open(path) as f:
        np.testing.assert_array_equal(f["s"][...], a + b)
    path = str(tmp_path / "bg.lam")
    with lamina.open(path, "w", io="async") as f:
        ds = f.create_dataset("u", shape=shape, dtype="f8")
        blocks = [np.ascontiguousarray(a[x : x + 2]) for x in (0, 2)]
        with f.step():
            ds.write(blocks[0], offset=(0, 0), copy=False)
            assert not f.engine.lend("u", (2, 0), blocks[1])
            ds.write(blocks[1], offset=(2, 0), copy=False)
            assert not blocks[1].flags.writeable  # the layer's own freeze, until on disk
        f.wait()
        assert blocks[1].flags.writeable
    with lamina.open(path) as f:
        np.testing.assert_array_equal(f["u"][...], a)
    with lamina.open(str(tmp_path / "plain.lam"), "w") as f:
        ds = f.create_dataset("u", shape=shape, dtype="f8")
        with f.step():
            ds.write(blocks[0], offset=(0, 0), copy=False)  # the first: through put
            assert f.engine.lend("u", (2, 0), blocks[1])
            assert not blocks[1].flags.writeable
            spare = np.ones((2, 4))
            for corner in ((3, 0), (-1, 0), (0, 1)):  # out of bounds: left to put, which refuses
                assert not f.engine.lend("u", corner, spare)
                with pytest.raises(lamina.BoundsError, match="'/?u'"):
                    ds.write(spare, offset=corner, copy=False)
            assert spare.flags.writeable
        assert blocks[1].flags.writeable


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([3, 3, 1, 2, 4]).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-2, 6), min_size=n, max_size=n),
            st.lists(st.integers(0, 3), min_size=n, max_size=n).filter(lambda s: 0 not in s)
            | st.just([0] * n),
            st.lists(st.integers(-1, 1), min_size=n, max_size=n),  # extent - (start + shape)
            st.none() | st.tuples(st.integers(0, n - 1), st.sampled_from([np.int64, float, bool])),
            st.integers(-1, 1),  # the corner one entry off in length
        )
    )
)
@example(([1, 2, 3], [2, 2, 2], [0, 1, 0], (2, float), 0))  # a 3-D corner within bounds
@example(([1, 2, 3], [2, 2, 2], [0, 1, 0], (1, np.int64), 0))
@example(([1, 2, 3], [2, 2, 2], [0, 1, 0], (0, bool), 0))
@example(([1, 2, 3], [2, 2, 2], [0, 0, 0], None, 0))
def test_lent_blocks_take_what_fits_says(case):
    """LentBlocks.take keeps a block exactly when it has bytes and geometry.fits says its
    corner is of ints and within the extent (3-D corners are tested by take itself)."""
    from lamina.geometry import fits

    start, shape, slack, odd, off = case
    extent = tuple(max(0, a + x + d) for a, x, d in zip(start, shape, slack, strict=True))
    if odd is not None:  # one entry of the corner not a Python int
        j, kind = odd
        start[j] = kind(start[j])
    start = tuple(start)
    if off < 0:
        start = start[:-1]
    elif off > 0:
        start = (*start, 0)
    arr = np.ones(tuple(shape))
    spec = DatasetSpec("u", extent, np.dtype("f8"))
    lent = staging.LentBlocks()
    want = arr.size > 0 and fits(start, arr.shape, extent)
    assert lent.take(spec, start, arr) is want
    assert len(lent) == int(want) and arr.flags.writeable is not want
    lent.thaw()
    assert arr.flags.writeable


def test_a_lent_write_at_the_origin_is_kept_without_put(tmp_path):
    """``ds.write(a, copy=False)`` with no offset (a dataset written whole each step) is lent
    at the origin: after the first step's write through ``put``, no write calls it."""
    path = str(tmp_path / "o.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", shape=(3, 4), dtype="f8")
        puts: list[Box] = []
        inner = _innermost(f)
        inner.put = _noting(inner.put, puts)
        for s in range(3):
            with f.step():
                ds.write(np.full((3, 4), float(s)), copy=False)
        assert [b.start for b in puts] == [(0, 0)]
        with f.step(), pytest.raises(lamina.ShapeError, match="dimensions"):
            ds.write(np.ones(4), copy=False)  # of another rank of array: left to put, which refuses
    with lamina.open(path) as f:
        assert [float(f["u"].read(step=s)[2, 3]) for s in range(3)] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "edge, threaded", [(4, False), (8, False), (16, True)], ids=["512B", "4KiB", "32KiB"]
)
def test_chunks_of_small_blocks_are_summarized_on_the_program_s_thread(
    tmp_path, rng, edge, threaded, monkeypatch
):
    """A staging chunk of blocks smaller than FAST_MIN on average is summarized where it is
    sealed (their checksums hold the interpreter lock); one of larger blocks goes to the
    worker thread.  Either way the statistics are the blocks' own."""
    from lamina import stats

    where: list[bool] = []
    start = staging.Chunk.start

    def spy(self, lengths, offsets, checksum, background):
        where.append(background)
        start(self, lengths, offsets, checksum, background)

    monkeypatch.setattr(staging.Chunk, "start", spy)
    n = (2 * stats.BACKGROUND_MIN) // (8 * edge**3)  # 2 MiB of float64 blocks
    blocks = rng.random((n, edge, edge, edge))
    with lamina.open(str(tmp_path / "c.lam"), "w", durable=False) as f:
        ds = f.create_dataset("u", (n * edge, edge, edge), np.float64)
        with f.step():
            for k in range(n):
                ds.write(blocks[k], offset=(k * edge, 0, 0))
    assert where and all(w == threaded for w in where)
    with lamina.open(str(tmp_path / "c.lam")) as f:
        t = f.engine.block_table("u", 0)
        assert np.array_equal(t.smin, blocks.reshape(n, -1).min(axis=1))
        assert np.allclose(t.ssum, blocks.reshape(n, -1).sum(axis=1))


def test_many_lent_datasets_of_one_block_each_store_what_copied_writes_store(tmp_path, rng):
    """A step of many datasets written once each with copy=False (a simulation's variables)
    is staged a chunk at a time: datasets of several dtypes and sizes, more bytes than one
    staging chunk holds, a dataset of two blocks among them.  Every value and statistic is
    what copied writes give, step after step."""
    dtypes = ["f8", "f4", "i4", "u1", "c8", "?"]
    sizes = [1, 7, 1000, 4096, 8192, 8192]  # elements: up to 64 KiB, the largest staged
    specs = [(f"v{i}", dtypes[i % 6], sizes[(i // 6) % 6]) for i in range(300)]
    total = sum(np.dtype(d).itemsize * n for _, d, n in specs)
    assert total > staging.CHUNK_BYTES
    steps = []
    for _ in range(2):
        data = {}
        for name, dt, n in specs:
            v = rng.standard_normal(n) * 100
            data[name] = (v > 0) if dt == "?" else v.astype(dt)
        steps.append(data)
    tables = {}
    for how in ("copied", "lent"):
        path = str(tmp_path / f"{how}.lam")
        with lamina.open(path, "w", durable=False) as f:
            dss = {name: f.create_dataset(name, shape=(n,), dtype=dt) for name, dt, n in specs}
            two = f.create_dataset("two", shape=(8,), dtype="f8")
            for data in steps:
                with f.step():
                    for k, (name, _, _) in enumerate(specs):
                        dss[name].write(data[name], copy=how == "copied")
                        if k == 40:
                            two.write(np.arange(4.0), offset=(4,), copy=how == "copied")
                            two.write(np.arange(4.0) + 10, copy=how == "copied")
        with lamina.open(path) as f:
            for s, data in enumerate(steps):
                for name, _, _ in specs:
                    np.testing.assert_array_equal(f[name].read(step=s), data[name])
                np.testing.assert_array_equal(f["two"].read(step=s), [10.0, 11, 12, 13, 0, 1, 2, 3])
            tables[how] = {
                name: [(bl.box, bl.stats, bl.nbytes) for bl in f[name].blocks(s)]
                for name in [*dss, "two"]
                for s in range(len(steps))
            }
    assert tables["copied"] == tables["lent"]


def _stats_blocks(path: str, io: str, corners, blocks, many: bool) -> list:
    """Write the statistics of *blocks* as one step (one call, or a call each), read them back."""
    # (layers=[]: the derived layer refuses statistics-only blocks of a plain dataset)
    with lamina.open(path, "w", io=io, layers=[]) as f:
        f.create_dataset("s", shape=(2 * blocks[0].shape[0], 3 * blocks[0].shape[1]), dtype="f8")
        eng = f.engine
        with f.step():
            if not many:
                for c, b in zip(corners, blocks, strict=True):
                    eng.put_stats("s", Box.from_offset(tuple(c), b.shape), b)
            else:
                # a bad block records none of the call
                with pytest.raises(lamina.ShapeError, match="block 1 of 2 has 3 dimensions"):
                    eng.put_stats_many("s", corners[:2], [blocks[0], blocks[1][:, :1, None]])
                with pytest.raises(lamina.BoundsError):
                    eng.put_stats_many("s", corners[-2:] + np.array([0, 1]), blocks[-2:])
                with pytest.raises(OverlapError):  # two blocks of one batch that meet
                    eng.put_stats_many("s", corners[[0, 0]], [blocks[0], blocks[0]])
                eng.put_stats_many("s", corners, blocks)
                with pytest.raises(OverlapError):  # (in the background too: at the call)
                    eng.put_stats_many("s", corners[-1:], blocks[-1:])
    with lamina.open(path) as f:
        return sorted((b.box.start, b.stats) for b in f["s"].blocks())


@pytest.mark.parametrize("io", ["sync", "async", "auto"])  # auto: its first step goes directly
@pytest.mark.parametrize("edge", [(2, 3), (96, 100)])  # summarized together; one pass each
def test_statistics_of_many_blocks_in_one_call_are_those_of_one_call_each(tmp_path, rng, io, edge):
    """Engine.put_stats_many: the statistics-only blocks put_stats records, checked as a whole,
    through the background layer too."""
    shape = (2 * edge[0], 3 * edge[1])
    corners = _grid(shape, edge)
    vals = rng.standard_normal(shape)
    vals[0, 0] = np.nan
    blocks = [vals[x : x + edge[0], y : y + edge[1]] for x, y in corners]
    one = _stats_blocks(str(tmp_path / "one.lam"), io, corners, blocks, False)
    many = _stats_blocks(str(tmp_path / "many.lam"), io, corners, blocks, True)
    assert len(many) == len(corners) == len(one)
    for (a, s1), (b, s2) in zip(one, many, strict=True):
        assert a == b
        assert (s1.min, s1.max, s1.count) == (s2.min, s2.max, s2.count)
        assert s1.sum == pytest.approx(s2.sum, rel=1e-12)


def test_statistics_of_many_blocks_over_the_budget_record_none(tmp_path, rng):
    """Under io='async' a batch's copies are counted against max_inflight_bytes as a whole: a
    batch that does not fit raises before any of its blocks is taken; the step goes on."""
    path = str(tmp_path / "b.lam")
    blocks = [rng.standard_normal((4, 4)) for _ in range(3)]
    corners = np.array([[0, 0], [4, 0], [8, 0]])
    with lamina.open(
        path, "w", io="async", max_inflight_bytes=2 * blocks[0].nbytes, layers=[]
    ) as f:
        f.create_dataset("s", shape=(12, 4), dtype="f8")
        with f.step():
            with pytest.raises(lamina.errors.ConfigError, match="statistics of 3 blocks"):
                f.engine.put_stats_many("s", corners, blocks)
            f.engine.put_stats_many("s", corners[:2], blocks[:2])
    with lamina.open(path) as f:
        got = f["s"].blocks()
        assert [b.box.start for b in got] == [(0, 0), (4, 0)]
        assert [b.stats.max for b in got] == [b.max() for b in blocks[:2]]


def test_statistics_take_the_casts_writes_take(tmp_path):
    """put_stats and put_stats_many refuse what a write refuses (float statistics of an
    integer dataset) and take what it takes (int16 into int32)."""
    with lamina.open(str(tmp_path / "c.lam"), "w", layers=[]) as f:
        f.create_dataset("s", shape=(4,), dtype="i4")
        eng = f.engine
        with f.step():
            with pytest.raises(lamina.DTypeError, match="float64"):
                eng.put_stats("s", Box((0,), (2,)), np.array([2.5, 3.0]))
            with pytest.raises(lamina.DTypeError, match="float64"):
                eng.put_stats_many("s", [[0]], [np.array([2.5, 3.0])])
            eng.put_stats("s", Box((0,), (2,)), np.array([2, 3], dtype="i2"))
            eng.put_stats_many("s", [[2]], [np.array([5, 7], dtype="i2")])
        assert [(b.stats.min, b.stats.max) for b in f["s"].blocks()] == [(2, 3), (5, 7)]


@pytest.mark.parametrize("io", ["sync", "async"])
@pytest.mark.parametrize("form", ["memmap", "mixed list", "memmap list"])
def test_every_array_kept_by_reference_is_read_only_while_kept(tmp_path, io, form):
    """copy=False: every caller's array lamina keeps by reference is read-only until its step
    is written, whatever else the call holds, and what is stored is the array as lent: a
    block cast in a list left the others of the list writeable (a change then failed its
    checksum on read), and an np.memmap (np.asarray of it is a plain view, which was frozen
    instead) was never read-only, its change stored or the block corrupt."""
    path = str(tmp_path / "a.lam")
    if form == "mixed list":
        big = np.ones((64, 512))
    else:
        big = np.lib.format.open_memmap(str(tmp_path / "big.npy"), "w+", "f8", (64, 512))
        big[...] = 1.0
    small = np.full((2, 512), 2.0, dtype="f4")  # cast to f8: lamina's own copy
    with lamina.open(path, "w", io=io) as f:
        ds = f.create_dataset("x", (66, 512), "f8")
        with f.step():
            if form == "memmap":
                ds.write(big, offset=(0, 0), copy=False)
                ds.write(small, offset=(64, 0), copy=False)
            else:  # a block to cast beside it, or none
                other = small if form == "mixed list" else small.astype("f8")
                ds.write_blocks([big, other], [[0, 0], [64, 0]], copy=False)
            # (io='async' copies a single memmap, and a list with a block to cast, at once)
            copied = io == "async" and form != "memmap list"
            assert big.flags.writeable == copied
            if copied:
                big[1, 1] = 42.0  # not stored: the step holds a copy
            else:
                with pytest.raises(ValueError, match="read-only"):
                    big[0, 0] = 42.0
            small[0, 0] = 5.0  # a cast copy was kept: the caller's own stays writeable
        f.wait()
        assert big.flags.writeable
        big[0, 0] = 42.0
    with lamina.open(path) as f:
        got = f["x"][...]
    np.testing.assert_array_equal(got[:64], 1.0)
    np.testing.assert_array_equal(got[64:], 2.0)


def test_an_input_of_a_derived_quantity_is_read_only_while_held(tmp_path):
    """A lent input of a quantity computed at the end of the step is read-only until then,
    staged or encoded by the engine at once or not: a change made meanwhile computed the
    quantity from values the file does not hold (u = 1, u2 = 10)."""
    path = str(tmp_path / "d.lam")
    with lamina.open(path, "w") as f:
        u = f.create_dataset("u", (8, 4), "f8")
        z = f.create_dataset("z", (8, 4), "f8", compression="zlib")
        f.derive("u2", "u * 2", strategy="store")
        f.derive("z2", "z * 2", strategy="store")
        stacked = np.ones((2, 4, 4))
        zs = np.ones((8, 4))
        with f.step():
            u.write_blocks(stacked, [[0, 0], [4, 0]], copy=False)  # small: staged at once
            z.write(zs, offset=(0, 0), copy=False)  # compressed at once
            for a in (stacked, zs):
                with pytest.raises(ValueError, match="read-only"):
                    a[...] = 5.0
        assert stacked.flags.writeable and zs.flags.writeable
        with pytest.raises(RuntimeError), f.step():  # a step dropped thaws them too
            z.write(zs, offset=(0, 0), copy=False)
            raise RuntimeError("the program fails inside the step")
        assert zs.flags.writeable
    with lamina.open(path) as f:
        assert (f["u2"][...] == 2.0).all() and (f["z2"][...] == 2.0).all()


def test_lent_arrays_are_writeable_once_wait_returns(tmp_path):
    """io='async': f.wait() returns once the step's lent arrays are writeable again (they
    were thawed after the waiters were told the step was done: a change right after wait()
    raised 'read-only' now and then)."""
    import sys

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with lamina.open(str(tmp_path / "w.lam"), "w", io="async") as f:
            ds = f.create_dataset("a", (1 << 15,), "f8")
            a = np.zeros(1 << 15)
            for k in range(60):
                with f.step():
                    ds.write(a, offset=(0,), copy=False)
                f.wait()
                a[:] = k  # raises if the step's arrays were not thawed yet
    finally:
        sys.setswitchinterval(before)
