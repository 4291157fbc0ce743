"""Group trees deeper than Python's recursion limit (1,000 frames): every walk of a tree
lists, prints and converts them (a path may have 2,048 parts), in the order of a shallow
tree's walk."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import lamina
from lamina import cli

#: groups above the dataset: past the recursion limit, within the path limit
DEPTH = 1500
#: the same for the import of a Zarr store, past a recursion limit lowered to ZARR_LIMIT
ZARR_DEPTH, ZARR_LIMIT = 500, 300


def _deep_path(depth: int = DEPTH) -> str:
    return "/".join(["g"] * depth) + "/d"


@pytest.fixture
def deep_file(tmp_path) -> str:
    path = str(tmp_path / "deep.lam")
    with lamina.open(path, "w", durable=False) as f:
        ds = f.create_dataset(_deep_path(), shape=(2,), dtype="f8")
        ds.attrs["units"] = "m"
        f.attrs["x"] = 1
        with f.step():
            ds[...] = [1.0, 2.0]
    return path


def _expected_walk(depth: int = DEPTH) -> list[str]:
    return ["/" + "/".join(["g"] * (i + 1)) for i in range(depth)] + ["/" + _deep_path(depth)]


def test_walk_of_a_tree_deeper_than_the_recursion_limit(deep_file):
    """Group.walk recursed a generator per level: RecursionError at 1,000 levels."""
    assert sys.getrecursionlimit() < DEPTH
    with lamina.open(deep_file) as f:
        assert [p for p, _ in f.walk()] == _expected_walk()
        mid = f["/".join(["g"] * 700)]
        assert [p for p, _ in mid.walk()] == _expected_walk()[700:]
        ds = next(obj for p, obj in f.walk() if p.endswith("/d"))
        np.testing.assert_array_equal(ds[...], [1.0, 2.0])


def test_walk_order_is_depth_first_members_sorted(tmp_path):
    """Each member, then everything below it, before the next member (sorted by name)."""
    path = str(tmp_path / "tree.lam")
    with lamina.open(path, "w", durable=False) as f:
        for name in ("b/y/d2", "b/x", "a/z/d1", "a/d0", "c", "b/y/a"):
            f.create_dataset(name, shape=(1,))
        f.create_group("b/w")
    with lamina.open(path) as f:
        assert [p for p, _ in f.walk()] == [
            "/a",
            "/a/d0",
            "/a/z",
            "/a/z/d1",
            "/b",
            "/b/w",
            "/b/x",
            "/b/y",
            "/b/y/a",
            "/b/y/d2",
            "/c",
        ]
        assert [p for p, _ in f["b"].walk()] == ["/b/w", "/b/x", "/b/y", "/b/y/a", "/b/y/d2"]
        kinds = {p: type(o).__name__ for p, o in f.walk()}
        assert kinds["/b/y"] == "Group" and kinds["/b/y/d2"] == "Dataset"


def test_ls_of_a_tree_deeper_than_the_recursion_limit(deep_file, capsys):
    """``lamina ls`` walked the tree with Group.walk: RecursionError, as a one-line error."""
    rc = cli.main(["ls", deep_file])
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err[-500:]
    lines = out.splitlines()
    assert "1 dataset" in lines[0]
    tree = [ln for ln in lines[1:] if not ln.strip().startswith("@")]
    assert tree[0] == "/"
    assert tree[1:-1] == ["  " * (i + 1) + "g/" for i in range(DEPTH)]
    assert tree[-1].startswith("  " * (DEPTH + 1) + "d  float64 (2,)  steps 0 (1 of 1)")
    assert out.rstrip().endswith("  " * (DEPTH + 2) + "@units = 'm'")
    rc = cli.main(["ls", deep_file, "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    doc = json.loads(out)
    assert [n["path"] for n in doc["nodes"]] == ["/", *_expected_walk()]


def test_html_repr_of_a_tree_deeper_than_the_recursion_limit(deep_file):
    with lamina.open(deep_file) as f:
        html = f._repr_html_()
        assert "lamina.File" in html and "more" not in html.split("<ul>")[0]


def test_hdf5_export_of_a_tree_deeper_than_the_recursion_limit(deep_file, tmp_path):
    """The export walked the tree with Group.walk (RecursionError), and made each group by
    its whole path from the root (h5py looks each of its parts up: O(depth) a group)."""
    h5py = pytest.importorskip("h5py")
    from lamina import hdf5

    h5 = tmp_path / "deep.h5"
    res = hdf5.convert(deep_file, h5, progress=False)
    assert res.groups == DEPTH and res.datasets == 1
    with h5py.File(h5, "r") as h:
        d = h[_deep_path()]
        np.testing.assert_array_equal(d[0], [1.0, 2.0])
        assert d.attrs["units"] == "m"
        assert list(h["/".join(["g"] * (DEPTH - 1))].keys()) == ["g"]


def _deep_store(tmp_path, depth: int) -> str:
    """An OME-Zarr store lamina made of a dataset *depth* groups down: a store of one group
    exported, its group's metadata copied into the groups added below it (Zarr makes
    each group of a path checking every one above it: 16 s for 200 levels)."""
    import shutil

    from lamina import omezarr

    src = str(tmp_path / "shallow.lam")
    with lamina.open(src, "w", durable=False) as f:
        f.create_dataset("g/d", shape=(2,), dtype="f8")
        with f.step():
            f["g/d"][...] = [3.0, 4.0]
    store = str(tmp_path / "deep.zarr")
    omezarr.convert(src, store, progress=False)
    top = os.path.join(store, "g")
    meta = [n for n in os.listdir(top) if n.startswith(".")]
    image = os.path.join(store, "d.image")
    os.rename(os.path.join(top, "d"), image)
    below = top
    for _ in range(depth - 1):
        below = os.path.join(below, "g")
        os.mkdir(below)
        for n in meta:
            shutil.copy(os.path.join(top, n), os.path.join(below, n))
    os.rename(image, os.path.join(below, "d"))
    return store


def _remove_deep(top: str) -> None:
    """Remove the directory tree *top* without recursion (shutil.rmtree recurses a level a
    directory: pytest's removal of old temporary directories would fail on this one)."""
    todo = [top]
    while todo:
        here = todo[-1]
        below = [e.path for e in os.scandir(here) if e.is_dir(follow_symlinks=False)]
        if below:
            todo += below
            continue
        for e in os.scandir(here):
            os.unlink(e.path)
        os.rmdir(here)
        todo.pop()


@pytest.fixture
def deep_store(tmp_path):
    pytest.importorskip("zarr")
    store = _deep_store(tmp_path, ZARR_DEPTH)
    try:
        yield store
    finally:
        _remove_deep(store)


def test_zarr_import_of_a_tree_deeper_than_the_recursion_limit(deep_store, tmp_path):
    """The import of a store walked its groups recursively: RecursionError at 1,000 levels.
    The tree passes a recursion limit lowered for the test (Zarr's own opening of a group n
    levels down costs n: 1,500 levels took 12 s)."""
    from lamina import omezarr

    store = deep_store
    back = tmp_path / "back.lam"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(ZARR_LIMIT)
    try:
        res = omezarr.convert(store, back, progress=False)
    finally:
        sys.setrecursionlimit(limit)
    assert res.groups == ZARR_DEPTH and res.datasets == 1
    with lamina.open(back) as b:
        assert [p for p, _ in b.walk()] == _expected_walk(ZARR_DEPTH)
        np.testing.assert_array_equal(b[_deep_path(ZARR_DEPTH)][...], [3.0, 4.0])


def test_zarr_walk_order_is_unchanged(tmp_path):
    """Groups and images of a store are taken depth first, members sorted by name."""
    pytest.importorskip("zarr")
    from lamina import omezarr

    src = str(tmp_path / "tree.lam")
    with lamina.open(src, "w", durable=False) as f:
        for name in ("b/y/d2", "b/x", "a/z/d1", "a/d0", "c"):
            f.create_dataset(name, shape=(2,))
        f.create_group("b/w")
        with f.step():
            f["c"][...] = 1
    store = tmp_path / "tree.zarr"
    omezarr.convert(src, store, progress=False)
    back = tmp_path / "back.lam"
    omezarr.convert(store, back, progress=False)
    with lamina.open(src) as a, lamina.open(back) as b:
        assert [p for p, _ in a.walk()] == [p for p, _ in b.walk()]
