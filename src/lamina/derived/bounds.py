"""Interval bounds of expressions and predicates from per-block statistics (for query pruning).

Given ``[min, max]`` of each input over a block (the statistics every block
carries) and the dtype of each input, :class:`Bounds` bounds an expression
over that block and tells whether a predicate *can* be true (and can be
false) somewhere in it, so a query reads only the blocks that may match and
takes a block whole only where every element is proven to match.

The bounds follow the arithmetic of :func:`lamina.derived.evaluate`, dtype by
dtype, so that they are proven, never estimated: for every element of a
block whose inputs lie in the given ranges, the value the evaluator computes
lies in the bound, and a predicate the evaluator finds True somewhere is
"can be true" (False somewhere: "can be false").

* **dtypes** -- every node has the dtype the evaluator gives it (numpy's
  promotion, NEP 50), learnt by running the kernels on tiny arrays
  (:func:`~lamina.derived.compute.node_dtypes`).  A constant subexpression is
  folded to the Python number the evaluator uses (:func:`~.kernels.fold`),
  weakly typed: it is cast, as numpy casts it, to the dtype of the operation
  it enters, so ``0.1`` against float16 data is ``float16(0.1)`` and ``1e300``
  against float32 data is ``inf``.
* **integers** (bool, int8 ... uint64) are bounded exactly, with Python
  integers.  Where the exact range of an operation leaves its dtype, numpy
  wraps: the bound is the wrapped range when every value of the range wraps
  by the same multiple of ``2**bits``, else the whole range of the dtype
  (``uint8: a + a`` is within ``[0, 255]``, never above).  Booleans add as
  ``or`` and multiply as ``and``, as numpy does.
* **floats**: ``+ - * /``, ``x ^ 2`` (``x * x``), negation, ``abs``, ``min`` and
  ``max`` are rounded correctly by numpy, so the bounds are computed exactly
  and rounded outward -- the lower bound down, the upper bound up -- to the
  node's dtype; a value beyond the dtype's largest finite number becomes
  ``inf`` there.  numpy's other functions (``sqrt exp log sin cos asin acos
  atan``, ``pow``) are allowed a relative error of 2**-20 (and an absolute
  2**-126) before that rounding, which covers their float32 and float64
  vector code and float16, computed in float32.
* **NaN** is tracked: an input may hold NaN if its range says so
  (``(lo, hi, True)``, or a NaN bound), and ``0/0``, ``inf - inf``,
  ``0 * inf``, ``sqrt(-1)``, ``log(-1)`` ... mark a result as possibly NaN;
  a comparison with NaN is False (``!=``: True), as in numpy.
* **comparisons** happen where numpy makes them: two integers (datasets or
  literals) are compared exactly, anything else in the promoted floating
  dtype, both sides cast to it (``int64 == 1.0`` compares in float64).
* what cannot be bounded is *unknown* (the dtype's whole range, and NaN for
  floats): stencils (they read neighbouring blocks), ``tan``, complex
  numbers, an integer to a power that may be negative, a power with a
  non-constant exponent, and every node of an expression the evaluator
  refuses for these dtypes.  A predicate with an unknown part is then
  possibly true and possibly false: its block is evaluated element by
  element, which gives the exact answer (or the evaluator's error).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from ..errors import ExpressionError
from .compute import node_dtypes
from .kernels import ConstantOverflow, fold, fold_numbers
from .nodes import BinOp, BoolOp, Call, Compare, Expr, Ref, UnaryOp
from .parser import check

INF = math.inf
_MAX64 = sys.float_info.max
_F64 = np.dtype(np.float64)


@dataclass(frozen=True)
class Interval:
    """Values in ``[lo, hi]`` (none if ``lo > hi``), plus NaN if ``nan``.

    Bounds of integer values are Python ints (exact); of floating values,
    floats (``-inf`` and ``inf`` allowed).
    """

    lo: int | float
    hi: int | float
    nan: bool = False

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    @classmethod
    def of(cls, value) -> Interval:
        """From ``(lo, hi)``, ``(lo, hi, may_have_nan)`` or an Interval (integer bounds stay exact)."""
        if isinstance(value, Interval):
            return value
        vals = list(value)
        if len(vals) not in (2, 3):
            raise ExpressionError(f"a range is (lo, hi) or (lo, hi, may_have_nan), got {value!r}")
        lo, hi = _number(vals[0], up=False), _number(vals[1], up=True)
        nan = bool(vals[2]) if len(vals) == 3 else False
        if (isinstance(lo, float) and math.isnan(lo)) or (isinstance(hi, float) and math.isnan(hi)):
            return cls(-INF, INF, True)
        return cls(lo, hi, nan)


def _number(v, up: bool) -> int | float:
    """A bound as a Python number: integers exact, floats of a wider dtype than float64 (a long
    double) rounded outward, *up* for an upper bound."""
    if isinstance(v, bool | np.bool_):
        return int(v)
    if isinstance(v, int | np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return f64_of(v, up)
    return float(v)


#: any value, possibly NaN
FULL = Interval(-INF, INF, True)
#: no value at all
NONE = Interval(INF, -INF, False)

#: relative and absolute error allowed to numpy's functions that are not rounded correctly
_REL, _ABS = 2.0**-20, 2.0**-126


def interval(
    expr: Expr, ranges: Mapping[str, object], dtypes: Mapping[str, Any] | None = None
) -> Interval:
    """Bounds of scalar *expr* over a block whose inputs lie in *ranges* (path -> (lo, hi[, nan])).

    *dtypes* gives the dtype of each input (path -> dtype); default float64
    for all.  Integer results have integer bounds.
    """
    if expr.is_predicate or expr.ncomponents != 1:
        raise ExpressionError("interval() needs a scalar expression", None, expr.source)
    return Bounds(expr, dtypes).interval(ranges)


def truth(
    pred: Expr, ranges: Mapping[str, object], dtypes: Mapping[str, Any] | None = None
) -> tuple[bool, bool]:
    """``(can_be_true, can_be_false)`` of predicate *pred* over a block with inputs in *ranges*.

    *dtypes* gives the dtype of each input (path -> dtype); default float64
    for all.  A query skips a block when ``can_be_true`` is False, and can
    take a whole block without testing elements when ``can_be_false`` is
    False.  For many blocks, build one :class:`Bounds` and call its
    :meth:`~Bounds.truth`.
    """
    check(pred, "predicate", pred.source)
    return Bounds(pred, dtypes).truth(ranges)


# ---------------------------------------------------------------------------
# rounding
# ---------------------------------------------------------------------------


def _f64(x: int | float | Fraction, up: bool) -> float:
    """The float64 nearest to *x* in the direction asked (down: largest <= x; up: smallest >= x)."""
    if isinstance(x, float):
        return x
    try:
        f = float(x)  # correctly rounded for int and Fraction
    except OverflowError:
        if x > 0:
            return INF if up else _MAX64
        return -_MAX64 if up else -INF
    if up and f < x:
        return math.nextafter(f, INF)
    if not up and f > x:
        return math.nextafter(f, -INF)
    return f


def _to(x: int | float | Fraction, dt: np.dtype, up: bool) -> float:
    """*x* rounded to a value of the floating dtype *dt*: down (largest <= x) or up (smallest >= x)."""
    f = _f64(x, up)
    if dt.itemsize >= 8 or math.isinf(f) or math.isnan(f):
        return f  # float64 (or wider: a float64 bound is also a bound there)
    y = float(dt.type(f))  # nearest; beyond the largest finite value: inf
    if up and y < f:
        return float(np.nextafter(dt.type(y), dt.type(INF)))
    if not up and y > f:
        return float(np.nextafter(dt.type(y), dt.type(-INF)))
    return y


def _exact(op: str, x: float, y: float) -> Fraction:
    fx, fy = Fraction(x), Fraction(y)
    if op == "+":
        return fx + fy
    if op == "*":
        return fx * fy
    return fx / fy


def _arith(op: str, x: float, y: float, up: bool) -> float:
    """``x op y`` (op in ``+ * /``) on floats, rounded down or up; NaN where IEEE gives NaN."""
    r = x + y if op == "+" else x * y if op == "*" else x / y
    if math.isnan(r) or math.isinf(x) or math.isinf(y):
        return r  # exact in the extended reals (or NaN)
    if op == "*" and (x == 0 or y == 0):
        return 0.0
    e = None  # the rounding error: x op y == r + e exactly (where computed without Fraction)
    if op == "+" and abs(r) < 2.0**1000:
        b = r - x  # TwoSum
        e = (x - (r - b)) + (y - b)
    elif op == "*" and _SAFE < abs(x) < _HUGE and _SAFE < abs(y) < _HUGE and abs(r) > _SAFE:
        xh, xl = _split(x)  # Dekker's TwoProduct (no over- or underflow in this range)
        yh, yl = _split(y)
        e = ((xh * yh - r) + xh * yl + xl * yh) + xl * yl
    if e is None:
        return _f64(_exact(op, x, y), up)
    if up:
        return r if e <= 0 else math.nextafter(r, INF)
    return r if e >= 0 else math.nextafter(r, -INF)


#: the range where TwoProduct is exact
_SAFE, _HUGE = 2.0**-450, 2.0**450


def _split(a: float) -> tuple[float, float]:
    """Veltkamp's split of *a* into two halves of 26 bits: a == hi + lo."""
    c = 134217729.0 * a  # 2**27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _sqrt(x: float, up: bool) -> float:
    if x == INF or x == 0:
        return x
    s = math.sqrt(x)
    sq = Fraction(s) ** 2
    if up and sq < x:
        return math.nextafter(s, INF)
    if not up and sq > x:
        return math.nextafter(s, -INF)
    return s


