"""The xarray backend and to_lamina: round trips, lazy indexing, dask chunks, steps, trees, MPI writers."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

xr = pytest.importorskip("xarray")
pytest.importorskip("dask.array")

import mpi_util as mu  # noqa: E402

import lamina  # noqa: E402
from lamina.xarray import LaminaArray, LaminaBackendEntrypoint, to_lamina  # noqa: E402

ENGINE = LaminaBackendEntrypoint


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """engine="lamina" and guessing by suffix, as after ``pip install lamina``.

    A source checkout run without installing has no entry point: a stand-in
    distribution on sys.path declares it the same way pyproject.toml does.
    """
    from xarray.backends import plugins

    eps = importlib.metadata.entry_points(group="xarray.backends")
    if "lamina" not in eps.names:
        info = tmp_path / "site" / "lamina_xarray_entry-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: lamina-xarray-entry\nVersion: 0\n"
        )
        (info / "entry_points.txt").write_text(
            "[xarray.backends]\nlamina = lamina_xarray_entry:LaminaBackendEntrypoint\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
    plugins.list_engines.cache_clear()
    yield
    plugins.list_engines.cache_clear()


def _flame(path, steps=3, shape=(6, 8, 10), split=((0, 3), (0, 4))):
    """A file like the demo's: fields/T on a 2x2 grid of blocks, a 0-D `time` per step, a grid."""
    ref = []
    with lamina.open(path, "w") as f:
        f.attrs["title"] = "test flame"
        T = f.create_dataset("fields/T", shape=shape, dtype="f8", compression="zstd")
        T.attrs["units"] = "K"
        T.attrs["dims"] = ["z", "y", "x"]
        P = f.create_dataset("fields/P", shape=shape, dtype="f4")
        P.attrs["dims"] = ["z", "y", "x"]
        x = f.create_dataset("fields/x", shape=(shape[2],), dtype="f8")
        x.attrs["dims"] = ["x"]
        x.attrs["static"] = 1
        tds = f.create_dataset("time", (), "f8")
        tds.attrs["units"] = "s"
        f.derive("fields/TP", "`fields/T` + `fields/P`", strategy="stats")
        nz, ny = shape[0] // 2, shape[1] // 2
        for k in range(steps):
            with f.step():
                full = k * 1000.0 + np.arange(np.prod(shape), dtype="f8").reshape(shape) / 7.0
                for z0 in (0, nz):
                    for y0 in (0, ny):
                        box = np.s_[z0 : z0 + nz, y0 : y0 + ny, :]
                        T[box] = full[box]
                        P[box] = (2 * full[box]).astype("f4")
                if k == 0:
                    x[...] = np.linspace(0.0, 1.0, shape[2])
                tds[()] = 0.25 * k
            ref.append(full)
    return np.stack(ref)


# ------------------------------------------------------------------------------ reading


def test_open_dataset_steps_dims_attrs_time(tmp_path):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        assert ds.T.dims == ("step", "z", "y", "x")
        assert ds.sizes == {"step": 3, "z": 6, "y": 8, "x": 10}
        assert ds.T.attrs == {"units": "K"}
        assert "x" in ds.coords and ds.x.dims == ("x",)  # static: no step dimension
        np.testing.assert_array_equal(ds.x.values, np.linspace(0.0, 1.0, 10))
        assert ds.time.dims == ("step",) and "time" in ds.coords  # from the root's 0-D `time`
        np.testing.assert_array_equal(ds.time.values, [0.0, 0.25, 0.5])
        np.testing.assert_array_equal(ds.T.values, ref)
        np.testing.assert_array_equal(ds.P.values, (2 * ref).astype("f4"))
        assert ds.T.encoding["lamina_compression"] == [{"id": "zstd"}]
        assert "compression" not in ds.T.encoding  # (xarray's netCDF backends take that key)


def test_cf_decoders_are_taken_and_off_unless_asked(tmp_path):
    """xarray's decoders (decode_times=, mask_and_scale=, ...) are taken, as zarr's backend
    takes them (each was a TypeError): given true, xr.decode_cf decodes with them; not given,
    or False, nothing is decoded (lamina's default, docs/xarray.md)."""
    path = tmp_path / "cf.lam"
    with lamina.open(path, "w") as f:
        t = f.create_dataset("time", data=np.array([0.0, 1.0, 2.0]))
        t.attrs.update({"units": "days since 2000-01-01", "dims": ["time"]})
        v = f.create_dataset("v", data=np.array([10, 20, -1], np.int16))
        v.attrs.update({"scale_factor": 0.5, "_FillValue": np.int16(-1), "dims": ["time"]})
    with xr.open_dataset(path, engine=ENGINE, step=0) as ds:
        assert ds.time.dtype == np.float64 and ds.v.dtype == np.int16
    for off in ({"decode_times": False}, {"decode_cf": False}, {"mask_and_scale": False}):
        with xr.open_dataset(path, engine=ENGINE, step=0, **off) as ds:
            assert ds.time.dtype == np.float64 and ds.v.dtype == np.int16, off
    with xr.open_dataset(path, engine=ENGINE, step=0, decode_times=True) as ds:
        assert ds.time.values[1] == np.datetime64("2000-01-02") and ds.v.dtype == np.int16
    with xr.open_dataset(path, engine=ENGINE, step=0, mask_and_scale=True) as ds:
        np.testing.assert_array_equal(ds.v.values, [5.0, 10.0, np.nan])
        assert ds.time.dtype == np.float64
    tree = xr.open_datatree(path, engine=ENGINE, step=0, decode_times=True, decode_coords=False)
    with tree:
        assert tree["time"].dtype.kind == "M"


