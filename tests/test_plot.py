"""``lamina plot`` and lamina.plot: PNGs of slices (Agg), block outlines, vectors, per-step statistics."""

from __future__ import annotations

import sys

import numpy as np
import pytest

mpl_image = pytest.importorskip("matplotlib.image")

import lamina  # noqa: E402
from lamina import plot  # noqa: E402
from lamina.cli import main  # noqa: E402


def _file(path):
    """A 3-D front on 2 x 2 blocks, 3 steps, a 0-D time, a vector derived quantity (curl)."""
    shape = (8, 12, 16)
    z = np.arange(shape[2])
    with lamina.open(path, "w") as f:
        T = f.create_dataset("fields/T", shape=shape, dtype="f8")
        T.attrs["dims"] = ["x", "y", "z"]
        T.attrs["units"] = "K"
        for c in ("u", "v", "w"):
            f.create_dataset(f"fields/{c}", shape=shape).attrs["dims"] = ["x", "y", "z"]
        f.create_dataset("fields/z", shape=(shape[2],)).attrs["units"] = "m"
        f.derive("fields/vort", "curl(`fields/u`, `fields/v`, `fields/w`)", strategy="stats")
        t = f.create_dataset("time", (), "f8")
        t.attrs["units"] = "s"
        for k in range(3):
            with f.step():
                front = np.where(z < 4 + 3 * k, 1800.0, 300.0)
                full = np.broadcast_to(front, shape) + np.arange(shape[1])[None, :, None]
                for x0 in (0, 4):
                    for y0 in (0, 6):
                        box = np.s_[x0 : x0 + 4, y0 : y0 + 6, :]
                        T[box] = full[box]
                X, Y, Z = np.meshgrid(*(np.arange(n, dtype=float) for n in shape), indexing="ij")
                f["fields/u"][...] = np.sin(Y / 3.0)
                f["fields/v"][...] = np.cos(Z / 4.0)
                f["fields/w"][...] = X * 0.1
                f["fields/z"][...] = np.linspace(0.0, 1.5e-3, shape[2])
                t[()] = 1e-4 * k


def _image(path):
    img = mpl_image.imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    return img


def _not_blank(img) -> None:
    rgb = img[..., :3]
    assert float(rgb.std()) > 0.05  # more than a background
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 50  # a colormap, not a few flat colours


def test_slice_png_renders(tmp_path):
    path = tmp_path / "p.lam"
    _file(path)
    out = tmp_path / "T.png"
    with lamina.open(path) as f:
        pic = plot.slice_png(f, "fields/T", out, slices=["y=5"], step=1, blocks=True, dpi=80)
    img = _image(out)
    assert (img.shape[1], img.shape[0]) == (pic.width, pic.height)
    assert pic.width > 300 and pic.height > 250
    _not_blank(img)
    assert "y=5" in pic.what and "step 1" in pic.what


def test_vector_magnitude_and_coordinates(tmp_path):
    path = tmp_path / "p.lam"
    _file(path)
    with lamina.open(path) as f:
        pic = plot.slice_png(f, "fields/vort", tmp_path / "v.png", slices=["z=3"], dpi=70)
        assert pic.what.startswith("|fields/vort|")
        with pytest.raises(lamina.NotFoundError, match="vector derived"):
            plot.slice_png(f, "fields", tmp_path / "g.png")
        with pytest.raises(lamina.SelectionError, match="no dimension 'q'"):
            plot.slice_png(f, "fields/T", tmp_path / "g.png", slices=["q=1"])
    _not_blank(_image(tmp_path / "v.png"))


def test_stats_from_block_statistics_alone(tmp_path, monkeypatch):
    path = tmp_path / "p.lam"
    _file(path)
    with lamina.open(path) as f:
        reads = []
        monkeypatch.setattr(f.engine, "get", lambda *a, **k: reads.append(a))
        s = plot.step_stats(f["fields/T"])
        np.testing.assert_allclose(plot.step_times(f), [0.0, 1e-4, 2e-4])
        pic = plot.stats_png(f, "fields/T", tmp_path / "s.png", dpi=70)
        assert reads == []  # no data read
    assert s["min"].tolist() == [300.0] * 3 and s["max"].tolist() == [1811.0] * 3
    _not_blank(_image(pic.path))


