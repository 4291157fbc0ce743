"""HDF5 interchange: lamina -> HDF5 -> lamina round trips, h5py and h5dump reading, plain HDF5 files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import lamina
from lamina import hdf5
from lamina.geometry import Box

# --------------------------------------------------------------------------
# a sample file with several dtypes, groups, partial coverage, unwritten steps


def make_sample(path) -> str:
    """Three steps; datasets written in some steps only, some partially, in several blocks."""
    path = str(path)
    rng = np.random.default_rng(7)
    with lamina.open(path, "w") as f:
        f.attrs["title"] = "sample run"
        f.attrs["names"] = ["u", "v", "wé"]
        f.attrs["dt"] = 0.25
        f.attrs["n"] = np.int32(12)
        f.attrs["flags"] = np.array([True, False, True])
        f.attrs["z"] = np.complex64(1 - 2j)
        f.attrs["grid"] = np.arange(6, dtype=np.uint16).reshape(2, 3)
        f.attrs["lamina_user_note"] = "a user attribute with the reserved prefix"
        f.create_group("empty/nested")
        g = f.create_group("fields")
        g.attrs["kind"] = "cell"
        t = f.create_dataset("fields/T", shape=(8, 6), dtype="f4", fill=-1.5)
        t.attrs["units"] = "K"
        p = f.create_dataset("fields/deep/p", shape=(4, 3, 5), dtype="i2", fill=-7)
        c = f.create_dataset("spectra/c", shape=(5, 4), dtype="c16", fill=1 + 1j)
        m = f.create_dataset("mask", shape=(6,), dtype="?", fill=True)
        m.attrs["lamina_weird"] = np.float64(3)
        h = f.create_dataset("half", shape=(3, 3), dtype="f2", fill=np.nan)
        be = f.create_dataset("bigendian", shape=(4,), dtype=">f8", fill=0.5)
        u = f.create_dataset("counts", shape=(2, 2), dtype="u8", fill=2**64 - 1)
        s = f.create_dataset("scalar", shape=(), dtype="f8", fill=-3.0)
        f.create_dataset("never", shape=(3,), dtype="i4", fill=4)
        f.create_dataset("zero", shape=(0, 3), dtype="f8")
        with f.step():  # step 0
            t[0:4, :] = rng.standard_normal((4, 6))
            t[4:8, 0:3] = 2.0
            p[...] = rng.integers(-1000, 1000, (4, 3, 5))
            c[1:3, :] = rng.standard_normal((2, 4)) + 1j * rng.standard_normal((2, 4))
            m[0:2] = False
            h[1, :] = [1.5, np.nan, np.inf]
            be[:] = [1, 2, 3, 4]
            u[0, :] = np.array([0, 2**63 + 5], dtype=np.uint64)
            s[()] = 42.0
        with f.step():  # step 1: only a few datasets
            m[2:6] = [False, True, False, True]
            c[0:1, 0:2] = 5 - 5j
            t[2:6, 1:5] = np.nan
        with f.step():  # step 2: T everywhere, p partially in two blocks
            t[...] = np.arange(48, dtype=np.float32).reshape(8, 6)
            p[0:2, :, :] = 1
            p[2:4, 1:3, 0:2] = 2
    return path


def _eq(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _attrs_equal(x, y) -> None:
    assert sorted(x.attrs) == sorted(y.attrs)
    for k in x.attrs:
        va, vb = x.attrs[k], y.attrs[k]
        if isinstance(va, (str, list)):
            assert va == vb and type(va) is type(vb), k
        else:
            assert _eq(va, vb), (k, va, vb)


def assert_same_lamina(pa, pb) -> None:
    """Every node, attribute, dtype, fill, codec, step, block box and value is the same."""
    with lamina.open(pa) as a, lamina.open(pb) as b:
        assert a.steps == b.steps
        na, nb = list(a.walk()), list(b.walk())
        assert [p for p, _ in na] == [p for p, _ in nb]
        _attrs_equal(a, b)
        for (path, x), (_, y) in zip(na, nb, strict=True):
            assert type(x) is type(y), path
            _attrs_equal(x, y)
            if not isinstance(x, lamina.Dataset):
                continue
            assert x.shape == y.shape and x.dtype == y.dtype, path
            assert _eq(x.fill, y.fill), (path, x.fill, y.fill)
            assert x.compression == y.compression, path
            for k in range(a.steps):
                assert sorted(x.coverage(k), key=str) == sorted(y.coverage(k), key=str), (path, k)
                assert _eq(a.at(k)[path][...], b.at(k)[path][...]), (path, k)


@pytest.fixture
def sample(tmp_path):
    return make_sample(tmp_path / "run.lam")


# --------------------------------------------------------------------------
# lamina -> HDF5 -> lamina


def test_roundtrip_restores_everything(sample, tmp_path):
    h5 = tmp_path / "run.h5"
    back = tmp_path / "back.lam"
    r1 = hdf5.convert(sample, h5, progress=False)
    assert r1.direction == "lamina->hdf5" and r1.steps == 3 and r1.warnings == []
    r2 = hdf5.convert(h5, back, progress=False)
    assert r2.direction == "hdf5->lamina" and r2.source_kind == "lamina" and r2.warnings == []
    assert r1.blocks == r2.blocks and r1.nbytes == r2.nbytes
    assert_same_lamina(sample, back)
    with lamina.open(back) as f:  # spot checks on the restored file
        assert f["never"].coverage(0) == [] and f["never"][...].tolist() == [4, 4, 4]
        assert f["mask"].coverage(2) == [] and f.at(2)["mask"][...].tolist() == [True] * 6
        assert sorted(f["fields/deep/p"].coverage(2), key=str) == [
            Box((0, 0, 0), (2, 3, 5)),
            Box((2, 1, 0), (4, 3, 2)),
        ]
        assert f.attrs["lamina_user_note"].startswith("a user")
        assert float(f["mask"].attrs["lamina_weird"]) == 3.0
        assert f["scalar"].coverage(1) == [] and f.at(0)["scalar"][()] == 42.0
        assert f["counts"].dtype == np.uint64 and int(f.at(0)["counts"][0, 1]) == 2**63 + 5


def test_h5py_reads_identical_values(sample, tmp_path):
    h5 = tmp_path / "run.h5"
    hdf5.lamina_to_hdf5(sample, h5, progress=False)
    with lamina.open(sample) as f, h5py.File(h5, "r") as h:
        assert h.attrs["lamina_format"] == "lamina-hdf5"
        assert int(h.attrs["lamina_format_version"]) == 1
        assert int(h.attrs["lamina_steps"]) == f.steps
        np.testing.assert_array_equal(h.attrs["lamina_step_times"], f.engine.catalog.step_times)
        assert h.attrs["title"] == "sample run"
        assert list(h.attrs["names"]) == ["u", "v", "wé"]
        assert h.attrs["flags"].dtype == np.bool_
        assert "empty/nested" in h and isinstance(h["empty/nested"], h5py.Group)
        assert h["fields"].attrs["kind"] == "cell"
        # the reserved prefix is escaped
        assert (
            "lamina_user_lamina_user_note" in h.attrs
            and "lamina_user_lamina_weird" in h["mask"].attrs
        )
        for path, ds in f.walk():
            if not isinstance(ds, lamina.Dataset):
                continue
            hd = h[path]
            assert hd.dtype == ds.dtype, path
            assert hd.shape == (f.steps, *ds.shape), path
            assert hd.chunks == (1, *(max(1, n) for n in ds.shape)), path
            assert _eq(hd.fillvalue, ds.fill), path  # numpy scalars are native-endian
            rows = hd.attrs["lamina_blocks"]
            assert rows.shape == (sum(len(ds.coverage(k)) for k in range(f.steps)), 1 + 2 * ds.ndim)
            assert list(hd.attrs["lamina_steps_written"]) == [
                k for k in range(f.steps) if ds.coverage(k)
            ]
            for k in range(f.steps):
                assert _eq(hd[k], f.at(k)[path][...]), (path, k)
        assert h["fields/T"].attrs["units"] == "K"
        # mask[0:2] was not written in step 1: the fill value, True
        assert h["mask"][1].tolist() == [True, True, False, True, False, True]
        assert h["spectra/c"][1, 0, 0] == 5 - 5j


def test_h5dump_reads_the_file(sample, tmp_path):
    exe = shutil.which("h5dump")
    if exe is None:
        pytest.skip("h5dump not installed (apt-get install hdf5-tools)")
    h5 = tmp_path / "run.h5"
    hdf5.lamina_to_hdf5(sample, h5, progress=False)
    out = subprocess.run([exe, str(h5)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for name in ("fields", "deep", "spectra", "empty", "nested"):
        assert f'GROUP "{name}"' in text
    for name in ('"T"', '"p"', '"c"', '"mask"', '"bigendian"', '"counts"', '"scalar"', '"never"'):
        assert f"DATASET {name}" in text
    assert '"lamina-hdf5"' in text and 'ATTRIBUTE "lamina_blocks"' in text
    # step 2 of T is 0..47: h5dump prints the row (2,7,0) as 42..47
    t = subprocess.run(
        [exe, "-d", "/fields/T", "-s", "2,7,0", "-c", "1,1,6", str(h5)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert t.returncode == 0, t.stderr
    assert "42, 43, 44, 45, 46, 47" in t.stdout
    m = subprocess.run([exe, "-d", "/mask", str(h5)], capture_output=True, text=True, timeout=60)
    assert "TRUE, TRUE, FALSE, TRUE, FALSE, TRUE" in m.stdout
    b = subprocess.run(
        [exe, "-d", "/bigendian", str(h5)], capture_output=True, text=True, timeout=60
    )
    assert "H5T_IEEE_F64BE" in b.stdout and "1, 2, 3, 4" in b.stdout


def test_zero_steps_and_definitions_only(tmp_path):
    src = tmp_path / "defs.lam"
    with lamina.open(src, "w") as f:
        f.create_dataset("a/x", shape=(3, 2), dtype="i8", fill=5)
        f.attrs["only"] = "definitions"
    h5 = tmp_path / "defs.h5"
    hdf5.convert(src, h5, progress=False)
    with h5py.File(h5) as h:
        assert h["a/x"].shape == (0, 3, 2) and h["a/x"].attrs["lamina_blocks"].shape == (0, 5)
    back = tmp_path / "back.lam"
    hdf5.convert(h5, back, progress=False)
    assert_same_lamina(src, back)


def _derived_file(path) -> dict:
    """Three inputs, a quantity of each strategy over them, a multiresolution dataset; what a
    reader reads of each at each of two steps."""
    want: dict = {}
    with lamina.open(path, "w") as f:
        for c in "abc":
            f.create_dataset(c, (6, 4), "f8")
        for strategy in ("store", "stats", "expression"):
            f.derive(f"m_{strategy}", "magnitude(a, b, c)", strategy=strategy)
        mr = f.create_dataset("mr", (16, 16), "f8", layout=lamina.Multires(patch=8, tolerance=1e-3))
        for k in range(2):
            with f.step():
                for i, c in enumerate("abc"):
                    f[c][: 3 + k] = np.full((3 + k, 4), float(i + k))  # rows past it: fill
                mr[...] = np.add.outer(np.arange(16.0), np.arange(16.0)) * (k + 1)
    with lamina.open(path) as f:
        for name in (*(f"m_{s}" for s in ("store", "stats", "expression")), "mr"):
            want[name] = [f.at(k)[name][...] for k in range(2)]
    return want


def test_derived_quantities_and_layouts_export_their_values_with_warnings(tmp_path):
    """Every strategy exports the values a reader reads (a quantity kept as its expression
    was exported as fill), and a warning names what is written as plain data."""
    src = tmp_path / "d.lam"
    want = _derived_file(src)
    res = hdf5.convert(src, tmp_path / "d.h5", progress=False)
    with h5py.File(tmp_path / "d.h5") as h:
        for name, steps in want.items():
            for k, values in enumerate(steps):
                np.testing.assert_array_equal(h[name][k], values, err_msg=f"{name} {k}")
    text = "\n".join(res.warnings)
    for strategy in ("store", "stats", "expression"):
        assert (
            f"/m_{strategy}: derived quantity ('magnitude(a, b, c)', strategy '{strategy}')" in text
        )
    assert "/mr: multiresolution layout written at full resolution" in text
    assert len(res.warnings) == 4


def test_large_blocks_move_in_slabs(tmp_path, monkeypatch):
    monkeypatch.setattr(hdf5, "SLAB_BYTES", 100)  # force slabs of a few elements
    src = tmp_path / "big.lam"
    data = np.arange(10 * 7 * 3, dtype=np.float64).reshape(10, 7, 3)
    with lamina.open(src, "w") as f:
        d = f.create_dataset("d", shape=(10, 7, 3), dtype="f8", fill=-1)
        with f.step():
            d[1:9, :, :] = data[1:9]
    h5 = tmp_path / "big.h5"
    r = hdf5.convert(src, h5, progress=False)
    assert r.blocks == 1 and r.nbytes == data[1:9].nbytes
    with h5py.File(h5) as h:
        assert _eq(h["d"][0, 1:9], data[1:9]) and (h["d"][0, 0] == -1).all()
    back = tmp_path / "back.lam"
    hdf5.convert(h5, back, progress=False)
    assert_same_lamina(src, back)  # one block in, one block out


def test_split_box_and_chunk_shape():
    box = Box((2, 0, 0), (12, 7, 3))
    for limit in (8, 24, 100, 168, 10**6):
        pieces = hdf5.split_box(box, 8, limit)
        assert sum(p.size for p in pieces) == box.size
        assert all(p.size * 8 <= max(limit, 8) for p in pieces)
        assert all(box.contains(p) for p in pieces)
        cover = np.zeros((12, 7, 3), int)
        for p in pieces:
            cover[p.slices] += 1
        assert (cover[2:12] == 1).all() and (cover[:2] == 0).all()
    assert hdf5.split_box(Box((0,), (0,)), 8, 1) == [Box((0,), (0,))]
    assert hdf5.chunk_shape((100, 50), 8) == (1, 100, 50)
    assert hdf5.chunk_shape((0, 4), 8) == (1, 1, 4)
    assert hdf5.chunk_shape((), 8) == (1,)
    c = hdf5.chunk_shape((4096, 4096, 64), 8, 1 << 30)
    assert np.prod(c) * 8 <= 1 << 30 and c[0] == 1


def test_gzip_option(sample, tmp_path):
    h5 = tmp_path / "z.h5"
    hdf5.convert(sample, h5, progress=False, gzip=4)
    with h5py.File(h5) as h:
        assert h["fields/T"].compression == "gzip"
    back = tmp_path / "back.lam"
    hdf5.convert(h5, back, progress=False)
    assert_same_lamina(sample, back)
    with pytest.raises(hdf5.ConvertError):
        hdf5.convert(h5, tmp_path / "x.lam", gzip=4)
    with pytest.raises(hdf5.ConvertError):
        hdf5.convert(sample, tmp_path / "y.h5", gzip=12)


def test_lamina_compression_is_restored(tmp_path):
    try:
        import numcodecs  # noqa: F401
    except Exception as e:  # a broken numcodecs/zfpy install
        pytest.skip(f"numcodecs unusable here: {e}")
    src = tmp_path / "z.lam"
    with lamina.open(src, "w") as f:
        d = f.create_dataset("d", shape=(64, 64), dtype="f8", compression="zstd")
        with f.step():
            d[...] = np.zeros((64, 64))
    h5 = tmp_path / "z.h5"
    hdf5.convert(src, h5, progress=False)
    back = tmp_path / "back.lam"
    hdf5.convert(h5, back, progress=False)
    assert_same_lamina(src, back)
    with lamina.open(back) as f:
        assert f["d"].blocks(0)[0].codec != "raw"


# --------------------------------------------------------------------------
# plain HDF5 files


def test_plain_hdf5_becomes_one_step(tmp_path):
    src = tmp_path / "plain.h5"
    grid = np.arange(24, dtype=np.float32).reshape(4, 6)
    with h5py.File(src, "w") as h:
        h.attrs["fixed"] = np.bytes_(b"abc")
        h.attrs["strs"] = np.array([b"x", b"yy"])
        h.attrs["pi"] = 3.14
        h.attrs.create("nothing", data=h5py.Empty("f8"))
        g = h.create_group("g")
        d = g.create_dataset("grid", data=grid, chunks=(1, 6))
        d.attrs["units"] = "m"
        h.create_dataset("c", data=np.array([1 + 2j, -3j], dtype=np.complex64))
        h.create_dataset("b", data=np.array([True, False, True]))
        h.create_dataset("s", data=7, dtype="i8")
        h.create_dataset("unwritten", shape=(5,), dtype="u2", fillvalue=9)
        h.create_dataset("text", data="not numeric")
        h.create_dataset("rec", data=np.zeros(2, dtype=[("x", "i4"), ("y", "f4")]))
        h["alias"] = h5py.SoftLink("/g/grid")
        h["hard"] = h["c"]  # the same object under two names: converted once
    dst = tmp_path / "plain.lam"
    r = hdf5.convert(src, dst, progress=False)
    assert r.source_kind == "plain" and r.steps == 1
    text = "\n".join(r.warnings)
    assert "/text" in text and "/rec" in text and "soft link /alias" in text and "'nothing'" in text
    assert "skipped /hard: a hard link to the object at /c, converted once, as /c" in text
    with lamina.open(dst) as f:
        assert f.steps == 1
        assert (
            f.attrs["fixed"] == "abc"
            and f.attrs["strs"].tolist() == ["x", "yy"]
            and float(f.attrs["pi"]) == 3.14
        )
        assert "nothing" not in f.attrs
        assert _eq(f["g/grid"][...], grid) and f["g/grid"].attrs["units"] == "m"
        assert f["c"].dtype == np.complex64 and f["c"][...].tolist() == [1 + 2j, -3j]
        assert f["b"].dtype == np.bool_ and f["b"][...].tolist() == [True, False, True]
        assert f["s"].shape == () and f["s"][()] == 7
        assert f["unwritten"].coverage(0) == [] and f["unwritten"][...].tolist() == [9] * 5
        assert "text" not in f and "rec" not in f and "alias" not in f
        assert "c" in f and "hard" not in f


def test_plain_hdf5_large_dataset_in_slabs(tmp_path, monkeypatch):
    monkeypatch.setattr(hdf5, "SLAB_BYTES", 64)
    src = tmp_path / "p.h5"
    data = np.arange(60, dtype=np.int32).reshape(10, 6)
    with h5py.File(src, "w") as h:
        h["d"] = data
    dst = tmp_path / "p.lam"
    hdf5.convert(src, dst, progress=False)
    with lamina.open(dst) as f:
        assert len(f["d"].coverage(0)) > 1
        assert _eq(f["d"][...], data)


# --------------------------------------------------------------------------
# errors and destinations


def test_destinations_that_cannot_be_put_in_place_leave_nothing(
    sample, tmp_path, capsys, monkeypatch
):
    """An empty destination, an HDF5 destination ending with a slash, a rename that fails:
    a one-line error, and no temporary file left next to it."""
    from lamina import cli

    monkeypatch.chdir(tmp_path)
    for dst, text in (
        ("", "no destination given"),
        ("new.h5/", "ends with a slash"),
    ):
        assert cli.main(["convert", str(sample), dst, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1, err
    blocker = tmp_path / "taken.h5"
    blocker.mkdir()  # a directory where the file would go: the rename fails
    (blocker / "x").write_text("keep")
    with pytest.raises((hdf5.ConvertError, FileExistsError)):
        hdf5.convert(sample, blocker, overwrite=True, progress=False)
    leftovers = [p.name for p in tmp_path.iterdir() if ".partial-" in p.name]
    leftovers += [p.name for p in tmp_path.parent.iterdir() if ".partial-" in p.name]
    assert leftovers == [] and (blocker / "x").read_text() == "keep"


def test_a_name_lamina_refuses_is_a_convert_error(tmp_path, capsys):
    """A link named '..' (HDF5 allows it): one error naming the file and the dataset."""
    from lamina import cli

    src = tmp_path / "dots.h5"
    with h5py.File(src, "w") as h:
        h.create_dataset("..", data=np.arange(3))
    with pytest.raises(hdf5.ConvertError, match=r"dots\.h5.*dataset /\.\.: cannot create it"):
        hdf5.convert(src, tmp_path / "dots.lam", progress=False)
    assert cli.main(["convert", str(src), str(tmp_path / "dots.lam")]) == 2
    err = capsys.readouterr().err
    assert "dataset /..: cannot create it" in err and err.count("\n") == 1, err
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("note", "a\x00b", "attribute 'note' holds a string with a NUL"),
        ("tags", ["ok", "a\x00b"], "attribute 'tags' holds a string with a NUL"),
        ("a\x00b", 2, r"attribute 'a\\x00b' has a NUL character in its name"),
    ],
)
def test_attributes_hdf5_cannot_hold_are_a_convert_error(tmp_path, capsys, name, value, words):
    """A NUL in an attribute's string (HDF5's variable-length strings hold none) or in its
    name (HDF5 ends the name there, and the attribute overwrote 'a'): one error naming the
    object and the attribute, and no output (a traceback before, or 'a' silently lost)."""
    from lamina import cli

    src = tmp_path / "nul.lam"
    with lamina.open(src, "w") as f:
        d = f.create_dataset("g/T", shape=(2,), dtype="f4")
        d.attrs["a"] = 1
        d.attrs[name] = value
        with f.step():
            d[:] = 1
    with pytest.raises(hdf5.ConvertError, match=f"'/g/T': {words}"):
        hdf5.convert(src, tmp_path / "nul.h5", progress=False)
    assert cli.main(["convert", str(src), str(tmp_path / "nul.h5")]) == 2
    assert "'/g/T': attribute" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["nul.lam"]


def test_leftovers_of_killed_conversions_are_removed(sample, tmp_path):
    """A conversion removes the temporary copies that conversions to the same destination,
    killed on this host, left; not those of a live process, another host or another name."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stem = f".run.h5.partial-{hdf5._host()}-"
    stale, live = tmp_path / f"{stem}{dead.pid}", tmp_path / f"{stem}{os.getppid()}"
    other = f".x.h5.partial-{hdf5._host()}-{dead.pid}"
    keep = [live, tmp_path / ".run.h5.partial-otherhost-1", tmp_path / other]
    for p in (stale, *keep):
        p.mkdir()
    hdf5.convert(sample, tmp_path / "run.h5", progress=False)
    assert not stale.exists() and all(p.exists() for p in keep)


