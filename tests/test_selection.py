"""Selection parsing (``lamina/selection.py``): numpy-style keys -> boxes, checked against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lamina.api.dataset import _select
from lamina.errors import BoundsError, LaminaError, SelectionError
from lamina.geometry import Box
from lamina.selection import parse

SHAPE = (5, 7, 3)


def apply(a: np.ndarray, key) -> np.ndarray:
    """Read *key* of *a* the way Dataset.__getitem__ does: box, then strides, then squeeze."""
    sel = parse(key, a.shape, "dataset 'a'")
    out = a[sel.box.slices]
    if sel.strided:
        out = out[tuple(slice(None, None, s) for s in sel.steps)]
    if sel.squeeze:
        out = out.reshape(sel.result_shape)
    assert out.shape == sel.result_shape
    return out


@pytest.mark.parametrize(
    "key, box, squeeze, result",
    [
        (2, Box((2, 0, 0), (3, 7, 3)), (0,), (7, 3)),
        (-1, Box((4, 0, 0), (5, 7, 3)), (0,), (7, 3)),
        ((1, 2, 0), Box((1, 2, 0), (2, 3, 1)), (0, 1, 2), ()),
        ((slice(1, 3),), Box((1, 0, 0), (3, 7, 3)), (), (2, 7, 3)),
        ((slice(None), -2), Box((0, 5, 0), (5, 6, 3)), (1,), (5, 3)),
        (Ellipsis, Box((0, 0, 0), (5, 7, 3)), (), (5, 7, 3)),
        ((Ellipsis, 1), Box((0, 0, 1), (5, 7, 2)), (2,), (5, 7)),
        ((0, Ellipsis, 1), Box((0, 0, 1), (1, 7, 2)), (0, 2), (7,)),
        ((0, 1, 2, Ellipsis), Box((0, 1, 2), (1, 2, 3)), (0, 1, 2), ()),
        ((), Box((0, 0, 0), (5, 7, 3)), (), (5, 7, 3)),
        ((slice(3, 1),), Box((3, 0, 0), (3, 7, 3)), (), (0, 7, 3)),
        ((slice(-3, -1),), Box((2, 0, 0), (4, 7, 3)), (), (2, 7, 3)),
        ((slice(None, None, 2), slice(1, 5)), Box((0, 1, 0), (5, 5, 3)), (), (3, 4, 3)),
        ((np.int64(3), np.int32(-1)), Box((3, 6, 0), (4, 7, 3)), (0, 1), (3,)),
    ],
)
def test_parse_examples(key, box, squeeze, result):
    sel = parse(key, SHAPE)
    assert sel.box == box
    assert sel.squeeze == squeeze
    assert sel.result_shape == result
    a = np.arange(np.prod(SHAPE)).reshape(SHAPE)
    assert np.array_equal(apply(a, key), a[key])


def test_steps_are_recorded():
    sel = parse((slice(None, None, 2), slice(1, 6, 3)), SHAPE)
    assert sel.strided
    assert sel.steps == (2, 3, 1)
    assert sel.result_shape == (3, 2, 3)
    assert not parse((slice(0, 2, 1),), SHAPE).strided


def test_zero_dim_shape():
    for key in ((), Ellipsis):
        sel = parse(key, ())
        assert sel.box == Box((), ()) and sel.result_shape == ()
    with pytest.raises(BoundsError, match="too many indices"):
        parse(0, ())


@pytest.mark.parametrize(
    "key, dim, text",
    [
        (5, 0, "index 5"),
        (-6, 0, "index -6"),
        ((0, 7), 1, "index 7"),
        ((0, 0, -4), 2, "index -4"),
        ((slice(0, 6),), 0, "slice bound 6"),
        ((slice(-6, None),), 0, "slice bound -6"),
        ((slice(None), slice(8, None)), 1, "slice bound 8"),
        ((Ellipsis, slice(0, 4)), 2, "slice bound 4"),
    ],
)
def test_out_of_bounds_names_dataset_and_dimension(key, dim, text):
    with pytest.raises(BoundsError) as ei:
        parse(key, SHAPE, "dataset '/fields/T'")
    msg = str(ei.value)
    assert "/fields/T" in msg
    assert f"dimension {dim}" in msg
    assert text in msg
    assert isinstance(ei.value, IndexError) and isinstance(ei.value, LaminaError)


def test_too_many_indices():
    with pytest.raises(BoundsError, match="too many indices"):
        parse((0, 0, 0, 0), SHAPE, "dataset 'x'")
    with pytest.raises(BoundsError, match="too many indices"):
        parse((0, 0, 0, 0, Ellipsis), SHAPE, "dataset 'x'")


@pytest.mark.parametrize(
    "key, text",
    [
        ((Ellipsis, Ellipsis), "single ellipsis"),
        ((slice(None, None, -1),), "step must be a positive"),
        ((slice(None, None, 0),), "step must be a positive"),
        ((slice(0.5, 2),), "slice bounds must be integers"),
        ((slice(True, 2),), "slice bounds must be integers"),
        ((slice(np.array(1.0), 2),), "slice bounds must be integers"),
        ((slice(np.array(True), 2),), "slice bounds must be integers"),
        ((slice(np.array([1]), 2),), "slice bounds must be integers"),
        ((None,), "np.newaxis"),
        ((True,), "unsupported index"),
        ((1.0,), "unsupported index"),
        (([0, 1],), "unsupported index"),
        (("a",), "unsupported index"),
    ],
)
def test_unsupported_keys_raise_index_error(key, text):
    with pytest.raises(IndexError, match=text) as ei:
        parse(key, SHAPE, "dataset 'x'")
    assert "dataset 'x'" in str(ei.value)


def test_zero_d_integer_arrays_bound_slices_as_in_numpy():
    """numpy takes a 0-D integer array for a slice bound (its __index__); lamina refused it."""
    a = np.arange(math.prod(SHAPE)).reshape(SHAPE)
    for key in [
        (slice(np.array(1), np.array(3)),),
        (slice(None, np.array(-1)), slice(np.uint8(1), None)),
        (Ellipsis, slice(np.array(1, dtype=np.uint64), np.array(3, dtype=np.int8))),
    ]:
        sel = parse(key, SHAPE, "dataset 'x'")
        assert np.array_equal(a[sel.box.slices].reshape(sel.result_shape), a[key]), key


# --------------------------------------------------------------------------
# property test against numpy on a real array


@st.composite
def in_bounds_keys(draw, shape):
    """Keys made of ints, slices (with positive steps) and at most one Ellipsis, all in bounds."""
    items = []
    for n in shape:
        kind = draw(st.sampled_from(["int", "slice", "full"] if n else ["slice", "full"]))
        if kind == "int":
            items.append(draw(st.integers(-n, n - 1)))
        elif kind == "full":
            items.append(slice(None))
        else:
            a = draw(st.one_of(st.none(), st.integers(-n, n)))
            b = draw(st.one_of(st.none(), st.integers(-n, n)))
            s = draw(st.one_of(st.none(), st.integers(1, 4)))
            items.append(slice(a, b, s))
    # optionally drop trailing full slices, or (not both: the meaning would shift) replace a
    # run of full slices, possibly empty, by Ellipsis
    how = draw(st.sampled_from(["explicit", "drop", "ellipsis"]))
    if how == "drop":
        while items and items[-1] == slice(None):
            items.pop()
    elif how == "ellipsis":
        i = draw(st.integers(0, len(items)))
        j = draw(st.integers(i, len(items)))
        if all(k == slice(None) for k in items[i:j]):
            items = items[:i] + [Ellipsis] + items[j:]
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


def shapes_and_keys(keys, sizes: st.SearchStrategy, ndims: tuple[int, int]) -> st.SearchStrategy:
    """(shape, key) pairs: a shape of *ndims* (lo, hi) dimensions of *sizes*, and a key of
    strategy *keys* (a function of the shape) for it."""
    return st.lists(sizes, min_size=ndims[0], max_size=ndims[1]).flatmap(
        lambda sh: st.tuples(st.just(tuple(sh)), keys(tuple(sh)))
    )


@given(shapes_and_keys(in_bounds_keys, st.integers(0, 6), (0, 4)))
def test_parse_matches_numpy(args):
    shape, key = args
    a = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    expect = a[key]
    got = apply(a, key)
    assert got.shape == np.shape(expect)
    assert np.array_equal(got, expect)


@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=3).flatmap(
        lambda sh: st.tuples(st.just(tuple(sh)), st.integers(0, len(sh) - 1), st.integers(1, 10))
    )
)
def test_out_of_bounds_int_always_bounds_error(args):
    shape, dim, excess = args
    for idx in (shape[dim] - 1 + excess, -shape[dim] - excess):
        key = tuple([0] * dim + [idx])
        with pytest.raises(BoundsError, match=f"dimension {dim}"):
            parse(key, shape, "dataset 'p'")


def test_zero_d_integer_arrays_are_integer_indices_as_in_numpy():
    a = np.arange(105).reshape(SHAPE)
    for key in (np.array(2), (np.array(-1), np.int16(3)), (Ellipsis, np.array(1, dtype=np.uint8))):
        np.testing.assert_array_equal(apply(a, key), a[key])


@pytest.mark.parametrize("key", [None, (None, 0), (0, None, 1), (None, 0, 0, Ellipsis)])
def test_newaxis_is_named_as_what_is_refused(key):
    """np.newaxis takes no dimension: the refusal names it, not a count of indices."""
    with pytest.raises(LaminaError, match=r"np.newaxis \(None\) is not supported"):
        parse(key, SHAPE, "dataset 'a'")


def test_the_quick_paths_agree_with_the_general_parse():
    """The whole-dataset and slices-only paths of parse give what the general path gives,
    errors included (float or bool bounds and steps, numpy integers, out of bounds, 0-D)."""
    import random

    from lamina import selection

    rng = random.Random(7)
    bounds = [None, 0, 1, 2, -1, -2, 3, 5, -5, 6, -6, 7, True, False, np.int64(2), 1.0]
    steps = [None, 1, 2, 0, -1, True, 1.0, np.int64(1)]

    def item():
        r = rng.random()
        if r < 0.7:
            return slice(rng.choice(bounds), rng.choice(bounds), rng.choice(steps))
        return rng.choice([0, -1, 4, Ellipsis, np.int64(1)])

    def outcome(fn, key, shape):
        try:
            s = fn(key, shape, "ds")
        except Exception as e:
            return type(e).__name__, str(e)
        types = [type(x) for x in s.box.start + s.box.stop]
        return s.box, s.squeeze, s.steps, types

    for _ in range(20_000):
        shape = tuple(rng.randint(0, 6) for _ in range(rng.randint(0, 3)))
        key = item() if rng.random() < 0.2 else tuple(item() for _ in range(rng.randint(0, 4)))
        assert outcome(parse, key, shape) == outcome(selection._parse, key, shape), (key, shape)


def test_stepped_reads_are_read_in_pieces_and_own_their_memory(tmp_path, monkeypatch):
    """``ds[::k]`` reads its span a piece at a time (a piece a few values long here) and keeps
    only the selected values: the same values as numpy for 400 random stepped keys over
    blocks written apart, fill between them, at every level of cutting; the result owns
    its memory (a view of the whole span kept every byte of it alive)."""
    import lamina
    from lamina.api import dataset as dataset_mod

    rng = np.random.default_rng(7)
    shape = (9, 11, 6)
    a = np.full(shape, -1.0)
    path = str(tmp_path / "s.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("a", shape=shape, dtype="f8", fill=-1.0)
        with f.step():
            for lo in ((0, 0, 0), (5, 3, 0), (2, 8, 3)):
                box = Box(lo, tuple(min(x + 5, n) for x, n in zip(lo, shape, strict=True)))
                block = rng.random(box.shape)
                ds.write(block, offset=lo)
                a[box.slices] = block
    reads = []
    with lamina.open(path) as f:
        ds = f["a"]
        real = ds.read
        monkeypatch.setattr(
            ds, "read", lambda box, out=None: reads.append(box.size * 8) or real(box, out=out)
        )
        for piece, direct in ((8, 1 << 30), (40, 1 << 30), (40, 16), (1 << 20, 1 << 30)):
            monkeypatch.setattr(dataset_mod, "STRIDED_PIECE", piece)
            monkeypatch.setattr(dataset_mod, "STRIDED_DIRECT", direct)  # indices read in place
            for _ in range(100):
                key = []
                for n in shape:
                    lo, hi = sorted(int(x) for x in rng.integers(-n, n + 1, 2))
                    key.append(
                        int(rng.integers(-n, n))
                        if rng.random() < 0.15
                        else slice(lo, hi, int(rng.integers(1, 5)))
                    )
                reads.clear()
                got = ds[tuple(key)]
                want = a[tuple(key)]
                assert np.array_equal(got, want), (key, piece)
                if not any(isinstance(k, slice) and k.step > 1 for k in key):
                    continue  # (a box read as it is)
                if isinstance(got, np.ndarray) and got.ndim:
                    assert got.base is None or got.base.nbytes == got.nbytes, key
                # a read is a piece at most, or a part of the result read where it goes
                assert max(reads, default=0) <= max(piece, want.nbytes), (key, reads)


# --------------------------------------------------------------------------
# reads with a list of indices or a boolean mask (one vector a selection, as h5py)


def read_like_a_dataset(a: np.ndarray, key, boxes: list | None = None):
    """*key* of *a* read the way Dataset.__getitem__ reads it (boxes, then numpy's picking)."""

    def read(box, out):
        if boxes is not None:
            boxes.append(box)
        if out is None:
            return a[box.slices].copy()
        out[...] = a[box.slices]
        return out

    return _select(key, a.shape, "dataset 'a'", read, a.dtype)


A3 = np.arange(6 * 7 * 8, dtype="f8").reshape(6, 7, 8)


@pytest.mark.parametrize(
    "key",
    [
        [0, 2],
        [5, 0, 0, -1],
        np.array([3], dtype=np.uint8),
        [],
        np.array([], dtype=np.int64),
        (slice(None), [1, 2]),
        (
            0,
            slice(None),
            [1, 7],
        ),  # an integer apart from the list: numpy puts the list's axis first
        (0, [1, 2], 0),
        ([0, 1], slice(None), 0),
        (Ellipsis, [1, 3]),
        ([2, 1], Ellipsis),
        (slice(None, None, 2), [6, 0], slice(1, 5, 2)),
        (np.int64(1), [0], 2),
        (np.arange(6) % 2 == 0,),
        (slice(1, 3), np.arange(7) > 3),
        (A3[..., 0] > 20,),
        (A3[:, :, 0] > 2000,),  # selects nothing
        (A3 > 100,),
    ],
    ids=repr,
)
def test_a_list_or_a_mask_reads_as_numpy_indexes(key):
    want = A3[key]
    got = read_like_a_dataset(A3, key)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_index_sequences_of_any_kind_read_as_numpy_takes_them(tmp_path):
    """numpy (and h5py) take any sequence of indices inside a key: a tuple, a range, an
    array of a subclass (a memory map, a masked array) or anything numpy makes an array
    of (an xarray DataArray); a 0-d masked integer is an integer.  A file's dataset
    reads them alike."""
    import xarray as xr

    import lamina

    mm = np.memmap(tmp_path / "idx.bin", dtype=np.int64, mode="w+", shape=(2,))
    mm[:] = [1, 3]
    keys = [
        (slice(None), (1, 3)),
        (slice(None), range(1, 3)),
        (Ellipsis, range(0, 8, 3)),
        (slice(None), np.ma.array([1, 3])),
        (slice(None), mm),
        (slice(None), xr.DataArray([1, 3])),
        (np.ma.array(1),),
        (slice(None), np.ma.array(np.arange(7) > 3)),
        (1, (0, 2), slice(2, 4)),
        (slice(None), ()),
    ]
    with lamina.open(str(tmp_path / "a.lam"), "w") as f:
        f.create_dataset("a", data=A3)
    with lamina.open(str(tmp_path / "a.lam")) as f:
        for key in keys:
            want = A3[key]
            got = f["a"][key]
            assert got.shape == want.shape, key
            np.testing.assert_array_equal(got, want)
            assert read_like_a_dataset(A3, key).shape == want.shape
        with pytest.raises(SelectionError, match=r"one list of indices .* got 2 \(items 1, 2\)"):
            f["a"][:, (1, 3), range(2)]
        with pytest.raises(SelectionError, match=r"item 1 of the selection is a list of <U1"):
            f["a"][:, ("a",)]


@st.composite
def vector_keys(draw, shape):
    """A basic key (ints, slices) with one axis taken by a list of indices or a 1-D mask."""
    ax = draw(st.integers(0, len(shape) - 1))
    items: list = [slice(None)] * len(shape)
    for d, n in enumerate(shape):
        if d != ax:
            items[d] = draw(
                st.one_of(
                    st.integers(-n, n - 1),
                    st.builds(slice, st.integers(0, n), st.integers(0, n), st.integers(1, 3)),
                    st.just(slice(None)),
                )
            )
    n = shape[ax]
    if draw(st.booleans()):
        items[ax] = draw(st.lists(st.integers(-n, n - 1), max_size=8))
    else:
        items[ax] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    return tuple(items)


@given(shapes_and_keys(vector_keys, st.integers(1, 6), (1, 3)))
def test_vector_reads_match_numpy(args):
    shape, key = args
    a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    got = read_like_a_dataset(a, key)
    assert got.shape == a[key].shape
    np.testing.assert_array_equal(got, a[key])


def test_vector_keys_with_an_ellipsis_read_as_numpy_indexes():
    """Every key of up to 4 items over 3 axes with one list or mask, integers, slices and
    at most one Ellipsis, against numpy: an Ellipsis between the list and an integer parts
    them even where it stands for no axis, and numpy then puts the list's axis first
    (a[:, 0, ..., [0, 1, 2]] read transposed)."""
    import itertools

    a = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    items = [slice(None), slice(1, 3), 0, -1, Ellipsis]
    checked = 0
    for n in range(1, 5):
        for rest in itertools.product(items, repeat=n - 1):
            if sum(k is Ellipsis for k in rest) > 1:
                continue
            for at in range(n):
                key = rest[:at] + ([0, 2, -1],) + rest[at:]
                try:
                    want = a[key]
                except IndexError:
                    continue
                got = read_like_a_dataset(a, key)
                assert got.shape == want.shape, key
                np.testing.assert_array_equal(got, want, err_msg=repr(key))
                checked += 1
    assert checked > 250


def test_a_sparse_list_reads_its_rows_not_the_span_between():
    """ds[[0, 999_999]] reads two rows, not the megabytes between them; near rows are read together."""
    a = np.zeros((1_000_000, 4))
    boxes: list = []
    read_like_a_dataset(a, [999_999, 0, 3], boxes)
    assert sum(b.size for b in boxes) * 8 < 1 << 10, boxes
    assert len(boxes) == 2  # rows 0 and 3 together, 999_999 apart


@pytest.mark.parametrize("dtype", [">i4", ">f8", "<i2"])
def test_a_list_read_in_several_runs_keeps_the_dataset_s_dtype(dtype):
    """Rows read in several runs were joined by np.concatenate, which makes big-endian
    native: ds[[1, 999_999]] of a '>i4' dataset gave int32 where numpy and h5py give '>i4'."""
    a = np.arange(1_000_000).astype(dtype)
    for key in ([1, 999_999], [5, 900_000, 3], np.arange(a.size) % 250_000 == 7):
        boxes: list = []
        got = read_like_a_dataset(a, key, boxes)
        assert len(boxes) > 1
        assert got.dtype == a[key].dtype and np.array_equal(got, a[key])


@pytest.mark.parametrize(
    "key, error, text",
    [
        ([[0, 1]], SelectionError, r"2-D array of indices"),
        ([0.5], SelectionError, r"list of float64 values"),
        (
            ([0], [1]),
            SelectionError,
            r"one list of indices or boolean mask per selection.*items 0, 1",
        ),
        ([6], BoundsError, r"index 6 is out of bounds for dimension 0 of size 6"),
        ((0, [-8]), BoundsError, r"index -8 is out of bounds for dimension 1 of size 7"),
        (
            np.ones(5, bool),
            BoundsError,
            r"mask of shape \(5,\) does not match dimension 0 of size 6",
        ),
        ((slice(None), np.ones((7, 8), bool)), SelectionError, r"2-D boolean mask must come first"),
        ((None, [0]), SelectionError, r"np.newaxis"),
        ((Ellipsis, [0], Ellipsis), SelectionError, r"single ellipsis"),
        ((0, 0, 0, [0]), BoundsError, r"too many indices"),
        # (taken as int64 it was -1: the last row, silently)
        (np.array([2**64 - 1], dtype=np.uint64), BoundsError, r"index 18446744073709551615 is out"),
    ],
    ids=str,
)
def test_bad_vector_keys_name_the_item_and_the_limit(key, error, text):
    with pytest.raises(error, match=text) as ei:
        read_like_a_dataset(A3, key)
    assert "dataset 'a'" in str(ei.value)


@pytest.mark.parametrize("shape", [(), (4,)])
@pytest.mark.parametrize("key", [True, np.True_, False, (True,), np.array(False), (Ellipsis, True)])
def test_a_boolean_scalar_is_refused_alike_on_every_shape(shape, key):
    """ds[True] of a 0-D dataset said 'too many indices (1) for 0 dimensions'; of a 1-D one
    'unsupported index': the same refusal, naming it, on both."""
    with pytest.raises(SelectionError, match=r"unsupported index .*boolean scalar adds an axis"):
        parse(key, shape, "dataset 'b'")


@pytest.mark.parametrize(
    "shape, key",
    [((0,), []), ((0,), np.zeros(0, bool)), ((3, 0), (slice(None), [])), ((3, 0), (0, []))],
)
def test_an_empty_list_on_an_axis_of_size_0_reads_as_numpy(shape, key):
    """ds[[]] of a dataset of shape (0,) (ds[ds[...] > 0] of an empty one) was a BoundsError."""
    a = np.zeros(shape)
    got = read_like_a_dataset(a, key)
    assert got.shape == a[key].shape


def test_a_list_of_spread_indices_reads_a_piece_at_a_time(monkeypatch):
    """Evenly spread indices were read as one run of their whole span (1e5 of 1e7: twice the
    dataset's memory for 0.8 MB); a run spans at most STRIDED_PIECE bytes."""
    from lamina.api import dataset as dataset_mod

    monkeypatch.setattr(dataset_mod, "STRIDED_PIECE", 64 * 8 * 100)  # 100 rows of 64 float64
    a = np.arange(1000 * 64, dtype="f8").reshape(1000, 64)
    key = list(range(0, 1000, 3))
    boxes: list = []
    np.testing.assert_array_equal(read_like_a_dataset(a, key, boxes), a[key])
    assert max(b.shape[0] for b in boxes) <= 100 and len(boxes) == 10
