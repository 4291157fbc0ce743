"""Bad input: each mistake is a clear error that names the thing, and the writer survives it.

Every error is a :class:`lamina.LaminaError` *and* the builtin a user would
catch (IndexError, ValueError, TypeError, KeyError, OSError, ...).  After an
error in a writer, earlier committed steps stay readable and the writer can
go on.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import lamina
import lamina.comm as comm_mod
from lamina.errors import (
    BoundsError,
    CodecError,
    DTypeError,
    ExistsError,
    LaminaError,
    ModeError,
    NotALaminaFileError,
    NotFoundError,
    OverlapError,
    RangeError,
    SelectionError,
    ShapeError,
    StepError,
    error_from_wire,
    error_to_wire,
    suggest,
)

pytestmark = pytest.mark.usefixtures("fast_native")


@pytest.fixture
def writer(open_file, new_path):
    """A writer with one committed step of 'fields/temp' (4x6 float64) and 'fields/count' (int32)."""
    path = new_path()
    f = open_file(path, "w")
    t = f.create_dataset("fields/temp", shape=(4, 6), dtype="f8")
    c = f.create_dataset("fields/count", shape=(10,), dtype="i4")
    with f.step():
        t[...] = np.arange(24.0).reshape(4, 6)
        c[...] = np.arange(10)
    f.path_for_test = path
    return f


def committed_ok(f, steps=1):
    """Earlier steps are intact (read through the writer)."""
    assert f.steps >= steps
    np.testing.assert_array_equal(f.at(0)["fields/temp"][...], np.arange(24.0).reshape(4, 6))
    np.testing.assert_array_equal(f.at(0)["fields/count"][...], np.arange(10))


def continue_ok(f):
    """The writer can commit another step after the error."""
    n = f.steps
    with f.step():
        f["fields/temp"][0] = -1.0
    assert f.steps == n + 1
    assert np.all(f["fields/temp"][0] == -1.0)
    committed_ok(f)


def reopen_ok(f, engine):
    path = f.path_for_test
    f.close()
    with lamina.open(path, "r", engine=engine) as r:
        np.testing.assert_array_equal(r.at(0)["fields/temp"][...], np.arange(24.0).reshape(4, 6))


# --------------------------------------------------------------------------
# the hierarchy


def test_every_error_subclasses_a_builtin():
    pairs = {
        lamina.FormatError: OSError,
        lamina.NotALaminaFileError: OSError,
        lamina.ChecksumError: OSError,
        BoundsError: IndexError,
        ShapeError: ValueError,
        DTypeError: TypeError,
        OverlapError: ValueError,
        NotFoundError: KeyError,
        ExistsError: ValueError,
        ModeError: PermissionError,
        StepError: IndexError,
        lamina.StepTimeoutError: TimeoutError,
        lamina.CollectiveMismatchError: RuntimeError,
        CodecError: ValueError,
        lamina.RemoteError: RuntimeError,
    }
    for cls, builtin in pairs.items():
        assert issubclass(cls, LaminaError) and issubclass(cls, builtin), cls


def test_not_found_message_is_not_quoted_like_key_error():
    assert str(NotFoundError("no dataset 'x'")) == "no dataset 'x'"


def test_errors_travel_by_name():
    name, msg = error_to_wire(OverlapError("boxes overlap"))
    e = error_from_wire(name, msg, rank=3)
    assert type(e) is OverlapError and str(e) == "rank 3: boxes overlap"
    name, msg = error_to_wire(ZeroDivisionError("boom"))
    e = error_from_wire(name, msg)
    assert isinstance(e, lamina.RemoteError) and isinstance(e, ZeroDivisionError)
    assert "ZeroDivisionError: boom" in str(e)
    e = error_from_wire(*error_to_wire(PermissionError(13, "denied")))
    assert isinstance(e, PermissionError) and isinstance(
        e, lamina.RemoteError
    )  # caught alike everywhere
    name, msg = error_to_wire(AssertionError("no builtin of the list"))
    e = error_from_wire(name, msg)
    assert type(e) is lamina.RemoteError and "AssertionError" in str(e)
    # unknown names never build anything but RemoteError
    assert type(error_from_wire("os.system", "x")) is lamina.RemoteError


def test_suggest():
    assert "Did you mean 'fields/temp'?" in suggest("fields/tmp", ["fields/temp", "other"])
    assert "'fields/temp'" in suggest("tempr", ["fields/temp"])  # matches on the last component
    assert suggest("zzzz", ["fields/temp"]) == ""


# --------------------------------------------------------------------------
# bounds, shapes, dtypes, overlaps (writers)


@pytest.mark.parametrize(
    "key, dim",
    [((slice(0, 5), slice(None)), 0), ((0, slice(2, 7)), 1), (4, 0), ((-5,), 0), ((0, 6), 1)],
)
def test_write_out_of_bounds(writer, engine, key, dim):
    with writer.step():
        with pytest.raises(BoundsError) as ei:
            writer["fields/temp"][key] = 1.0
        msg = str(ei.value)
        assert "fields/temp" in msg and f"dimension {dim}" in msg
        writer["fields/temp"][0] = 5.0  # the step goes on
    assert writer["fields/temp"][0, 0] == 5.0
    committed_ok(writer)
    reopen_ok(writer, engine)


def test_write_with_offset_out_of_bounds(writer):
    with pytest.raises(BoundsError, match=r"fields/temp.*dimension 1 reaches 7 > 6"):
        writer["fields/temp"].write(np.zeros((2, 3)), offset=(0, 4))
    with pytest.raises(ShapeError, match="data has 1 dimensions, dataset has 2"):
        writer["fields/temp"].write(np.zeros(3))
    with pytest.raises(ShapeError, match="offset"):
        writer["fields/temp"].write(np.zeros((1, 1)), offset=(0,))
    writer.end_step()  # the failed puts opened an implicit step; it commits empty
    continue_ok(writer)


def test_read_out_of_bounds(writer):
    with pytest.raises(BoundsError, match=r"'/fields/temp'.*dimension 1"):
        writer["fields/temp"][0, 9]
    with pytest.raises(BoundsError, match="fields/temp"):
        writer["fields/temp"].read(lamina.Box((0, 0), (5, 6)))
    with pytest.raises(BoundsError, match="1 dimensions but dataset 'fields/temp' has 2"):
        writer["fields/temp"].read(lamina.Box((0,), (1,)))
    committed_ok(writer)


def test_read_takes_a_box_or_slices_and_names_anything_else(writer):
    """read() takes a Box or a tuple of slices (negative bounds from the end, as numpy; a
    bound past either end a BoundsError, as ds[...] gives it); anything else is a TypeError
    naming the dataset and what was given, not an error from inside the engine."""
    ds = writer["fields/temp"]
    whole = ds.read()
    assert np.array_equal(ds.read(np.s_[1:3, 2:]), whole[1:3, 2:])
    assert np.array_equal(ds.read(np.s_[-3:-1, :-2]), whole[-3:-1, :-2])
    assert ds.read(np.s_[3:1, :]).shape == whole[3:1, :].shape == (0, 6)
    for sl, bound, dim in ((np.s_[1:99, :], 99, 0), (np.s_[:, -7:], -7, 1)):
        with pytest.raises(BoundsError, match=rf"'.*temp': slice bound {bound} is out of bounds "
                           rf"for dimension {dim} of size \d+ \(shape \(\d+, 6\)\)"):  # fmt: skip
            ds.read(sl)
        with pytest.raises(BoundsError, match=rf"slice bound {bound} is out of bounds"):
            ds[sl]  # the same bound, the same error
    out = np.empty((2, 6))
    assert ds.read(np.s_[0:2, :], out=out) is out and np.array_equal(out, whole[:2])
    with pytest.raises(BoundsError, match=r"1 slices for dataset '.*temp' of 2 dimensions"):
        ds.read(np.s_[0:2])
    with pytest.raises(TypeError, match=r"read\(\) of dataset '.*temp' takes slices of step 1"):
        ds.read(np.s_[0:4:2, :])
    with pytest.raises(TypeError, match=r"read\(\) of dataset '.*temp' takes slices of step 1"):
        ds.read(np.s_[0.5:2, :])
    for bad in ((0, 2), [slice(0, 2), slice(None)], "0:2", 3):
        with pytest.raises(TypeError, match=r"read\(\) of dataset '.*temp' takes a lamina.Box"):
            ds.read(bad)


def test_read_into_a_buffer_it_cannot_write_names_the_dataset(writer):
    """out= must be a writeable numpy array of the box's shape and the dataset's dtype: anything
    else is refused before anything is read, naming the dataset (a read-only array used to
    reach memoryview's BufferError, a list an AttributeError); a strided view is fine."""
    ds = writer["fields/temp"]
    whole = ds.read()
    frozen = np.zeros((2, 6))
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"dataset '.*temp'.*read-only"):
        ds.read(np.s_[0:2, :], out=frozen)
    assert not frozen.any()
    with pytest.raises(TypeError, match=r"dataset '.*temp'.*must be a numpy array, not list"):
        ds.read(np.s_[0:2, :], out=[[0.0] * 6] * 2)
    with pytest.raises(ShapeError, match=r"dataset '.*temp'.*output buffer \(2, 6\) float32"):
        ds.read(np.s_[0:2, :], out=np.zeros((2, 6), np.float32))
    with pytest.raises(ShapeError, match=r"dataset '.*temp'.*output buffer \(3, 6\)"):
        ds.read(np.s_[0:2, :], out=np.zeros((3, 6)))
    strided = np.zeros((4, 6))[::2]
    assert ds.read(np.s_[0:2, :], out=strided) is strided and np.array_equal(strided, whole[:2])
    committed_ok(writer)
    committed_ok(writer)