def test_existing_destination_needs_overwrite(sample, tmp_path):
    h5 = tmp_path / "run.h5"
    hdf5.convert(sample, h5, progress=False)
    with pytest.raises(FileExistsError, match="exists"):
        hdf5.convert(sample, h5, progress=False)
    hdf5.convert(sample, h5, progress=False, overwrite=True)
    back = tmp_path / "back.lam"
    hdf5.convert(h5, back, progress=False)
    hdf5.convert(h5, back, progress=False, overwrite=True)  # replaces a lamina directory
    other = tmp_path / "somedir"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not a lamina file"):
        hdf5.convert(h5, other, progress=False, overwrite=True)
    assert (other / "keep.txt").read_text() == "precious"
    # a file of another kind is never replaced either: not by HDF5, not by a lamina directory
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    for a, b, what in ((sample, notes, "not an HDF5 file"), (h5, notes, "not a lamina file")):
        with pytest.raises(FileExistsError, match=f"notes.txt' is {what}; not replacing it"):
            hdf5.convert(a, b, progress=False, overwrite=True)
    assert notes.read_text() == "precious"
    os.symlink(tmp_path / "nowhere.h5", tmp_path / "dangling.h5")
    with pytest.raises(FileExistsError, match="not an HDF5 file"):
        hdf5.convert(sample, tmp_path / "dangling.h5", progress=False, overwrite=True)
    with h5py.File(tmp_path / "ub.h5", "w", userblock_size=512) as h:
        h["x"] = 1  # HDF5 after a user block: still HDF5, replaced
    hdf5.convert(sample, tmp_path / "ub.h5", progress=False, overwrite=True)
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]


