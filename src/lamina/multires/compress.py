"""Encode and decode batches of patches: wavelet, per-band zfp, lossless fallbacks.

:func:`encode` transforms a batch of patches of one shape
(:mod:`lamina.multires.wavelet`), splits the coefficients into bands and
compresses each band of each patch with zfp's fixed-accuracy mode at the
band's tolerance (:mod:`lamina.multires.bound`), one zfp stream per band
and patch, so a reader of level ``k`` reads bands ``k .. L - 1`` of the
patches it needs and nothing else.  :func:`decode` reads a level back.

Each patch is stored in one of three modes (:class:`Mode`):

``WAVELET``
    float64 coefficients, zfp fixed accuracy; every level within the
    tolerance of the exact approximation rounded to the data's dtype
    (:func:`reference`).
``INTEGER``
    tolerance 0: the data as exact integers times a power of two (per
    patch), the integer lifting, and zfp's reversible (lossless) mode:
    full resolution reads back bit for bit, level ``k`` gives the integer
    transform's approximation scaled back and rounded to the dtype, exactly
    as :func:`reference` does (within a rounding unit of the float one).
``RAW``
    the patch's bytes, deflated: patches holding NaN or infinity (zfp maps
    them to finite numbers), patches whose tolerance is within rounding of
    their magnitude, patches on which zfp overshot its tolerance, float64
    patches too near its largest value for the float64 transforms
    (:func:`lamina.multires.bound.float64_headroom`), and at tolerance 0
    patches too wide in exponent for int64.  All of the patch
    sits in the coarsest band, so every level reads it; level 0 is the
    data bit for bit, and level ``k`` is computed from it on reading: the
    exact approximation rounded to the data's dtype (:func:`reference`),
    within half a unit in the last place of the unrounded one (where that
    lies within the dtype's finite range).

Every level is read in the data's dtype.  Where the approximation of
finite data exceeds the dtype's finite range (data near its largest
value), the values read are clipped to the largest finite value of that
sign, as :func:`reference` clips them, so finite data reads back finite;
infinite data stays infinite (:mod:`lamina.multires.bound`, *Overflow*).

Decoding trusts no byte: each stream must declare the shape and type the
band has (zfp's header is read before anything is decompressed, and the
stream padded to the most zfp can read for that shape), and raw patches
inflate into at most their known size, so corrupt data gives a
:class:`~lamina.errors.CodecError`, never a large allocation.
"""

from __future__ import annotations

import enum
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import CodecError, DTypeError, ShapeError
from ..zfpstream import zfp_bound, zfp_header, zfp_need
from . import bound, patches, wavelet


class Mode(enum.IntEnum):
    """How one patch is stored."""

    WAVELET = 0
    INTEGER = 1
    RAW = 2


#: verification of what zfp wrote: none, every coefficient against its
#: band's tolerance, or every level read back against the exact one
VERIFY = ("none", "coefficients", "levels")


@dataclass
class Encoded:
    """A batch of encoded patches of one shape.

    Attributes
    ----------
    shape
        The patches' shape (full or partial).
    patch
        The full patch shape (the transform's levels come from it).
    dtype
        The data's dtype (float32 or float64).
    tolerance
        The error bound asked for (0: lossless).
    tolerances
        The proved zfp tolerance per band (patches encoded with
        ``optimism`` may use larger ones: zfp streams carry their own).
    modes
        :class:`Mode` per patch.
    exponents
        Per patch, the power of two the integers of :attr:`Mode.INTEGER`
        are scaled by (0 for other modes).
    blobs
        ``blobs[b][i]``: the bytes of band ``b`` of patch ``i`` (empty for
        bands a raw patch does not use; None for a band a reader leaves
        out: its coefficients read as 0, see :func:`skippable`).
    amax
        ``(npatches, levels)``: the largest magnitude of each band's
        coefficients as stored (decoded), inf where not known (patches
        stored losslessly); what a reader may leave out follows from it.
    """

    shape: tuple[int, ...]
    patch: tuple[int, ...]
    dtype: np.dtype
    tolerance: float
    tolerances: np.ndarray
    modes: np.ndarray
    exponents: np.ndarray
    blobs: list[list[bytes | None]] = field(default_factory=list)
    amax: np.ndarray | None = None

    @property
    def levels(self) -> int:
        return len(self.tolerances)

    @property
    def npatches(self) -> int:
        return len(self.modes)

    def sizes(self) -> np.ndarray:
        """Bytes per patch and band, shape ``(npatches, levels)``."""
        out = np.zeros((self.npatches, self.levels), dtype=np.int64)
        for b, blobs in enumerate(self.blobs):
            out[:, b] = [0 if x is None else len(x) for x in blobs]
        return out

    def nbytes(self, level: int = 0) -> int:
        """Bytes a reader of *level* reads for the whole batch."""
        level = wavelet.check_level(level, self.levels)
        return int(self.sizes()[:, level:].sum())


