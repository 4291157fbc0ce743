"""Jupyter's HTML view of files, groups and datasets: the tree and its facts, no data read."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np

import lamina


class _Check(HTMLParser):
    """Collects the text and checks that every element opened is closed."""

    VOID = {"br", "hr", "img", "input", "meta", "link"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _text(html: str) -> str:
    p = _Check()
    p.feed(html)
    p.close()
    assert not p.stack, p.stack
    return " ".join(" ".join(p.text).split())


def _file(path):
    with lamina.open(path, "w") as f:
        f.attrs["title"] = "a <b>bold</b> title"
        T = f.create_dataset("fields/T", shape=(8, 6), dtype="f4", compression="zstd")
        T.attrs["units"] = "K"
        f.create_dataset("fields/u", shape=(8, 6))
        f.create_dataset("fields/v", shape=(8, 6))
        f.derive("fields/speed", "magnitude(`fields/u`, `fields/v`)", strategy="stats")
        for k in range(3):
            with f.step():
                T[0:4, :] = np.full((4, 6), k, "f4")
                T[4:8, :] = np.zeros((4, 6), "f4")
                f["fields/u"][...] = 1.0
                f["fields/v"][...] = 2.0


def test_file_group_dataset_html(tmp_path, monkeypatch):
    path = tmp_path / "r.lam"
    _file(path)
    with lamina.open(path) as f:
        reads = []
        monkeypatch.setattr(f.engine, "get", lambda *a, **k: reads.append(a))
        text = _text(f._repr_html_())
        assert "lamina.File" in text and "3 steps" in text
        assert "T float32 (8, 6) steps 0-2 (3 of 3) 6 blocks" in text
        assert "compression zstd" in text
        assert "@units 'K'" in text
        assert "@title 'a <b>bold</b> title'" in text  # escaped: shown as text, not markup
        assert "derived = magnitude(`fields/u`, `fields/v`) (strategy stats)" in text
        g = _text(f["fields"]._repr_html_())
        assert "lamina.Group /fields" in g and "4 members" in g
        d = _text(f["fields/T"]._repr_html_())
        assert "lamina.Dataset /fields/T" in d and "float32 (8, 6)" in d
        v = _text(f.at(1)._repr_html_())
        assert "at step 1" in v
        assert reads == []  # metadata only
    assert "closed" in _text(f._repr_html_())


def test_html_counts_bytes_from_the_block_tables(tmp_path, monkeypatch):
    """The repr and `lamina info` sum stored and raw bytes from a step's table columns, not
    through an object per block (a file of millions of blocks took minutes to show), and
    find the sums those objects give."""
    from lamina.api.html import dataset_facts
    from lamina.engines.base import BlockInfo

    path = tmp_path / "r.lam"
    _file(path)
    with lamina.open(path) as f:
        ds = f["fields/T"]
        want_stored = sum(b.nbytes for k in range(f.steps) for b in ds.blocks(k))
        want_raw = sum(b.raw_nbytes for k in range(f.steps) for b in ds.blocks(k))

        def no_objects(*a, **k):
            raise AssertionError("a block object was built")

        monkeypatch.setattr(BlockInfo, "from_row", no_objects)
        facts = dataset_facts(ds)
        assert (facts["stored"], facts["raw"]) == (want_stored, want_raw)
        assert facts["blocks"] == 6 and want_raw == 3 * 8 * 6 * 4
        f._repr_html_()


def test_html_says_what_lamina_ls_says_of_every_dataset(tmp_path, monkeypatch, capsys):
    """The repr's line of a multiresolution dataset names its layout and counts every band
    (it said 'compression none' and counted the patches' band 0 alone), a component of a
    vector quantity shows its definition (it said 'never written'), and a tree's storage is
    summed for all its datasets at once (one dataset at a time, a tree of 200 datasets over
    1,000 steps took 16-46 s)."""
    from lamina.catalog import Catalog
    from lamina.cli import main as cli

    path = str(tmp_path / "h.lam")
    x = np.linspace(0, 1, 40)
    with lamina.open(path, "w") as f:
        m = f.create_dataset("mr", (40, 40), layout=lamina.Multires(patch=16, tolerance=1e-6))
        for c in ("u", "v", "w"):
            f.create_dataset(c, (4, 5, 6))
        f.derive("vex", "curl(u, v, w)", strategy="expression")
        with f.step():
            m[...] = np.sin(x[:, None] * 3) * np.cos(x[None, :] * 2)
            for c in ("u", "v", "w"):
                f[c][...] = np.random.default_rng(1).random((4, 5, 6))
    assert cli(["ls", path]) == 0
    ls = capsys.readouterr().out
    mr_line = next(line.strip() for line in ls.splitlines() if line.strip().startswith("mr "))
    with lamina.open(path) as f:
        calls = []
        storage = Catalog.storage
        monkeypatch.setattr(
            Catalog, "storage", lambda self, *a, **k: calls.append(a) or storage(self, *a, **k)
        )
        text = _text(f._repr_html_())
        assert len(calls) == 1  # every dataset of the tree at once
        assert " ".join(mr_line.split()[1:]) in text, (mr_line, text)
        assert "compression multires(patch 16x16, tolerance 1e-06, 5 levels)" in text
        comp = _text(f["vex/x"]._repr_html_())
        assert (
            "computed when read" in comp and "derived = curl(u, v, w) (strategy expression)" in comp
        )
        assert "derived = curl(u, v, w)" in _text(f["vex"]._repr_html_())


def test_reprs_count_in_the_singular(tmp_path):
    """repr() of a file of one step and a group of one member: '1 steps', '(1 members)'."""
    with lamina.open(str(tmp_path / "one.lam"), "w") as f:
        f.create_dataset("g/a", shape=(2,))
        with f.step():
            f["g/a"][...] = 1.0
        assert repr(f).endswith("1 step)>") and repr(f["g"]) == "<lamina.Group '/g' (1 member)>"