def test_source_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        hdf5.convert(tmp_path / "missing.lam", tmp_path / "x.h5")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a thing")
    with pytest.raises(hdf5.ConvertError, match="neither"):
        hdf5.convert(junk, tmp_path / "x.h5")
    with pytest.raises(lamina.NotALaminaFileError):
        hdf5.convert(tmp_path, tmp_path / "x.h5")  # a directory but not a lamina file
    h5 = tmp_path / "s.h5"
    hdf5.convert(make_sample(tmp_path / "s2.lam"), h5, progress=False)
    with pytest.raises(hdf5.ConvertError, match="the same file"):
        hdf5.convert(h5, h5, overwrite=True)
    assert h5.is_file()
    cut = tmp_path / "cut.h5"  # a copy cut short: HDF5's own message names no file
    cut.write_bytes(h5.read_bytes()[: h5.stat().st_size // 2])
    with pytest.raises(hdf5.ConvertError, match=r"cut\.h5': HDF5 cannot open it \(.*truncated"):
        hdf5.convert(cut, tmp_path / "cut.lam", progress=False)
    assert not (tmp_path / "cut.lam").exists()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        hdf5.convert(make_sample(tmp_path / "s.lam"), tmp_path / "no" / "dir" / "x.h5")


def test_corrupt_block_table_is_a_format_error(sample, tmp_path):
    h5 = tmp_path / "run.h5"
    hdf5.convert(sample, h5, progress=False)
    with h5py.File(h5, "a") as h:
        rows = h["fields/T"].attrs["lamina_blocks"]
        rows[0, 3] = 99  # stop beyond the shape
        h["fields/T"].attrs["lamina_blocks"] = rows
    dst = tmp_path / "back.lam"
    with pytest.raises(lamina.FormatError, match="does not fit"):
        hdf5.convert(h5, dst, progress=False)
    assert not dst.exists()
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]
    with h5py.File(h5, "a") as h:
        h["fields/T"].attrs["lamina_blocks"] = np.zeros((1, 3), dtype=np.int64)
    with pytest.raises(lamina.FormatError, match="shape"):
        hdf5.convert(h5, dst, progress=False)
    with h5py.File(h5, "a") as h:
        h.attrs["lamina_format_version"] = np.int64(99)
    with pytest.raises(lamina.FormatError, match="version 99"):
        hdf5.convert(h5, dst, progress=False)


def test_progress_bar_goes_to_stderr(sample, tmp_path, capsys):
    hdf5.convert(sample, tmp_path / "a.h5", progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "B" in err
    hdf5.convert(sample, tmp_path / "b.h5")  # auto: stderr is not a terminal under pytest
    out, err = capsys.readouterr()
    assert out == "" and err == ""


# --------------------------------------------------------------------------
# files that claim more than they hold: refused or bounded by what they hold


def _lamina_made_h5(path, steps: int, times: int | None = None) -> None:
    """A root that says 'lamina-made' with *steps* steps and *times* step times (None: none)."""
    with h5py.File(path, "w", libver=("v108", "v110")) as h:
        h.attrs["lamina_format"] = "lamina-hdf5"
        h.attrs["lamina_format_version"] = np.int64(1)
        h.attrs["lamina_steps"] = np.int64(steps)
        if times is not None:
            h.attrs["lamina_step_times"] = np.zeros(times)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("times", [None, 0, 3])
def test_step_count_must_match_the_step_times(tmp_path, times):
    """A 1 KiB file claiming 10^12 steps committed them one by one, for ever."""
    src = tmp_path / "steps.h5"
    _lamina_made_h5(src, 10**12, times)
    assert os.path.getsize(src) < 16384
    dst = tmp_path / "back.lam"
    with pytest.raises(lamina.FormatError, match="lamina_step") as info:
        hdf5.convert(src, dst, progress=False)
    assert "10" in str(info.value) and not dst.exists()


def _block_file(path, steps: int, blocks, times: bool = True) -> None:
    """A lamina-made file with one dataset 'd' of shape (steps, 4), step 3 written."""
    _lamina_made_h5(path, steps, steps if times else None)
    with h5py.File(path, "a") as h:
        d = h.create_dataset("d", shape=(steps, 4), maxshape=(None, 4), chunks=(1, 4), dtype="f8")
        d[3] = 1.0
        d.attrs["lamina_blocks"] = np.array(blocks, dtype=np.int64)
        d.attrs["lamina_compression"] = "[]"


@pytest.mark.timeout(60)
def test_blocks_must_lie_on_stored_chunks(tmp_path):
    """A step axis of 10^12 costs nothing in HDF5; a block table naming steps whose chunks were
    never written is refused instead of copying terabytes of fill values."""
    n = 10**12
    _block_file(tmp_path / "huge.h5", n, [[3, 0, 4], [n - 1, 0, 4]], times=False)
    with pytest.raises(lamina.FormatError, match="lamina_step_times is missing"):
        hdf5.convert(tmp_path / "huge.h5", tmp_path / "a.lam", progress=False)
    # with consistent steps, a block on chunks that were never written is refused
    _block_file(tmp_path / "five.h5", 5, [[3, 0, 4], [4, 1, 3]])
    with pytest.raises(lamina.FormatError, match=r"block \(1,\)..\(3,\) of step 4 is not stored"):
        hdf5.convert(tmp_path / "five.h5", tmp_path / "b.lam", progress=False)
    _block_file(tmp_path / "ok.h5", 5, [[3, 0, 4]])
    hdf5.convert(tmp_path / "ok.h5", tmp_path / "c.lam", progress=False)
    with lamina.open(tmp_path / "c.lam") as f:
        assert f.steps == 5 and f.at(3)["d"][...].tolist() == [1.0] * 4
        assert f["d"].coverage(4) == []


def test_lamina_made_file_with_a_repacked_layout_converts(sample, tmp_path):
    """Contiguous storage (h5repack -l CONTI) holds every block: converted as before."""
    h5 = tmp_path / "run.h5"
    hdf5.convert(sample, h5, progress=False)
    flat = tmp_path / "flat.h5"
    with h5py.File(h5) as a, h5py.File(flat, "w", libver=("v108", "v110")) as b:
        for k, v in a.attrs.items():
            b.attrs[k] = v

        def copy(name, obj):
            if isinstance(obj, h5py.Group):
                g = b.require_group(name)
                for k, v in obj.attrs.items():
                    g.attrs[k] = v
            else:
                d = b.create_dataset(name, data=obj[()], fillvalue=obj.fillvalue)  # contiguous
                for k, v in obj.attrs.items():
                    d.attrs[k] = v

        a.visititems(copy)
    back = tmp_path / "back.lam"
    hdf5.convert(flat, back, progress=False)
    assert_same_lamina(sample, back)


@pytest.mark.timeout(60)
def test_plain_dataset_copies_only_its_stored_chunks(tmp_path):
    """A plain chunked dataset of 10^12 rows with two chunks written: two blocks, not 8 TB."""
    src = tmp_path / "sparse.h5"
    with h5py.File(src, "w") as h:
        d = h.create_dataset("d", shape=(10**12, 4), chunks=(10, 4), dtype="f8", fillvalue=-1)
        d[5] = 1.0
        d[10**12 - 3 :, 1:3] = 2.0
    r = hdf5.convert(src, tmp_path / "s.lam", progress=False)
    assert r.blocks == 2 and r.nbytes == 2 * 10 * 4 * 8
    with lamina.open(tmp_path / "s.lam") as f:
        d = f["d"]
        assert sorted(d.coverage(0), key=str) == sorted(
            [Box((0, 0), (10, 4)), Box((10**12 - 10, 0), (10**12, 4))], key=str
        )
        assert d[4:6].tolist() == [[-1.0] * 4, [1.0] * 4]
        assert d[10**12 - 1].tolist() == [-1.0, 2.0, 2.0, -1.0]
        assert d[10**6].tolist() == [-1.0] * 4  # never written: the fill value


@pytest.mark.timeout(60)
def test_plain_external_and_virtual_datasets_are_bounded(tmp_path):
    """External storage on a device that never ends is skipped; a virtual dataset copies the
    regions it maps."""
    src = tmp_path / "ext.h5"
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.arange(6.0).tobytes())
    with h5py.File(src, "w") as h:
        if os.path.exists("/dev/zero"):
            h.create_dataset(
                "zero", shape=(10**12,), dtype="f8", external=[("/dev/zero", 0, h5py.h5f.UNLIMITED)]
            )
        # declared 800 bytes of a file that holds 48
        h.create_dataset("short", shape=(100,), dtype="f8", external=[(str(raw), 0, 800)])
        h.create_dataset("ok", shape=(6,), dtype="f8", external=[(str(raw), 0, 48)])
        base = h.create_dataset("base", data=np.arange(10.0))
        lay = h5py.VirtualLayout(shape=(10**12,), dtype="f8")
        lay[100:110] = h5py.VirtualSource(base)
        h.create_virtual_dataset("v", lay, fillvalue=-1)
    r = hdf5.convert(src, tmp_path / "e.lam", progress=False)
    text = "\n".join(r.warnings)
    assert "skipped dataset /short: its external files hold 48 of its 800 bytes" in text
    if os.path.exists("/dev/zero"):
        assert "skipped dataset /zero: its external file '/dev/zero'" in text
    with lamina.open(tmp_path / "e.lam") as f:
        assert "zero" not in f and "short" not in f
        assert f["ok"][...].tolist() == list(np.arange(6.0))
        assert f["v"].coverage(0) == [Box((100,), (110,))]
        assert f["v"][98:112].tolist() == [-1, -1, *range(10), -1, -1]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_virtual_datasets_that_hdf5_cannot_read_safely_are_skipped(tmp_path):
    """A mapping of a FIFO would block the read for ever; one of the dataset itself, or a
    loop of virtual datasets, crashes HDF5 (a segfault): each is skipped with a warning
    naming why; a mapping of another dataset of the file is copied."""
    src = tmp_path / "v.h5"
    os.mkfifo(tmp_path / "pipe.h5")
    with h5py.File(src, "w") as h:
        h["x"] = np.arange(4, dtype="i4")

        def virtual(name, source, path):
            lay = h5py.VirtualLayout(shape=(4,), dtype="i4")
            lay[:] = h5py.VirtualSource(source, path, shape=(4,))
            h.create_virtual_dataset(name, lay, fillvalue=-1)

        virtual("fifo", "pipe.h5", "x")
        virtual("self", ".", "self")
        virtual("named", "./v.h5", "named")  # (the file itself by its name: a segfault too)
        virtual("a", ".", "b")
        virtual("b", ".", "a")
        virtual("ok", ".", "x")
    r = hdf5.convert(src, tmp_path / "v.lam", progress=False)
    text = "\n".join(r.warnings)
    assert "skipped dataset /fifo: its source file" in text and "not a regular file" in text
    assert (
        "skipped dataset /self: it maps itself through a loop of virtual datasets (/self -> /self)"
        in text
    )
    assert "(/a -> /b -> /a)" in text and "(/b -> /a -> /b)" in text
    assert "skipped dataset /named: it maps itself through a loop of virtual datasets" in text
    with lamina.open(tmp_path / "v.lam") as f:
        assert sorted(f) == ["ok", "x"]
        assert f["ok"][...].tolist() == [0, 1, 2, 3]


@pytest.mark.timeout(120)
def test_a_long_chain_of_virtual_datasets_is_walked_once(tmp_path):
    """The walk recursed once per link (RecursionError past about 1000) and walked each
    dataset's chain again (600 links: minutes).  The chain passes a recursion limit lowered
    for the test (HDF5's own read of a chain of n links costs n^2: 1,500 took 14 s)."""
    src = tmp_path / "chain.h5"
    n = 600
    with h5py.File(src, "w") as h:
        h["d0"] = np.arange(4.0)
        for i in range(1, n):
            lay = h5py.VirtualLayout(shape=(4,), dtype="f8")
            lay[:] = h5py.VirtualSource(".", f"d{i - 1}", shape=(4,))
            h.create_virtual_dataset(f"d{i}", lay)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        r = hdf5.convert(src, tmp_path / "chain.lam", progress=False)
    finally:
        sys.setrecursionlimit(limit)
    assert r.datasets == n and not r.warnings
    with lamina.open(tmp_path / "chain.lam") as f:
        assert f[f"d{n - 1}"][...].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("direction", ["to-hdf5", "from-hdf5", "from-zarr"])
def test_conversion_on_several_ranks_says_it_runs_on_one(sample, tmp_path, direction):
    """From HDF5 or Zarr the destination's temporary name (of the rank's pid) made the ranks
    disagree on the open: the error spoke of a collective call's arguments."""
    import mpi_util

    if direction == "to-hdf5":
        src, dst = sample, tmp_path / "out.h5"
    elif direction == "from-hdf5":
        src, dst = tmp_path / "in.h5", tmp_path / "out.lam"
        hdf5.convert(sample, src, progress=False)
    else:
        pytest.importorskip("zarr")
        from lamina import omezarr

        src, dst = tmp_path / "in.zarr", tmp_path / "out.lam"
        omezarr.convert(sample, src, progress=False)
    cmd = [
        mpi_util.mpiexec(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "lamina",
        "convert",
        str(src),
        str(dst),
    ]
    res = mpi_util.finish(mpi_util.start(cmd), cmd, 100)
    assert res.returncode != 0, res.describe()
    assert "conversion runs on one rank; it was started on 2 (run it without mpiexec)" in res.stderr
    assert "disagree" not in res.stderr and "Traceback" not in res.stderr
    assert not dst.exists() and not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_large_attribute_is_skipped_unread(tmp_path):
    src = tmp_path / "attr.h5"
    with h5py.File(src, "w", libver=("v108", "v110")) as h:
        h.attrs["big"] = np.zeros(200_000)  # 1.6 MB: more than a lamina attribute holds
        h.attrs["small"] = 1
    r = hdf5.convert(src, tmp_path / "a.lam", progress=False)
    assert any("'big'" in w and "1600000 bytes, more than" in w for w in r.warnings), r.warnings
    with lamina.open(tmp_path / "a.lam") as f:
        assert "big" not in f.attrs and int(f.attrs["small"]) == 1


def test_deeply_nested_compression_attribute_is_a_format_error(sample, tmp_path):
    h5 = tmp_path / "run.h5"
    hdf5.convert(sample, h5, progress=False)
    with h5py.File(h5, "a") as h:
        h["fields/T"].attrs["lamina_compression"] = "[" * 2000 + "]" * 2000
    with pytest.raises(lamina.FormatError, match="lamina_compression: .*nested 2000 levels"):
        hdf5.convert(h5, tmp_path / "back.lam", progress=False)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_source_is_refused(tmp_path):
    fifo = tmp_path / "in.h5"
    os.mkfifo(fifo)
    with pytest.raises(hdf5.ConvertError, match="not a regular file"):
        hdf5.convert(fifo, tmp_path / "x.lam")


def test_enum_values_are_kept_and_an_attribute_s_labels_named_as_dropped(tmp_path):
    """An enum dataset keeps its labels (hdf5_enum), an enum attribute only its values:
    a warning names the labels dropped; bool, h5py's own enum, is bool."""
    src = tmp_path / "enum.h5"
    color = h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 2}, basetype="u1")
    with h5py.File(src, "w") as h:
        d = h.create_dataset("color", data=np.array([0, 1, 2], dtype="u1"), dtype=color)
        d.attrs.create("state", data=np.array(1, dtype="u1"), dtype=color)
        d.attrs["hdf5_enum"] = "the type's labels take its place"
        h.create_dataset("flag", data=np.array([True, False]))  # bool: h5py's own enum, kept
        h["flag"].attrs["hdf5_enum"] = "kept: no enum takes its place"
    r = hdf5.convert(src, tmp_path / "enum.lam", progress=False)
    at_warn = [w for w in r.warnings if w.startswith("attribute 'state' of /color:")]
    for w in at_warn:
        assert "RED=0, GREEN=1, BLUE=2" in w and "uint8 values" in w
        assert "labels are dropped" in w
    assert len(at_warn) == 1, r.warnings
    skipped = (
        "skipped attribute 'hdf5_enum' of /color: the name holds the labels of its HDF5 enum type"
    )
    assert sorted(r.warnings) == sorted([at_warn[0], skipped]), r.warnings
    with lamina.open(tmp_path / "enum.lam") as f:
        assert f["color"].dtype == np.uint8 and f["color"][...].tolist() == [0, 1, 2]
        assert f["color"].attrs["state"] == 1 and f["flag"].dtype == np.bool_
        assert f["color"].attrs["hdf5_enum"] == '{"RED": 0, "GREEN": 1, "BLUE": 2}'
        assert f["flag"].attrs["hdf5_enum"] == "kept: no enum takes its place"


