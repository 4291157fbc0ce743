"""Kernels of derived quantities: exact agreement with numpy.gradient on the global array, for any region."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.derived import (
    DeviceUnavailableError,
    check_inputs,
    component_names,
    evaluate,
    evaluate_regions,
    gpu_available,
    grow_range,
    input_box,
    needed_boxes,
    parse,
    result_dtype,
)
from lamina.derived import compute as C
from lamina.derived import kernels as K
from lamina.derived.nodes import BinOp, BoolOp, Call, Compare, Num, Ref, UnaryOp
from lamina.derived.parser import axis_value
from lamina.errors import ExpressionError, ShapeError
from lamina.geometry import Box, decompose

# ---------------------------------------------------------------------------
# an independent reference: numpy on the whole global arrays
# ---------------------------------------------------------------------------

_FLOAT = {
    "sqrt": np.sqrt,
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
}


def _f64(x):
    return x.astype(np.float64) if isinstance(x, np.ndarray) and x.dtype.kind in "biu" else x


def reference(node, A, spacing=None):
    """Values of *node* over the whole domain of the arrays *A* (list of components)."""
    ndim = next(iter(A.values())).ndim if A else 0
    h = spacing or (1.0,) * ndim

    def g(x, ax):
        if not isinstance(x, np.ndarray):
            return 0.0
        return (
            np.gradient(x, h[ax], axis=ax, edge_order=2)
            if x.dtype != bool
            else np.gradient(x.astype(np.float64), h[ax], axis=ax, edge_order=2)
        )

    def r(n):
        if isinstance(n, Num):
            return [n.value]
        if isinstance(n, Ref):
            return [A[n.path]]
        if isinstance(n, BinOp):
            x, y = r(n.left)[0], r(n.right)[0]
            return [
                {
                    "+": lambda: x + y,
                    "-": lambda: x - y,
                    "*": lambda: x * y,
                    "/": lambda: x / y,
                    "^": lambda: x**y,
                }[n.op]()
            ]
        if isinstance(n, UnaryOp):
            x = r(n.operand)[0]
            return [-x if n.op == "-" else ~x]
        if isinstance(n, Compare):
            x, y = r(n.left)[0], r(n.right)[0]
            return [
                {
                    "<": np.less,
                    "<=": np.less_equal,
                    ">": np.greater,
                    ">=": np.greater_equal,
                    "==": np.equal,
                    "!=": np.not_equal,
                }[n.op](x, y)
            ]
        if isinstance(n, BoolOp):
            x, y = r(n.left)[0], r(n.right)[0]
            return [x & y if n.op == "&" else x | y]
        assert isinstance(n, Call)
        if n.name in ("magnitude", "dot", "cross"):
            comps = [c for a in n.args for c in r(a)]
            if n.name == "magnitude":
                comps = [_f64(c) for c in comps]
                s = comps[0] * comps[0]
                for c in comps[1:]:
                    s = s + c * c
                return [np.sqrt(s)]
            if n.name == "dot":
                k = len(comps) // 2
                s = comps[0] * comps[k]
                for i in range(1, k):
                    s = s + comps[i] * comps[k + i]
                return [s]
            p, q = comps[:3], comps[3:]
            return [p[1] * q[2] - p[2] * q[1], p[2] * q[0] - p[0] * q[2], p[0] * q[1] - p[1] * q[0]]
        args = [r(x)[0] for x in n.args]
        if n.name == "gradient":
            if len(n.args) == 2:
                return [g(args[0], axis_value(n.args[1]) % ndim)]
            return [g(args[0], j) for j in range(ndim)]
        if n.name == "divergence":
            s = g(args[0], 0)
            for j in range(1, len(args)):
                s = s + g(args[j], j)
            return [s]
        if n.name == "curl":
            u, v, w = args
            return [g(w, 1) - g(v, 2), g(u, 2) - g(w, 0), g(v, 0) - g(u, 1)]
        if n.name == "laplacian":
            s = g(g(args[0], 0), 0)
            for j in range(1, ndim):
                s = s + g(g(args[0], j), j)
            return [s]
        if n.name in _FLOAT:
            return [_FLOAT[n.name](_f64(args[0]))]
        if n.name == "abs":
            return [np.abs(args[0])]
        if n.name in ("min", "max"):
            fn = np.minimum if n.name == "min" else np.maximum
            s = args[0]
            for x in args[1:]:
                s = fn(s, x)
            return [s]
        op = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "pow": "^"}[n.name]
        return r(BinOp(op, n.args[0], n.args[1]))

    def folded(n):  # constant subexpressions are Python numbers (weak under NEP 50), as documented
        return [v.item() if isinstance(v, np.generic) else v for v in r_(n)]

    r_, r = r, folded
    with np.errstate(all="ignore"):
        return r(node)


def assert_same(got, want):
    assert len(got) == len(want)
    for x, y in zip(got, want, strict=True):
        y = np.asarray(y)
        assert x.shape == y.shape
        assert x.dtype == y.dtype, (x.dtype, y.dtype)
        np.testing.assert_array_equal(x, y)  # bit for bit (NaNs equal)


# ---------------------------------------------------------------------------
# exactness on random regions of random domains
# ---------------------------------------------------------------------------

STENCIL_EXPRS = {
    1: [
        "gradient(a, 0)",
        "laplacian(a)",
        "divergence(a)",
        "gradient(a, -1) * b + 1",
        "laplacian(a * b) - gradient(gradient(b, 0), 0)",
        "sqrt(abs(laplacian(a)))",
    ],
    2: [
        "gradient(a, 1)",
        "gradient(a, 0) + gradient(b, 1)",
        "laplacian(a)",
        "divergence(a, b)",
        "magnitude(gradient(a, 0), gradient(a, 1))",
        "gradient(gradient(a, 0) * b, 1)",
        "laplacian(gradient(a, 1))",
        "max(a, gradient(b, 0), 0.25)",
    ],
    3: [
        "gradient(a, 2)",
        "gradient(a)",
        "divergence(a, b, c)",
        "curl(a, b, c)",
        "magnitude(curl(a, b, c))",
        "laplacian(a)",
        "dot(curl(a, b, c), gradient(a))",
        "cross(curl(a, b, c), a, b, c)",
        "laplacian(a) + divergence(a, b, c) * c",
        "gradient(a * b + c, 1) / 2",
        "magnitude(a, b, c)",
        "gradient(gradient(a, 0), 2)",
    ],
}


@st.composite
def cases(draw, dtypes=("f8", "f4", "i4")):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(3, 8)) for _ in range(ndim))
    start, stop = [], []
    for n in shape:
        lo = draw(st.integers(0, n - 1))
        hi = draw(st.integers(lo + 1, min(n, lo + draw(st.sampled_from([1, 2, n])))))
        start.append(lo)
        stop.append(hi)
    text = draw(st.sampled_from(STENCIL_EXPRS[ndim]))
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    return shape, Box(tuple(start), tuple(stop)), text, dtype, seed


def _arrays(shape, dtype, seed, names="abc"):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return {k: rng.integers(-50, 50, size=shape).astype(dtype) for k in names}
    return {k: (rng.standard_normal(shape) * 3).astype(dtype) for k in names}


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from([1, 3, 17, 1 << 15]))
def test_region_equals_global_numpy(case, chunk):
    shape, region, text, dtype, seed = case
    A = _arrays(shape, dtype, seed)
    expr = parse(text)
    want = [np.asarray(w)[region.slices] for w in reference(expr, A)]
    inbox = input_box(expr, region, shape)
    got = evaluate(
        expr, {k: v[inbox.slices] for k, v in A.items()}, region, shape, chunk_elements=chunk
    )
    assert_same(got, want)


@settings(max_examples=60, deadline=None)
@given(cases(dtypes=("f8",)), st.integers(0, 2))
def test_input_box_is_the_halo_except_thin_boundary_regions(case, extra):
    shape, region, text, _, _ = case
    expr = parse(text)
    inbox = input_box(expr, region, shape)
    h = expr.halo

    def grown(k):
        return Box(
            tuple(max(a - k, 0) for a in region.start),
            tuple(min(b + k, n) for b, n in zip(region.stop, shape, strict=True)),
        )

    assert inbox.contains(region)
    assert grown(h + 1).contains(inbox)
    if all(b - a >= 2 for a, b in zip(region.start, region.stop, strict=True)):
        assert grown(h).contains(inbox)
    # any box containing the input box works too (here: grown by halo + extra, clipped)
    A = _arrays(shape, "f8", 7)
    box = grown(h + 1 + extra)
    got = evaluate(expr, {k: v[box.slices] for k, v in A.items()}, region, shape, origin=box.start)
    want = [np.asarray(w)[region.slices] for w in reference(expr, A)]
    assert_same(got, want)


def test_thin_region_at_the_boundary_needs_one_more_cell():
    e = parse("gradient(a, 0)")
    assert e.halo == 1
    assert input_box(e, Box((0,), (1,)), (10,)) == Box((0,), (3,))  # halo alone would give [0, 2)
    assert input_box(e, Box((9,), (10,)), (10,)) == Box((7,), (10,))
    assert input_box(e, Box((4,), (6,)), (10,)) == Box((3,), (7,))
    lap = parse("laplacian(a)")
    assert input_box(lap, Box((0, 4), (1, 5)), (10, 10)) == Box((0, 2), (4, 7))
    assert (
        grow_range(0, 1, 3) == (0, 3)
        and grow_range(2, 3, 3) == (0, 3)
        and grow_range(1, 2, 3) == (0, 3)
    )
    nb = needed_boxes(parse("gradient(a, 0) + b"), Box((2, 2), (4, 4)), (8, 8))
    assert nb == {"a": Box((1, 2), (5, 4)), "b": Box((2, 2), (4, 4))}


@pytest.mark.parametrize("nranks", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(
    "text",
    [
        "curl(a, b, c)",
        "laplacian(a)",
        "magnitude(curl(a, b, c))",
        "divergence(a, b, c)",
        "gradient(laplacian(a), 1)",
    ],
)
def test_any_decomposition_assembles_to_the_global_result(nranks, text):
    shape = (9, 7, 5)
    A = _arrays(shape, "f8", nranks)
    expr = parse(text)
    want = reference(expr, A)
    got = [np.full(shape, np.nan) for _ in want]
    for box in decompose(shape, nranks):
        if box.empty:
            continue
        inbox = input_box(expr, box, shape)
        parts = evaluate(expr, {k: v[inbox.slices] for k, v in A.items()}, box, shape)
        for g, p in zip(got, parts, strict=True):
            g[box.slices] = p
    assert_same(got, want)


def test_spacing_per_axis():
    shape = (6, 5, 4)
    A = _arrays(shape, "f8", 1)
    spacing = (0.1, 2.5, 1 / 3)
    for text in ["gradient(a)", "curl(a, b, c)", "laplacian(a)", "divergence(a, b, c)"]:
        expr = parse(text)
        want = reference(expr, A, spacing)
        region = Box((0, 1, 1), (3, 5, 2))
        inbox = input_box(expr, region, shape)
        got = evaluate(
            expr, {k: v[inbox.slices] for k, v in A.items()}, region, shape, spacing=spacing
        )
        assert_same(got, [w[region.slices] for w in want])
    # one number for all axes
    got = evaluate("gradient(a, 1)", A, spacing=0.5)
    assert_same(got, [np.gradient(A["a"], 0.5, axis=1, edge_order=2)])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cases(dtypes=("f8", "f4", "i4", "f2")),
    st.sampled_from([1, 7, 40, 1 << 15]),
    st.sampled_from([1.0, 0.5, 4.0, -0.25, 0.1, 1 / 3, -3.0]),
    st.booleans(),
)
def test_contiguous_inputs_take_the_flat_way_to_the_same_bits(case, chunk, h, whole):
    """C-contiguous inputs (whole arrays, or copies of exactly the input box), any spacing."""
    shape, region, text, dtype, seed = case
    A = _arrays(shape, dtype, seed)
    expr = parse(text)
    spacing = (h,) * len(shape)
    want = [np.asarray(w)[region.slices] for w in reference(expr, A, spacing)]
    inbox = input_box(expr, region, shape)
    if whole:
        arrays, origin = A, (0,) * len(shape)
    else:
        arrays = {k: np.ascontiguousarray(v[inbox.slices]) for k, v in A.items()}
        origin = inbox.start
    got = evaluate(expr, arrays, region, shape, origin=origin, spacing=h, chunk_elements=chunk)
    assert_same(got, want)


def test_flat_derivative_of_a_slab(monkeypatch):
    """Whole planes and parts of planes of a C-contiguous array, each axis, both boundaries."""
    from lamina.derived import _stencil

    rng = np.random.default_rng(8)
    a = rng.standard_normal((6, 5, 7))
    flat, ways = _stencil._flat, []

    def spy(xp, f, *args):
        r = flat(xp, f, *args)
        if f.shape == a.shape:  # (not the dtype probe's tiny arrays)
            ways.append(r)
        return r

    monkeypatch.setattr(_stencil, "_flat", spy)
    h = (0.5, 0.3, 2.0)
    for ax in range(3):
        want = np.gradient(a, h[ax], axis=ax, edge_order=2)
        for region in [
            Box((0, 0, 0), (6, 5, 7)),
            Box((2, 0, 0), (4, 5, 7)),
            Box((5, 1, 0), (6, 4, 7)),
        ]:
            for chunk in (1, 7, 35, 36, 1000):
                got = evaluate(
                    f"gradient(a, {ax})",
                    {"a": a},
                    region,
                    a.shape,
                    origin=(0, 0, 0),
                    spacing=h,
                    chunk_elements=chunk,
                )
                assert_same(got, [want[region.slices]])
    assert ways and all(ways)  # every block the flat way
    ways.clear()
    evaluate("curl(a, a, a)", {"a": np.asfortranarray(a)}, chunk_elements=7)
    assert ways and not any(ways)  # not C-contiguous: strided


def test_scale_by_a_power_of_two_is_the_division():
    from lamina.derived._stencil import _scale

    rng = np.random.default_rng(9)
    tiny = np.array([5e-324, 1e-310, -2.2e-308, 1e-45, 3e-39, np.inf, -np.inf, np.nan, 0.0, -0.0])
    x = np.concatenate([rng.standard_normal(1000) * 10.0 ** rng.integers(-300, 300, 1000), tiny])
    for dtype in ("f8", "f4"):
        with np.errstate(over="ignore"):
            y = x.astype(dtype)  # float32: subnormals, and infinities from the large ones
        for h in (1.0, 0.5, 0.125, -2.0, 1024.0, 2.0**-40, 0.1, 3.0):
            name, c = _scale(h, np.dtype(dtype))
            assert (name == "multiply") == (h in (1.0, 0.5, 0.125, -2.0, 1024.0, 2.0**-40))
            with np.errstate(all="ignore"):
                np.testing.assert_array_equal(getattr(np, name)(y, c), y / (2.0 * h))
    assert _scale(1.0, np.dtype("f2"))[0] == "divide"


@pytest.fixture
def two_threads(monkeypatch):
    from lamina.derived import _parallel

    monkeypatch.setattr(_parallel, "THREADS", 2)
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_ELEMENTS", 0)
    monkeypatch.setattr(_parallel, "THREAD_MIN_ELEMENTS", 1)
    monkeypatch.setattr(C, "SPREAD_MIN_ELEMENTS", 0)
    run, used = _parallel.run_blocks, []

    def counted(items, work, states):
        used.append(len(states))
        run(items, work, states)

    monkeypatch.setattr(_parallel, "run_blocks", counted)
    yield used


@pytest.mark.parametrize("threads", [2, 3])
def test_threads_give_the_same_bits(two_threads, monkeypatch, threads):
    from lamina.derived import _parallel

    monkeypatch.setattr(_parallel, "THREADS", threads)
    shape = (9, 8, 7)
    A = _arrays(shape, "f8", 12)
    for text in STENCIL_EXPRS[3] + ["a + b", "a / b - c", "magnitude(a, b, c) > 3"]:
        expr = parse(text) if ">" not in text else parse(text, "predicate")
        want = reference(expr, A)
        for chunk in (1, 13, 56, 1 << 15):
            assert_same(evaluate(expr, A, chunk_elements=chunk), want)
        region = Box((2, 1, 0), (7, 8, 7))
        out = [np.empty(region.shape, w.dtype) for w in want]
        got = evaluate(expr, A, region, shape, origin=(0, 0, 0), chunk_elements=20, out=out)
        assert all(g is o for g, o in zip(got, out, strict=True))
        assert_same(got, [w[region.slices] for w in want])
    assert two_threads and set(two_threads) == {threads}


def test_threads_keep_numpy_quiet_and_raise_errors(two_threads):
    A = {"a": np.linspace(-1.0, 1.0, 64), "b": np.zeros(64), "i": np.arange(64) - 60}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = evaluate("a / b + log(a)", A, chunk_elements=4)[0]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, A["a"] / A["b"] + np.log(A["a"]))
    with pytest.raises(ExpressionError, match="negative integer powers"):
        evaluate("a + i ^ i", A, chunk_elements=4)  # only the first blocks fail (not the probe)
    assert two_threads == [2, 2]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_regions_give_what_evaluate_gives_region_by_region(two_threads, threads):
    """evaluate_regions: per region what evaluate gives, bit for bit, whether the regions are
    shared among threads or not, for regions of different shapes, with halos, empty ones,
    and arrays of different dtypes (a probe per set of dtypes)."""
    shape = (12, 7, 5)
    A = _arrays(shape, "f8", 21)
    A32 = {k: v.astype("f4") for k, v in A.items()}
    boxes = [b for b in decompose(shape, 5)] + [Box((3, 2, 0), (3, 5, 5))]  # one empty
    for text in ["magnitude(a, b, c)", "a / b - c", "curl(a, b, c)", "a"]:
        expr = parse(text)
        items = []
        for k, box in enumerate(boxes):
            src = A32 if k % 2 else A
            inbox = input_box(expr, box, shape) if not box.empty else box
            arrays = {p: src[p][inbox.slices] for p in sorted(expr.inputs)}
            items.append((arrays, box, inbox.start))
        two_threads.clear()
        got = evaluate_regions(expr, items, shape, chunk_elements=17, threads=threads)
        # the regions shared among the threads, each region on one of them
        assert two_threads == [threads]
        assert len(got) == len(items)
        for (arrays, box, org), g in zip(items, got, strict=True):
            want = evaluate(expr, arrays, box, shape, origin=org, chunk_elements=17)
            assert_same(g, want)
            for x in g:  # fresh arrays, never the inputs
                assert all(not np.shares_memory(x, a) for a in arrays.values())


def test_small_regions_stay_on_one_thread(two_threads, monkeypatch):
    """Regions below SPREAD_MIN_ELEMENTS on average are not shared among threads (their
    Python holds the GIL); larger ones are."""
    shape = (8, 6)
    A = _arrays(shape, "f8", 5, names="uv")
    items = [
        ({k: v[r : r + 2] for k, v in A.items()}, Box((r, 0), (r + 2, 6)), (r, 0))
        for r in (0, 2, 4, 6)
    ]
    monkeypatch.setattr(C, "SPREAD_MIN_ELEMENTS", 13)  # 12 elements a region: too few
    two_threads.clear()
    small = evaluate_regions("u * v", items, shape)
    assert two_threads[0] == 1  # the regions one after the other (each as evaluate computes it)
    monkeypatch.setattr(C, "SPREAD_MIN_ELEMENTS", 12)
    two_threads.clear()
    assert_same(evaluate_regions("u * v", items, shape)[3], small[3])
    assert two_threads == [2]  # shared among two threads, each region on one


def test_regions_are_checked_as_evaluate_checks_them(two_threads):
    shape = (8, 6)
    A = _arrays(shape, "f8", 3, names="uv")
    box = Box((0, 0), (4, 6))
    with pytest.raises(ExpressionError, match="unknown dataset 'w'"):
        evaluate_regions("u + w", [(A, box, (0, 0))], shape)
    short = {"u": A["u"][:3], "v": A["v"][:4]}
    with pytest.raises(ShapeError, match="'u' covers"):
        evaluate_regions(
            "u + v", [({k: v[:4] for k, v in A.items()}, box, (0, 0)), (short, box, (0, 0))], shape
        )
    two_threads.clear()
    with pytest.raises(ExpressionError, match="negative integer powers"):  # raised in a thread
        evaluate_regions(
            "u + i ^ i",
            [({**A, "i": np.arange(48).reshape(shape) - 40}, box, (0, 0))] * 3,
            shape,
            threads=2,
        )
    assert two_threads == [2]
    assert evaluate_regions("u + v", [], shape) == []


def test_fewer_regions_than_threads(two_threads, monkeypatch):
    """Fewer regions than threads: too small for threads of their own, they go to as many
    threads as there are regions; large enough, each takes the threads itself."""
    from lamina.derived import _parallel

    shape = (8, 6)
    A = _arrays(shape, "f8", 7, names="uv")
    items = [
        ({k: v[r : r + 2] for k, v in A.items()}, Box((r, 0), (r + 2, 6)), (r, 0))
        for r in (0, 2, 4)
    ]
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_ELEMENTS", 13)  # 12 elements a region
    two_threads.clear()
    small = evaluate_regions("u - v", items, shape, threads=4)
    assert two_threads == [3]
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_ELEMENTS", 12)
    two_threads.clear()
    assert_same(evaluate_regions("u - v", items, shape, threads=4)[2], small[2])
    assert two_threads == [1, 4, 4, 4]  # one after the other, each on the four threads
    # one region large enough for threads of its own: not one thread for it, beside a small one
    uneven = items[:2] + [({k: v[4:8] for k, v in A.items()}, Box((4, 0), (8, 6)), (4, 0))]
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_ELEMENTS", 20)  # 12, 12 and 24 elements
    two_threads.clear()
    evaluate_regions("u - v", uneven, shape, threads=4)
    assert two_threads == [1, 4]


def test_default_threads(monkeypatch):
    from lamina.derived import _parallel as P

    for k in ("LAMINA_THREADS", *P._LOCAL_SIZE, *P._LAUNCHED):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(P.os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    assert P.default_threads() == P.MAX_THREADS == 8
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")
    assert P.default_threads() == 3
    monkeypatch.setenv("MPI_LOCALNRANKS", "24")
    assert P.default_threads() == 1
    monkeypatch.delenv("MPI_LOCALNRANKS")
    monkeypatch.setenv(
        "PMI_RANK", "0"
    )  # a launcher that does not say how many ranks share the node
    assert P.default_threads() == 1
    monkeypatch.setenv("LAMINA_THREADS", "16")
    assert P.default_threads() == 16
    monkeypatch.setenv("LAMINA_THREADS", "")  # empty: unset
    assert P.default_threads() == 1
    monkeypatch.setattr(P, "THREADS", 5)
    assert P.default_threads() == 5


@pytest.mark.parametrize("value", ["many", "-3", "0", "1.5", "+2", "0x10", "1e3"])
def test_lamina_threads_that_is_no_count_is_refused(monkeypatch, value):
    """Nonsense was taken silently as the default number of threads."""
    from lamina.derived import _parallel as P
    from lamina.errors import ConfigError

    monkeypatch.setattr(P.os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    monkeypatch.setenv("LAMINA_THREADS", value)
    want = r"\$LAMINA_THREADS must be an integer >= 1 .*one above 48, 4 per core"
    with pytest.raises(ConfigError, match=want + ".*got " + re.escape(repr(value))):
        P.default_threads()


def test_lamina_threads_is_at_most_four_per_core(monkeypatch):
    """A million threads failed at end_step (can't start new thread), 100,000 made a step
    100 times slower: above 4 per core a value counts as 4 per core."""
    from lamina.derived import _parallel as P

    monkeypatch.setattr(P.os, "sched_getaffinity", lambda pid: set(range(3)), raising=False)
    for asked, used in (("1", 1), ("12", 12), ("13", 12), ("1000000", 12)):
        monkeypatch.setenv("LAMINA_THREADS", asked)
        assert P.default_threads() == used, asked


def test_a_region_gives_each_thread_enough_elements(monkeypatch):
    """A region was split among as many threads as asked, down to one element each."""
    from lamina.derived import _parallel as P

    monkeypatch.setattr(P, "THREADS", 1 << 20)
    sizes = []
    run = P.run_blocks

    def counted(items, work, states):
        items = list(items)
        sizes.append((len(items), len(states)))
        run(items, work, states)

    monkeypatch.setattr(P, "run_blocks", counted)
    n = P.PARALLEL_MIN_ELEMENTS * 2
    A = {"a": np.arange(n, dtype="f8"), "b": np.ones(n)}
    np.testing.assert_array_equal(evaluate(parse("a + b"), A)[0], A["a"] + 1)
    assert sizes == [(n // P.THREAD_MIN_ELEMENTS, n // P.THREAD_MIN_ELEMENTS)], sizes
    assert P.split_threads(8, P.PARALLEL_MIN_ELEMENTS - 1) == 1
    assert P.split_threads(8, 3 * P.THREAD_MIN_ELEMENTS + 5) in (1, 3)


def test_threads_started_are_joined_when_a_start_fails(monkeypatch):
    """A thread that cannot be started left those started before it running (never joined);
    now the threads started share the work, and every one has ended on return."""
    import threading

    from lamina.derived import _parallel as P

    real, started = threading.Thread.start, []

    def start(self):
        if len(started) == 2:
            raise RuntimeError("can't start new thread")
        real(self)
        started.append(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    done = []
    P.run_blocks(range(100), lambda s, i: done.append(i), [None] * 6)
    assert sorted(done) == list(range(100))
    assert len(started) == 2 and not any(t.is_alive() for t in started)


# ---------------------------------------------------------------------------
# pointwise functions, dtypes, numpy semantics
# ---------------------------------------------------------------------------

POINTWISE = [
    "a + b",
    "a - b * c",
    "a / b",
    "a ^ 2",
    "b ^ 3",
    "-a",
    "add(a, b)",
    "subtract(a, 1)",
    "multiply(a, b)",
    "divide(1, b)",
    "pow(a, 0.5)",
    "sqrt(a)",
    "abs(b)",
    "exp(c)",
    "log(a)",
    "sin(a)",
    "cos(b)",
    "tan(c)",
    "asin(c)",
    "acos(c)",
    "atan(b)",
    "min(a, b)",
    "max(a, b, c)",
    "min(a, 0.5)",
    "magnitude(a, b, c)",
    "magnitude(b)",
    "dot(a, b, c, a, b, c)",
    "dot(a, b)",
    "cross(a, b, c, c, a, b)",
    "(a + b) * (a - b) / (c * c + 1)",
    "a * (1 / 3)",
    "sqrt(2) * a",
    "a + 2 ^ 10 - 3 * 4",
]


def pointwise_inputs(shape, dtype) -> dict[str, np.ndarray]:
    """Inputs a, b, c in the domains of the pointwise functions (a > 0, |c| < 1)."""
    rng = np.random.default_rng(5)
    if np.dtype(dtype).kind in "iu":
        return {k: rng.integers(1, 9, size=shape).astype(dtype) for k in "abc"}
    return {
        "a": rng.random(shape).astype(dtype) + 0.5,
        "b": rng.standard_normal(shape).astype(dtype),
        "c": (rng.random(shape) * 2 - 1).astype(dtype),
    }


@pytest.mark.parametrize("dtype", ["f8", "f4", "i4", "i8", "u1"])
@pytest.mark.parametrize("text", POINTWISE)
def test_pointwise_matches_numpy(text, dtype):
    shape = (7, 9)
    A = pointwise_inputs(shape, dtype)
    expr = parse(text)
    try:
        want = reference(expr, A)
    except OverflowError:  # e.g. uint8 + 1024: numpy refuses, so does lamina
        with pytest.raises(ExpressionError, match="out of bounds"):
            evaluate(expr, A)
        return
    want = [np.broadcast_to(np.asarray(w), shape) for w in want]
    for chunk in (1, 5, 1 << 15):
        got = evaluate(expr, A, chunk_elements=chunk)
        assert_same(got, want)
    assert [g.dtype for g in got] == result_dtype(expr, {k: np.dtype(dtype) for k in "abc"}, ndim=2)


@pytest.mark.parametrize(
    "text, dtype, out",
    [
        ("a + 1.5", "f4", "f4"),
        ("a * 2", "i2", "i2"),
        ("a / 2", "i4", "f8"),
        ("sqrt(a)", "i1", "f8"),
        ("sin(a)", "u2", "f8"),
        ("sqrt(a)", "f4", "f4"),
        ("magnitude(a, a)", "i1", "f8"),
        ("gradient(a, 0)", "i4", "f8"),
        ("gradient(a, 0)", "f4", "f4"),
        ("laplacian(a)", "f2", "f2"),
        ("abs(a)", "i4", "i4"),
        ("a * sqrt(2)", "f4", "f4"),
        ("a ^ 0.5", "i4", "f8"),
        ("a + a", "f4", "f4"),
    ],
)
def test_dtypes(text, dtype, out):
    assert result_dtype(text, {"a": dtype})[0] == np.dtype(out)
    A = {"a": np.arange(1, 13).reshape(3, 4).astype(dtype)}
    assert evaluate(text, A)[0].dtype == np.dtype(out)


def test_mixed_dtypes_promote_like_numpy():
    A = {"a": np.ones((4, 4), "f4"), "b": np.ones((4, 4), "f8"), "i": np.ones((4, 4), "i4")}
    assert evaluate("a + b", A)[0].dtype == np.float64
    assert evaluate("a * i", A)[0].dtype == np.float64
    assert evaluate("gradient(a, 0) + gradient(b, 1)", A)[0].dtype == np.float64
    assert evaluate("magnitude(a, a)", A)[0].dtype == np.float32
    assert evaluate("magnitude(a, b)", A)[0].dtype == np.float64


def test_division_by_zero_follows_numpy_without_warnings():
    A = {"a": np.array([1.0, -1.0, 0.0, 2.0]), "b": np.zeros(4), "i": np.array([1, 0, 2, 3])}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = evaluate("a / b", A)[0]
        np.testing.assert_array_equal(out, [np.inf, -np.inf, np.nan, np.inf])
        out = evaluate("1 / i", A)[0]
        np.testing.assert_array_equal(out, [1.0, np.inf, 0.5, 1 / 3])
        assert np.isnan(evaluate("log(a - 3)", A)[0]).all()
        assert evaluate("a + 1 / 0", A)[0][0] == np.inf


def test_predicates():
    rng = np.random.default_rng(2)
    A = {"vmag": rng.random((6, 7)), "T": rng.random((6, 7)) * 2000}
    text = "vmag < 0.3 & T > 1200 | ~(T != T)"
    want = ((A["vmag"] < 0.3) & (A["T"] > 1200)) | ~(A["T"] != A["T"])
    for expr in (text, parse(text, "predicate")):
        got = evaluate(expr, A, chunk_elements=5)
        assert got[0].dtype == bool
        np.testing.assert_array_equal(got[0], want)
    got = evaluate(
        "magnitude(gradient(T, 0), gradient(T, 1)) >= 400", A, Box((1, 2), (4, 7)), (6, 7)
    )
    g = np.sqrt(
        np.gradient(A["T"], axis=0, edge_order=2) ** 2
        + np.gradient(A["T"], axis=1, edge_order=2) ** 2
    )
    np.testing.assert_array_equal(got[0], (g >= 400)[1:4, 2:7])


def test_constants_zero_d_and_empty_regions():
    got = evaluate("2 ^ 3 + 1", {}, global_shape=(2, 3))
    assert got[0].dtype == np.int64 and (got[0] == 9).all()
    got = evaluate("1 < 2", {}, global_shape=(2,))
    assert got[0].dtype == bool and got[0].all()
    got = evaluate("a * 2 + 1", {"a": np.array(3.0)})
    assert got[0].shape == () and got[0] == 7.0
    a = np.arange(12.0).reshape(3, 4)
    got = evaluate("gradient(a, 0)", {"a": a}, Box((1, 1), (1, 3)), (3, 4))
    assert got[0].shape == (0, 2) and got[0].dtype == np.float64
    got = evaluate("divergence(a, 1)", {"a": a})  # the derivative of a constant is 0
    assert_same(got, [np.gradient(a, axis=0, edge_order=2)])


def test_results_are_fresh_arrays_and_inputs_untouched():
    a = np.arange(24.0).reshape(4, 6)
    keep = a.copy()
    out = evaluate("a", {"a": a})[0]
    out[...] = -1
    np.testing.assert_array_equal(a, keep)
    evaluate("sqrt(a) + a * a - a", {"a": a}, chunk_elements=4)
    np.testing.assert_array_equal(a, keep)


def test_non_contiguous_and_fortran_inputs():
    rng = np.random.default_rng(3)
    big = rng.random((10, 12, 14))
    a = big[::2, 1::2, ::-1]
    f = np.asfortranarray(rng.random(a.shape))
    for text in ["curl(a, f, a)", "magnitude(a, f)", "laplacian(f)"]:
        assert_same(
            evaluate(text, {"a": a, "f": f}, chunk_elements=13),
            reference(parse(text), {"a": a, "f": f}),
        )


def test_gpu_code_path_with_a_numpy_stand_in(monkeypatch):
    """The device path (no blocks, library-allocated results, copies to and from the device) on numpy."""

    class FakeCupy:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def asnumpy(x, out=None):
            copies.append(x.nbytes)
            if out is None:
                return np.array(x)
            out[...] = x
            return out

    copies: list[int] = []

    monkeypatch.setattr(C, "_array_module", lambda device: FakeCupy() if device == "gpu" else np)
    shape = (6, 5, 7)
    A = _arrays(shape, "f4", 11)
    for text in STENCIL_EXPRS[3] + ["a + 1", "a", "magnitude(a, b, c) > 3"]:
        expr = parse(text) if "<" not in text and ">" not in text else parse(text, "predicate")
        region = Box((0, 1, 2), (4, 5, 3))
        inbox = input_box(expr, region, shape)
        arrs = {k: v[inbox.slices] for k, v in A.items()}
        want = evaluate(expr, arrs, region, shape, device="cpu")
        assert_same(evaluate(expr, arrs, region, shape, device="gpu"), want)
        # into host arrays given: one copy from the device each, straight into them
        out = [np.full(w.shape, 7, w.dtype) for w in want]
        copies.clear()
        got = evaluate(expr, arrs, region, shape, device="gpu", out=out)
        assert all(g is o for g, o in zip(got, out, strict=True))
        assert copies == [w.nbytes for w in want]
        assert_same(got, want)


def test_device_choice():
    A = {"a": np.ones((3, 3))}
    assert evaluate("a + 1", A, device="auto")[0].sum() == 18
    with pytest.raises(ExpressionError):
        evaluate("a", A, device="tpu")
    if not gpu_available():
        with pytest.raises(DeviceUnavailableError):
            evaluate("a + 1", A, device="gpu")


# ---------------------------------------------------------------------------
# bad input: each a clear error
# ---------------------------------------------------------------------------


def test_unknown_dataset_suggests_close_names():
    with pytest.raises(ExpressionError) as info:
        check_inputs(parse("vx + vyy"), ["vx", "vy", "vz"])
    assert info.value.position == 5 and "Did you mean 'vy'" in str(info.value)
    with pytest.raises(
        ExpressionError, match=r"'fields' is a group: .* in backticks \(`fields/T`\)"
    ):
        check_inputs(parse("fields/T"), ["fields/T", "fields/p"])
    # a name already in backticks: the group, not the spelling, is what is wrong
    with pytest.raises(ExpressionError, match=r"'c' is a group: name one of its datasets"):
        check_inputs(parse("`c` * 2"), ["c/x", "c/y"])
    with pytest.raises(ExpressionError, match="is a function"):
        check_inputs(parse("sqrt + 1"), ["a"])
    with pytest.raises(ExpressionError, match="Available: 'alpha', 'beta'"):
        check_inputs(parse("zzz"), ["beta", "alpha"])
    with pytest.raises(ExpressionError) as info:
        evaluate("magnitude(ux, uy, uz)", {"ux": np.ones(3), "uy": np.ones(3), "vz": np.ones(3)})
    assert info.value.position == 18 and "'uz'" in str(info.value)


def test_inputs_of_different_shapes():
    shapes = {"a": (4, 5), "b": (4, 5), "c": (4, 6)}
    assert check_inputs(parse("a + b"), shapes) == (4, 5)
    with pytest.raises(ExpressionError) as info:
        check_inputs(parse("a + b * c"), shapes)
    assert info.value.position == 8 and "(4, 6)" in str(info.value) and "(4, 5)" in str(info.value)
    with pytest.raises(ShapeError, match="different shapes"):
        evaluate("a + c", {"a": np.ones((4, 5)), "c": np.ones((4, 6))})


@pytest.mark.parametrize(
    "text, shape, words",
    [
        ("gradient(a, 1)", (5, 2, 5), "at least 3 points along axis 1"),
        ("laplacian(a)", (5, 5, 1), "dimension 2"),
        ("curl(a, a, a)", (5, 5), "needs 3-D data"),
        ("gradient(a)", (5, 5), "needs 3-D data"),
        ("divergence(a, a)", (5, 5, 5), "one argument per axis"),
        ("gradient(a, 3)", (5, 5, 5), "axis 3 is out of range"),
        ("gradient(a, -4)", (5, 5, 5), "axis -4 is out of range"),
        ("a + divergence(a, a, a)", (2, 5, 5), "along axis 0"),
    ],
)
def test_stencil_errors_name_the_dimension(text, shape, words):
    with pytest.raises(ExpressionError) as info:
        evaluate(text, {"a": np.ones(shape)})
    assert words in str(info.value)
    assert info.value.position == text.index(text.split("(")[0].split()[-1])
    with pytest.raises(ExpressionError, match=words.split()[0]):
        check_inputs(parse(text), {"a": shape})


def test_numpy_refusals_become_expression_errors():
    A = {"i": np.arange(1, 5), "s": np.arange(4, dtype=np.int8)}
    with pytest.raises(ExpressionError) as info:
        evaluate("1 + i ^ -1", A)
    assert info.value.position == 6 and "negative integer powers" in str(info.value)
    with pytest.raises(ExpressionError) as info:
        evaluate("s + 1000", A)
    assert info.value.position == 2
    with pytest.raises(ExpressionError, match="make the base or the exponent a float"):
        evaluate("i ^ (0 - 2)", A)
    np.testing.assert_array_equal(evaluate("i ^ -1.0", A)[0], A["i"] ** -1.0)
    with pytest.raises(ExpressionError):
        evaluate("gradient(o, 0)", {"o": np.array(["x", "y", "z", "w"])})


@pytest.mark.parametrize(
    "const, want",
    [
        ("2 ^ -1", 2**-1),
        ("2^-1", 0.5),
        ("2 ^ -2 ^ 2", 2 ** -(2**2)),
        ("(0 - 2) ^ -3", (-2) ** -3),
        ("1 ^ -5", 1**-5),
        ("3 ^ -1", 3**-1),
        ("2 ^ -63", 2**-63),
        ("2 ^ -(2 ^ 10)", 2 ** -(2**10)),
        ("18446744073709551615 ^ -1", 18446744073709551615**-1),
    ],
)
def test_integer_constants_to_negative_powers_fold_as_python(const, want):
    """An integer constant to a negative integer power is the float Python computes (numpy refuses it)."""
    assert type(want) is float
    f = np.arange(4.0)
    i = np.arange(1, 5)
    got = evaluate(f"a + {const}", {"a": f})[0]
    np.testing.assert_array_equal(got, f + want)
    got = evaluate(f"i * ({const})", {"i": i})[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, i * want)
    assert K.fold(parse(const)) == [want]


def test_zero_to_a_negative_power_is_an_expression_error():
    text = "a + 0 ^ -1"
    with pytest.raises(
        ExpressionError, match=r"cannot compute 0 \^ -1: 0 cannot be raised"
    ) as info:
        evaluate(text, {"a": np.arange(4.0)})
    assert info.value.position == text.index("^")
    with pytest.raises(ExpressionError, match="cannot be raised to a negative power"):
        evaluate("a * (1 - 1) ^ (0 - 3)", {"a": np.arange(4.0)})


def test_arrays_that_do_not_cover_the_region():
    a = np.ones((10, 10))
    e = parse("gradient(a, 0)")
    region = Box((4, 4), (6, 6))
    with pytest.raises(ShapeError, match="pass origin"):
        evaluate(e, {"a": a[4:6, 4:6]}, region, (10, 10))
    with pytest.raises(ShapeError, match="is needed"):
        evaluate(e, {"a": a[4:6, 4:6]}, region, (10, 10), origin=(4, 4))
    with pytest.raises(ShapeError, match="dimensions"):
        evaluate(e, {"a": np.ones(10)}, region, (10, 10))
    with pytest.raises(ShapeError):
        evaluate(e, {"a": a}, region)  # region without global_shape
    # per-array origins
    got = evaluate(
        "a + b", {"a": a[4:6, 4:6], "b": a}, region, (10, 10), origin={"a": (4, 4), "b": (0, 0)}
    )
    assert (got[0] == 2).all()
    # region as slices or (start, stop)
    assert evaluate(e, {"a": a}, (slice(4, 6), slice(4, 6)), (10, 10))[0].shape == (2, 2)
    assert evaluate(e, {"a": a}, ((4, 4), (6, 6)), (10, 10))[0].shape == (2, 2)


def test_bad_spacing():
    a = {"a": np.ones((4, 4))}
    for bad in [(1.0,), 0.0, float("inf"), ("x", 1)]:
        with pytest.raises(ExpressionError, match="spacing"):
            evaluate("gradient(a, 0)", a, spacing=bad)


def test_hand_built_trees_are_checked():
    with pytest.raises(ExpressionError, match="takes 1 argument"):
        evaluate(Call("sqrt", (Ref("a"), Ref("a"))), {"a": np.ones(3)})
    with pytest.raises(ExpressionError, match="unknown function"):
        evaluate(Call("sqrtt", (Ref("a"),)), {"a": np.ones(3)})
    got = evaluate(BinOp("+", Ref("a"), Num(1)), {"a": np.ones(3)})
    assert (got[0] == 2).all()


def test_component_names():
    assert component_names("vort", parse("magnitude(curl(u, v, w))")) == ["vort"]
    assert component_names("vort", parse("curl(u, v, w)")) == ["vort/x", "vort/y", "vort/z"]
    assert component_names("g", 3) == ["g/x", "g/y", "g/z"]


def test_chunks_cover_the_box_once():
    box = Box((1, 2, 3), (6, 9, 40))
    for target in (1, 7, 37, 300, 10**6):
        seen = np.zeros((10, 10, 50), int)
        for c in K.chunks(box, target):
            assert c.size <= max(target, 1) or c.shape[-1] == 1 or target < 1
            seen[c.slices] += 1
        assert (seen[box.slices] == 1).all() and seen.sum() == box.size


def test_out_arrays():
    rng = np.random.default_rng(4)
    A = {k: rng.random((5, 6, 7)) for k in "uvw"}
    for text in ["curl(u, v, w)", "magnitude(u, v, w)", "u", "laplacian(u)", "u + v", "2 + 3.5"]:
        expr = parse(text)
        out = [np.empty((3, 6, 7)) for _ in range(expr.ncomponents)]
        region = Box((1, 0, 0), (4, 6, 7))
        got = evaluate(expr, A, region, (5, 6, 7), origin=(0, 0, 0), out=out)
        assert all(g is o for g, o in zip(got, out, strict=True))
        want = evaluate(expr, A, region, (5, 6, 7), origin=(0, 0, 0))
        assert_same(got, want)
    with pytest.raises(ShapeError):
        evaluate("u + v", A, out=[np.empty((5, 6))])
    with pytest.raises(ShapeError):
        evaluate("u + v", A, out=[np.empty((5, 6, 7))] * 2)
    with pytest.raises(TypeError):  # DTypeError
        evaluate("u + v", A, out=[np.empty((5, 6, 7), "f4")])


# ---------------------------------------------------------------------------
# bounds from block statistics (query pruning)
# ---------------------------------------------------------------------------

_values = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False, width=32),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan, 1200.0, 0.3]),
)


def _block_exprs():
    leaves = st.one_of(
        st.sampled_from([Ref("a"), Ref("b")]),
        st.sampled_from([0, 1, 2, 0.3, 0.5, 3.5, 1200]).map(Num),
    )

    def extend(ch):
        return st.one_of(
            st.builds(BinOp, st.sampled_from("+-*/^"), ch, ch),
            st.builds(lambda x: UnaryOp("-", x), ch),
            st.builds(
                lambda f, x: Call(f, (x,)),
                st.sampled_from(
                    ["sqrt", "abs", "exp", "log", "sin", "cos", "tan", "asin", "acos", "atan"]
                ),
                ch,
            ),
            st.builds(
                lambda f, x, y: Call(f, (x, y)),
                st.sampled_from(["min", "max", "magnitude", "dot"]),
                ch,
                ch,
            ),
        )

    return st.recursive(leaves, extend, max_leaves=5)


def _block_preds():
    cmp = st.builds(
        Compare, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _block_exprs(), _block_exprs()
    )
    return st.recursive(
        cmp,
        lambda ch: st.one_of(
            st.builds(BoolOp, st.sampled_from("&|"), ch, ch),
            st.builds(lambda x: UnaryOp("~", x), ch),
        ),
        max_leaves=3,
    )


def _stats(x):
    finite = x[~np.isnan(x)]
    if finite.size == 0:
        return (np.nan, np.nan)
    return (float(finite.min()), float(finite.max()), bool(np.isnan(x).any()))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _block_preds(),
    st.lists(_values, min_size=1, max_size=6),
    st.lists(_values, min_size=1, max_size=6),
    st.sampled_from(["f8", "f4"]),
)
def test_truth_is_conservative(pred, av, bv, dtype):
    from lamina.derived import truth

    n = min(len(av), len(bv))
    A = {"a": np.array(av[:n], dtype), "b": np.array(bv[:n], dtype)}
    try:
        actual = evaluate(pred, A)[0]
    except ExpressionError:  # e.g. a literal 0 to a negative integer power
        return
    can_true, can_false = truth(
        pred, {k: _stats(v) for k, v in A.items()}, {k: v.dtype for k, v in A.items()}
    )
    assert can_true or not actual.any()
    assert can_false or actual.all()


def test_truth_prunes_blocks():
    from lamina.derived import interval, truth

    q = parse("vmag < 0.3 & T > 1200", "predicate")
    assert truth(q, {"vmag": (0.5, 2.0), "T": (0, 2000)}) == (False, True)
    assert truth(q, {"vmag": (0.0, 0.2), "T": (1300, 2000)}) == (True, False)
    assert truth(q, {"vmag": (0.0, 0.2), "T": (1300, 2000, True)}) == (True, True)  # NaNs may fail
    assert truth(q, {"vmag": (0.0, 1.0), "T": (1000, 2000)}) == (True, True)
    e = parse("magnitude(vx, vy)")
    iv = interval(e, {"vx": (3, 3), "vy": (-4, 4)})
    assert iv.lo <= 3 and 5 <= iv.hi < 5.0001 and not iv.nan
    assert interval(parse("a / b"), {"a": (1, 2), "b": (-1, 1)}).hi == np.inf
    assert interval(parse("sqrt(a)"), {"a": (-1, 4)}).nan
    assert truth(parse("gradient(a, 0) > 1", "predicate"), {"a": (0, 0)}) == (True, True)
    with pytest.raises(ExpressionError, match="no range"):
        truth(q, {"vmag": (0, 1)})


def test_integer_constants_do_not_wrap_silently():
    A = {"a": np.ones(3)}
    with pytest.raises(ExpressionError, match="integer overflow") as info:
        evaluate("a + 2 ^ 64", A)
    assert info.value.position == 6
    assert evaluate("a * 2 ^ 62", A)[0][0] == 2.0**62
    assert evaluate("a * 2.0 ^ 100", A)[0][0] == 2.0**100


def test_lamina_threads_that_is_no_count_is_refused_at_the_open(monkeypatch, tmp_path):
    """A bad $LAMINA_THREADS was named only where kernels or reads first used threads: at a
    step's end, which then failed; the open names it, before anything is written."""
    import lamina
    from lamina.errors import ConfigError

    monkeypatch.setenv("LAMINA_THREADS", "many")
    with pytest.raises(ConfigError, match=r"\$LAMINA_THREADS must be an integer >= 1"):
        lamina.open(str(tmp_path / "t.lam"), "w")
    assert not (tmp_path / "t.lam").exists()