def test_lazy_datasets_pickle_and_read_where_unpickled(tmp_path):
    """A Dataset opened lazily pickles as its file's path (dask's processes and distributed
    schedulers, copy.deepcopy), as xarray's netCDF backends do: it was a TypeError.  A file
    in memory cannot be opened again: a TypeError says so."""
    import copy
    import pickle

    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        back = pickle.loads(pickle.dumps(ds))
        np.testing.assert_array_equal(back.T.values, ref)
        np.testing.assert_array_equal(back.TP[1].values, ds.TP[1].values)  # computed on read
        np.testing.assert_array_equal(copy.deepcopy(ds).T[2, 1:3].values, ref[2, 1:3])
        back.close()  # (the file opened again stays open for the other copies)
        np.testing.assert_array_equal(copy.deepcopy(ds).T[0].values, ref[0])
    with xr.open_dataset(path, engine=ENGINE, group="fields", chunks={}) as ds:
        got = ds.T.sum().compute(scheduler="processes", num_workers=2)
        assert float(got) == pytest.approx(float(ref.sum()))
    with lamina.open(str(tmp_path / "m.lam"), "w", engine="memory") as f:
        f.create_dataset("a", data=np.arange(3.0))
        f.end_step()
        with xr.open_dataset(f, engine=ENGINE) as ds:
            with pytest.raises(TypeError, match="cannot be pickled: its file is not on disk"):
                pickle.dumps(ds)


def test_a_selection_reads_after_its_dataset_is_closed(tmp_path):
    """A lazy selection taken inside ``with xr.open_dataset(...)`` reads after it, the file
    opened again by path, as zarr's and the netCDF backends do; so do the other groups of
    open_groups once one is closed (each was a ValueError, "file is closed")."""
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        last = ds.T.isel(step=-1)
        chunked = ds.T.chunk({"step": 1})
    np.testing.assert_array_equal(last.values, ref[-1])
    np.testing.assert_array_equal(chunked.sum("step").values, ref.sum(axis=0))
    groups = xr.open_groups(path, engine=ENGINE)
    groups["/"].close()  # (the groups share one file)
    np.testing.assert_array_equal(groups["/fields"].T.values, ref)


def test_a_file_opened_again_sees_the_steps_written_since(tmp_path):
    """A selection read after its Dataset was closed, and an unpickled Dataset, read steps the
    file gained since it was opened again for them (the file kept for the process was never
    refreshed: StepError "step 3 does not exist ... 2 committed step(s)")."""
    import pickle

    path = str(tmp_path / "grows.lam")
    with lamina.open(path, "w") as f:
        a = f.create_dataset("a", (3,), "f8")
        a.attrs["dims"] = ["x"]
        for k in range(2):
            with f.step():
                a[...] = k
    with xr.open_dataset(path, engine=ENGINE) as ds:
        first = ds.a.isel(step=0)
    np.testing.assert_array_equal(first.values, [0, 0, 0])  # (the file opened again, kept)
    with lamina.open(path, "a") as f:
        for k in range(2, 4):
            with f.step():
                f["a"][...] = k
    with xr.open_dataset(path, engine=ENGINE) as ds:
        last = ds.a.isel(step=3)
        blob = pickle.dumps(ds)
    np.testing.assert_array_equal(last.values, [3, 3, 3])
    np.testing.assert_array_equal(pickle.loads(blob).a.isel(step=3).values, [3, 3, 3])


def test_a_step_outside_the_file_is_an_index_error_naming_the_axis(tmp_path):
    """As zarr's: the dimension and its length, not a bare 'list index out of range'."""
    path = tmp_path / "s.lam"
    _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        for key in (3, [0, 3]):
            with pytest.raises(IndexError, match="dimension 'step' of length 3"):
                ds.T.isel(step=key).load()
        np.testing.assert_array_equal(ds.T.isel(step=-3).values, ds.T.isel(step=0).values)


def test_a_group_with_a_time_dimension_takes_no_time_from_its_parent(tmp_path):
    """A probe's history over its own dimension 'time': the root's per-step 'time' is not
    pushed in beside it (at one step, a ValueError "dimension 'time' already exists as a
    scalar variable" stopped open_dataset and open_datatree)."""
    path = str(tmp_path / "probe.lam")
    with lamina.open(path, "w") as f:
        t = f.create_dataset("time", (), "f8")
        h = f.create_dataset("probe/hist", (5,), "f8")
        h.attrs["dims"] = ["time"]
        for k in range(2):
            with f.step():
                t[()] = 0.1 * k
                h[...] = np.arange(5.0) + k
    with xr.open_dataset(path, engine=ENGINE, group="probe") as ds:
        assert dict(ds.sizes) == {"step": 2, "time": 5}
        assert "time" not in ds.coords
    with xr.open_dataset(path, engine=ENGINE, group="probe", step=1) as ds:
        np.testing.assert_array_equal(ds.hist.values, np.arange(5.0) + 1)
    tree = xr.open_datatree(path, engine=ENGINE, step=1)
    try:
        assert float(tree["/"].time) == 0.1
        np.testing.assert_array_equal(tree["/probe"].hist.values, np.arange(5.0) + 1)
    finally:
        tree.close()


def test_trees_and_groups_of_a_dataset_name_it(tmp_path):
    """open_datatree and open_groups with group= naming a dataset say so, as open_dataset
    does (an AttributeError: 'Dataset' object has no attribute 'walk')."""
    path = str(tmp_path / "g.lam")
    with lamina.open(path, "w") as f:
        a = f.create_dataset("g/a", (4,), "f8")
        with f.step():
            a[...] = 1
    for fn in (xr.open_dataset, xr.open_datatree, xr.open_groups):
        with pytest.raises(TypeError, match="'/g/a' in .* is a dataset, not a group"):
            fn(path, engine=ENGINE, group="g/a")


def test_listed_coordinates_keep_every_other_value_at_a_coarser_level(tmp_path):
    """A 1-D coordinate the group lists in 'coordinates' (lat over y, as to_lamina writes it)
    is strided at level k as an index coordinate is (it was left out with a warning)."""
    path = str(tmp_path / "lat.lam")
    lat_values = np.linspace(-60, 60, 16)
    with lamina.open(path, "w") as f:
        f.attrs["coordinates"] = ["lat"]
        T = f.create_dataset("T", (16, 16), "f8", layout=lamina.Multires(patch=8, tolerance=0))
        T.attrs["dims"] = ["y", "x"]
        y = f.create_dataset("y", (16,), "f8")
        y.attrs.update({"dims": ["y"], "static": 1})
        lat = f.create_dataset("lat", (16,), "f8")
        lat.attrs.update({"dims": ["y"], "static": 1})
        with f.step():
            T[...] = np.arange(256.0).reshape(16, 16)
            y[...] = np.arange(16.0)
            lat[...] = lat_values
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_dataset(path, engine=ENGINE, level=1) as ds:
            assert sorted(ds.coords) == ["lat", "y"]
            np.testing.assert_array_equal(ds.lat.values, lat_values[::2])
            np.testing.assert_array_equal(ds.y.values, np.arange(16.0)[::2])
            assert ds.lat.dims == ("y",)


