"""Per-band zfp tolerances that bound the error of every level by one tolerance.

The guarantee
-------------
Given a tolerance ``tol > 0``, a patch stored with the tolerances of
:func:`band_tolerances` (or losslessly, see *Rounding*) reads back so that
every value at level ``k`` differs by at most ``tol`` from the exact
level-``k`` approximation (:func:`lamina.multires.wavelet.approximation`)
rounded to the dataset's dtype (and clipped to its finite range, see
*Overflow*): what :func:`lamina.multires.compress.reference` gives.  At
level 0 that is the written value itself.

Values read have the dataset's dtype, and a coarser level of float32 data
is rarely a float32, so against the unrounded approximation ``a`` the
bound is ``tol`` plus half a unit in the last place of the dtype at ``a``.
For float64 data the approximation is float64 and rounding changes nothing.

Proof
-----
Let ``L`` be the number of levels and ``d`` the number of dimensions.
Storage quantizes band ``b`` (:mod:`lamina.multires.wavelet`) with zfp's
fixed-accuracy mode at tolerance ``t_b``, so every coefficient of band
``b`` is off by at most ``t_b`` (see *zfp's side* below for why this is
checked rather than trusted).  Write ``e_k`` for the largest error at
level ``k`` after the inverse transform (in exact arithmetic first).

*One axis.*  The inverse lifting step along one axis computes::

    x[2i]   = s[i] - d[i-1]/4 - d[i]/4
    x[2i+1] = s[i]/2 + s[i+1]/2 - d[i-1]/8 + 3 d[i]/4 - d[i+1]/8

(substituting the even samples into the odd ones).  At the ends the
symmetric extension folds a missing neighbour onto one that exists
(``d[-1] = d[0]``, ``x[m] = x[m-2]``), so weights of one input merge; a
merged weight's absolute value is at most the sum of the two, so the
absolute row sums can only drop (for two samples, ``x[1] = s[0] + d[0]/2``).
The absolute row sums are therefore at most ``1`` over the approximation
inputs and at most ``1`` over the detail inputs, with equality on interior
odd rows (even rows: ``1`` and ``1/2``).  In L-infinity operator norm the
step is the map ``(s, d) -> x`` with ``||x||_inf <= ||s||_inf + ||d||_inf``,
and this is attained (errors of the signs of the weights).

*One level in d dimensions.*  The separable inverse step applies the
one-axis step along each axis in turn.  Its output is a sum over the
``2**d`` sub-bands ``sigma`` (low or high along each axis) of a product
filter whose absolute weights sum to the product of the per-axis sums,
each at most ``1``.  So with ``E_sigma`` the largest error in sub-band
``sigma``::

    e_k <= E_low...low + sum over the 2**d - 1 detail sub-bands E_sigma
        <= e_{k+1} + (2**d - 1) t_k

(the approximation at level ``k + 1`` *is* the all-low sub-band), and the
constant ``2**d - 1`` is attained at points odd along every axis.

*All levels.*  The coarsest approximation is band ``L - 1`` itself:
``e_{L-1} <= t_{L-1}``.  By induction::

    e_k <= t_{L-1} + (2**d - 1) * (t_k + t_{k+1} + ... + t_{L-2})

which is largest at ``k = 0``.  (Each step's constant is attained; over
several steps the worst sign patterns of the steps differ, so the sum may
overestimate: with equal tolerances the largest row sum of the composed
inverse is 3.5 against the bound 4 for an 8-sample 1-D patch, 8.25
against 10 for 8 x 8, 10.4 against 15 for 4 x 4 x 4.)  :func:`band_tolerances` chooses ``t_b``
with ``sum_b w_b t_b = (1 - SAFETY) tol`` where ``w_b = 2**d - 1`` for
detail bands and ``w_{L-1} = 1``, so ``e_k <= (1 - SAFETY) tol`` for every
``k``.  Sub-bands that a partial patch leaves empty only remove terms.

*Rounding.*  The transform runs in float64; decoding clips a level's
values to the dtype's finite range and rounds them to the dtype, as
:func:`~lamina.multires.compress.reference` does with the exact
approximation they are compared with.  Clipping moves two values no
further apart; rounding moves a value ``v`` by at most half a unit in the
last place ``ulp(v)`` of the dtype at ``v``.  Let ``M`` be the largest
magnitude of the patch's data, its coefficients and its approximations at
every level (:func:`lamina.multires.wavelet.forward_magnitudes`).  The
exact value is at most ``M`` in magnitude and the one decoded at most
``M + tol``, so the two roundings add at most ``ulp(M + tol)``.  The
float64 passes (at most ``d (L - 1)`` forward and as many inverse, three
roundings per value each, spread with the same weights as above, at most
``2**d`` per level) add at most ``3 d 2**d (L - 1) 2**-53 M' < 2**-36 M'``
with ``M'`` the largest magnitude of the values they compute
(:func:`rounding_margin` takes twice the ulp, and a further factor on the
float64 term for the intermediate values of a step).  Encoding tries a
patch whose margin exceeds ``SAFETY * tol`` again with band tolerances
summing to ``(1 - WIDE_SAFETY) tol`` (the same proof with ``WIDE_SAFETY``
for ``SAFETY``), and stores a patch whose margin exceeds
``WIDE_SAFETY * tol`` too losslessly instead (``tol`` within a few units
in the last place of the data's magnitude, where compressing gains
nothing).  Level 0 of such a patch is then the written
data bit for bit, and level ``k`` is computed from it on reading: the
exact approximation rounded to the dtype, which is what the bound compares
with, so its error is 0.  Against the unrounded approximation a coarser
level of such float32 data is off by up to half a unit in the last place,
more than ``tol`` when ``tol`` is below that.

So every level reads back within ``(1 - SAFETY) tol + SAFETY tol = tol``
(``WIDE_SAFETY`` alike).

*Reads that leave bands out.*  A read at a looser tolerance ``t`` reads the
coefficients of whole bands as 0 (:func:`lamina.multires.compress.skippable`),
which moves a level by at most ``(1 - READ_SAFETY) s`` before rounding
(``s = t - tol``).  The value decoded is then at most ``M + tol + s`` in
magnitude: rounding it costs at most ``ulp(M + tol)`` if ``s <= M + tol``,
which the factor 2 in the margin covers, and otherwise at most ``ulp(s)``,
below the ``READ_SAFETY s`` kept back.  Such a read is within ``t``
(patches encoded with ``optimism`` keep the same room: each of their
levels is checked against ``tol`` less the patch's margin).

*Overflow.*  The approximation weights' absolute values sum to more than 1,
so a level of finite data near the largest finite value of the dtype can
exceed it (float32 data near ``+-3.4e38``).  Such values are clipped to the
largest finite value of their sign: in the values read, in the level's
statistics (computed from them) and in
:func:`~lamina.multires.compress.reference` alike, so finite data reads
back finite.  Infinite data stays infinite (its patches are stored
losslessly).  The float64 passes themselves never overflow: a forward
pass at most doubles magnitudes (quadruples them in its intermediate sums)
and an inverse pass at most triples them, whatever bands a read leaves
out, so a patch is compressed only while ``M + tol`` is at most
:func:`float64_headroom` (the largest float64 over ``2**(2 d (L - 1) + 4)``),
and the levels of a patch whose data exceed it are computed from its data
scaled down by that power of two (exact but for values it makes subnormal)
and scaled back.  Only float64 data comes near it.

Choosing the split
------------------
Any ``t_b`` with ``sum w_b t_b`` equal to the budget keeps the bound; the
split minimizes a rate model: a band of ``n_b`` coefficients at tolerance
``t_b`` costs about ``n_b log2(sigma_b / t_b)`` bits, and minimizing
``sum n_b log2(1 / t_b)`` subject to ``sum w_b t_b = B`` gives
``t_b = B n_b / (w_b N)`` (``N`` the patch's values): fine bands, which
hold most of the coefficients, get most of the tolerance (a 3-D patch
gives its finest band ``B / 8``, against ``B / (1 + 7 (L - 1))`` for an
even split).

zfp's side
----------
zfp's fixed-accuracy mode rounds the tolerance down to a power of two and
promises an absolute error at most the tolerance, but its documentation
(FAQ, "Why does zfp sometimes not respect my error tolerance?") lists cases
where it does not hold: values near the largest floating-point numbers,
blocks of subnormal numbers, and tolerances near the data's own precision,
and zfp issue 62 reported tolerances overshot on real data.  So instead of
a fixed safety factor, :mod:`lamina.multires.compress` decodes what zfp
wrote and checks every coefficient against ``t_b`` (``verify``); a patch
that fails is stored losslessly.  With that check the proof above rests
only on arithmetic.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from ..errors import BoundsError
from .wavelet import band_size, check_patch, nlevels

#: the part of the tolerance kept for rounding; a patch whose rounding
#: margin exceeds it is stored losslessly
SAFETY = 1 / 16
#: the part kept for rounding in a second try of the patches whose margin exceeds SAFETY's
#: part (their bands get the other half); a patch whose margin exceeds this part too is
#: stored losslessly
WIDE_SAFETY = 1 / 2

#: the part of a looser read's slack (its tolerance less the written one) kept for
#: rounding the values it moves (see the module docstring)
READ_SAFETY = 2.0**-20

#: float64 rounding of the forward and inverse transforms, relative to the
#: largest magnitude of a patch's values and coefficients (see the module
#: docstring); generous on purpose: a few hundred float64 ulps would do
FLOAT64_SLACK = 2.0**-36


def check_tolerance(tolerance: float) -> float:
    """*tolerance* as a float; ValueError naming it unless it is a real number (a numpy one
    too; not a bool, not a string), finite and >= 0."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise ValueError(f"tolerance must be a number, got {tolerance!r}")
    t = float(tolerance)
    if not (t >= 0 and math.isfinite(t)):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    return t


