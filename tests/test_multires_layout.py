"""The multiresolution layout as users meet it: create_dataset(layout=lamina.Multires(...)), write, read levels.

The algorithms themselves (wavelet, error bound, zfp per band, balancing)
are tested in test_multires.py and test_multires_balance.py; here they run
through the engines: steps, commits, checksums, statistics, queries, n
writers to m readers, bad input and damaged files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import lamina
from lamina.errors import ConfigError
from lamina.geometry import Box
from lamina.multires import compress

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

DATA = Path(
    os.environ.get("LAMINA_TEST_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
CTH = DATA / "cth_shock_128x64x64.npz"


def smooth(shape, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    return (x / np.sqrt(np.prod(shape))).astype(dtype)


def path_for(tmp_path, engine):
    return str(tmp_path / "f.lam") if engine == "native" else f"mem-{tmp_path.name}"


def write(path, engine, arr, layout, steps=1, boxes=None, **open_kw):
    with lamina.open(path, "w", engine=engine, **open_kw) as f:
        ds = f.create_dataset("T", arr.shape, arr.dtype, layout=layout)
        for s in range(steps):
            with f.step():
                for box in boxes or [Box.from_shape(arr.shape)]:
                    ds[box.slices] = arr[box.slices] + s
    return path


@pytest.mark.parametrize("engine", ["native", "memory"])
@pytest.mark.parametrize(
    "shape, patch",
    [((100,), 16), ((37, 50), (16, 8)), ((33, 20, 17), 8), ((64, 64), 32)],
)
def test_lossless_round_trip_bit_for_bit(tmp_path, engine, shape, patch):
    """Tolerance 0: level 0 reads back bit for bit (partial patches included), level k as the integer transform gives it."""
    x = smooth(shape, 1)
    p = write(path_for(tmp_path, engine), engine, x, lamina.Multires(patch=patch, tolerance=0))
    with lamina.open(p, "r", engine=engine) as f:
        ds = f["T"]
        assert np.array_equal(ds[...], x)
        for k in range(len(ds.levels)):
            want = compress.reference_array(x, ds.layout.patch, k, 0)
            assert np.array_equal(ds.level(k)[...], want), k


@pytest.mark.parametrize("engine", ["native", "memory"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tol", [1e-1, 1e-3, 1e-6])
def test_every_level_within_tolerance(tmp_path, engine, dtype, tol):
    x = smooth((40, 33, 21), 2, dtype) * 10
    p = write(
        path_for(tmp_path, engine), engine, x, lamina.Multires(patch=(16, 16, 8), tolerance=tol)
    )
    with lamina.open(p, "r", engine=engine) as f:
        ds = f["T"]
        for k in range(len(ds.levels)):
            want = compress.reference_array(x, (16, 16, 8), k, tol)
            got = ds.level(k)[...]
            assert got.dtype == dtype and got.shape == ds.levels[k]
            assert np.abs(got.astype(np.float64) - want).max() <= tol, k


@pytest.mark.skipif(not CTH.exists(), reason="shared data not present")
@pytest.mark.parametrize("name", ["pressure", "x_velocity", "volume_fraction_for_armor_plate"])
def test_real_data_through_the_file(tmp_path, name):
    """CTH fields (sharp fronts, empty regions) written by boxes that cut patches, every level within the bound."""
    x = np.load(CTH)[name][:, 5:60, 3:]
    tol = float(np.ptp(x)) * 1e-4
    boxes = [Box((0, 0, 0), (30, 55, 125)), Box((30, 0, 0), (64, 55, 125))]
    p = write(
        str(tmp_path / "c.lam"), "native", x, lamina.Multires(patch=32, tolerance=tol), boxes=boxes
    )
    with lamina.open(p) as f:
        ds = f["T"]
        for k in range(len(ds.levels)):
            want = compress.reference_array(x, (32, 32, 32), k, tol)
            assert np.abs(ds.level(k)[...].astype(np.float64) - want).max() <= tol
        assert ds.stored_bytes() < x.nbytes / 2


def test_levels_regions_and_bytes(tmp_path):
    x = smooth((64, 48), 3)
    p = write(str(tmp_path / "f.lam"), "native", x, lamina.Multires(patch=16, tolerance=1e-4))
    with lamina.open(p) as f:
        ds = f["T"]
        assert ds.levels == [(64, 48), (32, 24), (16, 12), (8, 6), (4, 3)]
        assert isinstance(ds.layout, lamina.Multires) and ds.layout.tolerance == 1e-4
        # a region of level 2 in its own coordinates, numpy-style selections
        ref = compress.reference_array(x, (16, 16), 2, 1e-4)
        assert np.abs(ds.level(2)[3:9, ::2] - ref[3:9, ::2]).max() <= 1e-4
        assert np.abs(ds.level(2)[5] - ref[5]).max() <= 1e-4
        got = ds.read(Box((3, 2), (9, 7)), level=2, tolerance=1e-3)
        assert np.abs(got - ref[3:9, 2:7]).max() <= 1e-4
        # only the patches the box meets, only the bands of its level and coarser
        assert ds.last_read_bytes == ds.stored_bytes(Box((3, 2), (9, 7)), level=2)
        whole = [ds.stored_bytes(level=k) for k in range(5)]
        assert whole == sorted(whole, reverse=True) and whole[4] < whole[0] / 10
        one_patch = ds.stored_bytes(Box((0, 0), (16, 16)))
        assert one_patch < whole[0] / 8
        # coarse to fine: all refinements together read what one read of level 0 reads
        out = list(ds.progressive())
        assert [k for k, _ in out] == [4, 3, 2, 1, 0]
        assert ds.last_read_bytes == whole[0]
        assert np.abs(out[-1][1] - x).max() <= 1e-4
        # the file counts what its datasets read (as for plain datasets), once; a query too
        b0 = f.engine.bytes_read
        ds.level(2)[...]
        assert f.engine.bytes_read - b0 == whole[2]
        b0 = f.engine.bytes_read
        res = f.query("T > 0", level=2)
        assert 0 < f.engine.bytes_read - b0 == res.bytes_read <= whole[2]


def test_mixed_file_steps_blocks_and_statistics(tmp_path):
    """A plain and a multiresolution dataset side by side; blocks are patches with statistics of their level."""
    x = smooth((48, 40), 4)
    with lamina.open(tmp_path / "f.lam", "w") as f:
        t = f.create_dataset("T", x.shape, x.dtype, layout=lamina.Multires(patch=16, tolerance=0))
        p = f.create_dataset("g/P", x.shape, x.dtype)
        for s in range(3):
            with f.step():
                t[...] = x + s
                p[...] = x - s
        assert sorted(f.keys()) == ["T", "g"]
    with lamina.open(tmp_path / "f.lam") as f:
        assert f.steps == 3 and sorted(f.keys()) == ["T", "g"]
        for s in range(3):
            assert np.array_equal(f.at(s)["T"][...], x + s)
            assert np.array_equal(f.at(s)["g/P"][...], x - s)
        blocks = f["T"].blocks(1)
        assert len(blocks) == 9 and {b.codec for b in blocks} == {"multires"}
        b = blocks[4]
        v = (x + 1)[b.box.slices]
        assert (b.stats.min, b.stats.max, b.stats.count) == (v.min(), v.max(), v.size)
        assert f["T"].coverage(0)


def test_queries_prune_by_patch_and_stay_exact(tmp_path):
    """Statistics are of the values written; a lossy read may differ by the tolerance, and the query widens by it."""
    x = smooth((64, 64), 5)
    tol = 1e-3
    p = write(str(tmp_path / "f.lam"), "native", x, lamina.Multires(patch=16, tolerance=tol))
    with lamina.open(p) as f:
        got = f["T"][...]
        for thr in (float(np.quantile(got, 0.99)), float(got.max()) - tol / 2, float(got.max())):
            res = f.query(f"T >= {thr!r}")
            assert res.count == int((got >= thr).sum())
        res = f.query(f"T >= {float(np.quantile(got, 0.99))!r}")
        assert len(res.candidates) < 16  # of 16 patches: the others are pruned


@pytest.mark.parametrize("engine", ["native", "memory"])
def test_query_at_a_coarse_level(tmp_path, engine):
    """f.query(..., level=k): in level-k coordinates, the values ds.level(k) reads, from the
    bands of level k and coarser only; datasets without that level are refused by name."""
    x = smooth((128, 96), 5) * 100
    tol = 1e-3
    p = path_for(tmp_path, engine)
    with lamina.open(p, "w", engine=engine) as f:
        f.create_dataset("T", x.shape, x.dtype, layout=lamina.Multires(patch=16, tolerance=tol))
        f.create_dataset("U", x.shape, x.dtype, layout=lamina.Multires(patch=32, tolerance=0))
        f.create_dataset("P", x.shape, x.dtype)
        f.derive("twice", "2 * T", "expression")
        with f.step():
            f["T"][...] = x
            f["U"][...] = -x
            f["P"][...] = x
    with lamina.open(p, engine=engine) as f:
        spent = []
        for k in (1, 2, 3):
            t, u = f["T"].level(k)[...], f["U"].level(k)[...]
            thr = float(np.quantile(t, 0.9))
            res = f.query(f"T >= {thr!r} & U < 0", select="T", level=k)
            want = (t >= thr) & (u < 0)
            assert res.level == k and res.region.shape == t.shape
            assert res.count == int(want.sum()) and np.array_equal(res.mask, want)
            assert np.array_equal(res.values["T"], t[want])
            assert len(res.candidates) < len(res.unit_boxes)  # patches pruned at level k
            fine = f.query(f"T >= {thr!r} & U < 0", select="T")
            assert 0 < res.bytes_read < fine.bytes_read  # no band finer than level k
            spent.append(res.bytes_read / fine.bytes_read)
            sub = f.query(f"T >= {thr!r}", region=(slice(0, 4), slice(None)), level=k)
            assert sub.count == int((t[:4] >= thr).sum())
            # the function of lamina.query answers as the method does, at the level given
            same = lamina.query.query(f, f"T >= {thr!r} & U < 0", select="T", level=k)
            assert same.level == k and np.array_equal(same.mask, want)
        assert spent == sorted(spent, reverse=True) and spent[-1] < 0.5, spent
        assert "level 2" in f.query("T > 0", level=2).summary()
        with pytest.raises(lamina.BoundsError, match="'P' has one level"):
            f.query("P > 0", level=1)
        with pytest.raises(lamina.BoundsError, match="'twice' is a derived"):
            f.query("twice > 0", level=1)
        with pytest.raises(lamina.BoundsError, match="level 5"):
            f.query("T > 0 & U > 0", level=5)  # U (patch 32) has level 5, T (patch 16) not
        with pytest.raises(lamina.BoundsError, match="level"):
            f.query("T > 0", level=-1)


def test_looser_read_tolerance_leaves_out_small_bands(tmp_path):
    """Every band records its largest coefficient magnitude (as encode gives it); a read at a
    looser tolerance leaves out the bands those magnitudes allow, reads fewer bytes (as
    stored_bytes predicts) and stays within the looser tolerance at every level."""
    rng = np.random.default_rng(3)
    yy, xx = np.meshgrid(np.linspace(0, 1, 64), np.linspace(0, 1, 64), indexing="ij")
    x = np.sin(3 * yy) + xx  # smooth on the left ...
    x[:, 32:] += 0.05 * rng.standard_normal((64, 32))  # ... rough on the right
    tol = 1e-4
    p = write(str(tmp_path / "f.lam"), "native", x, lamina.Multires(patch=16, tolerance=tol))
    with lamina.open(p) as f:
        ds = f["T"]
        eng = f.engine.stack()[-1]
        for k in range(5):
            t = eng.catalog.table(eng.catalog.level("T", k).id, 0)
            assert t.amax is not None and len(t.amax) == 16
            for i in range(len(t)):  # the magnitudes encode gives the same patch
                lo = t.box(i).start
                p0 = tuple(a << k for a in lo)
                enc = compress.encode(
                    x[None, p0[0] : p0[0] + 16, p0[1] : p0[1] + 16], (16, 16), tol
                )
                assert t.amax[i] == enc.amax[0, k]
        for k in range(4):
            full = ds.stored_bytes(level=k)
            ref = compress.reference_array(x, (16, 16), k, tol)
            for loose in (10 * tol, 0.2, 1.0):
                got = ds.read(level=k, tolerance=loose)
                assert ds.last_read_bytes == ds.stored_bytes(level=k, tolerance=loose)
                assert np.abs(got - ref).max() <= loose
            assert ds.last_read_bytes < full  # tolerance 1: only the coarse bands
        # at 0.2 the smooth half leaves out its finest bands, the rough half needs them
        half = [Box((0, 0), (64, 32)), Box((0, 32), (64, 64))]
        left, right = (ds.stored_bytes(b, tolerance=0.2) for b in half)
        assert left < ds.stored_bytes(half[0]) and right == ds.stored_bytes(half[1])


def test_unwritten_parts_read_as_fill(tmp_path):
    x = smooth((40, 40), 6)
    with lamina.open(tmp_path / "f.lam", "w") as f:
        t = f.create_dataset(
            "T", x.shape, x.dtype, fill=-5.0, layout=lamina.Multires(patch=16, tolerance=0)
        )
        with f.step():
            t[0:10, 0:20] = x[0:10, 0:20]
    with lamina.open(tmp_path / "f.lam") as f:
        got = f["T"][...]
        assert np.array_equal(got[0:10, 0:20], x[0:10, 0:20])
        assert (got[10:] == -5).all() and (got[:, 20:] == -5).all()
        assert len(f["T"].blocks(0)) == 2  # patches nobody wrote are not stored


def test_special_values_stored_losslessly(tmp_path):
    x = smooth((32, 32), 7)
    x[3, 4] = np.nan
    x[20, 30] = np.inf
    p = write(str(tmp_path / "f.lam"), "native", x, lamina.Multires(patch=16, tolerance=1e-2))
    with lamina.open(p) as f:
        got = f["T"][...]
        assert np.array_equal(got[:16, :16], x[:16, :16], equal_nan=True)
        assert got[20, 30] == np.inf
        assert np.abs(got[16:, :16] - x[16:, :16]).max() <= 1e-2
        b = [b for b in f["T"].blocks(0) if b.box.start == (0, 0)][0]
        assert b.stats.count == 255  # NaN-aware statistics


@pytest.mark.parametrize("order", ["patch", "level"])
def test_bands_back_to_back_are_read_together(tmp_path, monkeypatch, order):
    """Level order: the coarsest level of the whole domain is one read of the subfile (patch
    order: one per patch); in both orders the whole dataset at level 0 is one read."""
    from lamina.engines.native import engine as native

    x = smooth((64, 48), 3)
    layout = lamina.Multires(patch=16, tolerance=1e-4, order=order)
    p = write(str(tmp_path / "f.lam"), "native", x, layout)
    calls = []
    plain = native._pread_into

    def counting(fd, mv, offset, what):
        calls.append(len(mv))
        return plain(fd, mv, offset, what)

    with lamina.open(p) as f:
        ds = f["T"]
        need = [ds.stored_bytes(level=k) for k in range(5)]  # loads the step's block tables
        monkeypatch.setattr(native, "_pread_into", counting)
        coarse = ds.level(4)[...]
        assert len(calls) == (1 if order == "level" else 12)  # 12 patches
        assert sum(calls) == ds.last_read_bytes == need[4]
        calls.clear()
        whole = ds[...]
        assert len(calls) == 1  # every band of every patch, back to back in either order
        assert sum(calls) == need[0]
        monkeypatch.undo()
        assert np.abs(whole - x).max() <= 1e-4
        assert np.abs(coarse - compress.reference_array(x, (16, 16), 4, 1e-4)).max() <= 1e-4


def test_flipped_byte_in_a_level_gives_checksum_error(tmp_path):
    x = smooth((32, 32), 8)
    p = write(str(tmp_path / "f.lam"), "native", x, lamina.Multires(patch=16, tolerance=1e-3))
    with lamina.open(p) as f:
        coarse = f["T"].level(4)[...]
        b = f["T"].blocks(0)[1]
    data = tmp_path / "f.lam" / b.subfile
    raw = bytearray(data.read_bytes())
    raw[b.offset + b.nbytes // 2] ^= 0x10
    data.write_bytes(bytes(raw))
    with lamina.open(p) as f:
        with pytest.raises(lamina.ChecksumError, match="checksum"):
            f["T"][...]
        assert np.array_equal(f["T"].level(4)[...], coarse)  # the coarse bands are intact


def test_bad_input_names_the_dataset_and_the_limit(tmp_path):
    with lamina.open(tmp_path / "f.lam", "w") as f:
        with pytest.raises(lamina.ShapeError, match=r"'A'.*not a power of two"):
            f.create_dataset("A", (64, 64), "f8", layout=lamina.Multires(patch=24))
        with pytest.raises(lamina.ShapeError, match=r"'A'.*larger than the dataset's extent 20"):
            f.create_dataset("A", (64, 20), "f8", layout=lamina.Multires(patch=32))
        for bad in (-1.0, float("nan"), float("inf"), "1e-3", True):  # (no string, no bool)
            with pytest.raises(ValueError, match=r"'A'.*tolerance"):
                f.create_dataset("A", (64, 64), "f8", layout=lamina.Multires(tolerance=bad))
        for bad in (0.5, True, "2", float("inf")):
            with pytest.raises(ValueError, match=r"'A'.*optimism must be a finite number >= 1"):
                f.create_dataset("A", (64, 64), "f8", layout=lamina.Multires(optimism=bad))
        # numpy numbers are numbers (np.int64(2) was refused as 'not a finite number >= 1')
        with lamina.open(tmp_path / "n.lam", "w") as n:
            for i, kw in enumerate(({"optimism": np.int64(2)}, {"tolerance": np.float32(1e-3)})):
                n.create_dataset(f"ok{i}", (64, 64), "f8", layout=lamina.Multires(**kw))
        with pytest.raises(lamina.DTypeError, match=r"'A'.*float32 or float64"):
            f.create_dataset("A", (64, 64), "i4", layout=lamina.Multires())
        swapped = np.dtype("f8").newbyteorder()  # (was 'float32 or float64 data, not >f8')
        with pytest.raises(
            lamina.DTypeError, match=r"in this machine's byte order, not .f8: give float64"
        ):
            f.create_dataset("A", (64, 64), swapped, layout=lamina.Multires())
        with pytest.raises(ValueError, match="compression"):
            f.create_dataset("A", (64, 64), "f8", compression="zstd", layout=lamina.Multires())
        with pytest.raises(ValueError, match="order"):
            f.create_dataset("A", (64, 64), "f8", layout=lamina.Multires(order="random"))
        with pytest.raises(TypeError, match="lamina.Multires"):
            f.create_dataset("A", (64, 64), "f8", layout={"patch": 32})
        for bad in ("8", "16", True, (8.0, 8)):  # no string split into its digits, no bool
            with pytest.raises(lamina.ShapeError, match=r"'A'.*patch must be an int or a tuple"):
                f.create_dataset(
                    "A", (64, 64)[: 1 if bad == "8" else 2], "f8", layout=lamina.Multires(patch=bad)
                )
        with pytest.raises(lamina.ShapeError, match=r"'A'.*no empty dimension.*\(0, 4\)"):
            f.create_dataset("A", (0, 4), "f8", layout=lamina.Multires(patch=(1, 4)))
        t = f.create_dataset("T", (64, 64), "f8", layout=lamina.Multires(tolerance=1e-3))
        t[...] = smooth((64, 64))
        with pytest.raises(lamina.ModeError, match="'T' is not a derived quantity"):
            f._engine.put_stats("T", Box((0, 0), (2, 2)), np.zeros((2, 2)))
    with lamina.open(tmp_path / "g.lam", "w", layers=[]) as g:  # the engine's own refusal
        g.create_dataset("T", (64, 64), "f8", layout=lamina.Multires(tolerance=1e-3))
        with pytest.raises(ConfigError, match="statistics"):
            g._engine.put_stats("T", Box((0, 0), (2, 2)), np.zeros((2, 2)))
    with lamina.open(tmp_path / "f.lam") as f:
        t = f["T"]
        with pytest.raises(lamina.BoundsError, match=r"'T' has levels 0 to 5.*level 6"):
            t.level(6)
        with pytest.raises(lamina.BoundsError, match="level -1"):
            t.read(level=-1)
        with pytest.raises(ValueError, match=r"'T' was written with tolerance 0.001.*1e-05"):
            t.read(tolerance=1e-5)
        for bad in (-1, float("nan"), True, "1"):
            with pytest.raises(ValueError, match=r"^dataset 'T': read tolerance must be a"):
                t.read(tolerance=bad)
            with pytest.raises(ValueError, match=r"^dataset 'T': read tolerance must be a"):
                t.stored_bytes(tolerance=bad)
        with pytest.raises(lamina.BoundsError, match="level 1"):
            t.read(Box((0, 0), (33, 2)), level=1)
        for bad in (2.5, True, "1"):  # no level truncated or parsed
            with pytest.raises(TypeError, match=r"'T': a level is an int"):
                t.level(bad)
            with pytest.raises(TypeError, match=r"'T': a level is an int"):
                t.stored_bytes(level=bad)
        with pytest.raises(TypeError, match=r"stored_bytes\(\) of dataset '/T' takes a lamina.Box"):
            t.stored_bytes([0, 4])
        assert list(f.keys()) == ["T"]  # nothing committed was lost


def test_boxes_as_slices_and_empty_boxes_at_every_level(tmp_path):
    """stored_bytes and progressive take slices as read does; an empty box is empty at every
    level (its corner scaled, not turned into a cell)."""
    x = smooth((64, 32))
    with lamina.open(tmp_path / "f.lam", "w") as f:
        t = f.create_dataset("T", x.shape, "f8", layout=lamina.Multires(patch=8, tolerance=1e-3))
        with f.step():
            t[...] = x
    with lamina.open(tmp_path / "f.lam") as f:
        t = f["T"]
        box = Box((0, 0), (16, 32))
        assert t.stored_bytes(np.s_[0:16, :]) == t.stored_bytes(box) > 0
        got = [(k, a.shape) for k, a in t.progressive(np.s_[0:16, :])]
        assert got == [(k, a.shape) for k, a in t.progressive(box)]
        assert got[-1] == (0, (16, 32))
        for k, a in t.progressive(Box((3, 0), (3, 32))):
            assert a.size == 0, k
        assert t.read(Box((3, 0), (3, 8)), level=2).size == 0


@pytest.mark.parametrize(
    "shape, patch",
    [((8, 8, 4, 4), (2, 2, 2, 2)), ((3, 5, 4, 6), 2), ((4,) * 4, 4)],
    ids=["4d", "4d-uneven", "4d-one-patch"],
)
def test_four_dimensions_round_trip(tmp_path, shape, patch):
    """Every rank of 1 to 4 dimensions is written and read back (patches numbered in Morton
    order with as many bits as the grid needs: 21 a coordinate do not fit 64 bits in 4-D)."""
    x = smooth(shape, dtype=np.float32)
    with lamina.open(tmp_path / "f.lam", "w") as f:
        t = f.create_dataset("T", shape, "f4", layout=lamina.Multires(patch=patch, tolerance=1e-3))
        with f.step():
            t[...] = x
    with lamina.open(tmp_path / "f.lam") as f:
        t = f["T"]
        assert np.abs(t[...] - x).max() <= 1e-3
        for k in range(len(t.levels)):
            assert t.level(k)[...].shape == t.levels[k]


def test_overlapping_writes_are_refused_naming_both_boxes(tmp_path):
    with lamina.open(tmp_path / "f.lam", "w") as f:
        t = f.create_dataset("T", (32, 32), "f4", layout=lamina.Multires(patch=16))
        with f.step():
            t[0:10] = 1.0
            with pytest.raises(
                lamina.OverlapError, match=r"\[5:12, 0:32\] overlaps box \[0:10, 0:32\]"
            ):
                t[5:12] = 2.0


def test_background_io_encodes_behind_the_program(tmp_path):
    """io='async': end_step copies the pieces and returns; distribution, transform, zfp and the
    write run on the background thread, step after step, and every level reads back."""
    from lamina.layers.background import BackgroundLayer

    x = smooth((64, 48, 40), 11, np.float32)
    p = str(tmp_path / "f.lam")
    with lamina.open(p, "w", io="async") as f:
        assert any(isinstance(e, BackgroundLayer) for e in f.engine.stack())
        ds = f.create_dataset(
            "T", x.shape, x.dtype, layout=lamina.Multires(patch=16, tolerance=1e-3)
        )
        for s in range(3):
            with f.step():
                ds[:30] = x[:30] + s
                ds[30:] = x[30:] + s
        f.wait()
    with lamina.open(p) as f:
        assert f.steps == 3
        for s in range(3):
            for k in range(len(f["T"].levels)):
                want = compress.reference_array(x + s, (16, 16, 16), k, 1e-3)
                assert np.abs(f.at(s)["T"].level(k)[...] - want).max() <= 1e-3


@pytest.mark.parametrize("mode", ["memory", "both"])
def test_in_situ_transport_serves_the_levels(tmp_path, mode):
    """The same writer and reader programs as one launch, the reader taking the encoded bands
    from the writers' memory: every level, boxes, progressive reads, queries (3 -> 2 ranks)."""
    from test_transport import run_mpmd

    res = run_mpmd(
        (3, "multires", "write", "."),
        (2, "multires", "read", ".", 3),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": mode},
        timeout=240,
    )
    assert res.lines("OK write: 3 ranks") and res.lines("OK read: 2 ranks, 3 writers")
    assert (tmp_path / "a.lam").exists() == (mode == "both")


