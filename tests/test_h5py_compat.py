"""The same calls on h5py and on lamina, side by side: lamina behaves as h5py does, or differs on purpose.

h5py itself is the oracle. Each difference lamina keeps on purpose is listed
in docs/api.md ("Differences from h5py") and tested here as a difference.
"""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest

import lamina
from lamina.errors import CodecError, DTypeError, RangeError, ShapeError

pytestmark = pytest.mark.usefixtures("fast_native")


@pytest.fixture
def pair(tmp_path):
    """(an h5py file, a lamina file opened for writing), closed afterwards."""
    h = h5py.File(tmp_path / "oracle.h5", "w")
    f = lamina.open(tmp_path / "same.lam", "w")
    yield h, f
    h.close()
    f.close()


def both(pair, name, **kw):
    h, f = pair
    return h.create_dataset(name, **kw), f.create_dataset(name, **kw)


# ------------------------------------------------------------------ 0-D datasets


def test_zero_dim_reads(pair):
    hd, ld = both(pair, "s", shape=(), dtype="f8")
    hd[()] = 2.5
    ld[()] = 2.5
    pair[1].end_step()
    for key in ((), Ellipsis):
        h, v = hd[key], ld[key]
        assert type(h) is type(v) and np.asarray(h).shape == np.asarray(v).shape, key
        assert h == v
    assert (
        isinstance(ld[...], np.ndarray) and ld[...].shape == () and isinstance(ld[()], np.float64)
    )


def test_scalar_and_ellipsis_selections_of_nd_datasets(pair):
    hd, ld = both(pair, "a", shape=(3, 4), dtype="i4")
    data = np.arange(12, dtype="i4").reshape(3, 4)
    hd[...] = data
    ld[...] = data
    pair[1].end_step()
    for key in ((1, 2), (Ellipsis, 1, 2), (1, Ellipsis), (slice(None), 2), ()):
        h, v = hd[key], ld[key]
        assert type(h) is type(v) and np.array_equal(h, v), key


# ------------------------------------------------------------------ writes: broadcasting and Python values


@pytest.mark.parametrize(
    "shape, key, value",
    [
        ((10,), slice(None), np.ones((1, 10))),
        ((10,), slice(2, 5), np.ones((1, 1, 3))),
        ((4, 3), slice(None), np.arange(3.0)),
        ((4, 3), (0, slice(None)), np.ones((1, 3))),
        ((4, 3), slice(None), 7.0),
    ],
)
def test_writes_broadcast_as_numpy_does(pair, shape, key, value):
    hd, ld = both(pair, "b", shape=shape, dtype="f8")
    hd[key] = value
    ld[key] = value
    pair[1].end_step()
    assert np.array_equal(hd[...], ld[...])


def test_writes_that_do_not_broadcast_fail_on_both(pair):
    hd, ld = both(pair, "b", shape=(10,), dtype="f8")
    with pytest.raises((TypeError, ValueError)):
        hd[:] = np.ones((2, 10))
    with pytest.raises(ShapeError):
        ld[:] = np.ones((2, 10))


def test_a_ragged_list_is_a_value_error_on_both(pair):
    """Rows of different lengths: numpy and h5py raise ValueError; lamina a ShapeError (a
    ValueError) naming the dataset, in every way of writing, as create_dataset's data= does."""
    hd, ld = both(pair, "r", shape=(2, 2), dtype="i4")
    ragged = [[1, 2], [3]]
    with pytest.raises(ValueError):
        hd[...] = ragged
    for write in (
        lambda: ld.__setitem__(Ellipsis, ragged),
        lambda: ld.write(ragged),
        lambda: ld.write_blocks([ragged], [(0, 0)]),
        lambda: ld.__setitem__(Ellipsis, ([1, 2], (3,))),
    ):
        with pytest.raises(ShapeError, match="dataset '/r': the value is not an array of one"):
            write()
    with pytest.raises(DTypeError, match="cannot write"):  # one shape, but no numbers
        ld[...] = [[1, "a"], [2, 3]]


@pytest.mark.parametrize(
    "dtype, value",
    [("i1", 300), ("i1", -129), ("u1", -1), ("u1", 256), ("u2", 70000), ("i8", 2**63), ("u8", -5)],
)
def test_python_ints_out_of_range_are_refused(pair, dtype, value):
    """numpy and h5py raise OverflowError; lamina's RangeError is one."""
    hd, ld = both(pair, "x", shape=(2,), dtype=dtype)
    with pytest.raises(OverflowError):
        hd[0] = value
    with pytest.raises(OverflowError) as ei:
        ld[0] = value
    assert isinstance(ei.value, RangeError) and "'/x'" in str(ei.value)
    with pytest.raises(OverflowError):
        ld[...] = [0, value]


@pytest.mark.parametrize(
    "dtype, value",
    [
        ("u1", 5),
        ("u1", 255),
        ("?", 1),
        ("?", True),
        ("i1", -128),
        ("u8", 2**64 - 1),
        ("f4", 3),
        ("i2", 2.0),
        # numpy scalars are one value each, as a Python number (numpy and h5py store them)
        ("u1", np.int64(5)),
        ("u1", np.int8(5)),
        ("i4", np.float64(2.0)),
        ("?", np.int64(1)),
        ("f4", np.float64(0.5)),
    ],
)
def test_python_values_in_range_are_written(pair, dtype, value):
    hd, ld = both(pair, "x", shape=(3,), dtype=dtype)
    hd[1] = value
    ld[1] = value
    hd[...] = [value] * 3
    pair[1].end_step()
    ld[...] = [value] * 3
    pair[1].end_step()
    assert np.array_equal(hd[...], ld[...]) and ld[1] == np.array(value).astype(dtype)