def _widen(lo: float, hi: float) -> tuple[float, float]:
    """Room for a function's error: a relative 2**-20, at least 2**-126."""
    if not math.isinf(lo):
        lo -= max(abs(lo) * _REL, _ABS)
    if not math.isinf(hi):
        hi += max(abs(hi) * _REL, _ABS)
    return lo, hi


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------


def _int_range(dt: np.dtype) -> tuple[int, int]:
    if dt.kind == "b":
        return 0, 1
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _unknown(dt: np.dtype) -> Interval:
    """Any value of *dt* (NaN too for floating and complex dtypes)."""
    if dt.kind in "biu":
        lo, hi = _int_range(dt)
        return Interval(lo, hi)
    return FULL


def _wrap(lo: int, hi: int, dt: np.dtype) -> Interval:
    """The exact integer range ``[lo, hi]`` as numpy holds it in *dt* (wrapping modulo 2**bits)."""
    m, mx = _int_range(dt)
    if m <= lo and hi <= mx:
        return Interval(lo, hi)
    size = mx - m + 1
    k = (lo - m) // size
    if (hi - m) // size == k:
        return Interval(lo - k * size, hi - k * size)
    return Interval(m, mx)


class _V(NamedTuple):
    """A node's bound: its interval in dtype ``dt``, or (``dt`` None) a weakly typed Python number."""

    iv: Interval
    dt: np.dtype | None
    value: Any = None


