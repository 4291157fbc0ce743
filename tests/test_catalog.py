"""Catalog encoding round trips: wire primitives, DatasetSpec, Stats, BlockRecord, Record, attributes."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lamina.catalog import (
    KIND_CLOSE,
    KIND_META,
    KIND_STEP,
    OP_ATTR,
    OP_DATASET,
    OP_DELATTR,
    OP_EXT,
    OP_GROUP,
    BlockRecord,
    BlockTable,
    Catalog,
    DatasetSpec,
    Decoder,
    Encoder,
    Record,
    Stats,
    check_dtype,
    decode_packed,
    normalize_attr,
    normpath,
    pack,
    parent,
    present_attr,
    subfile_name,
)
from lamina.catalog.model import (
    BlockCodec,
    decode_attr,
    decode_dtype,
    encode_attr,
    encode_dtype,
    encode_op,
    value_bytes,
)
from lamina.catalog.wire import MAX_STR
from lamina.errors import DTypeError, FormatError
from lamina.geometry import Box
from lamina.stats import compute

ALL_DTYPES = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]

# --------------------------------------------------------------------------
# wire


@given(
    st.integers(0, 255),
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.binary(max_size=64),
    st.text(max_size=40),
)
def test_wire_round_trip(a, b, c, d, e, f, blob, text):
    enc = Encoder()
    enc.u8(a)
    enc.u16(b)
    enc.u32(c)
    enc.u64(d)
    enc.i64(e)
    enc.f64(f)
    enc.blob(blob)
    enc.str(text)
    enc.raw(b"xyz")
    dec = Decoder(enc.getvalue(), "test")
    assert dec.u8() == a
    assert dec.u16() == b
    assert dec.u32() == c
    assert dec.u64() == d
    assert dec.i64() == e
    assert dec.f64() == f
    assert dec.blob() == blob
    assert dec.str() == text
    assert dec.raw(3) == b"xyz"
    assert dec.remaining == 0
    dec.expect_end()


def test_wire_decoder_over_memoryview_and_window():
    enc = Encoder()
    enc.u32(7)
    enc.u32(9)
    buf = bytearray(b"\xff" * 3 + enc.getvalue() + b"\xee")
    d = Decoder(memoryview(buf), "win", pos=3, end=11)
    assert d.u32() == 7 and d.u32() == 9
    d.expect_end()
    with pytest.raises(FormatError, match="win: truncated"):
        d.u8()


def test_wire_errors_name_what():
    with pytest.raises(FormatError, match="thing: truncated at byte 0"):
        Decoder(b"\x01", "thing").u32()
    with pytest.raises(FormatError, match="trailing"):
        Decoder(b"\x01\x02", "thing").expect_end()
    e = Encoder()
    e.u32(3)
    e.raw(b"\xff\xfe\xfd")
    with pytest.raises(FormatError, match="not UTF-8"):
        Decoder(e.getvalue()).str()
    e = Encoder()
    e.u32(MAX_STR + 1)
    with pytest.raises(FormatError, match="exceeds the limit"):
        Decoder(e.getvalue() + b"x" * (MAX_STR + 1)).str()
    e = Encoder()
    e.u64(10)
    with pytest.raises(FormatError, match="exceeds the limit of 4"):
        Decoder(e.getvalue() + b"x" * 10).blob(limit=4)
    with pytest.raises(ValueError, match="format limit"):
        Encoder().str("x" * (MAX_STR + 1))


def test_wire_count_refuses_impossible_counts():
    e = Encoder()
    e.u32(1_000_000)
    e.raw(b"\x00" * 100)
    with pytest.raises(FormatError, match="cannot fit"):
        Decoder(e.getvalue(), "c").count(4, name="things")
    e = Encoder()
    e.u32(5)
    e.raw(b"\x00" * 100)
    assert Decoder(e.getvalue()).count(4) == 5
    with pytest.raises(FormatError):
        Decoder(e.getvalue()).count(4, limit=4)


# --------------------------------------------------------------------------
# paths and dtypes


def test_normpath_and_parent():
    assert normpath("/a//b/") == "a/b"
    assert normpath("c", "a/b") == "a/b/c"
    assert normpath("/c", "a/b") == "c"
    assert normpath("") == "" and normpath("/") == ""
    for bad in ("a/../b", "./a", "a/\0b"):
        with pytest.raises(ValueError):
            normpath(bad)
    with pytest.raises(TypeError):
        normpath(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds"):
        normpath("x" * 5000)
    # the limit is on the UTF-8 bytes, and the message counts them (it said "2049 characters")
    assert normpath("g/" + "x" * 4094) == "g/" + "x" * 4094 and normpath("é" * 2048)
    with pytest.raises(
        ValueError, match=r"path of 4098 bytes \(UTF-8\) exceeds the limit of 4096 bytes"
    ):
        normpath("é" * 2049)
    assert parent("a/b/c") == "a/b" and parent("a") == ""
    assert subfile_name(3, 1) == "data.3.1"


@pytest.mark.parametrize("dt", ALL_DTYPES + [">f8", "<i4", "f16", "c32"])
def test_dtype_round_trip(dt):
    d = check_dtype(dt)
    e = Encoder()
    encode_dtype(e, d)
    assert decode_dtype(Decoder(e.getvalue())) == d


@pytest.mark.parametrize("dt", ["O", "U5", "S3", "V8", "M8[s]", "m8", "i4,f8", "(2,)f8"])
def test_check_dtype_rejects(dt):
    with pytest.raises(DTypeError, match="not supported"):
        check_dtype(dt)


def test_check_dtype_not_a_dtype():
    with pytest.raises(DTypeError, match="not a numpy dtype"):
        check_dtype("notadtype")


@pytest.mark.parametrize(
    "s", ["O", "U5", "f3", "x", "", "i4,f8", "(2)f", "M8", "V8", "<<f8", "a", "4Lh@", "(|20x,l"]
)
def test_decode_dtype_rejects_with_format_error(s):
    e = Encoder()
    e.str(s)
    with pytest.raises(FormatError):
        decode_dtype(Decoder(e.getvalue()))


# --------------------------------------------------------------------------
# attributes

ATTR_VALUES = [
    "hello",
    "",
    "ünïcødé ✓",
    ["a", "bb", ""],
    ("x", "y"),
    3,
    -7,
    2.5,
    float("inf"),
    True,
    1 + 2j,
    np.float32(1.5),
    np.uint64(2**64 - 1),
    np.arange(6, dtype="i2").reshape(2, 3),
    np.linspace(0, 1, 5),
    np.zeros((0, 3)),
    np.array([1 + 1j, 2 - 2j], dtype="c8"),
    np.array([True, False]),
    [1, 2, 3],
    [1.5, 2.5],
]


@pytest.mark.parametrize("value", ATTR_VALUES, ids=[repr(v)[:30] for v in ATTR_VALUES])
def test_attr_round_trip(value):
    e = Encoder()
    encode_attr(e, value)
    d = Decoder(e.getvalue())
    got = decode_attr(d)
    d.expect_end()
    stored = normalize_attr(value)
    if isinstance(stored, str):
        assert got == value
    elif isinstance(stored, list):
        assert got == list(value)
    else:
        assert isinstance(got, np.ndarray)
        assert got.dtype == stored.dtype and got.shape == stored.shape
        assert np.array_equal(got, stored)
        shown = present_attr(got)
        if np.ndim(value) == 0:
            assert np.isscalar(shown) or isinstance(shown, np.generic)
            assert shown == value


@given(
    hnp.arrays(
        hnp.scalar_dtypes().filter(lambda d: d.kind in "biufc"),
        hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    )
)
def test_attr_round_trip_arrays(arr):
    e = Encoder()
    encode_attr(e, arr)
    got = decode_attr(Decoder(e.getvalue()))
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.tobytes() == np.ascontiguousarray(arr).tobytes()


@pytest.mark.parametrize(
    "value",
    [b"bytes", None, {"a": 1}, ["a", 1], object(), np.array(["x"]), np.datetime64("2020-01-01")],
)
def test_attr_bad_values(value):
    with pytest.raises(DTypeError):
        normalize_attr(value)


def test_attr_too_large():
    with pytest.raises(ValueError, match="store it as a dataset"):
        normalize_attr(np.zeros(200_000))


def test_attr_decode_errors():
    with pytest.raises(FormatError, match="unknown attribute type tag 9"):
        decode_attr(Decoder(b"\x09"))
    # an array attribute whose byte count does not match its shape
    e = Encoder()
    e.u8(2)
    encode_dtype(e, np.dtype("f8"))
    e.u8(1)
    e.u64(3)
    e.blob(b"\x00" * 16)
    with pytest.raises(FormatError, match="does not match"):
        decode_attr(Decoder(e.getvalue()))


def test_attr_decode_refuses_impossible_empty_shape():
    """A zero-size attribute with absurd dimensions must not reach numpy (ValueError there)."""
    e = Encoder()
    e.u8(2)
    encode_dtype(e, np.dtype("f8"))
    e.u8(2)
    e.u64(0)
    e.u64(2**64 - 1)
    e.blob(b"")
    with pytest.raises(FormatError):
        decode_attr(Decoder(e.getvalue()))


# --------------------------------------------------------------------------
# DatasetSpec


def roundtrip_spec(spec: DatasetSpec) -> DatasetSpec:
    e = Encoder()
    spec.encode(e)
    d = Decoder(e.getvalue())
    out = DatasetSpec.decode(d)
    d.expect_end()
    return out


@pytest.mark.parametrize("dt", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 3, 4, 5)])
def test_dataset_spec_round_trip(dt, shape):
    dtype = np.dtype(dt)
    fill = {"b": True, "i": -3, "u": 7, "f": 1.5, "c": 1 - 2j}[dtype.kind]
    codecs = ({"id": "zstd", "level": 3},) if dtype.kind != "b" else ()
    spec = DatasetSpec("grp/sub/data", shape, dtype, np.array(fill, dtype=dtype)[()], codecs, 4)
    out = roundtrip_spec(spec)
    assert out.path == spec.path and out.shape == shape and out.dtype == dtype
    assert out.id == 4 and out.codecs == codecs
    assert out.fill_scalar() == spec.fill_scalar()
    assert out.digest_bytes() == spec.digest_bytes()


def test_dataset_spec_nan_fill():
    spec = DatasetSpec("x", (3,), np.dtype("f4"), np.float32("nan"), (), 0)
    assert np.isnan(roundtrip_spec(spec).fill_scalar())


def test_dataset_spec_decode_errors():
    spec = DatasetSpec("x", (3,), np.dtype("f8"), 0.0, (), 0)
    e = Encoder()
    spec.encode(e)
    raw = e.getvalue()
    # truncated anywhere -> FormatError
    for n in range(len(raw)):
        with pytest.raises(FormatError):
            DatasetSpec.decode(Decoder(raw[:n]))

    def with_codecs(js: str) -> bytes:
        e = Encoder()
        e.u32(0)
        e.str("x")
        encode_dtype(e, np.dtype("f8"))
        e.u8(1)
        e.u64(3)
        e.raw(b"\x00" * 8)
        e.str(js)
        return e.getvalue()

    for js, text in [
        ("{not json", "not valid JSON"),
        ('{"id": "zstd"}', "not a list"),
        ("[1]", "not a list"),
        ("[" * 3000, "not valid JSON"),
        # valid JSON nested deeper than a codec description ever is: refused before parsing
        ("[" * 2000 + "]" * 2000, "nested 2000 levels deep"),
        ('[{"id": "zstd", "level": [[[[1]]]]}]', "nested 6 levels deep"),
        ('[{"level": 1}]', "a codec without a name"),
        ('[{"id": 5}]', "a codec without a name"),
    ]:
        with pytest.raises(FormatError, match=text):
            DatasetSpec.decode(Decoder(with_codecs(js)))
    # bad path component
    e = Encoder()
    DatasetSpec("a/../b", (1,), np.dtype("f8"), 0.0, (), 0).encode(e)
    with pytest.raises(FormatError, match="bad dataset path"):
        DatasetSpec.decode(Decoder(e.getvalue()))
    # impossible shape
    e = Encoder()
    DatasetSpec("a", (1 << 62,), np.dtype("f8"), 0.0, (), 0).encode(e)
    with pytest.raises(FormatError, match="impossible shape"):
        DatasetSpec.decode(Decoder(e.getvalue()))


# --------------------------------------------------------------------------
# Stats


def stats_equal(a: Stats, b: Stats) -> bool:
    def same(x, y):
        if isinstance(x, float) and math.isnan(x):
            return isinstance(y, float) and math.isnan(y)
        return x == y and type(x) is type(y)

    return (
        same(a.min, b.min)
        and same(a.max, b.max)
        and complex(a.sum) == complex(b.sum)
        and a.count == b.count
    )


def roundtrip_stats(s: Stats, dt) -> Stats:
    e = Encoder()
    s.encode(e, np.dtype(dt))
    d = Decoder(e.getvalue())
    out = Stats.decode(d, np.dtype(dt))
    d.expect_end()
    return out


@pytest.mark.parametrize("dt", ALL_DTYPES)
def test_stats_round_trip_every_dtype(dt, rng):
    dtype = np.dtype(dt)
    if dtype.kind == "b":
        a = rng.random(50) < 0.5
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size=50, dtype=dtype, endpoint=True)
        a[0], a[1] = info.min, info.max  # extremes survive exactly
    elif dtype.kind == "f":
        a = (rng.standard_normal(50) * 100).astype(dtype)
        a[3] = np.nan
    else:
        a = (rng.standard_normal(50) + 1j * rng.standard_normal(50)).astype(dtype)
    s, _ = compute(a)
    out = roundtrip_stats(s, dtype)
    assert stats_equal(out, s), (out, s)
    if dtype.kind in "iu":
        assert out.min == int(a.min()) and out.max == int(a.max())
        assert isinstance(out.min, int)
    if dtype.kind == "c":
        assert isinstance(out.sum, complex)
    else:
        assert isinstance(out.sum, float)


@pytest.mark.parametrize("dt", ["f4", "f8", "c16", "i4", "u1", "?"])
def test_stats_round_trip_empty_and_all_nan(dt):
    s, _ = compute(np.zeros(0, dtype=dt))
    assert s.count == 0
    out = roundtrip_stats(s, dt)
    assert stats_equal(out, s)
    if np.dtype(dt).kind in "fc":
        s, _ = compute(np.full(4, np.nan, dtype=dt))
        assert s.count == 0 and math.isnan(s.min) and math.isnan(s.max)
        assert stats_equal(roundtrip_stats(s, dt), s)


def test_stats_as_dict_is_json_safe():
    import json

    d = Stats(float("nan"), float("inf"), complex(1, 2), 3).as_dict()
    json.dumps(d)
    assert d["sum"] == [1.0, 2.0] and d["count"] == 3 and d["min"] == "nan" and d["max"] == "inf"
    d = Stats(1, 5, 6.0, 2).as_dict()
    assert d == {"min": 1, "max": 5, "sum": 6.0, "count": 2}


# --------------------------------------------------------------------------
# BlockRecord and Record


def specs_fixture():
    return [
        DatasetSpec("a", (10, 8), np.dtype("f8"), 0.0, (), 0),
        DatasetSpec("g/b", (100,), np.dtype("i2"), 0, ({"id": "zlib", "level": 1},), 1),
        DatasetSpec("s", (), np.dtype("c16"), 0j, (), 2),
    ]


def test_block_record_round_trip():
    specs = specs_fixture()
    st_ = Stats(-1.5, 2.5, 10.0, 80)
    recs = [
        BlockRecord(
            0,
            Box((0, 0), (10, 8)),
            rank=3,
            session=1,
            agg=2,
            offset=4096,
            length=640,
            seg=0,
            crcs=(123,),
            stats=st_,
        ),
        BlockRecord(
            1,
            Box((10,), (60,)),
            rank=0,
            length=600_000,
            codec=1,
            seg=1 << 18,
            crcs=(1, 2, 3),
            stats=Stats(-5, 9, 3.0, 50),
        ),
        BlockRecord(2, Box((), ()), length=16, crcs=(0xFFFFFFFF,), stats=None),
    ]
    for r in recs:
        e = Encoder()
        r.encode(e, specs[r.dataset].dtype)
        d = Decoder(e.getvalue())
        out = BlockRecord.decode(d, specs)
        d.expect_end()
        assert out == r
        assert out.subfile == subfile_name(r.session, r.agg)


def _block_bytes(rec: BlockRecord, specs) -> bytes:
    e = Encoder()
    rec.encode(e, specs[rec.dataset].dtype if rec.dataset < len(specs) else np.dtype("f8"))
    return e.getvalue()


def test_block_record_decode_errors():
    specs = specs_fixture()
    good = BlockRecord(0, Box((0, 0), (2, 2)), length=32, crcs=(5,))
    cases = [
        (BlockRecord(7, Box((0,), (1,)), length=8, crcs=(1,)), "dataset id 7"),
        (BlockRecord(0, Box((0, 0), (11, 2)), length=176, crcs=(1,)), "outside dataset"),
        (BlockRecord(0, Box((0, 0), (2, 2)), length=31, crcs=(1,)), "claims 31 bytes"),
        (BlockRecord(0, Box((0, 0), (2, 2)), length=32, crcs=(1, 2)), "2 checksums, expected 1"),
        (BlockRecord(0, Box((0, 0), (2, 2)), length=32, codec=4, crcs=(1,)), "unknown codec id 4"),
        (
            BlockRecord(0, Box((0, 0), (2, 2)), length=32, codec=2, crcs=(1,)),
            "statistics-only block .* claims 32 bytes",
        ),
        (BlockRecord(1, Box((0,), (4,)), length=1 << 62, codec=1, crcs=(1,)), "impossible"),
        (  # (formats 1 and 2: a segment or a count no int64 column holds, found at the open)
            BlockRecord(0, Box((0, 0), (2, 2)), length=32, seg=1 << 63, crcs=(1,)),
            "checksum segment",
        ),
        (
            BlockRecord(0, Box((0, 0), (2, 2)), length=32, crcs=(1,), stats=Stats(0, 1, 1, 5)),
            "counts 5 values, its box holds 4",
        ),
    ]
    for rec, text in cases:
        with pytest.raises(FormatError, match=text):
            BlockRecord.decode(Decoder(_block_bytes(rec, specs)), specs)
    # stop < start in the stored box
    raw = bytearray(_block_bytes(good, specs))
    raw[4:12] = (5).to_bytes(8, "little")  # start[0] = 5 > stop[0] = 2
    with pytest.raises(FormatError, match="outside"):
        BlockRecord.decode(Decoder(bytes(raw)), specs)
    # statistics flag other than 0/1
    raw = bytearray(_block_bytes(good, specs))
    raw[-1] = 2
    with pytest.raises(FormatError, match="statistics flag"):
        BlockRecord.decode(Decoder(bytes(raw)), specs)


def full_record(kind=KIND_STEP, step=0):
    """A record that defines datasets, groups and attributes and writes blocks to them."""
    specs = specs_fixture()
    ops = [
        (OP_GROUP, "g"),
        (OP_GROUP, "deep/er/group"),
        (OP_DATASET, specs[0]),
        (OP_DATASET, specs[1]),
        (OP_DATASET, specs[2]),
        (OP_ATTR, "", "title", "run 1"),
        (OP_ATTR, "a", "units", ["K", "kelvin"]),
        (OP_ATTR, "g", "dt", np.float64(0.25)),
        (OP_ATTR, "g/b", "origin", np.array([1, 2, 3], dtype="i8")),
        (OP_ATTR, "g", "gone", 1),
        (OP_DELATTR, "g", "gone"),
        (OP_EXT, "derived/x", b"\x00\x01payload"),
    ]
    blocks = [
        BlockRecord(
            0, Box((0, 0), (5, 8)), rank=0, length=320, crcs=(11,), stats=Stats(0.0, 1.0, 2.0, 40)
        ),
        BlockRecord(
            0,
            Box((5, 0), (10, 8)),
            rank=1,
            offset=320,
            length=320,
            crcs=(12,),
            stats=Stats(1.0, 2.0, 3.0, 40),
        ),
        BlockRecord(
            1, Box((0,), (100,)), length=50, codec=1, crcs=(13,), stats=Stats(-3, 4, 5.0, 100)
        ),
        BlockRecord(2, Box((), ()), length=16, crcs=(14,), stats=Stats(1.0, 1.0, 1 + 0j, 1)),
    ]
    rec = Record.of_blocks(kind, step, blocks, specs, session=2, nranks=2, time=1234.5, ops=ops)
    return rec, specs, blocks


def encode(rec, specs, version):
    """A record as the transports ship it (version 3: head and area packed) or as version 2 stores it."""
    head, area = rec.encode(specs, version)
    return pack(head, area) if version >= 3 else head


def decode(raw, cat, version, apply_ops=True):
    """(record, step blocks or None) of what :func:`encode` made."""
    if version >= 3:
        return decode_packed(raw, cat, "record", apply_ops, version)
    rec = Record.decode(raw, cat, "record", apply_ops, version=version)
    return rec, (rec.step_blocks(None, "record") if rec.kind == KIND_STEP else None)


def all_blocks(blocks, specs) -> list[BlockRecord]:
    return [r for d in blocks.datasets() for r in blocks.table(specs[d]).records(d)]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_record_round_trip_and_catalog(version):
    rec, specs, blocks = full_record()
    raw = encode(rec, specs, version)
    cat = Catalog()
    out, got = decode(raw, cat, version)
    assert (
        out.kind == KIND_STEP
        and out.step == 0
        and out.session == 2
        and out.nranks == 2
        and out.time == 1234.5
    )
    assert all_blocks(got, cat.specs) == blocks
    assert len(out.ops) == len(rec.ops)
    if version < 3:
        assert encode(out, cat.specs, version) == raw  # re-encoding is byte-identical
    cat.apply_record(out, ops_applied=True, blocks=got)
    assert cat.steps and len(cat.steps) == 1
    assert (
        cat.kind_of("a") == "dataset"
        and cat.kind_of("deep/er") == "group"
        and cat.kind_of("zzz") is None
    )
    assert cat.children("") == ["a", "deep", "g", "s"]
    assert cat.children("g") == ["b"]
    assert cat.all_paths() == ["a", "deep", "deep/er", "deep/er/group", "g", "g/b", "s"]
    assert cat.attrs[""]["title"] == "run 1"
    assert cat.attrs["a"]["units"] == ["K", "kelvin"]
    assert present_attr(cat.attrs["g"]["dt"]) == 0.25
    assert np.array_equal(cat.attrs["g/b"]["origin"], [1, 2, 3])
    assert "gone" not in cat.attrs["g"]
    assert cat.ext["derived/x"] == b"\x00\x01payload"
    assert [b.box for b in cat.blocks(0, 0)] == [Box((0, 0), (5, 8)), Box((5, 0), (10, 8))]
    assert cat.step_times == [1234.5]
    assert cat.last_session == 2 and not cat.closed


@pytest.mark.parametrize("version", [2, 3])
def test_record_kinds_and_order(version):
    rec, specs, _ = full_record()
    cat = Catalog()

    def apply(r):
        out, got = decode(encode(r, cat.specs, version), cat, version)
        cat.apply_record(out, ops_applied=True, blocks=got)

    out, got = decode(encode(rec, specs, version), cat, version)
    cat.apply_record(out, ops_applied=True, blocks=got)
    apply(Record(KIND_META, -1, session=3, ops=[(OP_ATTR, "", "more", 1.0)]))
    assert cat.attrs[""]["more"] == 1.0 and len(cat.steps) == 1
    apply(Record(KIND_CLOSE, -1, session=3))
    assert cat.closed and cat.nrecords == 3 and cat.last_session == 3
    # a step record out of order
    with pytest.raises(FormatError, match="out of order"):
        apply(Record(KIND_STEP, 5, session=3))


@pytest.mark.parametrize("version", [2, 3])
def test_record_decode_without_applying_ops(version):
    rec, specs, blocks = full_record()
    raw = encode(rec, specs, version)
    cat = Catalog()
    for op in rec.ops:
        cat.apply_op(op)
    out, got = decode(raw, cat, version, apply_ops=False)
    assert all_blocks(got, cat.specs) == blocks
    assert len(cat.specs) == 3


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("kind", ["step", "meta", "close", "empty step"])
def test_record_encoded_for_reading_is_what_its_head_decodes_to(version, kind):
    """``encode_read`` gives the bytes ``encode`` gives and the record ``decode`` makes of the
    head: the same fields, the same section directory (whose blocks read back), the same
    operations."""
    rec, specs, blocks = full_record()
    if kind == "meta":
        rec = Record(KIND_META, -1, session=3, time=5.5, ops=rec.ops)
    elif kind == "close":
        rec = Record(KIND_CLOSE, -1, session=3, time=6.5)
    elif kind == "empty step":
        rec = Record(KIND_STEP, 0, session=3, time=7.5, ops=rec.ops)
    head, area, read = rec.encode_read(specs, version, area_offset=4096)
    assert (head, area) == rec.encode(specs, version, area_offset=4096)
    cat = Catalog()
    for op in rec.ops:
        cat.apply_op(op)
    dec = Record.decode(head, cat, "record", apply_ops=False, version=version)
    for name in ("kind", "step", "session", "nranks", "time", "sections", "extents"):
        assert getattr(read, name) == getattr(dec, name), name
    assert (read.area_offset, read.area_length, read.version) == (
        dec.area_offset,
        dec.area_length,
        dec.version,
    )
    assert not read.tables and read.columns is None
    ops = [Encoder() for _ in range(2)]
    for e, r in zip(ops, (read, dec), strict=True):
        for op in r.ops:
            encode_op(e, op)
    assert ops[0].getvalue() == ops[1].getvalue()
    if kind == "step":  # the directory finds the blocks in the area
        got = read.step_blocks(lambda o, n: memoryview(area)[o : o + n], "record")
        assert all_blocks(got, cat.specs) == blocks
    with pytest.raises(ValueError, match="holds its blocks"):
        rec.encode_read(specs, 2)


def test_record_decode_errors():
    rec, specs, blocks = full_record()
    head, area = rec.encode(specs)
    with pytest.raises(FormatError, match="unknown record kind 9"):
        Record.decode(b"\x09" + head[1:], Catalog())
    with pytest.raises(FormatError, match="trailing"):
        Record.decode(head + b"\x00", Catalog())
    for n in (0, 1, len(head) // 2, len(head) - 1):
        with pytest.raises(FormatError):
            Record.decode(head[:n], Catalog())
    # blocks that refer to a dataset never defined
    blocks_only = Record.of_blocks(KIND_STEP, 0, blocks[:1], specs)
    for version in (2, 3):
        with pytest.raises(FormatError, match="dataset id 0"):
            Record.decode(blocks_only.encode(specs, version)[0], Catalog(), version=version)
    # an area that does not match its head
    cat = Catalog()
    with pytest.raises(FormatError, match="block area of"):
        decode_packed(pack(head, area[:-1]), cat, "record")
    bad = bytearray(area)
    bad[20] ^= 1
    out, got = decode_packed(pack(head, bytes(bad)), Catalog(), "record")
    with pytest.raises(FormatError, match="checksum"):
        all_blocks(got, specs)
    # a meta record may not carry blocks
    meta = Record.of_blocks(KIND_META, -1, blocks, specs)
    with pytest.raises(FormatError, match="meta record holds blocks"):
        cat = Catalog()
        for op in rec.ops:
            cat.apply_op(op)
        Record.decode(meta.encode(specs)[0], cat)


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("order", [(1, 0), (1, 1)])
def test_record_decode_refuses_block_sections_out_of_order(version, order):
    """The directory lists one section per dataset, by ascending dataset: a section of a
    lower dataset after a higher one, or of the same dataset twice, is refused."""
    from lamina.catalog.blocks import Section

    rec, specs, _ = full_record()
    head, area = rec.encode(specs, version)
    cat = Catalog()
    for op in rec.ops:
        cat.apply_op(op)
    one = Record.decode(head, cat, apply_ops=False, version=version).sections[0]
    sections = {
        k: Section(did, one.nblocks, k * one.length, one.length, one.crc)
        for k, did in enumerate(order)
    }
    bad = Record(KIND_STEP, 0, session=2, nranks=2, sections=sections)
    with pytest.raises(FormatError, match="block sections out of order"):
        Record.decode(bad.encode(cat.specs, version)[0], cat, apply_ops=False, version=version)


def test_catalog_apply_op_inconsistencies():
    cat = Catalog()
    spec = DatasetSpec("d", (2,), np.dtype("f8"), 0.0, (), 0)
    cat.apply_op((OP_DATASET, spec))
    with pytest.raises(FormatError, match="has id 0, expected 1"):
        cat.apply_op((OP_DATASET, DatasetSpec("e", (2,), np.dtype("f8"), 0.0, (), 0)))
    with pytest.raises(FormatError, match="defined twice"):
        cat.apply_op((OP_DATASET, DatasetSpec("d", (2,), np.dtype("f8"), 0.0, (), 1)))
    with pytest.raises(FormatError, match="pass through dataset"):
        cat.apply_op((OP_GROUP, "d/sub"))
    with pytest.raises(FormatError, match="unknown node"):
        cat.apply_op((OP_ATTR, "nowhere", "x", 1))
    with pytest.raises(FormatError, match="unknown operation"):
        cat.apply_op((99,))
    with pytest.raises(ValueError, match="unknown metadata operation"):
        from lamina.catalog.model import encode_op

        encode_op(Encoder(), (99,))


def test_format_4_compresses_band_sections_and_checks_them():
    """Format 4 stores the block tables of multiresolution datasets zlib-compressed (where that is
    shorter); a section whose compressed bytes do not hold what it claims is a FormatError."""
    import zlib

    from crc32c import crc32c

    from lamina.catalog.blocks import BlockTable, StepBlocks, encode_area, unsqueeze

    spec = DatasetSpec("T", (64, 64), np.dtype("f4"), 0.0, (), 0)
    recs = [
        BlockRecord(
            0,
            Box((i * 8, j * 8), (i * 8 + 8, j * 8 + 8)),
            0,
            0,
            0,
            (i * 8 + j) * 256,
            256,
            0,
            0,
            (i * 8 + j,),
            Stats(float(i), float(i + j), 1.0, 64),
        )
        for i in range(8)
        for j in range(8)
    ]
    t = BlockTable.from_records(recs, spec)
    plain_secs, plain = encode_area({0: t})
    secs, area = encode_area({0: t}, squeeze=[0])
    assert plain_secs[0].raw == 0 and secs[0].raw == len(plain) and len(area) < len(plain) / 3
    loaded = StepBlocks({0: secs[0]}, [], lambda o, n: area[o : o + n], "step 0")
    assert loaded.table(spec).records(0) == recs
    bad = zlib.compress(plain[:-1], 1)  # one byte short of what the section claims
    sec = secs[0]._replace(length=len(bad), crc=crc32c(bad))
    with pytest.raises(FormatError, match="do not hold the"):
        StepBlocks({0: sec}, [], lambda o, n: bad[o : o + n], "step 0").table(spec)
    with pytest.raises(FormatError, match="do not decompress"):
        unsqueeze(b"not zlib at all", 100, "step 0")


@st.composite
def _subfile_rows(draw):
    """Rows (session, aggregator, offset, length): often all in one subfile, as one
    aggregator writes them."""
    k = draw(st.sampled_from([1, 1, 3]))
    row = st.tuples(
        st.integers(0, k - 1), st.integers(0, k - 1), st.integers(0, 1000), st.integers(0, 50)
    )
    return draw(st.lists(row, min_size=1, max_size=12))


@given(st.lists(_subfile_rows(), min_size=1, max_size=3))
def test_extents_of_against_a_loop(tables):
    """The bytes each subfile must hold: the largest end of a stored block in it (one
    subfile or several, blocks of length 0 not counted)."""
    from lamina.catalog.blocks import extents_of

    built, want = {}, {}
    for did, rows in enumerate(tables):
        n = len(rows)
        cols = np.array(rows, dtype=np.int64)
        built[did] = SimpleNamespace(  # the columns extents_of reads, as a table has them
            session=cols[:, 0].astype(np.uint32),
            agg=cols[:, 1].astype(np.uint32),
            offset=cols[:, 2],
            length=cols[:, 3],
        )
        assert n
        for s, a, off, ln in rows:
            if ln > 0:
                want[(s, a)] = max(want.get((s, a), 0), off + ln)
    assert extents_of(built) == sorted((s, a, e) for (s, a), e in want.items())


@given(
    st.sampled_from(["same", "mixed"]),
    st.lists(st.sampled_from([0, 1, 2, 3, 4, 16]), min_size=1, max_size=8),
    st.lists(st.integers(0, 5 << 20), min_size=1, max_size=8),
)
def test_crc_counts_against_a_loop(kind, units, lengths):
    """Checksums per block: one without segments, else one per segment begun (at least
    one); tables of one power-of-two segment take the shift, the others the division."""
    from lamina.catalog.blocks import _crc_counts
    from lamina.catalog.model import SEGMENT_UNIT

    n = min(len(units), len(lengths))
    segs = (
        [units[0] * SEGMENT_UNIT] * n if kind == "same" else [u * SEGMENT_UNIT for u in units[:n]]
    )
    want = [1 if s == 0 else max(1, -(-ln // s)) for s, ln in zip(segs, lengths[:n], strict=True)]
    got = _crc_counts(np.array(segs, dtype=np.int64), np.array(lengths[:n], dtype=np.int64))
    assert got.tolist() == want


def _table_of_boxes(lo: np.ndarray, hi: np.ndarray) -> BlockTable:
    n = len(lo)
    z4, z8 = np.zeros(n, np.uint32), np.zeros(n, np.int64)
    return BlockTable(
        np.dtype("f8"),
        lo,
        hi,
        rank=z4,
        session=z4,
        agg=z4,
        offset=z8,
        length=z8,
        codec=np.zeros(n, np.uint8),
        seg=z8,
        ncrc=np.ones(n, np.uint32),
        crcs=z4,
        has_stats=np.zeros(n, bool),
        smin=np.zeros(n),
        smax=np.zeros(n),
        ssum=np.zeros(n),
        count=z8,
    )


@given(st.integers(1, 3), st.integers(0, 30), st.integers(0, 2**31))
def test_hits_against_brute_force_over_several_searches(nd, n, seed):
    """The blocks a box meets, first by a scan, then by the sorted index, a box asked
    again answered alike; answers are read-only, ascending, with the common parts."""
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, 12, (n, nd))
    hi = lo + rng.integers(1, 5, (n, nd))
    t = _table_of_boxes(lo, hi)
    boxes = [rng.integers(0, 12, nd) for _ in range(3)]
    queries = [(b, b + rng.integers(0, 6, nd)) for b in boxes]
    queries += [queries[1], (np.zeros(nd, np.int64), np.full(nd, 20)), queries[0]]
    for s, e in queries:
        idx, a, b = t.hits(s, e)
        clo, chi = np.maximum(lo, s), np.minimum(hi, e)
        want = np.flatnonzero((clo < chi).all(axis=1)) if n else np.zeros(0, np.int64)
        if bool((e <= s).any()):
            want = want[:0]
        assert idx.tolist() == want.tolist()
        assert np.array_equal(a, clo[want]) and np.array_equal(b, chi[want])
        assert not (idx.flags.writeable or a.flags.writeable or b.flags.writeable)
        again = t.hits(s, e)  # the same box at once: the same answer
        assert all(np.array_equal(x, y) for x, y in zip(again, (idx, a, b), strict=True))


@given(st.integers(1, 3), st.integers(1, 12), st.integers(0, 2**31))
def test_read_cost_against_brute_force(nd, n, seed):
    """The elements the parts of a search cover and the stored bytes a read of them takes: a
    raw block's part, a coded block whole; one block (on its values) as many (on columns)."""
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, 12, (n, nd))
    hi = lo + rng.integers(1, 5, (n, nd))
    t = _table_of_boxes(lo, hi)
    coded = rng.random(n) < 0.4
    t.codec = np.where(coded, int(BlockCodec.PIPELINE), int(BlockCodec.RAW)).astype(np.uint8)
    t.length = np.where(coded, rng.integers(1, 1000, n), (hi - lo).prod(axis=1) * 8)
    for s, e in [(np.zeros(nd, np.int64), np.full(nd, 20))] + [
        (b, b + rng.integers(1, 8, nd)) for b in rng.integers(0, 12, (4, nd))
    ]:
        idx, a, b = t.hits(s, e)
        part = (b - a).prod(axis=1)
        want = (int(part.sum()), int(np.where(coded[idx], t.length[idx], part * 8).sum()))
        assert t.read_cost(idx, a, b) == want
        for k in range(len(idx)):  # each part alone: the one-block path
            one = (idx[k : k + 1], a[k : k + 1], b[k : k + 1])
            assert t.read_cost(*one) == (
                int(part[k]),
                int(t.length[idx[k]]) if coded[idx[k]] else int(part[k]) * 8,
            )


