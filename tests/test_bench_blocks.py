"""Smoke test of ``lamina bench blocks``: a tiny run that must finish and report every cost.

Not a timed test: nothing here checks a speed, only that every method runs
every phase (the benchmark verifies the data each one reads and fails
otherwise), that cases over ``--max-bytes`` are skipped and said so, and
that the JSON and the table carry the per-block costs, ratios and targets.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi_util import finish, start

from lamina.bench import blocks


def test_case_layout():
    c = blocks.Case.make(4, 12, 3, rank=1, size=2, seed=1)
    assert c.dims == (3, 2, 2)
    assert c.gshape == (24, 8, 8) and c.box.start == (12, 0, 0)
    # the region view puts every block at its corner
    region = c.region(c.data)
    for k in range(c.nblocks):
        rel = c.block_box(k).shift(tuple(-s for s in c.box.start))
        assert np.array_equal(region[rel.slices], c.data[k])
    # only the last block of the rank holds values above the threshold
    assert (c.data[:-1] < c.threshold).all() and (c.data[-1] > c.threshold).any()


def test_plan_skips_over_max_bytes():
    run, skipped = blocks.plan([4, 32], [64, 4096], 2 << 20)  # 32 KiB, 2 MiB; 16 MiB, 1 GiB
    assert run == [(4, 64), (4, 4096)]
    assert skipped == [(32, 64), (32, 4096)]


def test_bench_blocks_smoke_json(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "lamina.bench",
        "blocks",
        "--edges",
        "4",
        "--blocks",
        "64,4096",
        "--max-bytes",
        "64KiB",
        "--ranks",
        "1",
        "--steps",
        "2",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--dir",
        str(tmp_path),
        "--json",
    ]
    res = finish(start(cmd), cmd, 120)
    assert res.returncode == 0, res.describe()
    doc = json.loads(res.stdout)
    assert doc["benchmark"] == "blocks"
    assert doc["skipped"] == [{"edge": 4, "blocks": 4096}]
    assert [j["ranks"] for j in doc["jobs"]] == [1]
    entries = doc["entries"]
    assert sorted(e["phase"] for e in entries) == sorted(blocks.PHASES)
    for e in entries:
        assert (e["edge"], e["blocks"], e["bytes_per_step"]) == (4, 64, 64 * 4**3 * 8)
        want = set(blocks.FAMILIES) - ({blocks.BATCH} if e["phase"] != "write" else set())
        assert set(e["per_block"]) == want  # write_blocks: in the write phase only
        assert all(0 < v < 10 for v in e["per_block"].values()), e
        assert e["vs_adios2"] > 0 and e["vs_numpy"] > 0
        assert e["flat"] is None  # 64 blocks: below the flatness range
    (t,) = doc["targets"]
    assert t["ranks"] == 1 and t["edge"] == 4 and t["write_vs_adios2"] > 0
    assert t["batch_vs_adios2"] > 0
    err = res.stderr
    for text in (
        "### write",
        "### read-all",
        "### read-one",
        "### query",
        "### targets",
        "batch/adios2",
    ):
        assert text in err, f"{text!r} missing from the report:\n{err}"
    assert "skipped (over --max-bytes 64 KiB" in err
    assert list(tmp_path.iterdir()) == []


def test_bench_blocks_usage_errors():
    from lamina.bench import main

    assert main(["blocks", "--edges", "x"]) == 2
    assert main(["blocks", "--edges", "64", "--blocks", "65536", "--max-bytes", "1MiB"]) == 2
    assert main(["blocks", "--methods", "netcdf"]) == 2