def _weak(value: Any) -> _V:
    if isinstance(value, float) and math.isnan(value):
        return _V(Interval(INF, -INF, True), None, value)
    return _V(Interval(_number(value, up=False), _number(value, up=True)), None, value)


def _desc(v: _V) -> Any:
    """What numpy's promotion sees: the dtype of an array, the Python number of a constant."""
    return v.dt if v.dt is not None else v.value


def _promote(*vals: _V) -> np.dtype:
    return np.result_type(*(_desc(v) for v in vals))


def _integral(v: _V) -> bool:
    if v.dt is None:
        return isinstance(v.value, int | bool)
    return v.dt.kind in "biu"


def _cast(v: _V, dt: np.dtype) -> Interval:
    """The values of *v* once numpy has cast them to *dt* (the dtype of the operation they enter)."""
    iv = v.iv
    if dt.kind == "c" or (v.dt is not None and v.dt.kind == "c"):
        return FULL
    if dt.kind in "biu":
        if iv.empty:
            return NONE
        if not _integral(v):  # numpy never casts floats to integers here
            return _unknown(dt)
        m, mx = _int_range(dt)
        if not (m <= iv.lo and iv.hi <= mx):  # numpy refuses (a literal) or this is not its cast
            return _unknown(dt)
        return iv
    if v.dt is None:  # numpy's own conversion of the Python number (0.1 -> float16(0.1))
        x = np.array(v.value, dtype=dt)[()]
        if np.isnan(x):
            return Interval(INF, -INF, True)
        return Interval(f64_of(x, up=False), f64_of(x, up=True))
    if iv.empty or v.dt == dt:
        return iv
    # numpy's cast (int64 -> float64 rounds to nearest, 70000 -> float16 is inf) is monotone:
    # the casts of the bounds bound the casts of the values
    lo = f64_of(np.array(iv.lo, dtype=v.dt).astype(dt)[()], up=False)
    hi = f64_of(np.array(iv.hi, dtype=v.dt).astype(dt)[()], up=True)
    return Interval(lo, hi, iv.nan)


