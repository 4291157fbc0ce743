"""Geometry: boxes, intersection, overlap search, process grids, decompositions (pure)."""

from __future__ import annotations

import contextlib
import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lamina import geometry
from lamina.errors import BoundsError, LaminaError, ShapeError
from lamina.geometry import (
    Box,
    box_of,
    covered_volume,
    decompose,
    dims_create,
    find_overlap,
    find_overlap_arrays,
    fits,
    morton_key,
    morton_order,
    split_range,
)

# --------------------------------------------------------------------------
# strategies


@st.composite
def boxes(draw, ndim=None, extent=12, allow_empty=True):
    nd = draw(st.integers(1, 3)) if ndim is None else ndim
    start, stop = [], []
    for _ in range(nd):
        a = draw(st.integers(0, extent))
        b = draw(st.integers(a if allow_empty else a + 1, extent + (0 if allow_empty else 1)))
        start.append(a)
        stop.append(b)
    return Box(tuple(start), tuple(stop))


@st.composite
def box_pairs(draw):
    nd = draw(st.integers(1, 3))
    return draw(boxes(ndim=nd)), draw(boxes(ndim=nd))


@st.composite
def box_lists(draw):
    nd = draw(st.integers(1, 3))
    return draw(st.lists(boxes(ndim=nd, extent=8), min_size=0, max_size=10))


def cells(b: Box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(a, z) for a, z in zip(b.start, b.stop, strict=True))))


# --------------------------------------------------------------------------
# Box basics


def test_box_properties():
    b = Box((1, 2, 3), (4, 2, 7))
    assert b.ndim == 3
    assert b.shape == (3, 0, 4)
    assert b.size == 0
    assert b.empty
    assert b.slices == (slice(1, 4), slice(2, 2), slice(3, 7))
    assert str(b) == "[1:4, 2:2, 3:7]"
    c = Box((0, 0), (2, 5))
    assert not c.empty and c.size == 10 and c.shape == (2, 5)


def test_box_is_hashable_and_immutable():
    b = Box((0, 1), (2, 3))
    assert {b: 1}[Box((0, 1), (2, 3))] == 1
    with pytest.raises(AttributeError):
        b.start = (5, 5)  # type: ignore[misc]


def test_zero_dim_box():
    b = Box((), ())
    assert b.ndim == 0 and b.shape == () and b.size == 1 and not b.empty
    assert b.intersect(Box((), ())) == b
    assert b.contains(Box((), ()))
    b.check_inside(())


def test_box_constructors():
    assert Box.from_shape((3, 4)) == Box((0, 0), (3, 4))
    assert Box.from_shape(()) == Box((), ())
    assert Box.from_offset((1, 2), (3, 4)) == Box((1, 2), (4, 6))
    assert Box.from_slices((slice(1, 3), slice(None)), (5, 6)) == Box((1, 0), (3, 6))
    assert Box.from_slices((slice(-2, None),), (5,)) == Box((3,), (5,))
    # reversed slices give an empty box, not a negative one
    assert Box.from_slices((slice(4, 1),), (5,)).empty
    with pytest.raises(BoundsError, match="step"):
        Box.from_slices((slice(0, 4, 2),), (5,))


@pytest.mark.parametrize(
    "start, stop, exc",
    [
        ((0, 0), (1,), ShapeError),
        ((-1,), (2,), BoundsError),
        ((3,), (2,), BoundsError),
    ],
)
def test_invalid_boxes(start, stop, exc):
    with pytest.raises(exc) as ei:
        Box(start, stop)
    assert isinstance(ei.value, LaminaError)
    assert str(start) in str(ei.value)


def test_box_errors_subclass_builtins():
    with pytest.raises(ValueError):
        Box((0,), (1, 2))
    with pytest.raises(IndexError):
        Box((2,), (1,))


def test_a_0_d_box_reads_as_numpy_indexes_the_scalar():
    """An overlap of two writes of a 0-D dataset said 'box [] ... overlaps box []'."""
    assert str(Box((), ())) == "[()]" and str(Box((1,), (3,))) == "[1:3]"


