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
boolean inputs in float64, as does ``magnitude``.  ``x ^ 2`` is ``x * x``.
Division by zero follows numpy without warnings: ``x / 0`` is ``±inf``,
``0 / 0`` and ``log(-1)`` are ``nan``; integer overflow wraps.  A derivative
of a constant is the constant ``0.0``.  Errors numpy raises (an integer to a
negative integer power, a literal that does not fit an int8 input) become an
:class:`~lamina.errors.ExpressionError` at the operation's position.

Kernels
-------
On the CPU, pointwise work runs block by block over the region, in blocks of
:data:`CHUNK_ELEMENTS` elements, each operation writing into a reused
scratch buffer (``out=``) and the last one straight into the result; so
temporaries stay in cache and memory traffic is close to the compulsory
"read each input once, write each output once".  Stencils whose arguments
are datasets (``gradient(a, 0)``, ``curl(u, v, w)``, ...) run block by block
too; a stencil of an expression, and ``laplacian``, computes its argument
over the grown box first.

Measured on this project's 2-core development VM (AMD EPYC, numpy 2.4,
float64 inputs of 128 MiB each; ``python -m lamina.derived.bench``;
GB/s of compulsory traffic, best of 5, a shared machine so +-15%)::

    magnitude(vx, vy, vz)   plain numpy  sqrt(vx*vx+vy*vy+vz*vz)  ~4.5 GB/s
                            numexpr 2.14 (1 or 2 threads)          ~2.4 GB/s
                            lamina blocked                         ~8.5 GB/s
    add(a, b)               numpy a + b                            ~6 GB/s
                            numexpr 2.14                           ~6 GB/s
                            lamina blocked                         ~6 GB/s

numexpr was no faster for ``add`` and half as fast for ``magnitude`` (its
sqrt is slower than numpy's SIMD one), it follows its own casting rules
rather than numpy's, and it compiles expressions through ``eval``; so lamina
does not use it.

On a GPU (``device="gpu"``, or ``"auto"`` when CuPy finds a device), the
same code runs with ``xp = cupy`` on the whole region at once; inputs are
copied to the device (only the needed box) and results back to the host.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DTypeError, ExpressionError, LaminaError, ShapeError, register, suggest
from ..geometry import Box
from .functions import COMPONENTS, FUNCTIONS
from .halo import as_box, check_stencils, grow, needed_boxes, stencil_paths, union
from .nodes import BinOp, BoolOp, Call, Compare, Expr, Num, Ref, UnaryOp
from .parser import axis_value, check, parse

#: elements per block of the CPU kernels (1 MiB of float64: temporaries stay in L2/L3; smaller
#: blocks cost more in per-block Python overhead than they gain in cache hits, measured)
CHUNK_ELEMENTS = 1 << 17


@register
class DeviceUnavailableError(LaminaError, RuntimeError):
    """``device="gpu"`` was asked for but CuPy or a CUDA device is missing."""


_ARITH = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "^": "power"}
_COMPARE = {
    "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal",
    "==": "equal", "!=": "not_equal",
}
_F64 = np.dtype(np.float64)
_EXACT_INT = {
    "add": operator.add, "subtract": operator.sub, "multiply": operator.mul, "power": operator.pow,
    "negative": operator.neg, "absolute": abs,
}


# ---------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------


