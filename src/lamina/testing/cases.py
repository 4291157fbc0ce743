"""Round-trip cases every engine must pass: what a writer program writes, what a reader program must see.

A :class:`Case` has a ``write(f, ctx)`` that every writer rank runs on a
file opened ``'w'`` (collective calls on every rank, each rank putting its
share of the blocks, :meth:`Context.mine`) and a ``read(f, ctx)`` that every
reader rank runs on the same file opened ``'r'``, checking everything.
Readers take steps in order (:meth:`Context.steps`), as a consumer of the
in situ transport must; what needs more of an engine names it in
:attr:`Case.needs` (see :data:`CAPABILITIES`).  Random data comes from
:meth:`Context.rng`, seeded by the case's name, so writers and readers
draw the same numbers.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

import lamina
from lamina.geometry import Box, decompose

#: what a case may need of an engine beyond writing a file and reading it back in order
CAPABILITIES = {
    "random_access": "readers read any committed step, in any order, as often as they like",
    "writer_reads": "a writer reads back the steps it committed",
    "stored_codecs": "blocks are stored with the dataset's compression (sizes and codec names show it)",
    "reopen": "a file outlives its writer: opened again in 'a' or 'w', read after the writer closed",
}

INT_DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"]
FLOAT_DTYPES = ["f2", "f4", "f8"]
COMPLEX_DTYPES = ["c8", "c16"]
ALL_DTYPES = ["?", *INT_DTYPES, *FLOAT_DTYPES, *COMPLEX_DTYPES]
#: a block bigger than the statistics chunk (and than one checksum segment of that size)
CHUNK = 1 << 18


@dataclass
class Context:
    """Where a case runs: the engine, its capabilities, this rank among the writers (or readers)."""

    case: str
    engine: str
    capabilities: frozenset[str]
    rank: int = 0
    size: int = 1
    #: how many ranks write (on the readers' side too: who wrote which block)
    writers: int = 1
    timeout: float = 60.0

    def rng(self) -> np.random.Generator:
        """Random numbers seeded by the case's name: the writers' and the readers' are the same."""
        return np.random.default_rng(zlib.crc32(self.case.encode()))

    def owner(self, i: int) -> int:
        """The writer rank that writes the *i*-th block of a case."""
        return i % self.writers

    def mine(self, items: Sequence) -> list:
        """The items (blocks) this writer rank writes: every ``size``-th, from its rank."""
        return [x for i, x in enumerate(items) if self.owner(i) == self.rank]

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def steps(self, f: lamina.File) -> Iterator[lamina.StepView]:
        """Every step of *f*, in order, as a stream (ends when the writer closed the file)."""
        return f.iter_steps(timeout=self.timeout)

    def last(self, f: lamina.File) -> lamina.StepView:
        """The last step of *f* (after the writer closed it), taking the steps in order."""
        views = list(self.steps(f))  # views are light: the data is read when asked for
        assert views, f"{f.filename}: no step was committed"
        return views[-1]


class Case:
    """One round trip; subclasses define :meth:`write` and :meth:`read` and may take parameters."""

    #: capabilities the case needs (keys of CAPABILITIES)
    needs: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **params: Any) -> None:
        self.params = params

    @property
    def name(self) -> str:
        base = type(self).__name__
        if not self.params:
            return base
        return base + "[" + "-".join(_label(v) for v in self.params.values()) + "]"

    #: options for the writer's lamina.open (on top of the runner's)
    def options(self) -> dict[str, Any]:
        return {}

    def write(self, f: lamina.File, ctx: Context) -> None:
        raise NotImplementedError

    def read(self, f: lamina.File, ctx: Context) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


def _label(v: Any) -> str:
    if isinstance(v, dict):
        return ",".join(f"{k}={_label(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return "+".join(_label(x) for x in v)
    return str(v)


# --------------------------------------------------------------------------- helpers


def sample(dtype, shape, rng: np.random.Generator, nan: bool = False) -> np.ndarray:
    """Random data of *dtype* spanning its range (ints), with NaNs if asked (floats, complex)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind == "b":
        a = rng.random(n) < 0.5
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
        if n >= 2:
            a[0], a[-1] = info.min, info.max
    elif dt.kind == "f":
        a = (rng.standard_normal(n) * 100).astype(dt)
    else:
        a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    a = a.reshape(shape)
    if nan and dt.kind in "fc" and n:
        flat = a.reshape(-1)
        flat[rng.random(n) < 0.2] = np.nan
    return a


def expected_stats(a: np.ndarray) -> tuple:
    """NaN-aware (min, max, sum, count) the way lamina defines block statistics."""
    if a.dtype.kind == "c":
        mag = np.abs(a)
        ok = ~np.isnan(mag)
        if not ok.any():
            return None, None, 0j, 0
        return (
            float(mag[ok].min()),
            float(mag[ok].max()),
            complex(a[ok].sum(dtype=np.complex128)),
            int(ok.sum()),
        )
    if a.dtype.kind == "f":
        ok = ~np.isnan(a)
        if not ok.any():
            return None, None, 0.0, 0
        v = a[ok]
        return float(v.min()), float(v.max()), float(v.sum(dtype=np.float64)), int(ok.sum())
    v = a.astype(np.int64) if a.dtype.kind == "b" else a
    return int(v.min()), int(v.max()), float(a.sum(dtype=np.float64)), a.size


def check_stats(stats, a: np.ndarray) -> None:
    """Assert that block statistics *stats* describe the values *a*."""
    mn, mx, s, n = expected_stats(a)
    assert stats is not None, "the block has no statistics"
    assert stats.count == n, (stats, n)
    if n == 0:
        assert math.isnan(stats.min) and math.isnan(stats.max)
        return
    if a.dtype.kind in "biu":
        assert stats.min == mn and stats.max == mx, (stats, mn, mx)
        assert isinstance(stats.min, int) and isinstance(stats.max, int)
    else:
        assert math.isclose(stats.min, mn, rel_tol=1e-6) and math.isclose(
            stats.max, mx, rel_tol=1e-6
        ), (
            stats,
            mn,
            mx,
        )
    tol = 1e-6 * max(1.0, abs(s))
    if a.dtype == np.float32:  # float32's rounding (lamina.stats.F32_ROW): of sum |x|, not of s
        tol = max(tol, 16 * 2.0**-24 * float(np.abs(a[~np.isnan(a)]).sum(dtype=np.float64)))
    assert abs(complex(stats.sum) - complex(s)) <= max(tol, 1e-9 * abs(s)), (stats.sum, s)


def check_extents(f: lamina.File, what: str = "") -> None:
    """Assert that each committed step's record says of every subfile where the step's blocks
    end there, as the step's own block columns say (a native writer takes the end of a stream
    of blocks it stored back to back without a look at each block)."""
    from lamina.catalog.blocks import extents_of

    cat = f.engine.catalog  # (the layers hand on their engine's)
    for step, sb in enumerate(cat.steps):
        want = extents_of({d: cat.table(d, step) for d in sb.datasets()})
        assert sb.extents == want, f"{what} step {step}: extents {sb.extents}, blocks say {want}"


def put_blocks(ds: lamina.Dataset, a: np.ndarray, boxes: Sequence[Box], ctx: Context) -> None:
    """This rank's share of *boxes* of array *a* into dataset *ds* (the current step)."""
    for b in ctx.mine(boxes):
        ds.write(a[b.slices], offset=b.start)