@pytest.mark.parametrize("value_shape", [(3, 6), (4, 5), (2,), (4, 6, 1)])
def test_shape_mismatch(writer, value_shape):
    with writer.step():
        with pytest.raises(ShapeError) as ei:
            writer["fields/temp"][1:3, :] = (
                np.zeros(value_shape) if value_shape != (2,) else np.zeros((2, 6, 2))
            )
        assert "fields/temp" in str(ei.value)
        writer["fields/temp"][1:3, :] = 7.0  # broadcasting a scalar is fine
    assert np.all(writer["fields/temp"][1:3] == 7.0)
    continue_ok(writer)


def test_strided_write_refused(writer):
    with pytest.raises(ShapeError, match="contiguous"):
        writer["fields/temp"][::2] = 0.0


@pytest.mark.parametrize(
    "dataset, value",
    [
        ("fields/count", np.ones(10, dtype="f8")),  # float -> int
        ("fields/count", np.ones(10, dtype="c8")),  # complex -> int
        ("fields/temp", np.ones((4, 6), dtype="c16")),  # complex -> float
        ("fields/count", np.array(["a"] * 10)),  # strings
        ("fields/count", np.array([object()] * 10)),  # objects
    ],
)
def test_dtype_mismatch(writer, engine, dataset, value):
    with writer.step():
        with pytest.raises(DTypeError) as ei:
            writer[dataset][...] = value
        msg = str(ei.value)
        assert dataset in msg and str(value.dtype) in msg
    committed_ok(writer, 2)
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_safe_casts_are_accepted(writer):
    with writer.step():
        writer["fields/temp"][0] = np.arange(6, dtype="i2")  # int -> float
        writer["fields/count"][:5] = np.arange(5, dtype="u1")  # uint8 -> int32
        writer["fields/count"][5:] = np.ones(5, dtype=bool)  # bool -> int
    assert writer["fields/temp"].dtype == np.float64
    np.testing.assert_array_equal(writer["fields/count"][...], [0, 1, 2, 3, 4, 1, 1, 1, 1, 1])


def test_overlapping_boxes_in_one_step(writer, engine):
    with writer.step():
        writer["fields/temp"][0:2, :] = 1.0
        with pytest.raises(OverlapError) as ei:
            writer["fields/temp"][1:3, 2:4] = 2.0
        msg = str(ei.value)
        assert "fields/temp" in msg and "[1:3, 2:4]" in msg and "[0:2, 0:6]" in msg
        writer["fields/temp"][2:4, :] = 3.0  # a disjoint box is still fine
        writer["fields/count"][0:2] = 1  # other datasets are independent
    np.testing.assert_array_equal(writer["fields/temp"][:, 0], [1, 1, 3, 3])
    # overlap across steps is fine: each step is a new version
    with writer.step():
        writer["fields/temp"][0:2, :] = 9.0
    committed_ok(writer)
    reopen_ok(writer, engine)


def test_failed_put_can_be_retried(writer, engine, monkeypatch):
    """A put that fails after its checks (here: the codec) leaves no trace: the same box can be
    written again without an OverlapError."""
    from lamina import codecs

    z = writer.create_dataset("z", shape=(8,), dtype="f8", compression="zstd")

    def broken(self, arr, what="a block"):
        raise CodecError("compression failed: simulated")

    with writer.step():
        with monkeypatch.context() as m:
            m.setattr(codecs.Pipeline, "encode", broken)
            with pytest.raises(CodecError, match="simulated"):
                z[:4] = np.ones(4)
        z[:4] = np.ones(4)  # retry
        z[4:] = 2.0
    np.testing.assert_array_equal(writer["z"][...], [1, 1, 1, 1, 2, 2, 2, 2])
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_overlap_on_zero_dim_dataset(writer):
    s = writer.create_dataset("scalar", shape=(), dtype="f4")
    with writer.step():
        s[()] = 1.0
        with pytest.raises(OverlapError):
            s[...] = 2.0
    assert writer["scalar"][()] == 1.0