def evaluate(
    expr: Expr | str,
    arrays: Mapping[str, Any],
    region: Any = None,
    global_shape: Sequence[int] | None = None,
    *,
    origin: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
    spacing: float | Sequence[float] | None = None,
    device: str = "cpu",
    chunk_elements: int | None = None,
    to_host: bool = True,
    out: Sequence[Any] | None = None,
) -> list[Any]:
    """Evaluate *expr* over *region* of the global domain.

    Parameters
    ----------
    expr
        A tree from :func:`~lamina.derived.parse`, or text (parsed as an
        expression, or as a predicate if it is one).
    arrays
        Input arrays by dataset path.  Each covers a box of the global domain
        that contains what the region needs (:func:`input_box`; more is fine).
    region
        The part of the global domain to compute: a :class:`~lamina.geometry.Box`,
        a tuple of slices, or ``(start, stop)``.  Default: the whole domain.
    global_shape
        Shape of the global domain (of every input dataset).  Default: the
        shape of the arrays, which then must be the whole domain.
    origin
        Global index of element ``(0, ..., 0)`` of the arrays (one offset for
        all, or a mapping path -> offset).  Default: found from each array's
        shape, which must then be that of the box the input needs
        (:func:`needed_boxes`), of the input box of all inputs
        (:func:`input_box`), or of the whole domain.
    spacing
        Grid spacing of the stencils: one number for all axes or one per axis
        (default 1.0).
    device
        ``"cpu"`` (numpy), ``"gpu"`` (CuPy; :class:`DeviceUnavailableError`
        if missing) or ``"auto"`` (CuPy if a device is there, else numpy).
    chunk_elements
        Block size of the CPU kernels (default :data:`CHUNK_ELEMENTS`).
    to_host
        Return numpy arrays also when computing on a GPU (default).
    out
        Arrays to write the result into, one per component, of the region's
        shape and of the result's dtype (:func:`result_dtype`); saves the
        allocation (and its page faults) of a fresh result.

    Returns
    -------
    list
        One array per component (1, or 3 for a vector), each of the region's
        shape; a predicate gives one boolean array.

    Raises
    ------
    ExpressionError
        Unknown dataset (with close names suggested), a stencil on an axis
        shorter than 3 or of the wrong dimensionality, numpy refusing an
        operation.
    ShapeError
        An array does not cover what the region needs, or has the wrong
        number of dimensions.
    """
    expr, text = _as_expr(expr)
    check_inputs(expr, arrays.keys(), text)
    if global_shape is None:
        if region is not None:
            raise ShapeError("give global_shape along with region")
        shapes = {tuple(np.shape(arrays[p])) for p in (expr.inputs or arrays)}
        if len(shapes) > 1:
            raise ShapeError(f"arrays of different shapes {sorted(shapes)}: give region and global_shape")
        if not shapes:
            raise ShapeError("an expression without inputs needs global_shape")
        global_shape = shapes.pop()
    shape = tuple(int(s) for s in global_shape)
    box = as_box(region, shape)
    check_stencils(expr, shape, text)
    sp = _spacing(spacing, len(shape))
    xp = _array_module(device)
    needed = needed_boxes(expr, box, shape)
    inbox = None
    for b in needed.values():
        inbox = union(inbox, b)
    prepared: dict[str, tuple[Any, tuple[int, ...]]] = {}
    for path in sorted(expr.inputs):
        a = arrays[path]
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            a = np.asarray(a)
        if a.ndim != len(shape):
            raise ShapeError(f"the array for {path!r} has {a.ndim} dimensions but the domain {shape} has {len(shape)}")
        org = _origin(path, a, origin, needed[path], inbox, shape)
        abox = Box.from_offset(org, a.shape)
        need = needed[path]
        if not need.empty and not abox.contains(need):
            raise ShapeError(
                f"the array for {path!r} covers {abox} of the domain {shape}, but {need} is needed "
                f"for the region {box} (see input_box)"
            )
        if xp is not np:
            sub = a[need.relative_to(abox)] if not need.empty else a[tuple(slice(0, 0) for _ in shape)]
            prepared[path] = (xp.asarray(np.ascontiguousarray(sub)), need.start)
        else:
            prepared[path] = (a, org)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        dtypes = _probe(expr, {p: a.dtype for p, (a, _) in prepared.items()}, len(shape), sp, text)
        if out is not None:
            _check_out(out, box, dtypes[id(expr)])
        if box.empty:
            outs = [xp.empty(box.shape, dtype=dt) for dt in dtypes[id(expr)]]
        else:
            ev = _Eval(xp, prepared, shape, sp, text, managed=xp is np, dtypes=dtypes,
                       chunk=chunk_elements or CHUNK_ELEMENTS)
            outs = ev.materialize(expr, box, copy=True, outs=out if xp is np else None)
    if xp is not np and (to_host or out is not None):
        outs = [xp.asnumpy(o) for o in outs]
    if out is not None:
        for o, r in zip(out, outs, strict=True):
            if r is not o:
                o[...] = r
        return list(out)
    return outs