def rows(n: int, parts: int, ncols: int | None = None) -> list[Box]:
    """*parts* slabs of rows of an (n, ncols) or (n,) array."""
    out = []
    for i in range(parts):
        lo, hi = n * i // parts, n * (i + 1) // parts
        out.append(Box((lo,), (hi,)) if ncols is None else Box((lo, 0), (hi, ncols)))
    return out


# --------------------------------------------------------------------------- dtypes, fill, blocks


class DtypesRoundTrip(Case):
    """Every dtype, three blocks, reads across block borders."""

    BOXES = (Box((0, 0), (4, 7)), Box((4, 0), (9, 3)), Box((4, 3), (9, 7)))

    def write(self, f, ctx):
        a = sample(self.params["dtype"], (9, 7), ctx.rng())
        ds = f.create_dataset("d", shape=(9, 7), dtype=self.params["dtype"])
        with f.step():
            put_blocks(ds, a, self.BOXES, ctx)

    def read(self, f, ctx):
        dtype = self.params["dtype"]
        a = sample(dtype, (9, 7), ctx.rng())
        ds = ctx.last(f)["d"]
        assert ds.dtype == np.dtype(dtype) and ds.shape == (9, 7)
        got = ds[...]
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, a)
        np.testing.assert_array_equal(ds[2:6, 1:5], a[2:6, 1:5])
        np.testing.assert_array_equal(ds[5], a[5])
        np.testing.assert_array_equal(ds[:, 3], a[:, 3])
        assert ds[8, 6] == a[8, 6]
        np.testing.assert_array_equal(np.asarray(ds), a)


class FillValues(Case):
    """Unwritten cells read as the fill value, in a step with blocks and in an empty step."""

    def write(self, f, ctx):
        dtype, fill = self.params["dtype"], self.params["fill"]
        ds = f.create_dataset("g/d", shape=(6, 5), dtype=dtype, fill=fill)
        expect = np.array(fill, dtype=dtype)[()]
        assert ds.fill == expect or np.isnan(ds.fill)
        with f.step():
            put_blocks(ds, np.ones((6, 5), dtype=dtype), [Box((1, 1), (3, 4))], ctx)
        with f.step():
            pass  # a step that writes nothing: everything reads as the fill

    def read(self, f, ctx):
        dtype, fill = self.params["dtype"], self.params["fill"]
        expect = np.full((6, 5), fill, dtype=dtype)
        expect[1:3, 1:4] = 1
        views = ctx.steps(f)
        v0 = next(views)
        np.testing.assert_array_equal(v0["g/d"][...], expect)
        np.testing.assert_array_equal(v0["g/d"][0], np.full(5, fill, dtype=dtype))
        assert v0["g/d"].coverage() == [Box((1, 1), (3, 4))]
        v1 = next(views)
        np.testing.assert_array_equal(v1["g/d"][...], np.full((6, 5), fill, dtype=dtype))
        assert v1["g/d"].coverage() == []
        assert next(views, None) is None


class CoverageAndBlocks(Case):
    """Block boxes, writer ranks, sizes and statistics as written; NaN fill outside the blocks."""

    BOXES = (Box((0, 0), (5, 4)), Box((5, 0), (10, 4)), Box((0, 4), (10, 6)), Box((3, 6), (4, 8)))

    def write(self, f, ctx):
        a = ctx.rng().standard_normal((10, 8))
        ds = f.create_dataset("x", shape=(10, 8), dtype="f8", fill=np.nan)
        with f.step():
            put_blocks(ds, a, self.BOXES, ctx)

    def read(self, f, ctx):
        a = ctx.rng().standard_normal((10, 8))
        ds = ctx.last(f)["x"]
        assert sorted(ds.coverage(), key=lambda b: b.start) == sorted(
            self.BOXES, key=lambda b: b.start
        )
        infos = ds.blocks()
        assert len(infos) == 4
        owner = {b: ctx.owner(i) for i, b in enumerate(self.BOXES)}
        for info in infos:
            assert isinstance(info, lamina.BlockInfo)
            assert info.raw_nbytes == info.box.size * 8
            assert info.nbytes == info.raw_nbytes and info.codec == "raw"
            assert info.rank == owner[info.box], (info.rank, owner[info.box])
            check_stats(info.stats, a[info.box.slices])
        got = ds[...]
        mask = np.zeros((10, 8), bool)
        for b in self.BOXES:
            mask[b.slices] = True
        np.testing.assert_array_equal(got[mask], a[mask])
        assert np.isnan(got[~mask]).all()


class BlockStats(Case):
    """Statistics of blocks with NaNs, all NaN, one value: NaN-aware, exact for integers."""

    def _blocks(self, ctx) -> dict[str, np.ndarray]:
        dtype = self.params["dtype"]
        rng = ctx.rng()
        return {
            "plain": sample(dtype, (20, 3), rng),
            "nan": sample(dtype, (20, 3), rng, nan=True),
            "allnan": np.full((20, 3), np.nan, dtype=dtype)
            if np.dtype(dtype).kind in "fc"
            else sample(dtype, (20, 3), rng),
            "one": sample(dtype, (1, 3), rng)[:1, :1].repeat(3, axis=1),
        }

    def write(self, f, ctx):
        blocks = self._blocks(ctx)
        a = np.concatenate([blocks[k] for k in ("plain", "nan", "allnan", "one")])
        ds = f.create_dataset("s", shape=(61, 3), dtype=self.params["dtype"])
        with f.step():
            put_blocks(
                ds,
                a,
                [
                    Box((0, 0), (20, 3)),
                    Box((20, 0), (40, 3)),
                    Box((40, 0), (60, 3)),
                    Box((60, 0), (61, 3)),
                ],
                ctx,
            )

    def read(self, f, ctx):
        blocks = self._blocks(ctx)
        ds = ctx.last(f)["s"]
        by_start = {b.box.start[0]: b for b in ds.blocks()}
        check_stats(by_start[0].stats, blocks["plain"])
        check_stats(by_start[20].stats, blocks["nan"])
        check_stats(by_start[40].stats, blocks["allnan"])
        check_stats(by_start[60].stats, blocks["one"])
        got = ds[...]
        np.testing.assert_array_equal(got[20:40], blocks["nan"])  # NaN == NaN here