def test_a_float_too_big_for_float32_is_refused(pair):
    """numpy stores inf (with a warning); lamina refuses a Python number its dtype cannot hold."""
    _, ld = both(pair, "x", shape=(1,), dtype="f4")
    with pytest.raises(RangeError, match="float32"):
        ld[0] = 1e300
    with pytest.raises(RangeError, match=r"np.float64\(1e\+300\).*float32"):
        ld[0] = np.float64(1e300)  # a numpy scalar as the Python number it holds
    ld[0] = float("inf")  # infinities and NaN are values of the dtype
    pair[1].end_step()
    assert ld[0] == np.inf


def test_complex_into_real_is_refused(pair):
    hd, ld = both(pair, "x", shape=(1,), dtype="f8")
    with pytest.raises(TypeError):
        hd[0] = 1j
    with pytest.raises(DTypeError):
        ld[0] = 1j
    # a numpy complex scalar: h5py stores its real part; lamina refuses it as a Python complex
    with pytest.warns(np.exceptions.ComplexWarning):
        hd[0] = np.complex128(2 + 0j)
    assert hd[0] == 2.0
    with pytest.raises(DTypeError):
        ld[0] = np.complex128(2 + 0j)


@pytest.mark.parametrize("dtype", ["u1", "u4", "?", "i1"])
@pytest.mark.parametrize("src", ["i8", "i1", "u8", "?"])
def test_integer_arrays_into_any_integer_or_bool_dataset(pair, dtype, src):
    """An ``np.arange`` into a uint dataset, a 0/1 array into a bool one: h5py and numpy take
    them, and lamina does too, as numpy's astype makes them (h5py saturates, lamina wraps:
    docs/api.md); in every way of writing."""
    data = np.array([0, 1, 2, 100, 3, 1], dtype=np.int64).astype(src).reshape(2, 3)
    want = data.astype(dtype)
    hd, ld = both(pair, "v", shape=(2, 3), dtype=dtype)
    hd[...] = data
    np.testing.assert_array_equal(hd[...], want)  # (all in range: h5py's saturation agrees)
    f = pair[1]
    w = f.create_dataset("w", (2, 3), dtype)
    b = f.create_dataset("b", (2, 3), dtype)
    ld[...] = data
    w.write(data[:1], offset=(0, 0))
    w.write(data[1:], offset=(1, 0), copy=False)
    b.write_blocks([data[:, :2], data[:, 2:]], [(0, 0), (0, 2)])
    d = f.create_dataset("d", data=data, dtype=dtype)
    f.end_step()
    for got in (ld, w, b, d):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got[...], want)
    if src == "i8" and dtype == "u1":  # out of range: numpy's astype wraps
        f.create_dataset("neg", data=np.array([-1, 300]), dtype="u1")
        f.end_step()
        assert f["neg"][...].tolist() == [255, 44]


def test_float_arrays_into_integer_or_bool_datasets_are_refused(pair):
    f = pair[1]
    for dtype in ("i4", "u1", "?"):
        ds = f.create_dataset(f"x{dtype}", (2,), dtype)
        with pytest.raises(DTypeError, match=f"float64 data to dataset 'x{re.escape(dtype)}'"):
            ds[...] = np.array([1.0, 0.0])


# ------------------------------------------------------------------ create_dataset


def test_create_dataset_from_data(pair):
    data = np.arange(6, dtype="u2").reshape(2, 3)
    hd, ld = both(pair, "d", data=data)
    pair[1].end_step()
    assert hd.shape == ld.shape == (2, 3) and hd.dtype == ld.dtype == np.dtype("u2")
    assert np.array_equal(ld[...], data)
    _, ld2 = both(pair, "e", data=[1.5, 2.5])
    pair[1].end_step()
    assert ld2.shape == (2,) and ld2.dtype == np.float64


@pytest.mark.parametrize("shape", [(2.5,), (3, 1.0), ("4",), (True,), 2.5])
def test_shapes_must_be_integers(pair, shape):
    """numpy refuses them (h5py takes (2.5,) as (2,)): lamina refuses, as numpy does (a difference from h5py)."""
    _, f = pair
    with pytest.raises(TypeError):
        np.empty(shape)
    with pytest.raises(ShapeError, match="not an integer|not an int"):
        f.create_dataset("s", shape=shape)


def test_a_shape_may_be_a_numpy_array_as_in_h5py(pair):
    for given, want in ((np.array([2, 3]), (2, 3)), ([np.int8(2)], (2,))):
        hd, ld = both(pair, f"s{len(want)}{want[0]}", shape=given, dtype="f4")
        assert hd.shape == ld.shape == want
    assert pair[1].create_dataset("s0", shape=np.array(4)).shape == (4,)  # as np.empty, not h5py
    with pytest.raises(
        ShapeError, match=r"shape array\(\[\[1, 2\]\]\) is not an int or a sequence"
    ):
        pair[1].create_dataset("bad", shape=np.array([[1, 2]]))