def test_derived_quantity_is_a_variable(tmp_path):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        assert ds.TP.encoding["lamina_derived"]["strategy"] == "stats"
        np.testing.assert_allclose(ds.TP[1].values, ref[1] + (2 * ref[1]).astype("f4"))


def test_vector_components_and_computed_quantities_chunk_like_their_inputs(tmp_path):
    """A curl's components x, y, z over dims (x, y, z) are named vort_x ...; an expression
    computed on read has the chunks of its inputs."""
    path = tmp_path / "vec.lam"
    shape = (6, 8, 10)
    rng = np.random.default_rng(1)
    with lamina.open(path, "w") as f:
        for c in ("u", "v", "w"):
            f.create_dataset(c, shape=shape).attrs["dims"] = ["x", "y", "z"]
        f.derive("vort", "curl(u, v, w)", strategy="stats")
        f.derive("speed", "magnitude(u, v, w)", strategy="expression")
        data = {c: rng.random(shape) for c in ("u", "v", "w")}
        with f.step():
            for c in ("u", "v", "w"):
                f[c][0:3] = data[c][0:3]
                f[c][3:6] = data[c][3:6]
    with xr.open_datatree(path, engine=ENGINE, chunks={}) as tree:
        vort = tree["vort"].to_dataset()
        assert sorted(vort.data_vars) == ["vort_x", "vort_y", "vort_z"]
        assert vort.vort_x.dims == ("step", "x", "y", "z")
        wx = np.gradient(data["w"], axis=1, edge_order=2) - np.gradient(
            data["v"], axis=2, edge_order=2
        )
        np.testing.assert_allclose(vort.vort_x[0].values, wx, rtol=1e-12, atol=1e-12)
        speed = tree.to_dataset().speed
        assert speed.chunks == ((1,), (3, 3), (8,), (10,))
        want = np.sqrt(data["u"] ** 2 + data["v"] ** 2 + data["w"] ** 2)
        np.testing.assert_allclose(speed[0].values, want)


@pytest.mark.parametrize("dims", [None, ["z", "y", "x"], ["a", "b", "c"]])
def test_a_vectors_components_are_named_alike_whatever_the_dims(tmp_path, dims):
    """vort_x, vort_y, vort_z as docs/xarray.md says: without dims (or with dims other than
    x, y, z) the components came out as x, y, z, so code written for one file broke on another."""
    path = tmp_path / "v.lam"
    with lamina.open(path, "w") as f:
        for c in ("u", "v", "w"):
            ds = f.create_dataset(c, shape=(4, 4, 4))
            if dims is not None:
                ds.attrs["dims"] = dims
        f.derive("vort", "curl(u, v, w)", strategy="expression")
        with f.step():
            for c in ("u", "v", "w"):
                f[c][...] = 1.0
    with xr.open_datatree(path, engine=ENGINE) as tree:
        assert sorted(tree["vort"].to_dataset().data_vars) == ["vort_x", "vort_y", "vort_z"]


@pytest.mark.parametrize(
    "var, value", [("LAMINA_ENGINE", "memory"), ("LAMINA_ENGINE", "mpi"), ("LAMINA_IO", "async")]
)
def test_a_path_opens_the_file_on_disk_whatever_the_jobs_settings(
    tmp_path, monkeypatch, var, value
):
    """The variables that switch a job's own programs (an in situ consumer launched with
    ``LAMINA_ENGINE=mpi``) do not turn ``xr.open_dataset(path)`` away from the file on disk,
    as they do not turn ``lamina ls`` or ``lamina convert``."""
    path = tmp_path / "run.lam"
    ref = _flame(path)
    monkeypatch.setenv(var, value)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        np.testing.assert_array_equal(ds.T.values, ref)


def test_one_step(tmp_path):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields", step=-2) as ds:
        assert ds.T.dims == ("z", "y", "x")
        assert int(ds.step) == 1 and float(ds.time) == 0.25
        np.testing.assert_array_equal(ds.T.values, ref[1])


def test_default_dims_and_attribute_mismatch(tmp_path):
    path = tmp_path / "plain.lam"
    with lamina.open(path, "w") as f:
        f.create_dataset("a", data=np.ones((3, 4)))
        f.create_dataset("b", data=np.ones((5,)))  # dim_0 of another size: renamed
        bad = f.create_dataset("c", data=np.ones((2, 2)))
        bad.attrs["dims"] = ["only_one"]
    with pytest.warns(UserWarning, match="names 1 dimensions"):
        ds = xr.open_dataset(path, engine=ENGINE)
    with ds:
        assert ds.a.dims == ("step", "dim_0", "dim_1")
        assert ds.b.dims == ("step", "dim_0_5")
        assert ds.c.dims == ("step", "dim_0_2", "dim_1_2")


SELECTIONS = [
    np.s_[:, 1:5, 2:7, 3],  # crosses block boundaries in z and y
    np.s_[-1, ::-1, ::3, :],  # negative step, stride
    np.s_[0:2, 5:0:-2, -1, ::-4],
    np.s_[1, 2, 3, 4],
    np.s_[:, 3:3, :, :],  # empty
    np.s_[0, 5:5:-1, :, 2:2:-3],  # empty with negative steps
    np.s_[::-1, 2, :, 9],
]


@pytest.mark.parametrize("key", SELECTIONS, ids=range(len(SELECTIONS)))
def test_lazy_basic_indexing(tmp_path, key):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        np.testing.assert_array_equal(ds.T[key].values, ref[key])


def test_backend_array_takes_empty_negative_slices(tmp_path):
    """xarray's key decomposition fails on ``slice(None, -1, -1)`` of a raw key; the array copes."""
    from xarray.core import indexing

    path = tmp_path / "run.lam"
    _flame(path)
    with lamina.open(path) as f:
        arr = LaminaArray(f["fields/T"], [0, 1, 2], None)
        key = indexing.OuterIndexer((0, slice(None, -1, -1), np.array([1, 2]), slice(None)))
        assert arr[key].shape == (0, 2, 10)