class ComplexStatsAreMagnitudes(Case):
    def write(self, f, ctx):
        z = np.array([3 + 4j, -1 + 0j, 0 - 2j, np.nan + 1j], dtype="c16")
        ds = f.create_dataset("z", shape=(4,), dtype="c16")
        with f.step():
            put_blocks(ds, z, [Box((0,), (4,))], ctx)

    def read(self, f, ctx):
        st = ctx.last(f)["z"].blocks()[0].stats
        assert st.min == 1.0 and st.max == 5.0 and st.count == 3
        assert abs(st.sum - (2 + 2j)) < 1e-12


class ByteOrder(Case):
    """Big-endian datasets keep their byte order; data of another order is converted on the way in."""

    def write(self, f, ctx):
        a = np.arange(24, dtype=">i4").reshape(4, 6)
        be = f.create_dataset(
            "be", shape=(4, 6), dtype=">i4", compression=self.params["compression"], fill=-2
        )
        le = f.create_dataset("le", shape=(4, 6), dtype="<f8")
        with f.step():
            put_blocks(be, a, [Box((0, 0), (2, 6))], ctx)
            put_blocks(le, a.astype(">f8"), rows(4, 2, 6), ctx)

    def read(self, f, ctx):
        a = np.arange(24, dtype=">i4").reshape(4, 6)
        v = ctx.last(f)
        got = v["be"][...]
        assert got.dtype == np.dtype(">i4")
        np.testing.assert_array_equal(got[:2], a[:2])
        np.testing.assert_array_equal(got[2:], -2)
        np.testing.assert_array_equal(v["le"][...], a)
        assert v["le"].dtype == np.dtype("<f8")
        st = v["be"].blocks()[0].stats
        assert (st.min, st.max, st.count) == (0, 11, 12)


# --------------------------------------------------------------------------- attributes and groups

ATTRS: dict[str, Any] = {
    "s": "text ✓",
    "ls": ["a", "b"],
    "i": 42,
    "f": 2.5,
    "c": 1 + 2j,
    "b": True,
    "arr": np.arange(6, dtype="i2").reshape(2, 3),
    "f32": np.float32(0.5),
    "u64": np.uint64(2**64 - 1),
}


class AttributesEverywhere(Case):
    def write(self, f, ctx):
        g = f.create_group("grp/sub")
        ds = g.create_dataset("d", shape=(2,), dtype="f4")
        for obj in (f, g, ds):
            for k, v in ATTRS.items():
                obj.attrs[k] = v
        f.attrs["gone"] = 1
        del f.attrs["gone"]
        ds.attrs["i"] = 43  # overwrite
        assert f.attrs["s"] == "text ✓" and ds.attrs["i"] == 43  # visible to the writer at once
        with f.step():
            pass

    def read(self, f, ctx):
        ctx.last(f)
        for obj in (f, f["grp/sub"], f["grp/sub/d"]):
            a = obj.attrs
            assert sorted(a) == sorted(ATTRS)
            assert len(a) == len(ATTRS)
            assert a["s"] == "text ✓" and isinstance(a["s"], str)
            assert (
                a["ls"].tolist() == ["a", "b"] and a["ls"].dtype == object
            )  # an array, as h5py gives
            assert a["f"] == 2.5 and a["c"] == 1 + 2j and a["b"]
            np.testing.assert_array_equal(a["arr"], ATTRS["arr"])
            assert a["arr"].dtype == np.dtype("i2")
            assert a["f32"] == np.float32(0.5) and a["f32"].dtype == np.float32
            assert a["u64"] == np.uint64(2**64 - 1)
            assert np.isscalar(a["i"])
            assert "gone" not in a
            assert "Attributes" in repr(a)
        assert f.attrs["i"] == 42 and f["grp/sub/d"].attrs["i"] == 43


class GroupsAndNavigation(Case):
    def write(self, f, ctx):
        a = f.create_group("a")
        b = a.create_group("b/c")  # parents created
        assert b.name == "/a/b/c"
        ds = b.create_dataset("data", shape=(3,), dtype="i4")
        assert ds.name == "/a/b/c/data"
        f.create_dataset("/top", shape=(1,))  # absolute from the root
        a.create_dataset("/a/x", shape=(1,))
        assert f.require_group("a/b").name == "/a/b"
        assert f.require_group("new").name == "/new"
        with f.step():
            put_blocks(ds, np.array([1, 2, 3], dtype="i4"), [Box((0,), (3,))], ctx)

    def read(self, f, ctx):
        v = ctx.last(f)
        assert list(f.keys()) == ["a", "new", "top"]
        assert list(f) == ["a", "new", "top"] and len(f) == 3
        assert list(f["a"].keys()) == ["b", "x"]
        assert isinstance(f["a"], lamina.Group) and isinstance(f["a/b/c/data"], lamina.Dataset)
        assert f["a"]["b/c"]["data"].name == "/a/b/c/data"
        assert f["a/b"]["/top"].name == "/top"
        assert "a/b/c" in f and "/a/b/c/data" in f and "b/c" in f["a"] and "zz" not in f
        assert "a/../b" not in f  # invalid names are simply not there
        np.testing.assert_array_equal(v["a/b/c/data"][...], [1, 2, 3])
        walked = [p for p, _ in f.walk()]
        assert walked == ["/a", "/a/b", "/a/b/c", "/a/b/c/data", "/a/x", "/new", "/top"]
        assert [k for k, _ in f["a"].items()] == ["b", "x"]
        assert len(f["a"].values()) == 2
        assert f.name == "/" and f.file is f and f["a"].file is f
        assert "lamina.Group" in repr(f["a"]) and "lamina.Dataset" in repr(f["top"])
        assert ctx.engine in repr(f)


class DatasetProperties(Case):
    def write(self, f, ctx):
        ds = f.create_dataset("p", shape=(4, 5), dtype="u2", fill=3, compression="zstd")
        assert ds.shape == (4, 5) and ds.ndim == 2 and ds.size == 20 and len(ds) == 4
        assert ds.dtype == np.dtype("u2") and ds.fill == 3
        if ctx.has("stored_codecs"):
            assert ds.compression == ({"id": "zstd"},)
        assert ds.step is None
        s = f.create_dataset("scalar", shape=())
        try:
            len(s)
        except TypeError:
            pass
        else:
            raise AssertionError("len() of a 0-D dataset did not raise TypeError")
        d1 = f.create_dataset("one", shape=7)  # an int shape is 1-D
        assert d1.shape == (7,)
        assert f.mode == "w" and f.engine.name == ctx.engine
        with f.step():
            pass

    def read(self, f, ctx):
        ctx.last(f)
        ds = f["p"]
        assert ds.shape == (4, 5) and ds.dtype == np.dtype("u2") and ds.fill == 3
        assert f["scalar"].shape == () and f["one"].shape == (7,)
        assert f.mode == "r" and f.engine.name == ctx.engine