def weights(ndim: int, levels: int) -> np.ndarray:
    """How much a band's coefficient errors can add to the error of a level.

    Returns
    -------
    numpy.ndarray
        ``w_b`` for bands ``0 .. levels - 1``: ``2**ndim - 1`` for detail
        bands (one term per detail sub-band), 1 for the coarsest
        approximation.
    """
    w = np.full(levels, float((1 << ndim) - 1))
    w[-1] = 1.0
    return w


def band_tolerances(
    tolerance: float, patch: Sequence[int], *, safety: float = SAFETY
) -> np.ndarray:
    """zfp tolerances per band so that every level reads back within *tolerance*.

    Parameters
    ----------
    tolerance
        The largest absolute error allowed at every level, >= 0; 0 means
        lossless (every band tolerance is 0).
    patch
        The full patch shape (edges powers of two).
    safety
        The part of *tolerance* reserved for rounding (see the module
        docstring).

    Returns
    -------
    numpy.ndarray
        ``t_b`` for bands ``0 .. nlevels(patch) - 1`` (band ``L - 1`` is
        the coarsest approximation), with ``sum w_b t_b = (1 - safety) *
        tolerance``.

    Raises
    ------
    ValueError
        If *tolerance* is negative, NaN or infinite, or *safety* is not in
        ``[0, 1)``.
    """
    tol = check_tolerance(tolerance)
    if not 0 <= safety < 1:
        raise ValueError(f"safety must be in [0, 1), got {safety}")
    p = check_patch(patch)
    levels = nlevels(p)
    n = np.array([band_size(p, levels, b) for b in range(levels)], dtype=np.float64)
    w = weights(len(p), levels)
    return (1 - safety) * tol * n / (w * n.sum())