def test_cli_plot(tmp_path, capsys):
    path = tmp_path / "p.lam"
    _file(path)
    out = tmp_path / "cli.png"
    assert main(["plot", str(path), "fields/T", "--slice", "x=2", "--blocks", "-o", str(out)]) == 0
    assert "cli.png" in capsys.readouterr().out
    _not_blank(_image(out))
    assert main(["plot", str(path), "fields/T", "--stats", "-o", str(tmp_path / "s.png")]) == 0
    assert main(["plot", str(path), "fields/T", "--slice", "x=99"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_cli_plot_refuses_bad_options_in_one_line(tmp_path, capsys):
    """A colormap matplotlib does not know, a resolution of 0 or 100,000 dpi, an output that
    is not a PNG: a one-line error naming it and exit code 2, nothing drawn."""
    path = tmp_path / "p.lam"
    _file(path)
    out = str(tmp_path / "x.png")
    for args, text in (
        (["--cmap", "infern"], "unknown colormap 'infern'. Did you mean 'inferno'"),
        (["--dpi", "0"], "--dpi must be between 10 and 1200, got 0"),
        (["--dpi", "100000"], "got 100000"),
        (["-o", str(tmp_path / "x.txt")], "give -o a name ending in .png"),
    ):
        argv = ["plot", str(path), "fields/T", "-o", out, *args]
        assert main(argv) == 2, args
        err = capsys.readouterr().err
        assert text in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not list(tmp_path.glob("x.*"))


def test_static_coordinates_come_from_the_step_that_wrote_them(tmp_path):
    """A coordinate written once (``to_lamina`` writes those that do not change in step 0)
    gives the axes of a picture of a later step."""
    xr = pytest.importorskip("xarray")
    from lamina.xarray import to_lamina

    x = np.linspace(0.0, 1.0, 5)
    ds = xr.Dataset(
        {"T": (("step", "y", "x"), np.random.default_rng(0).random((2, 4, 5)))},
        coords={"x": x, "y": np.linspace(0.0, 2.0, 4)},
    )
    to_lamina(ds, tmp_path / "c.lam")
    with lamina.open(tmp_path / "c.lam") as f:
        assert f["x"].coverage(1) == []  # written in step 0 only
        np.testing.assert_array_equal(plot._coord(f, "/", "x", 5, 1, {}), x)
        plot.slice_png(f, "T", tmp_path / "c.png", step=1)
    _not_blank(_image(tmp_path / "c.png"))


def test_coordinates_without_values_at_the_step_give_index_axes(tmp_path):
    """A coordinate first written after the step drawn (NaN fill: pcolormesh refused it; fill
    0: every edge 0, a blank picture) or only in part: that axis is drawn by index, with a
    warning naming the coordinate; where it holds values, it gives the axis."""
    path = tmp_path / "c.lam"
    with lamina.open(path, "w") as f:
        T = f.create_dataset("T", shape=(4, 6), dtype="f8")
        T.attrs["dims"] = ["y", "x"]
        x = f.create_dataset("x", shape=(6,), dtype="f8", fill=np.nan)
        y = f.create_dataset("y", shape=(4,), dtype="f8")
        for k in range(2):
            with f.step():
                T[...] = np.arange(24.0).reshape(4, 6) + k
                y[:2] = [0.0, 1.0]  # in part: the rest reads as its fill
                if k == 1:
                    x[:] = np.linspace(0, 1, 6)
    with lamina.open(path) as f:
        with pytest.warns(UserWarning, match="coordinate 'x' holds no values at step 0"):
            assert plot._coord(f, "/", "x", 6, 0, {}) is None
        with pytest.warns(UserWarning, match="coordinate 'y' holds no values at step 1"):
            assert plot._coord(f, "/", "y", 4, 1, {}) is None
        np.testing.assert_array_equal(plot._coord(f, "/", "x", 6, 1, {}), np.linspace(0, 1, 6))
        with pytest.warns(UserWarning, match="drawn by index"):
            plot.slice_png(f, "T", tmp_path / "c.png", step=0)
    _not_blank(_image(tmp_path / "c.png"))


def test_coordinates_out_of_order_give_index_axes(tmp_path):
    """Coordinate centers that neither rise nor fall throughout ([3, 1, 2, 0]: cells drawn
    at the wrong places; constant: cells of no width, a blank picture) give an index axis,
    with a warning naming the coordinate; falling ones are an axis."""
    path = tmp_path / "o.lam"
    with lamina.open(path, "w") as f:
        for name, values in (
            ("x", [3.0, 1.0, 2.0, 0.0]),
            ("y", [0.0] * 4),
            ("z", [4.0, 3.0, 1.0, 0.0]),
        ):
            f.create_dataset(name, data=np.array(values))
    with lamina.open(path) as f:
        for name in ("x", "y"):
            with pytest.warns(
                UserWarning, match=f"'{name}' holds values that neither rise nor fall"
            ):
                assert plot._coord(f, "/", name, 4, 0, {}) is None
        np.testing.assert_array_equal(plot._coord(f, "/", "z", 4, 0, {}), [4.0, 3.0, 1.0, 0.0])


def test_stats_of_what_has_no_block_statistics_is_an_error(tmp_path, capsys):
    """--stats of a quantity kept as its expression drew empty axes and said it drew them."""
    path = tmp_path / "e.lam"
    with lamina.open(path, "w") as f:
        T = f.create_dataset("T", shape=(8,), dtype="f8")
        f.derive("T2", "T * 2", strategy="expression")
        for k in range(2):
            with f.step():
                T[...] = k
    out = tmp_path / "s.png"
    assert main(["plot", str(path), "T2", "--stats", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'/T2' has no block statistics at any of the 2 steps (a derived quantity kept" in err
    assert not out.exists()


def test_stats_of_infinities_and_complex_values_and_nothing(tmp_path, capsys):
    """inf and -inf in every step have a NaN mean: --stats said the dataset had no block
    statistics; complex blocks keep min and max of |z| and a sum of z, and the mean drawn
    (real part of the sum) fell outside the |z| band; a file of no step and a dataset of
    no values gave empty pictures and status 0."""
    path = tmp_path / "c.lam"
    with lamina.open(path, "w") as f:
        e = f.create_dataset("e", shape=(4,), dtype="f8")
        z = f.create_dataset("z", shape=(3,), dtype="c16")
        f.create_dataset("flat", shape=(0, 3), dtype="f8")
        for k in range(3):
            with f.step():
                e[...] = [1, np.inf, -np.inf, 2]
                z[...] = 5j * (k + 1)
    with lamina.open(path) as f:
        s = plot.step_stats(f["e"])
        assert s["min"].tolist() == [-np.inf] * 3 and s["max"].tolist() == [np.inf] * 3
        s = plot.step_stats(f["z"])
        assert s["min"].tolist() == s["max"].tolist() == [5.0, 10.0, 15.0]
        assert np.isnan(s["mean"]).all()  # no mean of |z| from the blocks
    for name in ("e", "z"):
        out = tmp_path / f"{name}.png"
        assert main(["plot", str(path), name, "--stats", "-o", str(out)]) == 0
        _image(out)
    assert main(["plot", str(path), "flat", "-o", str(tmp_path / "flat.png")]) == 2
    assert "the slice holds no values" in capsys.readouterr().err
    empty = tmp_path / "none.lam"
    with lamina.open(empty, "w") as f:
        f.create_dataset("x", shape=(4,))
    assert main(["plot", str(empty), "x", "--stats", "-o", str(tmp_path / "x.png")]) == 2
    assert "no committed step" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "flat.png").exists()


def test_output_named_without_extension_is_the_file_written(tmp_path, capsys):
    """matplotlib added '.png' to a name without one, and the command named a file that was
    not there."""
    path = tmp_path / "p.lam"
    _file(path)
    for args, name in ((["--slice", "x=2"], "pic"), (["--stats"], "stats")):
        out = tmp_path / name
        assert main(["plot", str(path), "fields/T", *args, "-o", str(out)]) == 0
        assert capsys.readouterr().out.startswith(f"{out}:")
        _not_blank(_image(out))
        assert not (tmp_path / f"{name}.png").exists()


def test_cli_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    path = tmp_path / "p.lam"
    _file(path)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["plot", str(path), "fields/T", "-o", str(tmp_path / "x.png")]) == 2
    assert "pip install 'lamina[plot]'" in capsys.readouterr().err


def test_stats_says_why_it_has_nothing_and_refuses_a_slices_options(tmp_path, capsys):
    """--stats of a dataset written with NaN alone said "no step wrote a block of it"; of
    one of no element, that too; and --slice, --step, --blocks and --index (nonsense ones
    too) were taken with --stats and left unused."""
    path = tmp_path / "n.lam"
    with lamina.open(path, "w") as f:
        v = f.create_dataset("v", shape=(4,), dtype="f8")
        f.create_dataset("none", shape=(0,), dtype="f8")
        for _ in range(2):
            with f.step():
                v[...] = np.nan
    out = str(tmp_path / "s.png")
    assert main(["plot", str(path), "v", "--stats", "-o", out]) == 2
    assert "its blocks hold no value that is not NaN" in capsys.readouterr().err
    assert main(["plot", str(path), "none", "--stats", "-o", out]) == 2
    assert "it holds no element" in capsys.readouterr().err
    for extra in (["--slice", "nosuch=99"], ["--step", "42"], ["--blocks"], ["--index"]):
        assert main(["plot", str(path), "v", "--stats", "-o", out, *extra]) == 2
        err = capsys.readouterr().err
        assert f"{extra[0]}: for a slice; --stats draws every step's statistics" in err, err
    assert not (tmp_path / "s.png").exists()


def test_an_empty_axis_the_picture_cuts_itself_says_the_slice_is_empty(tmp_path):
    """A dataset of shape (0, 4, 5): its empty first axis, cut in the middle by the picture
    (no --slice given), holds no value; the same error as an empty free axis (it was a
    BoundsError about an index 0 the user never gave)."""
    path = str(tmp_path / "e.lam")
    with lamina.open(path, "w") as f:
        e = f.create_dataset("e", (0, 4, 5), "f8")
        e.attrs["dims"] = ["z", "y", "x"]
        with f.step():
            pass
    with lamina.open(path) as f:
        with pytest.raises(lamina.SelectionError, match=r"shape \(0, 4, 5\): the slice holds no"):
            plot.slice_png(f, "e", str(tmp_path / "e.png"))
