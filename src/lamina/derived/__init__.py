"""Derived quantities: an expression language over datasets and its kernels.

Pure code (no MPI, no files).  The derived layer and the query engine build on:

* :func:`parse` -- text to an immutable, checked tree (:class:`Expr` and its
  node types), in ``"expr"`` or ``"predicate"`` mode;
* static properties of a tree -- :attr:`Expr.inputs`, :attr:`Expr.ncomponents`,
  :attr:`Expr.halo`, :meth:`Expr.input_box`, :attr:`Expr.op_counts`,
  :attr:`Expr.flops_per_element`, :meth:`Expr.bytes_per_element`;
* :func:`check_inputs` -- unknown datasets ("Did you mean ...?"), shapes;
* :func:`evaluate` -- the values over a region, from arrays covering the
  region grown by the halo, exactly as ``numpy.gradient(edge_order=2)`` on
  the assembled global array; :func:`evaluate_regions` -- the same over many
  regions at once, each from arrays of its own, shared among threads;
* :func:`result_dtype`, :func:`component_names`, :func:`needed_boxes`;
* :func:`truth` / :func:`interval` / :class:`Bounds` -- whether a predicate can
  hold in a block given the block's min/max statistics and the inputs' dtypes,
  under the dtypes' own arithmetic (query pruning).

>>> from lamina.derived import parse, evaluate
>>> e = parse("magnitude(vx, vy, vz)")
>>> sorted(e.inputs), e.ncomponents, e.halo
(['vx', 'vy', 'vz'], 1, 0)
>>> str(parse("a+b*-c^2"))
'a + b * -c ^ 2'
"""

from typing import TYPE_CHECKING

from .. import lazy

if TYPE_CHECKING:
    from .bounds import Bounds, Interval, interval, truth
    from .compute import (
        DeviceUnavailableError,
        check_device,
        check_inputs,
        component_names,
        evaluate,
        evaluate_regions,
        gpu_available,
        result_dtype,
    )
    from .functions import COMPONENTS, FUNCTIONS, STENCILS, Function
    from .halo import check_stencils, grow_range, input_box, needed_boxes
    from .kernels import CHUNK_ELEMENTS
    from .nodes import BinOp, BoolOp, Call, Compare, Expr, Num, Ref, UnaryOp
    from .parser import MAX_DEPTH, MAX_INT_LITERAL, MAX_NESTING, check, parse, tokenize

#: where each name below lives: imported at its first use (lamina.lazy)
_WHERE = {
    "Bounds": ".bounds",
    "Interval": ".bounds",
    "interval": ".bounds",
    "truth": ".bounds",
    "DeviceUnavailableError": ".compute",
    "check_device": ".compute",
    "check_inputs": ".compute",
    "component_names": ".compute",
    "evaluate": ".compute",
    "evaluate_regions": ".compute",
    "gpu_available": ".compute",
    "result_dtype": ".compute",
    "COMPONENTS": ".functions",
    "FUNCTIONS": ".functions",
    "STENCILS": ".functions",
    "Function": ".functions",
    "check_stencils": ".halo",
    "grow_range": ".halo",
    "input_box": ".halo",
    "needed_boxes": ".halo",
    "CHUNK_ELEMENTS": ".kernels",
    "BinOp": ".nodes",
    "BoolOp": ".nodes",
    "Call": ".nodes",
    "Compare": ".nodes",
    "Expr": ".nodes",
    "Num": ".nodes",
    "Ref": ".nodes",
    "UnaryOp": ".nodes",
    "MAX_DEPTH": ".parser",
    "MAX_INT_LITERAL": ".parser",
    "MAX_NESTING": ".parser",
    "check": ".parser",
    "parse": ".parser",
    "tokenize": ".parser",
}

__getattr__ = lazy.getattr_for(__name__, _WHERE, globals())


__all__ = [
    "BinOp",
    "Bounds",
    "BoolOp",
    "CHUNK_ELEMENTS",
    "COMPONENTS",
    "Call",
    "Compare",
    "DeviceUnavailableError",
    "Expr",
    "FUNCTIONS",
    "Function",
    "MAX_DEPTH",
    "MAX_INT_LITERAL",
    "MAX_NESTING",
    "Num",
    "Ref",
    "STENCILS",
    "UnaryOp",
    "check",
    "check_device",
    "check_inputs",
    "check_stencils",
    "component_names",
    "evaluate",
    "evaluate_regions",
    "gpu_available",
    "Interval",
    "grow_range",
    "input_box",
    "interval",
    "needed_boxes",
    "parse",
    "result_dtype",
    "tokenize",
    "truth",
]
