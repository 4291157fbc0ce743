"""Queries give exactly what evaluating the predicate element by element gives, for every dtype."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import lamina
from lamina.derived import BinOp, BoolOp, Call, Compare, Num, Ref, UnaryOp, evaluate
from lamina.engines import memory as memory_engine
from lamina.errors import ExpressionError
from lamina.geometry import Box
from lamina.query import core as query_core

_names = itertools.count()


def _file(dtype, blocks, fill=0):
    """A memory file with dataset 'a' of *dtype*, one block per list in *blocks* (1-D)."""
    name = f"mem://query-sound/{next(_names)}"
    f = lamina.open(name, "w", engine="memory")
    n = sum(len(b) for b in blocks)
    ds = f.create_dataset("a", (n,), dtype=dtype, fill=fill)
    full = np.concatenate([np.asarray(b, dtype=dtype) for b in blocks])
    with f.step():
        start = 0
        for b in blocks:
            ds[start : start + len(b)] = full[start : start + len(b)]
            start += len(b)
    return name, f, full


def _brute(pred, arrays):
    return np.asarray(evaluate(pred, arrays)[0], dtype=bool)


@pytest.mark.parametrize(
    "dtype, blocks, pred",
    [
        # uint8 arithmetic wraps: a + a is at most 254, so nothing is > 300
        ("u1", [[200, 250], [100, 10]], "a + a > 300"),
        ("u1", [[200, 250], [100, 10]], "a + 1 < 100"),
        ("i1", [[100, 120], [1, 2]], "a * 2 < 0"),
        ("i8", [[2**62, 2**62 + 5], [0, 1]], "a * 4 == 0"),
        ("u8", [[0, 1], [5, 6]], "a - 2 > 10"),
        # float16: the literal is cast to float16 before comparing
        ("f2", [[0.1, 0.1], [0.3, 0.3]], "a == 0.1"),
        ("f2", [[0.1, 0.2], [0.3, 0.3]], "a <= 0.1"),
        ("f2", [[60000.0, 65000.0], [1.0, 2.0]], "a * 2 > 1e300"),
        # float32: 1e300 is inf in float32
        ("f4", [[np.inf, np.inf], [1.0, 2.0]], "a == 1e300"),
        ("f4", [[np.inf, np.inf], [1.0, 2.0]], "a > 1e300"),
        ("f4", [[3e38, 3e38], [1.0, 2.0]], "a + a > 1e300"),
        # long double (80-bit on x86): 2^53 + 1 is a value there, numpy compares with it exactly
        ("g", [[2**53, 2**53], [1, 2]], "a < 9007199254740993"),
        ("g", [[2**53, 2**53], [1, 2]], "a >= 9007199254740993"),
        ("g", [[2**53, 2**53], [1, 2]], "a != 9007199254740993"),
        ("g", [[2**53 + 1, 2**53 + 1], [1, 2]], "a - 1 == 9007199254740992"),
    ],
)
def test_pruning_follows_the_dtype(dtype, blocks, pred):
    name, f, full = _file(dtype, blocks)
    try:
        want = _brute(pred, {"a": full})
        r = f.query(pred)
        got = np.zeros(full.shape, dtype=bool)
        got[tuple(r.coords.T)] = True
        np.testing.assert_array_equal(got, want)
        for u, sure in zip(r.candidates, r.certain, strict=True):
            if sure:
                assert want[u.slices].all(), f"{u} reported certain but not all match"
        covered = np.zeros(full.shape, dtype=bool)
        for u in r.candidates:
            covered[u.slices] = True
        assert not (want & ~covered).any()
    finally:
        f.close()
        memory_engine.drop(name)


def test_a_dataset_cast_to_long_double_is_bounded_outward():
    """int64 2^53 + 1 against long double 2^53 + 0.5: numpy casts the int64 to long double
    exactly; its bound, cast through float64 to nearest, was 2^53 and pruned the block."""
    name = f"mem://query-sound/{next(_names)}"
    k = np.full(4, 2**53 + 1, dtype=np.int64)
    y = np.full(4, np.longdouble(2**53) + np.longdouble(0.5))
    with lamina.open(name, "w", engine="memory") as f:
        for path, a in (("k", k), ("y", y)):
            f.create_dataset(path, a.shape, a.dtype)
        with f.step():
            f["k"][...], f["y"][...] = k, y
        for pred in ("k > y", "y < k", "k == y", "k - y > 0"):
            want = _brute(pred, {"k": k, "y": y})
            assert f.query(pred).count == int(want.sum()), pred
    memory_engine.drop(name)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here")
def test_a_long_double_fill_bounds_the_unwritten_elements_outward():
    """The unwritten elements of a long double dataset read as its fill, 1 + 2^-60 here: its
    bound, rounded to the nearest float64 (1.0), let ``x > 1`` skip them all."""
    name = f"mem://query-sound/{next(_names)}"
    fill = np.longdouble(1) + np.longdouble(2) ** -60
    with lamina.open(name, "w", engine="memory") as f:
        x = f.create_dataset("x", (16,), np.longdouble, fill=fill)
        with f.step():
            x[:8] = 0
        full = f["x"][...]
        for pred in ("x > 1", "x >= 1 + 2^-60", "x < 1", "x != 1"):
            want = _brute(pred, {"x": full})
            assert f.query(pred).count == int(want.sum()), pred
    memory_engine.drop(name)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here")
@pytest.mark.parametrize("strategy", ["store", "stats", "expression"])
def test_a_long_double_quantity_read_for_its_range_is_bounded_outward(strategy):
    """A quantity without statistics of its own (kept as its expression) is read to find its
    range: that range, rounded to the nearest float64 (1 + 2^-60 as 1.0), let ``d > 1`` drop
    every match."""
    name = f"mem://query-sound/{next(_names)}"
    x = np.longdouble(1) + np.longdouble(2) ** -60
    with lamina.open(name, "w", engine="memory") as f:
        a = f.create_dataset("a", (8,), np.longdouble)
        f.derive("d", "a * 1", strategy)
        with f.step():
            a[0:4] = np.full(4, x)
            a[4:8] = 0
        full = f["a"][...]
        for pred in ("d > 1", "d + a > 2", "d < 1", "d >= 1 + 2^-60"):
            want = _brute(pred.replace("d", "(a * 1)"), {"a": full})
            assert f.query(pred).count == int(want.sum()), (strategy, pred)
    memory_engine.drop(name)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here")
def test_long_double_ranges_given_to_truth_are_taken_outward():
    """``truth`` with the range of a long double dataset given as numbers of its dtype."""
    from lamina.derived import parse, truth

    x = np.longdouble(1) + np.longdouble(2) ** -60
    can, _ = truth(parse("a > 1", "predicate"), {"a": (x, x)}, {"a": np.longdouble})
    assert can
    can, _ = truth(parse("a < -1", "predicate"), {"a": (-x, -x)}, {"a": np.longdouble})
    assert can


@pytest.mark.parametrize(
    "pred, pos",
    [("a > 1" + "0" * 400, 4), ("a < .\u00b9", 4), ("a + 2 ^ 1000000000000 > 0", 6)],
)
def test_unrepresentable_literals_in_a_query(pred, pos):
    name, f, _ = _file("f8", [[1.0, 2.0]])
    try:
        with pytest.raises(lamina.ExpressionError) as info:
            f.query(pred)
        assert info.value.position == pos
    finally:
        f.close()
        memory_engine.drop(name)


# ---------------------------------------------------------------------------
# property: random dtypes, data, blocks and predicates; the query equals the brute force

DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "?"]

_INT_EDGES = [0, 1, 2, 3, 100, 127, 128, 200, 255, 256, 2**15 - 1, 2**15, 2**16 - 1, 2**16]
_INT_EDGES += [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**53 + 1, 2**62, 2**63 - 1, 2**63]
_INT_EDGES += [2**64 - 1]
_FLOAT_EDGES = [0.0, 0.1, 0.3, 0.5, 1.0, 1.5, 2.0, 255.5, 300.0, 65504.0, 65519.0, 65520.0]
_FLOAT_EDGES += [1e20, 3.4028234663852886e38, 3.5e38, 1e300, 1.7976931348623157e308]
_FLOAT_EDGES += [1e-300, 1e-45, 6e-8, 2.0**-24, 1e-5]


def _pool(dt: np.dtype) -> list:
    """Values worth testing for *dt*: its extremes, values near the literals, NaN and inf."""
    if dt.kind == "b":
        return [False, True]
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = int(info.min), int(info.max)
        cands = [lo, lo + 1, hi - 1, hi] + _INT_EDGES + [-v for v in _INT_EDGES] + [-1, -2]
        return sorted({v for v in cands if lo <= v <= hi})
    with np.errstate(over="ignore"):
        vals = [dt.type(v) for v in _FLOAT_EDGES] + [dt.type(-v) for v in _FLOAT_EDGES]
    info = np.finfo(dt)
    vals += [info.max, -info.max, info.tiny, info.smallest_subnormal, np.inf, -np.inf, np.nan]
    vals += [np.nextafter(dt.type(v), dt.type(np.inf)) for v in (0.1, 1.0, 255.5)]
    vals += [np.nextafter(dt.type(v), dt.type(-np.inf)) for v in (0.1, 1.0, 300.0)]
    return vals


@st.composite
def _column(draw, n: int):
    """A dtype, a fill value, blocks (some left unwritten) and the data written there."""
    dt = np.dtype(draw(st.sampled_from(DTYPES)))
    pool = _pool(dt)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=6)))
    edges = [0, *cuts, n]
    blocks = [Box((edges[i],), (edges[i + 1],)) for i in range(len(edges) - 1)]
    written = [b for b in blocks if draw(st.booleans()) or len(blocks) == 1]
    data = np.zeros(n, dtype=dt)
    for b in written:  # each block takes its values from a few of the pool: ranges differ
        few = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        if dt.kind in "iu" and draw(st.booleans()):
            info = np.iinfo(dt)
            few.append(draw(st.integers(int(info.min), int(info.max))))
        elif dt.kind == "f" and draw(st.booleans()):
            few.append(draw(st.floats(width=8 * dt.itemsize if dt.itemsize > 2 else 16)))
        with np.errstate(over="ignore", invalid="ignore"):
            vals = draw(st.lists(st.sampled_from(few), min_size=b.size, max_size=b.size))
            data[b.slices] = np.asarray(vals).astype(dt)
    fill = draw(st.sampled_from(pool))
    return dt, blocks if written else [], written, data, fill


_INT_LITS = [0, 1, 2, 3, 7, 100, 127, 128, 200, 255, 256, 300, 1000, 32767, 32768, 65535]
_INT_LITS += [65536, 2**31 - 1, 2**31, 2**32, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]


class _FromData(Num):
    """A literal to be replaced by (the magnitude of) one of the values the data holds."""


def _literals():
    """Literals: the edges of the dtypes, and (most often) values the data holds."""
    edges = st.sampled_from(_INT_LITS + _FLOAT_EDGES).map(Num)
    slots = st.integers(0, 10**6).map(_FromData)
    lits = st.one_of(edges, slots, slots)
    return st.one_of(lits, lits.map(lambda n: UnaryOp("-", n)))


def _fill_in(node, values: list):
    """*node* with every ``_FromData`` literal replaced by a value of the data."""
    if isinstance(node, _FromData):
        return Num(values[node.value % len(values)]) if values else Num(1)
    kids = node.children
    if not kids:
        return node
    new = [_fill_in(k, values) for k in kids]
    if isinstance(node, Call):
        return dataclasses.replace(node, args=tuple(new))
    if isinstance(node, UnaryOp):
        return dataclasses.replace(node, operand=new[0])
    return dataclasses.replace(node, left=new[0], right=new[1])


def _magnitudes(arrays) -> list:
    out = []
    for a in arrays:
        for v in np.asarray(a).reshape(-1).tolist():
            v = int(v) if isinstance(v, bool) else v
            if isinstance(v, float) and not math.isfinite(v):
                continue
            out.append(abs(v))
    return out


def _exprs(lits):
    """Arithmetic expressions that read at least one dataset (literals as other operands)."""
    refs = st.sampled_from([Ref("a"), Ref("b")])

    def extend(ch):
        other = st.one_of(ch, lits)
        return st.one_of(
            st.builds(BinOp, st.sampled_from("+-*/"), ch, other),
            st.builds(BinOp, st.sampled_from("+-*/"), lits, ch),
            st.builds(
                lambda x, n: BinOp("^", x, Num(n)), ch, st.sampled_from([0, 1, 2, 3, 0.5, 2.0])
            ),
            st.builds(lambda x: UnaryOp("-", x), ch),
            st.builds(
                lambda f, x: Call(f, (x,)),
                st.sampled_from(["abs", "sqrt", "exp", "log", "sin", "atan"]),
                ch,
            ),
            st.builds(
                lambda f, x, y: Call(f, (x, y)),
                st.sampled_from(["min", "max", "magnitude", "add", "subtract", "multiply"]),
                ch,
                other,
            ),
            st.builds(
                lambda f, x, y, z: Call(f, (x, y, z)),
                st.sampled_from(["min", "max"]),
                ch,
                other,
                other,
            ),
            st.builds(lambda x, y, z, w: Call("dot", (x, y, z, w)), ch, other, other, other),
            st.builds(
                lambda xs: Call("magnitude", (Call("cross", tuple(xs)),)),
                st.lists(other, min_size=6, max_size=6),
            ),
            st.builds(lambda x, n: Call("pow", (x, Num(n))), ch, st.sampled_from([1, 2, 3, 0.5])),
        )

    return st.recursive(refs, extend, max_leaves=3)


def _predicates(lits):
    ops = st.sampled_from(["<", "<=", ">", ">=", "==", "!="])
    exprs = _exprs(lits)
    cmp = st.one_of(
        st.builds(Compare, ops, exprs, lits),  # most queries: a quantity and a threshold
        st.builds(Compare, ops, exprs, lits),
        st.builds(Compare, ops, exprs, exprs),
    )
    return st.recursive(
        cmp,
        lambda ch: st.one_of(
            st.builds(BoolOp, st.sampled_from("&|"), ch, ch),
            st.builds(lambda x: UnaryOp("~", x), ch),
        ),
        max_leaves=3,
    )


_PREDICATES = _predicates(_literals())


@pytest.mark.parametrize(
    "text",
    [
        # integer constants fold exactly in the bounds as in the evaluator: 0 * 2^63 is 0
        "magnitude(cross(`a`, `a`, 0, 9223372036854775808, `a`, 0)) < 0",
        "`a` * 0 * 9223372036854775808 < 1",
        "`a` > 2 ^ -1",  # an integer to a negative power: 0.5, as in Python
    ],
)
def test_constants_fold_in_the_bounds_as_in_the_evaluator(text):
    """The query's bounds fold a constant expression as the evaluator does; they went through
    numpy, which refuses 2^63 as an int64 (an OverflowError out of f.query) and 2 ^ -1."""
    name = f"mem://query-sound/{next(_names)}"
    with lamina.open(name, "w", engine="memory") as f:
        with f.step():
            f.create_dataset("a", (4,), dtype="u8")[...] = np.arange(4, dtype=np.uint64)
        want = _brute(text, {"a": np.arange(4, dtype=np.uint64)})
        r = f.query(text, select=["a"])
        got = np.zeros(4, dtype=bool)
        got[tuple(r.coords.T)] = True
        np.testing.assert_array_equal(got, want, err_msg=text)


@settings(max_examples=max(200, settings().max_examples))
@given(st.data())
def test_property_query_equals_brute_force(data):
    n = data.draw(st.integers(2, 12), label="n")
    cols = {p: data.draw(_column(n), label=p) for p in ("a", "b")}
    values = _magnitudes([a for _, _, _, full, fill in cols.values() for a in (full, fill)])
    pred = _fill_in(data.draw(_PREDICATES, label="predicate"), values)
    text = str(pred)
    # units judged in groups (split 2 or 3 ways), or one by one as few units are by default
    fanout = data.draw(st.sampled_from([0, 2, 3]), label="fanout")
    name = f"mem://query-sound/{next(_names)}"
    f = lamina.open(name, "w", engine="memory")
    saved = query_core.FANOUT, query_core.GROUP_MIN
    if fanout:
        query_core.FANOUT, query_core.GROUP_MIN = fanout, 2
    try:
        seen = {}
        with f.step():
            for p, (dt, _, written, full, fill) in cols.items():
                ds = f.create_dataset(p, (n,), dtype=dt, fill=fill)
                seen[p] = np.full(n, fill, dtype=dt)
                for b in written:
                    ds[b.slices] = full[b.slices]
                    seen[p][b.slices] = full[b.slices]
        try:
            want = _brute(text, seen)
        except ExpressionError:  # the evaluator refuses it (e.g. int8 + 300): so does the query
            event("the evaluator refuses the predicate")
            with pytest.raises(ExpressionError):
                f.query(text, select=["a", "b"])
            return
        r = f.query(text, select=["a", "b"])
        event(f"units pruned: {len(r.candidates) < r.units}, certain: {any(r.certain)}")
        event(f"matches: {'none' if not want.any() else 'all' if want.all() else 'some'}")
        got = np.zeros(n, dtype=bool)
        got[tuple(r.coords.T)] = True
        np.testing.assert_array_equal(got, want, err_msg=text)
        assert r.count == int(want.sum())
        covered = np.zeros(n, dtype=bool)
        for u, sure in zip(r.candidates, r.certain, strict=True):
            covered[u.slices] = True
            if sure:
                assert want[u.slices].all(), f"{text}: {u} reported certain, not all match"
        assert not (want & ~covered).any(), f"{text}: a match outside the candidates"
        for p in ("a", "b"):
            np.testing.assert_array_equal(r.values[p], seen[p][want])
    finally:
        query_core.FANOUT, query_core.GROUP_MIN = saved
        f.close()
        memory_engine.drop(name)


# ---------------------------------------------------------------------------
# memory: the exact answer is built unit by unit, never over the whole domain


def test_huge_domain_answers_in_small_memory():
    import tracemalloc

    shape = (2**20, 2**20)  # 8 TiB of float64, of which 4 blocks of 64 x 64 are written
    name = f"mem://query-sound/{next(_names)}"
    f = lamina.open(name, "w", engine="memory")
    try:
        a = f.create_dataset("a", shape, dtype="f8", fill=0.0)
        t = f.create_dataset("t", shape, dtype="i4", fill=-1)
        rng = np.random.default_rng(5)
        blocks = [
            Box((i, j), (i + 64, j + 64))
            for i, j in [(0, 0), (5000, 70), (2**19, 2**20 - 64), (2**20 - 64, 3)]
        ]
        data = {b: rng.uniform(0, 1, (64, 64)) for b in blocks}
        with f.step():
            for b in blocks:
                a[b.slices] = data[b]
                t[b.slices] = np.arange(b.size, dtype="i4").reshape(64, 64)
        want = sorted(
            ((b.start[0] + i, b.start[1] + j), data[b][i, j], 64 * i + j)
            for b in blocks
            for i, j in zip(*np.nonzero((data[b] > 0.9) & (data[b] < 0.95)), strict=True)
        )
        tracemalloc.start()
        try:
            r = f.query("a > 0.9 & a < 0.95", select=["a", "t"])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, f"peak {peak} bytes for a query of a few 64 x 64 blocks"
        assert r.count == len(want) > 0
        assert [tuple(c) for c in r.coords.tolist()] == [w[0] for w in want]
        np.testing.assert_array_equal(r.values["a"], [w[1] for w in want])
        np.testing.assert_array_equal(r.values["t"], [w[2] for w in want])
        assert set(r.candidates) == set(blocks)
        # the whole-region mask is built only when asked for, here over a small region
        small = f.query("a > 0.9 & a < 0.95", region=(slice(4990, 5100), slice(0, 200)))
        m = small.mask
        assert m.shape == (110, 200) and m.sum() == small.count
        np.testing.assert_array_equal(np.argwhere(m) + (4990, 0), small.coords)
    finally:
        f.close()
        memory_engine.drop(name)


@pytest.mark.parametrize(
    "pred",
    [
        "a > 0.5",
        "a > 0.5 & b < 3",
        "a >= 0",  # every unit certain
        "gradient(a, 1) > 0.2 | b == 2",  # stencils: halos read part by part
        "s > 0.6",  # a derived quantity without statistics: exact ranges read part by part
    ],
)
def test_parts_of_units_give_the_same_answer(monkeypatch, pred):
    from lamina.query import core

    name = f"mem://query-sound/{next(_names)}"
    f = lamina.open(name, "w", engine="memory")
    try:
        shape = (9, 13)
        rng = np.random.default_rng(8)
        a = f.create_dataset("a", shape, fill=0.25)
        b = f.create_dataset("b", shape, dtype="i2", fill=7)
        f.derive("s", "a * a + 0.1", strategy="expression")
        with f.step():
            a[0:5, 0:6] = rng.uniform(0, 1, (5, 6))
            a[5:9, 2:13] = rng.uniform(0, 1, (4, 11))
            b[:, 0:13] = rng.integers(0, 5, shape)
        whole = f.query(pred, select=["a", "b"])
        monkeypatch.setattr(core, "PART_ELEMENTS", 4)
        parts = f.query(pred, select=["a", "b"])
        assert whole.count > 0
        np.testing.assert_array_equal(parts.coords, whole.coords)
        for p in ("a", "b"):
            np.testing.assert_array_equal(parts.values[p], whole.values[p])
        np.testing.assert_array_equal(parts.mask, whole.mask)
        np.testing.assert_array_equal(whole.coords, np.argwhere(whole.mask))
    finally:
        f.close()
        memory_engine.drop(name)


def test_zero_dimensional_domain():
    name = f"mem://query-sound/{next(_names)}"
    f = lamina.open(name, "w", engine="memory")
    try:
        x = f.create_dataset("x", (), dtype="i4")
        with f.step():
            x[()] = 5
        r = f.query("x == 5", select=["x"])
        assert r.count == 1 and r.coords.shape == (1, 0) and r.values["x"].tolist() == [5]
        assert r.mask.shape == () and bool(r.mask)
        r = f.query("x + 1 == 5", select=["x"])
        assert r.count == 0 and r.coords.shape == (0, 0) and not r.mask
    finally:
        f.close()
        memory_engine.drop(name)