def f64_of(x: Any, up: bool) -> float:
    """The float64 nearest to *x*, a value of a floating dtype, in the direction asked (down:
    the largest <= x; up: the smallest >= x): *x* itself but where the dtype is wider than
    float64 (a long double: 2^53 + 1 is one, and nearest would be 2^53)."""
    if x.dtype.itemsize <= 8 or not np.isfinite(x):
        return float(x)
    return _f64(Fraction(*x.as_integer_ratio()), up)


# ---------------------------------------------------------------------------
# operations in one dtype
# ---------------------------------------------------------------------------

#: ufunc names of the operators and binary functions
_UFUNC = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "^": "power"}
_BINARY = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "pow": "^"}


def _fold2(name: str, a: Any, b: Any) -> _V:
    """Two Python numbers through the ufunc, as the evaluator folds them (integers exactly:
    ``0 * 2^63`` is 0, where numpy's int64 refuses 2^63); ExpressionError where it raises."""
    try:
        with np.errstate(all="ignore"):
            r = fold_numbers(name, (a, b))
    except (ConstantOverflow, ZeroDivisionError, OverflowError) as e:
        raise ExpressionError(f"cannot compute the constant {a} {name} {b}: {e}") from None
    return _weak(r)


def _op(name: str, vals: Sequence[_V], dt: np.dtype) -> Interval:
    """Bound of ufunc *name* of *vals*, computed in dtype *dt* (operands cast to it first)."""
    ivs = [_cast(v, dt) for v in vals]
    if dt.kind == "b":
        return _bool_op(name, ivs)
    if dt.kind in "iu":
        if any(iv.empty for iv in ivs):
            return NONE
        return _int_op(name, ivs, dt)
    if dt.kind == "f":
        return _float_op(name, ivs, dt, vals)
    return _unknown(dt)


def _bool_op(name: str, ivs: list[Interval]) -> Interval:
    if any(iv.empty for iv in ivs):
        return NONE
    if name in ("add", "maximum"):  # or
        return Interval(max(iv.lo for iv in ivs), max(iv.hi for iv in ivs))
    if name in ("multiply", "minimum"):  # and
        return Interval(min(iv.lo for iv in ivs), min(iv.hi for iv in ivs))
    if name == "absolute":
        return ivs[0]
    return Interval(0, 1)


def _int_op(name: str, ivs: list[Interval], dt: np.dtype) -> Interval:
    a = ivs[0]
    lo: int
    hi: int
    if name == "negative":
        return _wrap(-int(a.hi), -int(a.lo), dt)
    if name == "absolute":
        if a.lo <= 0 <= a.hi:
            return _wrap(0, int(max(-a.lo, a.hi)), dt)
        return _wrap(int(min(abs(a.lo), abs(a.hi))), int(max(abs(a.lo), abs(a.hi))), dt)
    b = ivs[1]
    alo, ahi, blo, bhi = int(a.lo), int(a.hi), int(b.lo), int(b.hi)
    if name == "add":
        return _wrap(alo + blo, ahi + bhi, dt)
    if name == "subtract":
        return _wrap(alo - bhi, ahi - blo, dt)
    if name == "multiply":
        ps = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
        return _wrap(min(ps), max(ps), dt)
    if name == "minimum":
        return Interval(min(alo, blo), min(ahi, bhi))
    if name == "maximum":
        return Interval(max(alo, blo), max(ahi, bhi))
    if name == "power":
        if blo < 0 or bhi > 64:  # numpy raises on negative powers; large ones: no bound worth it
            return _unknown(dt)
        cands: list[int] = []
        for n in range(blo, bhi + 1):
            ends = [alo**n, ahi**n]
            cands += ends
            if n % 2 == 0 and alo <= 0 <= ahi:
                cands.append(0)
        lo, hi = min(cands), max(cands)
        return _wrap(lo, hi, dt)
    return _unknown(dt)


