"""The CDF 5/3 lifting wavelet on batches of patches: forward, inverse, levels, bands.

The transform
-------------
One step of the CDF 5/3 (linear B-spline) wavelet splits a signal ``x`` of
length ``m`` into ``ceil(m/2)`` approximation values ``s`` (at the even
samples) and ``floor(m/2)`` details ``d`` (at the odd samples) by two
lifting steps::

    predict  d[i] = x[2i+1] - (x[2i] + x[2i+2]) / 2
    update   s[i] = x[2i]   + (d[i-1] + d[i]) / 4

so ``s`` is a local weighted mean of ``x`` (weights -1/8, 1/4, 3/4, 1/4,
-1/8: they sum to one, so the approximations are in the units of the data)
and ``d`` is what linear interpolation between the even samples misses.
The inverse undoes the steps in reverse order::

    x[2i]   = s[i] - (d[i-1] + d[i]) / 4
    x[2i+1] = d[i] + (x[2i] + x[2i+2]) / 2

In N dimensions a step applies the 1-D step along each axis in turn
(separable), on the current approximation only (Mallat layout): the
coefficient array has the patch's shape, the approximation of level ``k``
sits in its leading corner of shape ``ceil(patch / 2**k)``, and the details
of the step from level ``k`` to ``k + 1`` fill the rest of the corner of
level ``k``.

Levels are numbered as in OME-Zarr: level 0 is full resolution and level
``k`` has shape ``ceil(shape / 2**k)``.  A patch whose smallest edge is
``2**n`` has ``n + 1`` levels (:func:`nlevels`); at the last one a cubic
patch is a single value.

Edges and partial patches
-------------------------
Every patch is transformed on its own, so a patch is decoded without its
neighbours.  At a patch's edges the signal is extended symmetrically about
the edge sample (``x[-1] = x[1]``, ``x[m] = x[m-2]``), as in JPEG 2000.
This needs no sample outside the patch and works for *any* length ``m``,
even or odd, so a partial patch at the dataset's boundary (a patch that
the dataset's shape cuts short) is transformed at its true extent: it is
neither padded nor extrapolated (idx2 extrapolates to a full patch, which
stores values nobody wrote).  A partial patch of extent ``m`` has
``ceil(m / 2**k)`` values at level ``k``; since full patches have
``patch / 2**k``, the patches of a dataset of shape ``N`` give exactly
``ceil(N / 2**k)`` values at level ``k``: no padding is ever visible.

Levels of a dataset are therefore made of per-patch approximations, which
differ from those of one transform over the whole dataset near patch
edges; :func:`approximation` defines "the exact level-k approximation" a
reader of level ``k`` gets when nothing is compressed.

Exact integers for lossless storage
-----------------------------------
With ``integer=True`` the lifting steps round their updates down
(JPEG 2000's reversible 5/3)::

    d[i] = x[2i+1] - floor((x[2i] + x[2i+2]) / 2)
    s[i] = x[2i]   + floor((d[i-1] + d[i] + 2) / 4)

on int64 arrays.  The inverse recomputes the same rounded updates from the
same values and subtracts them, so it restores the input bit for bit (in
wrap-around int64 arithmetic, even if a value overflowed).  The float
transform is not exactly invertible in floating point; it is what lossy
storage uses, and its rounding is accounted for in :mod:`lamina.multires.bound`.

Bands
-----
A patch's coefficients are stored as ``nlevels`` bands: band ``L - 1`` is
the coarsest approximation; band ``b < L - 1`` holds the details of the
step from level ``b`` to ``b + 1`` (``2**ndim - 1`` sub-bands).  A reader of
level ``k`` needs bands ``k .. L - 1`` only.  :func:`pack` lays the
sub-bands of a band side by side along the first axis, each padded to the
largest one's shape by repeating its edge values (a padding that is
dropped again by :func:`unpack`), so a band is one rectangular array.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import BoundsError, ShapeError

#: dimensions the transform is tested for and zfp compresses
MAX_NDIM = 4


def check_patch(patch: Sequence[int]) -> tuple[int, ...]:
    """Validate a patch shape: 1 to 4 edges, each a power of two.

    Parameters
    ----------
    patch
        Edge lengths of a full patch.

    Returns
    -------
    tuple of int
        The patch shape.

    Raises
    ------
    ShapeError
        If an edge is not a power of two (1 included) or the patch has no
        dimension or more than :data:`MAX_NDIM`.
    """
    p = tuple(int(n) for n in patch)
    if not 1 <= len(p) <= MAX_NDIM:
        raise ShapeError(f"patches have 1 to {MAX_NDIM} dimensions, not {len(p)} ({p})")
    for d, n in enumerate(p):
        if n < 1 or n & (n - 1):
            raise ShapeError(f"patch edge {n} (dimension {d} of patch {p}) is not a power of two")
    return p


def nlevels(patch: Sequence[int]) -> int:
    """Number of levels of a patch: ``log2(min edge) + 1``.

    Parameters
    ----------
    patch
        Full patch shape, each edge a power of two.

    Returns
    -------
    int
        Levels 0 (full resolution) to ``log2(min(patch))``.
    """
    p = check_patch(patch)
    return min(p).bit_length()


def level_shape(shape: Sequence[int], level: int) -> tuple[int, ...]:
    """Shape at *level* of an array of *shape*: ``ceil(shape / 2**level)``."""
    if level < 0:
        raise BoundsError(f"level {level} does not exist: levels start at 0")
    return tuple(-(-int(n) // (1 << level)) for n in shape)


def check_level(level: int, levels: int) -> int:
    """*level* as an int; BoundsError naming the levels there are if it is not one of them."""
    level = int(level)
    if not 0 <= level < levels:
        raise BoundsError(f"level {level} does not exist: there are levels 0 to {levels - 1}")
    return level


def _check_batch(x: np.ndarray, patch: Sequence[int] | None, what: str) -> tuple[int, ...]:
    """Shape of one patch of batch *x* (patches along axis 0), checked against the full *patch*."""
    if x.ndim < 2:
        raise ShapeError(
            f"{what} needs a batch of patches of shape (npatches, *patch), got shape {x.shape}"
        )
    shape = tuple(x.shape[1:])
    if patch is not None:
        p = check_patch(patch)
        if len(p) != len(shape) or any(a > b or a < 1 for a, b in zip(shape, p, strict=True)):
            raise ShapeError(
                f"{what}: patches of shape {shape} do not fit in the patch {p} "
                "(each edge must be 1 to the patch's edge)"
            )
    elif len(shape) > MAX_NDIM or min(shape) < 1:
        raise ShapeError(f"{what}: patches of shape {shape} are empty or have too many dimensions")
    return shape


# --------------------------------------------------------------------------
# one lifting step along one axis (axis 0 of the views below), from src to dst


def _sums(d: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = d[i-1] + d[i]`` for each even sample, mirrored at both ends."""
    ne, no = out.shape[0], d.shape[0]
    np.add(d[0], d[0], out=out[0])
    np.add(d[:-1], d[1:], out=out[1:no])
    if ne > no:
        np.add(d[no - 1], d[no - 1], out=out[no])