def test_relations_of_boxes_of_other_ranks_name_them():
    a, b = Box((0,), (4,)), Box((0, 0), (4, 4))
    with pytest.raises(ShapeError, match="1-D box cannot contain a 2-D box"):
        a.contains(b)
    with pytest.raises(ShapeError, match="2-D box by 1 offsets"):
        b.shift((1,))
    with pytest.raises(ShapeError, match="1-D box is not inside a 2-D box"):
        a.relative_to(b)
    with pytest.raises(ShapeError, match="2-D box is not inside a 1-D box"):
        b.relative_to(a)


def test_relative_to_refuses_a_box_outside():
    outer = Box((4, 4), (8, 8))
    assert Box((5, 4), (8, 6)).relative_to(outer) == (slice(1, 4), slice(0, 2))
    # (slices -1:1 would select nothing, 3:5 a part, without a word)
    for inner in (Box((3, 4), (5, 6)), Box((7, 4), (9, 6)), Box((0, 0), (2, 2))):
        with pytest.raises(BoundsError, match="is not inside"):
            inner.relative_to(outer)
    with pytest.raises(BoundsError):
        Box((3, 4), (5, 6)).within(outer)


def test_intersect_rank_mismatch():
    with pytest.raises(ShapeError, match="1-D box with a 2-D box"):
        Box((0,), (2,)).intersect(Box((0, 0), (1, 1)))


def test_contains_relative_shift():
    outer = Box((2, 2), (10, 10))
    inner = Box((3, 4), (5, 9))
    assert outer.contains(inner) and not inner.contains(outer)
    assert outer.contains(outer)
    assert inner.relative_to(outer) == (slice(1, 3), slice(2, 7))
    a = np.arange(100).reshape(10, 10)
    assert np.array_equal(a[outer.slices][inner.relative_to(outer)], a[inner.slices])
    assert inner.shift((1, -1)) == Box((4, 3), (6, 8))
    with pytest.raises(BoundsError):
        inner.shift((-4, 0))


def test_check_inside_names_dataset_and_dimension():
    b = Box((0, 2), (3, 9))
    b.check_inside((3, 9))
    with pytest.raises(BoundsError) as ei:
        b.check_inside((3, 8), "dataset 'fields/T'")
    msg = str(ei.value)
    assert "fields/T" in msg and "dimension 1" in msg and "9 > 8" in msg
    with pytest.raises(BoundsError, match="2 dimensions but dataset 'x' has 3"):
        b.check_inside((3, 9, 1), "dataset 'x'")


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=0, max_size=4),
    st.lists(st.integers(0, 8), min_size=0, max_size=4),
)
def test_inside_agrees_with_check_inside(extents, shape):
    """The cheap test puts call first says yes exactly when check_inside raises nothing."""
    box = Box(tuple(a for a, _ in extents), tuple(a + n for a, n in extents))
    try:
        box.check_inside(tuple(shape))
        ok = True
    except BoundsError:
        ok = False
    assert box.inside(tuple(shape)) == ok


def test_box_rejects_any_negative_start_or_reversed_axis():
    for start, stop in (((0, -1, 0), (1, 1, 1)), ((0, 0, 3), (1, 1, 2)), ((5, 0), (4, 9))):
        with pytest.raises(BoundsError):
            Box(start, stop)
    assert Box((), ()).shape == ()


# --------------------------------------------------------------------------
# intersect properties


@given(box_pairs())
def test_intersect_commutative_and_contained(pair):
    a, b = pair
    ab, ba = a.intersect(b), b.intersect(a)
    assert ab == ba
    if ab is not None:
        assert not ab.empty
        assert a.contains(ab) and b.contains(ab)
        assert a.overlaps(b) and b.overlaps(a)
    else:
        assert not a.overlaps(b)


@given(box_pairs())
def test_intersect_agrees_with_cell_sets(pair):
    a, b = pair
    common = cells(a) & cells(b)
    inter = a.intersect(b)
    if not common:
        assert inter is None
    else:
        assert inter is not None and cells(inter) == common
        assert inter.size == len(common)