def _float_op(name: str, ivs: list[Interval], dt: np.dtype, vals: Sequence[_V]) -> Interval:
    a = ivs[0]
    if name == "negative":
        return a if a.empty else Interval(-a.hi, -a.lo, a.nan)
    if name == "absolute":
        if a.empty:
            return a
        lo = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
        return Interval(lo, max(abs(a.lo), abs(a.hi)), a.nan)
    if name in _FUNCS:
        return _function(name, a, dt)
    b = ivs[1]
    nan = a.nan or b.nan
    if name in ("minimum", "maximum"):  # NaN anywhere gives NaN
        if a.empty or b.empty:
            return Interval(INF, -INF, nan)
        pick = min if name == "minimum" else max
        return Interval(pick(a.lo, b.lo), pick(a.hi, b.hi), nan)
    if name == "power":
        return _float_power(a, b, dt, vals)
    if a.empty or b.empty:  # only NaN on one side
        return Interval(INF, -INF, nan)
    if name == "subtract":
        b = Interval(-b.hi, -b.lo, b.nan)
        name = "add"
    if name == "add":  # inf + -inf is NaN
        nan = nan or (a.hi == INF and b.lo == -INF) or (a.lo == -INF and b.hi == INF)
        lo = _arith("+", a.lo, b.lo, False)
        hi = _arith("+", a.hi, b.hi, True)
        return _rounded(-INF if math.isnan(lo) else lo, INF if math.isnan(hi) else hi, nan, dt)
    if name == "multiply":
        return _corners("*", a, b, nan, dt)
    if name == "divide":
        if b.lo <= 0 <= b.hi:
            both_inf = (math.isinf(a.lo) or math.isinf(a.hi)) and (
                math.isinf(b.lo) or math.isinf(b.hi)
            )
            return Interval(-INF, INF, nan or a.lo <= 0 <= a.hi or both_inf)
        return _corners("/", a, b, nan, dt)
    return _unknown(dt)


def _corners(op: str, a: Interval, b: Interval, nan: bool, dt: np.dtype) -> Interval:
    """``a * b`` or ``a / b`` (b without 0): the hull of the corners; ``0 * inf``, ``inf / inf``: NaN."""
    los: list[float] = []
    his: list[float] = []
    skipped = False
    for x in (a.lo, a.hi):
        for y in (b.lo, b.hi):
            lo = _arith(op, x, y, False)
            if math.isnan(lo):
                skipped = True
                continue
            los.append(lo)
            his.append(_arith(op, x, y, True))
    if op == "*":  # 0 * inf inside the box, not only at a corner
        skipped = skipped or (
            (a.lo <= 0 <= a.hi and (math.isinf(b.lo) or math.isinf(b.hi)))
            or (b.lo <= 0 <= b.hi and (math.isinf(a.lo) or math.isinf(a.hi)))
        )
    else:
        skipped = skipped or (
            (math.isinf(a.lo) or math.isinf(a.hi)) and (math.isinf(b.lo) or math.isinf(b.hi))
        )
    if skipped:  # those elements are NaN; next to them, finite products and quotients reach 0
        nan = True
        los.append(0.0)
        his.append(0.0)
    return _rounded(min(los), max(his), nan, dt)


def _rounded(lo: float, hi: float, nan: bool, dt: np.dtype) -> Interval:
    return Interval(_to(lo, dt, False), _to(hi, dt, True), nan)


def _square(a: Interval, dt: np.dtype) -> Interval:
    """``x * x`` of one value (never negative)."""
    if a.empty:
        return a
    small = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
    big = max(abs(a.lo), abs(a.hi))
    return _rounded(_arith("*", small, small, False), _arith("*", big, big, True), a.nan, dt)


