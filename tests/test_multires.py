"""Multiresolution storage: the CDF 5/3 wavelet, the per-level error bound, zfp per band (pure)."""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lamina
from lamina.errors import BoundsError, CodecError, DTypeError, ShapeError
from lamina.multires import bound, compress, patches, wavelet
from lamina.multires.compress import Mode

DATA = Path(os.environ.get("LAMINA_TEST_DATA", "/work/shared/data")) / "cth_shock_128x64x64.npz"

# --------------------------------------------------------------------------
# strategies


@st.composite
def patch_shapes(draw, max_edge_log=4):
    """A full patch (powers of two) and a partial shape inside it."""
    nd = draw(st.integers(1, 3))
    full = tuple(1 << draw(st.integers(0, max_edge_log)) for _ in range(nd))
    part = tuple(draw(st.integers(1, n)) for n in full)
    return full, part


KINDS = ("smooth", "noisy", "spiky", "constant", "tiny", "huge", "steps", "mixed")


def field(kind: str, shape: tuple[int, ...], seed: int, dtype=np.float64) -> np.ndarray:
    """A test field of *kind*: smooth waves, noise, spikes, a constant, tiny or huge magnitudes."""
    rng = np.random.default_rng(seed)
    grids = np.meshgrid(*(np.linspace(0, 1, n) for n in shape), indexing="ij")
    smooth = sum(np.sin(2 * np.pi * (k + 1) * g + k) for k, g in enumerate(grids))
    smooth = np.asarray(smooth, dtype=np.float64) + 0.0 * np.zeros(shape)
    if kind == "smooth":
        x = 10 * smooth
    elif kind == "noisy":
        x = rng.standard_normal(shape)
    elif kind == "spiky":
        x = np.zeros(shape)
        x.flat[rng.integers(0, x.size, max(1, x.size // 50))] = rng.choice([-1e4, 1e4], 1)
    elif kind == "constant":
        x = np.full(shape, rng.uniform(-1e3, 1e3))
    elif kind == "tiny":
        x = 1e-30 * (smooth + rng.standard_normal(shape))
    elif kind == "huge":
        x = 1e30 * (smooth + rng.standard_normal(shape))
    elif kind == "steps":
        x = np.where(grids[0] > 0.5, 100.0, -3.0) + 0.01 * rng.standard_normal(shape)
    else:  # mixed: smooth, noise and a few outliers of all magnitudes
        x = smooth + rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)
    return np.asarray(x, dtype=dtype)


def level_errors(array, patch, tol, enc=None):
    """Per level, the largest error of the decoded level against the exact one."""
    enc = enc or compress.encode_array(array, patch, tol)
    out = []
    for k in range(wavelet.nlevels(patch)):
        got = compress.decode_array(enc, k)
        want = compress.reference_array(array, patch, k, tol)
        assert got.shape == wavelet.level_shape(array.shape, k)
        assert got.dtype == array.dtype
        out.append(float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0)))
    return out


# --------------------------------------------------------------------------
# the wavelet