# ------------------------------------------------------------------ numpy conversion and attributes


def test_numpy_conversion(pair):
    hd, ld = both(pair, "a", shape=(3,), dtype="f4")
    hd[...] = [1, 2, 3]
    ld[...] = [1, 2, 3]
    pair[1].end_step()
    assert np.array_equal(np.asarray(hd), np.asarray(ld))
    assert np.array(ld, dtype="f8").dtype == np.float64
    with pytest.raises(ValueError):
        np.array(hd, copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        np.array(ld, copy=False)


def test_attribute_lists_of_strings_come_back_as_arrays(pair):
    h, f = pair
    for obj in (h, f):
        obj.attrs["names"] = ["u", "v", "wé"]
        obj.attrs["one"] = "text"
    f.end_step() if f.engine.in_step else None
    hv, lv = h.attrs["names"], f.attrs["names"]
    assert isinstance(hv, np.ndarray) and isinstance(lv, np.ndarray)
    assert hv.tolist() == lv.tolist() == ["u", "v", "wé"] and lv.dtype == hv.dtype == object
    assert h.attrs["one"] == f.attrs["one"] == "text"


# ------------------------------------------------------------------ differences kept on purpose (docs/api.md)


def test_slices_past_the_end_are_errors_not_clipped(pair):
    hd, ld = both(pair, "a", shape=(4,), dtype="f8")
    assert hd[2:10].shape == (2,)  # h5py and numpy clip
    with pytest.raises(lamina.BoundsError):
        ld[2:10]  # lamina: a box that does not fit is a decomposition bug, said at once


def test_invalid_names_are_not_found(pair):
    _, f = pair
    f.create_dataset("x", shape=(1,))
    with pytest.raises(lamina.NotFoundError, match="'../../etc/passwd'"):
        f["../../etc/passwd"]
    assert "../x" not in f


def test_dot_names_the_group_and_an_empty_name_nothing(pair):
    """'.' components name the group they are in; '' names nothing (lamina refused '.' and
    took '' for the group)."""
    h, f = pair
    for g in (h, f):
        g.create_group("g").create_dataset("x", shape=(2,), dtype="f4")
        assert "" not in g and "." in g and "./g/./x" in g and "g/." in g
        assert g["."].name == "/" and g["g/."].name == "/g" and g["./g/x"].name == "/g/x"
        assert g["g"]["."].name == "/g"
        with pytest.raises(KeyError):
            g[""]
    with pytest.raises(ValueError):
        f.create_group("")
    assert "g/.." not in f  # '..' stays refused (a difference: h5py has no '..' either)


def test_truth_is_whether_the_file_is_open(pair):
    """As h5py's: an empty group is true while the file is open (it was false: len 0); a
    group, dataset or file of a closed file is false."""
    made = []
    for g in pair:
        made.append((g, g.create_group("empty"), g.create_dataset("d", shape=(0,), dtype="f4")))
        assert all(made[-1])
    for g, e, d in made:
        g.close()
        assert not g and not e and not d


# ------------------------------------------------------------------ groups, definitions, iteration


def test_creating_a_group_that_exists_is_refused_as_h5py_refuses_it(pair):
    h, f = pair
    h.create_group("a")
    f.create_group("a")
    for name in ("a", "/"):
        with pytest.raises(ValueError):
            h.create_group(name)
        with pytest.raises(lamina.ExistsError, match="require_group returns it"):
            f.create_group(name)
    assert f.require_group("a").name == "/a"


def test_data_that_does_not_fit_the_shape_defines_nothing(pair):
    """h5py checks data against the shape before it creates the dataset; so does lamina now
    (the dataset stayed defined, and a corrected retry was an ExistsError)."""
    h, f = pair
    with pytest.raises((ValueError, TypeError)):
        h.create_dataset("x", shape=(4,), data=[1, 2, 3])
    with pytest.raises(ShapeError, match=r"data of shape \(3,\) does not fit its shape \(4,\)"):
        f.create_dataset("x", shape=(4,), data=[1, 2, 3])
    assert "x" not in f
    f.create_dataset("x", shape=(4,), data=[1, 2, 3, 4])
    f.create_dataset("y", shape=(2, 3), data=[[[1, 2, 3]]])  # leading axes of length 1 go


def test_data_of_as_many_elements_is_reshaped_as_h5py_does(pair):
    """Data of another shape with the dataset's number of elements is taken in C order, as
    h5py takes it; data that broadcasts to the shape is written broadcast (h5py refuses it)."""
    h, f = pair
    for name, shape, data in (
        ("a", (3, 2), np.arange(6.0).reshape(2, 3)),
        ("b", (6,), [[0, 1, 2], [3, 4, 5]]),
    ):
        hd = h.create_dataset(name, shape=shape, data=data)
        ld = f.create_dataset(name, shape=shape, data=data, dtype=hd.dtype)
        assert ld.shape == hd.shape == shape
    with pytest.raises(ValueError):
        h.create_dataset("c", shape=(3, 2), data=[1, 2])
    f.create_dataset("c", shape=(3, 2), data=[1, 2], dtype="i8")
    with pytest.raises(ShapeError, match=r"\(5,\) does not fit its shape \(3, 2\).*hold 6"):
        f.create_dataset("d", shape=(3, 2), data=np.arange(5))
    f.end_step()
    for name in ("a", "b"):
        np.testing.assert_array_equal(f[name][...], h[name][...])
    assert f["c"][...].tolist() == [[1, 2]] * 3


def test_iterating_a_dataset_reads_its_rows_as_h5py(pair):
    """Rows along the first axis; a 0-D dataset cannot be iterated; a missing step raises
    (without __iter__ Python stopped at the first IndexError, which a StepError is: [])."""
    h, f = pair
    ha, fa = both(pair, "a", data=np.arange(6.0).reshape(3, 2))
    hs, fs = both(pair, "s", data=np.float64(5))
    with pytest.raises(lamina.StepError):
        list(fa)  # nothing committed yet
    f.end_step()
    assert [r.tolist() for r in fa] == [r.tolist() for r in ha]
    for ds in (hs, fs):
        with pytest.raises(TypeError):
            list(ds)
        assert bool(ds)


def test_an_attribute_name_that_is_not_a_string_is_a_type_error(pair):
    h, f = pair
    f.attrs["a"] = 1
    with pytest.raises(TypeError, match="attribute names are strings, got 5"):
        f.attrs[5]
    for g in pair:  # set and deleted too (a ValueError when set); bytes taken as UTF-8
        with pytest.raises(TypeError):
            g.attrs[3] = 1
        g.attrs[b"x"] = 2
        assert g.attrs["x"] == g.attrs[b"x"] == 2 and b"x" in g.attrs
        del g.attrs[b"x"]
        assert "x" not in g.attrs


def test_slash_dot_names_the_root_from_any_group(pair):
    """'/.' (and '/./.') is the root, as in h5py: it was taken as the group asked, so an
    attribute meant for the root landed on '/a/b'."""
    for g0 in pair:
        g = g0.create_group("a/b")
        assert g["/."].name == g["/./."].name == g.require_group("/.").name == "/"
        g["/."].attrs["units"] = "m"
        assert "units" in g0.attrs and "units" not in g.attrs


def test_dot_and_empty_parts_keep_a_name_relative(pair):
    """'.//x' in group '/sub' is '/sub/x', as in h5py: with its '.' dropped, the name began
    with '/' and was taken from the root (a dataset made there; a read of '/y' for '/sub/y')."""
    for g0 in pair:
        sub = g0.create_group("sub")
        g0.create_group("y")
        sub.create_group("y")
        assert sub.create_group(".//x").name == "/sub/x" and "x" in sub and "x" not in g0
        assert sub.create_dataset(".//z", shape=(2,), dtype="f4").name == "/sub/z"
        assert sub[".//y"].name == "/sub/y" and sub[".//"].name == "/sub"
        assert sub["/./y"].name == "/y" and sub["/.//./y"].name == "/y"


def test_attributes_read_back_are_written_again_as_they_read(pair):
    """A list of strings reads back as an array of str objects (h5py's form); writing that
    back was a DTypeError on lamina."""
    for g in pair:
        g.attrs["names"] = ["x", "y"]
        g.attrs["copy"] = g.attrs["names"]
        assert g.attrs["copy"].tolist() == ["x", "y"] and g.attrs["copy"].dtype == object


def test_objects_of_one_file_compare_as_h5py_compares_them(pair):
    for f in pair:
        f.create_group("g")
        f.create_dataset("d", shape=(2,), dtype="f8")
        assert f["g"] == f["g"] and f["d"] == f["d"] and f["d"] in [f["d"]]
        assert len({f["g"], f["g"], f["d"], f["d"]}) == 2 and f == f["/"]
        assert f["g"] != f["d"] and f["d"] != 3


def test_the_fourth_positional_argument_of_create_dataset_is_data(pair):
    """As in h5py (it was lamina's fill: [1, 2, 3] was refused as a fill, 7.0 taken as one)."""
    for f in pair:
        f.create_dataset("a", (3,), "i4", [1, 2, 3])
    pair[1].end_step()
    assert pair[0]["a"][...].tolist() == pair[1]["a"][...].tolist() == [1, 2, 3]
    with pytest.raises(TypeError):
        pair[1].create_dataset("b", (3,), "f8", None, 7.0)  # fill is a keyword


def test_an_attribute_readers_would_refuse_is_refused_when_set(tmp_path):
    """An empty array of shape (0, 2**59) has no bytes but a shape readers refuse: it was
    taken, then every end_step and close raised FormatError until it was deleted."""
    with lamina.open(tmp_path / "z.lam", "w") as f:
        f.create_dataset("d", shape=(4,))
        with pytest.raises(ValueError, match="shape .* cannot be stored"):
            f.attrs["weird"] = np.empty((0, 2**59), "f8")
        assert "weird" not in f.attrs
        with f.step():
            f["d"][...] = 2
    with lamina.open(tmp_path / "z.lam") as f:
        assert f["d"][...].tolist() == [2.0] * 4


def test_an_error_out_of_the_file_discards_the_open_step_not_the_definitions(tmp_path):
    """A difference kept on purpose (docs/api.md): h5py has written the values; lamina's step
    is all or nothing, so the implicit step the error interrupted is not committed, while
    the definitions and attributes made before it are (by the close)."""
    path = tmp_path / "x.lam"
    with pytest.raises(RuntimeError, match="after writing"):
        with lamina.open(path, "w") as f:
            f.create_dataset("d", shape=(4,), dtype="f8")
            f["d"][:] = np.arange(4.0)
            f.attrs["a"] = 1
            raise RuntimeError("a bug after writing")
    with lamina.open(path) as f:
        assert list(f) == ["d"] and f.attrs["a"] == 1 and f.steps == 0


# ------------------------------------------------------------------ members as h5py's views


def test_keys_values_items_are_set_like_views(pair):
    """g.keys() was a list: g.keys() == {"a", "b"} was silently False and g.keys() - {"a"}
    a TypeError, where h5py's KeysViewHDF5 is set-like."""
    h, f = pair
    for g in (h, f):
        g.create_group("b")
        g.create_dataset("a", shape=(2,), dtype="f8")
    for g in (h, f):
        assert g.keys() == {"a", "b"} and g.keys() - {"a"} == {"b"}
        assert list(g.keys()) == ["a", "b"] and "a" in g.keys() and len(g.keys()) == 2
        assert [v.name for v in g.values()] == ["/a", "/b"]
        assert [k for k, _ in g.items()] == ["a", "b"]


def test_assignment_creates_a_dataset_and_get_gives_the_class(pair):
    """f[name] = array was a TypeError; get(name, getclass=True) was refused."""
    h, f = pair
    a = np.arange(6.0).reshape(2, 3)
    h["x"] = a
    with f.step():
        f["x"] = a
    np.testing.assert_array_equal(f["x"][...], h["x"][...])
    assert f["x"].dtype == h["x"].dtype and f["x"].shape == h["x"].shape
    assert f.get("x", getclass=True) is lamina.Dataset and h.get("x", getclass=True) is h5py.Dataset
    assert f.get("nope", getclass=True) is None
    with pytest.raises(TypeError, match=r"lamina has no hard or soft links"):
        f["y"] = f["x"]


def test_pickling_is_a_type_error_naming_the_object(pair):
    """pickle.dumps(ds) failed on whatever it met first inside (a local function, a
    memoryview, mpi4py's communicator); as h5py, a TypeError saying why. copy.copy is the
    same view."""
    import copy
    import pickle

    h, f = pair
    for g in (h, f):
        g.create_dataset("x", shape=(2,), dtype="f8")
    with pytest.raises(TypeError):
        pickle.dumps(h["x"])
    for obj in (f, f["x"], f.require_group("g")):
        for act in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match=r"cannot be pickled or deep-copied: it is a view"):
                act(obj)
        assert copy.copy(obj) is obj


