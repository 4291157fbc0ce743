"""The query engine (lamina.query): candidate blocks from statistics, exact selections, costs."""

from __future__ import annotations

import itertools
import json
import math
import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lamina
from lamina import cli
from lamina.derived import Interval, parse, truth
from lamina.engines import memory as memory_engine
from lamina.errors import (
    BoundsError,
    ExpressionError,
    NotFoundError,
    SelectionError,
    ShapeError,
    StepError,
)
from lamina.geometry import Box
from lamina.query import query, subtract

_names = itertools.count()


def boxes_of(shape, cuts0, cuts1) -> list[Box]:
    """Blocks of a 2-D domain cut at the given rows and columns."""
    r = [0, *cuts0, shape[0]]
    c = [0, *cuts1, shape[1]]
    return [
        Box((r[i], c[j]), (r[i + 1], c[j + 1]))
        for i in range(len(r) - 1)
        for j in range(len(c) - 1)
        if r[i] < r[i + 1] and c[j] < c[j + 1]
    ]


def write(f, name, full, blocks, fill=0.0, dtype=None):
    """Define *name*, write *full* over *blocks* in the current step; returns what a reader sees."""
    ds = f.create_dataset(name, full.shape, dtype=dtype or full.dtype, fill=fill)
    seen = np.full(full.shape, fill, dtype=ds.dtype)
    for b in blocks:
        ds[b.slices] = full[b.slices]
        seen[b.slices] = full[b.slices]
    return seen


def expected_truth(f, text, units, step):
    """(can be true, can be false) per unit, straight from the blocks' statistics and fill values."""
    pred = parse(text, mode="predicate")
    out = {}
    for u in units:
        ranges = {}
        for p in pred.inputs:
            ds = f[p]
            lo, hi, nan, covered = math.inf, -math.inf, False, 0
            for b in ds.blocks(step):
                i = b.box.intersect(u)
                if i is None:
                    continue
                covered += i.size
                if b.stats.count:
                    lo, hi = min(lo, b.stats.min), max(hi, b.stats.max)
                nan = nan or b.stats.count < b.box.size
            if covered < u.size:
                fv = float(ds.fill)
                if math.isnan(fv):
                    nan = True
                else:
                    lo, hi = min(lo, fv), max(hi, fv)
            ranges[p] = Interval(float(lo), float(hi), nan)
        out[u] = truth(pred, ranges)
    return out


def check(f, r, text, brute_full, arrays, step=None):
    """Everything a result must satisfy, given the brute-force mask over the whole domain."""
    box = r.region
    # units: disjoint, covering the region; inside one grid block or outside all of them
    assert sum(u.size for u in r.unit_boxes) == box.size
    for a, b in itertools.combinations(r.unit_boxes, 2):
        assert not a.overlaps(b)
    assert all(box.contains(u) for u in r.unit_boxes)
    if r.grid is not None:
        grid = [b.box for b in f[r.grid].blocks(r.step)]
        for u in r.unit_boxes:
            inside = [g for g in grid if g.contains(u)]
            assert len(inside) == 1 or not any(g.overlaps(u) for g in grid)
    # candidates: exactly the units whose statistics allow a match
    exp = expected_truth(f, text, r.unit_boxes, r.step)
    assert set(r.candidates) == {u for u, (t, _) in exp.items() if t}
    assert r.certain == [not exp[u][1] for u in r.candidates]
    # exact answer: the brute force, within the candidates
    want = brute_full[box.slices]
    # (a region keyed with integer indices: the mask has the shape numpy gives the key)
    np.testing.assert_array_equal(r.mask, want.reshape(r.mask_shape or want.shape))
    coords = np.argwhere(want) + np.asarray(box.start)
    np.testing.assert_array_equal(r.coords, coords.reshape(-1, len(box.start)))
    assert r.coords.dtype == np.int64
    assert r.count == int(want.sum())
    covered = np.zeros(want.shape, dtype=bool)
    for u, sure in zip(r.candidates, r.certain, strict=True):
        covered[u.relative_to(box)] = True
        if sure:
            assert want[u.relative_to(box)].all()
    assert not (want & ~covered).any(), "a match outside the candidate blocks"
    for p in r.select:
        np.testing.assert_array_equal(r.values[p], arrays[p][tuple(coords.T)])
        for u, vals in zip(r.candidates, r.candidate_values, strict=True):
            np.testing.assert_array_equal(vals[p], arrays[p][u.slices])