@given(boxes())
def test_intersect_with_self(b):
    if b.empty:
        assert b.intersect(b) is None
    else:
        assert b.intersect(b) == b
        assert b.contains(b)


@given(box_pairs(), box_pairs())
def test_intersect_associative(p1, p2):
    a, b = p1
    c, _ = p2
    assume(c.ndim == a.ndim)
    left = a.intersect(b)
    left = None if left is None else left.intersect(c)
    right = b.intersect(c)
    right = None if right is None else a.intersect(right)
    assert left == right


# --------------------------------------------------------------------------
# find_overlap


def brute_overlap(bs: list[Box]) -> bool:
    return any(bs[i].overlaps(bs[j]) for i in range(len(bs)) for j in range(i + 1, len(bs)))


@given(box_lists())
def test_find_overlap_agrees_with_brute_force(bs):
    got = find_overlap(bs)
    assert (got is not None) == brute_overlap(bs)
    if got is not None:
        i, j = got
        assert i < j
        assert bs[i].overlaps(bs[j])


@given(st.integers(1, 3), st.integers(1, 12), st.data())
def test_find_overlap_none_for_decomposition(ndim, nparts, data):
    shape = tuple(data.draw(st.integers(0, 9)) for _ in range(ndim))
    bs = decompose(shape, nparts)
    assert find_overlap(bs) is None
    # adding any copy of a non-empty box creates an overlap
    nonempty = [b for b in bs if not b.empty]
    if nonempty:
        k = data.draw(st.sampled_from(range(len(nonempty))))
        got = find_overlap([*bs, nonempty[k]])
        # the original boxes are disjoint, so the pair found must involve the copy
        assert got is not None and got[1] == len(bs)


def test_find_overlap_examples():
    assert find_overlap([]) is None
    assert find_overlap([Box((0,), (5,)), Box((5,), (9,))]) is None  # touching is not overlapping
    assert find_overlap([Box((0,), (5,)), Box((4,), (9,))]) == (0, 1)
    # empty boxes never overlap anything
    assert find_overlap([Box((2,), (2,)), Box((0,), (5,)), Box((3,), (3,))]) is None
    # long box early, overlap found with a much later one
    bs = (
        [Box((0, 0), (100, 1))]
        + [Box((i, 1), (i + 1, 2)) for i in range(50)]
        + [Box((60, 0), (61, 1))]
    )
    assert find_overlap(bs) == (0, 51)
    assert find_overlap([Box((), ()), Box((), ())]) == (0, 1)
    assert find_overlap([Box((), ())]) is None


@st.composite
def overlap_cases(draw):
    """Boxes of 0-4 dimensions that repeat, nest, touch, are empty and differ in size."""
    nd = draw(st.integers(0, 4))
    bs: list[Box] = []
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["free", "aligned", "inside", "beside"])) if bs else "free"
        if kind == "free":
            start = [draw(st.integers(0, 12)) for _ in range(nd)]
            stop = [a + draw(st.integers(0, 6)) for a in start]
        elif kind == "aligned":  # blocks of a hierarchy: sizes and positions multiples of 2**k
            size = 2 ** draw(st.integers(0, 5))
            start = [size * draw(st.integers(0, 8)) for _ in range(nd)]
            stop = [a + size * draw(st.integers(0, 1)) for a in start]
        elif kind == "inside":  # nested in an earlier box, possibly equal or empty
            outer = draw(st.sampled_from(bs))
            start = [draw(st.integers(a, b)) for a, b in zip(outer.start, outer.stop, strict=True)]
            stop = [draw(st.integers(a, b)) for a, b in zip(start, outer.stop, strict=True)]
        else:  # an earlier box moved by its extent along one dimension: touching, or 1 off
            other = draw(st.sampled_from(bs))
            start, stop = list(other.start), list(other.stop)
            if nd:
                d = draw(st.integers(0, nd - 1))
                shift = stop[d] - start[d] + draw(st.integers(-1, 1))
                start[d] += shift
                stop[d] += shift
            if any(a < 0 for a in start):
                continue
        bs.append(Box(tuple(start), tuple(stop)))
    return bs