def _check_out(out, box: Box, dtypes) -> None:
    if len(out) != len(dtypes):
        raise ShapeError(f"out has {len(out)} arrays for a result of {len(dtypes)} components")
    for o, dt in zip(out, dtypes, strict=True):
        if tuple(o.shape) != box.shape:
            raise ShapeError(f"out array of shape {tuple(o.shape)} for a region of shape {box.shape}")
        if o.dtype != dt:
            raise DTypeError(f"out array of dtype {o.dtype} for a result of dtype {dt}")


def result_dtype(expr: Expr | str, dtypes: Mapping[str, Any], ndim: int | None = None) -> list[np.dtype]:
    """Dtype of each output component for inputs of the given dtypes (no data needed).

    *ndim* is the number of dimensions of the data (default: 3 if the
    expression has a stencil that needs it, else 1).
    """
    expr, text = _as_expr(expr)
    check_inputs(expr, dtypes.keys(), text)
    if ndim is None:
        ndim = _default_ndim(expr)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        found = _probe(expr, {p: np.dtype(dtypes[p]) for p in expr.inputs}, ndim, (1.0,) * ndim, text)
    return list(found[id(expr)])


def check_inputs(expr: Expr, available: Any, text: str | None = None) -> tuple[int, ...] | None:
    """Check that every dataset *expr* reads exists.

    *available* is an iterable of dataset paths, or a mapping path -> shape
    (or -> array); with a mapping, the inputs must also share one shape, on
    which the stencils must be possible, and that shape is returned.

    Raises ExpressionError at the first unknown reference, suggesting close
    names ("Did you mean ...?"), or at the first input whose shape differs.
    """
    text = text if text is not None else getattr(expr, "source", None)
    names = set(available.keys()) if isinstance(available, Mapping) else set(available)
    for ref in expr.refs():
        if ref.path in names:
            continue
        if ref.path in FUNCTIONS:
            hint = f" {ref.path!r} is a function: call it as {ref.path}(...)."
        elif any(n.startswith(ref.path + "/") for n in names):
            hint = " Paths with '/' must be written in backticks, e.g. `a/b`." + suggest(ref.path, names)
        else:
            hint = suggest(ref.path, names)
            if not hint and names:
                some = sorted(names)
                hint = " Available: " + ", ".join(repr(n) for n in some[:12]) + (" ..." if len(some) > 12 else ".")
        raise ExpressionError(f"unknown dataset {ref.path!r}.{hint}", _pos(ref), text)
    if not isinstance(available, Mapping):
        return None
    shape: tuple[int, ...] | None = None
    first = ""
    for ref in expr.refs():
        v = available[ref.path]
        s = tuple(int(x) for x in (v.shape if hasattr(v, "shape") else v))
        if shape is None:
            shape, first = s, ref.path
        elif s != shape:
            raise ExpressionError(
                f"inputs of different shapes: {ref.path!r} has shape {s} but {first!r} has {shape}",
                _pos(ref),
                text,
            )
    if shape is not None:
        check_stencils(expr, shape, text)
    return shape


def component_names(name: str, expr: Expr | int) -> list[str]:
    """Dataset names of the result: ``[name]``, or ``[name/x, name/y, name/z]`` for a vector."""
    n = expr if isinstance(expr, int) else expr.ncomponents
    return [name] if n == 1 else [f"{name}/{c}" for c in COMPONENTS[:n]]


def gpu_available() -> bool:
    """True if CuPy imports and sees at least one CUDA device."""
    try:
        import cupy  # type: ignore[import-not-found]

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU
        return False


# ---------------------------------------------------------------------------
# helpers of the entry points
# ---------------------------------------------------------------------------


def _default_ndim(expr: Expr) -> int:
    """Fewest dimensions on which every stencil of *expr* is possible (3 when it does not matter)."""
    stencils = [n for n in expr.walk() if isinstance(n, Call) and n.function.kind == "stencil"]
    if not stencils:
        return 1
    for n in stencils:
        if n.name == "divergence":
            return len(n.args)
    ndim = 3
    for n in stencils:
        if n.name == "gradient" and len(n.args) == 2:
            ax = axis_value(n.args[1])
            if ax is not None:
                ndim = max(ndim, ax + 1 if ax >= 0 else -ax)
    return ndim


