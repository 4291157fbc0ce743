"""Evaluate an expression tree on numpy (or CuPy) arrays covering a region of the global domain.

Exactness of the stencils
-------------------------
``gradient``, ``divergence``, ``curl`` and ``laplacian`` are built from first
derivatives computed exactly as ``numpy.gradient(global_array, edge_order=2)``
computes them on the assembled global array, with the same floating-point
operations in the same order, so a region evaluated on any rank of any
decomposition gives the same bits as the serial computation:

* interior: ``(f[i+1] - f[i-1]) / (2.0 * h)``;
* at global index 0: ``(-1.5/h) * f[0] + (2.0/h) * f[1] + (-0.5/h) * f[2]``;
* at global index n-1: ``(0.5/h) * f[n-3] + (-2.0/h) * f[n-2] + (1.5/h) * f[n-1]``.

Whether a face of the region is a global boundary is decided from the
region's place in the global domain, so the caller passes the region and the
global shape, and input arrays covering at least
:func:`~lamina.derived.halo.input_box` (the region grown by the halo).
Integer (and boolean) inputs of a stencil are differentiated in float64, as
numpy does for integers; spacings are Python floats (one per axis, default 1).

``laplacian(a)`` is ``sum over axes j of gradient(gradient(a, j), j)``
(axes in order), the wide 5-point second difference of numpy's gradient
applied twice; ``divergence(u, v, w) = du/dx0 + dv/dx1 + dw/dx2`` and
``curl(u, v, w) = (dw/dx1 - dv/dx2, du/dx2 - dw/dx0, dv/dx0 - du/dx1)``,
with u, v, w the components along array axes 0, 1, 2 (as in ADIOS2).

Numbers
-------
Dtypes follow numpy (NEP 50): ``float32 + 1.5`` stays float32, ``int / int``
is float64.  Literals are Python numbers, and constant subexpressions are
folded to Python numbers with numpy's rules, so they never widen an array's
dtype.  ``sqrt exp log`` and the trigonometric functions compute integer and
boolean inputs in float64, as does ``magnitude``.  ``x ^ 2`` is ``x * x`` for float
``x`` (what numpy's ``x ** 2`` computes).
Division by zero follows numpy without warnings: ``x / 0`` is ``±inf``,
``0 / 0`` and ``log(-1)`` are ``nan``; integer overflow wraps.  A derivative
of a constant is the constant ``0.0``.  An integer constant to a negative
integer power folds as in Python (``2 ^ -1`` is ``0.5``; ``0 ^ -1`` is an
error).  Errors numpy raises (an integer array to a negative integer power,
a literal that does not fit an int8 input) become an
:class:`~lamina.errors.ExpressionError` at the operation's position.

Kernels
-------
On the CPU the region is cut into blocks of about :data:`CHUNK_ELEMENTS`
elements; each operation writes into a reused scratch buffer (``out=``) or
into the result's own block (``magnitude`` sums its squares there, ``curl``
and ``divergence`` put their first term there and subtract or add the next
ones in place), so temporaries stay in cache and the memory traffic is close
to the compulsory "read each input once, write each output once".  Stencils
of datasets (``gradient(a, 0)``, ``curl(u, v, w)``, ``laplacian(a)``, ...) run
block by block too, a derivative of a C-contiguous input being one flat 1-D
operation (:mod:`lamina.derived._stencil`); a stencil of an expression
computes its argument over the grown box first.  The blocks are shared among
a few threads (:mod:`lamina.derived._parallel`: all the cores of the process
divided among the MPI ranks of the node; ``LAMINA_THREADS`` overrides).

Measured on this project's 2-core development VM (AMD EPYC, AVX2, numpy 2.4,
numexpr 2.14), shared with other work (load 2-3): 512 MiB of float64 input
per kernel as in ``lamina bench derived``, output preallocated, best wall
clock of 5 runs or more; GB/s of compulsory traffic (numpy.copyto: 19.5)::

                              numpy   numexpr        lamina before   lamina
                                      1 / 2 threads  (1 thread)      1 / 2 threads
    add(a, b)                  16.0   21.6 / 25.8        23.5        23.6 / 30.4
    magnitude(vx, vy, vz)       4.6    5.5 /  9.9         8.8         9.0 / 14.5
    curl(u, v, w) (281^3)       2.3    3.8 /  4.6 (a)     3.6         6.3 / 6.3 (b)
    magnitude(curl(u, v, w))    1.2        -              2.3         3.5 / 5.0
    laplacian(u) (406^3)        0.5        -              1.2         2.4 / 2.7

(a) the central differences of the interior only, from strided views;
(b) the second core was busy.  numexpr gives the same bits here, but one
thread of it is slower than numpy's blocks and two are slower than two
threads of blocks, so lamina does not use it.  ``magnitude`` on one core is
bound by the square root (vsqrtpd: ~1.4 ns per float64 here, 31 of its 79 ms)
plus memory passes that separate numpy calls cannot overlap with it: 0.46x
memcpy, where ``curl`` reaches 0.35-0.4x; 0.6x for ``magnitude`` takes the
second core (0.75x when it is free).

On a GPU (``device="gpu"``, or ``"auto"`` when CuPy finds a device), the
same code runs with ``xp = cupy`` on the whole region at once; inputs are
copied to the device (only the needed box) and results back to the host.
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ExpressionError, LaminaError
from ..geometry import Box
from . import _parallel
from ._stencil import derivative, stencil
from .nodes import BinOp, BoolOp, Call, Compare, Expr, Num, Ref, UnaryOp

#: elements per block of the CPU kernels (2 MiB of float64: temporaries stay in L3; smaller blocks
#: cost more in per-block Python overhead than they gain in cache hits, measured)
CHUNK_ELEMENTS = 1 << 18


_ARITH = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "^": "power"}
_COMPARE = {
    "<": "less",
    "<=": "less_equal",
    ">": "greater",
    ">=": "greater_equal",
    "==": "equal",
    "!=": "not_equal",
}
_F64 = np.dtype(np.float64)
_EXACT_INT: dict[str, Callable[..., int]] = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "power": operator.pow,
    "negative": operator.neg,
    "absolute": abs,
}


#: the integers a constant may be: those of int64 and of uint64 (a literal may be either)
_INT_MIN, _UINT_MAX = -(1 << 63), (1 << 64) - 1


def _exact_int(name: str, args) -> int | None:
    """The exact integer result of folding ``name(*args)``, or None if it cannot fit 64 bits.

    ``power`` is not computed when the result is sure to be too large (``2 ^ 10^12`` would take
    Python hours): a base of magnitude 2 or more to a power above 64 exceeds 2**64.
    """
    if name == "power":
        base, n = args
        if type(base) is int and type(n) is int and abs(base) >= 2 and n > 64:
            return None
    return _EXACT_INT[name](*args)


def _int_to_negative(args) -> bool:
    """True for two Python integers, the second negative (``2 ^ -1``)."""
    return len(args) == 2 and all(type(a) is int for a in args) and args[1] < 0


class ConstantOverflow(ArithmeticError):
    """An integer constant whose exact value no 64-bit literal holds (:func:`fold_numbers`)."""


def fold_numbers(name: str, args: Sequence[Any], kw: Mapping[str, Any] | None = None) -> Any:
    """Python numbers through ufunc *name* as a constant of an expression folds: a Python number.

    Integers are folded exactly, as the literals they stand for: any result
    a literal may be (int64 or uint64), where numpy's int64 would wrap or
    refuse (:class:`ConstantOverflow` past them); an integer to a negative
    integer power as Python computes it (``2 ^ -1`` is 0.5, numpy refuses
    it); the rest with numpy's rules.  The evaluator and the query's bounds
    (:mod:`lamina.derived.bounds`) fold alike through this one function.
    """
    if name == "power" and not kw and _int_to_negative(args):
        if args[0] == 0:
            raise ZeroDivisionError("0 cannot be raised to a negative power")
        return operator.pow(*args)
    if name in _EXACT_INT and not kw and all(type(a) is int for a in args):
        exact = _exact_int(name, args)
        if exact is None or not _INT_MIN <= exact <= _UINT_MAX:
            raise ConstantOverflow(name)
        return exact
    r = _py(getattr(np, name)(*args, **(kw or {})))
    if type(r) is int and name in _EXACT_INT:  # numpy would wrap around silently
        exact = _exact_int(name, args)
        if exact is None or exact != r:
            raise ConstantOverflow(name)
    return r


def probe(
    expr: Expr, dtypes: Mapping[str, Any], ndim: int, spacing, text
) -> dict[int, list[np.dtype]]:
    """Run the kernels on tiny arrays of ones to learn the dtype of every node (by ``id``)."""
    shape = (3,) * ndim
    arrays = {p: (np.ones(shape, dtype=dt), (0,) * ndim) for p, dt in dtypes.items()}
    ev = Evaluator(np, arrays, shape, spacing, text, managed=False, dtypes={}, chunk=1 << 62)
    ev.materialize(expr, Box.from_shape(shape), copy=False)
    return ev.dtypes


def fold(node: Expr, text: str | None = None) -> list[Any]:
    """The values of the constant *node* (it reads no dataset), one per component.

    Each is the Python number the evaluator computes and uses (numpy's rules,
    then a Python scalar, so it stays weakly typed where it meets an array).
    Raises ExpressionError where the evaluator would (an integer overflow).
    """
    ev = Evaluator(np, {}, (), (), text, managed=False, dtypes={}, chunk=1 << 62)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return [_py(v) for v, _ in ev.ceval(node, Box((), ()), None, {})]


def node_pos(node: Expr) -> int | None:
    return node.pos if node.pos >= 0 else None


def _short(node: Expr) -> str:
    s = str(node)
    return s if len(s) <= 40 else s[:37] + "..."


def _is_array(v) -> bool:
    return hasattr(v, "shape") and not isinstance(v, np.generic)


def _py(v):
    """A numpy scalar as a Python number (weakly typed under NEP 50)."""
    return v.item() if isinstance(v, np.generic) else v


def _dtype_of(v) -> np.dtype:
    return v.dtype if _is_array(v) else np.result_type(v)


def _sub(a, sl: tuple):
    return a[sl] if sl else a[...]


def _single_op(node: Expr, pre) -> bool:
    """True if *node* is one operation on datasets/constants/ready arrays (no temporaries)."""

    def leaf(c: Expr) -> bool:
        return isinstance(c, Ref | Num) or c.is_constant or id(c) in pre

    if isinstance(node, BinOp | UnaryOp | Compare | BoolOp):
        return all(leaf(c) for c in node.children)
    if isinstance(node, Call):
        f = node.function
        if f.kind in ("binary", "unary", "float") or (f.kind == "fold" and len(node.args) == 2):
            return all(leaf(c) for c in node.args)
        if node.name == "gradient" and len(node.args) == 2:
            return isinstance(node.args[0], Ref)
    return False


def chunks(box: Box, target: int) -> Iterator[Box]:
    """Split *box* into row-major blocks of about *target* elements (whole trailing axes when they fit)."""
    shape = box.shape
    nd = len(shape)
    if nd == 0 or box.size <= target:
        yield box
        return
    inner, d = 1, nd
    while d > 0 and inner * shape[d - 1] <= target:
        inner *= shape[d - 1]
        d -= 1
    ax = d - 1
    step = max(1, target // inner)
    lead = [range(box.start[i], box.stop[i]) for i in range(ax)]
    for idx in itertools.product(*lead):
        for s in range(box.start[ax], box.stop[ax], step):
            start = idx + (s,) + box.start[ax + 1 :]
            stop = tuple(i + 1 for i in idx) + (min(s + step, box.stop[ax]),) + box.stop[ax + 1 :]
            yield Box(start, stop)


# ---------------------------------------------------------------------------
# the evaluator
# ---------------------------------------------------------------------------


class Evaluator:
    """One evaluation: inputs, domain, scratch buffers and the dtype of every node.

    ``managed``: CPU mode, block by block, every operation writes into a
    buffer chosen here (dtypes known from a probe run).  Otherwise (probe,
    GPU) the whole region is one block and the array library allocates;
    a probe run records the dtypes.
    """

    def __init__(self, xp, arrays, shape, spacing, text, *, managed, dtypes, chunk, threads=None):
        self.xp = xp
        self.arrays = arrays  # path -> (array, global offset of its element 0)
        self.shape = tuple(shape)
        self.spacing = spacing
        self.text = text
        self.managed = managed
        self.recording = not managed and not dtypes
        self.dtypes: dict[int, list[np.dtype]] = dtypes
        self.chunk = chunk if managed else 1 << 62
        self.free: dict[tuple, list] = {}
        self.promoted: dict[tuple, np.dtype] = {}
        self.array_type = np.ndarray if xp is np else (np.ndarray, xp.ndarray)
        # threads of the block loop (CPU only; None: _parallel.default_threads())
        self.threads = (threads or _parallel.default_threads()) if managed else 1

    def worker(self) -> Evaluator:
        """A copy for another thread: the same inputs and dtypes, buffers of its own."""
        w = copy.copy(self)
        w.free, w.promoted = {}, dict(self.promoted)
        return w

    # -- buffers ---------------------------------------------------------------
    def take(self, shape, dtype):
        if self.managed:
            lst = self.free.get((shape, dtype))
            if lst:
                return lst.pop()
        return self.xp.empty(shape, dtype=dtype)

    def give(self, a) -> None:
        if self.managed:
            self.free.setdefault((a.shape, a.dtype), []).append(a)

    def release(self, vals, keep) -> None:
        last = None
        for v, owned in vals:
            if owned and v is not keep and v is not last:  # the same array twice only as (c, c)
                last = v
                self.give(v)

    def error(self, at: Expr, e: Exception) -> ExpressionError:
        return ExpressionError(f"cannot compute {_short(at)}: {e}", node_pos(at), self.text)

    def view(self, path: str, box: Box):
        a, org = self.arrays[path]
        return _sub(
            a, tuple(slice(x - o, y - o) for x, y, o in zip(box.start, box.stop, org, strict=True))
        )

    # -- one elementwise operation ---------------------------------------------
    def call(self, name, vals, at, node=None, k=0, dest=None, dtype=None):
        """``name(*vals)`` (a ufunc), into *dest* or a reused/scratch buffer; returns (value, owned)."""
        args = [v for v, _ in vals]
        arr = self.array_type
        first = None
        for a in args:
            if isinstance(a, arr):
                first = a
                break
        kw = {} if dtype is None else {"dtype": dtype}
        try:
            if first is None:  # constant folding, with numpy's rules
                try:
                    return fold_numbers(name, args, kw), False
                except ConstantOverflow:
                    raise ExpressionError(
                        f"integer overflow in the constant {_short(at)} (write a float, e.g. 2.0 ^ 100)",
                        node_pos(at),
                        self.text,
                    ) from None
            out = dest
            if self.managed:
                if node is not None:
                    dt = self.dtypes[id(node)][k]
                elif dtype is not None:
                    dt = dtype
                elif len(args) == 2 and args[1] is first and args[0] is first:
                    dt = first.dtype  # x * x
                else:  # add/subtract/multiply/minimum/maximum: numpy's promotion of the operands
                    key = (name, *(a.dtype if isinstance(a, arr) else type(a) for a in args))
                    dt = self.promoted.get(key)
                    if dt is None:
                        dt = self.promoted[key] = np.result_type(*args)
                if dest is None or dest.dtype != dt:
                    shp = first.shape
                    out = None
                    for v, o in vals:
                        if o and v.dtype == dt and v.shape == shp:
                            out = v
                            break
                    if out is None:
                        out = self.take(shp, dt)
            fn = getattr(self.xp, name)
            r = fn(*args, out=out, **kw) if out is not None else fn(*args, **kw)
        except LaminaError:
            raise
        except (TypeError, ValueError, ArithmeticError) as e:
            if name == "power" and isinstance(e, ValueError) and "negative" in str(e):
                e = ValueError(
                    f"{e} (integer arrays: make the base or the exponent a float, e.g. ^ -1.0)"
                )
            raise self.error(at, e) from None
        self.release(vals, r)
        return r, r is not dest

    # -- tree walk over one block ------------------------------------------------
    def ceval(self, node: Expr, C: Box, dests, pre) -> list[tuple[Any, bool]]:
        vals = self._ceval(node, C, dests, pre)
        if self.recording:
            self.dtypes[id(node)] = [_dtype_of(v) for v, _ in vals]
        return vals

    def _ceval(self, node: Expr, C: Box, dests, pre) -> list[tuple[Any, bool]]:
        if isinstance(node, Num):
            return [(node.value, False)]
        if isinstance(node, Ref):
            return [(self.view(node.path, C), False)]
        hit = pre.get(id(node))
        if hit is not None:
            B, arrs = hit
            rel = C.relative_to(B)
            return [(_sub(a, rel), False) for a in arrs]
        d0 = dests[0] if dests else None
        if isinstance(node, BinOp):
            left = self.ceval(node.left, C, None, pre)[0]
            right = self.ceval(node.right, C, None, pre)[0]
            return [self._arith(node.op, left, right, node, d0)]
        if isinstance(node, UnaryOp):
            v = self.ceval(node.operand, C, None, pre)[0]
            return [
                self.call("negative" if node.op == "-" else "logical_not", [v], node, node, 0, d0)
            ]
        if isinstance(node, Compare):
            left = self.ceval(node.left, C, None, pre)[0]
            right = self.ceval(node.right, C, None, pre)[0]
            return [self.call(_COMPARE[node.op], [left, right], node, node, 0, d0)]
        if isinstance(node, BoolOp):
            left = self.ceval(node.left, C, None, pre)[0]
            right = self.ceval(node.right, C, None, pre)[0]
            name = "logical_and" if node.op == "&" else "logical_or"
            return [self.call(name, [left, right], node, node, 0, d0)]
        if isinstance(node, Call):
            return self._ceval_call(node, C, dests, pre)
        raise ExpressionError(f"not an expression node: {type(node).__name__}")

    def _arith(self, op, left, right, node, dest):
        x, r = left[0], right[0]
        if op == "^" and type(r) in (int, float) and _is_array(x) and x.dtype.kind in "fc":
            # as numpy's x ** 2 and x ** 0.5 compute them: a product and a square root (the
            # latter as np.power from numpy 2.3 on; that of numpy 2.0-2.2 could differ from
            # it in the last place)
            if r == 2:
                return self.call("multiply", [left, left], node, node, 0, dest)
            if r == 0.5:
                return self.call("sqrt", [left], node, node, 0, dest)
        return self.call(_ARITH[op], [left, right], node, node, 0, dest)

    def _ceval_call(self, node: Call, C: Box, dests, pre):
        f = node.function
        d0 = dests[0] if dests else None
        if f.kind == "stencil":
            if node.is_constant:
                return [(0.0, False)] * node.ncomponents
            return self.stencil(node, C, dests, None)  # chunkable: dataset arguments only
        if f.kind == "vector":
            comps = [cv for a in node.args for cv in self.ceval(a, C, None, pre)]
            return self._vector(node, comps, dests)
        vals = [self.ceval(a, C, None, pre)[0] for a in node.args]
        if f.kind == "binary":
            op = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "pow": "^"}[f.name]
            return [self._arith(op, vals[0], vals[1], node, d0)]
        if f.kind == "unary":
            return [self.call(f.ufunc, vals, node, node, 0, d0)]
        if f.kind == "float":
            v = vals[0][0]
            dt = _F64 if isinstance(v, self.array_type) and v.dtype.kind in "biu" else None
            return [self.call(f.ufunc, vals, node, node, 0, d0, dtype=dt)]
        if f.kind == "fold":
            acc = vals[0]
            for i, v in enumerate(vals[1:], 2):
                last = i == len(vals)
                acc = self.call(
                    f.ufunc, [acc, v], node, node if last else None, 0, d0 if last else None
                )
            return [acc]
        raise ExpressionError(f"no kernel for {f.name}()", node_pos(node), self.text)

    def _vector(self, node: Call, comps, dests):
        def d(k):
            return dests[k] if dests else None

        if node.name == "magnitude":
            acc = None  # ((c0*c0 + c1*c1) + c2*c2), integers in float64, summed in the result
            for c in comps:
                v = c[0]
                dt = _F64 if isinstance(v, self.array_type) and v.dtype.kind in "biu" else None
                sq = self.call("multiply", [c, c], node, None, 0, d(0) if acc is None else None, dt)
                acc = sq if acc is None else self.call("add", [acc, sq], node, None, 0, d(0))
            assert acc is not None
            return [self.call("sqrt", [acc], node, node, 0, d(0))]
        if node.name == "dot":
            n = len(comps) // 2
            acc = None
            for i in range(n):
                last = i == n - 1
                if acc is None:
                    acc = self.call(
                        "multiply",
                        [comps[i], comps[n + i]],
                        node,
                        node if last else None,
                        0,
                        d(0) if last else None,
                    )
                else:
                    p = self.call("multiply", [comps[i], comps[n + i]], node)
                    acc = self.call(
                        "add", [acc, p], node, node if last else None, 0, d(0) if last else None
                    )
            return [acc]
        if node.name == "cross":
            a = [
                (v, False) for v, _ in comps[:3]
            ]  # each component is used twice: release at the end
            b = [(v, False) for v, _ in comps[3:]]
            out = []
            for k, (i, j) in enumerate(((1, 2), (2, 0), (0, 1))):
                p = self.call("multiply", [a[i], b[j]], node)
                q = self.call("multiply", [a[j], b[i]], node)
                out.append(self.call("subtract", [p, q], node, node, k, d(k)))
            self.release(comps, None)
            return out
        raise ExpressionError(f"no kernel for {node.name}()", node_pos(node), self.text)

    # -- stencils ----------------------------------------------------------------
    def grad(self, f, fstart, obox: Box, ax: int, at: Expr, out=None):
        """First derivative along *ax* over *obox* of *f* (whose element 0 sits at global *fstart*)."""
        otype = f.dtype if f.dtype.kind in "fc" else _F64
        if out is None or out.dtype != otype:
            out = self.take(obox.shape, otype)
        try:
            derivative(self.xp, f, fstart, obox, ax, self.shape[ax], self.spacing[ax], out)
        except LaminaError:
            raise
        except (TypeError, ValueError, ArithmeticError) as e:
            raise self.error(at, e) from None
        return out

    def stencil(self, node: Call, B: Box, dests, get) -> list[tuple[Any, bool]]:
        """Evaluate stencil *node* over *B*; ``get(arg, box)`` gives an argument over a box."""
        result = stencil(self, node, B, dests, get)
        if self.recording:
            self.dtypes[id(node)] = [_dtype_of(v) for v, _ in result]
        return result

    # -- a whole box -------------------------------------------------------------
    def chunkable(self, node: Call) -> bool:
        """A stencil whose arguments are datasets (or constants) runs block by block.

        (``laplacian`` too: the first derivative over the block grown by one
        cell, then the second over the block.)
        """
        return all(isinstance(a, Ref) or a.is_constant for a in node.args)

    def frontier(self, node: Expr) -> list[Call]:
        """Stencils below *node* (through pointwise operations) that need their argument over a grown box."""
        out, stack = [], list(node.children)
        while stack:
            c = stack.pop()
            if c.is_constant or isinstance(c, Ref):
                continue
            if isinstance(c, Call) and c.function.kind == "stencil":
                if not self.chunkable(c):
                    out.append(c)
                continue
            stack.extend(c.children)
        return out

    def materialize(self, node: Expr, B: Box, copy: bool = False, outs=None) -> list[Any]:
        """*node* over the whole box *B*, one array per component (written into *outs* if given)."""
        res = self._materialize(node, B, copy and outs is None, outs)
        if outs is None or all(r is o for r, o in zip(res, outs, strict=True)):
            return res
        for o, r in zip(outs, res, strict=True):
            o[...] = r
        return list(outs)

    def _materialize(self, node: Expr, B: Box, copy: bool, outs) -> list[Any]:
        xp = self.xp
        if isinstance(node, Ref):
            v = self.view(node.path, B)
            if self.recording:
                self.dtypes[id(node)] = [v.dtype]
            return [v.copy() if copy else v]
        if node.is_constant:
            vals = self.ceval(node, B, None, {})
            return [xp.full(B.shape, v, dtype=_dtype_of(v)) for v, _ in vals]
        if isinstance(node, Call) and node.function.kind == "stencil" and not self.chunkable(node):
            vals = self.stencil(node, B, None, lambda arg, box: self.materialize(arg, box)[0])
            return [self._full(v, B, node, k) for k, (v, _) in enumerate(vals)]
        frontier = self.frontier(node)
        pre = {id(s): (B, self.materialize(s, B)) for s in frontier}
        if not self.managed:
            vals = self.ceval(node, B, None, pre)
            return [
                v.copy() if copy and _is_array(v) and not owned else self._full(v, B, node, k)
                for k, (v, owned) in enumerate(vals)
            ]
        if outs is None:
            outs = [xp.empty(B.shape, dtype=dt) for dt in self.dtypes[id(node)]]
        # one operation without temporaries needs no blocks: one call over the whole box (or one
        # part per thread)
        step = B.size if _single_op(node, pre) else self.chunk
        nt = _parallel.split_threads(self.threads, B.size)
        if nt > 1 and step >= B.size:
            step = -(-B.size // nt)
        boxes = list(chunks(B, step))
        nt = min(nt, len(boxes))
        if nt > 1:
            states = [self, *(self.worker() for _ in range(nt - 1))]
            _parallel.run_blocks(boxes, lambda ev, C: ev.block(node, B, C, outs, pre), states)
        else:
            for C in boxes:
                self.block(node, B, C, outs, pre)
        return outs

    def block(self, node: Expr, B: Box, C: Box, outs, pre) -> None:
        """*node* over the block *C* of *B*, into the blocks of *outs* (arrays over *B*)."""
        rel = C.relative_to(B)
        dests = [_sub(o, rel) for o in outs]
        vals = self.ceval(node, C, dests, pre)
        for (v, owned), dst in zip(vals, dests, strict=True):
            if v is not dst:
                dst[...] = v
                if owned:
                    self.give(v)

    def _full(self, v, B: Box, node: Expr, k: int):
        if _is_array(v):
            return v
        dt = self.dtypes[id(node)][k] if id(node) in self.dtypes else _dtype_of(v)
        return self.xp.full(B.shape, v, dtype=dt)