@given(patch_shapes(), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_forward_inverse_round_trip(shapes, npatches, seed):
    full, part = shapes
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((npatches, *part)) * 10.0 ** rng.integers(-3, 4)
    levels = wavelet.nlevels(full)
    c = wavelet.forward(x, levels, patch=full)
    assert c.shape == x.shape and c.dtype == np.float64
    scale = np.abs(x).max()
    for k in range(levels):
        approx = wavelet.approximation(x, k)
        assert approx.shape == (npatches, *wavelet.level_shape(part, k))
        np.testing.assert_allclose(
            wavelet.inverse(c, levels, k), approx, rtol=0, atol=1e-12 * scale
        )
    np.testing.assert_allclose(wavelet.inverse(c, levels), x, rtol=0, atol=1e-12 * scale)


@given(patch_shapes(), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_integer_lifting_is_exact(shapes, npatches, seed):
    full, part = shapes
    rng = np.random.default_rng(seed)
    levels = wavelet.nlevels(full)
    x = rng.integers(-(2**40), 2**40, (npatches, *part))
    c = wavelet.forward(x, levels, integer=True)
    assert c.dtype == np.int64
    np.testing.assert_array_equal(wavelet.inverse(c, levels, integer=True), x)
    for k in range(levels):
        np.testing.assert_array_equal(
            wavelet.inverse(c, levels, k, integer=True), wavelet.approximation(x, k, integer=True)
        )
    # even where values overflow, lifting undoes itself (wrap-around arithmetic)
    big = rng.integers(-(2**62), 2**62, (npatches, *part))
    with np.errstate(over="ignore"):
        back = wavelet.inverse(wavelet.forward(big, levels, integer=True), levels, integer=True)
    np.testing.assert_array_equal(back, big)


@given(patch_shapes(), st.integers(0, 2**32 - 1))
def test_bands_pack_and_unpack(shapes, seed):
    full, part = shapes
    levels = wavelet.nlevels(full)
    c = np.random.default_rng(seed).standard_normal((2, *part))
    bands = wavelet.pack(c, levels)
    assert len(bands) == levels
    for b, band in enumerate(bands):
        assert band.shape == (2, *wavelet.band_shape(part, levels, b))
    np.testing.assert_array_equal(wavelet.unpack(bands, part, levels), c)
    assert sum(wavelet.band_size(part, levels, b) for b in range(levels)) == math.prod(part)
    for k in range(levels):  # a reader of level k needs bands k .. L-1 only
        some = [None] * k + bands[k:]
        got = wavelet.inverse(wavelet.unpack(some, part, levels, k), levels, k)
        np.testing.assert_allclose(got, wavelet.inverse(c, levels, k), rtol=0, atol=1e-12)


def test_linear_data_has_details_only_at_the_far_edge():
    """CDF 5/3 predicts linear data exactly, except the last odd sample (symmetric extension)."""
    x = np.arange(32, dtype=np.float64)[None] * 3.0 + 1.0
    c = wavelet.forward(x, 6)
    nonzero = np.flatnonzero(c[0, 1:]) + 1
    np.testing.assert_array_equal(nonzero, [1, 3, 7, 15, 31])  # the last detail of each step
    a = wavelet.approximation(x, 2)
    np.testing.assert_allclose(a[0, :-1], x[0, ::4][:-1])


def test_levels_and_shapes():
    assert wavelet.nlevels((32, 32, 32)) == 6
    assert wavelet.nlevels((64, 16)) == 5
    assert wavelet.nlevels((1,)) == 1
    assert wavelet.level_shape((37, 50, 9), 2) == (10, 13, 3)
    assert wavelet.level_shape((37, 50, 9), 0) == (37, 50, 9)


def _matrix(shape, levels, level, band):
    """The inverse, from the coefficients of *band* to the values at *level*, as a matrix."""
    cols = []
    bands = wavelet.pack(np.zeros((1, *shape)), levels)
    for j in range(bands[band][0].size):
        unit = [np.zeros_like(b) for b in bands]
        unit[band].flat[j] = 1.0
        c = wavelet.unpack(unit, shape, levels, level)
        cols.append(wavelet.inverse(c, levels, level).ravel())
    return np.array(cols).T


@pytest.mark.parametrize(
    "full, part",
    [((8,), (8,)), ((8,), (5,)), ((8, 8), (8, 8)), ((8, 4), (3, 4)), ((4, 4, 4), (4, 3, 4))],
)
def test_operator_norms_match_the_proof(full, part):
    """Row sums of |inverse| per band: the bound of lamina.multires.bound holds, tightly on full patches.

    Padding entries of a packed band are not coefficients: the matrix
    columns of padded entries are zero, so they do not count.
    """
    levels = wavelet.nlevels(full)
    nd = len(full)
    t = np.linspace(1.0, 2.0, levels)  # any tolerances
    for k in range(levels):
        total = sum(
            t[b] * np.abs(_matrix(part, levels, k, b)).sum(axis=1) for b in range(k, levels)
        )
        assert total.max() <= bound.error_bound(t, nd, k) * (1 + 1e-12)
    # one step: at most 1 per detail sub-band, attained where a full patch has interior odd points
    for b in range(levels - 1):
        per = np.abs(_matrix(part, levels, b, b)).sum(axis=1)
        assert per.max() <= ((1 << nd) - 1) * (1 + 1e-12)
        if part == full and min(wavelet.level_shape(full, b)) >= 4:
            assert per.max() == pytest.approx((1 << nd) - 1)


# --------------------------------------------------------------------------
# the bound


def test_band_tolerances_spend_the_budget():
    for patch in [(32,), (16, 16), (32, 32, 32), (64, 16, 8)]:
        t = bound.band_tolerances(1.0, patch)
        w = bound.weights(len(patch), wavelet.nlevels(patch))
        assert (w * t).sum() == pytest.approx(1 - bound.SAFETY)
        assert bound.error_bound(t, len(patch)) == pytest.approx(1 - bound.SAFETY)
        assert (np.diff(t) <= 0).all() and t[0] > t[-1]  # fine bands get more
    assert not bound.band_tolerances(0.0, (8, 8)).any()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "x"])