def _pairs(ev: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = x[2i] + x[2i+2]`` for each odd sample, mirrored at the end."""
    ne, no = ev.shape[0], out.shape[0]
    if ne > no:
        np.add(ev[:no], ev[1:], out=out)
    else:
        np.add(ev[: no - 1], ev[1:], out=out[: no - 1])
        np.add(ev[no - 1], ev[no - 1], out=out[no - 1])


def _forward_axis(src: np.ndarray, dst: np.ndarray, integer: bool) -> None:
    """One forward step along axis 0: *src* samples -> *dst* ``[s..., d...]`` (same shape)."""
    m = src.shape[0]
    if m < 2:
        dst[...] = src
        return
    ne = (m + 1) // 2
    ev, od = src[0::2], src[1::2]
    s, d = dst[:ne], dst[ne:]
    _pairs(ev, d)
    if integer:
        d >>= 1
        np.subtract(od, d, out=d)
    else:
        d *= -0.5
        d += od
    _sums(d, s)
    if integer:
        s += 2
        s >>= 2
    else:
        s *= 0.25
    s += ev


def _inverse_axis(src: np.ndarray, dst: np.ndarray, integer: bool) -> None:
    """One inverse step along axis 0: *src* ``[s..., d...]`` -> *dst* samples (undoes the forward)."""
    m = src.shape[0]
    if m < 2:
        dst[...] = src
        return
    ne = (m + 1) // 2
    s, d = src[:ne], src[ne:]
    ev, od = dst[0::2], dst[1::2]
    _sums(d, ev)
    if integer:
        ev += 2
        ev >>= 2
    else:
        ev *= 0.25
    np.subtract(s, ev, out=ev)
    _pairs(ev, od)
    if integer:
        od >>= 1
    else:
        od *= 0.5
    od += d


def _corner(shape: Sequence[int]) -> tuple[slice, ...]:
    return (slice(None), *(slice(0, n) for n in shape))


def _work_dtype(x: np.ndarray, integer: bool) -> np.dtype:
    if integer:
        if x.dtype.kind not in "iub":
            raise ShapeError(f"the integer transform needs integer data, not {x.dtype}")
        return np.dtype(np.int64)
    if x.dtype.kind not in "fiub":
        raise ShapeError(f"the transform needs real numbers, not {x.dtype}")
    return np.dtype(np.float64)


def _passes(
    main: np.ndarray, scratch: np.ndarray, box: tuple[int, ...], axes: Sequence[int], step, integer
) -> tuple[np.ndarray, np.ndarray]:
    """Apply *step* along each of *axes* to the corner *box*, between two buffers.

    Each pass reads one buffer and writes the other.  Returns (main,
    scratch) with the result in main: when the corner is the whole array
    the buffers swap, else the corner is copied back.
    """
    corner = _corner(box)
    src, dst = main, scratch
    for axis in axes:
        step(np.moveaxis(src[corner], axis + 1, 0), np.moveaxis(dst[corner], axis + 1, 0), integer)
        src, dst = dst, src
    if src is main:
        return main, scratch
    if tuple(main.shape[1:]) == tuple(box):
        return src, dst
    main[corner] = src[corner]
    return main, scratch


def forward(
    x: np.ndarray,
    levels: int | None = None,
    *,
    patch: Sequence[int] | None = None,
    integer: bool = False,
) -> np.ndarray:
    """Forward transform of a batch of patches (Mallat layout, same shape).

    Parameters
    ----------
    x
        Array of shape ``(npatches, *pshape)``: patches of one shape, full
        or partial (cut short by the dataset's boundary).
    levels
        Number of levels; the transform makes ``levels - 1`` steps.
        Default: ``nlevels(patch)``.
    patch
        The full patch shape; default ``pshape`` (which must then be powers
        of two when *levels* is not given).
    integer
        Use the exactly invertible integer lifting (int64 coefficients);
        *x* must then hold integers.

    Returns
    -------
    numpy.ndarray
        Coefficients, float64 (int64 if *integer*), shape ``x.shape``.

    Raises
    ------
    ShapeError
        If the patches do not fit the patch shape or are not real numbers.
    BoundsError
        If *levels* is not between 1 and the patch's number of levels.
    """
    x = np.asarray(x)
    shape = _check_batch(x, patch, "forward")
    most = nlevels(patch if patch is not None else shape) if levels is None or patch else 0
    nlev = most if levels is None else int(levels)
    if most and nlev > most:
        raise BoundsError(f"level {nlev - 1} does not exist: there are levels 0 to {most - 1}")
    if nlev < 1:
        raise BoundsError(f"a transform has at least 1 level, not {nlev}")
    main = np.array(x, dtype=_work_dtype(x, integer), copy=True)
    scratch = np.empty_like(main)
    for step in range(1, nlev):
        box = level_shape(shape, step - 1)
        main, scratch = _passes(main, scratch, box, range(len(shape)), _forward_axis, integer)
    return main


def inverse(
    c: np.ndarray,
    levels: int,
    level: int = 0,
    *,
    integer: bool = False,
) -> np.ndarray:
    """Inverse transform of a batch of coefficient arrays, down to *level*.

    Parameters
    ----------
    c
        Coefficients of shape ``(npatches, *pshape)`` from :func:`forward`
        (or decoded from storage); bands finer than *level* are not read.
    levels
        The number of levels *c* was made with.
    level
        The level to reconstruct: 0 is full resolution.
    integer
        Invert the integer lifting (int64 coefficients).

    Returns
    -------
    numpy.ndarray
        Shape ``(npatches, *ceil(pshape / 2**level))``, float64 (int64 if
        *integer*).

    Raises
    ------
    BoundsError
        If *level* is not one of the *levels*.
    """
    c = np.asarray(c)
    shape = _check_batch(c, None, "inverse")
    level = check_level(level, levels)
    main = np.array(c[_corner(level_shape(shape, level))], dtype=_work_dtype(c, integer), copy=True)
    scratch = np.empty_like(main)
    for step in range(levels - 1, level, -1):
        box = level_shape(shape, step - 1)
        axes = reversed(range(len(shape)))
        main, scratch = _passes(main, scratch, box, list(axes), _inverse_axis, integer)
    return main


def forward_levels(x: np.ndarray, levels: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """:func:`forward`, also returning the exact approximation of every level on the way.

    Returns
    -------
    tuple
        The coefficients, and ``levels`` arrays: entry ``k`` equals
        ``approximation(x, k)`` bit for bit (it is the same computation).
    """
    x = np.asarray(x)
    shape = _check_batch(x, None, "forward_levels")
    main = np.array(x, dtype=np.float64, copy=True)
    scratch = np.empty_like(main)
    out = [main.copy()]
    for step in range(1, levels):
        main, scratch = _passes(
            main, scratch, level_shape(shape, step - 1), range(len(shape)), _forward_axis, False
        )
        out.append(main[_corner(level_shape(shape, step))].copy())
    return main, out


def forward_magnitudes(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`forward`, also returning the largest magnitude of every level on the way.

    Returns
    -------
    tuple
        The coefficients (those of :func:`forward`, bit for bit), and an
        array ``(npatches, levels)`` whose entry ``[i, k]`` is the largest
        absolute value of ``approximation(x, k)[i]`` (NaN where it holds NaN).
    """
    x = np.asarray(x)
    shape = _check_batch(x, None, "forward_magnitudes")
    main = np.array(x, dtype=np.float64, copy=True)
    scratch = np.empty_like(main)
    axes = tuple(range(1, main.ndim))
    out = np.empty((main.shape[0], levels))
    out[:, 0] = np.abs(main).max(axis=axes)
    for step in range(1, levels):
        main, scratch = _passes(
            main, scratch, level_shape(shape, step - 1), range(len(shape)), _forward_axis, False
        )
        out[:, step] = np.abs(main[_corner(level_shape(shape, step))]).max(axis=axes)
    return main, out


def inverse_levels(c: np.ndarray, levels: int) -> list[np.ndarray]:
    """Every level of :func:`inverse` from one pass: entry ``k`` equals ``inverse(c, levels, k)``."""
    c = np.asarray(c)
    shape = _check_batch(c, None, "inverse_levels")
    main = np.array(c, dtype=np.float64, copy=True)
    scratch = np.empty_like(main)
    out = [main[_corner(level_shape(shape, levels - 1))].copy()]
    for step in range(levels - 1, 0, -1):
        box = level_shape(shape, step - 1)
        main, scratch = _passes(
            main, scratch, box, list(reversed(range(len(shape)))), _inverse_axis, False
        )
        out.append(main[_corner(box)].copy())
    return out[::-1]


def approximation(x: np.ndarray, level: int, *, integer: bool = False) -> np.ndarray:
    """The exact level-*level* approximation of a batch of patches.

    The approximation coefficients after *level* forward steps, in
    float64; what a reader of *level* gets when nothing is compressed is
    this rounded to the data's dtype and clipped to its finite range
    (:func:`lamina.multires.compress.reference`).

    Parameters
    ----------
    x
        Patches, shape ``(npatches, *pshape)``.
    level
        0 (the data itself, as float64) up to the last level of the patch.
    integer
        The approximation of the integer lifting.

    Returns
    -------
    numpy.ndarray
        Shape ``(npatches, *ceil(pshape / 2**level))``.
    """
    x = np.asarray(x)
    shape = _check_batch(x, None, "approximation")
    if level < 0:
        raise BoundsError(f"level {level} does not exist: levels start at 0")
    c = forward(x, level + 1, integer=integer)
    return c[_corner(level_shape(shape, level))].copy()


# --------------------------------------------------------------------------
# bands


def _subbands(ndim: int) -> list[tuple[int, ...]]:
    """The detail sub-bands: every low (0) / high (1) choice per axis but all-low."""
    return [tuple((i >> (ndim - 1 - a)) & 1 for a in range(ndim)) for i in range(1, 1 << ndim)]


def band_shape(shape: Sequence[int], levels: int, band: int) -> tuple[int, ...]:
    """Shape of one patch's packed *band* (see :func:`pack`) for patches of *shape*."""
    band = check_level(band, levels)
    if band == levels - 1:
        return level_shape(shape, band)
    half = level_shape(shape, band + 1)
    return ((len(_subbands(len(shape)))) * half[0], *half[1:])


def band_size(shape: Sequence[int], levels: int, band: int) -> int:
    """Number of coefficients *band* holds for one patch of *shape* (without padding)."""
    band = check_level(band, levels)
    if band == levels - 1:
        return math.prod(level_shape(shape, band))
    return math.prod(level_shape(shape, band)) - math.prod(level_shape(shape, band + 1))


def _subband_slices(
    shape: Sequence[int], band: int
) -> list[tuple[tuple[slice, ...], tuple[int, ...]]]:
    """(slices into a coefficient array, shape) of each detail sub-band of *band*."""
    outer, half = level_shape(shape, band), level_shape(shape, band + 1)
    out = []
    for sb in _subbands(len(shape)):
        sl = tuple(
            slice(h, n) if hi else slice(0, h) for hi, h, n in zip(sb, half, outer, strict=True)
        )
        out.append(((slice(None), *sl), tuple(s.stop - s.start for s in sl)))
    return out


def pack(c: np.ndarray, levels: int) -> list[np.ndarray]:
    """Split a batch of coefficient arrays into its bands, each one rectangular array.

    Parameters
    ----------
    c
        Coefficients ``(npatches, *pshape)`` from :func:`forward`.
    levels
        The number of levels of the transform.

    Returns
    -------
    list of numpy.ndarray
        ``levels`` arrays, band ``b`` of shape ``(npatches, *band_shape(pshape,
        levels, b))``; band ``levels - 1`` is the coarsest approximation.
        Sub-bands shorter than the band's half shape (odd extents) are padded
        by repeating their edge values, empty ones with zeros.
    """
    shape = _check_batch(c, None, "pack")
    n = c.shape[0]
    out = []
    for band in range(levels - 1):
        half = level_shape(shape, band + 1)
        packed = np.empty((n, *band_shape(shape, levels, band)), dtype=c.dtype)
        for i, (sl, sub) in enumerate(_subband_slices(shape, band)):
            dst = packed[:, i * half[0] : (i + 1) * half[0]]
            if sub == half:
                dst[...] = c[sl]
            elif min(sub) == 0:
                dst[...] = 0
            else:
                pad = [(0, 0)] + [(0, h - s) for h, s in zip(half, sub, strict=True)]
                dst[...] = np.pad(c[sl], pad, mode="edge")
        out.append(packed)
    out.append(c[_corner(level_shape(shape, levels - 1))].copy())
    return out


def unpack(
    bands: Sequence[np.ndarray | None], shape: Sequence[int], levels: int, level: int = 0
) -> np.ndarray:
    """Coefficient arrays from bands *level* .. ``levels - 1`` (finer bands left zero).

    Parameters
    ----------
    bands
        ``levels`` packed band arrays as :func:`pack` gives them; those
        below *level* may be None.
    shape
        The patches' shape.
    levels
        The number of levels.
    level
        The finest band given.

    Returns
    -------
    numpy.ndarray
        ``(npatches, *shape)`` coefficients, ready for :func:`inverse` down
        to *level*.
    """
    shape = tuple(int(s) for s in shape)
    level = check_level(level, levels)
    if len(bands) != levels:
        raise ShapeError(f"{len(bands)} bands given for a transform of {levels} levels")
    last = bands[levels - 1]
    if last is None:
        raise ShapeError("the coarsest band (the approximation) is missing")
    n = last.shape[0]
    c = np.zeros((n, *shape), dtype=last.dtype)
    c[_corner(level_shape(shape, levels - 1))] = last
    for band in range(level, levels - 1):
        b = bands[band]
        if b is None:
            raise ShapeError(f"band {band} is missing to reconstruct level {level}")
        half = level_shape(shape, band + 1)
        want = (n, *band_shape(shape, levels, band))
        if b.shape != want:
            raise ShapeError(f"band {band} has shape {b.shape}, expected {want}")
        for i, (sl, sub) in enumerate(_subband_slices(shape, band)):
            src = b[:, i * half[0] : (i + 1) * half[0]]
            c[sl] = src[(slice(None), *(slice(0, s) for s in sub))]
    return c