def _as_expr(expr: Expr | str) -> tuple[Expr, str | None]:
    if isinstance(expr, str):
        try:
            node = parse(expr, "expr")
        except ExpressionError as first:
            try:
                node = parse(expr, "predicate")
            except ExpressionError:
                raise first from None
        return node, expr
    if not isinstance(expr, Expr):
        raise ExpressionError(f"an expression must be text or an Expr, not {type(expr).__name__}")
    text = getattr(expr, "source", None)
    check(expr, "predicate" if expr.is_predicate else "expr", text)
    return expr, text


def _pos(node: Expr) -> int | None:
    return node.pos if node.pos >= 0 else None


def _spacing(spacing, ndim: int) -> tuple[float, ...]:
    if spacing is None:
        return (1.0,) * ndim
    if np.ndim(spacing) == 0:
        values = [spacing] * ndim
    else:
        values = list(spacing)
        if len(values) != ndim:
            raise ExpressionError(f"spacing needs one value per axis ({ndim}), got {len(values)}")
    out = []
    for v in values:
        try:
            h = float(v)
        except (TypeError, ValueError):
            raise ExpressionError(f"spacing must be numbers, got {v!r}") from None
        if not math.isfinite(h) or h == 0.0:
            raise ExpressionError(f"spacing must be finite and non-zero, got {h}")
        out.append(h)
    return tuple(out)


def _array_module(device: str):
    if device == "cpu":
        return np
    if device not in ("gpu", "auto"):
        raise ExpressionError(f"device must be 'cpu', 'gpu' or 'auto', not {device!r}")
    if gpu_available():
        import cupy  # type: ignore[import-not-found]

        return cupy
    if device == "auto":
        return np
    raise DeviceUnavailableError("device='gpu' needs CuPy and a CUDA device; use device='cpu' or 'auto'")


def _origin(path, a, origin, need, inbox, shape) -> tuple[int, ...]:
    if origin is not None:
        org = origin[path] if isinstance(origin, Mapping) else origin
        org = tuple(int(x) for x in (org.start if isinstance(org, Box) else org))
        if len(org) != len(shape):
            raise ShapeError(f"origin {org} has {len(org)} values for {len(shape)}-D data")
        return org
    # a box is known by its shape: the needed box of this input, or of all inputs, or the domain
    # (when two of these have the same shape they are the same box, so the guess is safe)
    if need is not None and tuple(a.shape) == need.shape:
        return need.start
    if inbox is not None and tuple(a.shape) == inbox.shape:
        return inbox.start
    if tuple(a.shape) == shape:
        return (0,) * len(shape)
    raise ShapeError(
        f"the array for {path!r} has shape {tuple(a.shape)}, not that of the box it needs ({need}), "
        f"of the input box ({inbox}) or of the domain {shape}: pass origin= (its global offset)"
    )


def _probe(expr: Expr, dtypes: Mapping[str, Any], ndim: int, spacing, text) -> dict[int, list[np.dtype]]:
    """Run the kernels on tiny arrays of ones to learn the dtype of every node (by ``id``)."""
    shape = (3,) * ndim
    arrays = {p: (np.ones(shape, dtype=dt), (0,) * ndim) for p, dt in dtypes.items()}
    ev = _Eval(np, arrays, shape, spacing, text, managed=False, dtypes={}, chunk=1 << 62)
    ev.materialize(expr, Box.from_shape(shape), copy=False)
    return ev.dtypes


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


