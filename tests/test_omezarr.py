"""OME-Zarr interchange: lamina -> OME-Zarr read by zarr-python alone, back to lamina, foreign stores, the CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import lamina
from lamina import cli, hdf5, omezarr
from lamina.errors import FormatError
from lamina.hdf5 import ConvertError

zarr = pytest.importorskip("zarr")

TOL = 1e-3
SHAPE = (40, 36, 20)


def make_sample(path) -> str:
    """Two steps: a multires T (patch 16; part of it written in step 0), a plain 2-D p in a group, a 0-D s."""
    path = str(path)
    rng = np.random.default_rng(3)
    z, y, x = np.meshgrid(*(np.linspace(0, 1, n) for n in SHAPE), indexing="ij")
    smooth = np.sin(3 * z) * np.cos(2 * y) + x
    with lamina.open(path, "w") as f:
        f.attrs["title"] = "sample"
        f.attrs["grid"] = np.arange(6, dtype=np.uint16).reshape(2, 3)
        f.attrs["z"] = np.complex64(1 - 2j)
        f.attrs["bad"] = np.float32(np.nan)
        f.attrs["names"] = ["u", "v"]
        f.attrs["multiscales"] = "a user attribute of a reserved name"
        t = f.create_dataset(
            "T", SHAPE, "f4", fill=np.nan, layout=lamina.Multires(patch=16, tolerance=TOL)
        )
        t.attrs["units"] = "K"
        g = f.create_group("fields")
        g.attrs["kind"] = "cell"
        p = f.create_dataset("fields/p", (30, 25), "i2", fill=-7, compression="zstd")
        s = f.create_dataset("s", (), "f8", fill=-3.0)
        with f.step():
            t[0:20] = (smooth[0:20] + 0.01 * rng.standard_normal((20, *SHAPE[1:]))).astype("f4")
            t[20:40, 0:16] = 1.5
            p[0:10] = rng.integers(-100, 100, (10, 25))
            s[()] = 42.0
        with f.step():
            t[...] = (2 * smooth + 0.01 * rng.standard_normal(SHAPE)).astype("f4")
            p[5:30, 3:7] = 3
    return path


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> str:
    return make_sample(tmp_path_factory.mktemp("omezarr") / "run.lam")


@pytest.fixture(scope="module")
def store(sample, tmp_path_factory) -> tuple[str, omezarr.ConvertResult]:
    dst = str(tmp_path_factory.mktemp("omezarr-out") / "run.zarr")
    return dst, omezarr.convert(sample, dst, progress=False)


# --------------------------------------------------------------------------
# lamina -> OME-Zarr, read with zarr-python alone


def test_multiscales_metadata(sample, store):
    dst, res = store
    assert res.direction == "lamina->zarr" and res.datasets == 3 and res.groups == 1
    assert res.steps == 2 and res.nbytes > 0
    assert any("/s has 0 dimensions" in w for w in res.warnings)
    with open(os.path.join(dst, "T", ".zattrs")) as fh:  # zarr format 2 on disk
        attrs = json.load(fh)
    assert os.path.isfile(os.path.join(dst, ".zgroup"))
    (ms,) = attrs["multiscales"]
    assert ms["version"] == "0.4" and ms["name"] == "T"
    assert ms["axes"] == [
        {"name": "t", "type": "time"},
        {"name": "z", "type": "space"},
        {"name": "y", "type": "space"},
        {"name": "x", "type": "space"},
    ]
    with lamina.open(sample) as f:
        nlevels = len(f["T"].levels)
    assert nlevels == 5
    assert [d["path"] for d in ms["datasets"]] == ["0", "1", "2", "3", "4"]
    for k, d in enumerate(ms["datasets"]):
        assert d["coordinateTransformations"] == [{"type": "scale", "scale": [1] + [2**k] * 3}]
    lm = attrs["lamina"]
    assert lm["layout"]["patch"] == [16, 16, 16] and lm["layout"]["tolerance"] == TOL
    assert lm["dtype"] == "<f4" and lm["shape"] == list(SHAPE)
    assert attrs["units"] == "K"
    root = zarr.open_group(dst, mode="r")
    assert root.attrs["lamina"]["steps"] == 2 and len(root.attrs["lamina"]["step_times"]) == 2
    assert root.attrs["title"] == "sample" and root.attrs["names"] == ["u", "v"]
    assert root.attrs["lamina_user_multiscales"].startswith("a user")
    assert root.attrs["bad"] == "NaN"  # JSON has no NaN: written as zarr writes fill values
    p = zarr.open_group(dst, mode="r")["fields/p"]
    (pms,) = p.attrs["multiscales"]
    assert [a["name"] for a in pms["axes"]] == ["t", "y", "x"] and len(pms["datasets"]) == 1
    assert zarr.open_group(dst, mode="r")["fields"].attrs["kind"] == "cell"


def test_levels_equal_lamina_reads(sample, store):
    dst, _ = store
    root = zarr.open_group(dst, mode="r")
    with lamina.open(sample) as f:
        t = f["T"]
        for k, shape in enumerate(t.levels):
            a = root["T"][str(k)]
            assert a.shape == (2, *shape) and a.dtype == np.float32
            assert a.chunks == (1, *(16 >> k,) * 3)
            for step in range(2):
                np.testing.assert_array_equal(a[step], f.at(step)["T"].level(k)[...])
        p = root["fields/p"]["0"]
        assert p.fill_value == -7 and p.dtype == np.int16
        for step in range(2):
            np.testing.assert_array_equal(p[step], f.at(step)["fields/p"][...])
            assert root["s"]["0"][step] == f.at(step)["s"][()]
    # patches never written store no chunk: they read as the fill value
    assert not os.path.exists(os.path.join(dst, "T", "0", "0", "2", "1", "0"))
    assert os.path.exists(os.path.join(dst, "T", "0", "0", "2", "0", "0"))


def test_round_trip(sample, store, tmp_path):
    dst, _ = store
    back = tmp_path / "back.lam"
    res = omezarr.convert(dst, back, progress=False)
    assert res.direction == "zarr->lamina" and res.source_kind == "lamina"
    assert res.datasets == 3 and res.steps == 2 and res.warnings == []
    with lamina.open(sample) as a, lamina.open(back) as b:
        assert [p for p, _ in a.walk()] == [p for p, _ in b.walk()]
        assert b["T"].layout == a["T"].layout
        assert b["T"].layout.patch == (16, 16, 16) and b["T"].layout.tolerance == TOL
        assert b["fields/p"].compression == a["fields/p"].compression
        assert b["fields/p"].fill == -7 and np.isnan(b["T"].fill)
        for k in range(2):
            assert sorted(map(str, a["T"].coverage(k))) == sorted(map(str, b["T"].coverage(k)))
            for level in range(len(a["T"].levels)):
                x = a.at(k)["T"].level(level)[...]
                y = b.at(k)["T"].level(level)[...]
                np.testing.assert_array_equal(np.isnan(x), np.isnan(y))
                assert np.nanmax(np.abs(x - y)) <= TOL * (1 + 1e-6)
            np.testing.assert_array_equal(a.at(k)["fields/p"][...], b.at(k)["fields/p"][...])
            assert a.at(k)["s"][()] == b.at(k)["s"][()]
        for name in a.attrs:
            v, w = a.attrs[name], b.attrs[name]
            assert np.asarray(v).dtype == np.asarray(w).dtype, name
            np.testing.assert_array_equal(np.asarray(v), np.asarray(w))
        assert b["T"].attrs["units"] == "K" and b["fields"].attrs["kind"] == "cell"


# --------------------------------------------------------------------------
# OME-Zarr stores not made by lamina


def _foreign(path, fmt: int, axes, shape, levels: int = 2, time_written=None):
    """An image at /img of a store of Zarr format *fmt* (2: NGFF 0.4, 3: NGFF 0.5)."""
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    root.attrs["origin"] = "microscope"
    img = root.create_group("img")
    rng = np.random.default_rng(1)
    data = rng.random(shape).astype("f4")
    kw = {"chunk_key_encoding": {"name": "v2", "separator": "/"}} if fmt == 2 else {}
    for k in range(levels):
        sl = tuple(
            slice(None, None, 2**k) if a.get("type") == "space" else slice(None) for a in axes
        )
        lvl = data[sl]
        chunks = tuple(
            1 if a.get("type") == "time" else n for a, n in zip(axes, lvl.shape, strict=True)
        )
        arr = img.create_array(str(k), shape=lvl.shape, chunks=chunks, dtype="f4", **kw)
        if time_written is None:
            arr[...] = lvl
        else:
            arr[:time_written] = lvl[:time_written]
    ms = {
        "name": "img",
        "axes": axes,
        "datasets": [
            {
                "path": str(k),
                "coordinateTransformations": [
                    {
                        "type": "scale",
                        "scale": [2.0**k if a.get("type") == "space" else 1.0 for a in axes],
                    }
                ],
            }
            for k in range(levels)
        ],
    }
    if fmt == 2:
        img.attrs["multiscales"] = [{"version": "0.4", **ms}]
    else:
        img.attrs["ome"] = {"version": "0.5", "multiscales": [ms]}
    img.attrs["pixel"] = 0.5
    img.attrs["omero"] = {"channels": []}
    return data


T, Z, Y, X = (
    {"name": "t", "type": "time"},
    {"name": "z", "type": "space"},
    {"name": "y", "type": "space"},
    {"name": "x", "type": "space"},
)


@pytest.mark.parametrize("fmt", [2, 3])
def test_foreign_time_series(tmp_path, fmt):
    src = tmp_path / "cells.zarr"
    data = _foreign(src, fmt, [T, Z, Y, X], (3, 6, 5, 4))
    res = omezarr.convert(src, tmp_path / "cells.lam", progress=False)
    assert res.source_kind == "plain" and res.steps == 3 and res.datasets == 1
    assert any("coarser levels of its pyramid are not kept" in w for w in res.warnings)
    with lamina.open(tmp_path / "cells.lam") as f:
        ds = f["img"]
        assert ds.shape == (6, 5, 4) and ds.layout is None and f.steps == 3
        for k in range(3):
            np.testing.assert_array_equal(f.at(k)["img"][...], data[k])
        assert f.attrs["origin"] == "microscope" and ds.attrs["pixel"] == 0.5
        assert "omero" not in ds.attrs


def test_empty_numeric_attributes_round_trip(tmp_path):
    """Attributes of no values (int, bool, complex, 2-D) come back with their dtype and shape
    (they were dropped, with a warning that [] is not integers)."""
    src, back = tmp_path / "a.lam", tmp_path / "b.lam"
    want = {
        "i": np.zeros(0, np.int32),
        "b": np.zeros(0, bool),
        "c": np.zeros(0, np.complex64),
        "f": np.zeros((2, 0), np.float32),
    }
    with lamina.open(src, "w") as f:
        for k, v in want.items():
            f.attrs[k] = v
    _there_and_back(src, back)
    with lamina.open(back) as f:
        for k, v in want.items():
            got = f.attrs[k]
            assert got.dtype == v.dtype and got.shape == v.shape, k


def _there_and_back(src, back) -> None:
    """*src* to OME-Zarr (next to it) and back to *back*, without a warning either way."""
    store = os.path.join(os.path.dirname(src), "there.zarr")
    r1 = omezarr.convert(src, store, progress=False)
    r2 = omezarr.convert(store, back, progress=False)
    assert r1.warnings == [] and r2.warnings == []


def test_derived_quantities_export_their_values_with_warnings(tmp_path):
    """Every strategy exports the values a reader reads (a quantity kept as its expression
    was exported as fill), a warning names each; a multiresolution dataset keeps its levels."""
    import test_hdf5

    src = tmp_path / "d.lam"
    want = test_hdf5._derived_file(src)
    res = omezarr.convert(src, tmp_path / "d.zarr", progress=False)
    with lamina.open(src) as f:
        levels = [f.at(k)["mr"].level(1)[...] for k in range(2)]
    z = zarr.open(str(tmp_path / "d.zarr"), mode="r")
    for name, steps in want.items():
        for k, values in enumerate(steps):
            np.testing.assert_array_equal(z[f"{name}/0"][k], values, err_msg=f"{name} {k}")
    for k in range(2):
        np.testing.assert_array_equal(z["mr/1"][k], levels[k])
    assert len(res.warnings) == 3
    assert all("derived quantity" in w for w in res.warnings)


@pytest.mark.parametrize("fmt", [2, 3])
def test_foreign_one_step_and_root_image(tmp_path, fmt):
    src = tmp_path / "plane.zarr"
    data = _foreign(src, fmt, [Y, X], (7, 9), levels=1)
    res = omezarr.convert(src, tmp_path / "plane.lam", progress=False)
    assert res.steps == 1 and not any("pyramid" in w for w in res.warnings)
    with lamina.open(tmp_path / "plane.lam") as f:
        np.testing.assert_array_equal(f["img"][...], data)
    # a store that is one image: the dataset is named after the store
    one = tmp_path / "one.zarr"
    g = zarr.open_group(str(one), mode="w", zarr_format=fmt)
    g.create_array("s0", shape=(4, 4), chunks=(2, 2), dtype="u2")[...] = np.arange(16).reshape(4, 4)
    ms = {"axes": [Y, X], "datasets": [{"path": "s0"}]}
    if fmt == 2:
        g.attrs["multiscales"] = [{"version": "0.4", **ms}]
    else:
        g.attrs["ome"] = {"version": "0.5", "multiscales": [ms]}
    omezarr.convert(one, tmp_path / "one.lam", progress=False)
    with lamina.open(tmp_path / "one.lam") as f:
        assert f["one"].dtype == np.uint16
        np.testing.assert_array_equal(f["one"][...], np.arange(16).reshape(4, 4))


def test_foreign_singleton_channel_and_unwritten_time(tmp_path):
    src = tmp_path / "c.zarr"
    c = {"name": "c", "type": "channel"}
    data = _foreign(src, 2, [T, c, Y, X], (5, 1, 4, 3), levels=1, time_written=2)
    res = omezarr.convert(src, tmp_path / "c.lam", progress=False)
    assert any("'c' of type 'channel' (length 1) is dropped" in w for w in res.warnings)
    assert any("time points 2 to 4 hold no stored data" in w for w in res.warnings)
    with lamina.open(tmp_path / "c.lam") as f:
        assert f.steps == 2 and f["img"].shape == (4, 3)
        np.testing.assert_array_equal(f.at(1)["img"][...], data[1, 0])


def _bad(tmp_path, axes, shape, name="bad.zarr"):
    src = tmp_path / name
    _foreign(src, 2, axes, shape, levels=1)
    return src


def test_bad_inputs(tmp_path):
    # no multiscales anywhere
    src = tmp_path / "plain.zarr"
    zarr.open_group(str(src), mode="w", zarr_format=2).create_array("a", shape=(3,), dtype="i4")
    with pytest.raises(ConvertError, match=r"plain\.zarr.*holds no OME-Zarr image"):
        omezarr.convert(src, tmp_path / "x.lam")
    # axes that do not match the array
    src = tmp_path / "axes.zarr"
    _foreign(src, 2, [Y, X], (4, 4), levels=1)
    attrs = zarr.open_group(str(src), mode="a")["img"].attrs
    attrs["multiscales"] = [{"version": "0.4", "axes": [Z, Y, X], "datasets": [{"path": "0"}]}]
    with pytest.raises(ConvertError, match=r"axes\.zarr.*image /img.*3 axes.*2 dimensions"):
        omezarr.convert(src, tmp_path / "x.lam")
    # more than 3 space axes
    w = {"name": "w", "type": "space"}
    with pytest.raises(ConvertError, match=r"bad4\.zarr.*4 space axes"):
        omezarr.convert(_bad(tmp_path, [w, Z, Y, X], (2, 2, 2, 2), "bad4.zarr"), tmp_path / "x.lam")
    # a channel axis of several channels
    c = {"name": "c", "type": "channel"}
    with pytest.raises(ConvertError, match=r"chan\.zarr.*axis 'c' of type 'channel' has 3"):
        omezarr.convert(_bad(tmp_path, [c, Y, X], (3, 4, 4), "chan.zarr"), tmp_path / "x.lam")
    # a dataset path that is not an array
    src = tmp_path / "path.zarr"
    _foreign(src, 2, [Y, X], (4, 4), levels=1)
    attrs = zarr.open_group(str(src), mode="a")["img"].attrs
    attrs["multiscales"] = [{"version": "0.4", "axes": [Y, X], "datasets": [{"path": "nope"}]}]
    with pytest.raises(ConvertError, match=r"path\.zarr.*'nope'.*not an array"):
        omezarr.convert(src, tmp_path / "x.lam")
    assert not os.path.exists(tmp_path / "x.lam")
    # HDF5 to OME-Zarr directly, gzip for Zarr, Zarr to Zarr
    with pytest.raises(ConvertError, match="gzip applies to HDF5 output only"):
        omezarr.convert(src, tmp_path / "y.lam", gzip=3)


def _image(path, shape, axes, fmt: int = 2, **kw):
    """A store that is one image (array "0" of *shape*); returns the array."""
    g = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    a = g.create_array("0", shape=shape, **kw)
    ms = {"axes": axes, "datasets": [{"path": "0"}]}
    if fmt == 2:
        g.attrs["multiscales"] = [{"version": "0.4", **ms}]
    else:
        g.attrs["ome"] = {"version": "0.5", "multiscales": [ms]}
    return a


def test_foreign_null_fill_reads_as_zarr_reads(tmp_path):
    """fill_value null (Zarr format 2): the chunks not stored read as 0, as zarr-python reads them."""
    src = tmp_path / "fn.zarr"
    a = _image(src, (4, 4), [Y, X], dtype="f4", chunks=(2, 2), fill_value=None)
    a[:2, :2] = 1
    omezarr.convert(src, tmp_path / "fn.lam", progress=False)
    with lamina.open(tmp_path / "fn.lam") as f:
        assert f["fn"].fill == 0
        np.testing.assert_array_equal(f["fn"][...], zarr.open_array(str(src / "0"))[...])


def test_foreign_chunks_behind_symlinks(tmp_path):
    """Chunk directories reached through a symlink are read (as zarr reads them); a link back
    to a directory already listed (a loop) is not followed, with a warning."""
    src = tmp_path / "sym.zarr"
    enc = {"name": "v2", "separator": "/"}
    a = _image(src, (4, 4), [Y, X], dtype="f4", chunks=(2, 2), chunk_key_encoding=enc)
    want = np.arange(16.0).reshape(4, 4) + 1
    a[...] = want
    os.rename(src / "0" / "1", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", src / "0" / "1")
    os.symlink(src / "0", tmp_path / "elsewhere" / "loop")
    res = omezarr.convert(src, tmp_path / "sym.lam", progress=False)
    assert res.warnings == [
        "array /0: directory '1/loop' is a link to a directory already "
        "listed: its chunks are not read again"
    ]
    with lamina.open(tmp_path / "sym.lam") as f:
        np.testing.assert_array_equal(f["sym"][...], want)


def test_foreign_time_chunk_is_decoded_once(tmp_path, monkeypatch):
    """A chunk spanning many time points is read for several steps at once (as many as
    CACHE_BYTES holds), not once per step."""
    src = tmp_path / "tc.zarr"
    t = 40
    a = _image(src, (t, 8, 8), [T, Y, X], dtype="f4", chunks=(t, 8, 8), fill_value=0)
    want = np.random.default_rng(0).random((t, 8, 8)).astype("f4")
    a[...] = want
    reads = []
    getitem = zarr.Array.__getitem__

    def counted(self, sel):
        reads.append(sel)
        return getitem(self, sel)

    monkeypatch.setattr(zarr.Array, "__getitem__", counted)
    for cache, n in ((omezarr.CACHE_BYTES, 1), (10 * 8 * 8 * 4, 4)):
        monkeypatch.setattr(omezarr, "CACHE_BYTES", cache)
        reads.clear()
        res = omezarr.convert(src, tmp_path / "tc.lam", overwrite=True, progress=False)
        assert res.steps == t and len(reads) == n, reads
        with lamina.open(tmp_path / "tc.lam") as f:
            for k in (0, 9, 10, 39):
                np.testing.assert_array_equal(f.at(k)["tc"][...], want[k])


def test_foreign_far_time_point_is_refused(tmp_path, monkeypatch):
    """Steps holding no stored data still commit: more than MAX_EMPTY_STEPS of them (one time
    point far along the time axis) are refused before anything is written; fewer convert, each
    time point the step of its index."""
    monkeypatch.setattr(omezarr, "MAX_EMPTY_STEPS", 8)
    src = tmp_path / "far.zarr"
    a = _image(src, (10**9, 2, 2), [T, Y, X], dtype="f4", chunks=(1, 2, 2), fill_value=0)
    a[20] = 1
    with pytest.raises(ConvertError, match=r"far\.zarr.*time point 20.*commit 20 steps holding"):
        omezarr.convert(src, tmp_path / "far.lam", progress=False)
    assert not os.path.exists(tmp_path / "far.lam")
    a[20] = 0  # no chunk stored there any more
    a[5] = 2
    res = omezarr.convert(src, tmp_path / "far.lam", progress=False)
    assert res.steps == 6
    with lamina.open(tmp_path / "far.lam") as f:
        assert f["far"].coverage(0) == [] and f.at(5)["far"][...].tolist() == [[2, 2], [2, 2]]


def test_foreign_image_of_fill_values_is_one_unwritten_step(tmp_path):
    """An image no chunk of which is stored (all the fill value: an empty label mask) is one
    step in which it is not written, reading as its fill value."""
    for axes, shape in (([Y, X], (4, 4)), ([T, Y, X], (3, 4, 4))):
        src = tmp_path / "blank.zarr"
        _image(src, shape, axes, dtype="u1", chunks=(2,) * len(shape), fill_value=0)[...] = 0
        res = omezarr.convert(src, tmp_path / "blank.lam", overwrite=True, progress=False)
        assert res.steps == 1
        with lamina.open(tmp_path / "blank.lam") as f:
            assert f.steps == 1 and f["blank"].coverage(0) == []
            np.testing.assert_array_equal(f["blank"][...], np.zeros((4, 4), "u1"))


def test_foreign_errors_say_why(tmp_path):
    """A codec this installation lacks, and a store whose only image is not numeric: the
    error gives the cause."""
    for fmt in (2, 3):
        src = tmp_path / f"codec{fmt}.zarr"
        _image(src, (2, 2), [Y, X], fmt, dtype="f4", chunks=(2, 2))[...] = 1
        meta = src / "0" / (".zarray" if fmt == 2 else "zarr.json")
        z = json.loads(meta.read_text())
        if fmt == 2:
            z["compressor"] = {"id": "no_such_codec"}
        else:
            z["codecs"].append({"name": "no_such_codec", "configuration": {}})
        meta.write_text(json.dumps(z))
        with pytest.raises(ConvertError, match=r"cannot open '0'.*no_such_codec"):
            omezarr.convert(src, tmp_path / "x.lam")
    src = tmp_path / "dates.zarr"
    _image(src, (2, 2), [Y, X], dtype="M8[s]", chunks=(2, 2))
    with pytest.raises(ConvertError, match=r"no OME-Zarr image lamina can convert.*datetime64"):
        omezarr.convert(src, tmp_path / "x.lam")
    assert not os.path.exists(tmp_path / "x.lam")


def test_names_zarr_keeps_its_metadata_under_are_refused(tmp_path):
    """A dataset or group named like a Zarr metadata file: one error naming it, nothing written."""
    cases = (".zarray", ".zattrs", ".zgroup", "zarr.json", ".zmetadata", ".zattrs/x")
    for k, name in enumerate(cases):
        src = tmp_path / f"n{k}.lam"
        with lamina.open(src, "w") as f:
            f.create_dataset(f"g/{name}", (2,), "f4")
        what = "group /g/.zattrs" if "/" in name else f"dataset /g/{name}"
        with pytest.raises(ConvertError, match=rf"n{k}\.lam': {what}: .* Zarr metadata file"):
            omezarr.convert(src, tmp_path / "n.zarr", progress=False)
        assert not [p for p in os.listdir(tmp_path) if "n.zarr" in p]


def test_names_with_a_backslash_are_refused(tmp_path):
    """zarr-python takes a backslash for a path separator: ``a\\b`` would come back as a group
    ``a`` holding ``b``. One error naming it, nothing written."""
    for k, (path, what) in enumerate(
        (("a\\b", "dataset /a\\b"), ("g\\h/x", "group /g\\h"), ("g/x\\", "dataset /g/x\\"))
    ):
        src = tmp_path / f"b{k}.lam"
        with lamina.open(src, "w") as f:
            f.create_dataset(path, (2,), "f4")
        with pytest.raises(ConvertError) as got:
            omezarr.convert(src, tmp_path / "b.zarr", progress=False)
        assert f"{what}: " in str(got.value) and "backslash" in str(got.value), got.value
        assert not [p for p in os.listdir(tmp_path) if "b.zarr" in p]


def test_datasets_of_32_dimensions_are_refused_before_writing(tmp_path):
    """The step axis makes 33 dimensions, more than HDF5 and Zarr hold: an error naming the
    dataset, before any destination exists; 31 dimensions convert."""
    src, ok = tmp_path / "deep.lam", tmp_path / "ok.lam"
    for path, deep in ((src, True), (ok, False)):
        with lamina.open(path, "w") as f:
            f.create_dataset("ok", (31 * (1,)), "f8", fill=2.0)
            if deep:
                f.create_dataset("g/deep", (32 * (1,)), "f8")
    for dst in ("deep.zarr", "deep.h5"):
        with pytest.raises(ConvertError, match=r"dataset /g/deep has 32 dimensions.* \(32\)"):
            omezarr.convert(src, tmp_path / dst, progress=False)
        assert not [p for p in os.listdir(tmp_path) if dst in p]
    for dst in ("ok.zarr", "ok.h5"):
        omezarr.convert(ok, tmp_path / dst, progress=False)
        omezarr.convert(tmp_path / dst, tmp_path / f"{dst}.lam", progress=False)
        with lamina.open(tmp_path / f"{dst}.lam") as back:
            assert back["ok"].shape == 31 * (1,) and back["ok"].fill == 2.0


def test_lamina_made_inconsistent(store, tmp_path):
    import shutil

    dst, _ = store
    copy = tmp_path / "copy.zarr"
    shutil.copytree(dst, copy)
    root = zarr.open_group(str(copy), mode="a")
    meta = dict(root.attrs["lamina"])
    meta["step_times"] = meta["step_times"][:1]
    root.attrs["lamina"] = meta
    with pytest.raises(FormatError, match=r"copy\.zarr.*'steps' says 2 steps"):
        omezarr.convert(copy, tmp_path / "x.lam")


@pytest.fixture
def tiny(tmp_path) -> str:
    """One step: a 16 x 16 multires dataset (patch 8) and a plain 1-D one."""
    path = str(tmp_path / "tiny.lam")
    with lamina.open(path, "w") as f:
        m = f.create_dataset("m", (16, 16), "f8", layout=lamina.Multires(patch=8, tolerance=TOL))
        v = f.create_dataset("v", (5,), "i4", fill=-1)
        with f.step():
            m[...] = np.arange(256.0).reshape(16, 16)
            v[1:3] = 7
    return path


def test_dispatch_and_force(tiny, tmp_path):
    assert hdf5.detect(tiny) == "lamina"
    dst = tmp_path / "o.zarr"
    res = omezarr.convert(tiny, dst, progress=False)
    assert res.direction == "lamina->zarr" and res.warnings == []
    assert hdf5.detect(dst) == "zarr" and hdf5.is_zarr_store(dst)
    with open(os.path.join(dst, "v", ".zattrs")) as fh:
        (ms,) = json.load(fh)["multiscales"]
    assert [a["name"] for a in ms["axes"]] == ["t", "x"]
    with pytest.raises(FileExistsError, match="--force"):
        omezarr.convert(tiny, dst)
    omezarr.convert(tiny, dst, overwrite=True, progress=False)
    with pytest.raises(ConvertError, match="gzip applies to HDF5 output only"):
        omezarr.convert(tiny, tmp_path / "g.zarr", gzip=4)
    with pytest.raises(ConvertError, match="lamina.omezarr"):
        hdf5.convert(dst, tmp_path / "h.lam")
    with pytest.raises(ConvertError, match="give a lamina destination"):
        omezarr.convert(dst, tmp_path / "again.zarr")
    # a lamina file is never replaced by a Zarr store, nor a Zarr store by a lamina file
    lam = tmp_path / "keep.lam"
    omezarr.convert(dst, lam, progress=False)
    with pytest.raises(FileExistsError, match="not a Zarr store"):
        omezarr.lamina_to_zarr(tiny, lam, overwrite=True)
    other = tmp_path / "other.zarr"
    zarr.open_group(str(other), mode="w", zarr_format=2)
    with pytest.raises(FileExistsError, match="not a lamina file"):
        omezarr.zarr_to_lamina(dst, other, overwrite=True)
    # HDF5 goes on as before
    h5 = tmp_path / "o.h5"
    assert omezarr.convert(tiny, h5, progress=False).direction == "lamina->hdf5"
    with pytest.raises(ConvertError, match="convert it to lamina first"):
        omezarr.convert(h5, tmp_path / "h.zarr")


# --------------------------------------------------------------------------
# the command


def run(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_convert(tiny, tmp_path, capsys):
    dst = tmp_path / "c.zarr"
    rc, out, err = run(["convert", tiny, dst], capsys)
    assert rc == 0 and "lamina to OME-Zarr" in out and "2 datasets" in out and "1 step" in out
    assert err == ""
    rc, out, err = run(["convert", dst, tmp_path / "c.lam"], capsys)
    assert rc == 0 and "OME-Zarr (made by lamina) to lamina" in out and err == ""
    with lamina.open(tmp_path / "c.lam") as f:
        assert f["m"].layout.patch == (8, 8)
        np.testing.assert_array_equal(f["v"][...], [-1, 7, 7, -1, -1])
    rc, _, err = run(["convert", tiny, dst], capsys)
    assert rc == 2 and "--force" in err
    rc, out, err = run(["convert", tiny, dst, "--force", "-q"], capsys)
    assert rc == 0 and out == "" and err == ""
    rc, _, err = run(["convert", tiny, tmp_path / "g.zarr", "--gzip", "3"], capsys)
    assert rc == 2 and "gzip applies to HDF5 output only" in err
    src = tmp_path / "f.zarr"
    _foreign(src, 3, [T, Y, X], (2, 3, 4))
    rc, out, err = run(["convert", src, tmp_path / "f.lam"], capsys)
    assert rc == 0 and "(OME-Zarr to lamina)" in out and "pyramid are not kept" in err
    bad = tmp_path / "bad.zarr"
    zarr.open_group(str(bad), mode="w", zarr_format=2)
    rc, _, err = run(["convert", bad, tmp_path / "b.lam"], capsys)
    assert rc == 2 and "bad.zarr" in err and "no OME-Zarr image" in err


# --------------------------------------------------------------------------
# the axes: names, units, scale and translation


def test_dims_name_the_ngff_axes_and_bad_ones_are_said(tmp_path):
    """A dataset's dims named its axes x, y, z where NGFF said z, y, x (the x axis of 64
    samples labelled z next to dims saying x); dims that cannot name NGFF axes are said."""
    src = str(tmp_path / "d.lam")
    with lamina.open(src, "w") as f:
        a = f.create_dataset("a", shape=(6, 4, 2), dtype="f4")
        a.attrs["dims"] = ["x", "y", "z"]
        a.attrs["axis_units"] = ["meter", "meter", ""]
        a.attrs["scale"] = [0.5, 0.5, 2.0]
        b = f.create_dataset("b", shape=(3, 3), dtype="f4")
        b.attrs["dims"] = ["t", "x"]  # 't' is the time axis's name
        b.attrs["scale"] = [1.0, -1.0]
        with f.step():
            a[...] = 1
            b[...] = 2
    res = omezarr.convert(src, tmp_path / "d.zarr", progress=False)
    ms = zarr.open_group(str(tmp_path / "d.zarr"), mode="r")["a"].attrs["multiscales"][0]
    assert ms["axes"] == [
        {"name": "t", "type": "time"},
        {"name": "x", "type": "space", "unit": "meter"},
        {"name": "y", "type": "space", "unit": "meter"},
        {"name": "z", "type": "space"},
    ]
    assert ms["datasets"][0]["coordinateTransformations"] == [
        {"type": "scale", "scale": [1.0, 0.5, 0.5, 2.0]}
    ]
    msb = zarr.open_group(str(tmp_path / "d.zarr"), mode="r")["b"].attrs["multiscales"][0]
    assert [x["name"] for x in msb["axes"]] == ["t", "y", "x"]
    said = " ".join(res.warnings)
    assert "dataset /b: its attribute 'dims'" in said and "'t' names the time axis" in said
    assert "dataset /b: its attribute 'scale'" in said and "must be > 0" in said


def test_a_foreign_images_calibration_is_kept_and_written_back(tmp_path):
    """Axis names, units, scale and translation of an image not made by lamina were dropped
    without a word: they become the dataset's dims, axis_units, scale and translation, and
    go back into the NGFF metadata when the file is converted again."""
    src = tmp_path / "cal.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=2)
    g.create_array("0", shape=(4, 6, 8), chunks=(2, 3, 4), dtype="u2")[...] = 1
    um = "micrometer"
    g.attrs["multiscales"] = [
        {
            "version": "0.4",
            "axes": [{"name": n, "type": "space", "unit": um} for n in "zyx"],
            "datasets": [
                {
                    "path": "0",
                    "coordinateTransformations": [
                        {"type": "scale", "scale": [2.0, 0.25, 0.25]},
                        {"type": "translation", "translation": [10.0, 5.0, 5.0]},
                    ],
                }
            ],
        }
    ]
    omezarr.convert(src, tmp_path / "cal.lam", progress=False)
    with lamina.open(tmp_path / "cal.lam") as f:
        at = f["cal"].attrs
        assert list(at["dims"]) == ["z", "y", "x"] and list(at["axis_units"]) == [um] * 3
        assert list(at["scale"]) == [2.0, 0.25, 0.25] and list(at["translation"]) == [
            10.0,
            5.0,
            5.0,
        ]
    omezarr.convert(tmp_path / "cal.lam", tmp_path / "back.zarr", progress=False)
    ms = zarr.open_group(str(tmp_path / "back.zarr"), mode="r")["cal"].attrs["multiscales"][0]
    assert ms["axes"][1:] == [{"name": n, "type": "space", "unit": um} for n in "zyx"]
    assert ms["datasets"][0]["coordinateTransformations"] == [
        {"type": "scale", "scale": [1.0, 2.0, 0.25, 0.25]},
        {"type": "translation", "translation": [0.0, 10.0, 5.0, 5.0]},
    ]


@pytest.mark.parametrize(
    "axes, transforms, text",
    [
        (
            ["y", "x"],
            [{"type": "scale", "scale": [1, 1, 1]}],
            r"scale \[1, 1, 1\] must be 2 finite numbers",
        ),
        (["x", "x"], None, r"axes \['x', 'x'\]: axis names must be unique"),
        (["y", "x"], [{"type": "scale", "scale": [-1.0, 1.0]}], r"must be > 0 on every axis"),
        (
            ["y", "x"],
            [{"type": "translation", "translation": [0, "a"]}],
            r"translation .* finite numbers",
        ),
        (["y", "x"], {"type": "scale"}, r"coordinateTransformations must be a list of objects"),
    ],
)
def test_multiscales_that_break_ngff_rules_are_refused(tmp_path, axes, transforms, text):
    src = tmp_path / "bad.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=2)
    g.create_array("0", shape=(2, 2), dtype="f4")[...] = 1
    d = (
        {"path": "0"}
        if transforms is None
        else {"path": "0", "coordinateTransformations": transforms}
    )
    g.attrs["multiscales"] = [
        {"version": "0.4", "axes": [{"name": n, "type": "space"} for n in axes], "datasets": [d]}
    ]
    with pytest.raises(ConvertError, match=r"bad\.zarr.*image /.*" + text):
        omezarr.convert(src, tmp_path / "bad.lam", progress=False)
    assert not os.path.exists(tmp_path / "bad.lam")


def test_a_store_that_is_one_image_gives_its_attributes_once(tmp_path):
    """Its attributes went to the lamina root and to the dataset, every warning twice."""
    src = tmp_path / "one.zarr"
    g = _image(src, (2, 2), [Y, X], dtype="f4")
    g[...] = 1
    root = zarr.open_group(str(src), mode="a")
    root.attrs["acquired"] = 2024
    root.attrs["meta"] = {"k": 1}
    res = omezarr.convert(src, tmp_path / "one.lam", progress=False)
    assert sum("skipped attribute 'meta'" in w for w in res.warnings) == 1
    with lamina.open(tmp_path / "one.lam") as f:
        assert "acquired" not in f.attrs and f["one"].attrs["acquired"] == 2024


def test_the_multiscales_own_transforms_compose_and_the_time_axis_is_said(tmp_path):
    """NGFF 0.4 applies a multiscales' own coordinateTransformations after its datasets':
    only the dataset's scale was kept (0.5 where the image says 1.5). The time axis's scale
    and unit, which lamina does not keep, are said."""
    src = tmp_path / "outer.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=2)
    g.create_array("0", shape=(2, 3, 4), chunks=(1, 3, 4), dtype="f4")[...] = 1
    g.attrs["multiscales"] = [
        {
            "version": "0.4",
            "axes": [{"name": "t", "type": "time", "unit": "second"}, Y, X],
            "datasets": [
                {
                    "path": "0",
                    "coordinateTransformations": [
                        {"type": "scale", "scale": [2.0, 0.5, 0.25]},
                        {"type": "translation", "translation": [0.0, 10.0, 20.0]},
                    ],
                }
            ],
            "coordinateTransformations": [{"type": "scale", "scale": [1.0, 3.0, 4.0]}],
        }
    ]
    res = omezarr.convert(src, tmp_path / "outer.lam", progress=False)
    assert any("time axis's scale 2, unit 'second' is not kept" in w for w in res.warnings)
    with lamina.open(tmp_path / "outer.lam") as f:
        assert list(f["outer"].attrs["scale"]) == [1.5, 1.0]
        assert list(f["outer"].attrs["translation"]) == [30.0, 80.0]


def test_conversions_open_files_on_disk_whatever_the_environment_says(
    sample, tmp_path, monkeypatch
):
    """LAMINA_ENGINE=memory, LAMINA_TRANSPORT=memory or LAMINA_IO=bogus set for a job's
    programs: the conversions still read and write the files on disk."""
    monkeypatch.setenv("LAMINA_ENGINE", "memory")
    monkeypatch.setenv("LAMINA_TRANSPORT", "memory")
    monkeypatch.setenv("LAMINA_IO", "bogus")
    omezarr.convert(sample, tmp_path / "a.zarr", progress=False)
    omezarr.convert(tmp_path / "a.zarr", tmp_path / "back.lam", progress=False)
    assert os.path.isdir(tmp_path / "back.lam")
    monkeypatch.delenv("LAMINA_ENGINE")
    monkeypatch.delenv("LAMINA_TRANSPORT")
    monkeypatch.delenv("LAMINA_IO")
    with lamina.open(tmp_path / "back.lam") as f:
        assert f.steps >= 1


def test_attributes_json_rounds_come_back_exactly(tmp_path):
    """Values JSON or numpy would round or spoil come back exactly: a complex number with an
    infinite part (re + 1j * im made its real part NaN), uint64 past int64 beside smaller
    ones (numpy took the list for float64, and the attribute was dropped), long doubles
    (float64 in JSON: their exact digits are kept beside); a complex fill too."""
    src, back = tmp_path / "a.lam", tmp_path / "b.lam"
    third = np.longdouble(1) / 3
    want = {
        "z": np.complex128(complex(2.0, -np.inf)),
        "zn": np.array([complex(np.inf, np.nan), complex(-0.0, np.inf)], np.complex64),
        "ids": np.array([2**63, 1], np.uint64),
        "big": np.array([[2**64 - 1], [0]], np.uint64),
        "third": third,
        "thirds": np.array([third, -third, np.inf, np.nan], np.longdouble),
        "zl": np.array([complex(1, 1)], np.clongdouble) / 3,
    }
    with lamina.open(src, "w") as f:
        ds = f.create_dataset("d", (4,), "c16", fill=complex(1.0, np.inf))
        for k, v in want.items():
            f.attrs[k] = v
        with f.step():
            ds[0:1] = 5
    _there_and_back(src, back)
    with lamina.open(back) as f:
        for k, v in want.items():
            got = f.attrs[k]
            assert np.asarray(got).dtype == np.asarray(v).dtype, k
            np.testing.assert_array_equal(got, v, err_msg=k)
        assert f["d"].fill == complex(1.0, np.inf)
        np.testing.assert_array_equal(f["d"][...], [5, *[complex(1.0, np.inf)] * 3])


def test_recorded_exact_digits_that_are_no_long_double_are_refused_cheaply():
    """A store's 'exact' strings were converted as one fixed-width array (one string of 20,000
    characters beside 20,000 short ones: 1.5 GiB), a value past the range came back inf,
    nesting past Python's recursion limit raised RecursionError."""
    from lamina.omezarr import _numbers_from_json

    typ = {"dtype": np.dtype(np.longdouble).str, "shape": [1]}
    for exact in (["1" * 20000], ["1e+99999"], ["0x1p3"], [[]], [None], ["1.5"]):
        ok, _, why = _numbers_from_json([1.0], {**typ, "exact": exact})
        assert not ok and why, exact
    deep: list = [1.0]
    for _ in range(5000):
        deep = [deep]
    assert _numbers_from_json(deep, {"dtype": "<f8", "shape": [1]})[0] is False
    ok, v, _ = _numbers_from_json([1.0], {**typ, "exact": ["Infinity"]})
    assert ok and v == np.inf