# ------------------------------------------------------------------ h5py's descriptive attributes and visits


def _tree(pair):
    """The same small tree in both files: /a (3, 4) int32, /g/b (5,) float64, /g/h/c () float32."""
    h, f = pair
    data = {"a": np.arange(12, dtype="i4").reshape(3, 4), "g/b": np.linspace(0, 1, 5)}
    data["g/h/c"] = np.float32(1.5)
    for name, v in data.items():
        h.create_dataset(name, data=v)
        f.create_dataset(name, data=v)
    f.end_step()
    return h, f


def test_nbytes_maxshape_and_parent_as_h5py(pair):
    h, f = _tree(pair)
    for name in ("a", "g/b", "g/h/c"):
        assert f[name].nbytes == h[name].nbytes
        assert f[name].maxshape == h[name].maxshape
        assert f[name].parent.name == h[name].parent.name
    for name in ("/", "g", "g/h"):
        assert f[name].parent.name == h[name].parent.name
    assert f.at(0)["g/b"].parent.step == 0  # a view of a step stays at its step


def test_visit_and_visititems_as_h5py(pair):
    h, f = _tree(pair)
    for root in ("/", "g"):
        seen_h: list[str] = []
        seen_l: list[str] = []
        assert h[root].visit(seen_h.append) is None
        assert f[root].visit(seen_l.append) is None
        assert sorted(seen_l) == sorted(seen_h)  # (h5py's order: by name, as lamina's walk)
        kinds_h = {}
        kinds_l = {}
        h[root].visititems(lambda n, o, d=kinds_h: d.update({n: isinstance(o, h5py.Group)}))
        f[root].visititems(lambda n, o, d=kinds_l: d.update({n: isinstance(o, lamina.Group)}))
        assert kinds_l == kinds_h and kinds_l
    # the first value other than None stops the walk and is returned
    stop = lambda n: n if n.endswith("b") else None  # noqa: E731
    assert f.visit(stop) == h.visit(stop) == "g/b"
    found = f.visititems(lambda n, o: o if n == "g/h/c" else None)
    assert isinstance(found, lamina.Dataset) and found.name == "/g/h/c"