class _Eval:
    """One evaluation: inputs, domain, scratch buffers and the dtype of every node.

    ``managed``: CPU mode, block by block, every operation writes into a
    buffer chosen here (dtypes known from a probe run).  Otherwise (probe,
    GPU) the whole region is one block and the array library allocates;
    a probe run records the dtypes.
    """

    def __init__(self, xp, arrays, shape, spacing, text, *, managed, dtypes, chunk):
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
        return ExpressionError(f"cannot compute {_short(at)}: {e}", _pos(at), self.text)

    def view(self, path: str, box: Box):
        a, org = self.arrays[path]
        return _sub(a, tuple(slice(x - o, y - o) for x, y, o in zip(box.start, box.stop, org, strict=True)))

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
                r = _py(getattr(np, name)(*args, **kw))
                if type(r) is int and name in _EXACT_INT:  # numpy would wrap around silently
                    exact = _EXACT_INT[name](*args)
                    if exact != r:
                        raise ExpressionError(
                            f"integer overflow in the constant {_short(at)} (write a float, e.g. 2.0 ^ 100)",
                            _pos(at), self.text)
                return r, False
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
            return [self.call("negative" if node.op == "-" else "logical_not", [v], node, node, 0, d0)]
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
        r = right[0]
        if op == "^" and _is_array(left[0]) and not _is_array(r) and not isinstance(r, bool) and r == 2:
            return self.call("multiply", [left, left], node, node, 0, dest)  # like numpy's x ** 2
        return self.call(_ARITH[op], [left, right], node, node, 0, dest)

    def _ceval_call(self, node: Call, C: Box, dests, pre):
        f = node.function
        d0 = dests[0] if dests else None
        if f.kind == "stencil":
            if node.is_constant:
                return [(0.0, False)] * node.ncomponents
            return self.stencil(node, C, dests, lambda arg, box: self.view(arg.path, box))
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
                acc = self.call(f.ufunc, [acc, v], node, node if last else None, 0, d0 if last else None)
            return [acc]
        raise ExpressionError(f"no kernel for {f.name}()", _pos(node), self.text)

    def _vector(self, node: Call, comps, dests):
        def d(k):
            return dests[k] if dests else None

        if node.name == "magnitude":
            acc = None
            for i, c in enumerate(comps):
                v = c[0]
                dt = _F64 if isinstance(v, self.array_type) and v.dtype.kind in "biu" else None
                sq = self.call("multiply", [c, c], node, dtype=dt)
                acc = sq if acc is None else self.call("add", [acc, sq], node)
                del i
            assert acc is not None
            return [self.call("sqrt", [acc], node, node, 0, d(0))]
        if node.name == "dot":
            n = len(comps) // 2
            acc = None
            for i in range(n):
                last = i == n - 1
                if acc is None:
                    acc = self.call("multiply", [comps[i], comps[n + i]], node,
                                    node if last else None, 0, d(0) if last else None)
                else:
                    p = self.call("multiply", [comps[i], comps[n + i]], node)
                    acc = self.call("add", [acc, p], node, node if last else None, 0, d(0) if last else None)
            return [acc]
        if node.name == "cross":
            a = [(v, False) for v, _ in comps[:3]]  # each component is used twice: release at the end
            b = [(v, False) for v, _ in comps[3:]]
            out = []
            for k, (i, j) in enumerate(((1, 2), (2, 0), (0, 1))):
                p = self.call("multiply", [a[i], b[j]], node)
                q = self.call("multiply", [a[j], b[i]], node)
                out.append(self.call("subtract", [p, q], node, node, k, d(k)))
            self.release(comps, None)
            return out
        raise ExpressionError(f"no kernel for {node.name}()", _pos(node), self.text)

    # -- stencils ----------------------------------------------------------------
    def grad(self, f, fstart, obox: Box, ax: int, at: Expr, out=None):
        """First derivative along *ax* over *obox* of *f* (whose element 0 sits at global *fstart*)."""
        xp = self.xp
        n, h = self.shape[ax], self.spacing[ax]
        exact = f.dtype.kind in "fc"
        otype = f.dtype if exact else _F64
        if out is None or out.dtype != otype:
            out = self.take(obox.shape, otype)
        lo, hi = obox.start[ax], obox.stop[ax]
        base = [slice(a - s, b - s) for a, b, s in zip(obox.start, obox.stop, fstart, strict=True)]

        def fs(a, b):
            sl = list(base)
            sl[ax] = slice(a - fstart[ax], b - fstart[ax])
            return f[tuple(sl)]

        def os(a, b):
            sl = [slice(None)] * len(base)
            sl[ax] = slice(a - lo, b - lo)
            return out[tuple(sl)]

        try:
            i0, i1 = max(lo, 1), min(hi, n - 1)
            if i1 > i0:  # interior: central differences, as numpy.gradient
                o = os(i0, i1)
                kw = {} if exact else {"dtype": _F64}
                xp.subtract(fs(i0 + 1, i1 + 1), fs(i0 - 1, i1 - 1), out=o, **kw)
                xp.divide(o, 2.0 * h, out=o)
            if lo == 0:  # global boundary: second-order one-sided differences
                os(0, 1)[...] = (-1.5 / h) * fs(0, 1) + (2.0 / h) * fs(1, 2) + (-0.5 / h) * fs(2, 3)
            if hi == n:
                os(n - 1, n)[...] = (
                    (0.5 / h) * fs(n - 3, n - 2) + (-2.0 / h) * fs(n - 2, n - 1) + (1.5 / h) * fs(n - 1, n)
                )
        except LaminaError:
            raise
        except (TypeError, ValueError, ArithmeticError) as e:
            raise self.error(at, e) from None
        return out

    def stencil(self, node: Call, B: Box, dests, get) -> list[tuple[Any, bool]]:
        """Evaluate stencil *node* over *B*; ``get(arg, box)`` gives an argument over a box."""
        shape, ndim = self.shape, len(self.shape)
        paths = stencil_paths(node, ndim)
        fetched: dict[int, tuple[Any, Box]] = {}
        for i, (arg, ps) in enumerate(zip(node.args, paths, strict=True)):
            if not ps or arg.is_constant:
                continue
            U = None
            for p in ps:
                b = B
                for ax in p:
                    b = grow(b, ax, shape)
                U = union(U, b)
            fetched[i] = (get(arg, U), U)

        def d(k):
            return dests[k] if dests else None

        def D(i, ax, out=None):
            if i not in fetched:
                return 0.0, False
            f, U = fetched[i]
            r = self.grad(f, U.start, B, ax, node, out)
            return r, r is not out

        name = node.name
        if name == "gradient":
            if len(node.args) == 2:
                result = [D(0, axis_value(node.args[1]) % ndim, d(0))]
            else:
                result = [D(0, j, d(j)) for j in range(ndim)]
        elif name == "divergence":
            acc = D(0, 0, d(0) if ndim == 1 else None)
            for j in range(1, ndim):
                last = j == ndim - 1
                acc = self.call("add", [acc, D(j, j)], node, node if last else None, 0, d(0) if last else None)
            result = [acc]
        elif name == "curl":
            result = []
            for k, (i, a, j, b) in enumerate(((2, 1, 1, 2), (0, 2, 2, 0), (1, 0, 0, 1))):
                result.append(self.call("subtract", [D(i, a), D(j, b)], node, node, k, d(k)))
        elif name == "laplacian":
            f, U = fetched[0]
            acc = None
            for j in range(ndim):
                B1 = grow(B, j, shape)
                g1 = self.grad(f, U.start, B1, j, node)
                last = j == ndim - 1
                g2 = self.grad(g1, B1.start, B, j, node, d(0) if last and ndim == 1 else None)
                self.give(g1)
                term = (g2, g2 is not d(0))
                acc = term if acc is None else self.call(
                    "add", [acc, term], node, node if last else None, 0, d(0) if last else None
                )
            assert acc is not None
            result = [acc]
        else:  # pragma: no cover - the table and this method go together
            raise ExpressionError(f"no kernel for {name}()", _pos(node), self.text)
        if self.recording:
            self.dtypes[id(node)] = [_dtype_of(v) for v, _ in result]
        return result

    # -- a whole box -------------------------------------------------------------
    def chunkable(self, node: Call) -> bool:
        """A stencil whose arguments are datasets (or constants) runs block by block."""
        return node.name != "laplacian" and all(isinstance(a, Ref) or a.is_constant for a in node.args)

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
            return [v.copy() if copy and _is_array(v) and not owned else self._full(v, B, node, k)
                    for k, (v, owned) in enumerate(vals)]
        if outs is None:
            outs = [xp.empty(B.shape, dtype=dt) for dt in self.dtypes[id(node)]]
        # one operation without temporaries needs no blocks: one call over the whole box
        step = B.size if _single_op(node, pre) else self.chunk
        for C in chunks(B, step):
            rel = C.relative_to(B)
            dests = [_sub(o, rel) for o in outs]
            vals = self.ceval(node, C, dests, pre)
            for (v, owned), dst in zip(vals, dests, strict=True):
                if v is not dst:
                    dst[...] = v
                    if owned:
                        self.give(v)
        return outs

    def _full(self, v, B: Box, node: Expr, k: int):
        if _is_array(v):
            return v
        dt = self.dtypes[id(node)][k] if id(node) in self.dtypes else _dtype_of(v)
        return self.xp.full(B.shape, v, dtype=dt)