# --------------------------------------------------------------------------- steps


class ManySteps(Case):
    """Forty steps; each step's view reads that step."""

    N = 40

    def write(self, f, ctx):
        ds = f.create_dataset("v", shape=(3, 4), dtype="i8")
        for k in range(self.N):
            with f.step() as idx:
                assert idx == k
                put_blocks(ds, np.full((3, 4), k), rows(3, 2, 4), ctx)
            assert f.steps == k + 1
            if ctx.has("writer_reads"):
                assert ds[0, 0] == k  # the writer reads its latest committed step

    def read(self, f, ctx):
        times = []
        for k, view in enumerate(ctx.steps(f)):
            assert view.index == k and view.step == k
            assert np.all(view["v"][...] == k)
            assert view["v"].step == k
            assert f["v"].read(step=k)[1, 1] == k
            assert len(f["v"].blocks(step=k)) == 2
            g = view["/"]  # a group reached through a step view reads that step
            assert np.all(g["v"][...] == k)
            assert f"step {k}" in repr(view)
            times.append(view.time)
        assert len(times) == self.N
        assert times == sorted(times) and times[0] > 1e9


class ManyStepsRandomAccess(Case):
    """Steps read out of order, by negative index, again and again."""

    needs = frozenset({"random_access"})
    N = 40

    def write(self, f, ctx):
        ds = f.create_dataset("v", shape=(3, 4), dtype="i8")
        for k in range(self.N):
            with f.step():
                put_blocks(ds, np.full((3, 4), k), [Box((0, 0), (3, 4))], ctx)

    def read(self, f, ctx):
        n = self.N
        ctx.last(f)
        assert f.steps == n
        for k in (0, 1, 17, n - 1, -1, -n):
            view = f.at(k)
            kk = k % n
            assert view.index == kk and view.step == kk
            assert np.all(view["v"][...] == kk)
            assert f["v"].read(step=k)[1, 1] == kk
            assert len(f["v"].blocks(step=k)) == 1
        g = f.at(3)["/"]
        assert np.all(g["v"][...] == 3)


class ImplicitStepCommittedAtClose(Case):
    def write(self, f, ctx):
        ds = f.create_dataset("x", shape=(4,), dtype="f8")
        put_blocks(ds, np.array([1.0, 1.0, 2.0, 2.0]), [Box((0,), (2,)), Box((2,), (4,))], ctx)
        assert f.engine.in_step == bool(ctx.mine([0, 1])) and f.steps == 0

    def read(self, f, ctx):
        v = ctx.last(f)
        assert f.steps == 1
        np.testing.assert_array_equal(v["x"][...], [1, 1, 2, 2])


class ImplicitStepEndedExplicitly(Case):
    def write(self, f, ctx):
        ds = f.create_dataset("x", shape=(2,), dtype="f8", data=[5.0, 6.0])
        f.end_step()
        assert f.steps == 1
        with f.step():
            put_blocks(ds, np.full(2, 7.0), [Box((0,), (2,))], ctx)

    def read(self, f, ctx):
        views = ctx.steps(f)
        np.testing.assert_array_equal(next(views)["x"][...], [5, 6])
        np.testing.assert_array_equal(next(views)["x"][...], [7, 7])
        assert next(views, None) is None


class BeginEndStepCalls(Case):
    def write(self, f, ctx):
        ds = f.create_dataset("x", shape=(2,), dtype="i2")
        assert f.begin_step() == 0
        put_blocks(ds, np.array([1, 2], dtype="i2"), [Box((0,), (2,))], ctx)
        f.end_step()
        assert f.begin_step() == 1
        put_blocks(ds, np.array([9], dtype="i2"), [Box((0,), (1,))], ctx)
        f.end_step()

    def read(self, f, ctx):
        np.testing.assert_array_equal(ctx.last(f)["x"][...], [9, 0])


class AppendMode(Case):
    """A second session appends steps and metadata; a third changes metadata only."""

    needs = frozenset({"reopen", "random_access"})

    def write(self, f, ctx):
        ds = f.create_dataset("x", shape=(3,), dtype="f8")
        f.attrs["run"] = "first"
        for k in range(2):
            with f.step():
                put_blocks(ds, np.full(3, float(k)), [Box((0,), (3,))], ctx)
        path, comm = f.filename, f.comm
        f.close()
        with lamina.open(path, "a", comm=comm, engine=ctx.engine) as g:
            assert g.steps == 2 and g.attrs["run"] == "first"
            if ctx.has("writer_reads"):
                np.testing.assert_array_equal(g["x"][...], 1.0)  # reads what was there
            y = g.create_dataset("y", shape=(2,), dtype="i4")
            g.attrs["run"] = "second"
            with g.step() as k:
                assert k == 2
                put_blocks(g["x"], np.full(3, 2.0), [Box((0,), (3,))], ctx)
                put_blocks(y, np.array([3, 4], dtype="i4"), [Box((0,), (2,))], ctx)
        with lamina.open(path, "a", comm=comm, engine=ctx.engine) as g:
            g.attrs["meta-only"] = 1  # a change with no step

    def read(self, f, ctx):
        assert f.steps == 3
        for k in range(3):
            np.testing.assert_array_equal(f.at(k)["x"][...], float(k))
        np.testing.assert_array_equal(f.at(0)["y"][...], 0)  # defined later: fill before
        np.testing.assert_array_equal(f["y"][...], [3, 4])
        assert f.attrs["run"] == "second" and f.attrs["meta-only"] == 1
        subfiles = {b.subfile for k in range(3) for b in f["x"].blocks(k)}
        if ctx.engine == "native":
            assert {s.split(".")[1] for s in subfiles} == {"0", "1"}  # two writer sessions


class AppendCreatesMissingFile(Case):
    needs = frozenset({"reopen"})

    def write(self, f, ctx):
        path, comm = f.filename, f.comm
        f.close()
        # 'a' on a file that a killed writer left empty-handed, or none: a new file
        with lamina.open(path + "-new", "a", comm=comm, engine=ctx.engine) as g:
            put_blocks(g.create_dataset("x", shape=(1,)), np.ones(1), [Box((0,), (1,))], ctx)

    def read(self, f, ctx):
        with lamina.open(f.filename + "-new", "r", comm=f.comm, engine=ctx.engine) as g:
            assert g["x"][0] == 1.0


