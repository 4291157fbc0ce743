"""Block statistics and checksums (``stats.compute``) against numpy and plain crc32c."""

from __future__ import annotations

import math

import crc32c
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lamina import stats
from lamina.stats import CHUNK, SEGMENT, BlockJob, compute, crc, segment_crcs, summarize

DTYPES = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]


def reference(a: np.ndarray):
    """(min, max, sum, count) by the definition: NaN-aware; complex min/max of |z|."""
    a = a.reshape(-1)
    if a.dtype.kind == "c":
        ok = ~np.isnan(np.abs(a))
        v = a[ok]
        if not v.size:
            return None, None, 0j, 0
        return (
            float(np.abs(v).min()),
            float(np.abs(v).max()),
            complex(v.sum(dtype=np.complex128)),
            int(v.size),
        )
    if a.dtype.kind == "f":
        v = a[~np.isnan(a)]
        if not v.size:
            return None, None, 0.0, 0
        return float(v.min()), float(v.max()), float(v.sum(dtype=np.float64)), int(v.size)
    if not a.size:
        return 0, 0, 0.0, 0
    return int(a.min()), int(a.max()), float(a.sum(dtype=np.float64)), int(a.size)


def assert_matches(s, a):
    mn, mx, total, n = reference(a)
    assert s.count == n
    if a.dtype.kind in "fc" and n == 0:
        assert math.isnan(s.min) and math.isnan(s.max)
    elif a.dtype.kind in "fc":
        assert s.min == mn and s.max == mx  # min/max are exact, not approximations
        assert isinstance(s.min, float) and isinstance(s.max, float)
    else:
        assert s.min == mn and s.max == mx
        assert isinstance(s.min, int) and isinstance(s.max, int)
    if a.dtype.kind == "c":
        assert isinstance(s.sum, complex)
    else:
        assert isinstance(s.sum, float)
    # chunked float64 sums differ from numpy's pairwise sum only by rounding; float32 sums
    # of large chunks by float32's, at most 16 roundings of a partial sum (stats.F32_ROW)
    scale = (
        float(np.sum(np.abs(a[~np.isnan(a)]), dtype=np.float64))
        if a.size and a.dtype.kind in "fc"
        else abs(total)
    )
    rel = 16 * 2.0**-24 if a.dtype == np.float32 else 1e-9
    assert abs(complex(s.sum) - complex(total)) <= rel * max(1.0, scale)


def make(dtype, n, rng, nan_frac=0.0):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        a = rng.random(n) < 0.5
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
    elif dt.kind == "f":
        a = (rng.standard_normal(n) * 1e3).astype(dt)
    else:
        a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    if nan_frac and dt.kind in "fc":
        a[rng.random(n) < nan_frac] = np.nan
    return a


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_compute_small(dtype, n, rng):
    a = make(dtype, n, rng, nan_frac=0.1)
    s, crcs = compute(a)
    assert_matches(s, a)
    assert crcs == (crc32c.crc32c(a.tobytes()),)


@pytest.mark.parametrize("dtype", ["?", "i2", "u8", "f4", "f8", "c16"])
def test_compute_across_chunks(dtype, rng):
    """Sizes around and between chunk boundaries: not multiples of the chunk."""
    item = np.dtype(dtype).itemsize
    per_chunk = CHUNK // item
    for n in (per_chunk - 1, per_chunk, per_chunk + 1, 2 * per_chunk + 37):
        a = make(dtype, n, rng, nan_frac=0.01)
        s, crcs = compute(a)
        assert_matches(s, a)
        assert crcs == (crc32c.crc32c(a.tobytes()),)