def test_hard_link_back_to_the_root_is_named_in_a_warning(tmp_path):
    src = tmp_path / "loop.h5"
    with h5py.File(src, "w") as h:
        h.create_dataset("x", data=np.arange(3))
        h["loop/up"] = h["/"]  # the root group under a second name
    r = hdf5.convert(src, tmp_path / "loop.lam", progress=False)
    assert "skipped /loop/up: a hard link to the object at /, converted once, as /" in r.warnings
    with lamina.open(tmp_path / "loop.lam") as f:
        assert "loop" in f and "up" not in f["loop"] and f["x"][...].tolist() == [0, 1, 2]


def test_variable_length_strings_not_utf8_are_decoded_like_fixed_length_ones(tmp_path):
    src = tmp_path / "vlen.h5"
    ascii_vlen = h5py.string_dtype("ascii")
    with h5py.File(src, "w") as h:
        h.attrs.create("tag", data=np.array([b"ok", b"\xff"], dtype=object), dtype=ascii_vlen)
        h.attrs.create("one", data=np.array(b"caf\xe9", dtype=object), dtype=ascii_vlen)
        h.attrs.create("utf8", data=np.array("café".encode(), dtype=object), dtype=ascii_vlen)
        h.attrs["fixed"] = np.bytes_(b"caf\xe9")
    r = hdf5.convert(src, tmp_path / "vlen.lam", progress=False)
    assert r.warnings == []
    with lamina.open(tmp_path / "vlen.lam") as f:
        assert f.attrs["tag"].tolist() == ["ok", "\xff"]  # not UTF-8: Latin-1
        assert f.attrs["one"] == f.attrs["fixed"] == "café"
        assert f.attrs["utf8"] == "café"


