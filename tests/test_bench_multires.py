"""``lamina bench multires`` runs end to end (small: the figures are in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_bench_multires_quick_json():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lamina.bench",
            "multires",
            "--quick",
            "--ranks",
            "2",
            "--json",
            "--fields",
            "uneven",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["write"]["rows"]
    schemes = {(r["distribution"], r["aggregation"]) for r in rows}
    assert {
        ("balanced", "balanced"),
        ("greedy", "balanced"),
        ("balanced", "counts"),
        ("balanced", "local"),
    } <= schemes
    for r in rows:
        assert r["stored"] > 0 and r["seconds"] > 0
        if r["distribution"] == "balanced":
            assert r["patches_spread"] <= 1
    assert all(c["lamina_maxerr"] <= c["tolerance"] for c in doc["compress"]["uneven"])
    levels = doc["read"]["uneven"]
    assert [x["level"] for x in levels] == list(range(len(levels)))
    assert levels[-1]["bytes"] < levels[0]["bytes"]
    assert doc["simulate"][0]["distribute/balanced"]["patches_max_minus_min"] <= 1
