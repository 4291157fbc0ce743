"""Entry points of the derived kernels: evaluate an expression over a region, check its inputs.

The semantics (exact ``numpy.gradient`` stencils, dtypes, division by zero)
and the design and speed of the kernels are described in
:mod:`lamina.derived.kernels`; this module turns the caller's arguments
(regions, origins, spacings, devices) into one run of those kernels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import (
    DeviceUnavailableError,
    DTypeError,
    ExpressionError,
    ShapeError,
    suggest,
)
from ..geometry import Box
from . import _parallel
from .functions import COMPONENTS, FUNCTIONS
from .halo import as_box, check_stencils, needed_boxes, union
from .kernels import CHUNK_ELEMENTS, Evaluator, node_pos, probe
from .nodes import Call, Expr
from .parser import axis_value, check, parse

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
        On a GPU they may be CuPy arrays already on the device: then nothing
        crosses from the host.
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
        Return numpy arrays also when computing on a GPU (default).  With
        ``False`` the results stay on the device as CuPy arrays.
    out
        Arrays to write the result into, one per component, of the region's
        shape and of the result's dtype (:func:`result_dtype`); saves the
        allocation (and its page faults) of a fresh result.  On a GPU the
        results are copied from the device straight into them.

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
            raise ShapeError(
                f"arrays of different shapes {sorted(shapes)}: give region and global_shape"
            )
        if not shapes:
            raise ShapeError("an expression without inputs needs global_shape")
        global_shape = shapes.pop()
    shape = tuple(int(s) for s in global_shape)
    box = as_box(region, shape)
    check_stencils(expr, shape, text)
    sp = _spacing(spacing, len(shape))
    xp = _array_module(device)
    prepared = _prepare(expr, arrays, box, shape, origin, xp)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        dtypes = probe(expr, {p: a.dtype for p, (a, _) in prepared.items()}, len(shape), sp, text)
        if out is not None:
            _check_out(out, box, dtypes[id(expr)])
        if box.empty:
            outs = [xp.empty(box.shape, dtype=dt) for dt in dtypes[id(expr)]]
        else:
            ev = Evaluator(
                xp,
                prepared,
                shape,
                sp,
                text,
                managed=xp is np,
                dtypes=dtypes,
                chunk=chunk_elements or CHUNK_ELEMENTS,
            )
            outs = ev.materialize(expr, box, copy=True, outs=out if xp is np else None)
    if xp is not np and out is not None:
        for o, r in zip(out, outs, strict=True):
            if isinstance(o, np.ndarray) and o.flags.c_contiguous and o.flags.writeable:
                xp.asnumpy(r, out=o)  # straight into the host array: no second copy
            else:
                o[...] = xp.asnumpy(r) if isinstance(o, np.ndarray) else r
        return list(out)
    if xp is not np and to_host:
        outs = [xp.asnumpy(o) for o in outs]
    if out is not None:
        for o, r in zip(out, outs, strict=True):
            if r is not o:
                o[...] = r
        return list(out)
    return outs


#: regions of fewer elements than this on average are computed on one thread: their Python
#: (about 60 us a region) holds the GIL, and two threads ran slower than one (magnitude over
#: 256 regions of 10,816 elements: 42 against 36 ms; of 43,264: 11.3 against 12.7 ms; of
#: 173,889: 6.7 against 9.4 ms, on two cores)
SPREAD_MIN_ELEMENTS = 1 << 15


def evaluate_regions(
    expr: Expr | str,
    items: Sequence[tuple[Mapping[str, Any], Any, Any]],
    global_shape: Sequence[int],
    *,
    spacing: float | Sequence[float] | None = None,
    chunk_elements: int | None = None,
    threads: int | None = None,
) -> list[list[np.ndarray]]:
    """Evaluate *expr* over several regions on the CPU, each from arrays of its own.

    *items* are ``(arrays, region, origin)``, each as :func:`evaluate` takes
    them; the answer is, per item, what :func:`evaluate` returns for it, value
    for value (each element is computed by the same operations).  What one
    call per region would repeat is done once: the checks of the expression,
    the probe of its dtypes (per set of input dtypes), the threads.  The
    regions are shared among the kernels' threads (:mod:`._parallel`: *threads*,
    else the default; no more threads than regions), each computed on one
    thread, when together they are worth the threads
    (:data:`~._parallel.PARALLEL_MIN_ELEMENTS`), each is large enough
    (:data:`SPREAD_MIN_ELEMENTS` on average), and there are at least as many
    regions as threads or the regions are too small for threads of their own;
    otherwise one after the other, each as :func:`evaluate` computes it.  This is how many blocks are computed
    where they lie, without first copying them into one array over their box:
    a region costs about 60 us of Python here, a call of :func:`evaluate`
    about 145.
    """
    expr, text = _as_expr(expr)
    shape = tuple(int(s) for s in global_shape)
    check_stencils(expr, shape, text)
    sp = _spacing(spacing, len(shape))
    jobs = []
    for arrays, region, origin in items:
        check_inputs(expr, arrays.keys(), text)
        box = as_box(region, shape)
        jobs.append((box, _prepare(expr, arrays, box, shape, origin, np)))
    total = sum(box.size for box, _ in jobs)
    nt = threads or _parallel.default_threads()
    # fewer regions than threads: one large enough for threads of its own takes them, one
    # after the other; else the regions go to as many threads as there are regions
    own = max((box.size for box, _ in jobs), default=0) >= _parallel.PARALLEL_MIN_ELEMENTS
    spread = (
        nt > 1
        and len(jobs) > 1
        and (len(jobs) >= nt or not own)
        and total >= _parallel.PARALLEL_MIN_ELEMENTS
        and total >= SPREAD_MIN_ELEMENTS * len(jobs)
    )
    if spread:
        nt = min(nt, len(jobs))
    chunk = chunk_elements or CHUNK_ELEMENTS
    found: dict[tuple, dict[int, list[np.dtype]]] = {}
    results: list[list[np.ndarray]] = [[] for _ in jobs]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        evs = []
        for _, prepared in jobs:  # one probe per set of input dtypes
            key = tuple((p, a.dtype) for p, (a, _) in sorted(prepared.items()))
            if key not in found:
                found[key] = probe(expr, dict(key), len(shape), sp, text)
            evs.append(found[key])

        def work(state: list, i: int) -> None:
            ev, last = state
            box, prepared = jobs[i]
            if box.empty:
                results[i] = [np.empty(box.shape, dtype=dt) for dt in evs[i][id(expr)]]
                return
            if box.shape != last:  # scratch buffers are kept for one shape of region at a time
                ev.free, state[1] = {}, box.shape
            ev.arrays, ev.dtypes = prepared, evs[i]
            results[i] = ev.materialize(expr, box, copy=True)

        first = Evaluator(
            np,
            {},
            shape,
            sp,
            text,
            managed=True,
            dtypes={},
            chunk=chunk,
            threads=1 if spread else nt,
        )
        evals = [first, *(first.worker() for _ in range(nt - 1))] if spread else [first]
        _parallel.run_blocks(range(len(jobs)), work, [[ev, None] for ev in evals])
    return results


def _prepare(
    expr: Expr, arrays: Mapping[str, Any], box: Box, shape: tuple[int, ...], origin, xp
) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Each input of *expr* as (array, global offset of its element 0), checked to cover what
    *box* needs (on a GPU: only the needed box, on the device)."""
    if expr.halo == 0:  # pointwise: every input over the region itself (as needed_boxes says)
        needed = dict.fromkeys(expr.inputs, box)
        inbox = box if needed else None
    else:
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
            raise ShapeError(
                f"the array for {path!r} has {a.ndim} dimensions but the domain {shape} has {len(shape)}"
            )
        org = _origin(path, a, origin, needed[path], inbox, shape)
        abox = Box.from_offset(org, a.shape)
        need = needed[path]
        if not need.empty and not abox.contains(need):
            raise ShapeError(
                f"the array for {path!r} covers {abox} of the domain {shape}, but {need} is needed "
                f"for the region {box} (see input_box)"
            )
        if xp is not np:
            sub = (
                a[need.relative_to(abox)]
                if not need.empty
                else a[tuple(slice(0, 0) for _ in shape)]
            )
            if isinstance(sub, xp.ndarray):  # already on the device
                sub = xp.ascontiguousarray(sub)
            else:  # host memory: only the needed box travels
                sub = xp.asarray(np.ascontiguousarray(sub))
            prepared[path] = (sub, need.start)
        else:
            prepared[path] = (a, org)
    return prepared