@pytest.mark.parametrize(
    "source_sel, dest_shape, dest_sel",
    [
        (None, (3, 4), None),
        (np.s_[1:3, :], (3, 4), np.s_[0:2, :]),
        (np.s_[0:2, 1:3], (5, 6), np.s_[2:4, 3:5]),
        (np.s_[2, :], (4,), None),
        (np.s_[:, ::2], (3, 2), None),
    ],
)
@pytest.mark.parametrize("dtype", ["i4", "f8"])
def test_read_direct_as_h5py(pair, source_sel, dest_shape, dest_sel, dtype):
    h, f = _tree(pair)
    want = np.full(dest_shape, -1, dtype=dtype)
    got = want.copy()
    h["a"].read_direct(want, source_sel, dest_sel)
    assert f["a"].read_direct(got, source_sel, dest_sel) is None
    assert np.array_equal(got, want) and got.dtype == want.dtype
    view = np.full((6, 8), -1, dtype="i4")[::2, ::2]  # any strides: read straight into them
    f["a"].read_direct(view)
    assert np.array_equal(view, h["a"][...])
    part = np.zeros((2, 2), dtype=dtype)  # lamina's own Box as the source, as read() takes it
    f["a"].read_direct(part, lamina.Box((1, 2), (3, 4)))
    assert np.array_equal(part, h["a"][1:3, 2:4])