def corners(bs: list[Box], ndim: int) -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([b.start for b in bs], dtype=np.int64).reshape(len(bs), ndim)
    hi = np.array([b.stop for b in bs], dtype=np.int64).reshape(len(bs), ndim)
    return lo, hi


def check_overlap_answer(bs: list[Box]) -> tuple[int, int] | None:
    got = find_overlap(bs)
    assert (got is not None) == brute_overlap(bs)
    if got is not None:
        i, j = got
        assert i < j
        assert bs[i].overlaps(bs[j])
    if bs:
        assert find_overlap_arrays(*corners(bs, bs[0].ndim)) == got
    return got


@settings(max_examples=300)
@given(overlap_cases())
def test_find_overlap_exact(bs):
    check_overlap_answer(bs)


@contextlib.contextmanager
def search_tuning(**values):
    """Set the search's tuning constants, so that small inputs take the paths large ones take."""
    saved = {k: getattr(geometry, k) for k in values}
    try:
        for k, v in values.items():
            setattr(geometry, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(geometry, k, v)


SWEEP = geometry._sweep


def sweep_unchecked(*args):
    """The sweep without its own overlap test: cuts and pair tests must find every overlap."""
    return SWEEP(*args[:-1], False)


@settings(max_examples=150)
@given(
    overlap_cases(),
    st.sampled_from(
        [
            {"_STALL": 0, "_SMALL": 0},  # cut after every round
            {"_STALL": 0, "_SMALL": 0, "_sweep": sweep_unchecked},  # down to single elements
            {"_STALL": 0, "_SMALL": 3, "_CHUNK": 3, "_sweep": sweep_unchecked},  # small groups
            {"_STALL": 0, "_SMALL": 0, "_BUDGET": 1, "_CHUNK": 3, "_sweep": sweep_unchecked},
        ]
    ),
)
def test_find_overlap_exact_when_cutting(bs, tuning):
    with search_tuning(**tuning):
        check_overlap_answer(bs)


def test_find_overlap_arrays_contract():
    lo = np.array([[0, 0], [4, 0], [2, 2]])
    hi = np.array([[4, 4], [8, 4], [6, 3]])
    assert find_overlap_arrays(lo, hi) in {(0, 2), (1, 2)}
    assert find_overlap_arrays(lo[:2], hi[:2]) is None
    # empty boxes (stop <= start somewhere) overlap nothing; negative coordinates are fine
    assert find_overlap_arrays([[0, 0], [1, 5], [-3, -3]], [[9, 9], [0, 9], [0, 0]]) is None
    assert find_overlap_arrays(np.zeros((3, 0)), np.zeros((3, 0))) == (0, 1)
    assert find_overlap_arrays(np.zeros((1, 0)), np.zeros((1, 0))) is None
    assert find_overlap_arrays(np.zeros((0, 3)), np.zeros((0, 3))) is None
    big = 2**62
    assert find_overlap_arrays([[0], [big]], [[big], [2 * big - 1]]) is None
    with pytest.raises(BoundsError, match="2\\*\\*63"):
        find_overlap_arrays([[-big], [0]], [[0], [big]])
    with pytest.raises(ShapeError):
        find_overlap_arrays(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ShapeError):
        find_overlap_arrays(np.zeros(3), np.zeros(3))


def test_find_overlap_needs_one_number_of_dimensions():
    with pytest.raises(ShapeError, match=r"\[2, 3\]"):
        find_overlap([Box((0, 0), (1, 1)), Box((0, 0, 0), (1, 1, 1)), Box((0,) * 3, (1,) * 3)])


def pinwheels(lo: tuple[int, int], hi: tuple[int, int], depth: int) -> list[Box]:
    """A square split into 4 rectangles around a centre, each split again: no straight cut.

    No line crosses the layout without crossing a box, at any level, so
    sorting along the axes cannot separate the boxes.
    """
    (x0, y0), (x1, y1) = lo, hi
    if depth == 0:
        return [Box(lo, hi)]
    a, b = x0 + (x1 - x0) // 3, x0 + 2 * (x1 - x0) // 3
    c, d = y0 + (y1 - y0) // 3, y0 + 2 * (y1 - y0) // 3
    parts = [((x0, y0), (b, c)), ((b, y0), (x1, d)), ((a, d), (x1, y1)), ((x0, c), (a, y1))]
    return [Box((a, c), (b, d))] + [q for p in parts for q in pinwheels(*p, depth - 1)]


def test_find_overlap_pinwheels():
    bs = pinwheels((0, 0), (3**6, 3**6), 5)
    assert len(bs) == 1365
    assert sum(b.size for b in bs) == 3**12
    assert find_overlap(bs) is None
    # in 3-D: layers of pinwheels, each turned a quarter, separated by a layer of slabs
    layers = []
    for z in range(4):
        for b in bs:
            (x0, y0), (x1, y1) = b.start, b.stop
            if z % 2:
                (x0, y0), (x1, y1) = (y0, x0), (y1, x1)
            layers.append(Box((x0, y0, 2 * z), (x1, y1, 2 * z + 1)))
    layers += [Box((0, 3**6 // 2, 2 * z + 1), (3**6, 3**6, 2 * z + 2)) for z in range(4)]
    assert find_overlap(layers) is None
    for k in (7, 700, len(bs) + 100):
        grown = list(layers)
        b = grown[k]
        grown[k] = Box(b.start, (b.stop[0] + 1, *b.stop[1:]))
        got = find_overlap(grown)
        assert got is not None and k in got and grown[got[0]].overlaps(grown[got[1]])


# --------------------------------------------------------------------------
# find_overlap at scale: tens of thousands of blocks per step cost a few
# sweeps over them, not a comparison of every pair (work is counted, not timed)

WORK_PER_BOX = 16  # pieces swept or tested pair by pair, per box and dimension


def grid_blocks(blocks: tuple[int, ...], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Corners of the blocks of a regular grid of *blocks* blocks of *size**ndim* elements."""
    lo = np.indices(blocks).reshape(len(blocks), -1).T * size
    return lo, lo + size


def bounded(f, *args):
    """f(*args), checking that the search handled O(n) pieces (n boxes of ndim dimensions)."""
    work = [0]
    sweep, pairwise = geometry._sweep, geometry._pairwise

    def counted_sweep(active, *rest):
        work[0] += active.size
        return sweep(active, *rest)

    def counted_pairwise(active, *rest):
        work[0] += active.size
        return pairwise(active, *rest)

    with search_tuning(_sweep=counted_sweep, _pairwise=counted_pairwise):
        out = f(*args)
    boxes = args[0]
    n = len(boxes)
    ndim = len(boxes[0]) if len(args) == 2 else boxes[0].ndim
    assert work[0] <= WORK_PER_BOX * n * ndim, f"{work[0]} pieces handled for {n} boxes"
    return out


def test_find_overlap_scale_grid():
    lo, hi = grid_blocks((64, 64, 64), 8)
    bs = [Box(tuple(a), tuple(b)) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
    assert len(bs) == 262_144
    assert bounded(find_overlap, bs) is None
    assert bounded(find_overlap_arrays, lo, hi) is None
    # one block moved by half its size along dimension 0 overlaps its neighbour there
    k = 12345
    bs[k] = bs[k].shift((4, 0, 0))
    assert bounded(find_overlap, bs) == (k, k + 64 * 64)


def block_hierarchy(levels: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Leaves of a 3-D block tree: 8^3 blocks of 64^3, refined (into 8) near a sphere.

    A block of level k is 2**k times smaller than one of level 0.
    """
    rng = np.random.default_rng(seed)
    lo, hi = grid_blocks((8, 8, 8), 64)
    for _ in range(levels):
        centre = (lo + hi) / 2
        near = np.abs(np.linalg.norm(centre - 256, axis=1) - 160) < (hi - lo)[:, 0]
        refine = near & (rng.random(len(lo)) < 0.8) & ((hi - lo)[:, 0] == (hi - lo)[:, 0].min())
        half = (hi[refine] - lo[refine]) // 2
        corner = np.indices((2, 2, 2)).reshape(3, -1).T
        child_lo = (lo[refine][:, None, :] + corner * half[:, None, :]).reshape(-1, 3)
        child_hi = child_lo + np.repeat(half, 8, axis=0)
        lo = np.concatenate([lo[~refine], child_lo])
        hi = np.concatenate([hi[~refine], child_hi])
    return lo, hi


def test_find_overlap_scale_block_hierarchy():
    lo, hi = block_hierarchy(5)
    assert len(lo) > 50_000 and len(np.unique(hi[:, 0] - lo[:, 0])) == 6
    assert np.sum(np.prod(hi - lo, axis=1)) == 512**3  # the blocks tile the domain
    assert bounded(find_overlap_arrays, lo, hi) is None
    # a finest block moved by one element overlaps a neighbour
    k = int(np.argmin(hi[:, 0] - lo[:, 0]))
    lo[k] += 1
    hi[k] += 1
    got = bounded(find_overlap_arrays, lo, hi)
    assert got is not None and k in got


# --------------------------------------------------------------------------
# dims_create / split_range / decompose


@given(st.integers(1, 5000), st.integers(1, 4))
def test_dims_create_product_and_order(n, nd):
    dims = dims_create(n, nd)
    assert len(dims) == nd
    assert math.prod(dims) == n
    assert list(dims) == sorted(dims, reverse=True)
    assert all(d >= 1 for d in dims)


@pytest.mark.parametrize(
    "n, nd, expect",
    [
        (1, 3, (1, 1, 1)),
        (6, 2, (3, 2)),
        (12, 3, (3, 2, 2)),
        (16, 2, (4, 4)),
        (7, 2, (7, 1)),
        (64, 3, (4, 4, 4)),
    ],
)
def test_dims_create_examples(n, nd, expect):
    assert dims_create(n, nd) == expect


@pytest.mark.parametrize("n, nd", [(0, 2), (-3, 1), (4, 0)])
def test_dims_create_rejects(n, nd):
    with pytest.raises(ValueError):
        dims_create(n, nd)


@given(st.integers(0, 200), st.integers(1, 30))
def test_split_range_partitions(n, parts):
    pieces = [split_range(n, parts, i) for i in range(parts)]
    assert pieces[0][0] == 0 and pieces[-1][1] == n
    for (_, b), (c, _) in zip(pieces, pieces[1:], strict=False):
        assert b == c
    sizes = [b - a for a, b in pieces]
    assert max(sizes) - min(sizes) <= 1


@given(st.lists(st.integers(0, 9), min_size=1, max_size=3), st.integers(1, 16))
def test_decompose_covers_exactly(shape, nparts):
    shape = tuple(shape)
    bs = decompose(shape, nparts)
    assert len(bs) == nparts
    whole = Box.from_shape(shape)
    seen = np.zeros(shape, dtype=np.int32)
    for b in bs:
        assert b.ndim == len(shape)
        assert whole.contains(b)
        seen[b.slices] += 1
    # every cell covered exactly once: disjoint and complete
    assert np.all(seen == 1)
    assert sum(b.size for b in bs) == math.prod(shape)
    assert find_overlap(bs) is None
    assert covered_volume(bs, whole) == math.prod(shape)


@given(st.lists(st.integers(1, 9), min_size=2, max_size=3), st.data())
def test_decompose_with_explicit_dims(shape, data):
    dims = tuple(data.draw(st.integers(1, 4)) for _ in shape)
    n = math.prod(dims)
    bs = decompose(shape, n, dims)
    seen = np.zeros(shape, dtype=np.int32)
    for b in bs:
        seen[b.slices] += 1
    assert np.all(seen == 1)
    # row-major order of the process grid: the first box starts at the origin
    assert bs[0].start == (0,) * len(shape)


def test_decompose_scalar_and_errors():
    assert decompose((), 1) == [Box((), ())]
    with pytest.raises(ValueError, match="0-D"):
        decompose((), 2)
    with pytest.raises(ValueError, match="process grid"):
        decompose((4, 4), 4, dims=(3, 1))
    with pytest.raises(ValueError, match="process grid"):
        decompose((4, 4), 4, dims=(4,))


def test_decompose_gives_more_parts_to_longer_dimensions():
    # 8 ranks -> a (4, 2) grid; the 4 goes to the longer dimension
    assert {b.shape for b in decompose((100, 10), 8)} == {(25, 5)}
    assert {b.shape for b in decompose((10, 100), 8)} == {(5, 25)}
    assert {b.shape for b in decompose((10, 100), 2)} == {(10, 50)}


@pytest.mark.parametrize(
    ("shape", "nparts", "grid"),
    [
        ((1, 1, 64), 8, (1, 1, 8)),  # was 2 x 2 x 2: six ranks with nothing
        ((64, 1, 1), 12, (12, 1, 1)),
        ((1, 50), 4, (1, 4)),  # was 2 x 2
        ((2, 3, 64), 27, (1, 3, 9)),  # was 3 x 3 x 3; of the grids using all 27, the
        # smallest largest box (2 x 1 x 8, where 1 x 1 x 27 gives 2 x 3 x 3)
        ((3, 3, 64), 8, (2, 2, 2)),  # the usual grid leaves none empty: kept
        ((5, 7), 12, (3, 4)),
    ],
)
def test_decompose_leaves_no_rank_empty_where_the_shape_allows(shape, nparts, grid):
    bs = decompose(shape, nparts)
    assert all(b.size > 0 for b in bs), [b for b in bs if b.size == 0]
    counts = tuple(len({b.start[d] for b in bs}) for d in range(len(shape)))
    assert counts == grid


def test_decompose_of_fewer_cells_than_parts_leaves_only_the_excess_empty():
    bs = decompose((2, 2, 2), 16)
    assert sum(b.size > 0 for b in bs) == 8
    assert sum(b.size for b in bs) == 8


# --------------------------------------------------------------------------
# Morton order, covered volume


@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=3),
    st.lists(st.integers(0, 1000), min_size=1, max_size=3),
)
def test_morton_key_injective(p, q):
    assume(len(p) == len(q))
    assert (morton_key(p) == morton_key(q)) == (p == q)


def test_morton_order_z_curve():
    pts = [Box((x, y), (x + 1, y + 1)) for x in range(2) for y in range(2)]
    order = morton_order(reversed(pts))
    # dimension 0 is the least significant bit
    assert [b.start for b in order] == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_covered_volume():
    within = Box((0, 0), (4, 4))
    bs = [Box((0, 0), (2, 2)), Box((3, 3), (10, 10)), Box((5, 5), (6, 6))]
    assert covered_volume(bs, within) == 4 + 1


@given(
    st.one_of(st.integers(0, 40), st.integers(250, 300)), st.integers(0, 4), st.integers(0, 2**31)
)
def test_column_reductions_match_numpy_axis_reductions(n, nd, seed):
    """rows_* and cols_* give what numpy's axis reductions give, empty shapes included, on
    either side of ``AXIS_ROWS`` (one reduction along the axis, or a column at a time)."""
    from lamina.geometry import cols_max, cols_min, rows_all, rows_any, rows_less, rows_prod

    rng = np.random.default_rng(seed)
    lo = rng.integers(-3, 4, (n, nd))
    hi = rng.integers(-3, 4, (n, nd))
    m = lo < hi
    assert np.array_equal(rows_all(m), m.all(axis=1))
    assert np.array_equal(rows_any(m), m.any(axis=1))
    assert np.array_equal(rows_less(lo, hi), m.all(axis=1))
    assert np.array_equal(rows_prod(hi - lo), (hi - lo).prod(axis=1))
    if n:
        assert np.array_equal(cols_min(lo), lo.min(axis=0))
        assert np.array_equal(cols_max(hi), hi.max(axis=0))
        assert cols_min(lo).dtype == lo.dtype


def test_box_from_numpy_corners_is_checked_like_tuples():
    assert Box(np.array([1, 2]), np.array([3, 4])).shape == (2, 2)
    for start, stop in ((np.array([0]), np.array([-1])), (np.array([-1, 0]), np.array([1, 1]))):
        with pytest.raises(BoundsError):
            Box(start, stop)


def test_rows_prod_takes_any_integer_columns():
    from lamina.geometry import rows_prod

    for dt in (np.int32, np.uint32, np.uint64, np.int64):
        a = np.array([[2, 3, 4], [1, 5, 0]], dtype=dt)
        got = rows_prod(a)
        assert got.dtype == np.int64 and got.tolist() == [24, 0]


@given(
    st.lists(st.integers(-3, 50), min_size=0, max_size=4).flatmap(
        lambda off: st.tuples(
            st.just(tuple(off)), st.lists(st.integers(0, 9), min_size=len(off), max_size=len(off))
        )
    )
)
def test_box_of_is_the_checked_box(case):
    """box_of (a write's box, made without the generic checks) equals Box, and refuses what Box
    refuses."""
    off, shape = case[0], tuple(case[1])
    try:
        want = Box(off, tuple(a + s for a, s in zip(off, shape, strict=True)))
    except BoundsError:
        with pytest.raises(BoundsError):
            box_of(off, shape)
        return
    got = box_of(off, shape)
    assert got == want and hash(got) == hash(want) and got.shape == shape
    with pytest.raises(AttributeError):
        got.start = off  # frozen as Box is


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 4).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-3, 12), min_size=n, max_size=n),
            st.lists(st.integers(0, 6), min_size=n, max_size=n),
            st.lists(st.integers(-1, 2), min_size=n, max_size=n),  # extent - (start + shape)
            st.integers(-1, 1),  # a start or a shape one entry off in length
            st.sampled_from([int, np.int64, float, bool]),  # the start's entries
        )
    )
)
def test_fits_is_box_of_inside(case):
    """fits (a lent write's bounds test, made without a box) says what box_of(start,
    shape).inside(extent) says for corners of Python ints; False for any other corner
    (numpy ints and floats: put converts or refuses them) and for lengths that differ."""
    start, shape, slack, off, kind = case
    extent = tuple(max(0, a + n + d) for a, n, d in zip(start, shape, slack, strict=True))
    start = tuple(kind(a) for a in start)
    shape = tuple(shape)
    if off < 0 and start:
        start = start[:-1]
    elif off > 0:
        shape = (*shape, 1)
    got = fits(start, shape, extent)
    if len(start) != len(extent) or len(shape) != len(extent):
        assert got is False
        return
    if start and kind is not int:
        assert got is False
        return
    try:
        want = box_of(start, shape).inside(extent)
    except BoundsError:
        want = False  # below 0
    assert got is want


def test_box_constructors_take_integers_only():
    """Box.from_offset and Box.from_shape refuse what a corner refuses (a float, a string, a
    bool): int() took 1.7 as 1, '12' as the corner (1, 2) and True as 1, and a read of
    Box.from_offset((2.999,), (2,)) read [2:4]."""
    import numpy as np

    for offset, shape in (((1.7, 0), (2, 3)), ("12", (2, 3)), ((1, 0), (True, 3)), ((0,), (2.0,))):
        with pytest.raises(TypeError, match="not an integer|not a sequence of integers"):
            Box.from_offset(offset, shape)
    with pytest.raises(TypeError, match=r"box shape \(True, 3\) holds True"):
        Box.from_shape((True, 3))
    assert Box.from_offset((np.int64(1), 2), np.array([2, 3])) == Box((1, 2), (3, 5))
    assert Box.from_shape(np.array([2, 2])) == Box((0, 0), (2, 2))