def test_hits_keeps_the_last_search_and_only_for_its_box():
    lo = np.array([[0, 0], [4, 0], [0, 4], [4, 4]], dtype=np.int64)
    t = _table_of_boxes(lo, lo + 4)
    first = t.hits((1, 1), (5, 3))  # a scan
    assert t.hits((1, 1), (5, 3)) is first  # kept
    other = t.hits((3, 3), (5, 5))  # another box: searched (the sorted order now)
    assert other is not first and other[0].tolist() == [0, 1, 2, 3]
    back = t.hits((1, 1), (5, 3))
    assert back is not first and back[0].tolist() == first[0].tolist() == [0, 1]


# -- threads: a table, a step and a catalog are read by several threads at once -----------
# (thread_util.interleavings runs a second call at every bytecode of the first one: a
# value published before it is whole is met half-made at some switch, every time)


def _rows_of_four(n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Corners of *n* blocks of 4 rows by 8 columns, one under the other."""
    lo = np.stack([np.arange(0, 4 * n, 4), np.zeros(n, np.int64)], axis=1).astype(np.int64)
    return lo, lo + np.array([4, 8], dtype=np.int64)


def test_hits_from_a_thread_switched_to_while_the_sorted_order_is_made():
    """The second search of a table makes its sorted order (starts, and the widest block's
    extent): a search by another thread switched to at any point of it finds every block
    of its box, the blocks that start before the box too (the order was published before
    the extent, 0 until then: blocks begun before the box were left out, and a read filled
    their part with the fill value)."""
    from thread_util import interleavings

    lo, hi = _rows_of_four()

    def setup() -> BlockTable:
        t = _table_of_boxes(lo, hi)
        t.hits((0, 0), (1, 1))  # the first search: a scan (the next ones sort)
        return t

    n = 0
    for _k, out, inner, _t in interleavings(
        [BlockTable.hits],
        setup,
        lambda t: t.hits((41, 2), (47, 5)),
        lambda t: t.hits((5, 0), (7, 8)),
    ):
        assert out.get()[0].tolist() == [10, 11]
        idx, a, b = inner.get()
        assert idx.tolist() == [1] and a.tolist() == [[5, 0]] and b.tolist() == [[7, 8]]
        n += 1
    assert n > 20  # (the search was traced)


def test_block_checksums_from_a_thread_switched_to_while_their_pointer_is_made():
    """Where each block's checksums start is made at the first use (crc_ptr): another
    thread asking for a block's checksums at any point of it gets them all (the pointer
    was published zeroed, then summed: a block had no checksums, and a read of an intact
    file failed as corrupt)."""
    from thread_util import interleavings

    lo, hi = _rows_of_four(3)
    crcs = [[11, 12], [13], [14, 15, 16]]

    def setup() -> BlockTable:
        return BlockTable.build(np.dtype("f8"), lo, hi, crcs=crcs)

    def outer(t: BlockTable):
        return t.crc_ptr.tolist()

    assert BlockTable.crc_ptr.fget is not None
    n = 0
    for _k, out, inner, _t in interleavings(
        [BlockTable.crc_ptr.fget], setup, outer, lambda t: [t.block_crcs(i) for i in range(3)]
    ):
        assert out.get() == [0, 2, 3, 6]
        assert inner.get() == [tuple(c) for c in crcs]
        n += 1
    assert n > 5


def test_a_step_released_by_a_thread_while_another_takes_a_table_of_it(rng):
    """A catalog releases the tables of a step read long ago while another thread may be
    taking a table of it: one taken from the one-block sections decoded together, at any
    point, is the table decoded alone (the step's sections were looked up again after
    the release had dropped them: AttributeError)."""
    from thread_util import interleavings

    from lamina.catalog.blocks import StepBlocks, encode_area

    specs, tables = _one_block_tables(rng)
    secs, area = encode_area(tables)
    did, other = [s.dataset for s in secs if s.nblocks == 1][:2]
    alone = StepBlocks({s.dataset: s for s in secs}, [], lambda o, n: area[o : o + n], "step 0")
    want = alone.table(specs[did])

    def setup() -> StepBlocks:
        sb = StepBlocks({s.dataset: s for s in secs}, [], lambda o, n: area[o : o + n], "step 0")
        sb.table(specs[other], specs, eager=True)  # the one-block sections, together
        assert sb.together
        return sb

    n = 0
    for _k, out, inner, _sb in interleavings(
        [StepBlocks.table], setup, lambda sb: sb.table(specs[did], specs), lambda sb: sb.release()
    ):
        inner.get()
        _columns_equal(out.get(), want)
        n += 1
    assert n > 10


def test_steps_kept_by_two_threads_at_once():
    """Two threads reading steps of one file keep them in the catalog at once: at any
    point of one's keeping the other's, both are kept, the oldest two are released (once
    each), and KEEP_STEPS are kept (two threads dropped the same oldest step: KeyError,
    or one iterated the steps while the other changed them: RuntimeError)."""
    from thread_util import interleavings

    from lamina.catalog.tree import KEEP_STEPS

    class Step:
        def __init__(self, k: int, released: list[int]) -> None:
            self.k, self.released = k, released

        def release(self) -> None:
            self.released.append(self.k)

    def setup() -> tuple[Catalog, list[int]]:
        cat, released = Catalog(), []
        for k in range(KEEP_STEPS):
            cat._keep(k, Step(k, released))  # type: ignore[arg-type]
        assert not released
        return cat, released

    def keep(state, k: int) -> None:
        cat, released = state
        cat._keep(k, Step(k, released))

    n = 0
    for _k, out, inner, (cat, released) in interleavings(
        [Catalog._keep], setup, lambda s: keep(s, 100), lambda s: keep(s, 101)
    ):
        out.get()
        inner.get()
        assert sorted(released) == [0, 1]
        assert sorted(cat._kept) == [*range(2, KEEP_STEPS), 100, 101]
        n += 1
    assert n > 10


@pytest.mark.parametrize(
    "column, k, value, text",
    [
        ("offset", 2, 1 << 62, "impossible offset or length"),
        ("codec", 1, 9, "unknown codec id"),
        ("has_stats", 3, 2, "bad statistics flag"),
        ("codec", 0, int(BlockCodec.MULTIRES), "multiresolution band of a plain dataset"),
        ("codec", 2, int(BlockCodec.STATS_ONLY), "keeps statistics only but claims bytes"),
        ("length", 3, 8, "is raw but its length is not its box's bytes"),
        ("seg", 1, 1000, "checksum segment that is not a multiple"),
    ],
)
def test_block_table_decode_names_the_check_and_the_block(column, k, value, text):
    """Each check of a decoded block section names what is wrong and the first block where it
    is, whichever of them fail (the checks run on whole columns, the rows only on failure)."""
    spec = specs_fixture()[0]  # (10, 8) float64
    recs = [
        BlockRecord(0, Box((2 * i, 0), (2 * i + 2, 8)), offset=128 * i, length=128, crcs=(i,))
        for i in range(5)
    ]
    t = BlockTable.from_records(recs, spec)
    assert BlockTable.decode(t.encode(), spec, "s").length.tolist() == [128] * 5
    if column == "has_stats":  # a flag other than 0 or 1 exists only in bytes: the last column
        raw = bytearray(t.encode())
        raw[len(raw) - len(t) + k] = value
    else:
        col = getattr(t, column).copy()
        col[k] = value
        setattr(t, column, col)
        raw = bytearray(t.encode())
    box = f"({2 * k}, 0)..({2 * k + 2}, 8)"
    with pytest.raises(FormatError, match=rf"block {k} \(box {re.escape(box)}\) .*{text}"):
        BlockTable.decode(bytes(raw), spec, "s")


_BIG = 1 << 62


def _columns_one_by_one(raw: bytes, nd: int, dt: np.dtype, amax: bool) -> dict:
    """The columns of a section read one after the other, as docs/format.md lays them out,
    with the dtypes a decoded table gives them."""
    n, ncrcs = np.frombuffer(raw, "<u8", 2)
    n, ncrcs = int(n), int(ncrcs)
    sd = "<i8" if dt.kind == "i" else "<u8" if dt.kind in "ub" else "<f8"
    md = "<c16" if dt.kind == "c" else "<f8"
    layout = [("start", "<i8", n * nd), ("stop", "<i8", n * nd)]
    layout += [(k, "<u8", n) for k in ("offset", "length", "seg")]
    layout += [("smin", sd, n), ("smax", sd, n), ("ssum", md, n), ("count", "<u8", n)]
    layout += [(k, "<u4", n) for k in ("rank", "session", "agg", "ncrc")]
    layout += [("crcs", "<u4", ncrcs), ("codec", "u1", n), ("has_stats", "u1", n)]
    layout += [("amax", "<f8", n)] if amax else []
    out, pos = {}, 16
    for name, t, count in layout:
        out[name] = np.frombuffer(raw, t, count, pos)
        pos += np.dtype(t).itemsize * count
    assert pos == len(raw)
    out["start"], out["stop"] = out["start"].reshape(n, nd), out["stop"].reshape(n, nd)
    for name in ("offset", "length", "seg", "count"):
        out[name] = out[name].view("<i8")
    out["has_stats"] = out["has_stats"].view(np.bool_)
    return out


@settings(max_examples=60)
@given(
    n=st.integers(0, 70),
    nd=st.integers(0, 3),
    dt=st.sampled_from(["f4", "i8", "u1", "c16", "?"]),
    amax=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_sections_decode_as_one_record_as_column_by_column(n, nd, dt, amax, seed):
    """A section is read as the fields of one record (one call); the table is the one its
    columns read one by one give: every column's values, dtype and shape."""
    from lamina.catalog import blocks as cb

    rng = np.random.default_rng(seed)
    spec = DatasetSpec("/d", (40, 30, 20)[:nd], np.dtype(dt))
    lo = rng.integers(0, 10, (n, nd))
    hi = lo + rng.integers(0, 10, (n, nd))
    size = (hi - lo).prod(axis=1)
    t = _table_of_boxes(lo, hi)
    t.dtype = spec.dtype
    t.length = size * spec.dtype.itemsize
    t.offset = rng.integers(0, 1 << 40, n)
    t.rank, t.session, t.agg = (rng.integers(0, 1 << 32, n, dtype=np.uint32) for _ in range(3))
    t.crcs = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    t.has_stats = rng.random(n) < 0.5
    t.count = np.minimum(size, rng.integers(0, 100, n))
    t.smin, t.smax = rng.random(n), rng.random(n)
    t.ssum = rng.random(n) + (1j * rng.random(n) if dt == "c16" else 0)
    t.amax = rng.random(n) if amax else None
    raw = t.encode()
    one = BlockTable.decode(raw, spec, "s", amax)
    # the columns are fields of one record indeed
    assert one.smin.base.dtype.names == cb._FIELDS[: len(one.smin.base.dtype.names)]
    cols = _columns_one_by_one(raw, nd, spec.dtype, amax)
    for name in [*cb._FIELDS[:13], "crcs", "codec", "has_stats", "amax"]:
        a = getattr(one, name)
        if name not in cols:
            assert a is None
            continue
        b = cols[name]
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    assert one.encode() == raw