def test_read_direct_refuses_what_does_not_fit(pair):
    h, f = _tree(pair)
    with pytest.raises(TypeError):
        h["a"].read_direct(np.zeros((2, 2), "i4"), np.s_[0:3, :])
    with pytest.raises(
        ShapeError, match=r"read_direct\(\) of dataset '/a'.*shape \(3, 4\).*\(2, 2\)"
    ):
        f["a"].read_direct(np.zeros((2, 2), "i4"), np.s_[0:3, :])
    with pytest.raises(lamina.BoundsError, match="slice bound 5 is out of bounds"):
        f["a"].read_direct(np.zeros((5, 4), "i4"), np.s_[0:5, :])
    frozen = np.zeros((3, 4), "i4")
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        f["a"].read_direct(frozen)
    with pytest.raises(TypeError, match="must be a numpy array"):
        f["a"].read_direct([[0] * 4] * 3)
    with pytest.raises(ShapeError, match=r"shape \(2, 4\), which does not broadcast to"):
        f["a"].read_direct(np.zeros((5, 4), "i4"), np.s_[0:2, :], [0, 2, 4])


@pytest.mark.parametrize(
    "dataset, source_sel, dest_shape, dest_sel",
    [
        ("a", np.s_[1, 2], (3, 6), np.s_[2, 3]),  # one element into one element
        ("g/h/c", None, (), ()),  # 0-D into 0-D
        ("g/h/c", None, (1,), np.s_[0]),
        ("g/h/c", None, (1,), None),  # broadcast, as h5py's simple selections
        ("a", np.s_[0:1, :], (4, 4), None),
        ("a", None, (1, 3, 4), None),
        ("a", np.s_[1, 2], (1,), None),
        ("a", np.s_[1, :], (9,), np.s_[[0, 2, 4, 6]]),  # a list into dest, as numpy assigns
    ],
)
def test_read_direct_broadcasts_and_takes_any_part_as_h5py(
    pair, dataset, source_sel, dest_shape, dest_sel
):
    h, f = _tree(pair)
    want = np.full(dest_shape, -1.0)
    got = want.copy()
    h[dataset].read_direct(want, source_sel, dest_sel)
    f[dataset].read_direct(got, source_sel, dest_sel)
    assert np.array_equal(got, want)


def test_astype_reads_cast_as_h5py(pair):
    h, f = _tree(pair)
    for name, key in (("a", np.s_[1:3, ::2]), ("a", np.s_[...]), ("g/b", np.s_[2]), ("g/h/c", ())):
        for dt in ("f4", "i2", "u1"):
            want, got = h[name].astype(dt)[key], f[name].astype(dt)[key]
            assert np.asarray(got).dtype == np.asarray(want).dtype and np.array_equal(got, want)
        # (HDF5 has no conversion to complex; lamina casts as numpy does)
        want = np.asarray(h[name][key]).astype("c16")
        assert np.array_equal(f[name].astype("c16")[key], want)
    assert len(f["a"].astype("f4")) == len(h["a"].astype("f4")) == 3
    for k in ("shape", "ndim", "size", "dtype"):
        assert getattr(f["a"].astype("f4"), k) == getattr(h["a"].astype("f4"), k), k
    assert np.array_equal(np.asarray(f["a"].astype("f4")), np.asarray(h["a"].astype("f4")))
    assert np.asarray(f["a"].astype("f4")).dtype == np.float32
    with pytest.raises(DTypeError, match=r"dataset '/a': astype\(<U3\)"):
        f["a"].astype("U3")