# --------------------------------------------------------------------------
# encoding


def _check_data(x: np.ndarray, patch: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if x.dtype not in (np.float32, np.float64):
        raise DTypeError(f"multiresolution storage takes float32 or float64 data, not {x.dtype}")
    p = wavelet.check_patch(patch)
    if x.ndim != len(p) + 1:
        raise ShapeError(
            f"a batch of {len(p)}-D patches has shape (npatches, *patch), got {x.shape}"
        )
    shape = tuple(int(n) for n in x.shape[1:])
    if any(not 1 <= a <= b for a, b in zip(shape, p, strict=True)):
        raise ShapeError(
            f"patches of shape {shape} do not fit in the patch {p} "
            "(each edge must be 1 to the patch's edge)"
        )
    return shape, p


def _axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(1, x.ndim))


def _deflate(x: np.ndarray) -> bytes:
    return zlib.compress(np.ascontiguousarray(x).tobytes(), 1)


def encode(
    x: np.ndarray,
    patch: Sequence[int],
    tolerance: float,
    *,
    verify: str = "coefficients",
    optimism: float = 1.0,
) -> Encoded:
    """Encode a batch of patches so that every level reads back within *tolerance*.

    Parameters
    ----------
    x
        float32 or float64 array ``(npatches, *shape)``, each patch of
        *shape* (all of one shape: full, or cut short by the dataset).
    patch
        The full patch shape (powers of two); *shape* fits inside it.
    tolerance
        Largest absolute error at every level, >= 0; 0 stores the data
        losslessly (bit for bit at full resolution).
    verify
        ``"coefficients"`` (default): decode each zfp stream and store a
        patch losslessly if a coefficient is off by more than its band's
        tolerance, so that the bound rests on arithmetic alone;
        ``"levels"``: also read every level back and compare with
        :func:`reference`; ``"none"``: trust zfp (faster).
    optimism
        Try band tolerances this many times larger than the proved ones
        first, keep a patch so encoded only if every level of it reads
        back within *tolerance* less its rounding margin (checked as
        ``verify="levels"`` does), and
        encode the others with the proved tolerances.  The proof bounds
        the worst case of every coefficient error lining up; real errors
        are far smaller, so 8 to 16 typically shrinks the data by a third
        or more, at the cost of the check.  1 (default): proved tolerances
        only.

    Returns
    -------
    Encoded
        Modes, bytes per band and patch, and what decoding needs.

    Raises
    ------
    DTypeError
        If *x* is not float32 or float64.
    ShapeError
        If the patches do not fit the patch shape, or the patch's edges are
        not powers of two.
    ValueError
        If *tolerance* is negative, NaN or infinite, *verify* unknown or
        *optimism* below 1.
    """
    x = np.asarray(x)
    tol = bound.check_tolerance(tolerance)
    if verify not in VERIFY:
        raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
    if not (optimism >= 1 and math.isfinite(optimism)):
        raise ValueError(f"optimism must be a finite number >= 1, got {optimism!r}")
    shape, p = _check_data(x, patch)
    levels = wavelet.nlevels(p)
    n = x.shape[0]
    tolerances = bound.band_tolerances(tol, p)
    modes = np.full(n, Mode.RAW if tol == 0 else Mode.WAVELET, dtype=np.uint8)
    exponents = np.zeros(n, dtype=np.int32)
    blobs: list[list[bytes | None]] = [[b""] * n for _ in range(levels)]
    amax = np.full((n, levels), np.inf)
    finite = np.isfinite(x).all(axis=_axes(x)) if n else np.zeros(0, dtype=bool)
    if tol == 0:
        _encode_integer(x, finite, levels, modes, exponents, blobs, verify)
    elif optimism > 1:
        _encode_wavelet(x, finite, tol, tolerances * optimism, modes, blobs, "levels", amax)
        redo = np.flatnonzero((modes == Mode.RAW) & finite)
        if redo.size:
            again = encode(x[redo], p, tol, verify=verify)
            modes[redo] = again.modes
            assert again.amax is not None
            amax[redo] = again.amax
            for b in range(levels):
                for j, i in enumerate(redo):
                    blobs[b][i] = again.blobs[b][j]
    else:
        _encode_wavelet(x, finite, tol, tolerances, modes, blobs, verify, amax)
        _encode_wide(x, p, finite, tol, modes, blobs, verify, amax)
    raw = np.flatnonzero(modes == Mode.RAW)
    amax[modes != Mode.WAVELET] = np.inf
    for i in raw:
        for b in range(levels):
            blobs[b][i] = b""
        blobs[levels - 1][i] = _deflate(x[i])
    return Encoded(shape, p, x.dtype, tol, tolerances, modes, exponents, blobs, amax)