def test_empty_string_array_attribute_is_skipped_for_its_real_reason(tmp_path):
    src = tmp_path / "empty.h5"
    with h5py.File(src, "w") as h:
        d = h.create_dataset("d", data=np.arange(2))
        d.attrs["none"] = np.array([], dtype=h5py.string_dtype("ascii"))
        d.attrs["fixed"] = np.array([], dtype="S3")
        d.attrs["grid"] = np.array([[b"a", b"b"]])
    r = hdf5.convert(src, tmp_path / "empty.lam", progress=False)
    for name in ("none", "fixed"):
        (w,) = [w for w in r.warnings if f"attribute {name!r} of /d" in w]
        assert "an empty array of strings: lamina keeps no empty list of strings" in w
        assert "(0,)" not in w
    (w,) = [w for w in r.warnings if "attribute 'grid' of /d" in w]
    assert "a string array of shape (1, 2) (lamina keeps 1-D lists of strings)" in w
    with lamina.open(tmp_path / "empty.lam") as f:
        assert sorted(f["d"].attrs) == []


def test_enum_labels_come_back_to_hdf5_through_lamina(tmp_path):
    """An HDF5 enum dataset converted to lamina keeps its labels in the dataset's attribute
    ``hdf5_enum`` (JSON, label -> value), and converted back to HDF5 it is the same enum
    again, as h5py sees it; a lamina-made HDF5 file converted back keeps them too."""
    labels = {"RED": 0, "GREEN": 1, "BLUE": 200, "dark blue": 3}
    src = tmp_path / "enum.h5"
    with h5py.File(src, "w") as h:
        color = h5py.enum_dtype(labels, basetype="u1")
        h.create_dataset("g/color", data=np.array([0, 1, 200, 3], dtype="u1"), dtype=color)
        big = h5py.enum_dtype({"LOW": -(2**40), "HIGH": 2**40}, basetype="<i8")
        h.create_dataset("level", data=np.array([2**40, -(2**40)]), dtype=big)
    r = hdf5.convert(src, tmp_path / "enum.lam", progress=False)
    assert not any("color" in w or "level" in w for w in r.warnings), r.warnings
    with lamina.open(tmp_path / "enum.lam") as f:
        assert f["g/color"].dtype == np.uint8 and f["g/color"][...].tolist() == [0, 1, 200, 3]
        assert json.loads(f["g/color"].attrs["hdf5_enum"]) == labels
        assert json.loads(f["level"].attrs["hdf5_enum"]) == {"LOW": -(2**40), "HIGH": 2**40}
    r = hdf5.convert(tmp_path / "enum.lam", tmp_path / "again.h5", progress=False)
    assert not r.warnings, r.warnings
    with h5py.File(tmp_path / "again.h5", "r") as h:
        d = h["g/color"]
        assert h5py.check_enum_dtype(d.dtype) == labels
        assert d.dtype == np.uint8 and d[0].tolist() == [0, 1, 200, 3]
        assert "hdf5_enum" not in d.attrs  # the labels are the dataset's type again
        assert h5py.check_enum_dtype(h["level"].dtype) == {"LOW": -(2**40), "HIGH": 2**40}
    hdf5.convert(tmp_path / "again.h5", tmp_path / "back.lam", progress=False)
    with lamina.open(tmp_path / "back.lam") as f:
        assert json.loads(f["g/color"].attrs["hdf5_enum"]) == labels
        assert f["g/color"][...].tolist() == [0, 1, 200, 3]