def _float_power(a: Interval, b: Interval, dt: np.dtype, vals: Sequence[_V]) -> Interval:
    """``a ^ b`` with a constant exponent (numpy's pow: within the functions' error); else unknown."""
    if vals[1].dt is not None or b.empty or b.lo != b.hi:
        return FULL
    n = b.lo  # the exponent as numpy casts it to dt
    if n == 0:
        return Interval(1.0, 1.0, a.nan)  # x ^ 0 = 1, also for inf and NaN
    if a.empty:
        return a
    if n > 0 and float(n).is_integer() and n < 2**53:
        k = int(n)
        ends = [_pow(a.lo, k), _pow(a.hi, k)]
        lo = 0.0 if (k % 2 == 0 and a.lo <= 0 <= a.hi) else min(ends)
        return _rounded(*_widen(lo, max(ends)), a.nan, dt)
    if n > 0 and a.lo >= 0:  # x ^ 0.5 and friends: increasing on x >= 0
        return _rounded(*_widen(_pow(a.lo, n), _pow(a.hi, n)), a.nan, dt)
    return FULL


def _pow(x: float, n: float) -> float:
    try:
        return float(x**n)
    except OverflowError:
        return INF if x > 0 or (isinstance(n, int) and n % 2 == 0) else -INF


def _monotone(
    fn: Callable[[float], float],
    a: Interval,
    dt: np.dtype,
    lo_dom: float = -INF,
    hi_dom: float = INF,
    increasing: bool = True,
    open_lo: bool = False,
    floor: float = -INF,
) -> Interval:
    """*fn* applied to *a* clipped to its domain; values outside the domain give NaN.

    *floor*: a value the function never goes below (0 for ``sqrt`` and ``exp``), kept when the
    bounds are widened for the function's error.
    """
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
    lo_v, hi_v = _widen(lo_v, hi_v)
    return _rounded(max(lo_v, floor), hi_v, nan, dt)


def _exp(x: float) -> float:
    return math.exp(x) if x < 710 else INF


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -INF


_FUNCS = ("sqrt", "exp", "log", "sin", "cos", "tan", "arcsin", "arccos", "arctan")


def _function(name: str, a: Interval, dt: np.dtype) -> Interval:
    if name == "sqrt":
        return _monotone(math.sqrt, a, dt, 0.0, floor=0.0)
    if name == "exp":
        return _monotone(_exp, a, dt, floor=0.0)
    if name == "log":
        return _monotone(_log, a, dt, 0.0)
    if name == "arctan":
        return _monotone(math.atan, a, dt)
    if name == "arcsin":
        return _monotone(math.asin, a, dt, -1.0, 1.0)
    if name == "arccos":
        return _monotone(math.acos, a, dt, -1.0, 1.0, increasing=False)
    if name in ("sin", "cos"):
        if a.empty:
            return a
        return Interval(-1.0, 1.0, a.nan or math.isinf(a.lo) or math.isinf(a.hi))
    return FULL  # tan


# ---------------------------------------------------------------------------
# comparisons
# ---------------------------------------------------------------------------


def _compare(op: str, a: Interval, b: Interval) -> tuple[bool, bool]:
    """(can be true, can be false) of ``a op b`` for values in two intervals of one number type."""
    nan = a.nan or b.nan
    if a.empty or b.empty:  # only NaN on one side: every comparison is False, '!=' True
        return (op == "!=") and nan, (op != "!=") and nan
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


# ---------------------------------------------------------------------------
# the walk
# ---------------------------------------------------------------------------