# --------------------------------------------------------------------------
# names: not found, exists


def test_unknown_dataset_suggests_close_names(writer):
    with pytest.raises(NotFoundError) as ei:
        writer["fields/tmp"]
    assert isinstance(ei.value, KeyError)
    msg = str(ei.value)
    assert "fields/tmp" in msg and "Did you mean" in msg and "fields/temp" in msg
    with pytest.raises(KeyError, match="Did you mean"):
        writer["fields"]["temperature"]
    with pytest.raises(NotFoundError, match="Did you mean 'fields/count'"):
        writer.engine.put("fields/cont", lamina.Box((0,), (1,)), np.zeros(1, "i4"))
    with pytest.raises(NotFoundError, match="is a group, not a dataset"):
        writer.engine.put("fields", lamina.Box((0,), (1,)), np.zeros(1, "i4"))
    assert writer.get("fields/tmp") is None
    assert "fields/tmp" not in writer and "fields/temp" in writer
    writer.end_step()
    continue_ok(writer)


def test_unknown_attribute(writer):
    writer["fields/temp"].attrs["units"] = "K"
    with pytest.raises(NotFoundError, match="Did you mean 'units'"):
        writer["fields/temp"].attrs["unit"]
    with pytest.raises(NotFoundError, match="no attribute 'nope'"):
        del writer.attrs["nope"]
    with pytest.raises(NotFoundError, match="no group or dataset"):
        writer.engine.set_attr("nowhere", "x", 1)
    with pytest.raises(ValueError, match="attribute names"):
        writer.attrs[""] = 1


@pytest.mark.parametrize("value", [b"raw", None, {"a": 1}, ["a", 2], object()])
def test_bad_attribute_values(writer, value):
    with pytest.raises(DTypeError):
        writer.attrs["bad"] = value
    assert "bad" not in writer.attrs
    continue_ok(writer)


@pytest.mark.parametrize(
    "name, value",
    [
        ("long", "x" * 70_000),  # over the format's 64 KiB string limit
        ("longlist", ["ok", "y" * 70_000]),
        ("surrogate", "\udc80"),  # not encodable as UTF-8
        ("n" * 70_000, 1),  # the name itself too long
        ("\udc80", 1),
    ],
    ids=["long-str", "long-list", "bad-unicode", "long-name", "bad-unicode-name"],
)
def test_unstorable_attribute_is_refused_at_once(writer, engine, name, value):
    """Refused when set, naming the attribute; before the fix every later commit failed."""
    with pytest.raises(ValueError) as ei:
        writer["fields/temp"].attrs[name] = value
    assert "fields/temp" in str(ei.value)
    assert name not in writer["fields/temp"].attrs
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_attribute_with_too_many_dimensions(writer, engine):
    with pytest.raises(ValueError, match="33 dimensions exceeds the limit of 32"):
        writer.attrs["deep"] = np.zeros((1,) * 33)
    writer.attrs["ok"] = np.zeros((1,) * 32)
    continue_ok(writer)
    reopen_ok(writer, engine)


@pytest.mark.parametrize("shape", [(1,) * 33, (2**40, 2**40), (2**59, 8)])
def test_dataset_beyond_format_limits(writer, engine, shape):
    """Refused at definition; before the fix the definition was committed and the file no longer opened."""
    with pytest.raises(ShapeError, match="format allows"):
        writer.create_dataset("huge", shape=shape, dtype="f8")
    assert "huge" not in writer
    writer.create_dataset("wide", shape=(1,) * 32, dtype="u1")
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_a_dataset_of_exactly_2_62_bytes_is_refused_as_the_message_says(writer, engine):
    """The message said "at most 2**62 bytes" and refused exactly 2**62 (readers refuse a
    definition of 2**62 bytes or more): it says what is refused."""
    with pytest.raises(ShapeError, match=r"fewer than 2\*\*62 bytes") as got:
        writer.create_dataset("huge", shape=(2**59,), dtype="f8")  # 2**62 bytes
    assert "at most 2**62" not in str(got.value)
    with pytest.raises(ShapeError, match=r"fewer than 2\*\*62 bytes"):
        writer.create_dataset("huge", shape=(2**61, 0), dtype="i2")  # (0 counted as 1)
    writer.create_dataset("largest", shape=(2**59 - 1,), dtype="f8")  # 2**62 - 8 bytes
    assert "huge" not in writer and writer["largest"].shape == (2**59 - 1,)
    continue_ok(writer)
    reopen_ok(writer, engine)


@pytest.mark.parametrize("make", ["create_dataset", "create_group", "require_group"])
def test_a_name_with_a_lone_surrogate_is_a_value_error_naming_it(writer, engine, make):
    """A name holding a character UTF-8 cannot encode (a lone surrogate, as os.fsdecode makes
    of bytes that are not UTF-8) raised a bare UnicodeEncodeError that named no name."""
    name = "fields/bad\udc80name"
    args = {"shape": (2,)} if make == "create_dataset" else {}
    with pytest.raises(ValueError) as got:
        getattr(writer, make)(name, **args)
    assert not isinstance(got.value, UnicodeError), repr(got.value)
    assert "'bad\\udc80name'" in str(got.value) and "lone surrogate" in str(got.value)
    assert name not in writer
    with pytest.raises(KeyError, match="lone surrogate"):
        writer[name]
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_oversized_extension_record_refused(writer, engine):
    with pytest.raises(ValueError, match="exceeds the limit"):
        writer.engine.set_ext("layer/x", b"\0" * (2 << 20))
    writer.engine.set_ext("layer/x", b"fine")
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_creating_what_exists(writer, engine):
    with pytest.raises(ExistsError, match="'fields/temp'.*dataset"):
        writer.create_dataset("fields/temp", shape=(4, 6))
    with pytest.raises(ExistsError, match="group"):
        writer.create_dataset("fields", shape=(1,))
    with pytest.raises(ExistsError, match="dataset"):
        writer.create_group("fields/temp")
    with pytest.raises(ExistsError, match="'fields/temp' is a dataset"):
        writer.create_dataset("fields/temp/sub", shape=(1,))
    with pytest.raises(ExistsError, match="'fields/temp'"):
        writer.create_group("fields/temp/sub")
    with pytest.raises(TypeError, match="is a dataset, not a group"):
        writer.require_group("fields/temp")
    assert writer.require_group("fields").name == "/fields"
    with pytest.raises(ExistsError, match="require_group returns it"):
        writer.create_group("fields")  # as h5py: an existing group is not created again
    committed_ok(writer)
    continue_ok(writer)
    reopen_ok(writer, engine)