def test_lazy_outer_indexing(tmp_path):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        got = ds.T.isel(step=[2, 0], z=[5, 0, 3], x=[-1, 2, 2]).values
        np.testing.assert_array_equal(got, ref[[2, 0]][:, [5, 0, 3]][..., [-1, 2, 2]])
        sel = ds.T.isel(z=slice(4, None), y=[1, 6]).isel(x=slice(None, None, -3))  # chained lazily
        np.testing.assert_array_equal(sel.values, ref[:, 4:, [1, 6], ::-3])


def _axis_keys(n: int):
    ints = st.integers(-n, n - 1)
    # not below -n: xarray's lazy slice composition turns slice(-n - 1, None, -1), which is
    # empty, into the whole reversed axis before any backend sees it (an xarray bug)
    bounds = st.one_of(st.none(), st.integers(-n, n + 2))
    steps = st.one_of(st.none(), st.integers(-4, 4).filter(lambda v: v != 0))
    slices = st.builds(slice, bounds, bounds, steps)
    arrays = st.lists(ints, min_size=1, max_size=4).map(lambda v: np.asarray(v, dtype=np.int64))
    return st.one_of(ints, slices, arrays)


def _outer_numpy(a: np.ndarray, key: tuple) -> np.ndarray:
    out = a
    for ax in range(len(key) - 1, -1, -1):
        out = out[(slice(None),) * ax + (key[ax],)]
    return out


@settings(max_examples=40)
@given(data=st.data())
def test_outer_indexing_matches_numpy(tmp_path_factory, data):
    """Any mix of integers, slices (any step, empty too) and index arrays per axis, read lazily,
    equals numpy's outer indexing of the eager array."""
    path = tmp_path_factory.getbasetemp() / "prop.lam"
    if not path.exists():
        _flame(path)
    ref = np.load(path.parent / "prop.npy") if (path.parent / "prop.npy").exists() else None
    if ref is None:
        with lamina.open(path) as f:
            ref = np.stack([np.asarray(f.at(k)["fields/T"]) for k in range(f.steps)])
        np.save(path.parent / "prop.npy", ref)
    key = tuple(data.draw(_axis_keys(n)) for n in ref.shape)
    with xr.open_dataset(path, engine=ENGINE, group="fields") as ds:
        lazy = ds.T[key]  # xarray's indexing of 1-D arrays is outer (orthogonal), as here
        np.testing.assert_array_equal(lazy.values, _outer_numpy(ref, key))


def test_reads_only_touched_blocks(tmp_path):
    """A selection inside one block reads only that block: the others never decode."""
    path = tmp_path / "run.lam"
    _flame(path)
    f = lamina.open(path)
    seen = []
    ds = f["fields/T"]
    orig = ds.read

    def spy(box=None, step=None, out=None):
        seen.append(box)
        return orig(box, step, out)

    ds.read = spy  # type: ignore[method-assign]
    arr = LaminaArray(ds, [0, 1, 2], None)
    from xarray.core import indexing

    out = arr[indexing.BasicIndexer((1, slice(0, 2), slice(5, 8), slice(None)))]
    assert out.shape == (2, 3, 10)
    assert seen == [lamina.Box((0, 5, 0), (2, 8, 10))]
    touched = [b for b in ds.blocks(1) if b.box.intersect(seen[0]) is not None]
    assert len(touched) == 1
    f.close()


def test_dask_chunks_follow_blocks_and_equal_eager(tmp_path):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_dataset(path, engine=ENGINE, group="fields", chunks={}) as ds:
        assert ds.T.chunks == ((1, 1, 1), (3, 3), (4, 4), (10,))
        assert float(ds.T.mean().compute()) == pytest.approx(ref.mean())
        with xr.open_dataset(path, engine=ENGINE, group="fields") as eager:
            xr.testing.assert_identical(ds.compute(), eager.load())
    with xr.open_dataset(path, engine=ENGINE, group="fields", chunks="auto") as ds:
        # "auto" merges blocks into larger chunks but never cuts one
        for dim, sizes in zip(ds.T.dims[1:], ds.T.chunks[1:], strict=True):
            edges = set(np.cumsum(sizes).tolist())
            block = {"z": 3, "y": 4, "x": 10}[dim]
            assert all(e % block == 0 for e in edges)


def test_open_datatree(tmp_path):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with xr.open_datatree(path, engine=ENGINE) as tree:
        assert set(tree.children) == {"fields"}
        assert tree.attrs["title"] == "test flame"
        np.testing.assert_array_equal(tree["fields"].T.values, ref)
        # the root's time coordinate is inherited by the child node
        np.testing.assert_array_equal(tree["fields"]["time"].values, [0.0, 0.25, 0.5])


def test_open_datatree_of_default_dimension_names(tmp_path):
    """Datasets without ``dims`` in nested groups of other lengths: a node's default names
    (``dim_0``) of another size than its parent's are made distinct, as within a group, so
    that the tree aligns (it raised "not aligned with its parents")."""
    path = tmp_path / "t.lam"
    with lamina.open(path, "w") as f:
        for name, n in (("a", 8), ("g/b", 3), ("g/h/c", 8), ("g/h/d", 3), ("k/e", 5)):
            f.create_dataset(name, (n,), "f8")
        with f.step():
            for name in ("a", "g/b", "g/h/c", "g/h/d", "k/e"):
                f[name][...] = len(name)
    with xr.open_datatree(path, engine=ENGINE) as tree:
        assert tree["g"].b.dims == ("step", "dim_0_3")
        assert tree["g/h"].c.dims == ("step", "dim_0") and tree["g/h"].d.dims == ("step", "dim_0_3")
        assert tree["k"].e.dims == ("step", "dim_0_5")
        np.testing.assert_array_equal(tree["g/h"].d.values, [[5.0] * 3])
    with xr.open_dataset(path, engine=ENGINE, group="g") as one:  # a group alone: as before
        assert one.b.dims == ("step", "dim_0")