class WriteModeTruncates(Case):
    needs = frozenset({"reopen"})

    def write(self, f, ctx):
        ds = f.create_dataset("fields/T", shape=(8, 6), dtype="f8")
        f.attrs["title"] = "simple"
        for k in range(3):
            with f.step():
                put_blocks(ds, np.full((8, 6), float(k)), rows(8, 2, 6), ctx)
        path, comm = f.filename, f.comm
        f.close()
        with lamina.open(path, "w", comm=comm, engine=ctx.engine) as g:
            assert g.steps == 0 and "fields" not in g and len(g.attrs) == 0
            g.create_dataset("other", shape=(1,))

    def read(self, f, ctx):
        assert list(f.keys()) == ["other"] and f.steps == 0


# --------------------------------------------------------------------------- compression


class LosslessCompression(Case):
    def write(self, f, ctx):
        compression, dtype = self.params["compression"], self.params["dtype"]
        compressible, noise = self._data(ctx)
        c = f.create_dataset("c", shape=(32, 20), dtype=dtype, compression=compression)
        n = f.create_dataset("n", shape=(32, 20), dtype=dtype, compression=compression)
        with f.step():
            put_blocks(c, compressible, rows(32, 2, 20), ctx)
            put_blocks(n, noise, [Box((0, 0), (32, 20))], ctx)

    def _data(self, ctx):
        dtype = self.params["dtype"]
        rng = ctx.rng()
        compressible = np.repeat(sample(dtype, (32, 1), rng), 20, axis=1)  # rows of one value
        noise = sample(dtype, (32, 20), rng)  # may not compress: stored raw
        return compressible, noise

    def read(self, f, ctx):
        compressible, noise = self._data(ctx)
        v = ctx.last(f)
        np.testing.assert_array_equal(v["c"][...], compressible)
        np.testing.assert_array_equal(v["c"][3:20, 5:9], compressible[3:20, 5:9])
        np.testing.assert_array_equal(v["n"][...], noise)
        infos = v["c"].blocks()
        if ctx.has("stored_codecs"):
            assert all(b.codec != "raw" and b.nbytes < b.raw_nbytes for b in infos)
        for b in infos:
            check_stats(b.stats, compressible[b.box.slices])
        assert all(b.nbytes <= b.raw_nbytes for b in v["n"].blocks())


class ZfpTolerance(Case):
    def _data(self, ctx):
        dtype = self.params["dtype"]
        x, y = np.meshgrid(np.linspace(0, 4, 40), np.linspace(0, 4, 33), indexing="ij")
        return (np.sin(x) * np.cos(y) * 10 + ctx.rng().standard_normal((40, 33)) * 0.01).astype(
            dtype
        )

    def write(self, f, ctx):
        dtype, tol = self.params["dtype"], self.params["tol"]
        a = self._data(ctx)
        ds = f.create_dataset("z", shape=a.shape, dtype=dtype, compression=("zfp", tol))
        if ctx.has("stored_codecs"):
            assert ds.compression[0]["tolerance"] == tol
        with f.step():
            put_blocks(ds, a, rows(40, 2, 33), ctx)

    def read(self, f, ctx):
        dtype, tol = self.params["dtype"], self.params["tol"]
        a = self._data(ctx)
        ds = ctx.last(f)["z"]
        got = ds[...]
        assert got.dtype == np.dtype(dtype)
        err = np.max(np.abs(got.astype("f8") - a.astype("f8")))
        assert err <= tol, (err, tol)
        part = ds[10:30, 7:20]
        assert np.max(np.abs(part.astype("f8") - a[10:30, 7:20].astype("f8"))) <= tol
        for b in ds.blocks():  # statistics of the values read: decoded, where zfp stored them
            check_stats(b.stats, got[b.box.slices])
        if tol >= 1e-3 and ctx.has("stored_codecs"):
            assert all(b.codec == "zfpy" and b.nbytes < b.raw_nbytes for b in ds.blocks())


class ZfpNanAndInfStoredExactly(Case):
    """zfp would turn NaN and inf into finite numbers; such blocks are kept raw instead."""

    def _data(self):
        a = np.sin(np.linspace(0, 3, 24 * 16).reshape(24, 16)) * 5
        a[10, 3] = np.nan
        a[20, 7] = -np.inf
        return a

    def write(self, f, ctx):
        a = self._data()
        ds = f.create_dataset("z", shape=a.shape, dtype="f8", compression=("zfp", 1e-4))
        with f.step():
            put_blocks(ds, a, rows(24, 3, 16), ctx)

    def read(self, f, ctx):
        a = self._data()
        ds = ctx.last(f)["z"]
        got = ds[...]
        if ctx.has("stored_codecs"):
            codec = {b.box.start[0]: b.codec for b in ds.blocks()}
            assert codec == {0: "zfpy", 8: "raw", 16: "raw"}, codec
        assert np.max(np.abs(got[:8] - a[:8])) <= 1e-4
        np.testing.assert_array_equal(got[8:], a[8:])  # exact, NaN and -inf included


class ZfpModes(Case):
    def write(self, f, ctx):
        a = np.linspace(0, 1, 64 * 64).reshape(64, 64)
        ds = f.create_dataset("z", shape=a.shape, dtype="f8", compression=self.params["spec"])
        with f.step():
            put_blocks(ds, a, [Box((0, 0), (64, 64))], ctx)

    def read(self, f, ctx):
        a = np.linspace(0, 1, 64 * 64).reshape(64, 64)
        ds = ctx.last(f)["z"]
        b = ds.blocks()[0]
        got = ds[...]
        mode = self.params["spec"]
        if "rate" in mode:
            if ctx.has("stored_codecs"):
                assert b.nbytes <= a.size + 64  # 8 bits per value (plus a small header)
            assert np.max(np.abs(got - a)) < 0.05
        elif "precision" in mode:
            if ctx.has("stored_codecs"):
                assert b.nbytes < a.nbytes
            assert np.max(np.abs(got - a)) < 1e-2
        else:
            assert np.max(np.abs(got - a)) <= 0.01


# --------------------------------------------------------------------------- shapes