def test_bad_tolerances_are_refused(bad):
    with pytest.raises(ValueError, match="tolerance"):
        bound.band_tolerances(bad, (8, 8))
    with pytest.raises(ValueError, match="tolerance"):
        compress.encode(np.zeros((1, 8, 8)), (8, 8), bad)


@given(
    st.sampled_from(KINDS),
    st.lists(st.integers(1, 40), min_size=1, max_size=3),
    st.integers(0, 4),
    st.sampled_from([np.float32, np.float64]),
    st.floats(-6, 0.5),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=40)
def test_every_level_within_tolerance(kind, shape, edge_log, dtype, rel_log, seed):
    shape = tuple(shape)
    patch = tuple(min(1 << edge_log, 1 << max(0, n.bit_length() - 1)) for n in shape)
    x = field(kind, shape, seed, dtype)
    span = float(np.abs(x).max()) or 1.0
    tol = span * 10.0**rel_log
    errs = level_errors(x, patch, tol)
    assert max(errs) <= tol, (errs, tol)


@pytest.mark.parametrize("kind", KINDS)
def test_every_level_within_tolerance_3d(kind):
    x = field(kind, (40, 33, 24), 7, np.float32)
    patch = (16, 16, 16)
    for rel in (1e-1, 1e-3, 1e-5):
        tol = rel * (float(np.abs(x).max()) or 1.0)
        errs = level_errors(x, patch, tol)
        assert max(errs) <= tol