def error_bound(tolerances: Sequence[float] | np.ndarray, ndim: int, level: int = 0) -> float:
    """The largest error at *level* that coefficient errors up to *tolerances* can cause.

    ``t_{L-1} + (2**ndim - 1) * sum(t_level .. t_{L-2})``: the bound proved
    in the module docstring, before rounding.
    """
    t = np.asarray(tolerances, dtype=np.float64)
    levels = t.size
    if not 0 <= level < levels:
        raise BoundsError(f"level {level} does not exist: there are levels 0 to {levels - 1}")
    return float((weights(ndim, levels) * t)[level:].sum())


def float64_headroom(ndim: int, levels: int) -> float:
    """The largest magnitude a patch's float64 transforms take without overflowing.

    The largest float64 over ``2**(2 ndim (levels - 1) + 4)`` (see *Overflow*
    in the module docstring): a patch is compressed only while its
    magnitude plus the tolerance stays below it, and the levels of a patch
    whose data exceed it are computed from the data scaled down by that
    power of two.
    """
    return math.ldexp(float(np.finfo(np.float64).max), -headroom_exponent(ndim, levels))


def headroom_exponent(ndim: int, levels: int) -> int:
    """The power of two :func:`float64_headroom` divides the largest float64 by."""
    return 2 * ndim * (levels - 1) + 4


def rounding_margin(magnitude: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Per patch, how far rounding can move a value read back (see the module docstring).

    Parameters
    ----------
    magnitude
        Per patch, the largest absolute value of its data, its coefficients
        and its approximations at every level, plus the tolerance.
    dtype
        The dataset's float dtype.

    Returns
    -------
    numpy.ndarray
        Two units in the last place of *dtype* at *magnitude*, plus the
        float64 transforms' slack; inf where *magnitude* is beyond the
        finite range of *dtype* (or NaN): such patches are stored losslessly.
    """
    m = np.asarray(magnitude, dtype=np.float64)
    inside = m <= float(np.finfo(dtype).max)  # False for NaN
    ulp = np.spacing(np.where(inside, m, 0.0).astype(dtype)).astype(np.float64)
    return np.where(inside, 2 * ulp + FLOAT64_SLACK * m, np.inf)
