"""Smoke test of ``lamina bench stats``: a tiny run that reports every dtype against a memcpy.

Not a timed test: it checks that each dtype is timed both ways, that the
ratio is the one of the times, and that nonsense is refused by name.
"""

from __future__ import annotations

import json

import pytest

from lamina.bench import main as bench_main
from lamina.bench import stats as bench_stats


def test_bench_stats_smoke_json(capsys):
    assert (
        bench_stats.main(["--mib", "1", "--repeat", "2", "--dtypes", "f8,f4,i2,?", "--json"]) == 0
    )
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [r["dtype"] for r in out["rows"]] == ["float64", "float32", "int16", "bool"]
    for r in out["rows"]:
        assert r["bytes"] == 1 << 20
        for what in ("memcpy", "compute"):
            assert len(r[what]["times"]) == 2 and r[what]["min"] > 0
        assert r["ratio_best"] == pytest.approx(r["compute"]["min"] / r["memcpy"]["min"])
        assert r["ratio"] > 0
    assert "compute / memcpy" in captured.err and "<= 1.0x" in captured.err


@pytest.mark.parametrize(
    "args, why",
    [
        (["--dtypes", "f8,x"], "--dtypes: expected comma-separated dtypes, got 'f8,x'"),
        (["--dtypes", "S4"], "numeric dtypes only, got |S4"),
        (["--mib", "0"], "--mib and --repeat must be at least 1"),
    ],
)
def test_bench_stats_refuses_nonsense(args, why, capsys):
    assert bench_main(["stats", *args]) == 2
    assert why in capsys.readouterr().err