def test_to_lamina_refuses_what_would_not_read_back(tmp_path):
    """A name with '/', an attribute named as the mapping's own, static variables beside a
    step dimension of length 0: clear errors before anything is written; a step dimension of
    length 0 alone writes a file of no steps."""
    cases = (
        (xr.Dataset({"a/b": ("x", np.arange(3.0))}), "a name with '/'"),
        (xr.Dataset({"a": ("x", np.arange(3.0), {"dims": "bogus"})}), "attribute 'dims'"),
        (xr.Dataset({"a": ("x", np.arange(3.0), {"static": 0})}), "attribute 'static'"),
        (xr.Dataset(attrs={"coordinates": "x"}), "attribute 'coordinates'"),
        (
            xr.Dataset({"a": (("step", "x"), np.zeros((0, 2))), "b": ("x", np.ones(2))}),
            "whose length is 0",
        ),
    )
    for k, (ds, text) in enumerate(cases):
        with pytest.raises(ValueError, match=text):
            to_lamina(ds, tmp_path / f"bad{k}.lam")
        assert not (tmp_path / f"bad{k}.lam").exists()
    to_lamina(xr.Dataset({"a": (("step", "x"), np.zeros((0, 2)))}), tmp_path / "none.lam")
    with lamina.open(tmp_path / "none.lam") as f:
        assert f.steps == 0 and f["a"].shape == (2,)


def test_engine_name_and_guess(tmp_path, registered):
    path = tmp_path / "run.lam"
    ref = _flame(path)
    assert "lamina" in xr.backends.list_engines()
    with xr.open_dataset(path, group="fields") as ds:  # no engine=: guessed from .lam
        np.testing.assert_array_equal(ds.T[2].values, ref[2])
    with xr.open_dataset(str(path), engine="lamina", group="fields", step=0) as ds:
        np.testing.assert_array_equal(ds.T.values, ref[0])
    assert not LaminaBackendEntrypoint().guess_can_open("data.nc")


def test_open_file_object_stays_open(tmp_path):
    """A lamina File (or Group) opened by the program: the Dataset reads it and leaves it open."""
    path = tmp_path / "run.lam"
    ref = _flame(path)
    with lamina.open(path) as f:
        with xr.open_dataset(f["fields"], engine=ENGINE) as ds:
            np.testing.assert_array_equal(ds.T[0, :2].values, ref[0, :2])
        assert not f.engine.closed
        assert f["fields/T"][0, 0, 0] == ref[-1, 0, 0, 0]
        # a view of one step (the file as of step 1) reads that step, as step=1 does
        with xr.open_dataset(f.at(1)["fields"], engine=ENGINE) as one:
            assert "step" not in one.dims and int(one.step) == 1
            np.testing.assert_array_equal(one.T.values, ref[1])
        with pytest.raises(ValueError, match="step=0 given for a view of step 1"):
            xr.open_dataset(f.at(1), engine=ENGINE, step=0)


