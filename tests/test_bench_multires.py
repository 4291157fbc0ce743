"""``lamina bench multires`` runs end to end (small: the figures are in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def bench_json(*args: str) -> dict:
    """``lamina bench multires --quick --json ARGS`` in a child process: its JSON document."""
    out = subprocess.run(
        [sys.executable, "-m", "lamina.bench", "multires", "--quick", "--json", *args],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_bench_multires_quick_json():
    doc = bench_json("--ranks", "2", "--fields", "uneven")
    rows = doc["write"]["rows"]
    schemes = {(r["distribution"], r["aggregation"]) for r in rows}
    assert {
        ("balanced", "balanced"),
        ("greedy", "balanced"),
        ("balanced", "counts"),
        ("balanced", "local"),
    } <= schemes
    assert doc["failed_checks"] == []  # every file and read compared with the data
    for r in rows:
        assert r["stored"] > 0 and r["seconds"] > 0 and r["checked"]
        if r["distribution"] == "balanced":
            assert r["patches_spread"] <= 1
    assert all(c["lamina_maxerr"] <= c["tolerance"] for c in doc["compress"]["uneven"])
    levels = doc["read"]["uneven"]
    assert [x["level"] for x in levels] == list(range(len(levels)))
    assert all(x["ok"] for x in levels) and all(c["ok"] for c in doc["compress"]["uneven"])
    assert levels[-1]["bytes"] < levels[0]["bytes"]
    sim = doc["simulate"][0]
    assert sim["ranks"] == 10_000 and sim["sizes"] == "synthetic"
    assert sim["distribute/balanced"]["patches_max_minus_min"] <= 1
    for scheme in ("balanced", "counts"):
        assert {"messages", "bytes_max_over_mean", "plan_seconds"} <= set(
            sim[f"aggregate/{scheme}"]
        )
    assert (
        sim["aggregate/balanced"]["bytes_max_over_mean"]
        <= sim["aggregate/counts"]["bytes_max_over_mean"]
    )


def test_bench_multires_size_grid_quick_json():
    """The size-grid path: measured sizes interpolated to 4 ranks, aggregated and written."""
    doc = bench_json("--parts", "size-grid", "--size-grid", "4", "--fields", "uneven", "cth")
    assert "write" not in doc and "simulate" not in doc
    g = doc["size_grid"]
    assert "uneven" in g["measured"]
    for m in g["measured"].values():
        assert m["rank_grid"] == [2, 2, 2]
        assert sum(m["rank_bytes"]) == m["bytes"] and sum(m["rank_patches"]) == m["patches"]
        assert 0 < m["patch_min"] <= m["patch_max"]
    (job,) = g["jobs"]
    assert job["ranks"] == 4
    rows = job["rows"]
    for name, info in job["fields"].items():
        assert info["patches"] == 4 * 8  # 2 x 2 x 2 patches per rank in quick mode
        mine = [r for r in rows if r["field"] == name]
        runs = {(r["aggregation"], r["aggregators"]) for r in mine}
        assert runs == {(a, f) for a in ("balanced", "counts") for f in (4, 2, 1)} | {("local", 4)}
        by = {(r["aggregation"], r["aggregators"]): r for r in mine}
        for r in mine:
            # every byte allocated is written exactly once: the subfiles add up, each patch in place
            assert r["bytes"] == info["bytes"] and r["file_bytes"] == r["bytes"]
            assert r["checked"]
            assert r["seconds"] > 0 and set(r["phases"]) == {"plan", "exchange", "write", "fsync"}
            assert r["agg_balance"] >= 1
        assert by[("local", 4)]["messages"] == 0
        for f in (4, 2, 1):
            assert by[("balanced", f)]["agg_balance"] <= by[("counts", f)]["agg_balance"] + 1e-12
            assert by[("balanced", f)]["agg_bytes_max"] <= by[("counts", f)]["agg_bytes_max"]


def test_size_grid_interpolation():
    import numpy as np

    from lamina.bench.multires import trilinear, virtual_ranks

    rng = np.random.default_rng(0)
    sizes = rng.integers(100, 30_000, (8, 4, 4))
    assert np.array_equal(trilinear(sizes, sizes.shape), sizes)  # the same grid: unchanged
    fine = trilinear(sizes, (15, 7, 7))
    # corners aligned: every second point of the finer grid is a measured one
    assert np.allclose(fine[::2, ::2, ::2], sizes)
    assert sizes.min() <= fine.min() and fine.max() <= sizes.max()
    # 8 ranks of a measured rank's box reproduce the measured sizes; more ranks keep their spread
    v = virtual_ranks(sizes, 8, (4, 2, 2))
    assert v["dims"] == [2, 2, 2] and sorted(v["sizes"]) == sorted(sizes.reshape(-1))
    assert np.array_equal(np.bincount(v["owner"]), np.full(8, 16))
    v = virtual_ranks(sizes, 32, (4, 2, 2))
    assert v["sizes"].size == 32 * 16 and np.array_equal(np.bincount(v["owner"]), np.full(32, 16))
    # a 100x ramp across the domain survives whole: the end samples keep their values
    ramp = np.broadcast_to(np.rint(100 * 100 ** (np.arange(8) / 7))[:, None, None], (8, 4, 4))
    v = virtual_ranks(ramp, 64, (4, 2, 2))
    assert (v["sizes"].min(), v["sizes"].max()) == (100, 10_000)


def test_a_constant_field_is_reported_without_its_error_ratio():
    """A field whose range is 0 (the real data cut to 32^3 is all zeros) has tolerance 0:
    its row says '-' for maxerr/tol, where the report divided by 0 after every measurement."""
    from lamina.bench.multires import _report_compress

    row = dict(rel=0.01, lamina_ratio=240.0, lamina_psnr=float("inf"), lamina_maxerr=0.0)
    row.update(tolerance=0.0, zfp_ratio=1489.5, zfp_psnr=float("inf"), zstd_ratio=5957.8)
    out: list[str] = []
    _report_compress({"compress": {"cth": [dict(row, lamina_mibps=12.0)]}}, out)
    line = next(x for x in "\n".join(out).splitlines() if x.startswith("| cth"))
    assert [c.strip() for c in line.split("|")[1:-1]][3:5] == ["inf", "-"]