def test_foreign_integer_lists_past_int64_are_not_rounded(tmp_path):
    """numpy takes [2**63 + 1, 1] for float64 (2**63 + 1 rounded to 2**63)."""
    src = tmp_path / "big.zarr"
    _image(src, (2, 2), [Y, X], dtype="f4")[...] = 1
    root = zarr.open_group(str(src), mode="a")
    root.attrs["ids"] = [2**63 + 1, 1]
    root.attrs["huge"] = [2**64, 1]
    r = omezarr.convert(src, tmp_path / "big.lam", progress=False)
    with lamina.open(tmp_path / "big.lam") as f:
        ids = f["big"].attrs["ids"]
        assert ids.dtype == np.uint64 and ids.tolist() == [2**63 + 1, 1]
        assert "huge" not in f["big"].attrs
    assert any("'huge'" in w for w in r.warnings), r.warnings


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_chunk_that_is_a_fifo_is_refused_not_read(tmp_path):
    """(zarr-python would block in the read for ever.)"""
    store = tmp_path / "q.zarr"
    a = _image(
        store,
        (8, 8),
        [Y, X],
        dtype="f4",
        chunks=(4, 4),
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    a[...] = 1
    os.remove(store / "0" / "1" / "1")
    os.mkfifo(store / "0" / "1" / "1")
    with pytest.raises(FormatError, match=r"chunk '.*0/1/1' is not a regular file"):
        omezarr.convert(store, tmp_path / "q.lam", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["q.zarr"]


def test_bytes_paths_convert_as_lamina_open_takes_them(sample, tmp_path):
    for dst in (tmp_path / "b.zarr", tmp_path / "b.h5"):
        r = omezarr.convert(os.fsencode(sample), os.fsencode(dst), progress=False)
        assert r.dst == str(dst) and dst.exists()
    r = omezarr.convert(
        os.fsencode(tmp_path / "b.zarr"), os.fsencode(tmp_path / "c.lam"), progress=False
    )
    assert r.direction == "zarr->lamina"


def test_a_zarr_store_is_not_written_under_an_hdf5_name(store, tmp_path):
    with pytest.raises(ConvertError, match="names an HDF5 file: convert the store to lamina first"):
        omezarr.convert(store[0], tmp_path / "x.h5", progress=False)
    assert not (tmp_path / "x.h5").exists()
