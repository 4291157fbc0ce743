"""The stencils (gradient, divergence, curl, laplacian) and their first derivatives.

A first derivative is computed as ``numpy.gradient(edge_order=2)`` computes
it: in the interior ``(f[i+1] - f[i-1]) / (2.0 * h)``, at the global
boundaries the second-order one-sided differences, with numpy's operations in
numpy's order (see :mod:`lamina.derived.kernels`).  Two ways to the same bits:

* flat: when the input is C-contiguous and the part of it over the output box
  is one contiguous run (the output box spans the input's trailing axes), and
  the output is C-contiguous too, the central difference along any axis is
  one 1-D operation over the flattened arrays, the neighbours ``i - 1`` and
  ``i + 1`` lying one stride of that axis before and after.  Cells at the
  first or last index of the input along the axis get a wrong neighbour that
  way (the stride wraps into the next row or plane, or is cut off at the ends
  of the array); they are global boundaries, since the input holds the halo of
  every interior cell, and are overwritten afterwards by the one-sided
  differences;
* strided: slices along the axis, for any layout (each row of a strided
  operation costs numpy a call of its inner loop, so this is the slower one
  on small blocks).

Dividing by ``2.0 * h`` is a multiplication by its reciprocal when ``2.0 * h``
is a power of two: both round the same real number, so they give the same
bits, and a multiplication is cheaper.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ExpressionError
from ..geometry import Box
from .halo import grow, stencil_paths, union
from .nodes import Call, Ref
from .parser import axis_value

_F64 = np.dtype(np.float64)
_EXACT_SCALE = (np.dtype(np.float32), _F64)


def _scale(h: float, dtype: np.dtype) -> tuple[str, float]:
    """The ufunc and operand that give ``x / (2.0 * h)`` in *dtype*."""
    d = 2.0 * h
    m, e = math.frexp(abs(d))
    if m == 0.5 and -100 < e < 100 and dtype in _EXACT_SCALE:
        return "multiply", 1.0 / d  # a power of two: its reciprocal is exact in float32 and float64
    return "divide", d


def _run(fshape: tuple[int, ...], oshape: tuple[int, ...]) -> bool:
    """True if a box of *oshape* inside a C-ordered array of *fshape* is one contiguous run."""
    d = 0
    while d < len(oshape) and oshape[d] == 1:
        d += 1
    return all(o == f for o, f in zip(oshape[d + 1 :], fshape[d + 1 :], strict=True))


def _flat(xp, f, rel, oshape, ax: int, out, kw, scale) -> bool:
    """The central difference along *ax* as one 1-D operation; False if the layout does not allow it."""
    if (
        xp is not np
        or not isinstance(f, np.ndarray)
        or not f.flags.c_contiguous
        or not out.flags.c_contiguous
        or not _run(f.shape, oshape)
    ):
        return False
    cs = [1] * f.ndim  # C strides of f in elements
    for d in range(f.ndim - 2, -1, -1):
        cs[d] = cs[d + 1] * f.shape[d + 1]
    L0 = sum(r * c for r, c in zip(rel, cs, strict=True))
    s, N = cs[ax], out.size
    p0, p1 = max(0, s - L0), min(N, f.size - s - L0)
    if p1 > p0:
        ff, o = f.reshape(-1), out.reshape(-1)[p0:p1]
        np.subtract(ff[L0 + p0 + s : L0 + p1 + s], ff[L0 + p0 - s : L0 + p1 - s], out=o, **kw)
        getattr(np, scale[0])(o, scale[1], out=o)
    return True


def derivative(xp, f, fstart, obox, ax: int, n: int, h: float, out) -> None:
    """Write the first derivative along *ax* over *obox* into *out* (of ``obox.shape``).

    *f* covers a box starting at global index *fstart* that contains what
    :func:`~lamina.derived.halo.grow` asks for; *n* is the global size along
    *ax* and *h* the spacing.  Integer and boolean *f* are differentiated in
    float64 (*out* is then float64).
    """
    exact = f.dtype.kind in "fc"
    otype = f.dtype if exact else _F64
    kw = {} if exact else {"dtype": _F64}
    lo, hi = obox.start[ax], obox.stop[ax]
    rel = [a - s for a, s in zip(obox.start, fstart, strict=True)]
    base = [slice(r, r + (b - a)) for r, a, b in zip(rel, obox.start, obox.stop, strict=True)]

    def fs(a, b):
        sl = list(base)
        sl[ax] = slice(a - fstart[ax], b - fstart[ax])
        return f[tuple(sl)]

    def fi(i):  # the (n-1)-D cut at global index i along ax (a 0-d array, not a scalar, in 1-D)
        sl: list = list(base)
        sl[ax] = i - fstart[ax]
        return f[(*sl, Ellipsis)]

    def oi(i):
        sl: list = [slice(None)] * len(base)
        sl[ax] = i - lo
        return out[(*sl, Ellipsis)]

    i0, i1 = max(lo, 1), min(hi, n - 1)
    if i1 > i0:  # interior: central differences, as numpy.gradient
        scale = _scale(h, otype)
        if not _flat(xp, f, rel, obox.shape, ax, out, kw, scale):
            sl = [slice(None)] * len(base)
            sl[ax] = slice(i0 - lo, i1 - lo)
            o = out[tuple(sl)]
            xp.subtract(fs(i0 + 1, i1 + 1), fs(i0 - 1, i1 - 1), out=o, **kw)
            getattr(xp, scale[0])(o, scale[1], out=o)
    # global boundaries: second-order one-sided differences, ``(a * f0 + b * f1) + c * f2`` as numpy
    # (after the interior, which the flat way may have written there)
    if lo == 0:
        _one_sided(xp, oi(0), (fi(0), fi(1), fi(2)), (-1.5 / h, 2.0 / h, -0.5 / h))
    if hi == n:
        _one_sided(xp, oi(n - 1), (fi(n - 3), fi(n - 2), fi(n - 1)), (0.5 / h, -2.0 / h, 1.5 / h))


def _one_sided(xp, o, fs, cs) -> None:
    """``o = (cs[0] * fs[0] + cs[1] * fs[1]) + cs[2] * fs[2]``, with one temporary."""
    xp.multiply(fs[0], cs[0], out=o)
    t = xp.multiply(fs[1], cs[1], out=xp.empty_like(o))  # (an array also when 0-d)
    xp.add(o, t, out=o)
    xp.multiply(fs[2], cs[2], out=t)
    xp.add(o, t, out=o)


def stencil(ev, node: Call, B: Box, dests, get) -> list[tuple[Any, bool]]:
    """Stencil *node* over *B* for the evaluator *ev*; ``get(arg, box)``: an argument over a box.

    A dataset argument is read from its whole input array (which the
    derivatives slice by global index), so that a derivative can treat a
    contiguous input as flat whatever block *B* is.
    """
    shape, ndim = ev.shape, len(ev.shape)
    paths = stencil_paths(node, ndim)
    fetched: dict[int, tuple[Any, tuple[int, ...]]] = {}
    for i, (arg, ps) in enumerate(zip(node.args, paths, strict=True)):
        if not ps or arg.is_constant:
            continue
        if isinstance(arg, Ref):
            fetched[i] = ev.arrays[arg.path]
            continue
        U = None
        for p in ps:
            grown = B
            for ax in p:
                grown = grow(grown, ax, shape)
            U = union(U, grown)
        assert U is not None  # ps is not empty
        fetched[i] = (get(arg, U), U.start)

    def d(k):
        return dests[k] if dests else None

    def D(i, ax, out=None):
        if i not in fetched:
            return 0.0, False
        f, start = fetched[i]
        r = ev.grad(f, start, B, ax, node, out)
        return r, r is not out

    name = node.name
    if name == "gradient":
        if len(node.args) == 2:
            axis = axis_value(node.args[1])
            assert axis is not None  # checked when the expression was parsed
            result = [D(0, axis % ndim, d(0))]
        else:
            result = [D(0, j, d(j)) for j in range(ndim)]
    elif name == "divergence":
        acc = D(0, 0, d(0))  # the first term straight into the result, the others added to it
        for j in range(1, ndim):
            last = j == ndim - 1
            acc = ev.call(
                "add", [acc, D(j, j)], node, node if last else None, 0, d(0) if last else None
            )
        result = [acc]
    elif name == "curl":
        result = []
        for k, (i, a, j, b) in enumerate(((2, 1, 1, 2), (0, 2, 2, 0), (1, 0, 0, 1))):
            first = D(i, a, d(k))  # into the result, then the second term subtracted in place
            result.append(ev.call("subtract", [first, D(j, b)], node, node, k, d(k)))
    elif name == "laplacian":
        f, start = fetched[0]
        acc = None
        for j in range(ndim):
            B1 = grow(B, j, shape)
            g1 = ev.grad(f, start, B1, j, node)
            last = j == ndim - 1
            g2 = ev.grad(g1, B1.start, B, j, node, d(0) if j == 0 else None)  # first: the result
            ev.give(g1)
            term = (g2, g2 is not d(0))
            acc = (
                term
                if acc is None
                else ev.call(
                    "add", [acc, term], node, node if last else None, 0, d(0) if last else None
                )
            )
        assert acc is not None
        result = [acc]
    else:  # pragma: no cover - the table and this function go together
        raise ExpressionError(
            f"no kernel for {name}()", node.pos if node.pos >= 0 else None, ev.text
        )
    return result