@settings(max_examples=40)
@given(
    extra=st.integers(0, 300),
    nd=st.integers(1, 3),
    dt=st.sampled_from(["f8", "f4", "i4", "c16", "?"]),
    amax=st.booleans(),
    same=st.sets(st.sampled_from(["length", "count", "rank", "agg", "has", "smin", "ssum"])),
    seed=st.integers(0, 2**31),
)
# columns of 8 and 16 bytes past 64 KiB, those of 4 and 1 below it: both ways of folding
@example(extra=8000, nd=2, dt="c16", amax=True, same={"length", "rank", "smin", "ssum"}, seed=1)
@example(extra=8000, nd=3, dt="f8", amax=False, same={"count", "agg", "has"}, seed=2)
def test_large_tables_decode_folded_with_the_values_of_their_bytes(extra, nd, dt, amax, same, seed):
    """A table of FOLD_MIN rows or more is decoded into memory of its own: every column
    holds the bytes of its section; a column whose rows all hold one value (bit for bit)
    is that value once, at stride 0; the others are copies; all read-only; its nbytes
    counts what it holds.  Rows that differ only in the sign of a zero, in a NaN's payload
    or in the imaginary part of a sum are not folded."""
    from lamina.catalog import blocks as cb

    n = cb.FOLD_MIN + extra
    rng = np.random.default_rng(seed)
    spec = DatasetSpec("/d", (400, 30, 20)[:nd], np.dtype(dt))
    lo = rng.integers(0, 10, (n, nd))
    hi = lo + (rng.integers(1, 10, (n, nd)) if "length" not in same else 3)
    size = (hi - lo).prod(axis=1)
    t = _table_of_boxes(lo, hi)
    t.dtype = spec.dtype
    t.length = size * spec.dtype.itemsize
    t.offset = rng.integers(0, 1 << 40, n)
    t.rank = np.full(n, 3, np.uint32) if "rank" in same else rng.integers(0, 4, n, np.uint32)
    t.agg = np.full(n, 1, np.uint32) if "agg" in same else rng.integers(0, 4, n, np.uint32)
    t.crcs = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    t.has_stats = np.ones(n, bool) if "has" in same else rng.random(n) < 0.5
    t.count = size if "count" in same else np.minimum(size, rng.integers(0, 100, n))
    stat = cb.stat_dtype(spec.dtype)
    if "smin" in same:  # zeros, one of them negative: equal values, different bits
        t.smin = np.zeros(n, stat)
        if stat == np.float64 and rng.random() < 0.5:
            t.smin[rng.integers(n)] = -0.0
    else:
        t.smin = rng.integers(0, 3, n).astype(stat)
    t.smax = np.full(n, np.nan) if stat == np.float64 else np.full(n, 7, stat)
    if stat == np.float64 and rng.random() < 0.5:  # another NaN: unequal bits
        t.smax[rng.integers(n)] = np.frombuffer(b"\x01\x00\x00\x00\x00\x00\xf8\x7f", "<f8")[0]
    if "ssum" in same:
        t.ssum = np.full(n, 2.5 + (1j if dt == "c16" else 0))
        if dt == "c16" and rng.random() < 0.5:  # the real part alike, the imaginary not
            t.ssum[rng.integers(n)] = 2.5 - 1j
    else:
        t.ssum = rng.random(n) + (1j * rng.random(n) if dt == "c16" else 0)
    t.amax = (np.full(n, 4.0) if rng.random() < 0.5 else rng.random(n)) if amax else None
    raw = t.encode()
    got = BlockTable.decode(raw, spec, "s", amax)
    cols = _columns_one_by_one(raw, nd, spec.dtype, amax)
    held = 0
    for name, b in cols.items():
        a = getattr(got, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
        assert not a.flags.writeable, name
        bits = b.view(np.uint8).reshape(len(b), -1)
        one_value = bool((bits == bits[0]).all())
        if name in cb._FOLDABLE:
            assert (a.strides[0] == 0) == one_value, name
        else:
            assert a.strides[0] != 0 or len(a) <= 1, name
        if a.strides[0] == 0:
            held += a.itemsize
        else:
            # not a view of the section: a copy, or an array over bytes of its own
            base = a.base
            assert base is None or len(memoryview(base).cast("B")) == a.nbytes, name
            held += a.nbytes
    assert got.nbytes == held
    assert BlockTable.empty(nd, spec.dtype).nbytes == 0  # no row: nothing held
    assert got.encode() == raw
    # statistics that come later still go in (the folded columns become arrays again)
    rows = np.arange(0, n, 7)
    got.set_stats(rows, True, np.ones(len(rows)), np.ones(len(rows)), np.ones(len(rows)), 1)
    assert bool(got.has_stats[rows].all()) and bool((got.count[rows] == 1).all())


def _sound_block(nd: int, layered: bool, seg: int) -> tuple[DatasetSpec, dict]:
    """A dataset and the fields of a sound block of it (its box, location, codec, ...)."""
    shape = (8, 5, 6)[:nd]
    spec = DatasetSpec(
        "/d", shape, np.dtype("f4"), layout={"layout": "multires"} if layered else None
    )
    lo, hi = [1, 0, 2][:nd], [8, 3, 6][:nd]
    size = math.prod(b - a for a, b in zip(lo, hi, strict=True))
    length = size * 4
    ncrc = 1 if seg == 0 else max(1, -(-length // seg))
    codec = int(BlockCodec.MULTIRES) if layered else int(BlockCodec.RAW)
    f = dict(
        lo=lo, hi=hi, offset=4096, length=length, seg=seg, codec=codec, has=1, ncrc=ncrc,
        ncrcs=ncrc, count=size, mag=2.5 if layered else None,
    )  # fmt: skip
    return spec, f


def _wrong_values(spec: DatasetSpec, f: dict) -> list[tuple[str, int, object]]:
    """``(field, dimension, value)``: each field of block *f* set to values at and past its limits."""
    size, out = f["count"], []
    for k, n in enumerate(spec.shape):
        a, b = f["lo"][k], f["hi"][k]
        out += [("lo", k, v) for v in (-1, 0, b - 1, b, b + 1)]
        out += [("hi", k, v) for v in (a - 1, a, n, n + 1, -1)]
    out += [("offset", 0, v) for v in (0, _BIG - 1, _BIG, (1 << 64) - 1)]
    out += [("length", 0, v) for v in (0, 1, f["length"] - 1, f["length"] + 4, _BIG, 1 << 63)]
    out += [("seg", 0, v) for v in (0, 7, 1 << 18, (1 << 18) + 1, 1 << 19, _BIG, 1 << 63)]
    out += [("codec", 0, v) for v in [int(c) for c in BlockCodec] + [max(BlockCodec) + 1, 255]]
    out += [("has", 0, v) for v in (0, 1, 2, 255)]
    out += [("ncrc", 0, v) for v in (0, f["ncrc"] - 1, f["ncrc"] + 1)]
    out += [("ncrcs", 0, v) for v in (0, f["ncrc"] + 1)]
    out += [("count", 0, v) for v in (0, size, size + 1, (1 << 64) - 1)]
    if f["mag"] is not None:
        out += [("mag", 0, v) for v in (0.0, -1.0, -0.0, math.nan, math.inf)]
    return out


def _both_checks(spec: DatasetSpec, f: dict) -> list[str | None]:
    """What the one-block check and the column check say of block *f*: None, or the message."""
    from lamina.catalog import blocks as cb

    nd = spec.ndim
    u8 = lambda v: np.array([v], dtype="<u8")  # noqa: E731
    cols = (
        np.array(f["lo"], dtype=np.int64).reshape(1, nd),
        np.array(f["hi"], dtype=np.int64).reshape(1, nd),
        u8(f["offset"]),
        u8(f["length"]),
        u8(f["seg"]),
        np.array([f["ncrc"]], dtype="<u4"),
        f["ncrcs"],
        np.array([f["codec"]], dtype="u1"),
        np.array([f["has"]], dtype="u1"),
        u8(f["count"]),
        None if f["mag"] is None else np.array([f["mag"]], dtype="<f8"),
    )
    outcome: list[str | None] = []
    for check in (cb._check_one, cb._check_columns):
        try:
            check(spec, "section", cb._Columns(*cols))
            outcome.append(None)
        except FormatError as e:
            outcome.append(str(e))
    # the checks of one-block sections decoded together take a block where these accept it
    assert _sound_together(spec, f) == (outcome[0] is None), outcome[0]
    return outcome


def _sound_together(spec: DatasetSpec, f: dict) -> bool:
    """Whether block *f*, decoded with other one-block sections of its layout, passes their
    whole-column checks (:meth:`_OnesColumns.sound`); the other rows are sound blocks."""
    from lamina.catalog import blocks as cb

    if f["ncrcs"] < 1:  # no checksum: not a layout decoded together (decoded alone, refused)
        return False
    layered = spec.layout is not None
    rec = np.zeros(3, dtype=cb._ones_dtype(spec.ndim, spec.dtype, f["ncrcs"], layered))
    _, good = _sound_block(spec.ndim, layered, f["seg"] if f["seg"] in (0, 1 << 18) else 0)
    for k, g in ((0, good), (1, f), (2, good)):
        row = rec[k : k + 1]
        row["n"], row["c"] = 1, f["ncrcs"] if k == 1 else g["ncrc"]
        row["start"] = np.array(g["lo"]).reshape(1, 1, -1)
        row["stop"] = np.array(g["hi"]).reshape(1, 1, -1)
        for name, key in (("offset", "offset"), ("length", "length"), ("seg", "seg")):
            row[name] = np.array([g[key]], dtype="<u8")
        row["codec"], row["has"], row["ncrc"] = g["codec"], g["has"], g["ncrc"]
        row["count"] = np.array([g["count"]], dtype="<u8")
        if layered:
            row["amax"] = g["mag"]
    if good["ncrc"] != f["ncrcs"]:  # the sound rows need a layout of their own: row 1 alone
        rec = rec[1:2]
        return bool(cb._OnesColumns(rec, layered).sound([spec], f["ncrcs"])[0])
    ok = cb._OnesColumns(rec, layered).sound([spec] * 3, f["ncrcs"])
    assert ok[0] and ok[2]
    return bool(ok[1])


def _changed(f: dict, field: str, k: int, value) -> dict:
    g = dict(f)
    if field in ("lo", "hi"):
        g[field] = [value if i == k else v for i, v in enumerate(f[field])]
    else:
        g[field] = value
    return g


@pytest.mark.parametrize("nd", [0, 1, 3])
@pytest.mark.parametrize("layered", [False, True])
@pytest.mark.parametrize("seg", [0, 1 << 18])
def test_one_block_section_checks_agree_with_the_column_checks(nd, layered, seg):
    """A section of one block is checked on its values as Python numbers (the common case:
    a dataset written once a step); a section of many, on whole columns.  For a sound block
    and for the same block with each field set at and past its limits in turn (a corner
    outside the dataset, an impossible offset, an unknown codec, a wrong checksum count,
    more values counted than the box holds, ...), the two accept alike or raise the same
    FormatError message."""
    spec, f = _sound_block(nd, layered, seg)
    assert _both_checks(spec, f) == [None, None]
    refused = 0
    for field, k, value in _wrong_values(spec, f):
        got = _both_checks(spec, _changed(f, field, k, value))
        assert got[0] == got[1], (field, k, value)
        refused += got[0] is not None
    for codec in [int(c) for c in BlockCodec]:  # each codec with the lengths it allows or not
        for length in (0, 1, f["length"]):
            got = _both_checks(spec, dict(f, codec=codec, length=length))
            assert got[0] == got[1], (codec, length)
    assert refused >= 20  # the values past the limits are refused, not only the sound ones taken


@pytest.mark.parametrize("nd", [1, 3])
@pytest.mark.parametrize("layered", [False, True])
@pytest.mark.parametrize("seg", [0, 1 << 18])
def test_whole_column_judgement_passes_no_table_the_row_checks_refuse(
    monkeypatch, nd, layered, seg
):
    """A section's checks judge a table of one codec and one flag on reductions of whole
    columns first (``_looks_sound``) and look row by row only when that fails.  Tables of
    three blocks, the middle one with each field in turn at and past its limits: whenever
    the row checks refuse the table, the whole-column judgement does not pass it; and it
    passes the sound table (else the row checks would run for every table)."""
    from lamina.catalog import blocks as cb

    spec, f = _sound_block(nd, layered, seg)

    def cols_of(rows: list[dict]) -> cb._Columns:
        u8 = lambda key: np.array([r[key] for r in rows], dtype="<u8")  # noqa: E731
        return cb._Columns(
            np.array([r["lo"] for r in rows], dtype=np.int64),
            np.array([r["hi"] for r in rows], dtype=np.int64),
            u8("offset"),
            u8("length"),
            u8("seg"),
            np.array([r["ncrc"] for r in rows], dtype="<u4"),
            sum(r["ncrc"] for r in rows) + rows[1]["ncrcs"] - rows[1]["ncrc"],
            np.array([r["codec"] for r in rows], dtype="u1"),
            np.array([r["has"] for r in rows], dtype="u1"),
            u8("count"),
            None if f["mag"] is None else np.array([r["mag"] for r in rows], dtype="<f8"),
        )

    judged = cb._looks_sound
    size = np.full(3, f["count"], dtype=np.int64)
    assert judged(cols_of([f, f, f]), size, 4, layered)
    monkeypatch.setattr(cb, "_looks_sound", lambda *a: False)  # the row checks alone
    refused = 0
    wrong = [w for w in _wrong_values(spec, f) if w[0] not in ("lo", "hi")]  # bounds: checked first
    wrong += [("codec", 0, int(c)) for c in BlockCodec]
    for field, k, value in wrong:
        cols = cols_of([f, _changed(f, field, k, value), f])
        try:
            cb._check_columns(spec, "section", cols)
        except FormatError:
            refused += 1
            assert not judged(cols, size, 4, layered), (field, value)
    assert refused >= 15


@pytest.mark.parametrize("nd", [1, 3])
@pytest.mark.parametrize("layered", [False, True])
@pytest.mark.parametrize("seg", [0, 1 << 18])
def test_a_section_judged_like_the_last_sound_one_gets_the_same_verdict(
    monkeypatch, nd, layered, seg
):
    """A decoded section whose judged bytes (boxes, lengths, segments, counts, checksum
    counts, codecs, flags, magnitudes) equal those of the last sound section of the same
    dataset kind skips the column checks but for its offsets.  Sections of three blocks,
    the middle one with each field in turn at and past its limits, decoded right after the
    sound one: each gets the verdict (the same FormatError message, or none) it gets
    decoded first; and the sound one decoded again is not checked again (unless it holds
    more than ``JUDGED_MAX`` blocks)."""
    from lamina.catalog import blocks as cb

    spec, f = _sound_block(nd, layered, seg)

    def section(rows: list[dict]) -> bytes:
        ncrcs = sum(r["ncrc"] for r in rows) + rows[1]["ncrcs"] - rows[1]["ncrc"]
        rec = np.zeros(1, dtype=cb._section_dtype(3, nd, spec.dtype, ncrcs, layered))
        for name, key in (("offset", "offset"), ("length", "length"), ("seg", "seg")):
            rec[name] = [r[key] for r in rows]
        rec["start"], rec["stop"] = [r["lo"] for r in rows], [r["hi"] for r in rows]
        for name in ("ncrc", "codec", "has", "count"):
            rec[name] = [r[name] for r in rows]
        if layered:
            rec["amax"] = [r["mag"] for r in rows]
        return cb._HEAD.pack(3, ncrcs) + rec.tobytes()

    def verdict(raw: bytes) -> str | None:
        try:
            cb.BlockTable.decode(raw, spec, "section", amax=layered)
        except FormatError as e:
            return str(e)
        return None

    good = section([f, f, f])
    checked = []
    check = cb._check_columns
    monkeypatch.setattr(cb, "_check_columns", lambda *a: (checked.append(1), check(*a)))
    assert verdict(good) is None and verdict(good) is None
    assert len(checked) == 1  # the second time judged like the first
    refused = 0
    wrong = _wrong_values(spec, f) + [("codec", 0, int(c)) for c in BlockCodec]
    for field, k, value in wrong:
        bad = section([f, _changed(f, field, k, value), f])
        monkeypatch.setattr(cb, "_sound_last", None)
        first = verdict(bad)
        verdict(good)
        assert verdict(bad) == first, (field, k, value)
        refused += first is not None
    assert refused >= 20
    monkeypatch.setattr(cb, "JUDGED_MAX", 2)  # larger sections: always checked
    checked.clear()
    assert verdict(good) is None and verdict(good) is None
    assert len(checked) == 2


@given(data=st.data(), nd=st.sampled_from([0, 1, 3]), layered=st.booleans())
def test_one_block_section_checks_agree_with_two_fields_wrong(data, nd, layered):
    """As above, with two fields wrong at once: the first error in the checks' order wins
    in both."""
    spec, f = _sound_block(nd, layered, data.draw(st.sampled_from([0, 1 << 18])))
    wrong = _wrong_values(spec, f)
    for _ in range(2):
        f = _changed(f, *data.draw(st.sampled_from(wrong)))
    got = _both_checks(spec, f)
    assert got[0] == got[1]


def _one_block_tables(rng, n_each: int = 5) -> tuple[list[DatasetSpec], dict[int, BlockTable]]:
    """Datasets of several layouts (ndim, dtype, checksums, multiresolution bands) and a
    one-block table of each, with a few tables of three blocks among them."""
    from lamina.catalog.blocks import BlockTable

    specs, tables = [], {}
    kinds = [(nd, dt, nc, band) for nd in (1, 3) for dt in ("f8", "i2", "c16") for nc in (1, 2)
             for band in (False, True)]  # fmt: skip
    for nd, dt, nc, band in kinds:
        for j in range(n_each + 1):
            did = len(specs)
            n = 3 if j == n_each else 1
            shape = (40,) * nd
            spec = DatasetSpec(
                f"d{did}", shape, np.dtype(dt), None, (), did,
                layout={"layout": "multires"} if band else None,
            )  # fmt: skip
            specs.append(spec)
            lo = rng.integers(0, 20, (n, nd))
            hi = lo + rng.integers(1, 20, (n, nd))
            seg = (1 << 18) if nc == 2 else 0
            length = (
                np.prod(hi - lo, axis=1) * np.dtype(dt).itemsize
                if not band
                else np.full(n, (1 << 18) + 100 if nc == 2 else 64)
            )
            # bands of 2 checksums a block (segments of 256 KiB); raw blocks here have one
            nc_rows = [1 if seg == 0 else max(1, -(-int(x) // seg)) for x in length]
            t = BlockTable.build(
                dt, lo, hi, rank=rng.integers(0, 4, n), session=1, agg=2,
                offset=rng.integers(0, 1 << 40, n), length=length,
                codec=int(BlockCodec.MULTIRES) if band else int(BlockCodec.RAW), seg=seg,
                crcs=[[int(v) for v in rng.integers(0, 1 << 32, c)] for c in nc_rows],
                has_stats=True, smin=rng.integers(-5, 5, n), smax=rng.integers(5, 9, n),
                ssum=rng.random(n), count=rng.integers(0, 2, n),
            )  # fmt: skip
            if band:
                t.amax = rng.random(n)
            tables[did] = t
    return specs, tables


def _columns_equal(a: BlockTable, b: BlockTable) -> None:
    for name in BlockTable.__slots__:
        if name.startswith("_") or name in ("dtype", "ndim"):
            continue
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
        assert not x.flags.writeable, name  # decoded columns are read-only views


def test_one_block_sections_encode_and_decode_together_as_alone(rng):
    """A step of many datasets written as one block each (many simulation variables) has its
    one-block sections encoded together, layout by layout, and decoded together once a
    reader has asked for one in ONES_SHARE of them alone.  The bytes are those of each table encoded alone,
    and every table decoded together equals the one decoded alone, column by column."""
    from lamina.catalog.blocks import ONES_SHARE, StepBlocks, encode_area

    specs, tables = _one_block_tables(rng)
    secs, area = encode_area(tables)
    for sec in secs:
        assert area[sec.offset : sec.offset + sec.length] == tables[sec.dataset].encode()
    loads: list[tuple[int, int]] = []

    def load(o: int, n: int):
        loads.append((o, n))
        return memoryview(area)[o : o + n]

    together = StepBlocks({s.dataset: s for s in secs}, [], load, "step 0")
    alone = StepBlocks({s.dataset: s for s in secs}, [], lambda o, n: area[o : o + n], "step 0")
    order = list(rng.permutation(len(specs)))
    for did in order:
        _columns_equal(together.table(specs[did], specs), alone.table(specs[did]))
    # tables are read alone until one in ONES_SHARE of the step's were, then one load for
    # every one-block section left; the tables of three blocks are read alone
    nblocks = {s.dataset: s.nblocks for s in secs}
    alone_until = max(1, len(secs) // ONES_SHARE)
    expect, bulk = 0, False
    for did in order:
        if nblocks[specs[did].id] == 1 and not bulk and expect >= alone_until:
            bulk = True
            expect += 1
        elif nblocks[specs[did].id] > 1 or not bulk:
            expect += 1
    assert bulk and len(loads) == expect
    together.release()
    _columns_equal(together.table(specs[order[0]], specs), alone.table(specs[order[0]]))


def test_one_block_sections_decoded_together_name_a_bad_one(rng):
    """A damaged one-block section among many (a flipped byte: its checksum fails; a bad
    value under a good checksum: its check fails) is left out of the sections decoded
    together: the datasets around it read as written, and it raises the error that names
    it when it is asked for, as it would alone."""
    from crc32c import crc32c

    from lamina.catalog.blocks import StepBlocks, encode_area

    specs, tables = _one_block_tables(rng)
    secs, area = encode_area(tables)
    ones = [s for s in secs if s.nblocks == 1 and specs[s.dataset].dtype == np.dtype("f8")]
    flipped, wrong = ones[2], ones[3]
    raw = bytearray(area)
    raw[flipped.offset + 20] ^= 0x10  # in its first corner
    # the second block claims an unknown codec under a checksum that matches
    codec_at = wrong.offset + wrong.length - 2 - (8 if specs[wrong.dataset].layout else 0)
    raw[codec_at] = 250
    fixed = crc32c(bytes(raw[wrong.offset : wrong.offset + wrong.length]))
    directory = {s.dataset: s for s in secs}
    directory[wrong.dataset] = wrong._replace(crc=fixed)
    blocks = StepBlocks(directory, [], lambda o, n: memoryview(bytes(raw))[o : o + n], "step 3")
    alone = StepBlocks({s.dataset: s for s in secs}, [], lambda o, n: area[o : o + n], "step 3")
    for did in sorted(directory):
        if did == flipped.dataset:
            with pytest.raises(FormatError, match=f"dataset 'd{did}' fail their checksum"):
                blocks.table(specs[did], specs)
        elif did == wrong.dataset:
            with pytest.raises(FormatError, match=f"'d{did}': block 0 .* unknown codec id"):
                blocks.table(specs[did], specs)
        else:
            _columns_equal(blocks.table(specs[did], specs), alone.table(specs[did]))


def test_storage_of_one_block_sections_alone_as_their_tables_say(rng):
    """StepBlocks.storage takes a one-block section's sizes from its columns without making
    its table (where the step has too few for them to be decoded together): the same
    blocks, bytes stored and bytes of values as the table gives, for every kind of section;
    the same error as table() for a damaged one (its checksum, or a bad value under a good
    checksum); and nothing kept (a later table() loads it)."""
    from crc32c import crc32c

    from lamina.catalog.blocks import StepBlocks, encode_area

    specs, tables = _one_block_tables(rng)
    secs, area = encode_area(tables)
    for sec in secs:  # each section the only one of its step
        did, spec = sec.dataset, specs[sec.dataset]
        step = StepBlocks({did: sec}, [], lambda o, n: area[o : o + n], "step 3")
        t = tables[did]
        want = (len(t), t.stored_bytes(), t.value_bytes(spec.dtype.itemsize))
        assert step.storage(specs, {did}) == {did: want}, spec
        assert bool(step._tables) == (sec.nblocks > 1)  # a table made only for more blocks
        assert len(step.table(spec)) == len(t) and step._tables
    ones = [s for s in secs if s.nblocks == 1 and specs[s.dataset].dtype == np.dtype("f8")]
    flipped, wrong = ones[2], ones[3]
    raw = bytearray(area)
    raw[flipped.offset + 20] ^= 0x10
    codec_at = wrong.offset + wrong.length - 2 - (8 if specs[wrong.dataset].layout else 0)
    raw[codec_at] = 250
    fixed = wrong._replace(crc=crc32c(bytes(raw[wrong.offset : wrong.offset + wrong.length])))
    for sec, why in ((flipped, "fail their checksum"), (fixed, r"block 0 .* unknown codec id")):
        did = sec.dataset
        step = StepBlocks({did: sec}, [], lambda o, n: memoryview(bytes(raw))[o : o + n], "s")
        with pytest.raises(FormatError, match=f"dataset 'd{did}'.*{why}") as e:
            step.storage(specs, {did})
        with pytest.raises(FormatError) as e2:
            step.table(specs[did])
        assert str(e.value) == str(e2.value)


def test_storage_of_a_damaged_one_block_section_as_its_table_says(rng):
    """Bytes of one-block sections changed under a checksum made again (what no CRC finds):
    StepBlocks.storage, which unpacks such a section's values itself, gives the sizes the
    table would, or raises the error decoding the table raises, whatever byte changed."""
    from crc32c import crc32c

    from lamina.catalog.blocks import StepBlocks, encode_area

    specs, tables = _one_block_tables(rng, n_each=2)
    secs, area = encode_area(tables)
    said = set()
    for sec in secs:
        if sec.nblocks != 1:
            continue
        spec = specs[sec.dataset]
        for at in rng.choice(sec.length, min(sec.length, 24), replace=False).tolist():
            raw = bytearray(area[sec.offset : sec.offset + sec.length])
            raw[at] ^= 1 << int(rng.integers(8))
            got = sec._replace(offset=0, crc=crc32c(bytes(raw)))

            def outcome(fn, raw=bytes(raw), got=got):
                try:
                    return fn(StepBlocks({got.dataset: got}, [], lambda o, n: raw[o : o + n], "s"))
                except FormatError as e:
                    return str(e)

            t = outcome(lambda b, spec=spec: b.table(spec))
            if not isinstance(t, str):
                t = (1, t.stored_bytes(), t.value_bytes(spec.dtype.itemsize))
            assert outcome(lambda b, spec=spec: b.storage(specs, {spec.id})[spec.id]) == t
            said.add(isinstance(t, str))
    assert said == {True, False}  # both outcomes met


@pytest.mark.parametrize("band", [False, True])
def test_one_block_sections_judged_like_the_last_sound_group_get_the_same_verdict(
    rng, monkeypatch, band
):
    """A group of one-block sections decoded together whose judged bytes (heads, boxes,
    lengths, segments, counts, checksum counts, codecs, flags, magnitudes) and datasets
    equal the last sound group's skips the column checks but for its offsets (a step of
    many variables written like the one before).  Each judged field of one section made
    wrong in turn, and its offset past the limit, under a checksum that matches: decoded
    right after the sound group, every dataset gets the outcome (its table, or the
    FormatError naming it) it gets when the wrong group is decoded first."""
    from crc32c import crc32c

    from lamina.catalog import blocks as cb

    specs, tables = _one_block_tables(rng)
    secs, area = cb.encode_area(tables)
    # a group of one layout: 3-D float64 sections of one checksum, plain or bands
    group = [
        s
        for s in secs
        if s.nblocks == 1
        and specs[s.dataset].ndim == 3
        and specs[s.dataset].dtype == np.dtype("f8")
        and (specs[s.dataset].layout is not None) == band
        and tables[s.dataset].ncrc[0] == 1
    ]
    assert len(group) >= cb.ONES_MIN + 1
    first, victim = group[0], group[2]  # the first asked for is decoded alone
    directory = {s.dataset: s for s in group}
    rdt = cb._ones_dtype(3, np.dtype("f8"), 1, band)

    def outcomes_of(defs: list, raw: bytes, dirs: dict) -> list:
        blocks = cb.StepBlocks(dirs, [], lambda o, n: memoryview(raw)[o : o + n], "step 2")
        got = []
        for did in [first.dataset, *sorted(set(dirs) - {first.dataset})]:
            try:
                t = blocks.table(defs[did], defs)
            except FormatError as e:
                got.append(str(e))
            else:
                got.append(t.encode())
        return got

    def outcomes(raw: bytes, dirs: dict) -> list:
        return outcomes_of(specs, raw, dirs)

    def wrong(field: str, value) -> tuple[bytes, dict]:
        raw = bytearray(area)
        rec = np.frombuffer(raw, dtype=rdt, count=1, offset=victim.offset)
        rec[field] = value
        fixed = crc32c(bytes(raw[victim.offset : victim.offset + victim.length]))
        return bytes(raw), {**directory, victim.dataset: victim._replace(crc=fixed)}

    sound = cb._OnesColumns.sound
    checked = []
    monkeypatch.setattr(cb._OnesColumns, "sound", lambda *a: (checked.append(1), sound(*a))[1])
    monkeypatch.setattr(cb, "_ones_sound_last", None)
    good = outcomes(area, directory)
    assert outcomes(area, directory) == good and len(checked) == 1  # judged like the first
    cases = [
        ("n", 2), ("c", 5), ("start", -1), ("stop", 10**6), ("length", 1), ("seg", 3),
        ("count", 10**9), ("ncrc", 7), ("length", cb.LIMIT), ("codec", 250), ("has", 2), ("offset", cb.LIMIT),
    ] + ([("amax", -1.0)] if band else [])  # fmt: skip
    for field, value in cases:
        raw, dirs = wrong(field, value)
        monkeypatch.setattr(cb, "_ones_sound_last", None)
        alone = outcomes(raw, dirs)
        if (field, value) != ("length", 1) or not band:  # (a band's length is its own)
            assert any(isinstance(x, str) for x in alone), field  # the wrong value is refused
        assert outcomes(area, directory) == good
        assert outcomes(raw, dirs) == alone, field
    # the same bytes, the datasets decoded together defined smaller: judged on their
    # definitions too
    small = list(specs)
    for s in group[1:]:
        small[s.dataset] = dataclasses.replace(specs[s.dataset], shape=(4, 4, 4))
    monkeypatch.setattr(cb, "_ones_sound_last", None)
    alone = outcomes_of(small, area, directory)
    assert outcomes(area, directory) == good
    assert outcomes_of(small, area, directory) == alone != good


def test_steps_of_many_one_block_datasets_round_trip(tmp_path):
    """Through the file: steps of many datasets of several dtypes and shapes, most written
    as one block, some as two, some skipped, read back a step at a time with statistics."""
    import lamina

    kinds = [("f8", (16,)), ("i4", (4, 5)), ("c16", (3, 3, 3)), ("u2", (7,)), ("f4", (2, 2))]
    path = str(tmp_path / "many.lam")

    def values(ds, s: int, i: int) -> np.ndarray:
        a = np.arange(math.prod(ds.shape)) + s + i
        return a.reshape(ds.shape).astype(ds.dtype)

    with lamina.open(path, "w", durable=False) as f:
        dss = [f.create_dataset(f"v{i}", shape=kinds[i % 5][1], dtype=kinds[i % 5][0])
               for i in range(40)]  # fmt: skip
        for s in range(3):
            with f.step():
                for i, ds in enumerate(dss):
                    if (i + s) % 7 == 3:
                        continue
                    a = values(ds, s, i)
                    if i % 11 == 5:
                        ds.write(a[:1])
                        ds.write(a[1:], offset=(1,) + (0,) * (a.ndim - 1))
                    else:
                        ds.write(a, copy=False)
    with lamina.open(path) as f:
        for s in range(3):
            for i in range(40):
                ds = f[f"v{i}"]
                if (i + s) % 7 == 3:
                    assert ds.blocks(s) == []
                    continue
                a = values(ds, s, i)
                assert np.array_equal(ds.read(step=s), a)
                (st_,) = ds.blocks(s)[:1]
                assert st_.stats is not None and st_.stats.count >= 1


def _one_block_steps(path, n: int, size: int, scale: float) -> str:
    """A file of 3 steps of *n* one-block datasets v0..: v{i} at step s holds scale * s + i."""
    import lamina

    with lamina.open(path, "w", durable=False) as f:
        dss = [f.create_dataset(f"v{i}", shape=(size,), dtype="f8") for i in range(n)]
        for s in range(3):
            with f.step():
                for i, ds in enumerate(dss):
                    ds.write(np.full(size, scale * s + i), copy=False)
    return str(path)


def test_a_reader_of_every_variable_decodes_the_next_steps_sections_together(tmp_path):
    """A reader that took several one-block tables of a step decodes the next step's one-block
    sections together from its first read (the first table of the first step is decoded
    alone, as a reader of one variable a step has it); a reader of one variable a step
    keeps decoding that one alone, and the values are the same either way."""
    import lamina

    path = _one_block_steps(tmp_path / "vars.lam", 6, 5, 10.0)
    with lamina.open(path) as r:
        steps = r.engine.stack()[-1].catalog.steps
        for s in range(3):
            for i in range(6):
                np.testing.assert_array_equal(r[f"v{i}"].read(step=s), np.full(5, 10.0 * s + i))
        assert [b.together for b in steps] == [True, True, True]
    with lamina.open(path) as r:
        steps = r.engine.stack()[-1].catalog.steps
        for s in range(3):
            np.testing.assert_array_equal(r["v2"].read(step=s), np.full(5, 10.0 * s + 2))
        assert not any(b.together for b in steps) and all(len(b._tables) == 1 for b in steps)


def test_a_reader_of_a_few_of_many_variables_decodes_only_those(tmp_path):
    """Reading 2 of 40 one-block datasets a step decoded all 40 sections at the second
    (reading 2 of 4000 cost 80 times reading 1); one table in ONES_SHARE taken alone turns
    a step's reads into one decode of them all, and a reader of every variable keeps that."""
    import lamina

    n = 40
    path = _one_block_steps(tmp_path / "few.lam", n, 3, 100.0)
    with lamina.open(path) as r:
        steps = r.engine.stack()[-1].catalog.steps
        for s in range(3):
            for i in (7, 30):
                np.testing.assert_array_equal(r[f"v{i}"].read(step=s), np.full(3, 100.0 * s + i))
        assert not any(b.together for b in steps) and all(len(b._tables) == 2 for b in steps)
    with lamina.open(path) as r:
        steps = r.engine.stack()[-1].catalog.steps
        for s in range(3):
            for i in range(n):
                np.testing.assert_array_equal(r[f"v{i}"].read(step=s), np.full(3, 100.0 * s + i))
        assert all(b.together for b in steps)
        # the first step's first tables alone (one in ONES_SHARE), the next steps' none
        assert [len(b._tables) for b in steps] == [n] * 3


_STEP_DTYPES = ("f4", "f8", "i2", "i8", "u1", "?", "c8", "c16")


_STEP_DATASET = st.tuples(st.integers(0, 3), st.sampled_from(_STEP_DTYPES), st.booleans())


@settings(max_examples=80, deadline=None)
@given(
    st.lists(_STEP_DATASET, max_size=8),
    st.tuples(_STEP_DATASET, st.integers(4, 12)),  # many datasets of one layout
    st.integers(1, 3),
    st.integers(0, 2**32 - 1),
    st.sampled_from([3, 4]),
)
def test_step_table_encodes_as_its_tables_do(datasets, common, nranks, seed, version):
    """A commit encodes the step's blocks from one table of every dataset's rows (ranks one
    after the other, datasets in any order within a rank): the same sections, bytes and
    extents as one table per dataset gives, built from the same rows independently, for
    datasets of 0-3 dimensions, of float, integer, bool and complex dtypes, bands of
    multiresolution datasets (magnitudes and compression in format 4), blocks of several
    checksums, and enough one-block sections of one layout to be encoded together."""
    import zlib

    from crc32c import crc32c

    from lamina.catalog.blocks import (
        ONES_MIN,
        SQUEEZE_LEVEL,
        SQUEEZE_MIN,
        BlockTable,
        Section,
        StepTable,
        encode_area,
        encode_step,
        extents_of,
        stat_dtype,
        sum_dtype,
    )
    from lamina.catalog.record import _with_amax

    rng = np.random.default_rng(seed)
    datasets = [*datasets, *[common[0]] * common[1]]
    if not datasets:
        return
    specs = [
        DatasetSpec(
            f"d{i}",
            (50,) * nd,
            np.dtype(dt),
            0,
            (),
            i,
            {"layout": "multires"} if lay and nd else None,
        )
        for i, (nd, dt, lay) in enumerate(datasets)
    ]
    width = max(s.ndim for s in specs)
    plain = len(specs) - common[1]  # datasets from here on are of the common layout
    common_nc = int(rng.choice([1, 1, 2, 3]))  # their blocks' number of checksums
    rows = []  # (rank, did, columns of the row)
    for r in range(nranks):
        # many datasets of one block (encoded together), some of several
        k = len(specs) if rng.random() < 0.5 else int(rng.integers(0, len(specs) + 1))
        once = rng.permutation(len(specs))[:k]
        more = rng.integers(0, len(specs), int(rng.integers(0, ONES_MIN)))
        for did in np.concatenate([once, more]).tolist():
            spec = specs[did]
            nd = spec.ndim
            lo = rng.integers(0, 40, nd)
            nc = common_nc if did >= plain else int(rng.choice([1] * 8 + [2, 3]))
            sd, md = stat_dtype(spec.dtype), sum_dtype(spec.dtype)
            if sd.kind == "f":
                lo_hi = rng.normal(size=2)
                if rng.random() < 0.1:
                    lo_hi[0] = np.nan
            else:
                lo_hi = rng.integers(0, 100, 2)
            total = rng.normal() + (1j * rng.normal() if md.kind == "c" else 0)
            rows.append(
                (
                    r,
                    did,
                    dict(
                        start=lo,
                        stop=lo + rng.integers(1, 10, nd),
                        offset=int(rng.integers(0, 10**6)),
                        length=int(rng.integers(0, 5000)),
                        seg=int(rng.choice([0, 1 << 18])),
                        smin=np.array(lo_hi[0], dtype=sd),
                        smax=np.array(lo_hi[1], dtype=sd),
                        ssum=np.array(total, dtype=md),
                        count=int(rng.integers(0, 100)),
                        session=int(rng.integers(0, 2)),
                        agg=int(rng.integers(0, 3)),
                        crcs=rng.integers(0, 2**32, nc).astype(np.uint32),
                        codec=int(rng.choice([0, 1, 3])),
                        has_stats=bool(rng.random() < 0.8),
                        amax=float(rng.random()) if spec.layout is not None else np.inf,
                    ),
                )
            )
    complex_sums = any(sum_dtype(specs[d].dtype).kind == "c" for _, d, _ in rows)

    def padded(c, nd):
        out = np.zeros(width, dtype=np.int64)
        out[:nd] = c
        return out

    n = len(rows)
    if n:
        columns = StepTable(
            np.array([d for _, d, _ in rows], dtype=np.int64),
            start=np.array([padded(c["start"], specs[d].ndim) for _, d, c in rows]).reshape(
                n, width
            ),
            stop=np.array([padded(c["stop"], specs[d].ndim) for _, d, c in rows]).reshape(n, width),
            rank=np.array([r for r, _, _ in rows], dtype=np.uint32),
            session=np.array([c["session"] for *_, c in rows], dtype=np.uint32),
            agg=np.array([c["agg"] for *_, c in rows], dtype=np.uint32),
            offset=np.array([c["offset"] for *_, c in rows], dtype=np.int64),
            length=np.array([c["length"] for *_, c in rows], dtype=np.int64),
            codec=np.array([c["codec"] for *_, c in rows], dtype=np.uint8),
            seg=np.array([c["seg"] for *_, c in rows], dtype=np.int64),
            ncrc=np.array([len(c["crcs"]) for *_, c in rows], dtype=np.uint32),
            crcs=np.concatenate([c["crcs"] for *_, c in rows]),
            has_stats=np.array([c["has_stats"] for *_, c in rows], dtype=bool),
            smin=np.array([c["smin"].view("<u8") for *_, c in rows], dtype="<u8"),
            smax=np.array([c["smax"].view("<u8") for *_, c in rows], dtype="<u8"),
            ssum=np.array([c["ssum"] for *_, c in rows], dtype="<c16" if complex_sums else "<f8"),
            count=np.array([c["count"] for *_, c in rows], dtype=np.int64),
            amax=np.array([c["amax"] for *_, c in rows])
            if any(s.layout is not None for s in specs)
            else None,
        )
    else:
        columns = StepTable.empty()
    tables = {}
    for did, spec in enumerate(specs):  # the oracle: each dataset's rows, ranks in order
        mine = [c for _, d, c in sorted(rows, key=lambda x: x[0]) if d == did]
        if not mine:
            continue
        nd = spec.ndim
        t = BlockTable(
            spec.dtype,
            np.array([c["start"] for c in mine], dtype=np.int64).reshape(len(mine), nd),
            np.array([c["stop"] for c in mine], dtype=np.int64).reshape(len(mine), nd),
            rank=np.array([r for r, d, _ in sorted(rows, key=lambda x: x[0]) if d == did], "<u4"),
            session=np.array([c["session"] for c in mine], "<u4"),
            agg=np.array([c["agg"] for c in mine], "<u4"),
            offset=np.array([c["offset"] for c in mine], "<i8"),
            length=np.array([c["length"] for c in mine], "<i8"),
            codec=np.array([c["codec"] for c in mine], "u1"),
            seg=np.array([c["seg"] for c in mine], "<i8"),
            ncrc=np.array([len(c["crcs"]) for c in mine], "<u4"),
            crcs=np.concatenate([c["crcs"] for c in mine]),
            has_stats=np.array([c["has_stats"] for c in mine], bool),
            smin=np.array([c["smin"] for c in mine]),
            smax=np.array([c["smax"] for c in mine]),
            ssum=np.array([c["ssum"] for c in mine]),
            count=np.array([c["count"] for c in mine], "<i8"),
            amax=np.array([c["amax"] for c in mine]) if spec.layout is not None else None,
        )
        tables[did] = _with_amax(t, version >= 4 and spec.layout is not None)
    squeeze = [d for d in tables if specs[d].layout is not None] if version >= 4 else []

    def alone(squeeze):  # the reference: each table encoded alone
        sections, parts, pos = [], [], 0
        for did in sorted(tables):
            raw, size = tables[did].encode(), 0
            if did in squeeze and len(raw) >= SQUEEZE_MIN:
                packed = zlib.compress(raw, SQUEEZE_LEVEL)
                if len(packed) < len(raw):
                    raw, size = packed, len(raw)
            sections.append(Section(did, len(tables[did]), pos, len(raw), crc32c(raw), size))
            parts.append(raw)
            pos += len(raw)
        return sections, b"".join(parts)

    assert encode_step(columns, specs, version) == alone(squeeze)
    assert encode_area(tables, squeeze) == alone(squeeze)
    # tables with magnitudes, none compressed: one-block ones of one layout still together
    assert encode_area(tables) == alone(())
    assert columns.extents() == extents_of(tables)
    assert columns.dids == sorted(tables)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 12),
    st.sampled_from([3, 4]),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["none", "dataset", "order", "offset", "blocks", "raw", "length", "zero"]),
)
def test_record_directory_checked_at_once_as_one_by_one(nsec, version, seed, spoil):
    """A record's directory of block sections is checked as whole columns; whatever the
    entries (sound, or one field spoiled), the sections it gives are those the entry-by-entry
    checks give, and it gives none where those raise (they then name the entry)."""
    import struct

    from lamina.catalog.record import _ENTRY, _sections_at_once, _sections_one_by_one

    rng = np.random.default_rng(seed)
    specs = [
        DatasetSpec(f"d{i}", (9,) * int(rng.integers(0, 4)), np.dtype("f8"), 0, (), i)
        for i in range(16)
    ]
    ids = sorted(rng.choice(16, size=min(nsec, 16), replace=False).tolist())
    rows = []
    pos = 0
    for did in ids:
        rb = 16 * specs[did].ndim + 24 + 16 + 8 + 8 + 16 + 2
        n = int(rng.integers(1, 5))
        length = 16 + n * (rb + 4)
        raw = int(length) if version >= 4 and rng.random() < 0.3 else 0
        rows.append([did, n, pos, length - (7 if raw else 0), int(rng.integers(0, 2**32)), raw])
        pos += rows[-1][3]
    if rows and spoil != "none":
        k = int(rng.integers(0, len(rows)))
        field = {"dataset": 0, "order": 0, "offset": 2, "blocks": 1, "raw": 5, "length": 3}
        if spoil == "order" and len(rows) > 1:
            rows[k][0] = rows[k - 1][0]
        elif spoil == "zero":
            rows[k][1] = 0
        elif spoil == "dataset":
            rows[k][0] = 16 + k
        elif spoil in field:
            rows[k][field[spoil]] += int(rng.choice([1, 1 << 40, 1 << 62]))
    entry = _ENTRY[version]
    directory = b"".join(entry.pack(*(r if version >= 4 else r[:5])) for r in rows)
    try:
        want = _sections_one_by_one(directory, len(rows), specs, version, "record 0")
    except (FormatError, struct.error):
        want = None
    got = _sections_at_once(directory, len(rows), specs, version)
    if want is None:
        assert got is None
    elif got is not None:
        assert got == want
    if spoil == "none":
        assert got == want


def test_record_directory_whose_lengths_pass_2_to_the_64_is_refused():
    """Section lengths that add up past 2^64 wrap in the 64-bit columns of the check done
    at once: offsets forged to follow the wrapped sums must be refused as the entry-by-entry
    check refuses them, not handed on (a read then asked for exabytes)."""
    from lamina.catalog.record import _ENTRY, _sections_at_once, _sections_one_by_one

    specs = [DatasetSpec(f"d{i}", (4,), np.dtype("f8"), 0, (), i) for i in range(9)]
    rows, pos = [], 0
    for k, length in enumerate([(1 << 62) - 1] * 4 + [200] * 5):
        rows.append((k, 1, pos, length, 0, 0))
        pos = (pos + length) % (1 << 64)
    directory = b"".join(_ENTRY[4].pack(*r) for r in rows)
    assert _sections_at_once(directory, 9, specs, 4) is None
    with pytest.raises(FormatError, match="dataset 'd5'"):
        _sections_one_by_one(directory, 9, specs, 4, "record 0")


def test_children_follow_additions_and_restores():
    """children() keeps an index of the tree: it answers as a scan of every path would, after
    paths are added (a group, a dataset in it) and after a restore takes them away."""

    def scan(c: Catalog, path: str) -> list[str]:
        prefix = path + "/" if path else ""
        return sorted(
            {
                p[len(prefix) :].split("/", 1)[0]
                for p in (*c.groups, *c.datasets)
                if p and p.startswith(prefix) and p != path
            }
        )

    c = Catalog()
    c.apply_op((OP_GROUP, "g"))
    c.apply_op((OP_DATASET, DatasetSpec("g/a", (4,), np.dtype("f8"), id=0)))
    cp = c.checkpoint()
    for path in ("", "g", "g/a", "nothing"):
        assert c.children(path) == scan(c, path)
    c.apply_op((OP_GROUP, "g/h"))
    c.apply_op((OP_DATASET, DatasetSpec("g/h/b", (2,), np.dtype("i8"), id=1)))
    assert c.children("g") == ["a", "h"] and c.children("g/h") == ["b"]
    c.restore(cp)
    c.apply_op((OP_GROUP, "k"))  # as many paths as before the restore, other ones
    for path in ("", "g", "g/h", "k"):
        assert c.children(path) == scan(c, path), path


def test_a_checkpoint_restores_alike_however_often():
    """A checkpoint restored, then changed past again, restores to the same state once more:
    a rank that applies records again after a first restore may have to go back again."""
    c = Catalog()
    c.apply_op((OP_DATASET, DatasetSpec("g/a", (4,), np.dtype("f8"), id=0)))
    c.apply_op((OP_ATTR, "g/a", "units", "K"))
    cp = c.checkpoint()
    want = (set(c.groups), dict(c.datasets), {k: dict(v) for k, v in c.attrs.items()})
    for _ in range(3):
        c.apply_op((OP_DATASET, DatasetSpec("g/h/b", (2,), np.dtype("i8"), id=1)))
        c.apply_op((OP_ATTR, "g/a", "units", "m"))
        c.apply_op((OP_EXT, "x", b"1"))
        c.restore(cp)
        assert (set(c.groups), dict(c.datasets), c.attrs) == want
        assert len(c.specs) == 1 and not c.ext


def _catalog_state(c: Catalog) -> tuple:
    """Everything a restore must bring back, copied (attribute values compared by repr)."""
    return (
        set(c.groups),
        dict(c.datasets),
        {k: dict(v) for k, v in c.levels.items()},
        list(c.specs),
        list(c.layered),
        {k: {a: repr(v) for a, v in d.items()} for k, d in c.attrs.items()},
        dict(c.ext),
        len(c.steps),
        list(c.step_times),
        (c.closed, c.last_session, c.nrecords),
        {p: c.children(p) for p in ("", *c.groups)},
    )


def _multires_ops(path: str, first_id: int) -> list[tuple]:
    """The definition of a multiresolution dataset *path* and of its coarser levels."""
    from lamina.layouts.spec import Layout, Multires, level_specs

    shape, dtype = (64, 64), np.dtype("f4")
    layout = Multires(patch=16).describe(path, shape, dtype)
    spec = DatasetSpec(path, shape, dtype, 0, (), first_id, layout)
    layout = Layout.of(spec)
    assert layout is not None
    return [(OP_DATASET, s) for s in [spec, *level_specs(spec, layout, first_id + 1)]]


def test_a_restore_undoes_every_change_of_a_failed_apply():
    """Records applied after a checkpoint, the last failing part way (a dataset defined
    twice): restore brings back every group, dataset, level, attribute (set, changed,
    deleted, deleted and set again), extension record, step and count as they were, and
    the listing of children too, however often it is done."""
    c = Catalog()
    for op in [
        (OP_GROUP, "g"),
        (OP_DATASET, DatasetSpec("g/a", (4,), np.dtype("f8"), id=0)),
        (OP_ATTR, "", "title", "run 7"),
        (OP_ATTR, "g/a", "units", "K"),
        (OP_ATTR, "g/a", "scale", np.arange(3.0)),
        (OP_ATTR, "g", "gone", 1),
        (OP_EXT, "x", b"1"),
        *_multires_ops("m", 1),
    ]:
        c.apply_op(op)
    c.apply_record(Record(KIND_STEP, step=0, session=2, time=1.5))
    cp = c.checkpoint()
    want = _catalog_state(c)
    nspecs = len(c.specs)
    for _ in range(3):
        ops = [
            (OP_GROUP, "g/h/k"),
            (OP_DATASET, DatasetSpec("g/h/b", (2,), np.dtype("i8"), id=nspecs)),
            (OP_DATASET, DatasetSpec("c", (2,), np.dtype("i8"), id=nspecs + 1)),
            *_multires_ops("g/m2", nspecs + 2),
            (OP_ATTR, "g/a", "units", "m"),  # changed
            (OP_ATTR, "g/h/b", "new", 2),  # on a new dataset
            (OP_ATTR, "", "more", [1, 2]),  # a new one on an old node
            (OP_DELATTR, "g/a", "scale"),  # deleted
            (OP_DELATTR, "g", "gone"),
            (OP_ATTR, "g", "gone", 3),  # deleted, then set again
            (OP_DELATTR, "", "never"),  # deletes nothing
            (OP_EXT, "x", b"2"),
            (OP_EXT, "y", b"3"),
        ]
        c.apply_record(Record(KIND_STEP, step=1, session=3, time=2.5, ops=ops))
        c.apply_record(Record(KIND_CLOSE, session=3))
        with pytest.raises(FormatError, match="defined twice"):
            c.apply_record(
                Record(
                    KIND_META,
                    session=4,
                    ops=[
                        (OP_ATTR, "c", "half", 1),
                        (OP_DATASET, DatasetSpec("g/a", (4,), np.dtype("f8"), id=len(c.specs))),
                    ],
                )
            )
        assert c.children("g") == ["a", "h", "m2"]
        assert [s.path for s in c.layered] == ["m", "g/m2"]  # (their levels are not)
        c.restore(cp)
        assert _catalog_state(c) == want
        assert c.attrs["g/a"] == {"units": "K", "scale": c.attrs["g/a"]["scale"]}
        np.testing.assert_array_equal(c.attrs["g/a"]["scale"], np.arange(3.0))


def test_only_the_latest_checkpoint_restores():
    """A checkpoint is superseded by the next one: restoring the older one is refused (it
    could not bring back what it saw), the latest one still restores."""
    c = Catalog()
    old = c.checkpoint()
    c.apply_op((OP_GROUP, "g"))
    cp = c.checkpoint()
    c.apply_op((OP_GROUP, "h"))
    with pytest.raises(RuntimeError, match="checkpoint"):
        c.restore(old)
    c.restore(cp)
    assert c.groups == {"", "g"}


def test_a_checkpoint_and_a_restore_cost_what_changed_not_the_catalog():
    """Writers take a checkpoint at every commit and readers at every refresh: its cost (and
    a restore's) does not grow with the groups, datasets and attributes the catalog holds
    (a copy of them all made every commit quadratic in a run that adds datasets)."""
    import tracemalloc

    def cost(n: int) -> tuple[int, int]:
        c = Catalog()
        for i in range(n):
            c.apply_op((OP_DATASET, DatasetSpec(f"g{i % 50}/d{i}", (4,), np.dtype("f8"), id=i)))
            c.apply_op((OP_ATTR, f"g{i % 50}/d{i}", "units", "K"))
            c.apply_op((OP_ATTR, "", f"a{i}", i))
        c.checkpoint()  # (the first one's log of the ops above is dropped)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            cp = c.checkpoint()
            taken = tracemalloc.get_traced_memory()[0] - before
            c.apply_op((OP_ATTR, "", "a0", -1))
            c.apply_op((OP_DATASET, DatasetSpec("new", (4,), np.dtype("f8"), id=n)))
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            c.restore(cp)
            restored = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        assert c.attrs[""]["a0"] == 0 and "new" not in c.datasets
        return taken, restored

    small, large = cost(10), cost(5000)
    assert large[0] <= small[0] + 512, (small, large)  # a copy: about 1 MB
    assert large[1] <= small[1] + 512, (small, large)


def test_counting_and_listing_children_sorts_once(monkeypatch):
    """len(group) counts the children it holds without building and sorting their list, and a
    listing is sorted once until paths change (a loop of len(g) sorted every child each time)."""
    import lamina.catalog.tree as tree

    c = Catalog()
    for i in range(300):
        c.apply_op((OP_GROUP, f"g/k{i}"))
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return sorted(*args, **kwargs)

    monkeypatch.setattr(tree, "sorted", counted, raising=False)
    assert [c.nchildren("g") for _ in range(50)] == [300] * 50
    assert c.nchildren("") == 1 and c.nchildren("g/k0") == 0 and c.nchildren("none") == 0
    assert not calls
    names = [c.children("g") for _ in range(50)]
    assert len(calls) == 1 and names[0] == sorted(f"k{i}" for i in range(300))
    names[0].append("mine")  # a caller's list is its own
    assert c.children("g") == names[1]
    c.apply_op((OP_GROUP, "g/a"))
    assert c.children("g")[0] == "a" and c.nchildren("g") == 301


def test_len_of_a_group_sorts_nothing(engine, new_path, monkeypatch):
    """len(f) and len(g) in a loop cost one count each, not a sorted list of the members."""
    import lamina
    import lamina.catalog.tree as tree

    with lamina.open(new_path(), "w", engine=engine) as f:
        g = f.create_group("g")
        for i in range(200):
            g.create_group(f"k{i}")
        calls = []

        def counted(*args, **kwargs):
            calls.append(1)
            return sorted(*args, **kwargs)

        monkeypatch.setattr(tree, "sorted", counted, raising=False)
        assert [len(g) for _ in range(20)] == [200] * 20 and len(f) == 1
        assert not calls
        assert [list(g) for _ in range(5)][-1] == sorted(f"k{i}" for i in range(200))
        assert len(calls) == 1


def _commit_work(engine: str, path: str, ndatasets: int) -> tuple[int, int]:
    """Python lines run and bytes allocated at its peak by one step of a writer of
    *ndatasets* datasets (with an attribute each) that writes one block and changes one
    attribute, after a few such steps."""
    import sys
    import tracemalloc

    import lamina

    opts = {"durable": False} if engine == "native" else {}
    with lamina.open(path, "w", engine=engine, background_stats=False, **opts) as f:
        dss = [
            f.create_dataset(f"g{i % 20}/v{i}", shape=(4,), dtype="f8") for i in range(ndatasets)
        ]
        for i, ds in enumerate(dss):
            ds.attrs["i"] = i
        f.attrs["step"] = -1
        with f.step():
            pass
        x = np.zeros(4)
        lines = 0

        def count(frame, event, arg):
            nonlocal lines
            lines += event == "line"
            return count

        def step(k: int) -> None:
            with f.step():
                f.attrs["step"] = k
                dss[0][:] = x

        for k in range(3):
            step(k)
        traced = sys.gettrace()
        sys.settrace(count)
        try:
            step(3)
        finally:
            sys.settrace(traced)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            step(4)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    return lines, peak


def test_a_commit_costs_what_the_step_changed_not_the_whole_catalog(engine, new_path):
    """A step that writes one block and changes one attribute runs as many lines of Python and
    allocates as much with 2,000 datasets (and 2,000 attributes) defined as with 20: every
    commit copied every name and attribute (its checkpoint), and looked at every dataset for
    multiresolution ones, so a run that defines datasets as it goes was quadratic."""
    few_lines, few_bytes = _commit_work(engine, new_path(), 20)
    many_lines, many_bytes = _commit_work(engine, new_path(), 2000)
    assert many_lines <= few_lines + 20, (few_lines, many_lines)
    assert many_bytes <= few_bytes + 16384, (few_bytes, many_bytes)  # a copy: about 500 KB


def test_a_compressed_section_claiming_more_than_its_blocks_take_is_not_inflated():
    """A section of a few compressed bytes whose directory entry claims 100 MB raw (zlib
    inflates about 1000x) is refused from its head's counts, before the rest is inflated;
    a sound compressed section still decodes."""
    import tracemalloc
    import zlib

    from crc32c import crc32c

    from lamina.catalog.blocks import StepBlocks
    from lamina.catalog.record import Section

    spec = DatasetSpec("d", (4,), np.dtype("f8"), 0.0, (), 0)
    raw = 100 << 20
    stored = zlib.compress(b"\1" + bytes(raw - 1), 9)  # head: 1 block, 0 checksums; then zeros
    sec = Section(0, 1, 0, len(stored), crc32c(stored), raw)
    blocks = StepBlocks({0: sec}, [], lambda off, n: stored[off : off + n], "record 0")
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="head counts 1 blocks and 0 checksums"):
            blocks.table(spec, [spec])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    good = BlockTable.from_records(
        [BlockRecord(0, Box((0,), (4,)), length=32, crcs=(5,), stats=Stats(1.0, 2.0, 6.0, 4))],
        spec,
    ).encode()
    packed = zlib.compress(good)
    sec = Section(0, 1, 0, len(packed), crc32c(packed), len(good))
    t = StepBlocks({0: sec}, [], lambda off, n: packed[off : off + n], "record 0").table(
        spec, [spec]
    )
    assert len(t) == 1 and t.records(0)[0].crcs == (5,)


@pytest.mark.skipif(
    np.finfo(np.longdouble).nmant != 63, reason="long double is not x87's 80-bit format here"
)
@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_a_long_double_fill_encodes_without_its_padding(dtype):
    """A float128 fill value's 6 padding bytes held whatever memory had: two ranks creating
    one dataset disagreed on its definition (CollectiveMismatchError on every rank)."""
    part = np.dtype(np.longdouble).itemsize
    value = np.array(1.5, dtype=dtype)
    dirty = np.frombuffer(bytearray(value.tobytes()), np.uint8).reshape(-1, part).copy()
    dirty[:, 10:] = 0xA5  # padding as a stack might leave it
    dirty = dirty.reshape(-1).view(dtype)
    assert dirty.tobytes() != value.tobytes() or value.tobytes()[10:part] == b"\xa5" * (part - 10)
    assert dirty[0] == value
    assert value_bytes(dirty) == value_bytes(value)
    assert set(value_bytes(dirty)[10:part]) == {0}
    spec = DatasetSpec("/x", (4,), np.dtype(dtype), value[()], (), 0, None)
    e = Encoder()
    spec.encode(e)
    assert DatasetSpec.decode(Decoder(e.getvalue(), "spec")).fill == value


def test_a_reader_keeps_the_tables_of_the_steps_it_read_last_only(tmp_path):
    """A reader streaming through a run kept every step's decoded tables (about 4.7 KB a
    step of one small dataset, never let go): it keeps those of the KEEP_STEPS steps read
    last, and an older step read again is decoded again, with the same values."""
    import lamina
    from lamina.catalog.tree import KEEP_STEPS

    path = str(tmp_path / "long.lam")
    n = KEEP_STEPS + 40
    with lamina.open(path, "w", durable=False) as f:
        x = f.create_dataset("x", shape=(4,), dtype="f8")
        for s in range(n):
            with f.step():
                x[...] = s
    with lamina.open(path) as r:
        steps = r.engine.stack()[-1].catalog.steps
        for view in r.iter_steps(timeout=0):
            assert view["x"][0] == view.index
            assert len(view["x"].blocks()) == 1  # (blocks() of a step counts as reading it)
        decoded = [k for k, b in enumerate(steps) if b.nbytes]
        assert decoded == list(range(n - KEEP_STEPS, n))
        np.testing.assert_array_equal(r.at(3)["x"][...], 3.0)  # read again from the file
        assert steps[3].nbytes and not steps[n - KEEP_STEPS].nbytes


# -- the garbage collector paused while records are decoded ---------------------------------


def test_paused_gc_nests_and_restores():
    import gc

    from lamina.catalog.tree import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still runs
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("inside")
    assert gc.isenabled()  # on again after an error too
    gc.disable()  # a program that turned it off keeps it off
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_paused_gc_of_threads_ends_with_the_last():
    """Pauses of two threads that overlap: the collector is on again once both ended, not
    when the first did."""
    import gc
    import threading

    from lamina.catalog.tree import paused_gc

    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with paused_gc():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with paused_gc():
        pass
    assert not gc.isenabled()  # the other thread's pause goes on
    leave.set()
    t.join(10)
    assert gc.isenabled()


def test_records_are_read_with_the_collector_paused(tmp_path, monkeypatch):
    import gc

    import lamina
    from lamina.engines.native.engine import NativeEngine

    path = str(tmp_path / "g.lam")
    with lamina.open(path, "w") as f:
        d = f.create_dataset("a", (4,), np.float64)
        for s in range(3):
            with f.step():
                d.write(np.full(4, s, np.float64), offset=(0,))
    seen = []
    load = NativeEngine._load_records

    def spy(self, call):
        seen.append(gc.isenabled())
        return load(self, call)

    monkeypatch.setattr(NativeEngine, "_load_records", spy)
    with lamina.open(path, "r") as f:
        assert f["a"].read(step=2).tolist() == [2.0] * 4
    assert seen and not any(seen)
    assert gc.isenabled()
