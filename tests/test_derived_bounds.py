"""Interval bounds under each dtype's own arithmetic (lamina.derived.bounds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.derived import Bounds, Interval, evaluate, interval, parse, truth
from lamina.errors import ExpressionError


def tv(text, dtypes, **ranges):
    """(can be true, can be false) of predicate *text* with inputs of *dtypes* in *ranges*."""
    pred = parse(text, "predicate")
    return truth(
        pred, ranges, {p: dtypes for p in pred.inputs} if isinstance(dtypes, str) else dtypes
    )


@pytest.mark.parametrize(
    "text, dtype, a, want",
    [
        # integers wrap as numpy wraps them
        ("a + a > 300", "u1", (200, 250), (False, True)),
        ("a + a < 250", "u1", (200, 250), (True, False)),  # 400..500 wraps to 144..244
        ("a + 1 == 0", "u1", (255, 255), (True, False)),
        ("a * 2 < 0", "i1", (100, 120), (True, False)),
        ("-a == a", "i1", (-128, -128), (True, False)),
        ("abs(a) < 0", "i1", (-128, 5), (True, True)),
        ("a - 1 > 10", "u8", (0, 0), (True, False)),
        ("a * 4 == 0", "i8", (2**62, 2**62), (True, False)),
        ("a ^ 2 > 0", "i2", (200, 300), (True, True)),  # 40000 .. 90000: wraps, spanning
        ("a ^ 2 == 1", "i1", (-1, 1), (True, True)),
        ("a + 1 > a", "i4", (0, 2**31 - 1), (True, True)),  # wraps at the top only
        # exact integers, also beyond 2**53
        ("a == 9007199254740993", "i8", (2**53 + 1, 2**53 + 1), (True, False)),
        ("a > 9007199254740992", "i8", (2**53 + 1, 2**53 + 1), (True, False)),
        ("a < 18446744073709551615", "u8", (2**64 - 2, 2**64 - 2), (True, False)),
        ("a < 300", "i1", (-128, 127), (True, False)),  # compared exactly, not in int8
        ("a == -1", "u1", (0, 255), (False, True)),
        # a float literal compares in float64: 2**53 + 1 is 2**53 there
        ("a == 9007199254740992.0", "i8", (2**53 + 1, 2**53 + 1), (True, False)),
        # floats: the literal is cast to the data's dtype
        ("a == 0.1", "f2", (0.0999755859375, 0.0999755859375), (True, False)),
        ("a == 0.1", "f4", (float(np.float32(0.1)),) * 2, (True, False)),
        ("a == 0.1", "f8", (float(np.float32(0.1)),) * 2, (False, True)),
        ("a == 1e300", "f4", (math.inf, math.inf), (True, False)),
        ("a > 1e300", "f4", (math.inf, math.inf), (False, True)),
        ("a < 70000", "f2", (65504.0, 65504.0), (True, False)),  # 70000 is inf in float16
        ("a * 2 > 65000", "f2", (40000.0, 40000.0), (True, False)),  # overflows to inf
        ("a + a > 3.5e38", "f4", (3e38, 3e38), (False, True)),  # inf > inf
        ("a + 1 == a", "f4", (2.0**25, 2.0**25), (True, True)),
        # NaN
        ("a < 1", "f8", (0.0, 0.5, True), (True, True)),
        ("a != a", "f8", (0.0, 0.5, True), (True, True)),
        ("a != a", "f8", (0.5, 0.5), (False, True)),
        ("a - a == 0", "f8", (-math.inf, 0.0), (True, True)),  # inf - inf is NaN
        ("a * 0 == 0", "f4", (1.0, math.inf), (True, True)),  # inf * 0 is NaN
        ("sqrt(a) >= 0", "f8", (-1.0, 4.0), (True, True)),
        ("sqrt(a) >= 0", "f8", (0.0, 4.0), (True, False)),
    ],
)
def test_truth_under_the_dtype(text, dtype, a, want):
    assert tv(text, dtype, a=a) == want


@pytest.mark.parametrize(
    "text, dtype, values",
    [
        ("a + a > 300", "u1", [200, 250]),
        ("a * 2 < 0", "i1", [100, 120]),
        ("a == 0.1", "f2", [0.1, 0.1]),
        ("a == 1e300", "f4", [np.inf, np.inf]),
        ("a > 1e300", "f4", [np.inf, 3e38]),
        ("a * 4 == 0", "i8", [2**62, 2**62 + 1]),
        ("a == 9007199254740992.0", "i8", [2**53 + 1, 2**53]),
    ],
)
def test_truth_agrees_with_evaluate(text, dtype, values):
    arr = np.array(values, dtype=dtype)
    got = evaluate(parse(text, "predicate"), {"a": arr})[0]
    can_true, can_false = tv(text, dtype, a=(arr.min().item(), arr.max().item()))
    assert can_true or not got.any()
    assert can_false or got.all()


def test_booleans_add_as_or_and_multiply_as_and():
    assert tv("a + b > 0", "?", a=(1, 1), b=(0, 1)) == (True, False)  # True + x is True
    assert tv("a * b > 0", "?", a=(0, 0), b=(0, 1)) == (False, True)
    assert tv("a + 1 == 2", "?", a=(1, 1)) == (True, False)  # bool + int: int64
    # '-' of booleans: numpy refuses, so nothing is proven (the evaluator raises)
    assert tv("-a < 0", "?", a=(0, 1)) == (True, True)
    assert not Bounds(parse("-a < 0", "predicate"), {"a": "?"}).provable


def test_mixed_dtypes_promote_as_numpy():
    # int8 + float16 computes in float16 (2049 is not a float16: not certain); int16 + float16
    # in float32 (exactly 2049)
    assert tv("a + b == 2049", {"a": "i1", "b": "f2"}, a=(1, 1), b=(2048.0, 2048.0)) == (
        True,
        True,
    )
    assert tv("a + b == 2049", {"a": "i2", "b": "f2"}, a=(1, 1), b=(2048.0, 2048.0)) == (
        True,
        False,
    )
    # int64 and uint64 compare exactly
    assert tv("a < b", {"a": "i8", "b": "u8"}, a=(-1, -1), b=(2**64 - 1, 2**64 - 1)) == (
        True,
        False,
    )
    # int / int is float64
    assert tv("a / b > 0.4", "i4", a=(1, 1), b=(2, 2)) == (True, False)


def test_unknowns():
    assert tv("gradient(a, 0) > 1", "f8", a=(0.0, 0.0)) == (True, True)
    assert tv("tan(a) > 1e9", "f8", a=(0.0, 0.1)) == (True, True)
    assert tv("a ^ b > 0", "i4", a=(2, 3), b=(-1, 2)) == (True, True)  # numpy raises on -1
    # the evaluator refuses the literal for int8: nothing is proven, every block is evaluated
    b = Bounds(parse("a + 300 > 0", "predicate"), {"a": "i1"})
    assert not b.provable and b.truth({"a": (0, 0)}) == (True, True)
    assert b.interval({"a": (0, 0)}) == Interval(-math.inf, math.inf, True)


def test_interval_dtypes():
    iv = interval(parse("a + a"), {"a": (200, 250)}, {"a": "u1"})
    assert iv == Interval(144, 244) and isinstance(iv.lo, int)
    iv = interval(parse("a * 2"), {"a": (2**62, 2**62 + 3)}, {"a": "i8"})
    assert iv == Interval(-(2**63), -(2**63) + 6)
    iv = interval(parse("a * 0.1"), {"a": (1.0, 1.0)}, {"a": "f2"})
    assert iv.lo == iv.hi == float(np.float16(1.0) * np.float16(0.1))
    iv = interval(parse("a + 0.1"), {"a": (1.0, 1.0)})  # float64 by default: exact rounding
    assert iv.lo <= 1.1 <= iv.hi and iv.hi - iv.lo <= 2.3e-16
    with pytest.raises(ExpressionError, match="no dtype"):
        interval(parse("a + b"), {"a": (0, 1), "b": (0, 1)}, {"a": "f8"})
    with pytest.raises(ExpressionError, match="no range"):
        interval(parse("a + b"), {"a": (0, 1)})


_ARITH = st.sampled_from(["+", "-", "*", "/"])


@settings(max_examples=max(300, settings().max_examples))
@given(
    st.sampled_from(["f2", "f4", "f8"]),
    _ARITH,
    st.lists(st.floats(allow_nan=False, width=16), min_size=1, max_size=4),
    st.lists(st.floats(allow_nan=False, width=16), min_size=1, max_size=4),
)
def test_float_arithmetic_is_bounded(dtype, op, av, bv):
    """Every result of a op b lies in the interval computed from the ranges of a and b."""
    n = min(len(av), len(bv))
    a, b = np.array(av[:n], dtype), np.array(bv[:n], dtype)
    got = evaluate(parse(f"a {op} b"), {"a": a, "b": b})[0]
    iv = interval(
        parse(f"a {op} b"),
        {"a": (float(a.min()), float(a.max())), "b": (float(b.min()), float(b.max()))},
        {"a": dtype, "b": dtype},
    )
    for g in got.tolist():
        if math.isnan(g):
            assert iv.nan
        else:
            assert iv.lo <= g <= iv.hi, (g, iv)


@settings(max_examples=max(300, settings().max_examples))
@given(
    st.sampled_from(["i1", "i2", "u1", "u2", "i8", "u8"]),
    st.sampled_from(["+", "-", "*"]),
    st.data(),
)
def test_integer_arithmetic_is_bounded(dtype, op, data):
    info = np.iinfo(dtype)
    ints = st.integers(int(info.min), int(info.max))
    a = np.array(data.draw(st.lists(ints, min_size=1, max_size=4)), dtype)
    b = np.array(data.draw(st.lists(ints, min_size=len(a), max_size=len(a))), dtype)
    got = evaluate(parse(f"a {op} b"), {"a": a, "b": b})[0]
    iv = interval(
        parse(f"a {op} b"),
        {"a": (int(a.min()), int(a.max())), "b": (int(b.min()), int(b.max()))},
        {"a": dtype, "b": dtype},
    )
    for g in got.tolist():
        assert iv.lo <= g <= iv.hi, (g, iv)
