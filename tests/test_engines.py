"""Round trips through the whole API, run against every engine ('native' and 'memory').

Like zarr's ``testing/store.py``: one base class of behaviour that every
engine must show.  The ``engine`` fixture (conftest.py) parametrizes each
test over the engines, so adding an engine to ``ENGINES`` runs it through
the same suite.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lamina
from lamina import Box
from lamina.stats import CHUNK

pytestmark = pytest.mark.usefixtures("fast_native")

INT_DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"]
FLOAT_DTYPES = ["f2", "f4", "f8"]
COMPLEX_DTYPES = ["c8", "c16"]
ALL_DTYPES = ["?", *INT_DTYPES, *FLOAT_DTYPES, *COMPLEX_DTYPES]


def sample(dtype, shape, rng, nan=False):
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


def expected_stats(a: np.ndarray):
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


def check_stats(stats, a):
    mn, mx, s, n = expected_stats(a)
    assert stats.count == n
    if n == 0:
        assert math.isnan(stats.min) and math.isnan(stats.max)
        return
    if a.dtype.kind in "biu":
        assert stats.min == mn and stats.max == mx
        assert isinstance(stats.min, int) and isinstance(stats.max, int)
    else:
        assert stats.min == pytest.approx(mn, rel=1e-6) and stats.max == pytest.approx(mx, rel=1e-6)
    assert complex(stats.sum) == pytest.approx(complex(s), rel=1e-9, abs=1e-6 * max(1.0, abs(s)))


# --------------------------------------------------------------------------


class TestRoundTrip:
    """Behaviour every engine must show (run once per engine)."""

    # -- dtypes, partial reads, fill ------------------------------------------
    @pytest.mark.parametrize("dtype", ALL_DTYPES)
    def test_dtypes_round_trip(self, engine, new_path, rng, dtype):
        path = new_path()
        a = sample(dtype, (9, 7), rng)
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("d", shape=(9, 7), dtype=dtype)
            with f.step():
                ds[:4] = a[:4]
                ds[4:, :3] = a[4:, :3]
                ds[4:, 3:] = a[4:, 3:]
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["d"]
            assert ds.dtype == np.dtype(dtype) and ds.shape == (9, 7)
            got = ds[...]
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, a)
            # partial reads across block borders
            np.testing.assert_array_equal(ds[2:6, 1:5], a[2:6, 1:5])
            np.testing.assert_array_equal(ds[5], a[5])
            np.testing.assert_array_equal(ds[:, 3], a[:, 3])
            assert ds[8, 6] == a[8, 6]
            np.testing.assert_array_equal(np.asarray(ds), a)

    @pytest.mark.parametrize(
        "dtype, fill",
        [
            ("f8", 0),
            ("f8", -1.5),
            ("f4", np.nan),
            ("i4", -7),
            ("u2", 65535),
            ("?", True),
            ("c8", 1 - 1j),
            ("i8", 2**62),
        ],
    )
    def test_fill_values(self, engine, new_path, dtype, fill):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("g/d", shape=(6, 5), dtype=dtype, fill=fill)
            assert ds.fill == np.array(fill, dtype=dtype)[()] or np.isnan(ds.fill)
            with f.step():
                ds[1:3, 1:4] = np.ones((2, 3), dtype=dtype)
            with f.step():
                pass  # a step that writes nothing: everything reads as the fill
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["g/d"]
            expect = np.full((6, 5), fill, dtype=dtype)
            expect[1:3, 1:4] = 1
            np.testing.assert_array_equal(f.at(0)["g/d"][...], expect)
            np.testing.assert_array_equal(ds[...], np.full((6, 5), fill, dtype=dtype))
            np.testing.assert_array_equal(f.at(0)["g/d"][0], np.full(5, fill, dtype=dtype))
            assert ds.coverage() == []
            assert f.at(0)["g/d"].coverage() == [Box((1, 1), (3, 4))]

    def test_coverage_and_blocks(self, engine, new_path, rng):
        path = new_path()
        boxes = [
            Box((0, 0), (5, 4)),
            Box((5, 0), (10, 4)),
            Box((0, 4), (10, 6)),
            Box((3, 6), (4, 8)),
        ]
        a = rng.standard_normal((10, 8))
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("x", shape=(10, 8), dtype="f8", fill=np.nan)
            with f.step():
                for b in boxes:
                    ds.write(a[b.slices], offset=b.start)
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["x"]
            assert sorted(ds.coverage(), key=lambda b: b.start) == sorted(
                boxes, key=lambda b: b.start
            )
            infos = ds.blocks()
            assert len(infos) == 4
            for info in infos:
                assert isinstance(info, lamina.BlockInfo)
                assert info.raw_nbytes == info.box.size * 8
                assert info.nbytes == info.raw_nbytes and info.codec == "raw"
                assert info.rank == 0
                check_stats(info.stats, a[info.box.slices])
            got = ds[...]
            mask = np.zeros((10, 8), bool)
            for b in boxes:
                mask[b.slices] = True
            np.testing.assert_array_equal(got[mask], a[mask])
            assert np.isnan(got[~mask]).all()

    @pytest.mark.parametrize("dtype", ALL_DTYPES)
    def test_block_stats_match_numpy(self, engine, new_path, rng, dtype):
        path = new_path()
        blocks = {
            "plain": sample(dtype, (20, 3), rng),
            "nan": sample(dtype, (20, 3), rng, nan=True),
            "allnan": np.full((20, 3), np.nan, dtype=dtype)
            if np.dtype(dtype).kind in "fc"
            else sample(dtype, (20, 3), rng),
            "one": sample(dtype, (1, 3), rng)[:1, :1].repeat(3, axis=1),
        }
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("s", shape=(61, 3), dtype=dtype)
            with f.step():
                ds[0:20] = blocks["plain"]
                ds[20:40] = blocks["nan"]
                ds[40:60] = blocks["allnan"]
                ds[60:61] = blocks["one"]
        with lamina.open(path, "r", engine=engine) as f:
            by_start = {b.box.start[0]: b for b in f["s"].blocks()}
            check_stats(by_start[0].stats, blocks["plain"])
            check_stats(by_start[20].stats, blocks["nan"])
            check_stats(by_start[40].stats, blocks["allnan"])
            check_stats(by_start[60].stats, blocks["one"])
            got = f["s"][...]
            np.testing.assert_array_equal(got[20:40], blocks["nan"])  # NaN == NaN here

    def test_complex_stats_are_magnitudes(self, engine, new_path):
        path = new_path()
        z = np.array([3 + 4j, -1 + 0j, 0 - 2j, np.nan + 1j], dtype="c16")
        with lamina.open(path, "w", engine=engine) as f:
            f.create_dataset("z", shape=(4,), dtype="c16")[...] = z
        with lamina.open(path, "r", engine=engine) as f:
            st_ = f["z"].blocks()[0].stats
            assert st_.min == 1.0 and st_.max == 5.0 and st_.count == 3
            assert st_.sum == pytest.approx(2 + 2j)

    @pytest.mark.parametrize("compression", [None, "zstd"])
    def test_non_native_byte_order(self, engine, new_path, compression):
        path = new_path()
        a = np.arange(24, dtype=">i4").reshape(4, 6)
        with lamina.open(path, "w", engine=engine) as f:
            be = f.create_dataset("be", shape=(4, 6), dtype=">i4", compression=compression, fill=-2)
            le = f.create_dataset("le", shape=(4, 6), dtype="<f8")
            with f.step():
                be[:2] = a[:2]
                le[...] = a.astype(">f8")  # converted on the way in
        with lamina.open(path, "r", engine=engine) as f:
            got = f["be"][...]
            assert got.dtype == np.dtype(">i4")
            np.testing.assert_array_equal(got[:2], a[:2])
            np.testing.assert_array_equal(got[2:], -2)
            np.testing.assert_array_equal(f["le"][...], a)
            assert f["le"].dtype == np.dtype("<f8")
            st_ = f["be"].blocks()[0].stats
            assert (st_.min, st_.max, st_.count) == (0, 11, 12)

    # -- attributes and groups ------------------------------------------------
    def test_attributes_everywhere(self, engine, new_path):
        path = new_path()
        values = {
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
        with lamina.open(path, "w", engine=engine) as f:
            g = f.create_group("grp/sub")
            ds = g.create_dataset("d", shape=(2,), dtype="f4")
            for obj in (f, g, ds):
                for k, v in values.items():
                    obj.attrs[k] = v
            f.attrs["gone"] = 1
            del f.attrs["gone"]
            ds.attrs["i"] = 43  # overwrite
            # visible to the writer at once
            assert f.attrs["s"] == "text ✓" and ds.attrs["i"] == 43
        with lamina.open(path, "r", engine=engine) as f:
            for obj in (f, f["grp/sub"], f["grp/sub/d"]):
                a = obj.attrs
                assert sorted(a) == sorted(values)
                assert len(a) == len(values)
                assert a["s"] == "text ✓" and isinstance(a["s"], str)
                assert a["ls"] == ["a", "b"]
                assert a["f"] == 2.5 and a["c"] == 1 + 2j and a["b"]
                np.testing.assert_array_equal(a["arr"], values["arr"])
                assert a["arr"].dtype == np.dtype("i2")
                assert a["f32"] == np.float32(0.5) and a["f32"].dtype == np.float32
                assert a["u64"] == np.uint64(2**64 - 1)
                assert np.isscalar(a["i"])
                assert "gone" not in a
                assert "Attributes" in repr(a)
            assert f.attrs["i"] == 42 and f["grp/sub/d"].attrs["i"] == 43

    @settings(max_examples=30)
    @given(
        name=st.text(min_size=1, max_size=20),
        value=st.one_of(
            st.text(max_size=50),
            st.lists(st.text(max_size=10), min_size=1, max_size=5),
            st.integers(-(2**70), 2**70),
            st.floats(),
            st.complex_numbers(),
            st.booleans(),
            hnp.arrays(
                hnp.scalar_dtypes(),
                hnp.array_shapes(min_dims=0, max_dims=3, max_side=3),
            ),
        ),
    )
    def test_any_accepted_attribute_reopens(self, engine, new_path, name, value):
        """Whatever set accepts, a reader can open and gets back; the rest is refused at once."""
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            try:
                f.attrs[name] = value
            except (ValueError, TypeError) as e:
                assert isinstance(e, lamina.LaminaError) or "attribute" in str(e)
                accepted = False
            else:
                accepted = True
        with lamina.open(path, "r", engine=engine) as f:
            if not accepted:
                assert name not in f.attrs
                return
            got = f.attrs[name]
            if isinstance(value, str):
                assert got == value
            elif isinstance(value, list):
                assert got == value
            else:
                expect = np.asarray(value)
                np.testing.assert_array_equal(np.asarray(got), expect)
                g = np.asarray(got).dtype  # 0-D come back as numpy scalars, in native byte order
                assert (g.kind, g.itemsize) == (expect.dtype.kind, expect.dtype.itemsize)
        lamina.engines.memory.drop(path)

    def test_groups_and_navigation(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
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
                ds[...] = [1, 2, 3]
        with lamina.open(path, "r", engine=engine) as f:
            assert f.keys() == ["a", "new", "top"]
            assert list(f) == ["a", "new", "top"] and len(f) == 3
            assert f["a"].keys() == ["b", "x"]
            assert isinstance(f["a"], lamina.Group) and isinstance(f["a/b/c/data"], lamina.Dataset)
            assert f["a"]["b/c"]["data"].name == "/a/b/c/data"
            assert f["a/b"]["/top"].name == "/top"
            assert "a/b/c" in f and "/a/b/c/data" in f and "b/c" in f["a"] and "zz" not in f
            assert "a/../b" not in f  # invalid names are simply not there
            np.testing.assert_array_equal(f["a/b/c/data"][...], [1, 2, 3])
            walked = [p for p, _ in f.walk()]
            assert walked == ["/a", "/a/b", "/a/b/c", "/a/b/c/data", "/a/x", "/new", "/top"]
            assert [k for k, _ in f["a"].items()] == ["b", "x"]
            assert len(f["a"].values()) == 2
            assert f.name == "/" and f.file is f and f["a"].file is f
            assert "lamina.Group" in repr(f["a"]) and "lamina.Dataset" in repr(f["top"])
            assert engine in repr(f)

    def test_dataset_properties(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("p", shape=(4, 5), dtype="u2", fill=3, compression="zstd")
            assert ds.shape == (4, 5) and ds.ndim == 2 and ds.size == 20 and len(ds) == 4
            assert ds.dtype == np.dtype("u2") and ds.fill == 3
            assert ds.compression == ({"id": "zstd"},)
            assert ds.step is None
            s = f.create_dataset("scalar", shape=())
            with pytest.raises(TypeError):
                len(s)
            d1 = f.create_dataset("one", shape=7)  # an int shape is 1-D
            assert d1.shape == (7,)
            assert f.filename == path and f.mode == "w"
            assert f.engine.name == engine

    # -- steps ----------------------------------------------------------------
    def test_many_steps_and_views(self, engine, new_path):
        path = new_path()
        n = 40
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("v", shape=(3, 4), dtype="i8")
            for k in range(n):
                with f.step() as idx:
                    assert idx == k
                    ds[...] = np.full((3, 4), k)
                assert f.steps == k + 1
                assert ds[0, 0] == k  # the writer reads its latest committed step
        with lamina.open(path, "r", engine=engine) as f:
            assert f.steps == n
            for k in (0, 1, 17, n - 1, -1, -n):
                view = f.at(k)
                kk = k % n
                assert view.index == kk and view.step == kk
                assert np.all(view["v"][...] == kk)
                assert view["v"].step == kk
                assert f["v"].read(step=k)[1, 1] == kk
                assert len(f["v"].blocks(step=k)) == 1
            times = [f.at(k).time for k in range(n)]
            assert times == sorted(times) and times[0] > 1e9
            # a group reached through a step view reads that step
            g = f.at(3)["/"]
            assert np.all(g["v"][...] == 3)
            assert "step 3" in repr(f.at(3))

    def test_implicit_step_committed_at_close(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("x", shape=(4,), dtype="f8")
            ds[:2] = 1.0
            ds[2:] = 2.0
            assert f.engine.in_step and f.steps == 0
        with lamina.open(path, "r", engine=engine) as f:
            assert f.steps == 1
            np.testing.assert_array_equal(f["x"][...], [1, 1, 2, 2])

    def test_implicit_step_ended_explicitly(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("x", shape=(2,), dtype="f8", data=[5.0, 6.0])
            f.end_step()
            assert f.steps == 1
            with f.step():
                ds[...] = 7.0
        with lamina.open(path, "r", engine=engine) as f:
            assert f.steps == 2
            np.testing.assert_array_equal(f.at(0)["x"][...], [5, 6])
            np.testing.assert_array_equal(f["x"][...], [7, 7])

    def test_begin_end_step_calls(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("x", shape=(2,), dtype="i2")
            assert f.begin_step() == 0
            ds[...] = [1, 2]
            f.end_step()
            assert f.begin_step() == 1
            ds[0] = 9
            f.end_step()
        with lamina.open(path, "r", engine=engine) as f:
            np.testing.assert_array_equal(f["x"][...], [9, 0])

    def test_append_mode(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("x", shape=(3,), dtype="f8")
            f.attrs["run"] = "first"
            for k in range(2):
                with f.step():
                    ds[...] = k
        with lamina.open(path, "a", engine=engine) as f:
            assert f.steps == 2 and f.attrs["run"] == "first"
            np.testing.assert_array_equal(f["x"][...], 1.0)  # reads what was there
            y = f.create_dataset("y", shape=(2,), dtype="i4")
            f.attrs["run"] = "second"
            with f.step() as k:
                assert k == 2
                f["x"][...] = 2.0
                y[...] = [3, 4]
        with lamina.open(path, "a", engine=engine) as f:
            f.attrs["meta-only"] = 1  # a change with no step
        with lamina.open(path, "r", engine=engine) as f:
            assert f.steps == 3
            for k in range(3):
                np.testing.assert_array_equal(f.at(k)["x"][...], float(k))
            np.testing.assert_array_equal(f.at(0)["y"][...], 0)  # defined later: fill before
            np.testing.assert_array_equal(f["y"][...], [3, 4])
            assert f.attrs["run"] == "second" and f.attrs["meta-only"] == 1
            sessions = {b.subfile for k in range(3) for b in f["x"].blocks(k)}
            if engine == "native":
                assert sessions == {"data.0.0", "data.1.0"}

    def test_append_creates_missing_file(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "a", engine=engine) as f:
            f.create_dataset("x", shape=(1,))[...] = 1.0
        with lamina.open(path, "r", engine=engine) as f:
            assert f["x"][0] == 1.0

    def test_write_mode_truncates(self, engine, new_path, write_simple):
        path = new_path()
        write_simple(path, engine=engine, steps=3)
        with lamina.open(path, "w", engine=engine) as f:
            assert f.steps == 0 and "fields" not in f and len(f.attrs) == 0
            f.create_dataset("other", shape=(1,))
        with lamina.open(path, "r", engine=engine) as f:
            assert f.keys() == ["other"] and f.steps == 0

    def test_reader_follows_writer(self, engine, new_path):
        path = new_path()
        w = lamina.open(path, "w", engine=engine)
        try:
            ds = w.create_dataset("x", shape=(2,), dtype="i4")
            with w.step():
                ds[...] = [1, 1]
            r = lamina.open(path, "r", engine=engine)
            try:
                assert r.steps == 1 and not r.engine.writer_closed
                with w.step():
                    ds[...] = [2, 2]
                assert r.steps == 1
                assert r.refresh() == 2
                np.testing.assert_array_equal(r["x"][...], [2, 2])
                assert r.wait_for_step(1, timeout=1).index == 1
                w.close()
                r.refresh()
                assert r.engine.writer_closed
                assert [v.index for v in r.iter_steps(timeout=1)] == [0, 1]
                with pytest.raises(lamina.StepError, match="never exist"):
                    r.wait_for_step(5, timeout=1)
            finally:
                r.close()
        finally:
            w.close()

    def test_wait_for_step_times_out(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as w:
            w.create_dataset("x", shape=(1,))
            with w.step():
                pass
            with lamina.open(path, "r", engine=engine) as r:
                with pytest.raises(lamina.StepTimeoutError, match="no step 3"):
                    r.wait_for_step(3, timeout=0.1, poll=0.01)

    # -- compression ----------------------------------------------------------
    @pytest.mark.parametrize(
        "compression",
        [
            "zstd",
            "blosc",
            "lz4",
            "zlib",
            "gzip",
            {"id": "zstd", "level": 5, "checksum": True},
            ("blosc", {"cname": "lz4", "clevel": 5, "shuffle": 1}),
            ["zstd", "zlib"],
        ],
        ids=str,
    )
    @pytest.mark.parametrize("dtype", ["f8", "i4", "u1", "?", "c8"])
    def test_lossless_compression_exact(self, engine, new_path, rng, compression, dtype):
        path = new_path()
        shape = (32, 20)
        compressible = np.repeat(sample(dtype, (32, 1), rng), 20, axis=1)  # rows of one value
        noise = sample(dtype, shape, rng)  # may not compress: stored raw
        with lamina.open(path, "w", engine=engine) as f:
            c = f.create_dataset("c", shape=shape, dtype=dtype, compression=compression)
            n = f.create_dataset("n", shape=shape, dtype=dtype, compression=compression)
            with f.step():
                c[:16] = compressible[:16]
                c[16:] = compressible[16:]
                n[...] = noise
        with lamina.open(path, "r", engine=engine) as f:
            np.testing.assert_array_equal(f["c"][...], compressible)
            np.testing.assert_array_equal(f["c"][3:20, 5:9], compressible[3:20, 5:9])
            np.testing.assert_array_equal(f["n"][...], noise)
            infos = f["c"].blocks()
            assert all(b.codec != "raw" and b.nbytes < b.raw_nbytes for b in infos)
            for b in infos:
                check_stats(b.stats, compressible[b.box.slices])
            assert all(b.nbytes <= b.raw_nbytes for b in f["n"].blocks())

    @pytest.mark.parametrize("dtype", ["f4", "f8"])
    @pytest.mark.parametrize("tol", [1e-1, 1e-3, 1e-6])
    def test_zfp_respects_tolerance(self, engine, new_path, rng, dtype, tol):
        path = new_path()
        shape = (40, 33)
        x, y = np.meshgrid(np.linspace(0, 4, shape[0]), np.linspace(0, 4, shape[1]), indexing="ij")
        a = (np.sin(x) * np.cos(y) * 10 + rng.standard_normal(shape) * 0.01).astype(dtype)
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("z", shape=shape, dtype=dtype, compression=("zfp", tol))
            assert ds.compression[0]["tolerance"] == tol
            with f.step():
                ds[:20] = a[:20]
                ds[20:] = a[20:]
        with lamina.open(path, "r", engine=engine) as f:
            got = f["z"][...]
            assert got.dtype == np.dtype(dtype)
            err = np.max(np.abs(got.astype("f8") - a.astype("f8")))
            assert err <= tol, (err, tol)
            part = f["z"][10:30, 7:20]
            assert np.max(np.abs(part.astype("f8") - a[10:30, 7:20].astype("f8"))) <= tol
            for b in f["z"].blocks():
                # statistics describe the exact data that was written, not the decompressed one
                check_stats(b.stats, a[b.box.slices])
            if tol >= 1e-3:
                assert all(b.codec == "zfpy" and b.nbytes < b.raw_nbytes for b in f["z"].blocks())

    def test_zfp_blocks_with_nan_or_inf_are_stored_exactly(self, engine, new_path):
        """zfp would turn NaN and inf into finite numbers; such blocks are kept raw instead."""
        path = new_path()
        x = np.linspace(0, 3, 24 * 16).reshape(24, 16)
        a = np.sin(x) * 5
        a[10, 3] = np.nan
        a[20, 7] = -np.inf
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("z", shape=a.shape, dtype="f8", compression=("zfp", 1e-4))
            with f.step():
                ds[:8] = a[:8]
                ds[8:16] = a[8:16]
                ds[16:] = a[16:]
        with lamina.open(path, "r", engine=engine) as f:
            got = f["z"][...]
            codec = {b.box.start[0]: b.codec for b in f["z"].blocks()}
            assert codec == {0: "zfpy", 8: "raw", 16: "raw"}
            assert np.max(np.abs(got[:8] - a[:8])) <= 1e-4
            np.testing.assert_array_equal(got[8:], a[8:])  # exact, NaN and -inf included

    @pytest.mark.parametrize(
        "spec, check",
        [
            ({"id": "zfpy", "rate": 8}, "rate"),
            ({"id": "zfpy", "precision": 12}, "precision"),
            ({"id": "zfp", "tolerance": 0.01}, "tol"),
        ],
        ids=["rate", "precision", "tolerance-dict"],
    )
    def test_zfp_modes(self, engine, new_path, spec, check):
        path = new_path()
        a = np.linspace(0, 1, 64 * 64).reshape(64, 64)
        with lamina.open(path, "w", engine=engine) as f:
            f.create_dataset("z", shape=a.shape, dtype="f8", compression=spec)[...] = a
        with lamina.open(path, "r", engine=engine) as f:
            b = f["z"].blocks()[0]
            got = f["z"][...]
            if check == "rate":
                # fixed rate: 8 bits per value (plus a small header)
                assert b.nbytes <= a.size + 64
                assert np.max(np.abs(got - a)) < 0.05
            elif check == "precision":
                assert b.nbytes < a.nbytes
                assert np.max(np.abs(got - a)) < 1e-2
            else:
                assert np.max(np.abs(got - a)) <= 0.01

    # -- shapes: 0-D, empty, zero-size, strided ---------------------------------
    @pytest.mark.parametrize("dtype", ["f8", "i2", "?", "c16"])
    def test_zero_dim_dataset(self, engine, new_path, dtype):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            s = f.create_dataset("s", shape=(), dtype=dtype, fill=1)
            assert s.shape == () and s.ndim == 0 and s.size == 1
            with f.step():
                s[()] = np.zeros((), dtype=dtype)
            with f.step():
                pass
            with f.step():
                s[...] = np.array(1, dtype=dtype)
        with lamina.open(path, "r", engine=engine) as f:
            s = f["s"]
            for _ in range(3):  # alternate between steps: each read must really fill its buffer
                assert f.at(0)["s"][()] == 0 and f.at(2)["s"][()] == 1 and f.at(1)["s"][()] == 1
            assert s[()] == 1 and s[...] == 1
            assert f.at(0)["s"][()] == 0
            assert f.at(1)["s"][()] == 1  # fill
            assert s.coverage() == [Box((), ())]
            assert f.at(1)["s"].coverage() == []
            assert s.blocks()[0].stats.count == 1
            assert s.read().shape == ()

    def test_zero_dim_many_steps(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            s = f.create_dataset("s", shape=(), dtype="f8", fill=-1, compression="zstd")
            for k in range(6):
                with f.step():
                    if k % 3:
                        s[()] = k * 1.5
        with lamina.open(path, "r", engine=engine) as f:
            for k in reversed(range(6)):
                assert f.at(k)["s"][()] == (k * 1.5 if k % 3 else -1.0)
                assert f.at(k)["s"].read().item() == (k * 1.5 if k % 3 else -1.0)

    def test_empty_boxes_and_zero_size_datasets(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("d", shape=(4, 3), dtype="f8")
            z = f.create_dataset("z", shape=(0, 5), dtype="i4")
            with f.step():
                ds[2:2] = np.empty((0, 3))
                ds[:, 1:1] = 5.0
                ds.write(np.empty((0, 0)), offset=(4, 3))  # empty box at the far corner
                ds[0:2] = 1.0
                ds[1:1, 0:3] = np.empty((0, 3))  # empty inside a written box: no overlap
                z[...] = np.empty((0, 5), dtype="i4")
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["d"]
            assert ds.coverage() == [Box((0, 0), (2, 3))]
            assert ds[3:3].shape == (0, 3)
            assert ds[:, 2:2].shape == (4, 0)
            assert ds[4:].shape == (0, 3)
            np.testing.assert_array_equal(ds[...], [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]])
            assert f["z"][...].shape == (0, 5) and f["z"].coverage() == []

    def test_strided_reads(self, engine, new_path, rng):
        path = new_path()
        a = rng.standard_normal((11, 9, 4))
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("a", shape=a.shape, dtype="f8")
            with f.step():
                ds[:5] = a[:5]
                ds[5:] = a[5:]
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["a"]
            for key in [
                (slice(None, None, 2), slice(1, 5)),
                (slice(1, None, 3), Ellipsis, 2),
                (slice(None, None, 4), slice(None, None, 4), slice(None, None, 4)),
                (Ellipsis, slice(0, 4, 3)),
                (3, slice(None, None, 2)),
                (slice(2, 9, 5), slice(8, 0)),
            ]:
                np.testing.assert_array_equal(ds[key], a[key])

    @settings(max_examples=25)
    @given(data=st.data())
    def test_random_writes_and_reads(self, engine, new_path, data):
        """Random disjoint boxes written, random selections read back, against a numpy model."""
        shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3), label="shape"))
        nparts = data.draw(st.integers(1, 6), label="nparts")
        parts = lamina.geometry.decompose(shape, nparts)
        keep = data.draw(st.lists(st.booleans(), min_size=nparts, max_size=nparts), label="keep")
        path = new_path()
        model = np.full(shape, -1, dtype="i8")
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("r", shape=shape, dtype="i8", fill=-1)
            with f.step():
                for b, k in zip(parts, keep, strict=True):
                    if k:
                        v = np.arange(b.size, dtype="i8").reshape(b.shape) + 100 * b.start[0]
                        ds[b.slices] = v
                        model[b.slices] = v
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["r"]
            np.testing.assert_array_equal(ds[...], model)
            for _ in range(3):
                key = tuple(
                    slice(a, data.draw(st.integers(a, n)), data.draw(st.integers(1, 3)))
                    for n in shape
                    for a in [data.draw(st.integers(0, n))]
                )
                np.testing.assert_array_equal(ds[key], model[key])
            assert sum(b.size for b in ds.coverage()) == int(
                sum(b.size for b, k in zip(parts, keep, strict=True) if k)
            )
        lamina.engines.memory.drop(path)

    # -- buffers --------------------------------------------------------------
    def test_read_into_out_buffer(self, engine, new_path, rng):
        path = new_path()
        a = rng.standard_normal((6, 6))
        with lamina.open(path, "w", engine=engine) as f:
            f.create_dataset("a", shape=(6, 6), dtype="f8")[...] = a
        with lamina.open(path, "r", engine=engine) as f:
            out = np.empty((2, 3))
            got = f["a"].read(Box((1, 2), (3, 5)), out=out)
            assert got is out
            np.testing.assert_array_equal(out, a[1:3, 2:5])
            with pytest.raises(lamina.ShapeError, match="output buffer"):
                f["a"].read(Box((1, 2), (3, 5)), out=np.empty((2, 3), dtype="f4"))

    def test_copy_semantics(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("a", shape=(4,), dtype="f8")
            buf = np.ones(2)
            with f.step():
                ds[:2] = buf
                buf[:] = 99.0  # the default copies: changing the buffer after the put is safe
                ds.write(np.full(2, 3.0), offset=(2,), copy=False)
        with lamina.open(path, "r", engine=engine) as f:
            np.testing.assert_array_equal(f["a"][...], [1, 1, 3, 3])

    def test_non_contiguous_and_broadcast_inputs(self, engine, new_path):
        path = new_path()
        base = np.arange(48.0).reshape(6, 8)
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("a", shape=(4, 3), dtype="f8")
            with f.step():
                ds[:2] = base[:4:2, ::3]  # strided view
                ds[2:] = np.asfortranarray(base[:2, :3])  # Fortran order
            with f.step():
                ds[...] = [1.0, 2.0, 3.0]  # broadcast a row
        with lamina.open(path, "r", engine=engine) as f:
            np.testing.assert_array_equal(f.at(0)["a"][:2], base[:4:2, ::3])
            np.testing.assert_array_equal(f.at(0)["a"][2:], base[:2, :3])
            np.testing.assert_array_equal(f["a"][...], np.tile([1.0, 2.0, 3.0], (4, 1)))

    def test_large_block_chunked_stats_and_partial_reads(self, engine, new_path, rng):
        """A block bigger than the stats chunk and than one checksum segment."""
        path = new_path()
        n = 3 * CHUNK // 8 + 123  # not a multiple of the chunk
        a = rng.standard_normal(n)
        a[n // 2] = np.nan
        with lamina.open(path, "w", engine=engine, checksum_segment=CHUNK) as f:
            f.create_dataset("big", shape=(n,), dtype="f8")[...] = a
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["big"]
            check_stats(ds.blocks()[0].stats, a)
            np.testing.assert_array_equal(ds[...], a)
            for lo, hi in [
                (0, 10),
                (CHUNK // 8 - 5, CHUNK // 8 + 5),
                (n - 7, n),
                (1000, 2 * CHUNK // 8 + 77),
            ]:
                np.testing.assert_array_equal(ds[lo:hi], a[lo:hi])

    @pytest.mark.parametrize(
        "options",
        [{"background_stats": False}, {"checksum_segment": 0}, {"checksum_segment": 2 * CHUNK}],
    )
    def test_common_options(self, engine, new_path, rng, options):
        path = new_path()
        a = rng.standard_normal((70, 1000))
        with lamina.open(path, "w", engine=engine, **options) as f:
            f.create_dataset("a", shape=a.shape, dtype="f8")[...] = a
        with lamina.open(path, "r", engine=engine) as f:
            np.testing.assert_array_equal(f["a"][...], a)
            np.testing.assert_array_equal(f["a"][30:40, 999], a[30:40, 999])
            check_stats(f["a"].blocks()[0].stats, a)


# --------------------------------------------------------------------------
# native-only options


@pytest.mark.parametrize(
    "options", [{"durable": False}, {"aggregators": 1}, {"durable": True, "aggregators": 1}]
)
def test_native_options(native_path, options, rng):
    a = rng.standard_normal((5, 5))
    with lamina.open(native_path, "w", engine="native", **options) as f:
        f.create_dataset("a", shape=(5, 5), dtype="f8")[...] = a
    with lamina.open(native_path, "r", engine="native") as f:
        np.testing.assert_array_equal(f["a"][...], a)


def test_default_engine_is_native_and_env_override(tmp_path, monkeypatch):
    p = str(tmp_path / "d.lam")
    with lamina.open(p, "w") as f:
        assert f.engine.name == "native"
    monkeypatch.setenv("LAMINA_ENGINE", "memory")
    with lamina.open("mem://env", "w") as f:
        assert f.engine.name == "memory"
    lamina.engines.memory.drop("mem://env")


def test_engine_registry():
    from lamina.engines import registry

    assert {"native", "memory", "mpi", "both"} <= set(registry.engine_names())
    assert registry.engine_entry("memory").factory("w").name == "memory"
    assert registry.layer_names() == ["derived"] and registry.default_layers() == ["derived"]
    with pytest.raises(ValueError, match="unknown engine 'memroy'.*Did you mean 'memory'"):
        registry.engine_entry("memroy")
    with pytest.raises(ValueError, match="unknown layer 'derivd'.*Did you mean 'derived'"):
        registry.layer_entry("derivd")


def test_memory_files_are_shared_in_process_and_dropped():
    from lamina.engines import memory

    with lamina.open("mem://shared", "w", engine="memory") as f:
        f.create_dataset("x", shape=(1,))[...] = 4.0
    with lamina.open("mem://shared", "r", engine="memory") as f:
        assert f["x"][0] == 4.0
    memory.drop("mem://shared")
    with pytest.raises(lamina.NotALaminaFileError):
        lamina.open("mem://shared", "r", engine="memory")