def _check_out(out, box: Box, dtypes) -> None:
    if len(out) != len(dtypes):
        raise ShapeError(f"out has {len(out)} arrays for a result of {len(dtypes)} components")
    for o, dt in zip(out, dtypes, strict=True):
        if tuple(o.shape) != box.shape:
            raise ShapeError(
                f"out array of shape {tuple(o.shape)} for a region of shape {box.shape}"
            )
        if o.dtype != dt:
            raise DTypeError(f"out array of dtype {o.dtype} for a result of dtype {dt}")


def result_dtype(
    expr: Expr | str, dtypes: Mapping[str, Any], ndim: int | None = None
) -> list[np.dtype]:
    """Dtype of each output component for inputs of the given dtypes (no data needed).

    *ndim* is the number of dimensions of the data (default: 3 if the
    expression has a stencil that needs it, else 1).
    """
    expr, text = _as_expr(expr)
    check_inputs(expr, dtypes.keys(), text)
    if ndim is None:
        ndim = _default_ndim(expr)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        found = probe(
            expr, {p: np.dtype(dtypes[p]) for p in expr.inputs}, ndim, (1.0,) * ndim, text
        )
    return list(found[id(expr)])


def node_dtypes(expr: Expr, dtypes: Mapping[str, Any]) -> dict[int, list[np.dtype]]:
    """The dtype of every node of *expr* (by ``id``) that the evaluator computes as an array.

    Found as :func:`result_dtype` finds the result's: by running the kernels
    on tiny arrays of the input dtypes.  Nodes below a stencil may be left
    out; constant subexpressions are Python numbers (:func:`~.kernels.fold`).
    Raises ExpressionError where the evaluator refuses the expression for
    these dtypes (an integer literal that does not fit an int8 input, a
    boolean subtraction, ...).
    """
    ndim = _default_ndim(expr)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return probe(
            expr, {p: np.dtype(dtypes[p]) for p in expr.inputs}, ndim, (1.0,) * ndim, expr.source
        )


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
        elif inside := sorted(n for n in names if n.startswith(ref.path + "/")):
            # (a group, or a vector quantity: its datasets are its components)
            hint = (
                f" {ref.path!r} is a group: name one of its datasets, a path with '/' in "
                f"backticks (`{inside[0]}`)." + suggest(ref.path, names)
            )
        else:
            hint = suggest(ref.path, names)
            if not hint and names:
                some = sorted(names)
                hint = (
                    " Available: "
                    + ", ".join(repr(n) for n in some[:12])
                    + (" ..." if len(some) > 12 else ".")
                )
        raise ExpressionError(f"unknown dataset {ref.path!r}.{hint}", node_pos(ref), text)
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
                node_pos(ref),
                text,
            )
    if shape is not None:
        check_stencils(expr, shape, text)
    return shape