@given(
    st.sampled_from(KINDS),
    st.lists(st.integers(1, 24), min_size=1, max_size=3),
    st.sampled_from([np.float32, np.float64]),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
@settings(max_examples=30)
def test_tolerance_zero_is_bit_exact(kind, shape, dtype, seed, specials):
    shape = tuple(shape)
    patch = tuple(1 << max(0, min(3, n.bit_length() - 1)) for n in shape)
    x = field(kind, shape, seed, dtype)
    if specials and x.size > 3:
        flat = x.reshape(-1)
        flat[:4] = [-0.0, np.nan, np.inf, np.finfo(dtype).smallest_subnormal]
    enc = compress.encode_array(x, patch, 0.0)
    back = compress.decode_array(enc, 0)
    assert back.dtype == x.dtype
    np.testing.assert_array_equal(back.view(np.uint8), x.view(np.uint8))
    for k in range(1, wavelet.nlevels(patch)):
        want = compress.reference_array(x, patch, k, 0.0)
        np.testing.assert_array_equal(compress.decode_array(enc, k), want)
        assert want.shape == wavelet.level_shape(shape, k)


def test_tolerance_zero_takes_the_integer_path():
    x = field("smooth", (32, 32), 1, np.float32)
    enc = compress.encode(patches.cut(x, (16, 16))[0].data, (16, 16), 0.0)
    assert (enc.modes == Mode.INTEGER).all()
    # the integer approximation stays within a few units of the float one
    for k in range(5):
        a = compress.reference(patches.cut(x, (16, 16))[0].data, (16, 16), k, 0.0)
        f = wavelet.approximation(patches.cut(x, (16, 16))[0].data, k)
        assert np.abs(a - f).max() <= 1e-5 * np.abs(x).max()


def test_nan_and_inf_patches_are_stored_losslessly():
    x = field("smooth", (32, 32), 3)
    x[3, 4] = np.nan
    x[20, 30] = -np.inf
    tol = 0.01
    enc = compress.encode_array(x, (16, 16), tol)
    (batch, e), *_ = enc.batches
    assert sorted(np.flatnonzero(e.modes == Mode.RAW)) == [0, 3]
    back = compress.decode_array(enc, 0)
    raw = np.zeros(x.shape, dtype=bool)
    raw[:16, :16] = raw[16:, 16:] = True
    np.testing.assert_array_equal(back[raw], x[raw])  # NaN == NaN here
    assert np.abs(back[~raw] - x[~raw]).max() <= tol
    for k in range(1, 5):
        got = compress.decode_array(enc, k)
        want = compress.reference_array(x, (16, 16), k, tol)
        ok = np.isfinite(want)
        assert np.abs(got[ok] - want[ok]).max() <= tol
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def test_tolerance_tens_of_ulps_still_gives_bands():
    """float32 values near 2,000 at tolerance 1e-3 (about 8 units in their last place, the
    README's example): the first try keeps a sixteenth of the tolerance for rounding, too
    little there, and the patches were stored raw (a level-3 read read every byte, the
    file 3x larger); the second try keeps half and compresses them, every level within
    the tolerance.  Data of a few hundred distinct values deflates smaller than its bands
    at such a tolerance and stays raw."""
    n = 32
    z, y, x = np.meshgrid(np.arange(2 * n) / n, np.arange(n) / n, np.arange(n) / n, indexing="ij")
    smooth = 0.5 + 0.25 * np.sin(6.1 * x + 2.3 * y * y) + 0.25 * np.cos(4.7 * z + 1.3 * x * y)
    t = (500 + 1360 * smooth).astype(np.float32)
    data = np.stack([t[:n], t[n:]])
    enc = compress.encode(data, (n,) * 3, 1e-3)
    assert list(enc.modes) == [Mode.WAVELET] * 2
    assert enc.nbytes(3) < 0.05 * enc.nbytes(0) < 0.05 * data.nbytes
    for k in range(enc.levels):
        want = compress.reference(data, (n,) * 3, k, 1e-3).astype(np.float64)
        assert np.abs(compress.decode(enc, k).astype(np.float64) - want).max() <= 1e-3
    steps = np.round(data / 8) * 8
    enc = compress.encode(steps, (n,) * 3, 1e-3)
    assert list(enc.modes) == [Mode.RAW] * 2
    np.testing.assert_array_equal(compress.decode(enc, 0), steps)


@pytest.mark.parametrize("again", [False, True])
def test_zfp_overshoot_falls_back_to_lossless(monkeypatch, again):
    """If zfp read back a coefficient off by more than its tolerance, the patch is encoded
    again with the tighter band tolerances of the second try; if zfp overshoots there too
    (*again*), it is stored raw."""
    import zfpy

    x = field("smooth", (32, 32), 5)
    data = patches.cut(x, (16, 16))[0].data
    levels = wavelet.nlevels((16, 16))
    target = wavelet.pack(wavelet.forward(data, levels), levels)[0][1]  # patch 1's band 0
    real = zfpy.decompress_numpy
    seen = []

    def bad(blob):
        out = real(blob)
        if out.shape == target.shape and np.abs(out - target).max() < 0.1:
            seen.append(1)
            if again or len(seen) == 1:
                out = out + 1.0
        return out

    monkeypatch.setattr(zfpy, "decompress_numpy", bad)
    enc = compress.encode(data, (16, 16), 0.1)
    monkeypatch.setattr(zfpy, "decompress_numpy", real)
    assert len(seen) == 2, seen  # the stream checked once in each try
    one = Mode.RAW if again else Mode.WAVELET
    assert list(enc.modes) == [Mode.WAVELET, one, Mode.WAVELET, Mode.WAVELET]
    back = compress.decode(enc, 0)[1]
    if again:
        np.testing.assert_array_equal(back, data[1])
    else:
        assert np.abs(back - data[1]).max() <= 0.1


def test_verify_levels_and_none_agree_with_the_bound():
    x = field("mixed", (48, 40), 11, np.float32)
    tol = 1e-2 * float(np.abs(x).max())
    for verify in ("none", "levels"):
        enc = compress.encode_array(x, (16, 16), tol, verify=verify)
        assert max(level_errors(x, (16, 16), tol, enc)) <= tol


@given(
    st.sampled_from(KINDS),
    st.lists(st.integers(1, 40), min_size=1, max_size=3),
    st.sampled_from([np.float32, np.float64]),
    st.floats(-5, 0),
    st.sampled_from([4.0, 32.0, 1e6]),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=25)
def test_optimism_keeps_the_bound(kind, shape, dtype, rel_log, optimism, seed):
    """Larger tolerances tried first are kept only where every level still reads back within it."""
    shape = tuple(shape)
    patch = tuple(1 << max(0, min(3, n.bit_length() - 1)) for n in shape)
    x = field(kind, shape, seed, dtype)
    tol = (float(np.abs(x).max()) or 1.0) * 10.0**rel_log
    enc = compress.encode_array(x, patch, tol, optimism=optimism)
    assert max(level_errors(x, patch, tol, enc)) <= tol


@given(
    st.sampled_from(KINDS),
    st.lists(st.integers(4, 40), min_size=1, max_size=3),
    st.sampled_from([np.float32, np.float64]),
    st.floats(-5, -1),
    st.floats(-1, 3),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=40)
def test_bands_left_out_keep_the_looser_bound(kind, shape, dtype, rel_log, slack_log, opt, seed):
    """Bands left out by skippable (coefficients read as 0) move every level by at most the
    slack: a looser read stays within written tolerance + slack."""
    shape = tuple(shape)
    patch = tuple(1 << max(0, min(3, n.bit_length() - 1)) for n in shape)
    x = field(kind, shape, seed, dtype)
    tol = (float(np.abs(x).max()) or 1.0) * 10.0**rel_log
    slack = tol * 10.0**slack_log
    enc = compress.encode_array(x, patch, tol, optimism=8.0 if opt else 1.0)
    levels = wavelet.nlevels(patch)
    for k in range(levels):
        want = compress.reference_array(x, patch, k, tol)
        parts = []
        for b, e in enc.batches:
            skip = compress.skippable(e.amax, x.ndim, slack, k)
            assert not skip[:, levels - 1].any() and not skip[:, :k].any()
            blobs = [
                [None if skip[i, j] else e.blobs[j][i] for i in range(e.npatches)]
                for j in range(levels)
            ]
            cut = dataclasses.replace(e, blobs=blobs)
            parts.append(patches.Batch(b.shape, b.coords, compress.decode(cut, k)))
        got = patches.join(parts, x.shape, patch, k)
        err = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
        assert err <= tol + slack, (k, err, tol, slack)


def test_skippable_leaves_out_finest_bands_first_within_the_slack():
    amax = np.array([[0.1, 0.2, 0.4, 5.0], [np.inf, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    # 2-D: detail bands weigh 3, the coarsest approximation is never left out
    got = compress.skippable(amax, 2, 1.0, 0)
    assert got.tolist() == [
        [True, True, False, False],
        [False, False, False, False],  # an unknown finest band stops the run
        [True, True, True, False],
    ]
    assert compress.skippable(amax, 2, 1.0, 1).tolist()[0] == [False, True, False, False]
    assert not compress.skippable(amax, 2, 0.0, 0).any()


def test_optimism_shrinks_smooth_data():
    x = field("smooth", (64, 64, 64), 1, np.float32)
    plain = compress.encode_array(x, (32, 32, 32), 0.01)
    bold = compress.encode_array(x, (32, 32, 32), 0.01, optimism=16)
    assert bold.nbytes() < 0.9 * plain.nbytes()
    assert max(level_errors(x, (32, 32, 32), 0.01, bold)) <= 0.01
    with pytest.raises(ValueError, match="optimism"):
        compress.encode_array(x, (32, 32, 32), 0.01, optimism=0.5)


@given(patch_shapes(), st.integers(0, 2**32 - 1))
def test_all_levels_in_one_pass(shapes, seed):
    full, part = shapes
    levels = wavelet.nlevels(full)
    x = np.random.default_rng(seed).standard_normal((2, *part))
    c, exact = wavelet.forward_levels(x, levels)
    np.testing.assert_array_equal(c, wavelet.forward(x, levels))
    rec = wavelet.inverse_levels(c, levels)
    c2, sizes = wavelet.forward_magnitudes(x, levels)
    np.testing.assert_array_equal(c2, c)
    for k in range(levels):
        np.testing.assert_array_equal(exact[k], wavelet.approximation(x, k))
        np.testing.assert_array_equal(rec[k], wavelet.inverse(c, levels, k))
        np.testing.assert_array_equal(sizes[:, k], np.abs(exact[k]).reshape(2, -1).max(axis=1))


def test_tiny_tolerance_near_float_precision_stays_exact():
    """A tolerance within rounding of the data's magnitude: such patches are stored losslessly."""
    x = field("smooth", (16, 16), 2, np.float32) + 1000
    tol = float(np.spacing(np.float32(1000)))
    enc = compress.encode(x[None], (16, 16), tol)
    assert (enc.modes == Mode.RAW).all()
    assert np.abs(compress.decode(enc)[0] - x).max() == 0


def exact_levels(x, patch, k):
    """The exact level-*k* approximation of a whole array, unrounded (float64)."""
    with np.errstate(invalid="ignore"):  # NaN and infinity spread
        parts = [
            patches.Batch(b.shape, b.coords, wavelet.approximation(b.data, k))
            for b in patches.cut(x, patch)
        ]
    return patches.join(parts, x.shape, patch, k)


@pytest.mark.parametrize("patch", [(1024, 2, 2, 2), (32768, 2, 2), (8192, 1, 1, 1)])
def test_bands_longer_than_zfp_records_are_stored_raw(patch):
    """A detail band packs its 2^d - 1 sub-bands along axis 0: patches of (1024, 2, 2, 2) give
    4-D bands of 7,680 rows, past the 4,096 zfp's header records, and the write failed in
    zfpy.  Such patches are stored raw (as codecs store blocks past zfp's limits): level 0
    exact, every level the reference."""
    x = np.cumsum(np.random.default_rng(0).standard_normal((2 * patch[0], *patch[1:])), axis=0)
    tol = 1e-3
    enc = compress.encode_array(x, patch, tol)
    assert all((e.modes == Mode.RAW).all() for _, e in enc.batches)
    for k in range(wavelet.nlevels(patch)):
        got = compress.decode_array(enc, k)
        np.testing.assert_array_equal(got, compress.reference_array(x, patch, k, tol))
    np.testing.assert_array_equal(compress.decode_array(enc, 0), x)


def test_raw_levels_are_the_approximation_rounded_to_the_dtype(tmp_path):
    """A tolerance below float32's resolution of the data stores patches raw: every level reads
    back as the exact approximation rounded to float32 (what reference gives: error 0), within
    half an ulp of the unrounded one, which is more than the tolerance; NaN and infinity alike."""
    rng = np.random.default_rng(0)
    x = (1000 + rng.standard_normal((32, 32))).astype(np.float32)
    x[3, 4], x[20, 30] = np.nan, -np.inf  # two of the four patches
    patch, tol = (16, 16), 1e-6
    enc = compress.encode_array(x, patch, tol)
    assert all((e.modes == Mode.RAW).all() for _, e in enc.batches)
    worst = 0.0
    for k in range(wavelet.nlevels(patch)):
        got = compress.decode_array(enc, k)
        want = compress.reference_array(x, patch, k, tol)
        assert want.dtype == got.dtype == np.float32
        np.testing.assert_array_equal(got, want)  # NaN where NaN, infinity where infinity
        exact = exact_levels(x, patch, k)
        np.testing.assert_array_equal(want, exact.astype(np.float32))
        finite = np.isfinite(exact)
        err = np.abs(got[finite].astype(np.float64) - exact[finite])
        assert (err <= np.abs(np.spacing(got[finite])) / 2).all(), k
        worst = max(worst, float(err.max()))
    assert worst > tol  # the half ulp, not the tolerance, bounds it against the unrounded one
    p = str(tmp_path / "r.lam")
    with lamina.open(p, "w") as f:
        ds = f.create_dataset(
            "T", x.shape, x.dtype, layout=lamina.Multires(patch=16, tolerance=tol)
        )
        with f.step():
            ds[...] = x
    with lamina.open(p) as f:
        ds = f["T"]
        for k in range(len(ds.levels)):
            want = compress.reference_array(x, patch, k, tol)
            np.testing.assert_array_equal(ds.level(k)[...], want)
            for t in (tol, 1e-3, 10.0):
                np.testing.assert_array_equal(ds.read(level=k, tolerance=t), want)
    # float64: the approximation is float64 already, raw levels are it bit for bit
    x64 = x.astype(np.float64)
    enc = compress.encode_array(x64, patch, 1e-14)
    assert all((e.modes == Mode.RAW).all() for _, e in enc.batches)
    for k in range(wavelet.nlevels(patch)):
        np.testing.assert_array_equal(compress.decode_array(enc, k), exact_levels(x64, patch, k))


@pytest.mark.parametrize(
    "dtype, top, tols", [(np.float32, 3e38, (0.0, 1e30)), (np.float64, 1.7e308, (0.0, 1e290))]
)
def test_finite_data_near_the_largest_float_reads_back_finite(tmp_path, dtype, top, tols):
    """The approximation overshoots near the largest float: levels are clipped to it, in the
    values read, the level statistics and the reference alike, with no warning on the way."""
    rng = np.random.default_rng(0)
    x = (rng.choice([-1, 1], (32, 32)) * top).astype(dtype)
    x[20:, 20:] = (rng.uniform(-1, 1, (12, 12)) * top).astype(dtype)
    big = float(np.finfo(dtype).max)
    for tol in tols:
        p = str(tmp_path / f"big{tol:g}.lam")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with lamina.open(p, "w") as f:
                layout = lamina.Multires(patch=16, tolerance=tol)
                ds = f.create_dataset("T", x.shape, x.dtype, layout=layout)
                with f.step():
                    ds[...] = x
            with lamina.open(p) as f:
                ds = f["T"]
                eng = f.engine.stack()[-1]
                for k in range(len(ds.levels)):
                    got = ds.level(k)[...]
                    assert np.isfinite(got).all(), (tol, k)
                    want = compress.reference_array(x, (16, 16), k, tol)
                    assert np.isfinite(want).all()
                    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
                    assert err.max() <= tol, (tol, k)
                    t = eng.block_table("T", 0, level=k)
                    for i in range(len(t)):
                        v = got[t.box(i).slices]
                        assert -big <= t.smin[i] <= v.min() and v.max() <= t.smax[i] <= big
                if tol == 0:
                    np.testing.assert_array_equal(ds[...], x)
                if dtype == np.float32:  # the unclipped approximation leaves the range
                    assert (np.abs(exact_levels(x, (16, 16), 1)) > big).any()
        # infinite data stays infinite (its patch is stored raw)
        y = x.copy()
        y[1, 1] = np.inf
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            enc = compress.encode_array(y, (16, 16), tol)
            for k in range(1, 5):
                got = compress.decode_array(enc, k)
                np.testing.assert_array_equal(got, compress.reference_array(y, (16, 16), k, tol))
                assert not np.isfinite(got[0, 0]) and np.isfinite(got[:, -1]).all()
            assert np.isposinf(compress.decode_array(enc, 1)[0, 0])  # not clipped


# --------------------------------------------------------------------------
# real data


@pytest.fixture(scope="module")
def cth():
    if not DATA.exists():
        pytest.skip(f"real data not found at {DATA}")
    with np.load(DATA) as f:
        return {k: f[k] for k in ("pressure", "x_velocity", "volume_fraction_for_armor_plate")}


@pytest.mark.parametrize("name", ["pressure", "x_velocity", "volume_fraction_for_armor_plate"])
@pytest.mark.parametrize("patch", [(32, 32, 32), (16, 16, 16), (8, 16, 32)])
def test_real_data_every_level_within_tolerance(cth, name, patch):
    x = cth[name]
    span = float(x.max() - x.min())
    for rel in (1e-2, 1e-5):
        tol = rel * span
        enc = compress.encode_array(x, patch, tol)
        errs = level_errors(x, patch, tol, enc)
        assert max(errs) <= tol, (errs, tol)
        assert enc.nbytes() < x.nbytes


def test_real_data_cut_to_partial_patches(cth):
    """A corner of the field of an awkward shape: partial patches along every axis."""
    x = cth["pressure"][5:46, 3:64, 17:128]
    tol = 1e-3 * float(x.max() - x.min())
    assert max(level_errors(x, (16, 16, 16), tol)) <= tol
    enc = compress.encode_array(x, (16, 16, 16), 0.0)
    np.testing.assert_array_equal(compress.decode_array(enc).view(np.uint32), x.view(np.uint32))


# --------------------------------------------------------------------------
# errors that name the limit


def test_errors_name_the_limit():
    with pytest.raises(ShapeError, match="not a power of two"):
        wavelet.check_patch((8, 12))
    with pytest.raises(ShapeError, match="larger than the dataset"):
        patches.grid((10, 10), (16, 16))
    with pytest.raises(ShapeError, match="do not fit in the patch"):
        compress.encode(np.zeros((1, 9, 8)), (8, 8), 0.1)
    with pytest.raises(DTypeError, match="float32 or float64"):
        compress.encode(np.zeros((1, 8, 8), dtype=np.int32), (8, 8), 0.1)
    enc = compress.encode(np.zeros((1, 8, 8)), (8, 8), 0.1)
    with pytest.raises(BoundsError, match="level 4 does not exist: there are levels 0 to 3"):
        compress.decode(enc, 4)
    with pytest.raises(BoundsError, match="level -1 does not exist"):
        compress.decode(enc, -1)
    with pytest.raises(ValueError, match="verify"):
        compress.encode(np.zeros((1, 8, 8)), (8, 8), 0.1, verify="maybe")


def test_cut_and_join_cover_the_array_once():
    x = np.arange(37 * 50 * 9, dtype=np.float64).reshape(37, 50, 9)
    for patch in [(8, 8, 8), (16, 16, 4), (32, 64, 16), (1, 2, 4)]:
        batches = patches.cut(x, patch)
        got = sorted(v for b in batches for v in b.data.ravel())
        np.testing.assert_array_equal(got, x.ravel())
        np.testing.assert_array_equal(patches.join(batches, x.shape, patch), x)
        assert sum(len(b.coords) for b in batches) == math.prod(patches.grid(x.shape, patch))


def test_corrupt_streams_give_codec_errors():
    x = field("smooth", (16, 16), 4)[None]
    for tol in (0.1, 0.0):
        enc = compress.encode(x, (16, 16), tol)
        good = enc.blobs[0][0]
        other = compress.encode(field("smooth", (8, 8), 1)[None], (8, 8), tol).blobs[0][0]
        for blob in (b"", b"zfp", good[:20], other, b"\x00" * 64, good[:-8]):
            enc.blobs[0][0] = blob
            try:
                compress.decode(enc, 0)
            except CodecError:
                pass
        enc.blobs[0][0] = good
    raw = compress.encode(np.full((1, 8, 8), np.nan), (8, 8), 0.1)
    assert raw.modes[0] == Mode.RAW
    for blob in (b"", b"garbage", raw.blobs[-1][0][:-3], raw.blobs[-1][0] + b"x"):
        raw.blobs[-1][0] = blob
        with pytest.raises(CodecError):
            compress.decode(raw, 0)