@pytest.fixture
def two_fields(open_file, new_path):
    """T (f8, 4 blocks, NaNs, one block unwritten -> fill -1) and g/P (f4, 3 slabs, fill NaN), two steps."""
    f = open_file(new_path(), "w")
    shape = (12, 10)
    rng = np.random.default_rng(7)
    T0 = np.arange(120, dtype="f8").reshape(shape)
    T0[1, 1] = T0[9, 2] = np.nan
    P0 = (-np.arange(120, dtype="f4").reshape(shape)) % 37
    t_blocks = boxes_of(shape, [6], [5])[:3]  # [6:12, 5:10] never written
    p_blocks = [
        Box((0, 0), (4, 10)),
        Box((4, 0), (8, 10)),
        Box((9, 0), (12, 10)),
    ]  # row 8 unwritten
    with f.step():
        Ts = write(f, "T", T0, t_blocks, fill=-1.0)
        Ps = write(f, "g/P", P0, p_blocks, fill=np.nan)
        N = write(
            f, "n", rng.integers(0, 10, shape).astype("i4"), boxes_of(shape, [3, 7], []), fill=0
        )
    with f.step():
        f["T"][...] = T0 + 1000
    return f, {"T": Ts, "g/P": Ps, "n": N}


CASES = [
    ("T > 20", lambda a: a["T"] > 20),
    ("T < 0", lambda a: a["T"] < 0),
    ("T == 3", lambda a: a["T"] == 3),
    ("T != T", lambda a: a["T"] != a["T"]),
    ("~(T >= 50)", lambda a: ~(a["T"] >= 50)),
    ("T > 20 & `g/P` < 10", lambda a: (a["T"] > 20) & (a["g/P"] < 10)),
    ("T > 100 | `g/P` <= 1", lambda a: (a["T"] > 100) | (a["g/P"] <= 1)),
    ("`g/P` != `g/P` | n == 9", lambda a: (a["g/P"] != a["g/P"]) | (a["n"] == 9)),
    ("abs(T - 30) <= 4 & ~(n > 5)", lambda a: (np.abs(a["T"] - 30) <= 4) & ~(a["n"] > 5)),
    ("n >= 0", lambda a: a["n"] >= 0),
    ("T > 1e9", lambda a: a["T"] > 1e9),
]


@pytest.mark.parametrize("text,fn", CASES, ids=[c[0] for c in CASES])
def test_matches_brute_force(two_fields, text, fn):
    f, arrays = two_fields
    with np.errstate(invalid="ignore"):
        want = fn(arrays)
    r = query(f, text, select=["T", "/g/P", "n"], step=0)
    assert r.step == 0 and r.grid == parse(text, mode="predicate").refs().__next__().path
    assert r.select == ("T", "g/P", "n")
    check(f, r, text, want, arrays)


@pytest.mark.parametrize(
    "region",
    [
        (slice(2, 9), slice(3, 8)),
        Box((6, 5), (12, 10)),
        "0:1, :",
        (7, ...),
        ((0, 0), (3, 10)),
        [(0, 0), [3, 10]],
        "5:5,:",
    ],
)
def test_regions(two_fields, region):
    f, arrays = two_fields
    text = "T < 40 | T < 0"
    want = (arrays["T"] < 40) | (arrays["T"] < 0)
    r = query(f.at(0), text, select="g/P", region=region)
    check(f, r, text, want, arrays)


def test_fill_region_is_a_unit(two_fields):
    f, arrays = two_fields
    r = query(f, "T < 0", step=0, select=["T"])
    # the unwritten quarter of T reads -1: certain, found without reading T for the predicate
    assert Box((6, 5), (12, 10)) in r.unit_boxes
    i = r.candidates.index(Box((6, 5), (12, 10)))
    assert r.certain[i]
    assert r.count == 30
    assert (r.values["T"] == -1).all()
    # the fill part costs nothing to read
    assert r.candidate_bytes_read == 0 and r.exact_bytes_read == 0


def test_steps_and_views(two_fields):
    f, arrays = two_fields
    later = query(f, "T >= 1000", select=["T"])  # last step: everything rewritten (but 2 NaNs)
    assert later.step == 1 and later.count == 118 and later.certain == [False]
    assert f.query("T >= 1000", step=-2).count == 0
    assert f.at(0).query("T >= 1000").count == 0
    assert query(f.at(0), "T >= 1000", step=1).count == 118


def test_bytes_and_blocks(two_fields):
    f, arrays = two_fields
    r = query(f, "T > 40", select=["n"], step=0)
    # the block answer reads n over the candidates, nothing else
    assert r.candidate_bytes_read == sum(u.size for u in r.candidates) * 4
    # the exact answer reads T over the candidates that are not certain
    unsure = [u for u, c in zip(r.candidates, r.certain, strict=True) if not c]
    assert unsure
    written = [b.box for b in f["T"].blocks(0)]
    touched = sum(i.size for u in unsure for b in written if (i := b.intersect(u)) is not None)
    assert r.exact_bytes_read == touched * 8
    assert r.exact_blocks_read == len({b for u in unsure for b in written if b.overlaps(u)})
    nothing = query(f, "T > 1e9", select=["n"], step=0)
    assert nothing.candidates == [] and nothing.bytes_read == 0 and nothing.count == 0
    assert nothing.coords.shape == (0, 2) and nothing.values["n"].dtype == np.int32