class ZeroDimDataset(Case):
    def write(self, f, ctx):
        dtype = self.params["dtype"]
        s = f.create_dataset("s", shape=(), dtype=dtype, fill=1)
        assert s.shape == () and s.ndim == 0 and s.size == 1
        with f.step():
            put_blocks(s, np.zeros((), dtype=dtype), [Box((), ())], ctx)
        with f.step():
            pass
        with f.step():
            put_blocks(s, np.array(1, dtype=dtype), [Box((), ())], ctx)

    def read(self, f, ctx):
        views = ctx.steps(f)
        v0 = next(views)
        assert v0["s"][()] == 0 and v0["s"].coverage() == [Box((), ())]
        v1 = next(views)
        assert v1["s"][()] == 1 and v1["s"].coverage() == []  # the fill
        s = next(views)["s"]
        assert s[()] == 1 and s[...] == 1
        assert s.coverage() == [Box((), ())]
        assert s.blocks()[0].stats.count == 1
        assert s.read().shape == ()
        if ctx.has("random_access"):
            for _ in range(3):  # alternate between steps: each read must really fill its buffer
                assert f.at(0)["s"][()] == 0 and f.at(2)["s"][()] == 1 and f.at(1)["s"][()] == 1


class ZeroDimManySteps(Case):
    def write(self, f, ctx):
        s = f.create_dataset("s", shape=(), dtype="f8", fill=-1, compression="zstd")
        for k in range(6):
            with f.step():
                if k % 3:
                    put_blocks(s, np.array(k * 1.5), [Box((), ())], ctx)

    def read(self, f, ctx):
        seen = 0
        for k, view in enumerate(ctx.steps(f)):
            assert view["s"][()] == (k * 1.5 if k % 3 else -1.0)
            assert view["s"].read().item() == (k * 1.5 if k % 3 else -1.0)
            seen += 1
        assert seen == 6


class EmptyBoxesAndZeroSizeDatasets(Case):
    def write(self, f, ctx):
        ds = f.create_dataset("d", shape=(4, 3), dtype="f8")
        z = f.create_dataset("z", shape=(0, 5), dtype="i4")
        with f.step():
            ds[2:2] = np.empty((0, 3))
            ds[:, 1:1] = 5.0
            ds.write(np.empty((0, 0)), offset=(4, 3))  # empty box at the far corner
            put_blocks(ds, np.ones((4, 3)), [Box((0, 0), (2, 3))], ctx)
            ds[1:1, 0:3] = np.empty((0, 3))  # empty inside a written box: no overlap
            z[...] = np.empty((0, 5), dtype="i4")

    def read(self, f, ctx):
        v = ctx.last(f)
        ds = v["d"]
        assert ds.coverage() == [Box((0, 0), (2, 3))]
        assert ds[3:3].shape == (0, 3)
        assert ds[:, 2:2].shape == (4, 0)
        assert ds[4:].shape == (0, 3)
        np.testing.assert_array_equal(ds[...], [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]])
        assert v["z"][...].shape == (0, 5) and v["z"].coverage() == []


class StridedReads(Case):
    def write(self, f, ctx):
        a = ctx.rng().standard_normal((11, 9, 4))
        ds = f.create_dataset("a", shape=a.shape, dtype="f8")
        with f.step():
            put_blocks(ds, a, [Box((0, 0, 0), (5, 9, 4)), Box((5, 0, 0), (11, 9, 4))], ctx)

    def read(self, f, ctx):
        a = ctx.rng().standard_normal((11, 9, 4))
        ds = ctx.last(f)["a"]
        for key in [
            (slice(None, None, 2), slice(1, 5)),
            (slice(1, None, 3), Ellipsis, 2),
            (slice(None, None, 4), slice(None, None, 4), slice(None, None, 4)),
            (Ellipsis, slice(0, 4, 3)),
            (3, slice(None, None, 2)),
            (slice(2, 9, 5), slice(8, 0)),
        ]:
            np.testing.assert_array_equal(ds[key], a[key])


class RandomBoxes(Case):
    """Seeded random decompositions, some parts left unwritten, random strided selections read back."""

    def _plan(self, ctx):
        rng = ctx.rng()
        shape = tuple(int(n) for n in rng.integers(1, 8, size=int(rng.integers(1, 4))))
        nparts = int(rng.integers(1, 7))
        parts = decompose(shape, nparts)
        keep = [bool(k) for k in rng.random(len(parts)) < 0.7]
        model = np.full(shape, -1, dtype="i8")
        written = []
        for b, k in zip(parts, keep, strict=True):
            if k:
                model[b.slices] = np.arange(b.size, dtype="i8").reshape(b.shape) + 100 * (
                    b.start[0] if b.ndim else 0
                )
                written.append(b)
        keys = []
        for _ in range(3):
            key = []
            for n in shape:
                a = int(rng.integers(0, n + 1))
                key.append(slice(a, int(rng.integers(a, n + 1)), int(rng.integers(1, 4))))
            keys.append(tuple(key))
        return shape, written, model, keys

    def write(self, f, ctx):
        shape, written, model, _ = self._plan(ctx)
        ds = f.create_dataset("r", shape=shape, dtype="i8", fill=-1)
        with f.step():
            put_blocks(ds, model, written, ctx)

    def read(self, f, ctx):
        shape, written, model, keys = self._plan(ctx)
        ds = ctx.last(f)["r"]
        np.testing.assert_array_equal(ds[...], model)
        for key in keys:
            np.testing.assert_array_equal(ds[key], model[key])
        assert sum(b.size for b in ds.coverage()) == sum(b.size for b in written)


# --------------------------------------------------------------------------- buffers


class ReadIntoBuffer(Case):
    def write(self, f, ctx):
        a = ctx.rng().standard_normal((6, 6))
        ds = f.create_dataset("a", shape=(6, 6), dtype="f8")
        with f.step():
            put_blocks(ds, a, rows(6, 3, 6), ctx)

    def read(self, f, ctx):
        a = ctx.rng().standard_normal((6, 6))
        ds = ctx.last(f)["a"]
        out = np.empty((2, 3))
        got = ds.read(Box((1, 2), (3, 5)), out=out)
        assert got is out
        np.testing.assert_array_equal(out, a[1:3, 2:5])
        try:
            ds.read(Box((1, 2), (3, 5)), out=np.empty((2, 3), dtype="f4"))
        except lamina.ShapeError as e:
            assert "output buffer" in str(e)
        else:
            raise AssertionError("a buffer of the wrong dtype was accepted")


class CopySemantics(Case):
    def write(self, f, ctx):
        ds = f.create_dataset("a", shape=(4,), dtype="f8")
        with f.step():
            if ctx.owner(0) == ctx.rank:
                buf = np.ones(2)
                ds[:2] = buf
                buf[:] = 99.0  # the default copies: changing the buffer after the put is safe
            if ctx.owner(1) == ctx.rank:
                ds.write(np.full(2, 3.0), offset=(2,), copy=False)

    def read(self, f, ctx):
        np.testing.assert_array_equal(ctx.last(f)["a"][...], [1, 1, 3, 3])


