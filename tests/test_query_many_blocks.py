"""Queries over steps of many blocks: answers pinned, and Python objects only where needed.

The block answer works on the columns of the block tables (starts, stops,
statistics); these tests pin what it answers on a grid with holes, datasets
with the grid's blocks in another order or with other blocks, and derived
quantities with and without blocks, so that no change to how units are made
and judged can change an answer: the units and their order, the candidates,
the exact answer, and the blocks and bytes each answer reads.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import lamina
from lamina import geometry
from lamina.geometry import Box
from lamina.query import source as source_mod


def field(shape, k):
    """Smooth values in [0, 1] with a little noise (arithmetic: the same on every machine)."""
    i, j = np.indices(shape)
    noise = ((i * 7919 + j * 104729 + k * 15485863) % 1009) / 1009.0
    return 0.45 + 0.4 * np.sin(i / (7.0 + k)) * np.cos(j / (5.0 + k)) + 0.1 * noise


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory):
    """(72, 60) in 360 cells of 3 x 4, every 7th unwritten (holes): ``a`` (f8, two NaNs, fill
    -1) and ``n`` (i4) over the cells, ``g/b`` (f4, fill NaN) over the same cells written in
    the reverse order, ``c`` over 8 slabs of other blocks (one missing, fill 2), ``s`` derived
    as its expression (no blocks) and ``e`` derived with statistics."""
    path = str(tmp_path_factory.mktemp("many") / "grid.lam")
    shape = (72, 60)
    cells = [Box((r, c), (r + 3, c + 4)) for r in range(0, 72, 3) for c in range(0, 60, 4)]
    kept = [b for k, b in enumerate(cells) if k % 7 != 3]
    a = field(shape, 1)
    a[5, 7] = a[40, 33] = np.nan
    b = field(shape, 2).astype("f4")
    n = (field(shape, 3) * 10).astype("i4")
    c = field(shape, 4)
    with lamina.open(path, "w", durable=False) as f:
        da = f.create_dataset("a", shape, "f8", fill=-1.0)
        db = f.create_dataset("g/b", shape, "f4", fill=np.nan)
        dn = f.create_dataset("n", shape, "i4", fill=0)
        dc = f.create_dataset("c", shape, "f8", fill=2.0)
        f.derive("s", "a * 2 + `g/b`", strategy="expression")
        f.derive("e", "a + n", strategy="stats")
        with f.step():
            for bx in kept:
                da[bx.slices] = a[bx.slices]
                dn[bx.slices] = n[bx.slices]
            for bx in reversed(kept):
                db[bx.slices] = b[bx.slices]
            for r in range(0, 72, 8):
                if r != 16:
                    dc[r : r + 8] = c[r : r + 8]
    return path


def digest(x) -> str:
    h = hashlib.sha256()
    if isinstance(x, np.ndarray):
        h.update(str((x.dtype.str, x.shape)).encode())
        h.update(np.ascontiguousarray(x).tobytes())
    else:
        h.update(repr(x).encode())
    return h.hexdigest()[:16]


def fingerprint(r) -> dict:
    """Counts and digests of everything a result answers (units and candidates in order)."""
    out = {
        "grid": r.grid,
        "units": (r.units, digest([(u.start, u.stop) for u in r.unit_boxes])),
        "candidates": (len(r.candidates), digest([(u.start, u.stop) for u in r.candidates])),
        "certain": (sum(r.certain), digest([bool(c) for c in r.certain])),
        "candidate_values": digest([digest(v[p]) for v in r.candidate_values for p in sorted(v)]),
        "candidate_read": (r.candidate_blocks_read, r.candidate_bytes_read),
    }
    if r.exact:
        out["count"] = r.count
        out["coords"] = digest(r.coords)
        out["values"] = digest([digest(r.values[p]) for p in sorted(r.values)])
        out["exact_read"] = (r.exact_blocks_read, r.exact_bytes_read)
    return out


#: (condition, arguments, fingerprint) as the query engine answered them when each unit was a
#: Box made from the block table and the ranges lists of Intervals
PINNED = [
    (
        "a > 0.9",
        {},
        {
            "grid": "a",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (15, "de74db7a16271799"),
            "certain": (0, "da24643615a1bf0c"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (0, 0),
            "count": 37,
            "coords": "18d031a23d7e51c4",
            "values": "4f53cda18c2baa0c",
            "exact_read": (15, 1440),
        },
    ),
    (
        "a > 0.9",
        {"exact": False},
        {
            "grid": "a",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (15, "de74db7a16271799"),
            "certain": (0, "da24643615a1bf0c"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (0, 0),
        },
    ),
    (
        "a < 0.2 & `g/b` > 0.5",
        {"select": ["g/b"]},
        {
            "grid": "a",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (16, "d01c89a7790123c4"),
            "certain": (0, "8d29a8b7c3431b5c"),
            "candidate_values": "6d21b9ed08e6ba26",
            "candidate_read": (16, 768),
            "count": 49,
            "coords": "36a258dc501332c8",
            "values": "b87d7d52b4d43267",
            "exact_read": (16, 1536),
        },
    ),
    (
        "n == 3",
        {"select": ["a", "n"]},
        {
            "grid": "n",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (94, "fb6f63d9fe3c33df"),
            "certain": (1, "c52947998cd52f60"),
            "candidate_values": "b982b55051c62cc4",
            "candidate_read": (188, 13536),
            "count": 475,
            "coords": "c4021b960704705a",
            "values": "7834121458ad5dcb",
            "exact_read": (0, 0),
        },
    ),
    (
        "n + 1 > 9 | a != a",
        {},
        {
            "grid": "n",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (309, "3ab1640c5ee76c93"),
            "certain": (0, "e1bf2e098c96b1ec"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (0, 0),
            "count": 37,
            "coords": "312416e912405cbe",
            "values": "4f53cda18c2baa0c",
            "exact_read": (618, 44496),
        },
    ),
    (
        "a > 0.5 & c < 0.3",
        {"select": ["c"]},
        {
            "grid": "a",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (186, "86fb91b004fcc7dc"),
            "certain": (0, "8ee7c5166995a815"),
            "candidate_values": "f0201ae570b461ae",
            "candidate_read": (8, 17344),
            "count": 300,
            "coords": "8e4b334d6e2b17c7",
            "values": "56d618ea43128969",
            "exact_read": (186, 17856),
        },
    ),
    (
        "a < 0",
        {"region": "5:50, 7:41"},
        {
            "grid": "a",
            "units": (160, "562f6ea914f7d047"),
            "candidates": (24, "f3c0f65864838bca"),
            "certain": (24, "af5c3ec2c6655cba"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (0, 0),
            "count": 222,
            "coords": "e7acd0386a4586c3",
            "values": "4f53cda18c2baa0c",
            "exact_read": (0, 0),
        },
    ),
    (
        "a < 0",
        {"region": "5:50, 7:41", "exact": False},
        {
            "grid": "a",
            "units": (160, "562f6ea914f7d047"),
            "candidates": (24, "f3c0f65864838bca"),
            "certain": (24, "af5c3ec2c6655cba"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (0, 0),
        },
    ),
    (
        "e > 8.5",
        {"select": ["e"]},
        {
            "grid": "e",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (33, "215fe56f8ce81c58"),
            "certain": (4, "e35534771486056d"),
            "candidate_values": "5482eee71d0dc90a",
            "candidate_read": (66, 4752),
            "count": 182,
            "coords": "fcf1439da3f99563",
            "values": "4714a1827d531a47",
            "exact_read": (0, 0),
        },
    ),
    (
        "s > 2.5",
        {"select": ["s"]},
        {
            "grid": "s",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (23, "77cf719718ec477f"),
            "certain": (0, "7e93601250fb2956"),
            "candidate_values": "6adf45bdf601c520",
            "candidate_read": (618, 44496),
            "count": 95,
            "coords": "285c3af9450ac148",
            "values": "939f0b01b32098cd",
            "exact_read": (0, 0),
        },
    ),
    (
        "s < 0.4 & a > 0.1",
        {"region": "10:70, 3:57"},
        {
            "grid": "a",
            "units": (315, "a0e35ab1d99fb46d"),
            "candidates": (7, "6f0c465bbe0d0ba4"),
            "certain": (0, "53fcf5e00fb82fd3"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (540, 33312),
            "count": 12,
            "coords": "c5950d571c792853",
            "values": "4f53cda18c2baa0c",
            "exact_read": (7, 608),
        },
    ),
    (
        "`g/b` < 0.2",
        {"exact": False, "select": "a"},
        {
            "grid": "g/b",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (41, "0c49a8b3aaf21fe8"),
            "certain": (7, "af33ef167ee3e243"),
            "candidate_values": "22ac898a7c2419a7",
            "candidate_read": (41, 3936),
        },
    ),
    (
        "c > 1.5",
        {},
        {
            "grid": "c",
            "units": (9, "4dd34baa153797b5"),
            "candidates": (1, "d9c650b8f318c015"),
            "certain": (1, "b78c88a26a2b512a"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (0, 0),
            "count": 480,
            "coords": "e9b59b4598fc6bbe",
            "values": "4f53cda18c2baa0c",
            "exact_read": (0, 0),
        },
    ),
    (
        "a >= 0",
        {"region": np.s_[33]},
        {
            "grid": "a",
            "units": (15, "03acbf96e5315ea2"),
            "candidates": (13, "748c87a9115db59b"),
            "certain": (13, "ef2e9280f4e65656"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (0, 0),
            "count": 52,
            "coords": "54ebdd8d0040f527",
            "values": "4f53cda18c2baa0c",
            "exact_read": (0, 0),
        },
    ),
]

#: the same file with the statistics of every 5th block of ``a`` missing: units decided by
#: statistics alternate with units whose ranges are read (in runs broken by decided units)
PINNED_PARTLY = [
    (
        "a > 0.9",
        {},
        {
            "grid": "a",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (15, "de74db7a16271799"),
            "certain": (0, "da24643615a1bf0c"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (62, 5952),
            "count": 37,
            "coords": "18d031a23d7e51c4",
            "values": "4f53cda18c2baa0c",
            "exact_read": (12, 1152),
        },
    ),
    (
        "a > 0.9",
        {"exact": False},
        {
            "grid": "a",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (15, "de74db7a16271799"),
            "certain": (0, "da24643615a1bf0c"),
            "candidate_values": "4f53cda18c2baa0c",
            "candidate_read": (62, 5952),
        },
    ),
    (
        "a < 0.2 & `g/b` > 0.5",
        {"select": ["g/b"]},
        {
            "grid": "a",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (16, "d01c89a7790123c4"),
            "certain": (0, "8d29a8b7c3431b5c"),
            "candidate_values": "6d21b9ed08e6ba26",
            "candidate_read": (58, 4800),
            "count": 49,
            "coords": "36a258dc501332c8",
            "values": "b87d7d52b4d43267",
            "exact_read": (14, 1344),
        },
    ),
    (
        "n == 3 & a > 0.3",
        {"select": ["a"]},
        {
            "grid": "n",
            "units": (360, "0aa9d0c2d6d322c6"),
            "candidates": (80, "2fa889895864da3a"),
            "certain": (1, "011ff8e7d386872f"),
            "candidate_values": "57a383c944c417af",
            "candidate_read": (82, 7872),
            "count": 345,
            "coords": "ce3862ea2cd2b592",
            "values": "7f91a491c3081a07",
            "exact_read": (79, 3792),
        },
    ),
]


@pytest.mark.parametrize("text,kw,want", PINNED, ids=[f"{t} {k}" for t, k, _ in PINNED])
def test_answers_pinned(grid_file, text, kw, want):
    with lamina.open(grid_file) as f:
        assert fingerprint(f.query(text, **kw)) == want


@pytest.mark.parametrize(
    "text,kw,want", PINNED_PARTLY, ids=[f"{t} {k}" for t, k, _ in PINNED_PARTLY]
)
def test_answers_pinned_with_some_statistics_missing(grid_file, monkeypatch, text, kw, want):
    table = source_mod.Source.table

    def partly(self, path):
        t = table(self, path)
        if path == "a":
            t.has_stats = t.has_stats & (np.arange(t.n) % 5 != 2)
        return t

    monkeypatch.setattr(source_mod.Source, "table", partly)
    with lamina.open(grid_file) as f:
        assert fingerprint(f.query(text, **kw)) == want


@pytest.mark.parametrize("exact", [False, True])
def test_a_box_per_candidate_not_per_block(tmp_path, monkeypatch, exact):
    """Over a step of 10,000 blocks of which a few can match, the query makes Python boxes for
    the candidates (and their reads), not one per block: the units stay columns of the block
    table, and ``r.unit_boxes`` makes a box only when one is asked for."""
    nb = 10_000
    path = str(tmp_path / "many.lam")
    values = np.random.default_rng(0).random((nb, 4))
    with lamina.open(path, "w", durable=False) as f:
        ds = f.create_dataset("x", (nb * 4,), "f8")
        with f.step():
            ds.write_blocks(values, np.arange(nb).reshape(nb, 1) * 4)
    made = []
    post_init = geometry.Box.__post_init__

    def counted(self):
        made.append(1)
        post_init(self)

    with lamina.open(path) as f:
        view = f.at(0)
        monkeypatch.setattr(geometry.Box, "__post_init__", counted)
        r = view.query("x > 0.9995", exact=exact)
        monkeypatch.undo()
    hits = values.max(axis=1) > 0.9995
    assert r.units == nb and len(r.candidates) == int(hits.sum()) > 0
    assert r.candidates == [Box((4 * i,), (4 * i + 4,)) for i in np.flatnonzero(hits).tolist()]
    if exact:
        assert r.count == int((values > 0.9995).sum())
    assert len(made) < 20 * len(r.candidates) + 100 < nb // 10
    # the units as a sequence of boxes, made when asked for
    units = r.unit_boxes
    assert units[0] == Box((0,), (4,)) and units[-1] == Box((4 * nb - 4,), (4 * nb,))
    assert units[1:3] == [Box((4,), (8,)), Box((8,), (12,))]
    assert Box((4,), (8,)) in units and Box((4,), (9,)) not in units
    assert sum(u.size for u in units) == 4 * nb