def test_files_without_layouts_and_older_versions_read_as_before():
    """The layout lives in the codec list's first element: a plain definition encodes as it always did."""
    from lamina.catalog.model import DatasetSpec, Decoder, Encoder

    s = DatasetSpec("a/b", (4, 5), np.dtype("f4"), 0.0, ({"id": "zstd"},), 3)
    e = Encoder()
    s.encode(e)
    assert b'[{"id":"zstd"}]' in e.getvalue()
    back = DatasetSpec.decode(Decoder(e.getvalue(), "test"))
    assert back.layout is None and back.codecs == ({"id": "zstd"},)


@pytest.mark.parametrize("n, m", [(1, 3), (3, 2), (4, 1)])
def test_n_writers_m_readers_every_level(tmp_path, n, m):
    """Uneven slabs that cut patches, three files (lossy and lossless, patch and level order,
    balanced/greedy distribution, balanced/counts/local aggregation), every level read by
    slabs, random boxes and progressively by another rank count, and queried."""
    res = mu.run_mpi(n, "multires", "write", tmp_path, timeout=150)
    assert "OK write" in res.stdout
    res = mu.run_mpi(m, "multires", "read", tmp_path, n, timeout=150)
    assert f"OK read: {m} ranks, {n} writers" in res.stdout


def test_command_line_shows_layout_levels_and_loads(tmp_path, capsys):
    from lamina.cli import main

    x = smooth((40, 36), 9)
    x[0, 0] = np.nan
    write(str(tmp_path / "f.lam"), "native", x, lamina.Multires(patch=16, tolerance=1e-3))
    assert main(["ls", str(tmp_path / "f.lam")]) == 0
    out = capsys.readouterr().out
    assert "multires(patch 16x16, tolerance 0.001, 5 levels, 1 patches lossless" in out
    assert main(["info", str(tmp_path / "f.lam"), "T"]) == 0
    out = capsys.readouterr().out
    assert "9 patches" in out and "bytes per subfile" in out and "20x18" in out
    assert main(["dump", str(tmp_path / "f.lam"), "T", "--level", "3", "--json"]) == 0
    import json

    got = json.loads(capsys.readouterr().out)
    assert got["level"] == 3 and got["shape"] == [5, 5]
    assert main(["dump", str(tmp_path / "f.lam"), "T", "--level", "9"]) != 0
    assert "levels 0 to 4" in capsys.readouterr().err
