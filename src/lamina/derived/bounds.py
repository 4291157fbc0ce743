"""Interval bounds of expressions and predicates from per-block statistics (for query pruning).

Given ``[min, max]`` of each input over a block (the statistics every block
carries), :func:`interval` bounds an expression over that block and
:func:`truth` tells whether a predicate *can* be true (and can be false)
somewhere in it, so a query reads only the blocks that may match.  The
answers are conservative: "can be true" is never False for a block that has
a matching element.

Rules:

* every computed bound is widened outward by a relative 2**-20 (and at
  least 2**-126), so rounding of float64 and float32 arithmetic and the
  few-ulp errors of numpy's transcendental functions cannot make a bound
  too tight (float16 data is not covered);
* NaN is tracked: an input may contain NaN if its range says so
  (``(lo, hi, True)``, or a NaN bound), and ``0/0``, ``inf - inf``,
  ``sqrt(-1)``, ``log(-1)`` ... mark a result as possibly NaN; a comparison
  with NaN is False (``!=``: True), as in numpy;
* stencils (``gradient`` ...) read neighbouring blocks, so their bounds are
  unknown: ``(-inf, inf)``, possibly NaN;
* integer overflow is assumed not to happen (numpy would wrap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ExpressionError
from .nodes import BinOp, BoolOp, Call, Compare, Expr, Num, Ref, UnaryOp
from .parser import check

INF = math.inf


@dataclass(frozen=True)
class Interval:
    """Values in ``[lo, hi]`` (none if ``lo > hi``), plus NaN if ``nan``."""

    lo: float
    hi: float
    nan: bool = False

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    @classmethod
    def of(cls, value) -> Interval:
        """From ``(lo, hi)``, ``(lo, hi, may_have_nan)`` or an Interval."""
        if isinstance(value, Interval):
            return value
        vals = list(value)
        if len(vals) not in (2, 3):
            raise ExpressionError(f"a range is (lo, hi) or (lo, hi, may_have_nan), got {value!r}")
        lo, hi = float(vals[0]), float(vals[1])
        nan = bool(vals[2]) if len(vals) == 3 else False
        if math.isnan(lo) or math.isnan(hi):
            return cls(-INF, INF, True)
        return cls(lo, hi, nan)


FULL = Interval(-INF, INF, True)
NONE = Interval(INF, -INF, False)


#: relative widening of every computed bound: covers float32 rounding (2**-24) and the few-ulp
#: errors of numpy's SIMD transcendental functions; absolute floor for numbers near 0
_REL, _ABS = 2.0**-20, 2.0**-126


def _down(x: float) -> float:
    return x if math.isinf(x) else x - max(abs(x) * _REL, _ABS)


def _up(x: float) -> float:
    return x if math.isinf(x) else x + max(abs(x) * _REL, _ABS)


def _make(los: Sequence[float], his: Sequence[float], nan: bool) -> Interval:
    """Widened interval from candidate bounds (NaN candidates mean NaN is possible)."""
    good_lo = [x for x in los if not math.isnan(x)]
    good_hi = [x for x in his if not math.isnan(x)]
    nan = nan or len(good_lo) < len(los) or len(good_hi) < len(his)
    if not good_lo or not good_hi:
        return Interval(-INF, INF, True)
    return Interval(_down(min(good_lo)), _up(max(good_hi)), nan)


def interval(expr: Expr, ranges: Mapping[str, object]) -> Interval:
    """Bounds of scalar *expr* over a block whose inputs lie in *ranges* (path -> (lo, hi[, nan]))."""
    if expr.is_predicate or expr.ncomponents != 1:
        raise ExpressionError("interval() needs a scalar expression", None, expr.source)
    return _iv(expr, ranges)


def truth(pred: Expr, ranges: Mapping[str, object]) -> tuple[bool, bool]:
    """``(can_be_true, can_be_false)`` of predicate *pred* over a block with inputs in *ranges*.

    A query skips a block when ``can_be_true`` is False, and can take a
    whole block without testing elements when ``can_be_false`` is False.
    """
    check(pred, "predicate", pred.source)
    return _truth(pred, ranges)


def _iv(node: Expr, ranges) -> Interval:
    if isinstance(node, Num):
        v = float(node.value)
        if isinstance(node.value, int) and abs(node.value) <= 2**24:
            return Interval(v, v)
        return Interval(_down(v), _up(v))  # against float32 data, a literal is rounded to float32
    if isinstance(node, Ref):
        if node.path not in ranges:
            raise ExpressionError(
                f"no range for dataset {node.path!r}", node.pos if node.pos >= 0 else None
            )
        return Interval.of(ranges[node.path])
    if isinstance(node, UnaryOp):  # '-'
        a = _iv(node.operand, ranges)
        return a if a.empty else Interval(-a.hi, -a.lo, a.nan)
    if isinstance(node, BinOp):
        return _binop(node.op, _iv(node.left, ranges), _iv(node.right, ranges), node.right)
    if isinstance(node, Call):
        return _call(node, ranges)
    raise ExpressionError(f"no bounds for {type(node).__name__}")


def _binop(op: str, a: Interval, b: Interval, right: Expr | None = None) -> Interval:
    nan = a.nan or b.nan
    if a.empty or b.empty:  # only NaN on one side: NaN, except nan ^ 0 = 1 ^ nan = 1
        return FULL if op == "^" else Interval(INF, -INF, nan)
    if op == "+":  # inf + -inf is NaN
        nan = nan or (a.hi == INF and b.lo == -INF) or (a.lo == -INF and b.hi == INF)
        return _make([a.lo + b.lo], [a.hi + b.hi], nan)
    if op == "-":  # inf - inf is NaN
        nan = nan or (a.hi == INF and b.hi == INF) or (a.lo == -INF and b.lo == -INF)
        return _make([a.lo - b.hi], [a.hi - b.lo], nan)
    if op == "*":
        ps = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        iv = _make(ps, ps, nan)
        if (a.lo <= 0 <= a.hi and math.isinf(max(abs(b.lo), abs(b.hi)))) or (
            b.lo <= 0 <= b.hi and math.isinf(max(abs(a.lo), abs(a.hi)))
        ):
            return Interval(min(iv.lo, 0.0), max(iv.hi, 0.0), True)  # 0 * inf
        return iv
    if op == "/":
        if b.lo <= 0 <= b.hi:
            return Interval(-INF, INF, nan or a.lo <= 0 <= a.hi or b.lo == b.hi == 0)
        qs = [a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi]
        return _make(
            qs,
            qs,
            nan
            or (math.isinf(a.lo) or math.isinf(a.hi))
            and (math.isinf(b.lo) or math.isinf(b.hi)),
        )
    if op == "^":
        n = right.value if isinstance(right, Num) else None
        if isinstance(n, int) or (isinstance(n, float) and n.is_integer() and abs(n) < 2**53):
            n = int(n)
            if n == 0:
                return Interval(1.0, 1.0, nan)
            if n > 0:
                cands = [_pow(a.lo, n), _pow(a.hi, n)]
                lo = 0.0 if (n % 2 == 0 and a.lo <= 0 <= a.hi) else min(cands)
                return _make([lo], [max(cands)], nan)
        if isinstance(n, float) and n > 0 and a.lo >= 0:  # x ^ 0.5 and friends: monotone on x >= 0
            return _make([_pow(a.lo, n)], [_pow(a.hi, n)], nan)
        return FULL
    raise ExpressionError(f"no bounds for operator {op!r}")


def _pow(x: float, n: float) -> float:
    try:
        return x**n
    except OverflowError:
        return INF if x > 0 or (isinstance(n, int) and n % 2 == 0) else -INF


def _monotone(
    fn,
    a: Interval,
    lo_dom: float = -INF,
    hi_dom: float = INF,
    increasing: bool = True,
    open_lo: bool = False,
) -> Interval:
    """*fn* applied to *a* clipped to its domain; values outside the domain give NaN."""
    nan = a.nan or a.lo < lo_dom or (open_lo and a.lo <= lo_dom) or a.hi > hi_dom
    lo, hi = max(a.lo, lo_dom), min(a.hi, hi_dom)
    if lo > hi or a.empty:
        return Interval(INF, -INF, True)
    vals = []
    for x in (lo, hi):
        try:
            vals.append(fn(x))
        except (ValueError, OverflowError):
            vals.append(-INF if (x == lo_dom and open_lo) else (INF if increasing else -INF))
    lo_v, hi_v = (vals[0], vals[1]) if increasing else (vals[1], vals[0])
    return _make([lo_v], [hi_v], nan)


def _square(a: Interval) -> Interval:
    return _binop("^", a, a, Num(2))


def _call(node: Call, ranges) -> Interval:
    name = node.name
    f = node.function
    if f.kind == "stencil":
        return FULL
    if f.kind == "vector":
        comps = []
        for arg in node.args:
            if arg.ncomponents == 1:
                comps.append(_iv(arg, ranges))
            else:  # a vector argument (curl, cross, gradient(a)): unknown components
                comps.extend([_iv_vector(arg, ranges, k) for k in range(arg.ncomponents)])
        if name == "magnitude":
            s = _square(comps[0])
            for c in comps[1:]:
                s = _binop("+", s, _square(c))
            return _monotone(math.sqrt, s, 0.0)
        if name == "dot":
            n = len(comps) // 2
            s = _binop("*", comps[0], comps[n])
            for i in range(1, n):
                s = _binop("+", s, _binop("*", comps[i], comps[n + i]))
            return s
        return FULL  # cross has 3 components: not reached through interval()
    args = [_iv(a, ranges) for a in node.args]
    if f.kind == "binary":
        op = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "pow": "^"}[name]
        return _binop(op, args[0], args[1], node.args[1])
    if f.kind == "fold":
        nan = any(a.nan for a in args)
        if any(a.empty for a in args):
            return Interval(INF, -INF, nan)
        pick = min if name == "min" else max
        return Interval(pick(a.lo for a in args), pick(a.hi for a in args), nan)
    a = args[0]
    if name == "abs":
        if a.empty:
            return a
        lo = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
        return Interval(lo, max(abs(a.lo), abs(a.hi)), a.nan)
    if name == "sqrt":
        return _monotone(math.sqrt, a, 0.0)
    if name == "exp":
        return _monotone(lambda x: math.exp(x) if x < 710 else INF, a)
    if name == "log":
        return _monotone(lambda x: math.log(x) if x > 0 else -INF, a, 0.0)
    if name == "atan":
        return _monotone(math.atan, a)
    if name == "asin":
        return _monotone(math.asin, a, -1.0, 1.0)
    if name == "acos":
        return _monotone(math.acos, a, -1.0, 1.0, increasing=False)
    if name in ("sin", "cos"):
        if a.empty:
            return a
        return Interval(-1.0, 1.0, a.nan or math.isinf(a.lo) or math.isinf(a.hi))
    return FULL  # tan and anything else


def _iv_vector(node: Expr, ranges, k: int) -> Interval:
    if isinstance(node, Call) and node.name == "cross":
        comps = [
            c
            for a in node.args
            for c in ([_iv(a, ranges)] if a.ncomponents == 1 else [FULL] * a.ncomponents)
        ]
        p, q = comps[:3], comps[3:]
        i, j = ((1, 2), (2, 0), (0, 1))[k]
        return _binop("-", _binop("*", p[i], q[j]), _binop("*", p[j], q[i]))
    return FULL


def _truth(node: Expr, ranges) -> tuple[bool, bool]:
    if isinstance(node, BoolOp):
        t1, f1 = _truth(node.left, ranges)
        t2, f2 = _truth(node.right, ranges)
        if node.op == "&":
            return t1 and t2, f1 or f2
        return t1 or t2, f1 and f2
    if isinstance(node, UnaryOp) and node.op == "~":
        t, f = _truth(node.operand, ranges)
        return f, t
    if isinstance(node, Compare):
        a, b = _iv(node.left, ranges), _iv(node.right, ranges)
        nan = a.nan or b.nan
        if a.empty or b.empty:  # only NaN on one side: every comparison is False, '!=' True
            return (node.op == "!=") and nan, (node.op != "!=") and nan
        op = node.op
        if op in (">", ">="):  # a > b is b < a
            a, b, op = b, a, "<" if op == ">" else "<="
        if op == "<":
            return a.lo < b.hi, a.hi >= b.lo or nan
        if op == "<=":
            return a.lo <= b.hi, a.hi > b.lo or nan
        overlap = a.lo <= b.hi and b.lo <= a.hi
        single = a.lo == a.hi == b.lo == b.hi
        if op == "==":
            return overlap, not single or nan
        return not single or nan, overlap  # '!='
    raise ExpressionError(f"not a condition: {node}", node.pos if node.pos >= 0 else None)