@pytest.mark.parametrize(
    "name, text",
    [
        ("a/../b", "invalid path component"),
        ("a/\0", "invalid path component"),
        ("", "an empty name"),
    ],
)
def test_invalid_names(writer, name, text):
    with pytest.raises(ValueError, match=text):
        writer.create_dataset(name, shape=(1,))


def test_dot_names_the_group_it_is_in(writer):
    """As h5py: create_dataset('./x') creates /x ('.' was refused)."""
    assert writer.create_dataset("./x", shape=(1,)).name == "/x"
    assert writer.create_group("g/.").name == "/g"


# --------------------------------------------------------------------------
# dtypes, fill values and codecs at creation


@pytest.mark.parametrize(
    "dtype", [object, str, "U4", "S3", "M8[s]", "V8", [("a", "f4")], "notadtype"]
)
def test_unsupported_dtype(writer, dtype):
    with pytest.raises(DTypeError) as ei:
        writer.create_dataset("bad", shape=(3,), dtype=dtype)
    assert isinstance(ei.value, TypeError)
    assert "bad" not in writer
    continue_ok(writer)


@pytest.mark.parametrize(
    "dtype, fill", [("i4", 1.5), ("i4", np.nan), ("f8", 1j), ("?", 2.5), ("f8", "abc")]
)
def test_fill_that_does_not_fit(writer, dtype, fill):
    with pytest.raises(DTypeError, match="fill value") as ei:
        writer.create_dataset("bad", shape=(3,), dtype=dtype, fill=fill)
    assert isinstance(ei.value, TypeError) and "bad" in str(ei.value)
    assert "bad" not in writer


@pytest.mark.parametrize(
    "dtype, fill", [("f4", 1e300), ("f4", np.float64(1e39)), ("f2", 70000), ("c8", -1e300)]
)
def test_finite_fill_beyond_a_float_dtype_is_refused_as_a_write_of_it_is(writer, dtype, fill):
    """A write of 1e300 into float32 is a RangeError; the same value as the fill was stored
    as inf and every unwritten element read inf.  inf and NaN fills stay allowed."""
    with pytest.raises(RangeError, match="fill value .* beyond the range of dtype") as ei:
        writer.create_dataset("bad", shape=(3,), dtype=dtype, fill=fill)
    assert "bad" in str(ei.value) and "bad" not in writer
    assert writer.create_dataset("ok", shape=(3,), dtype=dtype, fill=np.inf).fill == np.inf
    continue_ok(writer)


def test_negative_shape(writer):
    with pytest.raises(ValueError, match="negative"):
        writer.create_dataset("neg", shape=(3, -1))


@pytest.mark.parametrize(
    "compression, dtype, shape, text",
    [
        ("snappy", "f8", (4,), "unknown codec 'snappy'"),
        ("pickle", "f8", (4,), "unknown codec 'pickle'"),
        ({"id": "zstd", "level": "high"}, "f8", (4,), "parameter 'level' must be int"),
        ({"id": "zstd", "levle": 3}, "f8", (4,), "no parameter 'levle'"),
        ({"id": "zstd", "checksum": 1}, "f8", (4,), "'checksum' must be bool"),
        ({"id": "zlib", "level": True}, "f8", (4,), "'level' must be int"),
        ("zfp", "f8", (4,), "error bound"),
        (("zfp", -1.0), "f8", (4,), "positive finite"),
        (("zfp", float("nan")), "f8", (4,), "positive finite"),
        (("zfp", float("inf")), "f8", (4,), "positive finite"),
        (("zfp", 1e-3), "i2", (4,), "not int16"),
        (("zfp", 1e-3), "c16", (4,), "not complex128"),
        (("zfp", 1e-3), "f8", (), "0-D"),
        (("zfp", 1e-3), "f8", (2, 2, 2, 2, 2), "5-D"),
        (("zstd", 3), "f8", (4,), "expected"),
        (("zfp", "tight"), "f8", (4,), "expected"),
        (42, "f8", (4,), "codec name, tuple or dict"),
        (True, "f8", (4,), "codec name, tuple or dict"),
        ([None], "f8", (4,), "codec name, tuple or dict"),
        ({"level": 3}, "f8", (4,), "unknown codec None"),
        ({"id": "zfpy", "rate": -4}, "f8", (4,), "positive"),
    ],
)
def test_bad_compression(writer, compression, dtype, shape, text):
    with pytest.raises(CodecError, match=text) as ei:
        writer.create_dataset("c", shape=shape, dtype=dtype, compression=compression)
    assert isinstance(ei.value, ValueError)
    assert "c" not in writer
    continue_ok(writer)


# --------------------------------------------------------------------------
# files and modes


def test_nonexistent_path_in_read_mode(tmp_path):
    p = tmp_path / "missing.lam"
    with pytest.raises(FileNotFoundError, match="missing.lam"):
        lamina.open(p, "r", engine="native")
    assert not p.exists()


def test_memory_file_that_was_never_written():
    """As a file on disk that is not there (it was a NotALaminaFileError)."""
    with pytest.raises(FileNotFoundError, match="no in-memory lamina file"):
        lamina.open("mem://never-written", "r", engine="memory")