def test_require_dataset_as_h5py(pair):
    h, f = _tree(pair)
    for obj in (h, f):
        made = obj.require_dataset("new/d", (2, 3), "f4")
        assert made.shape == (2, 3) and made.dtype == np.float32
        assert obj.require_dataset("new/d", (2, 3), "f4", exact=True) == made
        assert obj.require_dataset("new/d", (2, 3), "f2") == made  # casts safely
        assert obj["g"].require_dataset("b", 5, "f8") == obj["g/b"]  # an int is a shape
    cases = [
        (("a", (4, 3), "i4"), r"dataset '/a' exists with shape \(3, 4\), not the shape \(4, 3\)"),
        (("a", (3, 4), "i8"), r"dtype int32: the dtype int64 asked does not cast safely"),
        (("a", (3, 4), "i2", True), r"dtype int32: the dtype int16 asked is not it"),
        (("g", (3, 4), "i4"), r"'/g' is a group, not a dataset"),
        (("a", (3, 4), "nope"), r"^dataset '/a': not a numpy dtype: 'nope'"),
    ]
    for args, message in cases:
        with pytest.raises(TypeError):
            h.require_dataset(*args)
        with pytest.raises(TypeError, match=message):
            f.require_dataset(*args)
    with pytest.raises(DTypeError):
        f.require_dataset("a", (3, 4), "f8")


@pytest.mark.parametrize(
    "value, words",
    [
        ([["a", "b"], ["c", "d"]], r"not a nested list of them \(2-D\)"),
        (np.array(["a", "b"]), r"not an array of numpy strings \(dtype <U1\): give .tolist\(\)"),
        (b"xy", "decode bytes to str first"),
        ([b"x", b"y"], "decode bytes to str first"),
    ],
)
def test_attribute_strings_lamina_does_not_store_say_what_it_stores(pair, value, words):
    """A flat list of str and one str are the strings lamina stores; the others say so (a
    nested list of str said 'dtype <U1 is not supported: use ... strings')."""
    with pytest.raises(DTypeError, match=f"attribute 'a' on '/': .*{words}"):
        pair[1].attrs["a"] = value


def test_a_ragged_attribute_is_a_shape_error_naming_it(pair):
    """numpy and h5py raise ValueError; lamina a ShapeError (a ValueError), as for data."""
    with pytest.raises(ValueError):
        pair[0].attrs["a"] = [[1, 2], [3]]
    with pytest.raises(ShapeError, match="attribute 'a' on '/': .* not an array of one shape"):
        pair[1].attrs["a"] = [[1, 2], [3]]


def test_deleting_a_member_is_refused_in_words(pair):
    """h5py deletes; lamina keeps every member (docs/api.md): a TypeError saying so, not
    Python's bare 'AttributeError: __delitem__'."""
    hd, ld = both(pair, "g/x", shape=(2,), dtype="f4")
    del pair[0]["g/x"]
    assert "g/x" not in pair[0]
    for group, name in ((pair[1], "g/x"), (pair[1]["g"], "x")):
        with pytest.raises(TypeError, match=f"cannot delete '{name}' from .*does not delete"):
            del group[name]
    assert "g/x" in pair[1]


def test_attrs_create_and_modify_as_h5py(pair):
    h, f = _tree(pair)
    for obj in (h, f):
        a = obj["a"].attrs
        a.create("n", 3, dtype="i2")
        a.create("grid", np.arange(6), shape=(2, 3), dtype="f4")
        a.create("plain", [1.5, 2.5])
        a["keep"] = np.int16(7)
        a.modify("keep", 300.9)  # cast to the attribute's int16
        a["v"] = np.zeros(3, "f4")
        a.modify("v", [1, 2, 3])
        a["one"] = np.array([5], "i4")
        a.modify("one", 6)  # a 1-element value into a 1-element attribute
        a.modify("fresh", 2.5)  # none yet: set as given
        a["s"] = "text"
        a.modify("s", "other")
    f.close()  # (committed with it) and read back from the file
    g = lamina.open(f.filename, "r")
    ha, fa = h["a"].attrs, g["a"].attrs
    assert sorted(fa) == sorted(ha)
    for k in ha:
        want, got = ha[k], fa[k]
        assert type(got) is type(want), k
        assert np.asarray(got).dtype == np.asarray(want).dtype, k
        assert np.array_equal(got, want), k
    g.close()
    f = lamina.open(f.filename, "a")
    with pytest.raises(ValueError):
        h["a"].attrs.create("bad", np.arange(6), shape=(4,))
    with pytest.raises(ShapeError, match=r"attribute 'bad' on '/a': shape \(4,\) holds 4 values"):
        f["a"].attrs.create("bad", np.arange(6), shape=(4,))
    with pytest.raises(TypeError):
        h["a"].attrs.modify("v", [1, 2])
    for obj in (h, f):  # strings stay strings
        with pytest.raises(TypeError):
            obj["a"].attrs.modify("s", 5)
    f["a"].attrs.create("names", ["x", "yy"], shape=(2,))
    assert f["a"].attrs["names"].tolist() == ["x", "yy"]
    with pytest.raises(ShapeError, match="strings are held as a string or a list"):
        f["a"].attrs.create("grid", ["x", "yy"], shape=(2, 1))
    with pytest.raises(ShapeError, match=r"attribute 'v' on '/a': it has shape \(3,\)"):
        f["a"].attrs.modify("v", [1, 2])
    # a Python number beyond the dtype: h5py's OverflowError, lamina's names the attribute
    f["a"].attrs["u"] = h["a"].attrs["u"] = np.uint8(7)
    with pytest.raises(OverflowError):
        h["a"].attrs.modify("u", 300)
    with pytest.raises(RangeError, match=r"attribute 'u' on '/a': 300 is beyond .* uint8"):
        f["a"].attrs.modify("u", 300)
    f["a"].attrs.modify("u", np.int64(300))  # a numpy value: cast as astype casts
    assert f["a"].attrs["u"] == 44
    h["a"].attrs.modify("u", "5")  # h5py parses a string into numbers; lamina refuses it
    assert h["a"].attrs["u"] == 5
    for value in ("5", "x", ["1", "2"]):  # ('x' was numpy's bare ValueError)
        with pytest.raises(DTypeError, match=r"attribute 'u' on '/a': it holds numbers \(uint8\)"):
            f["a"].attrs.modify("u", value)
    f.close()