def component_names(name: str, expr: Expr | int) -> list[str]:
    """Dataset names of the result: ``[name]``, or ``[name/x, name/y, name/z]`` for a vector."""
    n = expr if isinstance(expr, int) else expr.ncomponents
    return [name] if n == 1 else [f"{name}/{c}" for c in COMPONENTS[:n]]


def gpu_missing() -> str | None:
    """What a GPU computation lacks here (CuPy, or a CUDA device it sees), or None if nothing."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - any failure means: no usable CuPy
        return f"CuPy does not import ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any failure means: no usable device
        return f"CuPy finds no CUDA device ({type(e).__name__}: {e})"
    if count <= 0:
        return "CuPy sees no CUDA device"
    return None


def gpu_available() -> bool:
    """True if CuPy imports and sees at least one CUDA device."""
    return gpu_missing() is None


def check_device(device: str) -> None:
    """Refuse *device* unless it is ``"cpu"``, ``"gpu"`` or ``"auto"`` and, for ``"gpu"``, usable.

    Cheap for ``"cpu"`` and ``"auto"`` (CuPy is not imported); ``"gpu"`` without CuPy or a
    CUDA device is a :class:`DeviceUnavailableError` saying which is missing.
    """
    if device not in ("cpu", "gpu", "auto"):
        raise ExpressionError(f"device must be 'cpu', 'gpu' or 'auto', not {device!r}")
    if device == "gpu":
        missing = gpu_missing()
        if missing is not None:
            raise DeviceUnavailableError(
                f"device='gpu' needs CuPy and a CUDA device: {missing}; use device='cpu' or 'auto'"
            )


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
    check_device(device)  # "gpu": raises unless CuPy sees a device
    if device == "gpu" or gpu_available():
        import cupy

        return cupy
    return np


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