def test_not_a_lamina_file(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("hello")
    with pytest.raises(NotALaminaFileError, match="plain.txt"):
        lamina.open(plain, "r", engine="native")
    with pytest.raises(NotALaminaFileError, match="a file of that name exists"):
        lamina.open(plain, "w", engine="native")
    assert plain.read_text() == "hello"  # never clobbered
    d = tmp_path / "somedir"
    d.mkdir()
    (d / "precious.dat").write_text("keep me")
    with pytest.raises(NotALaminaFileError, match="not a lamina file"):
        lamina.open(d, "r", engine="native")
    with pytest.raises(NotALaminaFileError, match="not a lamina file"):
        lamina.open(d, "w", engine="native")
    with pytest.raises(NotALaminaFileError):
        lamina.open(d, "a", engine="native")
    assert (d / "precious.dat").read_text() == "keep me"
    # an empty directory may become a lamina file
    e = tmp_path / "empty"
    e.mkdir()
    with lamina.open(e, "w", engine="native") as f:
        f.create_dataset("x", shape=(1,))
    # a file whose commit log is not a lamina header
    junk = tmp_path / "junk.lam"
    junk.mkdir()
    (junk / "lamina.commit").write_bytes(b"\x00" * 64)
    (junk / "lamina.meta").write_bytes(b"\x00" * 64)
    with pytest.raises(NotALaminaFileError, match="bad magic"):
        lamina.open(junk, "r", engine="native")


def test_bad_mode_engine_and_options(tmp_path, engine):
    with pytest.raises(ValueError, match="mode must be"):
        lamina.open(tmp_path / "m.lam", "x", engine=engine)
    with pytest.raises(ValueError, match="unknown engine 'nativ'.*Did you mean 'native'"):
        lamina.open(tmp_path / "m.lam", "w", engine="nativ")
    with pytest.raises(TypeError, match="unknown option"):
        lamina.open(tmp_path / "m.lam", "w", engine=engine, agregators=2)
    with pytest.raises(ValueError, match="checksum_segment"):
        lamina.open(tmp_path / "m.lam", "w", engine=engine, checksum_segment=1000)
    with pytest.raises(TypeError, match="communicator"):
        lamina.open(tmp_path / "m.lam", "w", engine=engine, comm="world")


def test_native_aggregators_option(tmp_path):
    for bad in (2, 0, -1):
        with pytest.raises(
            ValueError, match=rf"between 1 and the number of ranks \(1\), got {bad}"
        ):
            lamina.open(tmp_path / "a.lam", "w", engine="native", aggregators=bad)
    for bad in ("all", 1.0, True, "1"):  # no count: refused, not converted
        with pytest.raises(TypeError, match=r"aggregators must be an int from 1 .*, got"):
            lamina.open(tmp_path / "a.lam", "w", engine="native", aggregators=bad)
    assert not (tmp_path / "a.lam").exists()  # nothing made
    lamina.open(tmp_path / "a.lam", "w", engine="native", aggregators=np.int64(1)).close()


@pytest.mark.parametrize("value", ["no", 0, None])
def test_flag_options_are_bools_not_truths(tmp_path, value):
    """background_stats="no" used to be taken as True (Python's truth of a string): every
    flag of lamina.open is a bool, anything else a TypeError naming it, nothing made."""
    for name in ("background_stats", "durable"):
        with pytest.raises(TypeError, match=rf"{name} must be a bool \(True or False\), got"):
            lamina.open(tmp_path / "f.lam", "w", engine="native", **{name: value})
    assert not (tmp_path / "f.lam").exists()
    lamina.open(tmp_path / "f.lam", "w", background_stats=np.bool_(False)).close()


def test_writing_in_read_mode(writer, engine):
    path = writer.path_for_test
    writer.close()
    with lamina.open(path, "r", engine=engine) as f:
        ds = f["fields/temp"]
        attempts = [
            lambda: ds.__setitem__(0, 1.0),
            lambda: ds.write(np.zeros((1, 1))),
            lambda: f.create_dataset("new", shape=(1,)),
            lambda: f.create_group("g"),
            lambda: f.attrs.__setitem__("a", 1),
            lambda: f.attrs.__delitem__("a"),
            f.begin_step,
            f.end_step,
            lambda: f.engine.set_ext("k", b""),
        ]
        for attempt in attempts:
            with pytest.raises(ModeError) as ei:
                attempt()
            assert "read-only" in str(ei.value) and path in str(ei.value)
            assert isinstance(ei.value, PermissionError)
        # reading still works
        np.testing.assert_array_equal(ds[...], np.arange(24.0).reshape(4, 6))


def test_use_after_close(writer):
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer["fields/temp"][0] = 1.0
    writer.close()  # closing twice is harmless


# --------------------------------------------------------------------------
# steps


def test_write_corners_must_be_integers(writer):
    """A write's corner of anything but integers is refused, not rounded or parsed (2.5 was
    written at 2, "5" at 5); numpy's integers are corners; offsets of write_blocks too."""
    c = writer["fields/count"]
    for offset, text in (
        ((2.5,), "holds 2.5"),
        (("5",), "holds '5'"),
        ((np.float64(0.9),), "holds np.float64"),
        ((True,), "holds True"),
        (8, "offset 8 is not a sequence"),
        ("5", "offset '5' is not a sequence"),
    ):
        for copy in (True, False):
            with pytest.raises(SelectionError, match=re.escape(text)):
                c.write(np.full(2, 7, "i4"), offset=offset, copy=copy)
    c.write(np.full(2, 7, "i4"), offset=(np.array(2),))  # as numpy indexes: 0-D arrays too
    c.write(np.full(2, 8, "i4"), offset=np.array([6]))
    with pytest.raises(DTypeError, match="block offsets must be integers"):
        c.write_blocks(np.zeros((2, 1), "i4"), np.array([[4.0], [5.0]]))
    with pytest.raises(BoundsError, match="past the largest corner"):
        c.write_blocks(np.zeros((1, 1), "i4"), np.array([[2**64 - 1]], dtype=np.uint64))
    writer.end_step()
    got = writer.at(1)["fields/count"]
    np.testing.assert_array_equal(got[2:4], [7, 7])
    np.testing.assert_array_equal(got[6:8], [8, 8])
    continue_ok(writer)


def test_steps_must_be_integers(writer, engine):
    """A step of anything but an integer is a StepError, not rounded: -0.5 read step 0 (int()
    rounds toward 0), not the last; numpy's integers are steps."""
    with writer.step():
        writer["fields/count"][...] = 5
    for bad in (1.7, "1", True, -0.5, None.__class__):
        with pytest.raises(StepError, match="a step is an integer"):
            writer.at(bad)
    with pytest.raises(StepError, match="a step is an integer"):
        writer["fields/count"].read(step=0.5)
    assert writer.at(np.int64(1)).index == 1 and writer.at(-1).index == 1
    assert writer.at(np.array(1)).index == 1  # a 0-D array of an integer, as numpy indexes
    continue_ok(writer)


def test_step_that_does_not_exist(writer, engine):
    """The error names the step asked for (-2 was named -1: the step after adding the count)."""
    for k in (1, 5, -2):
        with pytest.raises(StepError) as ei:
            writer.at(k)
        assert f"step {k} does not exist" in str(ei.value), str(ei.value)
        assert "1 committed step(s) (0..0, or -1..-1)" in str(ei.value)
    with pytest.raises(StepError):
        writer["fields/temp"].read(step=3)
    with pytest.raises(StepError):
        writer["fields/temp"].blocks(step=7)
    assert writer.at(-1).index == 0
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_read_before_any_step(open_file, new_path):
    f = open_file(new_path(), "w")
    ds = f.create_dataset("x", shape=(3,))
    with pytest.raises(StepError, match="no committed steps"):
        ds[...]
    with pytest.raises(StepError):
        f.at(0)


def test_step_calls_out_of_order(writer):
    with pytest.raises(StepError, match="without begin_step"):
        writer.end_step()
    writer.begin_step()
    with pytest.raises(StepError, match="already open"):
        writer.begin_step()
    with pytest.raises(StepError, match="already open"):
        with writer.step():
            pass
    writer.end_step()
    continue_ok(writer)


def test_failed_step_is_discarded(writer, engine):
    n = writer.steps
    with pytest.raises(RuntimeError, match="simulation blew up"):
        with writer.step():
            writer["fields/temp"][...] = 99.0
            raise RuntimeError("simulation blew up")
    assert writer.steps == n and not writer.engine.in_step
    # the next step takes the same index and the discarded data never appears
    with writer.step() as k:
        assert k == n
        writer["fields/count"][...] = 1
    assert writer.steps == n + 1
    np.testing.assert_array_equal(writer["fields/temp"][...], 0.0)  # not written in this step
    committed_ok(writer)
    reopen_ok(writer, engine)


def test_error_inside_with_file_closes_cleanly(new_path, engine):
    path = new_path()
    with pytest.raises(ZeroDivisionError):
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("x", shape=(4,))
            with f.step():
                ds[...] = 1.0
            ds[...] = 2.0  # implicit step, discarded by the error
            raise ZeroDivisionError("simulated failure")
    with lamina.open(path, "r", engine=engine) as f:
        assert f.steps == 1
        np.testing.assert_array_equal(f["x"][...], 1.0)
        assert f.engine.writer_closed


def test_errors_name_the_file_and_dataset(writer):
    """A selection error on a nested dataset names it with its full path."""
    g = writer.create_group("deep/er")
    ds = g.create_dataset("d", shape=(2, 2))
    with pytest.raises(BoundsError, match="'/deep/er/d'"):
        ds[2, 0] = 1
    with pytest.raises(IndexError, match="'/deep/er/d'.*unsupported index"):
        ds[[0, 1]] = 1.0
    with pytest.raises(IndexError, match="'/deep/er/d'.*one list of indices"):
        ds[[0, 1], [0, 1]]


def test_reading_native_file_with_memory_engine(tmp_path, write_simple):
    p = str(tmp_path / "n.lam")
    write_simple(p)
    assert os.path.isdir(p)
    with pytest.raises(NotALaminaFileError):
        lamina.open(p, "r", engine="memory")


def test_create_dataset_on_a_closed_file_says_so(tmp_path):
    f = lamina.open(str(tmp_path / "closed.lam"), "w", durable=False)
    f.close()
    with pytest.raises(ValueError, match="create dataset 'a'.*is closed"):
        f.create_dataset("a", (3,))


# --------------------------------------------------------------------------
# arguments checked before anything is made of them


@pytest.mark.parametrize(
    "dtype, data, kind, words",
    [
        ("i4", np.array([1.0, 2.0, 3.0]), DTypeError, "float64 data to dataset 'counts'"),
        ("u1", [-1, 300], RangeError, "dataset 'counts': data .* beyond the range of dtype uint8"),
        (
            "i1",
            np.int64(300),
            RangeError,
            r"data np.int64\(300\) is beyond the range of dtype int8",
        ),
        ("u1", np.array([1.0, 2.0, 3.0]), DTypeError, "float64 data to dataset 'counts'"),
        (None, [[1, 2], [3]], ShapeError, "dataset 'counts': data is not an array"),
        # an array-like of a dtype is an array of it, not numbers cast by value
        ("i4", memoryview(np.array([1.5, 2.0])), DTypeError, "float64 data to dataset 'counts'"),
    ],
)
def test_create_dataset_whose_data_is_refused_defines_nothing(
    writer, engine, dtype, data, kind, words
):
    """The data's cast (the one its write makes) and shape are checked before the dataset is
    defined: a refused create leaves nothing behind (it left the dataset defined, all fill,
    so that the corrected call raised ExistsError), and the corrected call succeeds."""
    steps = writer.steps
    with pytest.raises(kind, match=words):
        writer.create_dataset("counts", dtype=dtype, data=data)
    assert "counts" not in writer and writer.steps == steps and not writer.engine.in_step
    ds = writer.create_dataset("counts", data=np.array([1, 2, 3], dtype=dtype or "i4"))
    with writer.step():  # takes the step the data's write opened
        writer["fields/temp"][0] = -1.0
    np.testing.assert_array_equal(ds[...], [1, 2, 3])
    committed_ok(writer)
    reopen_ok(writer, engine)


def _array_likes(a: np.ndarray) -> list:
    """*a* as the array-likes a program hands a write: each carries *a*'s dtype."""
    import array

    xr = pytest.importorskip("xarray")
    out = [memoryview(a), xr.DataArray(a)]
    if a.dtype.char in array.typecodes:
        out.append(array.array(a.dtype.char, a.tolist()))
    return out


@pytest.mark.parametrize(
    "dtype, values",
    [
        ("i4", np.array([1.7, 1e30, np.nan])),  # numpy's cast: 1, then INT_MIN twice
        ("f8", np.array([1 + 5j, 2 + 0j])),  # the imaginary part dropped
        ("i1", np.array([-1, 2], dtype="i8")),
    ],
)
def test_array_likes_take_the_rule_of_arrays_not_of_values(writer, dtype, values):
    """A memoryview, an array.array or an xarray DataArray carries a dtype: a write takes
    it as an array of that dtype, refused where the array is (float into int, complex into
    real), not as numbers cast by value, which numpy does unsafely (1e30 became INT_MIN)."""
    ds = writer.create_dataset("x", shape=values.shape, dtype=dtype)
    writes = (
        lambda a: ds.__setitem__(..., a),
        lambda a: ds.write(a),
        lambda a: ds.write_blocks([a], [(0,)]),
    )
    for given in [values, *_array_likes(values)]:
        for write in writes:
            with writer.step():
                if values.dtype.kind == "i":  # int64 into int8: a cast within a kind
                    write(given)
                    continue
                with pytest.raises(DTypeError, match=f"{values.dtype} data to dataset 'x'"):
                    write(given)
            if values.dtype.kind == "i":
                np.testing.assert_array_equal(ds[...], values.astype(dtype))


@pytest.mark.parametrize(
    "dtype, value, kind",
    [
        ("i8", np.longdouble(2**63), RangeError),
        ("i4", np.longdouble("1e30"), RangeError),
        ("u1", np.longdouble(-5), RangeError),
        ("i4", np.longdouble("nan"), DTypeError),
        ("f8", np.clongdouble(1 + 2j), DTypeError),
    ],
)
def test_long_double_scalars_are_cast_by_value(writer, dtype, value, kind):
    """A long double scalar is one value, as np.float64 is: beyond the dtype a RangeError,
    NaN into an integer a DTypeError, where numpy's array cast stored INT_MIN or 251."""
    ds = writer.create_dataset("x", shape=(2,), dtype=dtype)
    with writer.step():
        with pytest.raises(kind, match="dataset '/x'"):
            ds[0] = value
        ds[1] = np.longdouble(3.9)  # into an integer truncated, as a Python float is
    assert ds[1] == (3 if dtype != "f8" else 3.9)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # numpy's, of np.matrix
def test_a_matrix_of_one_row_fills_a_1d_selection(writer):
    """As an array of shape (1, 6) does (leading axes of length 1 may go): a matrix, which
    stays 2-D under reshape, was a ShapeError."""
    with writer.step():
        writer["fields/temp"][0] = np.matrix([[1.0, 2, 3, 4, 5, 6]])
    assert writer["fields/temp"][0].tolist() == [1.0, 2, 3, 4, 5, 6]


def test_a_long_double_fraction_into_bool_is_true(writer):
    """Nonzero is True, as numpy and h5py cast np.longdouble(0.5) (it was truncated to 0)."""
    ds = writer.create_dataset("flags", shape=(2,), dtype=bool)
    with writer.step():
        ds[0] = np.longdouble(0.5)
        ds[1] = np.longdouble(0)
    assert ds[...].tolist() == [True, False]
    made = writer.create_dataset("made", data=np.longdouble(0.5), dtype=bool)
    with writer.step():
        writer["fields/temp"][0] = -1.0
    assert bool(made[...]) is True


def test_create_dataset_casts_python_numbers_by_value(writer):
    """Python numbers and lists of them are data of the dataset's dtype where their values
    fit, as a write of them is (and h5py's create_dataset): [1, 2, 3] into uint8."""
    ds = writer.create_dataset("small", data=[1, 2, 3], dtype="u1")
    ranged = writer.create_dataset("ranged", data=range(3), dtype="u1")  # a range is numbers
    one = writer.create_dataset("one", data=5, dtype="i2")
    scalar = writer.create_dataset("scalar", data=np.int64(5), dtype="u1")  # as h5py takes it
    assert ds.dtype == np.uint8 and one.dtype == np.int16 and scalar.dtype == np.uint8
    assert ranged.dtype == np.uint8
    with writer.step():
        writer["fields/temp"][0] = -1.0
    np.testing.assert_array_equal(ds[...], [1, 2, 3])
    assert one[...] == 5 and scalar[...] == 5


def test_box_corners_are_integers():
    """A Box keeps its corners as tuples of Python ints, numpy's integers and arrays taken;
    anything else is a TypeError naming the corner (an array start failed deep in a read,
    a float or a string corner later still)."""
    b = lamina.Box(np.array([0, 1]), [np.int64(2), 3])
    assert b == lamina.Box((0, 1), (2, 3)) and hash(b) == hash(lamina.Box((0, 1), (2, 3)))
    assert all(type(v) is int for v in b.start + b.stop)
    for start, stop, words in [
        ((0.0, 0), (2, 2), r"box start \(0.0, 0\) holds 0.0"),
        ((0, 0), (2, 2.5), r"box stop \(2, 2.5\) holds 2.5"),
        ((True,), (2,), "box start .* holds True"),
        ("01", "23", "box start '01' is not a sequence of integers"),
        (np.zeros((1, 2), int), (1, 2), "box start .* is not a sequence"),
        (np.array([0.5]), (1,), "box start .* not an integer"),
        (0, 2, "box start 0 is not a sequence"),
    ]:
        with pytest.raises(TypeError, match=words):
            lamina.Box(start, stop)


def test_read_box_far_outside_allocates_nothing(writer):
    """A Box outside the dataset is a BoundsError naming the dataset, the box and the shape
    before an array of its shape is made (16 PiB was a MemoryError, 2**63 numpy's ValueError);
    a Box of numpy arrays reads, alone and collectively."""
    ds = writer["fields/temp"]
    whole = ds.read()
    for box in [
        lamina.Box((0, 0), (2**31, 2**20)),
        lamina.Box((0, 0), (2**63, 2)),
        lamina.Box((0, 0), (5, 6)),
    ]:
        for collective in (False, True):
            with pytest.raises(
                BoundsError, match=rf"box {re.escape(str(box))} .*'fields/temp' of shape \(4, 6\)"
            ):
                ds.read(box, collective=collective)
    corners = lamina.Box(np.array([1, 2]), np.array([3, 4]))
    np.testing.assert_array_equal(ds.read(corners), whole[1:3, 2:4])
    np.testing.assert_array_equal(ds.read(corners, collective=True), whole[1:3, 2:4])
    committed_ok(writer)


def test_a_view_of_a_step_changes_nothing(writer, engine):
    """f.at(k) is read-only: attributes, datasets and groups made through it are a ModeError
    (they reached the live file), as its writes are; require_group of a group it has reads."""
    writer.attrs["kept"] = 1
    old = writer.at(0)
    attempts = [
        lambda: old.attrs.__setitem__("note", "x"),
        lambda: old.attrs.__delitem__("kept"),
        lambda: old["fields/temp"].attrs.__setitem__("units", "K"),
        lambda: old["fields"].attrs.__setitem__("units", "K"),
        lambda: old.create_dataset("made", shape=(2,)),
        lambda: old["fields"].create_dataset("made", shape=(2,)),
        lambda: old.create_group("grp"),
        lambda: old.require_group("grp"),
        lambda: old["fields/temp"].__setitem__(0, 1.0),
    ]
    for attempt in attempts:
        with pytest.raises(ModeError, match="committed step 0") as ei:
            attempt()
        assert isinstance(ei.value, PermissionError)
    assert old.require_group("fields").name == "/fields"
    assert dict(writer.attrs) == {"kept": 1} and dict(writer["fields/temp"].attrs) == {}
    assert sorted(writer.keys()) == ["fields"] and "made" not in writer["fields"]
    continue_ok(writer)
    reopen_ok(writer, engine)


def test_bytes_path_names_the_same_file(tmp_path, monkeypatch):
    """A bytes path (os.fsencode's) opens the file it names; str() of it made a directory
    named "b'...'" under the working directory."""
    monkeypatch.chdir(tmp_path)
    path = str(tmp_path / "b.lam")
    with lamina.open(os.fsencode(path), "w") as f:
        assert f.filename == path
        f.create_dataset("x", shape=(2,))[...] = 1.0
    assert os.listdir(tmp_path) == ["b.lam"]
    with lamina.open(os.fsencode(path)) as f:
        np.testing.assert_array_equal(f["x"][...], [1.0, 1.0])


def test_arguments_of_the_wrong_kind_are_named(tmp_path, monkeypatch):
    """Options and arguments of the wrong type or range: a TypeError or ValueError naming
    them and what they take (an AttributeError, int()'s and float()'s words, an
    OverflowError at the first write, numpy's ragged-array error had no name)."""
    monkeypatch.delenv("LAMINA_TRANSPORT", raising=False)
    monkeypatch.delenv("LAMINA_TRANSPORT_TIMEOUT", raising=False)
    p = tmp_path / "a.lam"
    with pytest.raises(lamina.ConfigError, match="transport must be one of .* got 5"):
        lamina.open(p, "w", transport=5)
    # an empty argument is refused, as io='' is (engine='' and transport='' were the defaults)
    with pytest.raises(lamina.ConfigError, match="transport must be one of .* got ''"):
        lamina.open(p, "w", transport="")
    with pytest.raises(lamina.ConfigError, match="transport must be one of .* got ''"):
        lamina.open(p, "w", engine="native", transport="")
    with pytest.raises(lamina.ConfigError, match="engine='' names no engine"):
        lamina.open(p, "w", engine="")
    assert not p.exists()
    for seg in ("4MiB", 2**70, True, 4194304.0):
        with pytest.raises(ValueError, match=r"checksum_segment must be .* below 2\*\*62"):
            lamina.open(p, "w", checksum_segment=seg)
    for options, kind, words in [
        (dict(queue_limit=1.5), ValueError, "queue_limit must be an integer >= 2, got 1.5"),
        (dict(queue_limit="2"), ValueError, "queue_limit must be an integer >= 2, got '2'"),
        (dict(timeout="x"), ValueError, "timeout must be a number of seconds > 0, got 'x'"),
        (dict(shallow=5), TypeError, "shallow must be a dataset path glob"),
    ]:
        with pytest.raises(kind, match=words):
            lamina.open(p, "w", transport="memory", **options)
    for bad in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv("LAMINA_TRANSPORT_TIMEOUT", bad)
        with pytest.raises(ValueError, match="LAMINA_TRANSPORT_TIMEOUT must be a number"):
            lamina.open(p, "w", transport="memory")
        # the wait of the first task_comm in a workflow reads it too, and refuses the same
        with pytest.raises(ValueError, match="LAMINA_TRANSPORT_TIMEOUT must be a number"):
            comm_mod.transport_patience()
    monkeypatch.setenv("LAMINA_TRANSPORT_TIMEOUT", "2.5")
    assert comm_mod.transport_patience() == 2.5
    monkeypatch.delenv("LAMINA_TRANSPORT_TIMEOUT")
    assert comm_mod.transport_patience() == comm_mod.DEFAULT_PATIENCE
    # the transport's spin: read where a name opens (at import it stopped `import lamina`)
    from lamina.engines.transport import wire

    for bad in ("2ms", "-1", "inf"):
        monkeypatch.setenv("LAMINA_TRANSPORT_SPIN", bad)
        # (inf was refused as "must be a number of seconds >= 0", which it is)
        want = f"LAMINA_TRANSPORT_SPIN must be a finite number of seconds >= 0, got '{bad}'"
        with pytest.raises(ValueError, match=re.escape(want)):
            lamina.open(p, "w", transport="memory")
    monkeypatch.setenv("LAMINA_TRANSPORT_SPIN", "0.001")
    assert wire.spin_seconds() == 0.001 and wire.Poll(1.0).spin == 0.001
    monkeypatch.delenv("LAMINA_TRANSPORT_SPIN")
    assert wire.spin_seconds() == wire.SPIN and wire.Poll(1.0).spin == wire.SPIN
    with lamina.open(p, "w", checksum_segment=1 << 18) as f:
        # a codec refused names the dataset, as its dtype and layout refused do
        for compression in ("nosuch", {"id": ["zstd"]}, {"id": "zfpy", "rate": 1}):
            with pytest.raises(lamina.CodecError, match="^dataset 'z': "):
                f.create_dataset("z", shape=(4,), compression=compression)
        f.create_dataset("a", shape=(4,))[...] = 1.0
        with pytest.raises(ShapeError, match="dataset 'r': data is not an array of one shape"):
            f.create_dataset("r", data=[[1, 2], [3]])
        with pytest.raises(ValueError, match="cannot set attribute 'r' on '/'"):
            f.attrs["r"] = [[1, 2], [3]]
        assert "r" not in f and "r" not in f.attrs
    with lamina.open(p) as f:
        with pytest.raises(TypeError, match=r"wait_for_step\(\): step must be an integer.*'1'"):
            f.wait_for_step("1", timeout=1)
        with pytest.raises(TypeError, match=r"wait_for_step\(\): timeout must be a number"):
            f.wait_for_step(5, timeout="1")
        with pytest.raises(TypeError, match=r"iter_steps\(\): timeout must be a number.*'5'"):
            list(f.iter_steps(timeout="5"))
        with pytest.raises(ValueError, match=r"iter_steps\(\): poll must be > 0"):
            list(f.iter_steps(poll=0))
        for key in (..., 0, None):
            with pytest.raises(TypeError, match="group '/' of .* is indexed by the name"):
                f[key]
        np.testing.assert_array_equal(f["a"][...], 1.0)


@pytest.mark.parametrize(
    "exc, said",
    [
        (ValueError("user bug on rank 1"), "(ValueError: user bug on rank 1)"),
        (KeyboardInterrupt(), "(KeyboardInterrupt)"),
        (lamina.StepError("no step 4"), "(StepError: no step 4)"),
    ],
)
def test_a_rank_that_left_is_said_once_by_its_error(exc, said):
    """'(Remote:ValueError: ValueError: user bug)' and '(RemoteError: KeyboardInterrupt: )':
    the class once, and no empty message after it."""
    err = comm_mod._error_from_payload(comm_mod._error_payload(exc, left=True), 1)
    assert f"rank 1 left the file after an error of its own {said}; let go" in str(err)


def test_a_second_writer_in_one_process_is_told_when_the_first_opened(tmp_path, monkeypatch):
    """The in-process LockError said 'since' the time of the second open, not the first's."""
    from lamina.engines.native import lock as lock_mod

    monkeypatch.setattr(lock_mod, "_who", lambda: "host h pid 1 since FIRST")
    with lamina.open(tmp_path / "held.lam", "w"):
        monkeypatch.setattr(lock_mod, "_who", lambda: "host h pid 1 since SECOND")
        with pytest.raises(lamina.LockError, match=r"in this process \(host h pid 1 since FIRST\)"):
            lamina.open(tmp_path / "held.lam", "a")