def test_blocks_only_and_presentation(two_fields):
    f, arrays = two_fields
    r = query(f, "T > 100", select=["T"], exact=False, step=0)
    assert not r.exact and r.mask is None and r.count is None
    assert r.candidates and len(r.candidate_values) == len(r.candidates)
    d = r.as_dict()
    assert d["exact_answer"] is None
    json.dumps(d)
    text = r.summary()
    assert "candidate blocks" in text and "units" in text
    r = query(f, "T != T", select=["T", "n"], step=0)
    d = r.as_dict(limit=1)
    assert d["exact_answer"]["count"] == 2 and len(d["exact_answer"]["coords"]) == 1
    assert d["exact_answer"]["values"]["T"] == ["nan"]
    json.dumps(d, allow_nan=False)
    assert "matching elements: 2" in r.summary()
    assert r.matches(5)[1][0] == (9, 2)
    one = query(f, "T == T", region=(slice(0, 1), slice(0, 1)), step=0).summary()
    assert "(1 element)" in one and "1 block read" in one and "1 blocks" not in one, one


def test_complex_and_unwritten_datasets(open_file, new_path):
    f = open_file(new_path(), "w")
    z = f.create_dataset("z", (6,), dtype="c16")
    f.create_dataset("never", (6,), fill=7.0)
    with f.step():
        z[:3] = [1, 2j, 3]
        z[3:] = [4, 5, 6j]
    r = query(f, "abs(z) > 3.5 & never == 7", select=["z"])
    assert r.candidates == [Box((0,), (3,)), Box((3,), (6,))]  # |z| statistics do not bound z
    assert r.coords[:, 0].tolist() == [3, 4, 5]
    assert r.values["z"].tolist() == [4, 5, 6j]
    assert query(f, "never < 7").candidates == []


def test_stencil_predicate(open_file, new_path):
    f = open_file(new_path(), "w")
    shape = (6, 7, 5)
    rng = np.random.default_rng(3)
    u, v, w = (rng.normal(size=shape) for _ in range(3))
    blocks = [Box((i, j, 0), (min(i + 3, 6), min(j + 4, 7), 5)) for i in (0, 3) for j in (0, 4)]
    with f.step():
        for n, a in (("u", u), ("v", v), ("w", w)):
            write(f, n, a, blocks)
    g = np.gradient
    cx = g(w, axis=1, edge_order=2) - g(v, axis=2, edge_order=2)
    cy = g(u, axis=2, edge_order=2) - g(w, axis=0, edge_order=2)
    cz = g(v, axis=0, edge_order=2) - g(u, axis=1, edge_order=2)
    mag = np.sqrt(cx**2 + cy**2 + cz**2)
    text = "magnitude(curl(u, v, w)) > 1.5 & u > -1"
    want = (mag > 1.5) & (u > -1)
    for region in (None, (slice(1, 5), slice(2, 7), slice(0, 1))):
        r = query(f, text, select=["v"], region=region)
        box = r.region
        got = np.zeros(shape, dtype=bool)
        got[box.slices] = r.mask
        np.testing.assert_array_equal(r.mask, want[box.slices])
        assert r.count == int(want[box.slices].sum()) > 0
        np.testing.assert_array_equal(r.values["v"], v[got])
    # halos: the exact answer reads u, v, w beyond the candidates (stencils have no statistics)
    r = query(f, text)
    assert r.candidates == r.unit_boxes and not any(r.certain)
    assert r.exact_bytes_read > 3 * 8 * r.region.size
    assert r.exact_blocks_read == 3 * len(blocks)


def test_errors(two_fields):
    f, _ = two_fields
    with pytest.raises(ExpressionError, match=r"unknown dataset 'Tx'.*Did you mean 'T'"):
        query(f, "Tx > 1")
    with pytest.raises(ExpressionError, match="Did you mean 'g/P'"):
        query(f, "P > 1")
    with pytest.raises(ExpressionError) as e:
        query(f, "T > ")
    assert e.value.position == 4
    with pytest.raises(ExpressionError, match="condition"):
        query(f, "T + 1")
    with pytest.raises(ExpressionError, match="no dataset"):
        query(f, "1 > 0")
    assert query(f, "1 > 0", select=["T"]).count == 120
    with pytest.raises(NotFoundError, match=r"unknown dataset 'TT'.*Did you mean 'T'"):
        query(f, "T > 1", select=["TT"])
    with pytest.raises(NotFoundError, match="is a group"):
        query(f, "T > 1", select=["g"])
    with pytest.raises(StepError, match="2 committed"):
        query(f, "T > 1", step=5)
    with pytest.raises(StepError, match="integer"):
        query(f, "T > 1", step="last")
    with pytest.raises(BoundsError, match=r"dimension 0 of size 12"):
        query(f, "T > 1", region=(slice(0, 13),))
    with pytest.raises(BoundsError, match="reaches 11 > 10"):
        query(f, "T > 1", region=Box((0, 0), (3, 11)))
    with pytest.raises(SelectionError, match="step 1"):
        query(f, "T > 1", region=(slice(0, 10, 2),))
    with pytest.raises(SelectionError):
        query(f, "T > 1", region="0:2:x")
    # (numpy's (x > 1)[[1, 2]] is rows 1 and 2: the list was taken for the element (1, 2))
    with pytest.raises(SelectionError, match=r"a list \[1, 2\] indexes numpy's way"):
        query(f, "T > 1", region=[1, 2])
    f.create_dataset("small", (3,))
    with pytest.raises(ShapeError, match=r"'small' has shape \(3,\) but 'T' has shape \(12, 10\)"):
        query(f, "T > small")
    with pytest.raises(ShapeError, match="different shapes"):
        query(f, "T > 1", select=["small"])


