"""Which input cells an expression needs to give a region exactly: halos and input boxes.

The stencils reproduce ``numpy.gradient(global_array, edge_order=2)``.  Along
an axis of global size ``n >= 3`` the derivative at global index ``i`` reads

* ``i - 1`` and ``i + 1`` for ``0 < i < n - 1`` (central difference),
* ``0, 1, 2`` for ``i = 0`` and ``n - 3, n - 2, n - 1`` for ``i = n - 1``
  (second-order one-sided differences at the global boundary).

So the input range needed for an output range ``[lo, hi)`` along that axis is
``[lo - 1, hi + 1)`` clipped to ``[0, n)``, widened to ``[0, 3)`` when
``lo = 0`` and to ``[n - 3, n)`` when ``hi = n`` (:func:`grow_range`).  Nested
stencils apply the rule once per level, innermost last (``laplacian(a)``
applies it twice along each axis).  :func:`needed_boxes` does this over a
whole tree; the kernels use the very same functions to slice their inputs, so
what is fetched and what is read cannot disagree.

Compared with the interior halo :attr:`Expr.halo <lamina.derived.nodes.Expr.halo>`,
the exact box is the region grown by ``halo`` and clipped, except that a
region one cell thick touching a global boundary needs one more cell inward.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ExpressionError, ShapeError
from ..geometry import Box
from .nodes import Call, Expr, Ref
from .parser import axis_value


def grow_range(lo: int, hi: int, n: int) -> tuple[int, int]:
    """Input range ``[a, b)`` that a first derivative over output ``[lo, hi)`` reads (axis size *n* >= 3)."""
    if hi <= lo:
        return lo, hi
    a, b = max(lo - 1, 0), min(hi + 1, n)
    if lo == 0:
        b = max(b, min(3, n))
    if hi == n:
        a = min(a, max(n - 3, 0))
    return a, b


def grow(box: Box, axis: int, global_shape: Sequence[int]) -> Box:
    """*box* with :func:`grow_range` applied along *axis*."""
    a, b = grow_range(box.start[axis], box.stop[axis], global_shape[axis])
    start, stop = list(box.start), list(box.stop)
    start[axis], stop[axis] = a, b
    return Box(tuple(start), tuple(stop))


def union(a: Box | None, b: Box) -> Box:
    """Bounding box of two boxes (a may be None)."""
    if a is None:
        return b
    return Box(
        tuple(min(x, y) for x, y in zip(a.start, b.start, strict=True)),
        tuple(max(x, y) for x, y in zip(a.stop, b.stop, strict=True)),
    )


def as_box(region, global_shape: Sequence[int]) -> Box:
    """A :class:`~lamina.geometry.Box` from a Box, a tuple of slices, or a ``(start, stop)`` pair; checked inside the domain."""
    shape = tuple(int(s) for s in global_shape)
    if isinstance(region, Box):
        box = region
    elif region is None:
        box = Box.from_shape(shape)
    elif isinstance(region, tuple | list) and all(isinstance(s, slice) for s in region):
        if len(region) != len(shape):
            raise ShapeError(
                f"region has {len(region)} slices but the data has {len(shape)} dimensions"
            )
        box = Box.from_slices(region, shape)
    elif hasattr(region, "start") and hasattr(region, "stop"):
        box = Box(tuple(int(x) for x in region.start), tuple(int(x) for x in region.stop))
    elif isinstance(region, tuple | list) and len(region) == 2:
        box = Box(tuple(int(x) for x in region[0]), tuple(int(x) for x in region[1]))
    else:
        raise ShapeError(
            f"cannot read a region from {region!r}: give a Box, slices or (start, stop)"
        )
    box.check_inside(shape, "the global domain")
    return box


def stencil_paths(call: Call, ndim: int) -> list[list[tuple[int, ...]]]:
    """For each argument of a stencil call, the axes of the derivatives applied to it.

    Each entry is a list of paths; a path is the axes of nested first
    derivatives, outermost first (``laplacian`` gives ``[(0, 0), (1, 1), ...]``).
    Axes are normalized; call :func:`check_stencils` first.
    """
    name, args = call.name, call.args
    if name == "gradient":
        if len(args) == 2:
            ax = axis_value(args[1])
            assert ax is not None
            return [[(ax % ndim,)], []]
        return [[(j,) for j in range(ndim)]]
    if name == "divergence":
        return [[(j,)] for j in range(len(args))]
    if name == "curl":
        return [[(2,), (1,)], [(2,), (0,)], [(1,), (0,)]]
    if name == "laplacian":
        return [[(j, j) for j in range(ndim)]]
    return [[] for _ in args]


def check_stencils(expr: Expr, global_shape: Sequence[int], text: str | None = None) -> None:
    """Raise ExpressionError if a stencil cannot be applied on data of *global_shape*.

    A derivative along an axis needs at least 3 points there (second-order
    one-sided differences); ``curl`` and ``gradient(a)`` need 3-D data;
    ``divergence`` takes one argument per axis; a gradient axis must exist.
    """
    shape = tuple(int(s) for s in global_shape)
    ndim = len(shape)
    for node in expr.walk():
        if not isinstance(node, Call) or node.function.kind != "stencil":
            continue
        pos = node.pos if node.pos >= 0 else None
        what = f"{node.name}()"
        if node.name == "gradient" and len(node.args) == 2:
            ax = axis_value(node.args[1])
            if ax is None or not -ndim <= ax < ndim:
                raise ExpressionError(
                    f"gradient axis {ax} is out of range for {ndim}-D data of shape {shape}",
                    pos,
                    text,
                )
        elif node.name in ("curl",) or (node.name == "gradient" and len(node.args) == 1):
            if ndim != 3:
                raise ExpressionError(
                    f"{what} needs 3-D data, but the data has shape {shape}", pos, text
                )
        elif node.name == "divergence" and len(node.args) != ndim:
            raise ExpressionError(
                f"divergence() takes one argument per axis: {ndim} for data of shape {shape}, "
                f"got {len(node.args)}",
                pos,
                text,
            )
        elif node.name == "laplacian" and ndim == 0:
            raise ExpressionError(f"{what} needs at least 1-D data", pos, text)
        axes = sorted({ax for paths in stencil_paths(node, ndim) for p in paths for ax in p})
        for ax in axes:
            if shape[ax] < 3:
                raise ExpressionError(
                    f"{what} needs at least 3 points along axis {ax} (second-order differences), "
                    f"but the global shape {shape} has {shape[ax]} in dimension {ax}",
                    pos,
                    text,
                )


def needed_boxes(expr: Expr, region, global_shape: Sequence[int]) -> dict[str, Box]:
    """For each input path, the bounding box of the cells needed to evaluate *region* exactly."""
    shape = tuple(int(s) for s in global_shape)
    box = as_box(region, shape)
    check_stencils(expr, shape)
    out: dict[str, Box] = {}
    if box.empty:
        return {p: box for p in expr.inputs}
    _need(expr, box, shape, out)
    return out


def _need(node: Expr, box: Box, shape: tuple[int, ...], out: dict[str, Box]) -> None:
    if isinstance(node, Ref):
        out[node.path] = union(out.get(node.path), box)
        return
    if isinstance(node, Call) and node.function.kind == "stencil":
        for arg, paths in zip(node.args, stencil_paths(node, len(shape)), strict=True):
            for path in paths:
                b = box
                for ax in path:  # outermost derivative first: it reads the inner one on a grown box
                    b = grow(b, ax, shape)
                _need(arg, b, shape, out)
        return
    for c in node.children:
        _need(c, box, shape, out)


def input_box(expr: Expr, region, global_shape: Sequence[int]) -> Box:
    """Bounding box of all inputs needed for *region* (the region itself if nothing is read)."""
    boxes = needed_boxes(expr, region, global_shape)
    result: Box | None = None
    for b in boxes.values():
        result = union(result, b)
    return result if result is not None else as_box(region, global_shape)