class NonContiguousAndBroadcastInputs(Case):
    def write(self, f, ctx):
        base = np.arange(48.0).reshape(6, 8)
        ds = f.create_dataset("a", shape=(4, 3), dtype="f8")
        with f.step():
            if ctx.owner(0) == ctx.rank:
                ds[:2] = base[:4:2, ::3]  # strided view
            if ctx.owner(1) == ctx.rank:
                ds[2:] = np.asfortranarray(base[:2, :3])  # Fortran order
        with f.step():
            if ctx.owner(0) == ctx.rank:
                ds[...] = [1.0, 2.0, 3.0]  # broadcast a row

    def read(self, f, ctx):
        base = np.arange(48.0).reshape(6, 8)
        views = ctx.steps(f)
        v0 = next(views)
        np.testing.assert_array_equal(v0["a"][:2], base[:4:2, ::3])
        np.testing.assert_array_equal(v0["a"][2:], base[:2, :3])
        v1 = next(views)
        np.testing.assert_array_equal(v1["a"][...], np.tile([1.0, 2.0, 3.0], (4, 1)))


class LargeBlock(Case):
    """A block bigger than the statistics chunk and than one checksum segment."""

    N = 3 * CHUNK // 8 + 123  # not a multiple of the chunk

    def options(self):
        return {"checksum_segment": CHUNK}

    def _data(self, ctx):
        a = ctx.rng().standard_normal(self.N)
        a[self.N // 2] = np.nan
        return a

    def write(self, f, ctx):
        ds = f.create_dataset("big", shape=(self.N,), dtype="f8")
        with f.step():
            put_blocks(ds, self._data(ctx), [Box((0,), (self.N,))], ctx)

    def read(self, f, ctx):
        a, n = self._data(ctx), self.N
        ds = ctx.last(f)["big"]
        check_stats(ds.blocks()[0].stats, a)
        np.testing.assert_array_equal(ds[...], a)
        for lo, hi in [
            (0, 10),
            (CHUNK // 8 - 5, CHUNK // 8 + 5),
            (n - 7, n),
            (1000, 2 * CHUNK // 8 + 77),
        ]:
            np.testing.assert_array_equal(ds[lo:hi], a[lo:hi])


class CommonOptions(Case):
    def options(self):
        return dict(self.params["options"])

    def write(self, f, ctx):
        a = ctx.rng().standard_normal((70, 1000))
        ds = f.create_dataset("a", shape=a.shape, dtype="f8")
        with f.step():
            put_blocks(ds, a, [Box((0, 0), (70, 1000))], ctx)

    def read(self, f, ctx):
        a = ctx.rng().standard_normal((70, 1000))
        ds = ctx.last(f)["a"]
        np.testing.assert_array_equal(ds[...], a)
        np.testing.assert_array_equal(ds[30:40, 999], a[30:40, 999])
        check_stats(ds.blocks()[0].stats, a)


class ManyRanksBlocks(Case):
    """Each writer rank writes blocks of a 3-D field along every axis; readers read slabs across them."""

    SHAPE = (12, 10, 8)

    def _boxes(self, ctx):
        return decompose(self.SHAPE, 6)

    def write(self, f, ctx):
        a = ctx.rng().standard_normal(self.SHAPE)
        ds = f.create_dataset("u", shape=self.SHAPE, dtype="f8")
        for k in range(2):
            with f.step():
                put_blocks(ds, a + k, self._boxes(ctx), ctx)

    def read(self, f, ctx):
        a = ctx.rng().standard_normal(self.SHAPE)
        for k, view in enumerate(ctx.steps(f)):
            ds = view["u"]
            np.testing.assert_array_equal(ds[...], a + k)
            np.testing.assert_array_equal(ds[:, 3, :], a[:, 3, :] + k)
            np.testing.assert_array_equal(ds[5:9, 2:9, 1:7], a[5:9, 2:9, 1:7] + k)
            assert {b.rank for b in ds.blocks()} == {ctx.owner(i) for i in range(6)}


class WriteBlocks(Case):
    """Many blocks per call (``Dataset.write_blocks``): stacked, as a list of shapes, cast,
    compressed or large, mixed with single writes; every block's statistics are its own."""

    SHAPE = (24, 20, 18)
    EDGE = (2, 2, 3)  # 12 x 10 x 6 = 720 blocks: a writer's share is a large batch

    def _grid(self) -> np.ndarray:
        e = np.array(self.EDGE)
        counts = [n // k for n, k in zip(self.SHAPE, self.EDGE, strict=True)]
        idx = np.stack(np.meshgrid(*map(np.arange, counts), indexing="ij"), axis=-1)
        return idx.reshape(-1, 3) * e

    def options(self):
        form = self.params["form"]
        return {"checksum_segment": CHUNK} if form == "large" else {}

    def _data(self, ctx) -> np.ndarray:
        return ctx.rng().standard_normal(self.SHAPE).astype("f4")

    def write(self, f, ctx):
        form = self.params["form"]
        a = self._data(ctx)
        kw = {"compression": "zstd"} if form == "compressed" else {}
        ds = f.create_dataset("u", shape=self.SHAPE, dtype="f4", **kw)
        big = f.create_dataset("big", shape=(4, CHUNK // 4 + 9), dtype="f4")
        corners = np.array(ctx.mine(list(self._grid())), dtype=np.int64).reshape(-1, 3)
        ex, ey, ez = self.EDGE
        stacked = np.stack([a[x : x + ex, y : y + ey, z : z + ez] for x, y, z in corners])
        if not len(stacked):
            stacked = np.zeros((0, *self.EDGE), dtype="f4")
        with f.step():
            if form == "list":  # a list of arrays of different shapes: pairs of blocks merged
                pairs = [c for c in corners if c[2] in (0, 2 * ez)]  # z in [0, 4 ez): merged
                rest = [c for c in corners if c[2] >= 4 * ez]  # the last two, single
                blocks = [a[x : x + ex, y : y + ey, z : z + 2 * ez] for x, y, z in pairs]
                blocks += [a[x : x + ex, y : y + ey, z : z + ez] for x, y, z in rest]
                ds.write_blocks(blocks, np.array(pairs + rest, dtype=np.int64).reshape(-1, 3))
            elif form == "cast":  # float64 blocks into a float32 dataset, lent without a copy
                ds.write_blocks(stacked.astype("f8"), corners, copy=False)
            elif form == "mixed":  # single writes, then two batches, in one step
                half = len(corners) // 2
                for k in range(min(5, half)):
                    ds.write(stacked[k], offset=corners[k])
                lo = min(5, half)
                ds.write_blocks(stacked[lo:half], corners[lo:half])
                ds.write_blocks(stacked[half:], corners[half:])
            elif form == "large":  # blocks bigger than the staging limit, each a row
                rows = [r for r in range(4) if ctx.owner(r) == ctx.rank]
                b = self._big(ctx)
                big.write_blocks(
                    b[rows][:, None, :], np.array([[r, 0] for r in rows]).reshape(-1, 2)
                )
                ds.write_blocks(stacked, corners)
            else:
                ds.write_blocks(stacked, corners)

    def _big(self, ctx) -> np.ndarray:
        return ctx.rng().standard_normal((4, CHUNK // 4 + 9)).astype("f4")

    def read(self, f, ctx):
        form = self.params["form"]
        a = self._data(ctx)
        ds = ctx.last(f)["u"]
        np.testing.assert_array_equal(ds[...], a)
        np.testing.assert_array_equal(ds[3:17, 1:19, 4:11], a[3:17, 1:19, 4:11])
        blocks = ds.blocks()
        assert sum(b.box.size for b in blocks) == a.size
        if form != "list":
            assert len(blocks) == len(self._grid())
        for b in blocks[:: max(1, len(blocks) // 7)]:
            check_stats(b.stats, a[b.box.slices])
        assert {b.rank for b in blocks} <= set(range(ctx.writers))
        if form == "large":
            big = ctx.last(f)["big"]
            np.testing.assert_array_equal(big[...], self._big(ctx))
            for b in big.blocks():
                check_stats(b.stats, self._big(ctx)[b.box.slices])


class WriteBlocksRefused(Case):
    """A bad batch raises before any of its blocks is stored: the step holds the others."""

    def write(self, f, ctx):
        ds = f.create_dataset("v", shape=(8, 8), dtype="i4")
        with f.step():
            if ctx.rank == 0:
                ds.write_blocks(np.ones((2, 2, 2), "i4"), [[0, 0], [2, 0]])
                bad = [
                    (np.ones((2, 2, 2), "i4"), [[4, 0], [7, 0]], lamina.BoundsError),
                    (np.ones((2, 2, 2), "i4"), [[4, 0], [0, 1]], lamina.OverlapError),
                    (np.ones((2, 2, 2), "i4"), [[4, 0], [5, 0]], lamina.OverlapError),
                    (np.ones((2, 2, 2), "c8"), [[4, 0], [6, 0]], lamina.DTypeError),
                    (np.ones((2, 2, 2), "i4"), [[4, 0]], lamina.ShapeError),
                    (np.ones((2, 2, 2), "i4"), [[4.0, 0.0], [6.0, 0.0]], TypeError),
                    (
                        [np.ones((2, 2), "i4"), np.ones(3, "i4")],
                        [[4, 0], [6, 0]],
                        lamina.ShapeError,
                    ),
                ]
                for blocks, offsets, err in bad:
                    try:
                        ds.write_blocks(blocks, offsets)
                    except err as e:
                        assert "'v'" in str(e) or "/v" in str(e), e
                    else:
                        raise AssertionError(f"{offsets} was accepted")
                ds.write_blocks(np.full((2, 2, 2), 5, "i4"), [[4, 0], [6, 0]])

    def read(self, f, ctx):
        got = ctx.last(f)["v"][...]
        want = np.zeros((8, 8), "i4")
        want[:4, :2] = 1
        want[4:, :2] = 5
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- the list


def all_cases() -> list[Case]:
    """Every case, in the order a writer and a reader program run them."""
    out: list[Case] = []
    out += [DtypesRoundTrip(dtype=d) for d in ALL_DTYPES]
    out += [
        FillValues(dtype=d, fill=v)
        for d, v in [
            ("f8", 0),
            ("f8", -1.5),
            ("f4", np.nan),
            ("i4", -7),
            ("u2", 65535),
            ("?", True),
            ("c8", 1 - 1j),
            ("i8", 2**62),
        ]
    ]
    out.append(CoverageAndBlocks())
    out += [BlockStats(dtype=d) for d in ALL_DTYPES]
    out.append(ComplexStatsAreMagnitudes())
    out += [ByteOrder(compression=c) for c in (None, "zstd")]
    out += [AttributesEverywhere(), GroupsAndNavigation(), DatasetProperties()]
    out += [
        ManySteps(),
        ManyStepsRandomAccess(),
        ImplicitStepCommittedAtClose(),
        ImplicitStepEndedExplicitly(),
    ]
    out += [BeginEndStepCalls(), AppendMode(), AppendCreatesMissingFile(), WriteModeTruncates()]
    compressions: list[Any] = [
        "zstd",
        "blosc",
        "lz4",
        "zlib",
        "gzip",
        {"id": "zstd", "level": 5, "checksum": True},
        ("blosc", {"cname": "lz4", "clevel": 5, "shuffle": 1}),
        ["zstd", "zlib"],
    ]
    out += [
        LosslessCompression(compression=c, dtype=d)
        for c in compressions
        for d in ("f8", "i4", "u1", "?", "c8")
    ]
    out += [ZfpTolerance(dtype=d, tol=t) for d in ("f4", "f8") for t in (1e-1, 1e-3, 1e-6)]
    out.append(ZfpNanAndInfStoredExactly())
    out += [
        ZfpModes(spec=s)
        for s in (
            {"id": "zfpy", "rate": 8},
            {"id": "zfpy", "precision": 12},
            {"id": "zfp", "tolerance": 0.01},
        )
    ]
    out += [ZeroDimDataset(dtype=d) for d in ("f8", "i2", "?", "c16")]
    out += [ZeroDimManySteps(), EmptyBoxesAndZeroSizeDatasets(), StridedReads()]
    out += [RandomBoxes(seed=s) for s in range(8)]
    out += [ReadIntoBuffer(), CopySemantics(), NonContiguousAndBroadcastInputs(), LargeBlock()]
    out += [
        CommonOptions(options=o)
        for o in (
            {"background_stats": False},
            {"checksum_segment": 0},
            {"checksum_segment": 2 * CHUNK},
        )
    ]
    out.append(ManyRanksBlocks())
    out += [
        WriteBlocks(form=f) for f in ("stacked", "list", "cast", "mixed", "compressed", "large")
    ]
    out.append(WriteBlocksRefused())
    names = [c.name for c in out]
    assert len(set(names)) == len(names), "case names must differ"
    return out


CASES: list[Case] = all_cases()


__all__ = [
    "ALL_DTYPES",
    "CAPABILITIES",
    "CASES",
    "Case",
    "Context",
    "check_stats",
    "expected_stats",
    "put_blocks",
    "sample",
]
