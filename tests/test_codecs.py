"""The compression pipeline: argument normalization, validation, and encode/decode round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lamina import codecs
from lamina.errors import CodecError

LOSSLESS = ["zstd", "blosc", "lz4", "zlib"]


def dt(s):
    return np.dtype(s)


@pytest.mark.parametrize(
    "arg, expect",
    [
        (None, ()),
        (False, ()),
        ((), ()),
        ("zstd", ({"id": "zstd"},)),
        ("gzip", ({"id": "zlib"},)),
        (("zfp", 1e-3), ({"id": "zfpy", "tolerance": 1e-3, "mode": 4},)),
        (("zfp", 1), ({"id": "zfpy", "tolerance": 1.0, "mode": 4},)),
        ({"id": "zfp", "tolerance": 0.5}, ({"id": "zfpy", "tolerance": 0.5, "mode": 4},)),
        ({"id": "zfpy", "rate": 8}, ({"id": "zfpy", "rate": 8, "mode": 2},)),
        ({"id": "zfpy", "precision": 16}, ({"id": "zfpy", "precision": 16, "mode": 3},)),
        (("zstd", {"level": 9}), ({"id": "zstd", "level": 9},)),
        (
            {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2},
            ({"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2},),
        ),
        (["zstd", {"id": "zlib", "level": 1}], ({"id": "zstd"}, {"id": "zlib", "level": 1})),
    ],
)
def test_normalize_accepted_forms(arg, expect):
    assert codecs.normalize(arg, dt("f8"), 2) == expect


def test_normalize_does_not_mutate_input():
    cfg = {"id": "zfp", "tolerance": 1}
    codecs.normalize(cfg, dt("f4"), 3)
    assert cfg == {"id": "zfp", "tolerance": 1}


@pytest.mark.parametrize("dtype", ["f4", "f8", "i4", "i8"])
@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_zfp_accepts_dtypes_and_ranks(dtype, ndim):
    arg = ("zfp", 0.1) if dtype[0] == "f" else {"id": "zfp", "precision": 32}
    assert codecs.normalize(arg, dt(dtype), ndim)[0]["id"] == "zfpy"


@pytest.mark.parametrize(
    "arg, dtype, ndim, text",
    [
        ("brotli", "f8", 1, "unknown codec 'brotli'"),
        ({"id": "pickle"}, "f8", 1, "unknown codec 'pickle'"),
        ({"id": "zstd", "level": 1.5}, "f8", 1, "must be int"),
        ({"id": "lz4", "acceleration": "fast"}, "f8", 1, "must be int"),
        ({"id": "blosc", "cname": 3}, "f8", 1, "must be str"),
        ({"id": "zlib", "wbits": 15}, "f8", 1, "no parameter 'wbits'"),
        ({"id": "zfpy", "tolerance": True}, "f8", 1, "must be float"),
        (("zfp", 0.0), "f8", 1, "positive finite"),
        (("zfp", 1e-3), "f2", 1, "not float16"),
        (("zfp", 1e-3), "u4", 1, "not uint32"),
        (("zfp", 1e-3), "i4", 1, "float data only"),
        (("zfp", 1e-3), ">f8", 1, "native byte order"),
        (("zfp", 1e-3), "?", 1, "not bool"),
        (("zfp", 1e-3), "f8", 0, "0-D"),
        (("zfp", 1e-3), "f8", 5, "5-D"),
        ({"id": "zfpy"}, "f8", 2, "error bound"),
        ({"id": "zfpy", "rate": 0}, "f8", 2, "rate must be a positive"),
        ({"id": "zfpy", "rate": 1e6}, "f8", 2, "at most 64"),
        ({"id": "zfpy", "rate": float("nan")}, "f8", 2, "rate must be a positive"),
        ({"id": "zfpy", "precision": -3}, "f8", 2, "precision must be a positive"),
        ({"id": "zfpy", "precision": 1000}, "f8", 2, "at most 64"),
        # parameters numcodecs only checks when it compresses: found at definition
        ({"id": "blosc", "cname": "nope"}, "f8", 1, "does not work for float64"),
        ({"id": "blosc", "shuffle": 7}, "f8", 1, "does not work"),
        ({"id": "blosc", "clevel": 99}, "f8", 1, "does not work"),
        ({"id": "zlib", "level": 42}, "f8", 1, "does not work"),
        (["zstd", {"id": "blosc", "cname": "x" * 5000}], "f8", 1, "too long to record"),
        (["zstd", {"id": "blosc", "cname": "x" * 500}], "f8", 1, "does not work"),
        (("zfp", 1e-3, 2), "f8", 1, "codec name, tuple or dict"),
        ((3, 4), "f8", 1, "codec name, tuple or dict"),
        (b"zstd", "f8", 1, "codec name, tuple or dict"),
        (["zstd", 7], "f8", 1, "codec name, tuple or dict"),
        (["zstd"] * 400, "f8", 1, "too long to record"),
    ],
)
def test_normalize_rejects(arg, dtype, ndim, text):
    with pytest.raises(CodecError, match=text):
        codecs.normalize(arg, dt(dtype), ndim)


# --------------------------------------------------------------------------
# the pipeline


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("dtype", ["?", "i1", "u2", "i4", "u8", "f4", "f8", "c8", "c16"])
def test_lossless_round_trip(name, dtype, rng):
    shape = (13, 7)
    if dt(dtype).kind == "b":
        a = rng.random(shape) < 0.3
    elif dt(dtype).kind == "c":
        a = (rng.standard_normal(shape) + 1j).astype(dtype)
    else:
        a = (rng.standard_normal(shape) * 50).astype(dtype)
    p = codecs.pipeline(codecs.normalize(name, dt(dtype), 2))
    raw = p.encode(a)
    assert isinstance(raw, bytes)
    out = p.decode(raw, dt(dtype), shape, "test block")
    assert out.dtype == dt(dtype) and out.shape == shape
    np.testing.assert_array_equal(out, a)


def test_chained_pipeline(rng):
    a = np.repeat(rng.standard_normal((20, 1)), 30, axis=1)
    cfg = codecs.normalize(["zstd", "zlib"], dt("f8"), 2)
    p = codecs.pipeline(cfg)
    raw = p.encode(a)
    assert len(raw) < a.nbytes
    np.testing.assert_array_equal(p.decode(raw, dt("f8"), a.shape, "x"), a)


def test_pipeline_is_cached():
    cfg = codecs.normalize("lz4", dt("f8"), 1)
    assert codecs.pipeline(cfg) is codecs.pipeline(tuple(dict(c) for c in cfg))


@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9),
        elements=st.floats(-1e6, 1e6, allow_nan=False, width=64),
    ),
    st.sampled_from([1e-6, 1e-3, 0.1, 10.0]),
)
def test_zfp_error_bound_property(a, tol):
    p = codecs.pipeline(codecs.normalize(("zfp", tol), a.dtype, a.ndim))
    out = p.decode(p.encode(a), a.dtype, a.shape, "zfp block")
    assert out.shape == a.shape
    assert np.max(np.abs(out - a)) <= tol


@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_zfp_compresses_smooth_data(dtype):
    x = np.linspace(0, 6, 64)
    a = (np.sin(x)[:, None] * np.cos(x)[None, :]).astype(dtype)
    for tol in (1e-2, 1e-4):
        p = codecs.pipeline(codecs.normalize(("zfp", tol), a.dtype, 2))
        raw = p.encode(a)
        assert len(raw) < a.nbytes / 3
        assert np.max(np.abs(p.decode(raw, a.dtype, a.shape, "z").astype("f8") - a)) <= tol


def test_zfp_rate_and_precision_modes_take_effect():
    a = np.linspace(0, 1, 4096).reshape(64, 64)
    rate = codecs.pipeline(codecs.normalize({"id": "zfpy", "rate": 4}, a.dtype, 2))
    raw = rate.encode(a)
    assert len(raw) <= a.size * 4 // 8 + 64  # 4 bits per value
    assert np.max(np.abs(rate.decode(raw, a.dtype, a.shape, "r") - a)) < 0.1
    prec = codecs.pipeline(codecs.normalize({"id": "zfpy", "precision": 8}, a.dtype, 2))
    raw8 = prec.encode(a)
    prec20 = codecs.pipeline(codecs.normalize({"id": "zfpy", "precision": 20}, a.dtype, 2))
    assert len(raw8) < len(prec20.encode(a)) < a.nbytes


@pytest.mark.parametrize("dtype", ["i4", "i8"])
def test_zfp_integers(rng, dtype):
    """zfp ignores a tolerance on integer data (errors of several units even at 1e-9), so
    lamina refuses the combination instead of promising a bound that does not hold."""
    with pytest.raises(CodecError, match="float data only"):
        codecs.normalize(("zfp", 1.0), dt(dtype), 2)
    with pytest.raises(CodecError, match="float data only"):
        codecs.normalize({"id": "zfpy", "tolerance": 1e-9}, dt(dtype), 2)
    a = rng.integers(-1000, 1000, size=(16, 16), dtype=dtype)
    p = codecs.pipeline(codecs.normalize({"id": "zfpy", "precision": 16}, a.dtype, 2))
    raw = p.encode(a)
    out = p.decode(raw, a.dtype, a.shape, "ints")
    assert out.dtype == np.dtype(dtype) and out.shape == a.shape and len(raw) < a.nbytes


# --------------------------------------------------------------------------
# configurations and bytes from disk are not trusted


@pytest.mark.parametrize("cfg", [{"id": "pickle"}, {"id": "json2"}, {"id": None}, {}])
def test_pipeline_refuses_codecs_outside_the_allowed_list(cfg):
    with pytest.raises(CodecError, match="refusing codec"):
        codecs.Pipeline((cfg,))


@pytest.mark.parametrize(
    "cfg",
    [{"id": "zstd", "bogus": 1}, {"id": "zfpy", "bogus": 2}, {"id": "blosc", "cname": "nope"}],
)
def test_pipeline_bad_parameters_from_disk(cfg):
    with pytest.raises(CodecError) as ei:
        p = codecs.Pipeline((cfg,))
        p.encode(np.zeros(100))  # some codecs only complain when used
    assert str(cfg["id"]) in str(ei.value)


@pytest.mark.parametrize("name", [*LOSSLESS, "zfp"])
def test_decode_garbage_is_codec_error(name):
    arg = ("zfp", 1e-3) if name == "zfp" else name
    p = codecs.pipeline(codecs.normalize(arg, dt("f8"), 1))
    with pytest.raises(CodecError, match="block 7"):
        p.decode(b"\x00garbage\xff" * 5, dt("f8"), (10,), "block 7")


@pytest.mark.parametrize("name", LOSSLESS)
def test_decode_wrong_size_is_codec_error(name):
    p = codecs.pipeline(codecs.normalize(name, dt("f8"), 1))
    raw = p.encode(np.arange(10.0))
    with pytest.raises(CodecError, match="expected"):
        p.decode(raw, dt("f8"), (12,), "block x")


def test_zfp_decode_wrong_shape_is_codec_error():
    p = codecs.pipeline(codecs.normalize(("zfp", 1e-3), dt("f8"), 1))
    raw = p.encode(np.arange(10.0))
    with pytest.raises(CodecError, match="decompressed 10 values, expected 12"):
        p.decode(raw, dt("f8"), (12,), "block z")


def test_encode_failure_is_codec_error():
    p = codecs.pipeline(codecs.normalize(("zfp", 1e-3), dt("f8"), 1))
    with pytest.raises(CodecError, match="compression with"):
        p.encode(np.zeros((2, 2, 2, 2, 2)))  # zfp has no 5-D mode