def test_subtract():
    outer = Box((0, 0, 0), (5, 6, 7))
    holes = [Box((1, 1, 1), (3, 4, 9)), Box((4, 0, 0), (5, 6, 7)), Box((0, 5, 0), (9, 9, 2))]
    pieces = subtract(outer, holes)
    seen = np.zeros(outer.shape, dtype=int)
    for p in pieces:
        seen[p.slices] += 1
    want = np.ones(outer.shape, dtype=int)
    for h in holes:
        want[h.slices] = 0
    np.testing.assert_array_equal(seen, want)


def test_subtract_against_a_grid_of_cells():
    """Random boxes and holes (overlapping, reaching out of the box, empty) in 0-3
    dimensions: the pieces are disjoint, inside the box, outside every hole, and cover the
    rest; and holes between many blocks leave as many pieces as there are gaps (each hole
    was taken from every piece left: a query over 8,000 such blocks took 82 s)."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        nd = int(rng.integers(0, 4))
        lo = tuple(int(v) for v in rng.integers(2, 8, nd))
        hi = tuple(a + int(v) for a, v in zip(lo, rng.integers(0, 7, nd), strict=True))
        outer = Box(lo, hi)
        holes = []
        for _ in range(int(rng.integers(0, 9))):
            a = tuple(int(v) for v in rng.integers(0, 10, nd))
            holes.append(
                Box(a, tuple(x + int(v) for x, v in zip(a, rng.integers(0, 6, nd), strict=True)))
            )
        pieces = subtract(outer, holes)
        seen = np.zeros(outer.shape, dtype=int)
        for p in pieces:
            assert p.intersect(outer) == p and not p.empty
            seen[p.relative_to(outer)] += 1
        want = np.ones(outer.shape, dtype=int)
        for h in holes:
            i = h.intersect(outer)
            if i is not None:
                want[i.relative_to(outer)] = 0
        np.testing.assert_array_equal(seen, want)
    blocks = [Box((4 * k,), (4 * k + 2,)) for k in range(8000)]
    gaps = subtract(Box((0,), (32000,)), blocks)
    assert len(gaps) == 8000 and all(g.shape == (2,) for g in gaps)


# ---------------------------------------------------------------------------
# property: random block layouts, data and thresholds

OPS = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@st.composite
def layouts(draw):
    shape = (draw(st.integers(1, 9)), draw(st.integers(1, 9)))

    def layout():
        c0 = sorted(draw(st.sets(st.integers(1, max(1, shape[0] - 1)), max_size=3)))
        c1 = sorted(draw(st.sets(st.integers(1, max(1, shape[1] - 1)), max_size=3)))
        blocks = boxes_of(shape, [c for c in c0 if c < shape[0]], [c for c in c1 if c < shape[1]])
        keep = draw(st.lists(st.booleans(), min_size=len(blocks), max_size=len(blocks)))
        return [b for b, k in zip(blocks, keep, strict=True) if k or len(blocks) == 1]

    def data():
        vals = draw(
            st.lists(
                st.sampled_from([-3.0, -1.0, 0.0, 0.5, 2.0, 4.0, np.nan]), min_size=1, max_size=6
            )
        )
        return np.asarray(
            draw(
                st.lists(
                    st.sampled_from(vals),
                    min_size=shape[0] * shape[1],
                    max_size=shape[0] * shape[1],
                )
            )
        ).reshape(shape)

    a, b = data(), data()
    la, lb = layout(), layout()
    ops = draw(st.lists(st.sampled_from(sorted(OPS)), min_size=2, max_size=2))
    ts = draw(st.lists(st.sampled_from([-2.0, 0.0, 0.5, 1.0, 3.0]), min_size=2, max_size=2))
    join = draw(st.sampled_from(["&", "|"]))
    negate = draw(st.booleans())
    r0 = sorted(draw(st.lists(st.integers(0, shape[0]), min_size=2, max_size=2)))
    r1 = sorted(draw(st.lists(st.integers(0, shape[1]), min_size=2, max_size=2)))
    fills = draw(st.lists(st.sampled_from([0.0, -5.0, np.nan]), min_size=2, max_size=2))
    return shape, a, b, la, lb, ops, ts, join, negate, (r0, r1), fills


@settings(max_examples=40)
@given(layouts())
def test_property_random_layouts(case):
    shape, a, b, la, lb, ops, ts, join, negate, (r0, r1), fills = case
    text = f"A {ops[0]} {ts[0]} {join} B {ops[1]} {ts[1]}"
    if negate:
        text = f"~({text})"
    name = f"mem://query-prop/{next(_names)}"
    f = lamina.open(name, "w", engine="memory")
    try:
        with f.step():
            arrays = {
                "A": write(f, "A", a, la, fill=fills[0]),
                "B": write(f, "B", b, lb, fill=fills[1]),
            }
        with np.errstate(invalid="ignore"):
            x = OPS[ops[0]](arrays["A"], ts[0])
            y = OPS[ops[1]](arrays["B"], ts[1])
        want = (x & y) if join == "&" else (x | y)
        if negate:
            want = ~want
        region = Box((r0[0], r1[0]), (r0[1], r1[1]))
        r = query(f, text, select=["A", "B"], region=region)
        check(f, r, text, want, arrays)
    finally:
        f.close()
        memory_engine.drop(name)


# ---------------------------------------------------------------------------
# derived quantities


def _velocity_file(path, engine, strategy):
    """vx, vy, vz, T on (8, 8, 8) in 8 blocks; the speed grows block by block; vmag and w = curl derived."""
    shape = (8, 8, 8)
    rng = np.random.default_rng(11)
    f = lamina.open(path, "w", engine=engine)
    full = {n: rng.uniform(-1, 1, shape) for n in ("vx", "vy", "vz", "T")}
    blocks = [Box((i, j, k), (i + 4, j + 4, k + 4)) for i in (0, 4) for j in (0, 4) for k in (0, 4)]
    for n, b in enumerate(blocks):  # block n: speeds 0.52 n +- 0.18
        for c in ("vx", "vy", "vz"):
            full[c][b.slices] = 0.3 * n + 0.1 * full[c][b.slices]
    ds = {n: f.create_dataset(n, shape) for n in full}
    f.derive("vmag", "magnitude(vx, vy, vz)", strategy=strategy)
    f.derive("w", "curl(vx, vy, vz)", strategy=strategy)
    with f.step():
        for n, d in ds.items():
            for b in blocks:
                d[b.slices] = full[n][b.slices]
    return f, full


def test_derived_strategies_agree(engine, new_path):
    results = {}
    for strategy in ("store", "stats", "expression"):
        f, full = _velocity_file(new_path(strategy), engine, strategy)
        try:
            results[strategy] = (
                query(f, "vmag < 0.5", select=["T", "vmag"]),
                query(f, "vmag < 0.5", select=["T"], region="0:6, :, 2:"),
                query(f, "magnitude(curl(vx, vy, vz)) > 0.3 & `w/z` > 0 & T > 0", select="w"),
                query(f, "vmag < 0.5", select=["T"]),
            )
        finally:
            f.close()
    vmag = np.sqrt(full["vx"] ** 2 + full["vy"] ** 2 + full["vz"] ** 2)
    store, stats, expr = results["store"], results["stats"], results["expression"]
    for k in range(4):
        for other in (stats[k], expr[k]):
            np.testing.assert_array_equal(other.mask, store[k].mask)
            np.testing.assert_array_equal(other.coords, store[k].coords)
            if k == 1 and other is expr[k]:  # exact ranges over parts of blocks: never fewer prunes
                assert set(other.candidates) <= set(store[k].candidates)
                continue
            assert other.candidates == store[k].candidates
            assert other.certain == store[k].certain
            for p in store[k].values:
                np.testing.assert_array_equal(other.values[p], store[k].values[p])
    whole, part, curl, _ = store
    np.testing.assert_array_equal(whole.mask, vmag < 0.5)
    np.testing.assert_array_equal(whole.values["T"], full["T"][vmag < 0.5])
    # pruning works: the slow blocks match everywhere, the fast ones are skipped
    assert any(whole.certain) and len(whole.candidates) < whole.units == 8
    assert curl.select == ("w/x", "w/y", "w/z") and curl.count > 0
    # "T where vmag < x": statistics cost what stored data costs; the expression reads every input
    for k in (1, 3):
        assert stats[k].candidate_bytes_read == store[k].candidate_bytes_read
        assert expr[k].candidate_bytes_read >= 3 * 8 * expr[k].region.size
        assert store[k].candidate_bytes_read < expr[k].candidate_bytes_read
    assert store[1].candidate_bytes_read == 8 * sum(c.size for c in store[1].candidates)


LOSSY = [("zfp", 0.1), {"id": "zfpy", "rate": 8}, {"id": "zfpy", "precision": 10}]


@pytest.mark.parametrize("compression", LOSSY, ids=["tolerance", "rate", "precision"])
@pytest.mark.parametrize("dtype", ["f8", "f4"])
def test_lossy_codecs_answer_for_the_values_read(tmp_path, compression, dtype):
    """Blocks stored through zfp read back other values than those written: their statistics
    are of the values read, so that a query prunes and decides by what every read returns.
    Thresholds at the written extremes, where values read lie on both sides of them."""
    path = str(tmp_path / "z.lam")
    data = np.random.default_rng(0).uniform(0, 1, (64, 64)).astype(dtype)
    with lamina.open(path, "w") as f:
        a = f.create_dataset("a", data.shape, dtype, compression=compression)
        with f.step():
            a[:32] = data[:32]
            a[32:] = data[32:]
    with lamina.open(path) as f:
        seen = f["a"][...]
        assert not np.array_equal(seen, data)  # lossy: the case this test is about
        for b in f["a"].blocks():
            part = seen[b.box.slices]
            assert (b.stats.min, b.stats.max) == (part.min(), part.max())
        hi, lo = float(data.max()), float(data.min())
        for text, want in (
            (f"a > {hi!r}", seen > hi),
            (f"a <= {hi!r}", seen <= hi),
            (f"a < {lo!r}", seen < lo),
            (f"a >= {lo!r}", seen >= lo),
        ):
            r = f.query(text)
            assert r.count == int(want.sum()), text
            np.testing.assert_array_equal(r.mask, want)


def test_zfp_beyond_its_bound_is_stored_raw(tmp_path, monkeypatch):
    """A block zfp would read back beyond the tolerance (a corner case of zfp's accuracy mode)
    is stored raw: every value read lies within the tolerance of the one written."""
    from lamina import codecs

    decode = codecs.Pipeline.decode

    def off_by_much(self, raw, dtype, shape, what):
        out = decode(self, raw, dtype, shape, what)
        if out[0, 0] > 0.5:  # some blocks only
            out = out + 1.0
        return out

    monkeypatch.setattr(codecs.Pipeline, "decode", off_by_much)
    path = str(tmp_path / "b.lam")
    data = np.zeros((64, 64))
    data[:32] = np.linspace(0.6, 0.9, 32 * 64).reshape(32, 64)  # its blocks would be off
    with lamina.open(path, "w") as f:
        a = f.create_dataset("a", data.shape, "f8", compression=("zfp", 0.1))
        with f.step():
            a[:32] = data[:32]
            a[32:] = data[32:]
    monkeypatch.setattr(codecs.Pipeline, "decode", decode)
    with lamina.open(path) as f:
        blocks = f["a"].blocks()
        assert [b.codec for b in blocks] == ["raw", "zfpy"]
        np.testing.assert_array_equal(f["a"][:32], data[:32])
        assert np.abs(f["a"][32:] - data[32:]).max() <= 0.1


@pytest.mark.parametrize("strategy", ["store", "stats", "expression"])
def test_derived_over_lossy_inputs_answer_for_the_values_read(tmp_path, strategy):
    """A quantity computed at write from inputs a lossy codec did not keep: its statistics
    (strategy "stats") are of values no read returns, so a query does not prune with them;
    every strategy answers for the values a read of the quantity returns."""
    path = str(tmp_path / "d.lam")
    data = np.random.default_rng(1).uniform(0, 1, (64, 64))
    with lamina.open(path, "w") as f:
        a = f.create_dataset("a", data.shape, "f8", compression=("zfp", 0.1))
        f.derive("m", "abs(a) * 2", strategy=strategy)
        f.derive("n", "m + 1", strategy="stats")  # through a quantity recomputed when read
        with f.step():
            a[:32] = data[:32]
            a[32:] = data[32:]
    with lamina.open(path) as f:
        m, n = f["m"][...], f["n"][...]
        thr = float(2 * data.max())
        for text, want in (
            (f"m > {thr!r}", m > thr),
            (f"m <= {thr!r}", m <= thr),
            (f"n > {thr + 1!r}", n > thr + 1),
        ):
            r = f.query(text)
            np.testing.assert_array_equal(r.mask, want, err_msg=text)


def test_blocks_without_statistics_are_read_together(tmp_path, monkeypatch):
    """Units whose ranges only reading can tell, and that make a box together, are read at once:
    a quantity kept as its expression is evaluated once over many blocks, not once per block;
    the answers are those of the stored quantity, and only the candidates' values are kept."""
    n = 40
    shape = (n, 6, 5)
    rng = np.random.default_rng(5)
    ramp = 2 * (np.arange(n)[:, None, None] / n) ** 2  # from 0 to 2 along axis 0
    full = {"vx": ramp + 0.01 * rng.uniform(-1, 1, shape), "vy": 0.1 * rng.uniform(-1, 1, shape)}
    slabs = [Box((i, 0, 0), (i + 1, 6, 5)) for i in range(n)]
    results = {}
    evaluations = []
    evaluate = lamina.derived.evaluate

    def spy(*args, **kw):
        evaluations.append(args[2])
        return evaluate(*args, **kw)

    monkeypatch.setattr(lamina.derived, "evaluate", spy)
    for strategy in ("store", "expression"):
        path = str(tmp_path / f"{strategy}.lam")
        with lamina.open(path, "w") as f:
            ds = {c: f.create_dataset(c, shape) for c in full}
            f.derive("sp", "vx * vx + vy * vy", strategy=strategy)
            f.derive("g", "gradient(vx)", strategy=strategy)
            with f.step():
                for c, d in ds.items():
                    for b in slabs:
                        d[b.slices] = full[c][b.slices]
        with lamina.open(path) as f:
            evaluations.clear()
            results[strategy] = [
                f.query("sp < 0.5", select=["sp", "vy"]),
                f.query("`g/x` > 0.05", select="g", region="3:37, 1:, :"),
                f.query("sp > 3", select="sp"),
            ]
            computed = list(evaluations)
    store, expr = results["store"], results["expression"]
    # the units are the blocks of the inputs: the condition is evaluated once over all of them;
    # the other components of g selected, once over the candidates (consecutive ones here)
    everything = Box((0, 0, 0), shape)
    cands = expr[1].candidates
    g_over_candidates = Box(cands[0].start, cands[-1].stop)
    assert g_over_candidates.size == sum(c.size for c in cands)
    assert computed == [everything, Box((3, 1, 0), (37, 6, 5)), g_over_candidates, everything]
    for a, b in zip(store, expr, strict=True):
        assert 0 < len(b.candidates) < len(b.unit_boxes)
        assert a.candidates == b.candidates and a.certain == b.certain
        np.testing.assert_array_equal(a.coords, b.coords)
        for p in a.values:
            np.testing.assert_array_equal(a.values[p], b.values[p])
        for va, vb in zip(a.candidate_values, b.candidate_values, strict=True):
            for p in va:
                np.testing.assert_array_equal(va[p], vb[p])
        # the candidates' values hold no memory of the units that were pruned
        arrays = [v for got in b.candidate_values for v in got.values()]
        owners = {id(o): o for o in (a if a.base is None else a.base for a in arrays)}
        assert sum(o.nbytes for o in owners.values()) == sum(a.nbytes for a in arrays)


def test_derived_declared_by_a_reader(tmp_path):
    path = str(tmp_path / "v.lam")
    f, full = _velocity_file(path, "native", "stats")
    f.close()
    with lamina.open(path) as g:
        g.derive("speed2", "vx^2 + vy^2 + vz^2")  # this process only: computed when read
        r = g.query("speed2 < 0.25 & vmag < 0.5", select=["speed2"])
        want = full["vx"] ** 2 + full["vy"] ** 2 + full["vz"] ** 2
        np.testing.assert_array_equal(r.mask, want < 0.25)
        np.testing.assert_allclose(r.values["speed2"], want[want < 0.25])
        assert r.grid == "vmag"  # the first dataset of the condition with blocks
        # no blocks at all: the units follow the blocks of the anchor (vx), exact ranges are read
        r = g.query("speed2 < 0.25", select=None)
        assert r.grid == "speed2" and r.units == 8 and r.select == ()
        np.testing.assert_array_equal(r.mask, want < 0.25)
        assert r.candidate_bytes_read == 3 * 8 * want.size and r.candidate_blocks_read == 24
        assert r.exact_bytes_read == 0  # the values read for the ranges are reused


# ---------------------------------------------------------------------------
# command line


@pytest.fixture
def lam_file(tmp_path):
    f, full = _velocity_file(str(tmp_path / "v.lam"), "native", "stats")
    f.close()
    return str(tmp_path / "v.lam"), full


def run(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_query(lam_file, capsys):
    path, full = lam_file
    vmag = np.sqrt(full["vx"] ** 2 + full["vy"] ** 2 + full["vz"] ** 2)
    n = int((vmag < 0.5).sum())
    rc, out, err = run(
        ["query", path, "--where", "vmag < 0.5", "--select", "T,vmag", "--limit", "3"], capsys
    )
    assert rc == 0, err
    assert f"matching elements: {n}" in out and "candidate blocks:" in out and "bytes" not in err
    assert "first 3 matches" in out and "vmag" in out.splitlines()[-4]
    rc, out, err = run(
        ["query", path, "--where", "vmag < 0.5", "--blocks-only", "--region", "0:4,:,:"], capsys
    )
    assert rc == 0 and "exact answer" not in out and "[0:4, 0:4, 0:4]" in out
    rc, out, err = run(
        ["query", path, "-w", "vmag < 0.5", "--json", "-s", "T", "--step", "-1", "-n", "2"], capsys
    )
    d = json.loads(out)
    assert (
        rc == 0 and d["exact_answer"]["count"] == n and len(d["exact_answer"]["values"]["T"]) == 2
    )
    for argv, msg in [
        (["--where", "vmgn < 1"], "Did you mean 'vmag'"),
        (["--where", "vmag <"], "position"),
        (["--where", "vmag < 1", "--region", "0:9"], "out of bounds"),
        (["--where", "vmag < 1", "--step", "3"], "does not exist"),
        (["--where", "vmag < 1", "--select", "nope"], "unknown dataset 'nope'"),
        (["--where", "vmag < 1", "--limit", "-1"], "--limit"),
    ]:
        rc, out, err = run(["query", path, *argv], capsys)
        assert rc == 2 and "Traceback" not in err, err
        # one line; an expression's error with its picture below (the caret at the position)
        lines = err.strip().splitlines()
        assert msg in lines[0], err
        assert len(lines) == 1 or (len(lines) == 3 and lines[2].strip() == "^"), err
    rc, out, err = run(["query", str(path) + ".missing", "--where", "a > 1"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_cli_ls_shows_derived(lam_file, capsys):
    path, _ = lam_file
    rc, out, err = run(["ls", path], capsys)
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.strip().startswith("vmag "))
    assert "derived = magnitude(vx, vy, vz) (strategy stats)" in line
    assert "derived = curl(vx, vy, vz)" in next(
        x for x in out.splitlines() if x.strip() == "w/" or x.strip().startswith("w/ ")
    )
    rc, out, err = run(["ls", path, "--json"], capsys)
    nodes = {n["path"]: n for n in json.loads(out)["nodes"]}
    assert nodes["/vmag"]["derived"] == {"expression": "magnitude(vx, vy, vz)", "strategy": "stats"}
    assert nodes["/w/x"]["derived"]["strategy"] == "stats"
    assert "derived" not in nodes["/vx"]


def test_a_region_keyed_with_integers_gives_the_mask_numpy_gives(tmp_path):
    """``region=np.s_[2]`` (or ``"2,:"``) of a 2-D domain: ``r.mask`` is ``(x > t)[key]`` of
    numpy's shape (one axis), as docs/query.md says; it had the box's (1, 8)."""
    x = np.arange(48.0).reshape(6, 8)
    path = str(tmp_path / "q.lam")
    with lamina.open(path, "w") as f:
        f.create_dataset("x", data=x)
    with lamina.open(path) as f:
        for region, key in (
            (np.s_[2], np.s_[2]),
            ("2,:", np.s_[2, :]),
            (np.s_[..., 3], np.s_[..., 3]),
            (np.s_[1, 5], np.s_[1, 5]),
            (np.s_[1:4], np.s_[1:4]),
            (Box((1, 2), (3, 5)), np.s_[1:3, 2:5]),
        ):
            r = f.query("x > 20", region=region)
            want = (x > 20)[key]
            assert r.mask.shape == want.shape, region
            np.testing.assert_array_equal(r.mask, want)
            assert r.count == int(np.sum(want))


def test_an_answer_larger_than_memory_is_refused_before_it_is_made(tmp_path, monkeypatch):
    """A predicate true on the fill value of a huge dataset holding a few blocks: the exact
    answer (2**40 coordinates) is a MemoryError naming the query and saying what to ask
    instead, before anything is made (the process was killed for memory); exact=False and
    a predicate false on the fill still answer.  Matches found part by part are counted
    against the limit too."""
    from lamina.query import core

    path = str(tmp_path / "sparse.lam")
    with lamina.open(path, "w") as f:
        d = f.create_dataset("d", shape=(1 << 40,), dtype="u1", fill=7)
        with f.step():
            d.write(np.arange(8, dtype="u1"), offset=(0,))
            d.write(np.arange(8, dtype="u1"), offset=((1 << 40) - 8,))
    with lamina.open(path) as f:
        with pytest.raises(MemoryError, match=r"query 'd > 2'.*exact=False"):
            f.query("d > 2")
        assert len(f.query("d > 2", exact=False).candidates) == 3  # the fill between counts
        assert f.query("d > 100").count == 0
        assert f.query("d > 2", region=np.s_[:16]).count == 5 + 8  # a region answers
        # evaluated part by part: 5 matches in the first block, the limit 4 elements
        monkeypatch.setattr(core, "answer_limit", lambda: 4 * 8)
        with pytest.raises(MemoryError, match="holds 5 elements at least"):
            f.query("d > 2", region=np.s_[:8])
        assert f.query("d > 3", region=np.s_[:8]).count == 4