def zfp_max_extent(ndim: int) -> int:
    """The longest axis zfp's header records for an *ndim*-D field: the sizes share 48 bits,
    each axis storing its length less one (2**48 values in 1-D, 2**24 in 2-D, 65536 in 3-D,
    4096 in 4-D); zfp cannot write the header of a longer one (a band of patches here, a
    block in :mod:`lamina.codecs`)."""
    return 1 << (48 // ndim)


def _encode_wavelet(
    x: np.ndarray,
    finite: np.ndarray,
    tol: float,
    tolerances: np.ndarray,
    modes: np.ndarray,
    blobs: list[list[bytes | None]],
    verify: str,
    amax: np.ndarray,
    safety: float = bound.SAFETY,
) -> None:
    """zfp-compress the bands of the finite patches; mark the others RAW.  *amax* gets each
    band's largest decoded coefficient magnitude (without ``verify``: the largest exact one
    plus the band's tolerance, which zfp's error bound then covers).  Patches whose rounding
    margin exceeds the part of *tol* kept for it (*safety*; *tolerances* leave it out), or
    whose magnitude leaves the float64 transforms too little headroom, are stored RAW
    (:mod:`lamina.multires.bound`)."""
    import zfpy

    levels = len(tolerances)
    headroom = bound.float64_headroom(x.ndim - 1, levels)
    if x.shape[0]:
        fits = finite & (np.abs(x).max(axis=_axes(x)).astype(np.float64) <= headroom)
    else:
        fits = finite
    modes[~fits] = Mode.RAW
    idx = np.flatnonzero(fits)
    if not idx.size:
        return
    xs = x[idx]
    axes = _axes(xs)
    check_levels = verify == "levels"
    if check_levels:
        c, exact = wavelet.forward_levels(xs, levels)
        sizes = np.stack([np.abs(a).max(axis=axes) for a in exact], axis=1)
    else:
        c, sizes = wavelet.forward_magnitudes(xs, levels)
    magnitude = np.maximum(sizes.max(axis=1), np.abs(c).max(axis=axes)) + tol
    margin = bound.rounding_margin(magnitude, x.dtype)
    # NaN-safe: an overflowing margin also sends the patch to RAW
    ok = (margin <= safety * tol) & (magnitude <= headroom)
    bands = wavelet.pack(c, levels)
    for band in bands:
        if band.ndim > 1 and max(band.shape[1:]) > zfp_max_extent(band.ndim - 1):
            # zfp's header cannot record an axis this long (a detail band packs its 2^d - 1
            # sub-bands along axis 0: patches of (1024, 2, 2, 2) give 15 * 512 = 7,680 rows,
            # past 4,096 in 4-D): every patch of this shape is stored raw
            modes[idx] = Mode.RAW
            return
    decoded = [np.zeros_like(band) for band in bands] if check_levels else []
    for b, (band, t) in enumerate(zip(bands, tolerances, strict=True)):
        out = blobs[b]
        for j, i in enumerate(idx):
            if not ok[j]:
                continue
            data = np.ascontiguousarray(band[j])
            blob = zfpy.compress_numpy(data, tolerance=float(t))
            if verify != "none":
                back = zfpy.decompress_numpy(blob)
                if not np.abs(back - data).max() <= t:
                    ok[j] = False
                    continue
                if check_levels:
                    decoded[b][j] = back
                amax[i, b] = float(np.abs(back).max()) if back.size else 0.0
            else:
                amax[i, b] = (float(np.abs(data).max()) if data.size else 0.0) + float(t)
            out[i] = blob
    if check_levels and ok.any():
        sel = np.flatnonzero(ok)
        got = wavelet.inverse_levels(
            wavelet.unpack([d[sel] for d in decoded], xs.shape[1:], levels), levels
        )
        # what decode gives against what reference gives, both clipped and rounded to the
        # dtype, with the margin kept back for reads that leave bands out
        room = (tol - margin[sel]).reshape((-1,) + (1,) * len(axes))
        for k in range(levels):
            want = _in_range(exact[k][sel], x.dtype).astype(np.float64)
            err = np.abs(_in_range(got[k], x.dtype).astype(np.float64) - want)
            ok[sel[~(err <= room).all(axis=axes)]] = False
    modes[idx[~ok]] = Mode.RAW


def _encode_wide(
    x: np.ndarray,
    patch: tuple[int, ...],
    finite: np.ndarray,
    tol: float,
    modes: np.ndarray,
    blobs: list[list[bytes | None]],
    verify: str,
    amax: np.ndarray,
) -> None:
    """The finite patches left RAW, encoded again keeping :data:`bound.WIDE_SAFETY` of *tol*
    for rounding (their bands get the rest), so that a tolerance a few tens of units in the
    last place of the data's magnitude (1e-3 on float32 values near 2,000) still gives
    bands: a RAW patch is read whole at every level.  A patch so encoded is kept where its
    bands hold no more bytes than the patch deflated (near its precision, data with many
    repeated values deflates smaller, and stays RAW); those whose margin exceeds even that
    part, or whose zfp streams overshoot, stay RAW too."""
    redo = np.flatnonzero((modes == Mode.RAW) & finite)
    if not redo.size:
        return
    n = redo.size
    levels = len(blobs)
    sub_modes = np.full(n, Mode.WAVELET, dtype=np.uint8)
    sub_blobs: list[list[bytes | None]] = [[b""] * n for _ in range(levels)]
    sub_amax = np.full((n, levels), np.inf)
    wide = bound.band_tolerances(tol, patch, safety=bound.WIDE_SAFETY)
    _encode_wavelet(
        x[redo],
        np.ones(n, dtype=bool),
        tol,
        wide,
        sub_modes,
        sub_blobs,
        verify,
        sub_amax,
        safety=bound.WIDE_SAFETY,
    )
    for j in np.flatnonzero(sub_modes == Mode.WAVELET):
        i = redo[j]
        if sum(len(sub_blobs[b][j] or b"") for b in range(levels)) > len(_deflate(x[i])):
            continue
        modes[i] = Mode.WAVELET
        amax[i] = sub_amax[j]
        for b in range(levels):
            blobs[b][i] = sub_blobs[b][j]


#: the integer lifting may grow magnitudes by up to 2 per axis and level
#: (one more bit for the rounding offsets): integers of a patch must stay
#: below 2**(62 - ndim * (levels - 1) - 1) for the approximations to be exact
def _integer_limit(ndim: int, levels: int) -> int:
    return 61 - ndim * (levels - 1)


def _integer_form(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Patches as int64 ``X`` with ``x = X * 2**e`` exactly: (X, e, fits) per patch.

    ``e`` is the lowest set bit of any value's binary expansion, so ``X`` is
    as small as it can be; ``fits`` is False where ``X`` would not leave
    the integer transform room (or the patch has NaN or infinity).
    """
    n = x.shape[0]
    axes = _axes(x)
    xf = x.astype(np.float64)
    finite_values = np.isfinite(xf)
    # -0.0 would come back as +0.0: such patches are stored raw
    fits = finite_values.all(axis=axes) & ~(np.signbit(xf) & (xf == 0)).any(axis=axes)
    xf = np.where(finite_values, xf, 0.0)
    mant, exp = np.frexp(xf)
    m = np.abs(np.ldexp(mant, 53)).astype(np.int64)  # exact: |mant| < 1
    low = m & -m  # the lowest set bit of each mantissa (0 for zeros)
    none = np.iinfo(np.int32).max
    lowexp = np.where(m != 0, np.frexp(low.astype(np.float64))[1] - 1 + exp - 53, none)
    e = lowexp.min(axis=axes) if n else np.zeros(0, dtype=np.int64)
    e = np.where(e == none, 0, e).astype(np.int64)
    top = np.abs(xf).max(axis=axes) if n else np.zeros(0)
    with np.errstate(over="ignore"):
        fits &= np.ldexp(top, -e) < 2.0 ** _integer_limit(x.ndim - 1, levels)
    shape = (n,) + (1,) * (x.ndim - 1)
    scaled = np.ldexp(np.where(fits.reshape(shape), xf, 0.0), -np.where(fits, e, 0).reshape(shape))
    return scaled.astype(np.int64), e.astype(np.int32), fits


def _encode_integer(
    x: np.ndarray,
    finite: np.ndarray,
    levels: int,
    modes: np.ndarray,
    exponents: np.ndarray,
    blobs: list[list[bytes | None]],
    verify: str,
) -> None:
    """Lossless: integer lifting, zfp reversible; patches that do not fit stay RAW."""
    import zfpy

    if not x.shape[0]:
        return
    big, e, fits = _integer_form(x, levels)
    idx = np.flatnonzero(fits & finite)
    if not idx.size:
        return
    c = wavelet.forward(big[idx], levels, integer=True)
    bands = wavelet.pack(c, levels)
    ok = np.ones(idx.size, dtype=bool)
    for b, band in enumerate(bands):
        for j, i in enumerate(idx):
            data = np.ascontiguousarray(band[j])
            blob = zfpy.compress_numpy(data)  # no tolerance, rate or precision: reversible
            if verify != "none" and not np.array_equal(zfpy.decompress_numpy(blob), data):
                ok[j] = False
            blobs[b][i] = blob
    modes[idx[ok]] = Mode.INTEGER
    exponents[idx[ok]] = e[idx[ok]]


# --------------------------------------------------------------------------
# decoding

_ZFP_TYPES = {np.dtype(np.float64): "float64", np.dtype(np.int64): "int64"}


def _zfp_decode(blob: bytes, shape: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """One zfp stream -> array of *shape*; CodecError unless its header says so."""
    try:
        import zfpy
    except ImportError as e:  # (a dependency: an installation without it is broken)
        raise CodecError(f"{what}: zfp data, and zfpy cannot be imported: {e}") from e

    if len(blob) < 16 or blob[:3] != b"zfp":
        raise CodecError(f"{what}: not zfp data (no zfp header)")
    try:
        h = zfpy.header(blob)
    except Exception as e:  # zfpy raises assorted types
        raise CodecError(f"{what}: unreadable zfp header: {e}") from e
    dims = [h["nw"], h["nz"], h["ny"], h["nx"]]
    got = tuple(int(n) for n in dims if n)
    if got != shape or np.dtype(h["type"]) != dtype:
        raise CodecError(
            f"{what}: the zfp stream holds {np.dtype(h['type'])} of shape {got}, "
            f"expected {dtype} of shape {shape}"
        )
    # zfp reads as far as the header's mode takes it: a mode that lets a block take more than
    # the stream's bound (a forged fixed rate of 32,768 bits a block) read past the buffer
    _, _, per_block, header_bits = zfp_header(blob, what)
    need = zfp_need(shape, per_block, header_bits)
    if need > zfp_bound(shape):
        raise CodecError(
            f"{what}: the zfp header lets a block of the stream take {per_block} bits, more "
            f"than a band of shape {shape} can hold"
        )
    data = blob if len(blob) >= need else blob + bytes(need - len(blob))
    try:
        out = zfpy.decompress_numpy(data)
    except Exception as e:  # zfpy raises assorted types
        raise CodecError(f"{what}: zfp decompression failed: {e}") from e
    return np.asarray(out).reshape(shape)


def _in_range(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Level values of finite data (float64) in *dtype*: clipped to its finite range, rounded.

    Infinities (from float64 overflow of finite data) become the largest
    finite value of their sign too.
    """
    top = float(np.finfo(dtype).max)
    return np.clip(v, -top, top).astype(dtype)


def _from_values(x: np.ndarray, level: int, levels: int) -> np.ndarray:
    """Level *level* of patches *x* computed from their values, as lossless storage reads it.

    The exact approximation (:func:`lamina.multires.wavelet.approximation`),
    finite values clipped to the finite range of the data's dtype and
    rounded to it; infinite values (only infinite data gives them) and NaN
    stay.  A patch whose finite values exceed
    :func:`lamina.multires.bound.float64_headroom` is transformed scaled
    down by its power of two, so the float64 passes cannot overflow.
    """
    if level == 0:
        return x.copy()
    n = x.shape[0]
    e = bound.headroom_exponent(x.ndim - 1, levels)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and infinity propagate
        top = np.where(np.isfinite(x), np.abs(x), 0).max(axis=_axes(x)) if n else np.zeros(0)
        top = top.astype(np.float64)
        scale = np.where(top > bound.float64_headroom(x.ndim - 1, levels), -e, 0)
        scale = scale.reshape((n,) + (1,) * (x.ndim - 1))
        scaled = scale.any()
        a = wavelet.approximation(np.ldexp(x.astype(np.float64), scale) if scaled else x, level)
        limit = np.ldexp(float(np.finfo(x.dtype).max), scale)
        out = np.where(np.isinf(a), a, np.clip(a, -limit, limit))
        if scaled:
            out = np.ldexp(out, -scale)
        return out.astype(x.dtype)


def _inflate(blob: bytes, nbytes: int, what: str) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(blob, nbytes + 1)
    except zlib.error as e:
        raise CodecError(f"{what}: corrupt raw patch: {e}") from e
    if len(out) != nbytes or not d.eof or d.unused_data:
        raise CodecError(f"{what}: a raw patch holds {nbytes} bytes; the stored data does not")
    return out


def _bands(enc: Encoded, idx: np.ndarray, level: int, dtype: np.dtype) -> list[np.ndarray | None]:
    """Decoded bands *level* .. L-1 of patches *idx*, stacked."""
    out: list[np.ndarray | None] = [None] * enc.levels
    for b in range(level, enc.levels):
        shape = wavelet.band_shape(enc.shape, enc.levels, b)
        arr = np.empty((idx.size, *shape), dtype=dtype)
        for j, i in enumerate(idx):
            blob = enc.blobs[b][i]
            if blob is None:  # left out by the reader: its coefficients read as 0
                arr[j] = 0
            else:
                arr[j] = _zfp_decode(blob, shape, dtype, f"band {b} of patch {i}")
        out[b] = arr
    return out


def _decode_wavelet(enc: Encoded, idx: np.ndarray, level: int) -> np.ndarray:
    bands = _bands(enc, idx, level, np.dtype(np.float64))
    c = wavelet.unpack(bands, enc.shape, enc.levels, level)
    return wavelet.inverse(c, enc.levels, level)


def skippable(amax: np.ndarray, ndim: int, slack: float, level: int = 0) -> np.ndarray:
    """Which bands a read of *level* may leave out and stay within *slack* more error.

    Leaving out band ``b`` of a patch reads its coefficients as 0, which
    moves them by at most ``amax[b]`` (the largest magnitude stored); by the
    bound of :mod:`.bound` a level ``k <= b`` moves by at most ``w_b
    amax[b]`` more.  Per patch, bands are left out finest first (``level``,
    ``level + 1``, ...) while the sum of ``w_b amax[b]`` stays within
    *slack* (less the sliver ``bound.READ_SAFETY`` of it kept for rounding
    the values to the dtype); the coarsest approximation is always read.

    Parameters
    ----------
    amax
        ``(npatches, levels)`` largest coefficient magnitudes (inf: unknown,
        never left out).
    ndim
        The data's number of dimensions.
    slack
        The error allowed on top of the written tolerance: a read tolerance
        minus the written one.
    level
        The level read.

    Returns
    -------
    numpy.ndarray
        bool ``(npatches, levels)``: True where a band may be left out.
    """
    a = np.asarray(amax, dtype=np.float64)
    out = np.zeros(a.shape, dtype=bool)
    if not slack > 0 or a.shape[1] < 2:
        return out
    w = bound.weights(ndim, a.shape[1])
    cost = np.cumsum((w * a)[:, level:-1], axis=1)  # leaving out bands level .. b
    # a sliver of the slack stays for rounding the values moved to the dtype
    out[:, level:-1] = cost <= slack * (1 - bound.READ_SAFETY)
    return out


def decode(enc: Encoded, level: int = 0, patches: Sequence[int] | None = None) -> np.ndarray:
    """Read *level* of the patches of *enc* back.

    Parameters
    ----------
    enc
        What :func:`encode` gave (or the same rebuilt from storage).
    level
        0 (full resolution) to ``enc.levels - 1``.
    patches
        Indices of the patches to decode; default all.

    Returns
    -------
    numpy.ndarray
        ``(len(patches), *ceil(shape / 2**level))`` in the data's dtype:
        the float64 values of the transform rounded to it, clipped to its
        finite range where finite data gives values beyond it (see the
        module docstring); a patch stored raw gives exactly what
        :func:`reference` gives.

    Raises
    ------
    BoundsError
        If *level* does not exist.
    CodecError
        If stored bytes do not decode to what the patch holds.
    """
    level = wavelet.check_level(level, enc.levels)
    sel = np.arange(enc.npatches) if patches is None else np.asarray(patches, dtype=np.int64)
    out = np.empty((sel.size, *wavelet.level_shape(enc.shape, level)), dtype=enc.dtype)
    modes = enc.modes[sel]
    j = np.flatnonzero(modes == Mode.WAVELET)
    if j.size:
        out[j] = _in_range(_decode_wavelet(enc, sel[j], level), enc.dtype)
    j = np.flatnonzero(modes == Mode.INTEGER)
    if j.size:
        bands = _bands(enc, sel[j], level, np.dtype(np.int64))
        c = wavelet.unpack(bands, enc.shape, enc.levels, level)
        big = wavelet.inverse(c, enc.levels, level, integer=True)
        e = enc.exponents[sel[j]].reshape((-1,) + (1,) * len(enc.shape))
        with np.errstate(over="ignore"):  # clipped below
            out[j] = _in_range(np.ldexp(big.astype(np.float64), e), enc.dtype)
    j = np.flatnonzero(modes == Mode.RAW)
    if j.size:
        nbytes = math.prod(enc.shape) * enc.dtype.itemsize
        raw = np.stack(
            [
                np.frombuffer(
                    _inflate(enc.blobs[enc.levels - 1][i], nbytes, f"patch {i}"), dtype=enc.dtype
                ).reshape(enc.shape)
                for i in sel[j]
            ]
        )
        out[j] = _from_values(raw, level, enc.levels)
    return out


def reference(x: np.ndarray, patch: Sequence[int], level: int, tolerance: float) -> np.ndarray:
    """The exact level-*level* approximation that :func:`decode` is bounded against.

    In the data's dtype, as lossless storage reads it: for a tolerance > 0
    the float transform's approximation
    (:func:`lamina.multires.wavelet.approximation`, float64) rounded to the
    dtype; for tolerance 0 the integer transform's approximation scaled
    back for patches that take the integer path, else the float one, each
    rounded to the dtype.  Finite data's values beyond the dtype's finite
    range are clipped to its largest finite value of that sign, as
    :func:`decode` clips them.  A patch stored raw decodes to exactly this;
    a compressed one to within the tolerance of it
    (:mod:`lamina.multires.bound`).
    """
    x = np.asarray(x)
    _, p = _check_data(x, patch)
    levels = wavelet.nlevels(p)
    wavelet.check_level(level, levels)
    out = _from_values(x, level, levels)
    if bound.check_tolerance(tolerance) > 0:
        return out
    big, e, fits = _integer_form(x, levels)
    if fits.any():
        a = wavelet.approximation(big[fits], level, integer=True)
        scale = e[fits].reshape((-1,) + (1,) * (x.ndim - 1))
        with np.errstate(over="ignore"):  # clipped
            out[fits] = _in_range(np.ldexp(a.astype(np.float64), scale), x.dtype)
    return out


# --------------------------------------------------------------------------
# whole arrays


@dataclass
class EncodedArray:
    """A whole array encoded patch by patch: one :class:`Encoded` per patch shape."""

    shape: tuple[int, ...]
    patch: tuple[int, ...]
    batches: list[tuple[patches.Batch, Encoded]]

    @property
    def levels(self) -> int:
        return wavelet.nlevels(self.patch)

    def nbytes(self, level: int = 0) -> int:
        """Bytes a reader of *level* of the whole array reads."""
        return sum(enc.nbytes(level) for _, enc in self.batches)


def encode_array(
    array: np.ndarray,
    patch: Sequence[int],
    tolerance: float,
    *,
    verify: str = "coefficients",
    optimism: float = 1.0,
) -> EncodedArray:
    """Cut *array* into patches (:func:`lamina.multires.patches.cut`) and :func:`encode` each batch."""
    array = np.asarray(array)
    p = wavelet.check_patch(patch)
    out = []
    for batch in patches.cut(array, p):
        enc = encode(batch.data, p, tolerance, verify=verify, optimism=optimism)
        out.append((patches.Batch(batch.shape, batch.coords, np.empty(0)), enc))
    return EncodedArray(tuple(array.shape), p, out)


def decode_array(enc: EncodedArray, level: int = 0) -> np.ndarray:
    """Level *level* of an array encoded by :func:`encode_array`: shape ``ceil(shape / 2**level)``."""
    level = wavelet.check_level(level, enc.levels)
    parts = [patches.Batch(b.shape, b.coords, decode(e, level)) for b, e in enc.batches]
    return patches.join(parts, enc.shape, enc.patch, level)


def reference_array(
    array: np.ndarray, patch: Sequence[int], level: int, tolerance: float
) -> np.ndarray:
    """The exact level-*level* approximation of a whole array (:func:`reference` per patch)."""
    array = np.asarray(array)
    p = wavelet.check_patch(patch)
    parts = [
        patches.Batch(b.shape, b.coords, reference(b.data, p, level, tolerance))
        for b in patches.cut(array, p)
    ]
    return patches.join(parts, array.shape, p, level)
