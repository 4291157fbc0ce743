"""Smoke test of ``lamina bench catalog``: a tiny run that reports every phase for both tools.

Not a timed test: it checks that both files are written and opened, that
each phase is timed for lamina and ADIOS2, and that the index size and the
memory figures are there and plausible.
"""

from __future__ import annotations

import json
import sys

import pytest

from lamina.bench import catalog


def test_bench_catalog_smoke_json(tmp_path, capsys):
    assert (
        catalog.main(
            ["--steps", "3", "--blocks", "50", "--repeat", "1", "--dir", str(tmp_path), "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 3 and out["blocks"] == 50
    tools = [r["tool"] for r in out["rows"]]
    assert tools == ["lamina", "adios2 BP5"]
    for r in out["rows"]:
        assert r["index_bytes"] > 0 and r["write_s"] > 0
        for phase in ("open", "step index", "read one"):
            assert r[phase]["median"] > 0 and len(r[phase]["times"]) == 1
    mem = out["memory"]
    # one decoded step of 50 blocks costs more than the whole undecoded file's share per block
    assert mem["step_bytes_per_block"] > mem["open_bytes_per_block"] >= 0
    assert not list(tmp_path.iterdir())  # both files removed


def test_bench_catalog_refuses_nonsense(capsys):
    assert catalog.main(["--blocks", "1"]) == 2
    assert "need --steps >= 1" in capsys.readouterr().err


def test_bench_catalog_without_adios2(tmp_path, capsys, monkeypatch):
    """ADIOS2 is an optional extra: without it the bench leaves its rows out with a note and
    prints lamina's, as write, read, blocks and async do."""
    monkeypatch.setitem(sys.modules, "adios2", None)  # import adios2 raises ImportError
    argv = ["--steps", "2", "--blocks", "4", "--repeat", "1", "--dir", str(tmp_path), "--json"]
    assert catalog.main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [r["tool"] for r in out["rows"]] == ["lamina"]
    assert "note: adios2 BP5 left out: adios2 is not installed" in captured.err
    assert not list(tmp_path.iterdir())


def test_bench_catalog_writes_imported_alternating_repeated(tmp_path, capsys, monkeypatch):
    """Each timed write finds its package already imported (the import is not part of the
    time), and --write-repeat writes each tool that many times in alternating order."""
    pytest.importorskip("adios2")
    monkeypatch.delitem(sys.modules, "adios2")  # restored afterwards
    calls = []

    def recorder(name, fn):
        def record(path, steps, blocks):
            calls.append((name, "adios2" in sys.modules))
            fn(path, steps, blocks)

        return record

    monkeypatch.setattr(catalog, "_write_lamina", recorder("lamina", catalog._write_lamina))
    monkeypatch.setattr(catalog, "_write_adios2", recorder("adios2 BP5", catalog._write_adios2))
    argv = ["--steps", "2", "--blocks", "4", "--repeat", "1", "--write-repeat", "3"]
    assert catalog.main([*argv, "--dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lam, bp = "lamina", "adios2 BP5"
    assert [n for n, _ in calls] == [lam, bp, bp, lam, lam, bp]
    assert all(imported for _, imported in calls)
    assert all(len(r["write_times"]) == 3 for r in out["rows"])
    assert not list(tmp_path.iterdir())
    assert catalog.main(["--write-repeat", "0"]) == 2