def test_an_hdf5_enum_attribute_that_is_no_enum_of_its_dataset_is_copied_as_it_is(tmp_path):
    """A lamina dataset's ``hdf5_enum`` that is not labels of integers its dtype holds is
    written as a plain attribute (a warning says why) over a plain dataset."""
    path = tmp_path / "x.lam"
    cases = {
        "floats": ("f4", '{"A": 0}'),
        "range": ("u1", '{"A": 0, "B": 256}'),
        "text": ("i2", "not JSON"),
        "list": ("i2", "[1, 2]"),
        "value": ("i2", '{"A": 1.5}'),
        "same": ("i2", '{"A": 1, "B": 1}'),
        "none": ("i2", "{}"),
        "nonstr": ("i2", ["a", "b"]),
    }
    with lamina.open(path, "w", durable=False) as f:
        for name, (dt, value) in cases.items():
            f.create_dataset(name, (2,), dt).attrs["hdf5_enum"] = value
        with f.step():
            for name, (dt, _) in cases.items():
                f[name][...] = np.array([1, 0], dtype=dt)
    r = hdf5.convert(path, tmp_path / "x.h5", progress=False)
    for name in cases:
        assert any(w.startswith(f"dataset /{name}: attribute 'hdf5_enum'") for w in r.warnings), (
            name,
            r.warnings,
        )
    with h5py.File(tmp_path / "x.h5", "r") as h:
        for name, (_, value) in cases.items():
            assert h5py.check_enum_dtype(h[name].dtype) is None, name
            got = h[name].attrs["hdf5_enum"]
            assert (list(got) if isinstance(value, list) else got) == value, name