class Bounds:
    """Bounds of one expression or predicate for inputs of given dtypes, over many blocks.

    Parameters
    ----------
    expr
        A checked tree (:func:`~lamina.derived.parse`), scalar or predicate.
    dtypes
        The dtype of each input, path -> dtype (default: float64 for all).

    The dtypes of the nodes and the values of the constant subexpressions
    are found once, here; :meth:`truth` and :meth:`interval` then take the
    ranges of one block.  Where the evaluator refuses *expr* for these
    dtypes, nothing is proven: every block may match and may fail.
    """

    def __init__(self, expr: Expr, dtypes: Mapping[str, Any] | None = None) -> None:
        self.expr = expr
        self.text = expr.source
        if dtypes is None:
            dtypes = {p: _F64 for p in expr.inputs}
        missing = sorted(p for p in expr.inputs if p not in dtypes)
        if missing:
            raise ExpressionError(f"no dtype for dataset {missing[0]!r}", None, self.text)
        self.dtypes = {p: np.dtype(dtypes[p]) for p in expr.inputs}
        self.node_dt: dict[int, list[np.dtype]] | None
        try:
            self.node_dt = node_dtypes(expr, self.dtypes)
        except ExpressionError:
            self.node_dt = None  # the evaluator refuses some data of these dtypes: no proof
        self._consts: dict[int, list[Any]] = {}

    @property
    def provable(self) -> bool:
        """False where the evaluator refuses the expression for these dtypes (nothing is proven)."""
        return self.node_dt is not None

    def truth(self, ranges: Mapping[str, object]) -> tuple[bool, bool]:
        """``(can_be_true, can_be_false)`` of the predicate over a block with inputs in *ranges*."""
        if self.node_dt is None:
            return True, True
        with np.errstate(all="ignore"):
            return self._truth(self.expr, ranges)

    def interval(self, ranges: Mapping[str, object]) -> Interval:
        """Bounds of the scalar expression over a block with inputs in *ranges*."""
        if self.node_dt is None:
            return FULL
        with np.errstate(all="ignore"):
            return self._iv(self.expr, ranges).iv

    # -- values ----------------------------------------------------------------
    def _dt(self, node: Expr, k: int = 0) -> np.dtype | None:
        assert self.node_dt is not None
        got = self.node_dt.get(id(node))
        return got[k] if got is not None and k < len(got) else None

    def _const(self, node: Expr) -> list[Any]:
        got = self._consts.get(id(node))
        if got is None:
            got = self._consts[id(node)] = fold(node, self.text)
        return got

    def _iv(self, node: Expr, ranges) -> _V:
        if node.is_constant:
            return _weak(self._const(node)[0])
        if isinstance(node, Ref):
            return self._ref(node, ranges)
        dt = self._dt(node)
        if dt is None:  # not computed as an array on its own: unknown
            return _V(FULL, _F64)
        if isinstance(node, UnaryOp):  # '-'
            return _V(_op("negative", [self._iv(node.operand, ranges)], dt), dt)
        if isinstance(node, BinOp):
            return self._binop(node.op, node.left, node.right, dt, ranges)
        if isinstance(node, Call):
            return self._call(node, dt, ranges)
        return _V(_unknown(dt), dt)

    def _ref(self, node: Ref, ranges) -> _V:
        if node.path not in ranges:
            raise ExpressionError(
                f"no range for dataset {node.path!r}", node.pos if node.pos >= 0 else None
            )
        dt = self.dtypes[node.path]
        iv = Interval.of(ranges[node.path])
        if dt.kind == "c":
            return _V(FULL, dt)
        if dt.kind in "biu":  # integers: no NaN, only values of the dtype
            m, mx = _int_range(dt)
            if iv.empty:
                return _V(NONE, dt)
            lo = m if iv.lo == -INF else max(m, math.ceil(iv.lo))
            hi = mx if iv.hi == INF else min(mx, math.floor(iv.hi))
            return _V(Interval(lo, hi) if lo <= hi else NONE, dt)
        if iv.empty:
            return _V(Interval(INF, -INF, iv.nan), dt)
        return _V(Interval(_to(iv.lo, dt, False), _to(iv.hi, dt, True), iv.nan), dt)

    def _binop(self, op: str, left: Expr, right: Expr, dt: np.dtype, ranges) -> _V:
        a, b = self._iv(left, ranges), self._iv(right, ranges)
        if (
            op == "^"
            and b.dt is None
            and type(b.value) in (int, float)
            and b.value == 2
            and a.dt is not None
            and a.dt.kind in "fc"
        ):  # the evaluator computes x ^ 2 as x * x
            return _V(_square(_cast(a, dt), dt) if dt.kind == "f" else _unknown(dt), dt)
        return _V(_op(_UFUNC[op], [a, b], dt), dt)

    def _call(self, node: Call, dt: np.dtype, ranges) -> _V:
        f = node.function
        if f.kind == "stencil":
            return _V(_unknown(dt), dt)
        if f.kind == "vector":
            comps: list[_V] = []
            for arg in node.args:
                if arg.ncomponents == 1:
                    comps.append(self._iv(arg, ranges))
                else:
                    comps.extend(self._vector(arg, k, ranges) for k in range(arg.ncomponents))
            if node.name == "magnitude":
                return self._magnitude(comps, dt)
            if node.name == "dot":
                return self._dot(comps, dt)
            return _V(_unknown(dt), dt)  # cross: 3 components, bounded through _vector
        args = [self._iv(a, ranges) for a in node.args]
        if f.kind == "binary":
            return self._binop(_BINARY[f.name], node.args[0], node.args[1], dt, ranges)
        if f.kind in ("unary", "float"):
            return _V(_op(f.ufunc, args, dt), dt)
        if f.kind == "fold":  # left to right, promoting at each step as the evaluator does
            acc = args[0]
            for i, v in enumerate(args[1:], 2):
                acc = self._step(f.ufunc, acc, v, dt if i == len(args) else None)
            return acc
        return _V(_unknown(dt), dt)

    def _step(self, name: str, a: _V, b: _V, dt: np.dtype | None) -> _V:
        """One operation of a sequence: folded for two constants, else in *dt* or the promoted dtype."""
        if a.dt is None and b.dt is None:
            return _fold2(name, a.value, b.value)
        t = dt if dt is not None else _promote(a, b)
        return _V(_op(name, [a, b], t), t)

    def _magnitude(self, comps: list[_V], dt: np.dtype) -> _V:
        acc: _V | None = None
        for c in comps:
            if c.dt is None:
                sq = _fold2("multiply", c.value, c.value)
            else:
                t = _F64 if c.dt.kind in "biu" else c.dt
                sq = _V(_square(_cast(c, t), t) if t.kind == "f" else _unknown(t), t)
            acc = sq if acc is None else self._step("add", acc, sq, None)
        assert acc is not None
        return _V(_op("sqrt", [acc], dt), dt)

    def _dot(self, comps: list[_V], dt: np.dtype) -> _V:
        n = len(comps) // 2
        acc: _V | None = None
        for i in range(n):
            last = i == n - 1
            p = self._step("multiply", comps[i], comps[n + i], dt if (last and n == 1) else None)
            acc = p if acc is None else self._step("add", acc, p, dt if last else None)
        assert acc is not None
        return acc

    def _vector(self, node: Expr, k: int, ranges) -> _V:
        """Component *k* of a vector argument: computed for ``cross``, unknown for stencils."""
        dt = self._dt(node, k) or _F64
        if isinstance(node, Call) and node.name == "cross":
            comps: list[_V] = []
            for a in node.args:
                if a.ncomponents == 1:
                    comps.append(self._iv(a, ranges))
                else:
                    ct = self._dt(a, 0) or _F64
                    comps.extend([_V(_unknown(ct), ct)] * a.ncomponents)
            p, q = comps[:3], comps[3:]
            i, j = ((1, 2), (2, 0), (0, 1))[k]
            return self._step(
                "subtract",
                self._step("multiply", p[i], q[j], None),
                self._step("multiply", p[j], q[i], None),
                dt,
            )
        return _V(_unknown(dt), dt)

    # -- conditions ------------------------------------------------------------
    def _truth(self, node: Expr, ranges) -> tuple[bool, bool]:
        if node.is_constant:
            v = bool(self._const(node)[0])
            return v, not v
        if isinstance(node, BoolOp):
            t1, f1 = self._truth(node.left, ranges)
            t2, f2 = self._truth(node.right, ranges)
            if node.op == "&":
                return t1 and t2, f1 or f2
            return t1 or t2, f1 and f2
        if isinstance(node, UnaryOp) and node.op == "~":
            t, f = self._truth(node.operand, ranges)
            return f, t
        if isinstance(node, Compare):
            a, b = self._iv(node.left, ranges), self._iv(node.right, ranges)
            if _integral(a) and _integral(b):  # numpy compares integers exactly
                return _compare(node.op, a.iv, b.iv)
            try:
                loop = _promote(a, b)  # the dtype numpy compares in
            except (TypeError, ValueError, OverflowError):
                return True, True
            if loop.kind != "f":
                return True, True
            return _compare(node.op, _cast(a, loop), _cast(b, loop))
        raise ExpressionError(f"not a condition: {node}", node.pos if node.pos >= 0 else None)
