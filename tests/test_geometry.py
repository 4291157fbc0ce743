"""Geometry: boxes, intersection, overlap search, process grids, decompositions (pure)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from lamina.errors import BoundsError, LaminaError, ShapeError
from lamina.geometry import (
    Box,
    covered_volume,
    decompose,
    dims_create,
    find_overlap,
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