def test_create_dataset_takes_h5py_spellings(pair):
    h, f = pair
    for obj in (h, f):
        obj.create_dataset("z", (4,), "f8", fillvalue=2.5)
        obj.create_dataset("g", (64,), "f8", compression="gzip", compression_opts=9, chunks=True)
        obj.create_dataset("p", (3,), "i4", chunks=None, maxshape=None, shuffle=False)
        obj.create_dataset("q", (2,), "i4", fletcher32=False, track_times=False)
        obj.create_dataset("l", (64,), "f8", compression=4)  # an integer: the gzip level
        obj["g"][...] = np.sin(np.arange(64.0))
    f.end_step()
    assert f["z"].fill == h["z"].fillvalue == 2.5
    assert np.array_equal(f["z"][...], h["z"][...])
    assert np.array_equal(f["g"][...], h["g"][...])
    assert f["g"].compression == ({"id": "zlib", "level": 9},)
    assert f["l"].compression == ({"id": "zlib", "level": 4},)
    assert (h["l"].compression, h["l"].compression_opts) == ("gzip", 4)


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (dict(chunks=(2, 2)), TypeError, r"h5py's chunks=\(2, 2\) has no use in lamina: .*block"),
        (dict(maxshape=(None, 4)), TypeError, r"maxshape=.*shape is fixed; time goes into steps"),
        (dict(shuffle=True), TypeError, r"shuffle=True .*'blosc'"),
        (dict(fletcher32=True), TypeError, r"fletcher32=True .*CRC-32C"),
        (dict(fillvalue=1, fill=2), TypeError, r"give fill= or h5py's fillvalue=, not both"),
        (dict(compression="zstd", compression_opts=3), CodecError, r"level of compression='gzip'"),
        (dict(compression_opts=3), CodecError, r"compression_opts=3 is the level"),
        (dict(colour="red"), TypeError, r"create_dataset\('d'\) got an unexpected keyword.*colour"),
        (
            dict(compression=12),
            CodecError,
            r"compression=12: an integer is the gzip level \(0-9, as in h5py\)",
        ),
    ],
)
def test_h5py_keywords_lamina_cannot_honour_say_what_it_does(pair, kw, error, message):
    _, f = pair
    with pytest.raises(error, match=message):
        f.create_dataset("d", (4, 4), "f4", **kw)
    assert "d" not in f  # nothing defined


def test_names_given_as_bytes_and_keys_reversed_as_h5py(pair):
    """h5py takes b'g' for a member's name (lamina: TypeError, and f[b'g'] said a group holds
    no values to select); reversed(f.keys()) was not reversible."""
    h, f = pair
    for x in (h, f):
        x.create_group(b"g")
        x.create_group("h")
        assert b"g" in x and x[b"g"].name == "/g"
        assert list(reversed(x.keys())) == ["h", "g"]
    with pytest.raises(ValueError, match="is not UTF-8"):
        f.create_group(b"\xff")


def test_views_of_a_dataset_iterate_as_the_dataset_and_as_h5py(tmp_path):
    """ds.astype(...) and ds.level(k) had no __iter__: Python indexed them until an IndexError,
    which a file without steps (StepError) and a 0-D index (BoundsError) are: []."""
    with lamina.open(tmp_path / "v.lam", "w") as f:
        a = f.create_dataset("a", (3,), "i4")
        z = f.create_dataset("z", (), "f8")
        for view in (a.astype("f4"), a.level(0)):
            with pytest.raises(lamina.StepError, match="no committed steps"):
                list(view)
        for view in (z.astype("i4"), z.level(0)):
            with pytest.raises(TypeError, match="cannot iterate over a 0-D dataset"):
                list(view)
        with f.step():
            a[...] = [1, 2, 3]
        assert [x.dtype for x in a.astype("f4")] == [np.float32] * 3
        assert [int(x) for x in a.level(0)] == [1, 2, 3]
        with pytest.raises(ValueError, match=r"np.array\(ds.level\(k\), copy=False\)"):
            np.array(a.level(0), copy=False)


@pytest.mark.parametrize("engine", ["native", "memory"])
def test_calls_on_a_closed_file_say_it_is_closed(tmp_path, engine):
    """A collective read raised mpi4py's error on a freed communicator; flush on the memory
    engine returned; prefetch said to open with io='async'."""
    path = tmp_path / "c.lam"
    with lamina.open(path, "w", engine=engine) as f:
        d = f.create_dataset("d", data=np.arange(4.0))
    for call in (
        lambda: d.read(collective=True),
        lambda: d.read(),
        f.flush,
        lambda: d.prefetch(),
    ):
        with pytest.raises(ValueError, match="file .* is closed"):
            call()