def test_nan_only_in_later_chunks(rng):
    a = rng.standard_normal(3 * CHUNK // 8)
    a[-5:] = np.nan
    a[CHUNK // 8 + 3] = np.nan
    s, _ = compute(a)
    assert_matches(s, a)
    # a chunk made only of NaN contributes nothing
    b = np.concatenate([np.full(CHUNK // 8, np.nan), np.array([5.0, -2.0])])
    s, _ = compute(b)
    assert (s.min, s.max, s.sum, s.count) == (-2.0, 5.0, 3.0, 2)


@pytest.mark.parametrize("dtype", ["i8", "u8"])
def test_64_bit_integer_sums_are_exact_rounded_once_on_every_path(dtype):
    """A small block (summed whole, with others) and a large one (in chunks) of the same
    64-bit integers store the same sum: the exact one, rounded once (the small block's was
    accumulated in float64: 2^53 + 2 for [2^53, 1, 1, 1] through one path, 2^53 + 4 the other)."""
    a = np.array([2**53, 1, 1, 1] * 3, dtype=dtype)
    exact = float(int(a.astype(object).sum()))
    assert compute(a)[0].sum == exact
    assert summarize([a, a[:4]], checksum=False).sums.tolist() == [exact, float(2**53 + 3)]
    big = np.concatenate([a, np.zeros(CHUNK // 8 + 5, dtype=dtype)])  # chunks of any size
    assert compute(big)[0].sum == exact


def test_a_complex_value_with_a_nan_part_is_left_out_whatever_its_magnitude():
    """|inf + NaN j| is inf, but the value is NaN (numpy's isnan): it was counted and its
    magnitude taken as the maximum."""
    a = np.array([complex(np.inf, np.nan), 1, 2j, complex(np.nan, -np.inf), 3 + 4j])
    s, _ = compute(a)
    assert (s.min, s.max, s.sum, s.count) == (1.0, 5.0, 4 + 6j, 3)
    many = summarize([a, a[:2]], checksum=False)
    assert many.counts.tolist() == [3, 1] and many.maxs.tolist() == [5.0, 1.0]


@pytest.mark.parametrize(
    "dtype, bits",
    [("f8", 0x7FF0000000000123), ("f8", 0xFFF0000000000001), ("f4", 0x7F800001)],
)
@pytest.mark.parametrize("n", [3, CHUNK // 4 + 3])
def test_a_signalling_nan_is_left_out_as_a_quiet_one(dtype, bits, n):
    """fmin and fmax return NaN for a signalling NaN (imported data can hold one): the
    extremes of [2, sNaN, 1] came out 1 and 1, and a query for values > 1.5 missed the 2."""
    a = np.ones(n, dtype=dtype)
    a[0] = 2.0
    a[1:2].view(np.uint64 if dtype == "f8" else np.uint32)[0] = bits
    assert np.isnan(a[1])
    s, _ = compute(a)
    assert (s.min, s.max, s.count) == (1.0, 2.0, n - 1) and s.sum == n
    many = summarize([a, a[:2]], checksum=False)
    assert many.mins.tolist() == [1.0, 2.0] and many.maxs.tolist() == [2.0, 2.0]
    assert many.counts.tolist() == [n - 1, 1]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf + -inf
def test_special_values():
    s, _ = compute(np.array([np.inf, -np.inf, 1.0]))
    assert s.min == -np.inf and s.max == np.inf and s.count == 3 and math.isnan(s.sum)
    s, _ = compute(np.array([np.nan, np.nan], dtype="f4"))
    assert s.count == 0 and math.isnan(s.min) and s.sum == 0.0
    s, _ = compute(np.array([3 + 4j, np.nan + 0j, 0j], dtype="c8"))
    assert (s.min, s.max, s.count) == (0.0, 5.0, 2) and s.sum == 3 + 4j
    s, _ = compute(np.array([True, False, True]))
    assert (s.min, s.max, s.sum, s.count) == (0, 1, 2.0, 3)
    info = np.iinfo(np.uint64)
    s, _ = compute(np.array([info.max, 0], dtype="u8"))
    assert s.max == 2**64 - 1 and s.min == 0  # exact, not through float
    s, _ = compute(np.array([-(2**63), 2**63 - 1], dtype="i8"))
    assert s.min == -(2**63) and s.max == 2**63 - 1


@pytest.mark.parametrize("dtype", ["?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8"])
def test_integer_sums_of_large_chunks_are_exact(dtype, rng):
    """Integer chunks from LANES_MIN values are summed exactly (in lanes of a wider type, or in
    64 bits) and rounded once: the float nearest the exact sum, over several passes and a tail
    that fills no lane.  64-bit values are large enough that a float64 accumulation rounds."""
    dt = np.dtype(dtype)
    n = 2 * stats.PASS // dt.itemsize + 4099
    if dt.kind == "b":
        a = rng.random(n) < 0.5
    elif dt.itemsize == 8:  # a pass's sum near 2**62: float64 partial sums round
        a = rng.integers(2**44, 2**45, n, dtype=dt)
        a[::7] *= -1 if dt.kind == "i" else 1
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    exact = sum(int(v) for v in np.add.reduceat(a.astype(object), np.arange(0, n, 4096)))
    s, _ = compute(a)
    assert s.sum == float(exact) and s.count == n
    assert (s.min, s.max) == (int(a.min()), int(a.max()))


@pytest.mark.parametrize("dtype", ["i4", "u4"])
@pytest.mark.parametrize("top", [1, 1000, 2**19 - 1, 2**19, 2**22, 2**23 - 1, 2**30])
def test_32_bit_sums_in_rows_of_their_own_type_are_exact(dtype, top, rng):
    """32-bit integers are summed in rows whose partial sums cannot leave the type (shorter rows
    for larger values, none past 2**23 / 2**24 where the rows would get too short): exact, with
    the extremes at the chunk's edges and a tail that fills no row."""
    dt = np.dtype(dtype)
    lo = -top if dt.kind == "i" else 0
    n = 2 * stats.PASS // dt.itemsize + 4099
    a = rng.integers(lo, top, n, dtype=dt, endpoint=True)
    a[0], a[-1] = lo, top
    a[1 : 1 << 12] = top  # a whole row at the top: its sum is the largest a row can have
    rows = stats._rows32(dt, lo, top)
    limit = 1 << (31 if dt.kind == "i" else 32)
    assert rows == 0 or (max(-lo, top) * rows < limit and rows >= stats.ROWS32_MIN)
    assert rows or max(-lo, top) * stats.ROWS32_MIN >= limit
    s, _ = compute(a)
    assert s.sum == float(int(a.astype(object).sum())) and s.count == n


@pytest.mark.parametrize("top", [1, 2, 3])
def test_sums_of_small_bytes_are_exact(top, rng):
    """Bytes of 0 and 1 (a mask) are counted; any larger byte takes the lanes: both exact."""
    a = rng.integers(0, top + 1, stats.PASS + 999, dtype=np.uint8)
    s, _ = compute(a)
    assert s.sum == float(int(a.sum(dtype=np.uint64))) and s.max == top


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_large_sums_past_the_fast_types_range():
    """Sums that would overflow the fast path's type are taken in float64, as before: 64-bit
    integers whose exact sum leaves 64 bits, float32 lanes past float32's range (with
    infinities of both signs inside lanes, where float64 sums to zero)."""
    n = stats.LANES_MIN + 5
    s, _ = compute(np.full(n, 2**62, dtype=np.int64))
    assert s.sum == pytest.approx(2.0**62 * n)
    s, _ = compute(np.full(n, 2**63, dtype=np.uint64))
    assert s.sum == pytest.approx(2.0**63 * n)
    s, _ = compute(np.full(2 * stats.LANES_MIN, 3e38, dtype=np.float32))
    assert s.sum == pytest.approx(float(np.float32(3e38)) * 2 * stats.LANES_MIN)
    assert s.count == 2 * stats.LANES_MIN
    half = np.full(stats.LANES_MIN, 3e38, dtype=np.float32)
    s, _ = compute(np.concatenate([half, -half]))
    assert s.sum == 0.0 and s.count == 2 * stats.LANES_MIN and s.max == float(half[0])


def test_float32_sums_keep_float32_rounding(rng):
    """A float32 sum of large chunks keeps float32's rounding, not that of one long float32
    partial sum.  (A chunk with NaN inside is summed in float64 again: test_compute_across_chunks.)"""
    # values of one magnitude: a float32 sum rounding each addition in one long partial
    # sum drifts far past that bound (an accumulation in fewer, wider lanes too)
    a = rng.uniform(0.5, 1.5, 3 * stats.PASS // 4 + 17).astype(np.float32)
    exact = math.fsum(a.astype(np.float64).tolist())
    s, _ = compute(a)
    assert s.count == a.size
    # the bound is 16 roundings of 2**-24 each; rows of 256 random values do far better (1e-9
    # here), where one long float32 partial sum drifts by 5e-7 to 3e-6
    assert abs(s.sum - exact) <= 2 * 2.0**-24 * exact
    # one value everywhere, where every lane rounds alike: numpy's own float32 sum errs by
    # 1.5e-7 to 1.9e-7 here, rows of 256 values by 1.5e-7 at most (a row of 0.1 added in one
    # float32 partial sum, without vector lanes: 2.4e-6)
    for v in (0.1, 1 / 3, 0.7):
        a = np.full(3 * stats.PASS // 4 + 17, v, dtype=np.float32)
        exact = math.fsum(a.astype(np.float64).tolist())
        assert abs(compute(a)[0].sum - exact) <= 4 * 2.0**-24 * exact


@pytest.mark.parametrize("dt", [np.longdouble, np.clongdouble])
@pytest.mark.parametrize("n", [3, CHUNK + 5])
def test_long_double_bounds_hold_every_value(dt, n):
    """Long double (80-bit on x86, 128-bit elsewhere) blocks of any size: no cast error, and
    the float64 min and max are rounded outward, so that a query never leaves out a block
    for a rounding (1 + 4 eps of long double rounds to 1.0 to nearest)."""
    tiny = np.finfo(np.longdouble).eps * 4
    a = np.full(n, np.longdouble(1) + tiny, dtype=dt)
    a[0] = np.longdouble(0.5) - tiny  # the extremes: both round inward to nearest
    st_, _ = compute(a)
    flat = stats.summarize_flat(a, np.array([n]))
    mag = np.abs(a)
    for lo, hi in ((st_.min, st_.max), (flat.mins[0], flat.maxs[0])):
        assert lo <= mag.min() and hi >= mag.max(), (lo, hi)
        assert hi - lo < 2 * (mag.max() - mag.min()) + 1e-9  # outward by one float64 step only
    assert st_.count == n and flat.counts[0] == n
    assert abs(st_.sum - complex(np.add.reduce(a))) < 1e-6 * n


def test_multidimensional_and_non_contiguous(rng):
    a = rng.standard_normal((30, 40, 5))
    view = a[::2, 5:30, ::-1]
    s, crcs = compute(view)
    assert_matches(s, np.ascontiguousarray(view))
    assert crcs == (crc32c.crc32c(np.ascontiguousarray(view).tobytes()),)
    s, _ = compute(np.float32(2.5) * np.ones(()))  # 0-D
    assert (s.min, s.max, s.count) == (2.5, 2.5, 1)


@given(
    hnp.arrays(
        st.sampled_from([np.dtype(d) for d in DTYPES]),
        st.integers(0, 300),
        elements=None,
    )
)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # sums of inf/-inf or of huge values
def test_compute_property(a):
    # hypothesis may produce inf and huge values: compare exactly what is exact
    s, crcs = compute(a)
    mn, mx, total, n = reference(a)
    assert s.count == n
    if n and a.dtype.kind in "biu":
        assert (s.min, s.max) == (mn, mx)
    elif n:
        assert s.min == mn and s.max == mx
    assert crcs == (crc32c.crc32c(a.tobytes()),)


# --------------------------------------------------------------------------
# segment checksums


def slices_crcs(buf: bytes, seg: int) -> tuple[int, ...]:
    if seg <= 0 or len(buf) <= seg:
        return (crc32c.crc32c(buf),)
    return tuple(crc32c.crc32c(buf[i : i + seg]) for i in range(0, len(buf), seg))


@pytest.mark.parametrize("dtype", ["u1", "f4", "f8", "c16"])
@pytest.mark.parametrize("seg", [CHUNK, 2 * CHUNK, 3 * CHUNK])
def test_segment_checksums_match_crc32c_over_slices(dtype, seg, rng):
    item = np.dtype(dtype).itemsize
    for nbytes in (seg - item, seg, seg + item, 3 * seg + 5 * item, 7 * CHUNK + item):
        a = make(dtype, nbytes // item, rng)
        raw = a.tobytes()
        s, crcs = compute(a, seg)
        assert crcs == slices_crcs(raw, seg)
        assert crcs == segment_crcs(raw, seg)
        assert_matches(s, a)


@given(
    st.integers(0, 5000),
    st.sampled_from([8, 16, 24, 64, 100, 4096, 1 << 18]),
    st.sampled_from(["u1", "i2", "f4", "f8", "c16"]),
)
def test_small_segments_property(n, seg, dtype):
    """Any segment size (even one that splits items) gives one CRC per seg bytes."""
    a = np.arange(n).astype(dtype)
    _, crcs = compute(a, seg)
    assert crcs == slices_crcs(a.tobytes(), seg)


def test_checksum_off_and_zero_segment(rng):
    a = rng.standard_normal(100_000)
    s, crcs = compute(a, SEGMENT, checksum=False)
    assert crcs == ()
    assert_matches(s, a)
    _, crcs = compute(a, 0)
    assert crcs == (crc32c.crc32c(a.tobytes()),)


def test_crc_helpers():
    assert crc(b"") == 0
    assert crc(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc(b"56789", crc(b"1234")) == crc(b"123456789")
    assert segment_crcs(b"") == (0,)
    assert segment_crcs(b"abc", 0) == (crc(b"abc"),)
    assert segment_crcs(b"abcdef", 2) == (crc(b"ab"), crc(b"cd"), crc(b"ef"))
    assert segment_crcs(memoryview(np.arange(4, dtype="i4")), 8) == slices_crcs(
        np.arange(4, dtype="i4").tobytes(), 8
    )


def test_large_buffers_take_awscrt_and_give_crc32c_values(rng):
    """Buffers from FAST_MIN bytes go to awscrt's CRC-32C (a dependency: its absence here
    is a failure, not a skip); at and around the switch, continued from any value and
    from any buffer type, the CRC is crc32c's."""
    from awscrt.checksums import crc32c as aws

    buf = rng.integers(0, 256, 3 * stats.FAST_MIN + 7, dtype=np.uint8)
    assert crc(buf[: stats.FAST_MIN]) == crc32c.crc32c(buf[: stats.FAST_MIN])
    assert stats._fast_crc is aws
    for n in (stats.FAST_MIN - 1, stats.FAST_MIN, stats.FAST_MIN + 1, len(buf)):
        for start in (0, 0x12345678, 0xFFFFFFFF):
            want = crc32c.crc32c(buf[:n], start)
            assert crc(buf[:n], start) == want
            assert crc(buf[:n].tobytes(), start) == want
            assert crc(memoryview(buf[:n]), start) == want
    head = crc(buf[:100])  # a small buffer continued by a large one, and the other way round
    assert crc(buf[100:], head) == crc32c.crc32c(buf)
    assert crc(buf[-50:], crc(buf[:-50])) == crc32c.crc32c(buf)


@given(
    st.integers(1, 300),
    st.integers(0, 70),
    st.integers(0, 2**32 - 1),
)
def test_crc_concat_is_the_crc_of_the_pieces_back_to_back(length, n, seed):
    """The CRC of a run follows from its pieces' CRCs (any length, any count)."""
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 256, n * length, dtype=np.uint8).tobytes()
    pieces = np.array(
        [crc32c.crc32c(buf[i * length : (i + 1) * length]) for i in range(n)], dtype=np.uint32
    )
    assert stats.crc_concat(pieces, length) == crc32c.crc32c(buf)


@given(
    st.integers(0, 40),
    st.lists(st.integers(0, 20_000), min_size=1, max_size=12),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
@example(3, [4, 2, 6], False, 0)  # unequal pieces that add up to n times the first
@example(5, [512] * 9, True, 1)
def test_piece_crcs_are_each_piece_s_crc(start, lengths, same, seed):
    """Pieces of one size (read as the rows of one array) and of any sizes, empty ones,
    large ones (awscrt's CRC), from any offset: each piece's CRC-32C."""
    if same:
        lengths = [lengths[0]] * len(lengths)
    edges = np.cumsum([start, *lengths])
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 256, int(edges[-1]) + 7, dtype=np.uint8)
    want = [crc32c.crc32c(buf[a:b].tobytes()) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    got = stats.piece_crcs(buf.data, edges)
    assert got.dtype == np.uint32
    assert got.tolist() == want


@given(st.lists(st.integers(0, 5000), max_size=12), st.integers(0, 2**32 - 1))
def test_crc_combine_is_the_crc_of_pieces_of_any_lengths(lengths, seed):
    """Pieces of different lengths, empty ones among them: their CRCs and lengths give the
    CRC of the pieces back to back."""
    rng = np.random.default_rng(seed)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    crcs = [crc32c.crc32c(p) for p in pieces]
    assert stats.crc_combine(crcs, lengths) == crc32c.crc32c(b"".join(pieces))


def test_crc_concat_large_pieces(rng):
    for length in (1 << 18, (1 << 20) + 8, 3 * 4096):
        buf = rng.integers(0, 256, 5 * length, dtype=np.uint8)
        pieces = [crc32c.crc32c(buf[i * length : (i + 1) * length]) for i in range(5)]
        assert stats.crc_concat(np.array(pieces), length) == crc32c.crc32c(buf)


def test_crc_concat_keeps_few_operators(monkeypatch, rng):
    """Runs of many different block lengths do not grow the operator caches without bound."""
    monkeypatch.setattr(stats, "_ZEROS", {})
    monkeypatch.setattr(stats, "_ZEROS_MAX", 8)
    monkeypatch.setattr(stats, "_RADIX_TABLES", {})
    monkeypatch.setattr(stats, "_RADIX_MAX", 3)
    for length in range(1, 80):
        buf = rng.integers(0, 256, 5 * length, dtype=np.uint8)
        pieces = [crc32c.crc32c(buf[i * length : (i + 1) * length]) for i in range(5)]
        assert stats.crc_concat(np.array(pieces), length) == crc32c.crc32c(buf)
        assert len(stats._ZEROS) <= 8 and len(stats._RADIX_TABLES) <= 3


@pytest.mark.parametrize("n", [15, 16, 17, 255, 256, 257, 4097])
def test_crc_concat_over_several_steps(n, rng):
    """Counts around powers of the radix (groups filled exactly, or padded in front), up to
    four steps of combination."""
    length = 3
    buf = rng.integers(0, 256, n * length, dtype=np.uint8)
    pieces = stats.piece_crcs(buf.data, np.arange(n + 1) * length)
    assert stats.crc_concat(pieces, length) == crc32c.crc32c(buf)
    bad = pieces.copy()
    bad[n // 2] ^= 1 << 7  # one stored checksum wrong: the run's CRC differs
    assert stats.crc_concat(bad, length) != crc32c.crc32c(buf)
    every_other = np.repeat(pieces, 2)[::2]  # strided, a list and big-endian: the same CRC
    for crcs in (every_other, pieces.tolist(), pieces.astype(">u4")):
        assert stats.crc_concat(crcs, length) == crc32c.crc32c(buf)


@pytest.mark.parametrize(
    "lengths",
    [[64] * 37, [8, 8], [512] * 1000, [3, 9, 3, 100, 1, 64], [1 << 15] * 3, [5, 1 << 16, 40000]],
)
def test_first_bad_piece_finds_each_corrupt_piece(lengths, rng):
    """A flipped bit in any piece is found and named by its position; a clean run gives -1."""
    lengths = np.asarray(lengths, dtype=np.int64)
    buf = rng.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
    ends = np.cumsum(lengths)
    begins = ends - lengths
    good = np.array(
        [crc32c.crc32c(buf[a:b]) for a, b in zip(begins, ends, strict=True)], dtype=np.uint32
    )
    assert stats.first_bad_piece(buf, lengths, good) == -1
    for k in sorted({0, len(lengths) // 2, len(lengths) - 1}):
        bad = buf.copy()
        bad[begins[k] + rng.integers(0, lengths[k])] ^= 1 << int(rng.integers(0, 8))
        assert stats.first_bad_piece(bad, lengths, good) == k
        wrong = good.copy()  # the stored checksum changed instead of the bytes
        wrong[k] ^= 0x80
        assert stats.first_bad_piece(buf, lengths, wrong) == k
    two = buf.copy()  # two corrupt pieces: the first is named
    two[begins[-1]] ^= 1
    two[begins[0]] ^= 1
    assert stats.first_bad_piece(two, lengths, good) == 0


@pytest.mark.parametrize("background", [True, False])
def test_block_job(background, rng):
    a = rng.standard_normal(50_000)
    job = BlockJob(a, CHUNK, background=background)
    s, crcs = job.result()
    assert_matches(s, a)
    assert crcs == slices_crcs(a.tobytes(), CHUNK)
    assert job.result() == (s, crcs)  # result is kept


def test_pool_is_shared():
    assert stats._pool() is stats._pool()


# --------------------------------------------------------------------------
# many small blocks at once


@pytest.mark.parametrize("dtype", DTYPES)
def test_summarize_agrees_with_compute(dtype, rng):
    """One reduceat per statistic over many blocks: the same min, max and count; sums to rounding."""
    blocks = [make(dtype, int(n), rng, nan_frac=0.05) for n in rng.integers(1, 600, size=40)]
    if np.dtype(dtype).kind in "fc":
        blocks.append(np.full(7, np.nan, dtype=dtype))  # nothing but NaN
        blocks.append(
            np.array([np.inf, -np.inf, 1.0], dtype=dtype)
        )  # a NaN sum that is the statistic
    got = summarize(blocks)
    assert len(got.crcs) == len(blocks)
    for i, b in enumerate(blocks):
        st, crcs = got.stats(i), (int(got.crcs[i]),)
        want, wcrcs = compute(b, 0)
        assert crcs == wcrcs == (crc32c.crc32c(b.tobytes()),)
        assert st.count == want.count
        if want.count == 0:
            assert math.isnan(st.min) and math.isnan(st.max)
            continue
        assert st.min == want.min and st.max == want.max
        assert type(st.min) is type(want.min)
        if np.isnan(want.sum):
            assert np.isnan(st.sum)
            continue
        assert complex(st.sum) == pytest.approx(complex(want.sum), rel=1e-12, abs=1e-9)
        assert_matches(st, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_summarize_a_block_alone_as_among_others(dtype, rng):
    """A block summarized alone (a dataset written once a step takes fewer calls) gets the
    same statistics and checksum, bit for bit, as the same block among others: NaN inside,
    nothing but NaN, infinities, integers at their limits."""
    blocks = [make(dtype, int(n), rng, nan_frac=0.1) for n in (1, 2, 7, 64, 601)]
    if np.dtype(dtype).kind in "fc":
        blocks += [np.full(5, np.nan, dtype=dtype), np.array([np.inf, -np.inf, 1], dtype=dtype)]
        if np.dtype(dtype).kind == "c":
            blocks.append(np.array([1 + 1j, complex(1, np.nan)], dtype=dtype))
    together = summarize(blocks)
    for i, b in enumerate(blocks):
        alone = summarize([b])
        for col in ("mins", "maxs", "sums", "counts", "crcs"):
            a, t = getattr(alone, col), getattr(together, col)[i : i + 1]
            assert a.dtype == t.dtype and a.tobytes() == t.tobytes(), (col, i)
    assert summarize([blocks[0]], checksum=False).crcs is None
    with pytest.raises(ValueError, match="non-empty"):
        stats.summarize_flat(blocks[0].reshape(-1)[:0], np.zeros(1, np.int64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,size", [(1, 1), (1, 64), (2, 64), (7, 3), (64, 64), (3, 5000)])
def test_blocks_of_one_size_summarize_as_blocks_of_any_size(dtype, n, size, rng):
    """summarize_rows (blocks of one size, the staged blocks of one shape) gives what
    summarize_flat gives for the same blocks, bit for bit: NaN inside, checksums or none."""
    values = make(dtype, n * size, rng, nan_frac=0.1)
    for checksum in (True, False):
        rows = stats.summarize_rows(values, n, checksum)
        flat = stats.summarize_flat(values, np.full(n, size, np.int64), checksum)
        for col in ("mins", "maxs", "sums", "counts", "crcs"):
            a, b = getattr(rows, col), getattr(flat, col)
            if not checksum and col == "crcs":
                assert a is None and b is None
                continue
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (col, checksum)
    for bad, k in ((values[:5], 2), (values[:0], 1), (values[:4], 0)):  # sizes differ; empty
        with pytest.raises(ValueError, match=rf"summarize_rows\(\) takes {k} non-empty blocks"):
            stats.summarize_rows(bad, k)


def test_summarize_refuses_empty_blocks():
    with pytest.raises(ValueError, match="non-empty"):
        summarize([np.ones(3), np.ones(0)])
    assert len(summarize([]).mins) == 0


def test_summarize_checksums_are_one_column(rng):
    """One uint32 CRC-32C per block, or None when checksums are off."""
    blocks = [rng.standard_normal(int(n)) for n in (1, 5, 64)]
    got = summarize(blocks)
    assert got.crcs is not None and got.crcs.dtype == np.uint32
    assert got.crcs.tolist() == [crc32c.crc32c(b.tobytes()) for b in blocks]
    assert summarize(blocks, checksum=False).crcs is None
    assert summarize([], checksum=False).crcs is None
    assert summarize([]).crcs is not None and summarize([]).crcs.size == 0
