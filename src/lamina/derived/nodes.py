"""The expression tree: immutable nodes, their canonical text and their static properties.

Nodes are frozen dataclasses, so two trees are equal (and hash alike) when
they have the same structure; the source position ``pos`` of each node is
kept for error messages but takes no part in equality.  ``str(expr)`` is the
canonical text: fewest parentheses, one space around binary operators,
backticks only where a path needs them; it parses back to an equal tree.

Static properties (no data needed) used by the derived layer and the cost
model: :attr:`Expr.inputs`, :attr:`Expr.ncomponents`, :attr:`Expr.halo`,
:meth:`Expr.input_box`, :attr:`Expr.op_counts`, :attr:`Expr.flops_per_element`,
:meth:`Expr.bytes_per_element`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar

from .functions import FUNCTIONS, stencil_ops, vector_ops

if TYPE_CHECKING:  # pragma: no cover
    from functools import cached_property

    from ..geometry import Box
else:

    class cached_property:
        """A value computed at its first use and kept in the instance, as
        ``functools.cached_property`` keeps it, without its lock: on Python 3.11 that lock
        is one per property of a class, shared by every instance, and trees read from
        several threads at once (queries, reads of quantities) took the locks of two
        properties in both orders (``Expr.halo`` then ``Call.halo``, and the reverse): a
        deadlock.  Two threads may compute a value twice; both get the same."""

        def __init__(self, fn: Any) -> None:
            self.fn = fn
            self.name = fn.__name__
            self.__doc__ = fn.__doc__

        def __set_name__(self, owner: type, name: str) -> None:
            self.name = name

        def __get__(self, obj: Any, cls: type | None = None) -> Any:
            if obj is None:
                return self
            value = self.fn(obj)
            obj.__dict__[self.name] = value  # found there from now on (no __set__ here)
            return value


#: a dataset path written without backticks
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

# binding strength, loosest first (used by the parser and the printer)
P_OR, P_AND, P_NOT, P_CMP, P_ADD, P_MUL, P_UNARY, P_POW, P_ATOM = range(1, 10)

ARITH_OPS = ("+", "-", "*", "/", "^")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
BOOL_OPS = ("&", "|")


@dataclass(frozen=True)
class Expr:
    """Base class of all nodes.  ``pos``: 0-based offset of the node in the source text."""

    pos: int = field(default=-1, compare=False, repr=False, kw_only=True)

    precedence: ClassVar[int] = P_ATOM

    # -- structure ----------------------------------------------------------
    @property
    def children(self) -> tuple[Expr, ...]:
        return ()

    def walk(self) -> Iterator[Expr]:
        """This node and all below it, depth first, left to right (source order)."""
        stack: list[Expr] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def refs(self) -> Iterator[Ref]:
        """Every dataset reference, in source order (a path may occur several times)."""
        return (n for n in self.walk() if isinstance(n, Ref))

    def map_refs(self, fn: Callable[[str], str]) -> Expr:
        """A copy with every dataset path replaced by ``fn(path)`` (e.g. to resolve relative names)."""
        result = self._map_refs(fn)
        if self.source is not None:
            result.__dict__["_source"] = self.source
        return result

    def _map_refs(self, fn: Callable[[str], str]) -> Expr:
        if isinstance(self, Ref):
            return replace(self, path=fn(self.path))
        kids = self.children
        if not kids:
            return self
        new = [k._map_refs(fn) for k in kids]
        if isinstance(self, Call):
            return replace(self, args=tuple(new))
        if isinstance(self, UnaryOp):
            return replace(self, operand=new[0])
        return replace(self, left=new[0], right=new[1])  # type: ignore[call-arg]

    @property
    def source(self) -> str | None:
        """The text this tree was parsed from (on the root only; positions refer to it)."""
        return self.__dict__.get("_source")

    @cached_property
    def depth(self) -> int:
        """Height of the tree (1 for a leaf)."""
        return 1 + max((c.depth for c in self.children), default=0)

    # -- static properties ---------------------------------------------------
    @cached_property
    def inputs(self) -> frozenset[str]:
        """The dataset paths the expression reads."""
        return frozenset(r.path for r in self.refs())

    @property
    def ncomponents(self) -> int:
        """1 for a scalar (or a predicate), 3 for a vector (curl, cross, gradient(a))."""
        return 1

    @property
    def is_predicate(self) -> bool:
        """True for a boolean expression (comparison, &, |, ~)."""
        return False

    @property
    def is_constant(self) -> bool:
        """True if the expression reads no dataset."""
        return not self.inputs

    @cached_property
    def halo(self) -> int:
        """Cells of halo per side the expression needs in the *interior* of the domain.

        0 for pointwise expressions; each stencil adds its reach to the halo of
        its arguments (``gradient``/``divergence``/``curl`` 1, ``laplacian`` 2,
        so ``gradient(gradient(a, 0), 1)`` and ``laplacian(a)`` need 2 and
        ``laplacian(gradient(a, 0))`` needs 3).  The same width is assumed on
        every axis, which is exact for ``laplacian`` and conservative for a
        gradient along one axis.

        Growing a region by ``halo`` (clipped to the domain) gives enough input
        everywhere except for a region 1 cell thick touching a global boundary:
        the one-sided second-order formula there reads 3 points inward, so such
        a region needs one more cell.  :meth:`input_box` gives the exact box;
        ``halo + 1`` (when ``halo > 0``) is always enough.
        """
        kids = max((c.halo for c in self.children), default=0)
        return kids

    def input_box(self, region: Box | Sequence[slice], global_shape: Sequence[int]) -> Box:
        """The smallest box of input needed to evaluate *region* exactly (see :mod:`.halo`)."""
        from .halo import input_box

        return input_box(self, region, global_shape)

    @cached_property
    def op_counts(self) -> dict[str, int]:
        """Elementary operations per grid point, by category, for the cost model.

        Categories: ``add`` (also subtract, negate, abs, min/max, comparisons
        and boolean ops), ``mul``, ``div``, ``sqrt``, ``pow``, ``transcendental``
        (exp, log, trig).  Stencils count their interior formula; functions
        whose count depends on the number of dimensions assume 3.  Constant
        subexpressions are folded before evaluation and count nothing.
        """
        if self.is_constant:
            return {}
        total: Counter[str] = Counter()
        for c in self.children:
            total.update(c.op_counts)
        total.update(self._own_ops())
        return dict(total)

    def _own_ops(self) -> dict[str, int]:
        return {}

    @property
    def flops_per_element(self) -> int:
        """Sum of :attr:`op_counts`: operations per grid point (all components together)."""
        return sum(self.op_counts.values())

    def bytes_per_element(self, itemsize: int, out_itemsize: int | None = None) -> int:
        """Compulsory memory traffic per grid point: each input read once, each output component written once.

        *itemsize* is the size of one input element, *out_itemsize* that of one
        output element (default: *itemsize*).  Halo cells and temporaries are
        left out: the CPU kernels work in cache-sized blocks so that temporaries
        do not reach memory.  Divide :attr:`flops_per_element` by this for the
        arithmetic intensity of a roofline model.
        """
        out = itemsize if out_itemsize is None else out_itemsize
        return len(self.inputs) * itemsize + self.ncomponents * out

    # -- text ----------------------------------------------------------------
    def __str__(self) -> str:
        return _fmt(self, 0)

    def _text(self) -> str:  # the node's own text, without surrounding parentheses
        raise NotImplementedError


@dataclass(frozen=True)
class Num(Expr):
    """A numeric literal (int or float, finite, not negative: ``-2`` is ``UnaryOp('-', Num(2))``)."""

    value: int | float

    def __post_init__(self) -> None:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"Num needs an int or a float, got {v!r}")
        if isinstance(v, float) and (not math.isfinite(v) or math.copysign(1.0, v) < 0):
            raise ValueError(f"Num needs a finite value >= 0, got {v!r}")
        if isinstance(v, int) and v < 0:
            raise ValueError(f"Num needs a value >= 0, got {v!r}")

    def _text(self) -> str:
        return repr(self.value) if isinstance(self.value, float) else str(self.value)


@dataclass(frozen=True)
class Ref(Expr):
    """A dataset path; written bare if it is an identifier, else in backticks (a backtick doubled)."""

    path: str

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"Ref needs a non-empty path, got {self.path!r}")

    def _text(self) -> str:
        if NAME_RE.fullmatch(self.path):
            return self.path
        return "`" + self.path.replace("`", "``") + "`"


@dataclass(frozen=True)
class Call(Expr):
    """A function call ``name(arg, ...)``; ``name`` is a key of :data:`FUNCTIONS`."""

    name: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.args, tuple):
            object.__setattr__(self, "args", tuple(self.args))

    @property
    def children(self) -> tuple[Expr, ...]:
        return self.args

    @property
    def function(self):
        return FUNCTIONS[self.name]

    @property
    def ncomponents(self) -> int:
        if self.name in ("curl", "cross"):
            return 3
        if self.name == "gradient" and len(self.args) == 1:
            return 3
        return 1

    @cached_property
    def halo(self) -> int:
        f = FUNCTIONS.get(self.name)
        reach = f.reach if f is not None else 0
        return reach + max((c.halo for c in self.args), default=0)

    def _own_ops(self) -> dict[str, int]:
        f = FUNCTIONS.get(self.name)
        if f is None:
            return {}
        if f.kind == "stencil":
            return stencil_ops(self.name, len(self.args))
        if f.kind == "vector":
            return vector_ops(self.name, sum(a.ncomponents for a in self.args))
        if f.kind == "fold":
            return {"add": max(len(self.args) - 1, 0)}
        return dict(f.ops)

    def _text(self) -> str:
        return self.name + "(" + ", ".join(_fmt(a, 0) for a in self.args) + ")"


@dataclass(frozen=True)
class BinOp(Expr):
    """Arithmetic ``left op right`` with op in ``+ - * / ^`` (``**`` is written ``^``)."""

    op: str
    left: Expr
    right: Expr

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return {"+": P_ADD, "-": P_ADD, "*": P_MUL, "/": P_MUL, "^": P_POW}[self.op]

    def _own_ops(self) -> dict[str, int]:
        if self.op == "^" and self.right == Num(2):
            return {"mul": 1}
        return {{"+": "add", "-": "add", "*": "mul", "/": "div", "^": "pow"}[self.op]: 1}

    def _text(self) -> str:
        p = self.precedence
        if self.op == "^":  # right associative; the base is an atom, the exponent may be negated
            return f"{_fmt(self.left, P_ATOM)} ^ {_fmt(self.right, P_UNARY)}"
        return f"{_fmt(self.left, p)} {self.op} {_fmt(self.right, p + 1)}"


@dataclass(frozen=True)
class UnaryOp(Expr):
    """``-operand`` (negation) or ``~operand`` (logical not, predicates only)."""

    op: str
    operand: Expr

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return P_NOT if self.op == "~" else P_UNARY

    @property
    def is_predicate(self) -> bool:
        return self.op == "~"

    def _own_ops(self) -> dict[str, int]:
        return {"add": 1}

    def _text(self) -> str:
        if (
            self.op == "~"
        ):  # '~(a < b)' rather than the equivalent '~a < b', which reads like Python
            inner = self.operand
            need = P_NOT if isinstance(inner, UnaryOp) and inner.op == "~" else P_ATOM
            return "~" + _fmt(inner, need)
        return self.op + _fmt(self.operand, self.precedence)


@dataclass(frozen=True)
class Compare(Expr):
    """``left op right`` with op in ``< <= > >= == !=`` (predicates only; not chained)."""

    op: str
    left: Expr
    right: Expr

    precedence: ClassVar[int] = P_CMP

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    @property
    def is_predicate(self) -> bool:
        return True

    def _own_ops(self) -> dict[str, int]:
        return {"add": 1}

    def _text(self) -> str:
        return f"{_fmt(self.left, P_ADD)} {self.op} {_fmt(self.right, P_ADD)}"


@dataclass(frozen=True)
class BoolOp(Expr):
    """``left & right`` or ``left | right`` on predicates (binding looser than comparisons)."""

    op: str
    left: Expr
    right: Expr

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return P_AND if self.op == "&" else P_OR

    @property
    def is_predicate(self) -> bool:
        return True

    def _own_ops(self) -> dict[str, int]:
        return {"add": 1}

    def _text(self) -> str:
        p = self.precedence
        return f"{_fmt(self.left, p)} {self.op} {_fmt(self.right, p + 1)}"


def _fmt(node: Expr, need: int) -> str:
    """Text of *node*, in parentheses if it binds more loosely than *need*."""
    text = node._text()
    return f"({text})" if node.precedence < need else text


def node_fields(node: Expr) -> dict[str, object]:
    """The compared fields of a node (for debugging and tests)."""
    return {f.name: getattr(node, f.name) for f in fields(node) if f.compare}