def test_levels_of_multiresolution_datasets(tmp_path):
    """level=k: multiresolution variables at level k (what Dataset.level reads), 1-D coordinates
    every 2**k-th value, datasets without that level left out with a warning; lazily."""
    from lamina.multires import compress

    path = tmp_path / "mr.lam"
    shape = (40, 36)
    yy, xx = np.meshgrid(np.linspace(0, 1, shape[0]), np.linspace(0, 2, shape[1]), indexing="ij")
    ref = [np.sin(3 * yy) * xx + k for k in range(2)]
    with lamina.open(path, "w") as f:
        T = f.create_dataset("T", shape, "f8", layout=lamina.Multires(patch=8, tolerance=1e-6))
        T.attrs["dims"] = ["y", "x"]
        x = f.create_dataset("x", (shape[1],), "f8")
        x.attrs["dims"] = ["x"]
        x.attrs["static"] = 1
        P = f.create_dataset("P", shape, "f4")
        P.attrs["dims"] = ["y", "x"]
        for k in range(2):
            with f.step():
                T[...] = ref[k]
                P[...] = ref[k]
                if k == 0:
                    x[...] = np.linspace(0, 2, shape[1])
    with xr.open_dataset(path, engine=ENGINE) as ds:  # level 0: everything
        assert set(ds.data_vars) == {"T", "P"} and ds.T.shape == (2, 40, 36)
    for level in (1, 2, 3):
        with pytest.warns(UserWarning, match="'P' in .* no level"):
            ds = xr.open_dataset(path, engine=ENGINE, level=level)
        with ds:
            assert set(ds.data_vars) == {"T"} and ds.T.encoding["lamina_level"] == level
            n = [-(-s // 2**level) for s in shape]
            assert ds.T.shape == (2, *n) and ds.sizes["x"] == n[1]
            np.testing.assert_array_equal(ds.x.values, np.linspace(0, 2, shape[1])[:: 2**level])
            for k in range(2):
                want = compress.reference_array(ref[k], (8, 8), level, 1e-6)
                assert np.abs(ds.T[k].values - want).max() <= 1e-6
                assert np.abs(ds.T[k, 1:3, ::2].values - want[1:3, ::2]).max() <= 1e-6
            with lamina.open(path) as f:
                np.testing.assert_array_equal(ds.T[1].values, f["T"].level(level)[...])
    with pytest.raises(ValueError, match="level=-1"):
        xr.open_dataset(path, engine=ENGINE, level=-1)


# ------------------------------------------------------------------------------ writing


def _sample(dtype) -> xr.Dataset:
    rng = np.random.default_rng(0)
    data = (rng.random((4, 5)) * 100).astype(dtype)
    return xr.Dataset(
        {
            "a": (("y", "x"), data, {"units": "m", "scale": 2.5, "flags": np.array([1, 2, 3])}),
            "b": ("x", np.arange(5, dtype="i2"), {"long_name": "bee"}),
            "c": ((), np.float32(3.5)),
        },
        coords={
            "x": ("x", np.arange(5.0) * 0.1, {"units": "km"}),
            "lat": ("y", np.linspace(-1, 1, 4)),
        },
        attrs={"title": "sample", "names": ["p", "q"], "version": 3},
    )


@pytest.mark.parametrize("dtype", ["f8", "f4", "i1", "u2", "i8", "c8", "bool"])
def test_roundtrip_dtypes_coords_attrs(tmp_path, dtype):
    src = _sample(dtype)
    to_lamina(src, tmp_path / "s.lam")
    with xr.open_dataset(tmp_path / "s.lam", engine=ENGINE) as back:
        xr.testing.assert_identical(back.load(), src)
        assert back.a.dtype == np.dtype(dtype)


def test_roundtrip_steps_and_time(tmp_path):
    src = xr.Dataset(
        {
            "T": (("step", "z", "x"), np.arange(3 * 4 * 6, dtype="f8").reshape(3, 4, 6)),
            "grid": ("x", np.linspace(0, 1, 6)),
        },
        coords={"time": ("step", [0.0, 0.1, 0.3])},
    )
    src.lamina.to_lamina(tmp_path / "s.lam")  # the accessor
    with lamina.open(tmp_path / "s.lam") as f:
        assert f.steps == 3
        assert float(f.at(2)["time"][()]) == 0.3
        assert f["T"].attrs["dims"].tolist() == ["z", "x"]
    with xr.open_dataset(tmp_path / "s.lam", engine=ENGINE) as back:
        xr.testing.assert_identical(back.load(), src)
    with xr.open_dataset(tmp_path / "s.lam", engine=ENGINE, step=1) as one:
        xr.testing.assert_identical(one.load().drop_vars("step"), src.isel(step=1))


def test_a_step_coordinate_of_its_own_at_one_step(tmp_path):
    """A Dataset's own 'step' coordinate (a lamina dataset 'step', as a program's step
    counter is) is the index over all steps and the scalar coordinate at one step, where
    xarray refused the two 'step' variables."""
    src = xr.Dataset(
        {"a": (("step", "x"), np.arange(6.0).reshape(2, 3))}, coords={"step": [10, 20]}
    )
    to_lamina(src, tmp_path / "c.lam")
    with xr.open_dataset(tmp_path / "c.lam", engine=ENGINE) as back:
        xr.testing.assert_identical(back.load(), src)
    with xr.open_dataset(tmp_path / "c.lam", engine=ENGINE, step=-1) as one:
        xr.testing.assert_identical(one.load(), src.isel(step=-1))
    tree = xr.open_datatree(tmp_path / "c.lam", engine=ENGINE, step=0)
    assert int(tree["/"].step) == 10
    tree.close()


def test_a_parents_step_coordinate_labels_its_children_at_one_step(tmp_path):
    """A tree opened at step=1: the root said step=20 and the child group step=1 (the index),
    where the tree opened whole passes 20 down; a group opened alone said 1 too."""
    root = xr.Dataset({"r": (("step",), [1.0, 2.0])}, coords={"step": [10, 20]})
    child = xr.Dataset({"v": (("step", "x"), np.arange(6.0).reshape(2, 3))})
    to_lamina(xr.DataTree.from_dict({"/": root, "/c": child}), tmp_path / "t.lam")
    one = xr.open_datatree(tmp_path / "t.lam", engine=ENGINE, step=1)
    assert int(one.ds["step"]) == int(one["c"]["step"]) == 20
    one.close()
    with xr.open_dataset(tmp_path / "t.lam", engine=ENGINE, group="c", step=1) as g:
        assert int(g.step) == 20


def test_a_static_step_dataset_beside_the_step_dimension(tmp_path):
    """A 0-D 'step' dataset marked static made every file that has it unreadable without
    step= (xarray: 'dimension step already exists as a scalar variable'): left out with a
    warning, read at one step."""
    path = tmp_path / "s.lam"
    with lamina.open(path, "w") as f:
        s = f.create_dataset("step", (), "i8")
        s.attrs["static"] = 1
        a = f.create_dataset("a", (3,), "f8")
        for k in range(2):
            with f.step():
                a[...] = k
                if k == 0:
                    s[()] = 100
    with pytest.warns(UserWarning, match="static"):
        with xr.open_dataset(path, engine=ENGINE) as ds:
            assert ds.sizes["step"] == 2 and "step" not in ds.data_vars
            assert ds.a.values.tolist() == [[0.0] * 3, [1.0] * 3]
    with xr.open_dataset(path, engine=ENGINE, step=1) as one:
        assert int(one.step) == 100


def test_numpy_string_attributes_are_written_as_strings(tmp_path):
    """flag_meanings as a numpy '<U' array (as xarray reads netCDF attributes) was refused
    by to_lamina; written as the list of strings (a 0-D one as a string)."""
    src = xr.Dataset(
        {"a": (("x",), [1.0], {"flag_meanings": np.array(["low", "high"]), "u": np.array("m")})}
    )
    to_lamina(src, tmp_path / "u.lam")
    with xr.open_dataset(tmp_path / "u.lam", engine=ENGINE) as back:
        assert back.a.attrs["flag_meanings"].tolist() == ["low", "high"]
        assert back.a.attrs["u"] == "m"


def test_roundtrip_dask_writes_chunks_as_blocks(tmp_path):
    src = _sample("f8").chunk({"y": 2, "x": 3})
    to_lamina(src, tmp_path / "s.lam")
    with lamina.open(tmp_path / "s.lam") as f:
        assert len(f["a"].blocks(0)) == 4
    with xr.open_dataset(tmp_path / "s.lam", engine=ENGINE, chunks={}) as back:
        assert back.a.chunks == ((2, 2), (3, 2))
        xr.testing.assert_identical(back.compute(), src.compute())


def test_roundtrip_datatree(tmp_path):
    tree = xr.DataTree.from_dict(
        {
            "/": xr.Dataset(attrs={"title": "tree"}),
            "/fluid": _sample("f8"),
            "/fluid/sub": xr.Dataset({"q": (("k",), np.arange(3, dtype="u1"))}),
        }
    )
    to_lamina(tree, tmp_path / "t.lam")
    with xr.open_datatree(tmp_path / "t.lam", engine=ENGINE) as back:
        xr.testing.assert_identical(back.load(), tree)


def test_write_refuses_what_lamina_cannot_store(tmp_path):
    ds = xr.Dataset({"s": ("x", np.array(["a", "b"]))})
    with pytest.raises(TypeError, match="numbers only"):
        to_lamina(ds, tmp_path / "s.lam")


def test_write_refusals_leave_the_destination_as_it_was(tmp_path):
    """What lamina cannot store (a datetime coordinate, an attribute None or a dict) is refused
    before the file is opened: an existing file is kept, none is created."""
    import pandas as pd

    path = tmp_path / "keep.lam"
    good = xr.Dataset({"a": ("x", np.arange(4.0))})
    to_lamina(good, path)
    cases = (
        (
            xr.Dataset(
                {"t": (("time", "x"), np.ones((3, 4)))},
                coords={"time": pd.date_range("2020-01-01", periods=3)},
            ),
            "variable 'time' has dtype datetime64",
        ),
        (xr.Dataset({"a": ("x", np.arange(2.0), {"meta": {"n": 1}})}), "attribute 'meta'"),
        (xr.Dataset(attrs={"none": None}), "group '/': attribute 'none'"),
        # refused by the format only (surrogates, strings past 64 KiB): once refused late,
        # after mode 'w' had emptied the file
        (xr.Dataset(attrs={"source": "caf\udce9"}), "attribute 'source'.*surrogates"),
        (xr.Dataset({"a": ("x", [1.0], {"h": "x" * 70000})}), "attribute 'h'.*format limit"),
    )
    lzf = xr.Dataset({"v": ("x", np.arange(3.0))})
    lzf.v.encoding["compression"] = "lzf"  # (an HDF5 filter lamina has not)
    cases += (
        (lzf, "variable 'v': unknown codec 'lzf'"),
        (xr.Dataset({"a": ("x", np.arange(2.0))}), None),  # (fine: a control)
        (xr.Dataset({".": ("x", np.arange(2.0))}), "variable '.': a dataset needs a name"),
        (xr.Dataset({"": ("x", np.arange(2.0))}), "variable '': a dataset needs a name"),
        (xr.Dataset({"..": ("x", np.arange(2.0))}), "variable '..': invalid path component"),
        (xr.Dataset({"a": ("x", np.arange(2.0))}), None),
    )
    for k, (bad, text) in enumerate(cases):
        if text is None:
            continue
        with pytest.raises((TypeError, ValueError), match=text):
            to_lamina(bad, path)
        with pytest.raises((TypeError, ValueError), match=text):
            to_lamina(bad, tmp_path / f"new{k}.lam")
        assert not (tmp_path / f"new{k}.lam").exists()
    with xr.open_dataset(path, engine=ENGINE) as back:
        xr.testing.assert_identical(back.load(), good)


def test_a_renamed_variable_is_dropped_by_the_name_it_shows(tmp_path):
    """drop_variables takes the names the Dataset shows: a dataset 'y' over (y, x) is the
    variable 'var_y', and drop_variables=['var_y'] left it there."""
    path = str(tmp_path / "drop.lam")
    with lamina.open(path, "w") as f:
        for name in ("y", "v"):
            f.create_dataset(name, data=np.ones((3, 4))).attrs["dims"] = ["y", "x"]
    with xr.open_dataset(path, engine=ENGINE) as ds:
        assert sorted(ds.data_vars) == ["v", "var_y"]
    with xr.open_dataset(path, engine=ENGINE, drop_variables=["var_y"]) as ds:
        assert list(ds.data_vars) == ["v"]


def test_a_renamed_dataset_does_not_replace_another(tmp_path):
    """A dataset named like one of its dimensions is renamed (NAME_y); where the group holds
    a dataset of that name already, it is NAME_y_2 (with a warning), not written over it."""
    path = str(tmp_path / "rename.lam")
    with lamina.open(path, "w") as f:
        a = f.create_dataset("var_y", data=np.ones((2, 3)))
        a.attrs["dims"] = ["y", "n"]
        b = f.create_dataset("y", data=-np.ones((2, 3)))
        b.attrs["dims"] = ["y", "n"]
    with pytest.warns(
        UserWarning, match=r"'var_y' is taken in the group: it is the variable 'var_y_2'"
    ):
        ds = xr.open_dataset(path, engine=ENGINE)
    with ds:
        assert sorted(ds.data_vars) == ["var_y", "var_y_2"]
        np.testing.assert_array_equal(ds["var_y"].values, np.ones((1, 2, 3)))  # (one step)
        np.testing.assert_array_equal(ds["var_y_2"].values, -np.ones((1, 2, 3)))


@pytest.mark.parametrize("first", ["a", "z"])
def test_named_dimensions_win_over_default_names_in_either_order(tmp_path, first):
    """A dataset without 'dims' gets dim_0; one whose 'dims' names dim_0 (as xarray's own
    default) of another length keeps it, whichever comes first: the default is the one made
    distinct (dim_0_3), where the file failed to open when the default came first."""
    path = str(tmp_path / "dims.lam")
    unnamed, named = ("a", "z") if first == "a" else ("z", "a")
    with lamina.open(path, "w") as f:
        f.create_dataset(unnamed, data=np.arange(3.0))
        f.create_dataset(named, data=np.arange(5.0)).attrs["dims"] = ["dim_0"]
    with xr.open_dataset(path, engine=ENGINE) as ds:
        assert ds[named].dims == ("step", "dim_0") and ds[unnamed].dims == ("step", "dim_0_3")
        assert ds.sizes == {"step": 1, "dim_0": 5, "dim_0_3": 3}


def test_writing_over_the_file_a_dataset_reads_from_is_refused(tmp_path):
    """A Dataset read lazily from a lamina file, written back to that file in mode 'w',
    would have removed what it still had to read (h5py refuses to truncate an open file):
    refused before the file is touched; once loaded it may be written there."""
    path = tmp_path / "self.lam"
    to_lamina(xr.Dataset({"T": ("x", np.arange(1000.0))}), path)
    with xr.open_dataset(path, engine=ENGINE) as ds:
        edited = ds.assign_attrs(note="edited")
        with pytest.raises(ValueError, match=r"variable 'T' is read lazily from .*self.lam"):
            to_lamina(edited, str(path) + "/")  # (another spelling of the same path)
        np.testing.assert_array_equal(ds.T.values, np.arange(1000.0))
        to_lamina(edited, tmp_path / "other.lam")  # another file: fine
        loaded = edited.load()
    to_lamina(loaded, path)
    with xr.open_dataset(path, engine=ENGINE) as back:
        assert back.attrs["note"] == "edited"
        np.testing.assert_array_equal(back.T.values, np.arange(1000.0))
    # a result computed from it lazily has no source any more, but its graph reads the file
    # (it was written over it: the file emptied, the write failing)
    ds = xr.open_dataset(path, engine=ENGINE, chunks={})
    doubled = ds * 2
    assert "source" not in doubled.T.encoding
    with pytest.raises(ValueError, match=r"self.lam' is open for reading .* variable 'T'"):
        to_lamina(doubled, path)
    ds.close()
    to_lamina(xr.Dataset({"T": ("x", np.arange(3.0))}) * 2, path)  # in memory: written
    with xr.open_dataset(path, engine=ENGINE) as back:
        np.testing.assert_array_equal(back.T.values, [0.0, 2.0, 4.0])


def test_append_adds_names_and_refuses_clashes_before_writing(tmp_path):
    """mode='a' adds variables beside the file's, coordinates too (the file's 'lat' became a
    data variable: the list of coordinates was replaced); a name the file holds, or a
    dimension of another length, is refused before the file is touched (refused midway, the
    group's attributes were replaced and the variables before the clash left empty; the
    other length was written, and the group no longer opened)."""
    path = tmp_path / "app.lam"
    first = xr.Dataset(
        {"T": ("y", [1.0, 2.0, 3.0])},
        coords={"lat": ("y", [10.0, 20.0, 30.0])},
        attrs={"title": "original"},
    )
    to_lamina(first, path)
    with lamina.open(path) as f:
        before = (dict(f.attrs), sorted(f), f.steps)
    clashes = (
        (
            xr.Dataset(
                {"new": ("y", [5.0, 6.0, 7.0]), "T": ("y", [3.0, 4.0, 5.0])}, attrs={"title": "X"}
            ),
            lamina.ExistsError,
            "holds 'T' already",
        ),
        (xr.Dataset({"w": ("y", [1.0, 2.0])}), ValueError, "dimension 'y' has length 2, and 3"),
    )
    for bad, kind, text in clashes:
        with pytest.raises(kind, match=text):
            to_lamina(bad, path, mode="a")
        with lamina.open(path) as f:
            assert (dict(f.attrs), sorted(f), f.steps) == before
    more = xr.Dataset({"P": ("y", [4.0, 5.0, 6.0])}, coords={"lon": ("y", [1.0, 2.0, 3.0])})
    to_lamina(more, path, mode="a")
    with xr.open_dataset(path, engine=ENGINE, step=-1) as ds:
        assert sorted(ds.coords) == ["lat", "lon", "step"] and sorted(ds.data_vars) == ["P", "T"]
        np.testing.assert_array_equal(ds.P.values, [4.0, 5.0, 6.0])
        np.testing.assert_array_equal(ds.lat.values, [10.0, 20.0, 30.0])


def test_a_compressed_variable_keeps_its_codec_under_a_key_of_its_own(tmp_path):
    """A lamina dataset's codecs come as encoding['lamina_compression'] (xarray's netCDF
    backends take 'compression' as a string: h5netcdf failed on lamina's list), and
    to_lamina writes them again; an explicit encoding['compression'] still counts."""
    path = tmp_path / "comp.lam"
    with lamina.open(str(path), "w") as f:
        f.create_dataset("v", data=np.arange(100.0).reshape(10, 10), compression="zstd")
    with xr.open_dataset(path, engine=ENGINE) as ds:
        assert ds.v.encoding["lamina_compression"] == [{"id": "zstd"}]
        assert "compression" not in ds.v.encoding
        to_lamina(ds, tmp_path / "copy.lam")
        other = ds.copy()
        other.v.encoding = {"compression": "gzip"}
        to_lamina(other, tmp_path / "gzip.lam")
    with lamina.open(str(tmp_path / "copy.lam")) as f:
        assert [c["id"] for c in f["v"].compression] == ["zstd"]
    with lamina.open(str(tmp_path / "gzip.lam")) as f:
        assert [c["id"] for c in f["v"].compression] == ["zlib"]


@pytest.mark.slow
def test_reads_a_file_written_by_four_ranks(tmp_path):
    """4 ranks write one Dataset (each its part) with to_lamina; this process reads it back."""
    path = tmp_path / "mpi.lam"
    mu.run_mpi(4, "xarray_write", path, timeout=120, env=mu.child_env())
    want = _scenario("xarray_write").expected()
    with lamina.open(path) as f:
        ranks = {b.rank for b in f["T"].blocks(0)}
        assert ranks == {0, 1, 2, 3}  # every rank wrote a part
    with xr.open_dataset(path, engine=ENGINE, chunks={}) as back:
        xr.testing.assert_identical(back.compute(), want)


def _scenario(name: str):
    spec = importlib.util.spec_from_file_location(f"scenario_{name}", mu.scenario(name))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_listing_engines_does_not_import_lamina(tmp_path):
    """xarray loads every backend's entry point to list its engines: lamina's must not start MPI."""
    site = tmp_path / "site"  # a stand-in for the installed entry point (as in `registered`)
    if "lamina" not in importlib.metadata.entry_points(group="xarray.backends").names:
        info = site / "lamina_xarray_entry-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: lamina-xarray-entry\nVersion: 0\n"
        )
        (info / "entry_points.txt").write_text(
            "[xarray.backends]\nlamina = lamina_xarray_entry:LaminaBackendEntrypoint\n"
        )
    src = os.path.dirname(os.path.dirname(lamina.__file__))
    code = (
        "import sys, xarray as xr\n"
        "engines = xr.backends.list_engines()\n"
        "assert 'lamina' in engines, sorted(engines)\n"
        "assert engines['lamina'].guess_can_open('run.lam/')\n"
        "assert not engines['lamina'].guess_can_open('run.nc')\n"
        "print(sorted(m for m in ('lamina', 'mpi4py') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), src])}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_static_attribute_that_says_false_is_not_static(tmp_path):
    """A 'static' attribute spelled as a string: "false" (or "0") says not static, as 0 and
    False do; it was taken for true, as any string but '' was."""
    from lamina.xarray import conventions as cv

    assert [cv.is_static({"static": v}) for v in ("false", "0", "no", "")] == [False] * 4
    assert [cv.is_static({"static": v}) for v in ("true", "1", "Yes", 1, np.bool_(True))] == [
        True
    ] * 5
    assert not cv.is_static({}) and not cv.is_static({"static": 0})
    path = str(tmp_path / "s.lam")
    with lamina.open(path, "w") as f:
        a = f.create_dataset("a", (3,), "f8")
        a.attrs.update({"static": "false", "dims": ["x"]})
        for k in range(2):
            with f.step():
                a[...] = k
    with xr.open_dataset(path, engine=ENGINE) as ds:
        assert ds.a.dims == ("step", "x")
        np.testing.assert_array_equal(ds.a.values, [[0.0] * 3, [1.0] * 3])
