"""Smoke test of ``lamina bench steps``: a tiny run that times every method at two dataset counts.

Not a timed test: it checks that each method wrote and read (what every
method reads back is compared inside the benchmark), that the files are
gone, and that nonsense arguments are refused.
"""

from __future__ import annotations

import json
import sys

from lamina.bench import steps


def test_bench_steps_smoke_json(tmp_path, capsys):
    argv = ["--datasets", "1,3", "--elements", "8", "--steps", "2", "--warmup", "1"]
    assert steps.main([*argv, "--repeat", "1", "--dir", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [r["datasets"] for r in out["rows"]] == [1, 3]
    for r in out["rows"]:
        for phase in ("write", "read"):
            for m in steps.METHODS:
                assert r[phase][m]["median"] > 0 and len(r[phase][m]["times"]) == 1
    assert "lamina/adios2 BP5" in captured.err
    assert "\nwrite\n" in captured.err and "\nread\n" in captured.err
    assert not list(tmp_path.iterdir())  # every file removed


def test_bench_steps_refuses_nonsense(capsys):
    from lamina.bench import main as bench

    for argv, message in (
        (["--datasets", "0"], "--datasets: expected positive integers, got '0'"),
        (["--datasets", "x"], "--datasets: expected comma-separated integers, got 'x'"),
        (["--seed", "-1"], "--seed >= 0"),  # (numpy's ValueError, a traceback)
        (["--methods", "lamina,hdf6"], "--methods: unknown ['hdf6']"),
    ):
        assert bench(["steps", *argv]) == 2
        assert message in capsys.readouterr().err


def test_bench_steps_without_adios2(tmp_path, capsys, monkeypatch):
    """ADIOS2 is an optional extra: without it the bench leaves its method out with a note
    and prints lamina's rows, as write, read, blocks and async do."""
    monkeypatch.setitem(sys.modules, "adios2", None)  # import adios2 raises ImportError
    argv = ["--datasets", "2", "--elements", "4", "--steps", "1", "--warmup", "0"]
    assert steps.main([*argv, "--repeat", "1", "--dir", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "adios2 BP5" not in out["methods"] and "lamina" in out["methods"]
    assert set(out["rows"][0]["write"]) == set(steps.METHODS) - {"adios2 BP5"}
    assert "note: adios2 BP5 left out: adios2 is not installed" in captured.err
    assert "lamina/numpy" in captured.err and "lamina/adios2 BP5" not in captured.err
