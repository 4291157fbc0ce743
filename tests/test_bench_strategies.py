"""Smoke test of ``lamina bench strategies``: a tiny run that must finish and print its tables.

Nothing here checks a speed (a benchmark is a program, not a timed test):
only that every strategy is written and queried, that the answers agree, the
bytes read and the storage are what lamina's design says, and that the
report has the tables and the targets.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest

import lamina.bench
from lamina.bench import strategies

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_util  # noqa: E402

CAL = perf_util.CAL


@pytest.fixture
def calfile(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text(CAL.to_json())
    return str(p)


def test_grid():
    shape = strategies.grid(256 << 20, 64)
    assert shape[0] % 64 == 0 and shape[1] == shape[2]
    n = 3 * math.prod(shape) * 8
    assert 0.95 * (256 << 20) <= n <= 256 << 20
    assert strategies.grid(1000, 1)[0] >= 3  # curl needs 3 cells along every axis
    assert strategies.grid(1 << 20, 7)[0] % 7 == 0


def test_curl_fields_ramp():
    shape = (8, 5, 6)
    f = strategies.curl_fields(shape)
    cx = np.gradient(f["vz"], axis=1, edge_order=2) - np.gradient(f["vy"], axis=2, edge_order=2)
    want = np.broadcast_to(1 + 2 * np.arange(8)[:, None, None] / 7, shape)
    assert np.allclose(cx, want)
    m = strategies.magnitude_fields(shape)
    mag = np.sqrt(m["vx"] ** 2 + m["vy"] ** 2 + m["vz"] ** 2)
    assert np.all(np.diff(mag.min(axis=(1, 2))) > 0)  # rises along axis 0


def test_bench_strategies_json(tmp_path, calfile, capsys):
    rc = lamina.bench.main(
        [
            "strategies",
            "--size",
            "2MiB",
            "--blocks",
            "8,4",
            "--repeat",
            "1",
            "--fractions",
            "10,100",
            "--calibration",
            calfile,
            "--dir",
            str(tmp_path / "files"),
            "--json",
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    text = cap.err
    for s in (
        "$ lamina bench strategies --size 2MiB",
        "1 process (one rank)",
        f"read from {calfile}",
        "#### magnitude",
        "#### curl",
        "S3D case: vx where vmag < x",
        "#### targets",
        "pred/meas",
    ):
        assert s in text, f"{s!r} missing from the report:\n{text}"
    assert "history: pred/meas" in text and "model on history within" in text
    assert [(m["kernel"], m["blocks"]) for m in doc["kernels"]] == [
        ("magnitude", 8),
        ("curl", 8),
        ("magnitude", 4),
        ("curl", 4),
    ]
    assert doc["history_source"].startswith("what the derived layer timed in this run")
    before = os.environ["LAMINA_HISTORY"]
    assert not os.path.exists(before)  # the runs' history went elsewhere, and was removed
    for m in doc["kernels"][:2]:  # 8 blocks: predicted from what was timed at 4, and back
        for s in ("store", "stats"):
            assert m["write"][s]["source_history"] == "history"
            assert m["write"][s]["predicted_history"] > 0
        for q in m["queries"]:
            for s in strategies.STRATEGIES:
                r = q["read"][s]
                assert r["source_history"] == "history" and r["total_predicted_history"] > 0
                assert r["ratio_history"] == pytest.approx(
                    r["total_predicted_history"] / r["total_measured"]
                )
    for m in doc["kernels"]:
        n = math.prod(m["shape"])
        inputs = 3 * n * 8
        blocks = m["blocks"]
        c = 3 if m["kernel"] == "curl" else 1
        # storage: the derived data for store, next to nothing for the others
        assert m["write"]["store"]["storage_measured"] >= c * n * 8
        assert m["write"]["expression"]["storage_measured"] < 4096
        assert m["storage_check"]["met"]
        assert [q["candidates"] for q in m["queries"]] == [1, blocks]
        for q in m["queries"]:
            assert q["achieved"] == pytest.approx(q["candidates"] / blocks)
            r = q["read"]
            assert r["store"]["bytes_read"] == pytest.approx(q["achieved"] * c * n * 8)
            assert r["stats"]["bytes_read"] >= q["achieved"] * inputs
            assert r["expression"]["bytes_read"] >= inputs
            for s in strategies.STRATEGIES:
                assert r[s]["total_predicted"] > 0 and r[s]["total_measured"] > 0
            chk = q["s3d_check"]
            assert chk["stats_met"] and chk["expression_met"] and chk["counts_agree"]
            assert q["s3d"]["store"]["candidate_bytes"] == q["s3d"]["stats"]["candidate_bytes"]
    # the files were kept in --dir only while running
    assert not any((tmp_path / "files").iterdir())


def _tiny_run(capsys, calfile: str, *more: str) -> tuple[dict, str]:
    """One block count of magnitude at 1 MiB, one query: (the JSON document, the report)."""
    rc = lamina.bench.main(
        ["strategies", "--size", "1MiB", "--blocks", "4", "--repeat", "1", "--fractions", "100"]
        + ["--kernels", "magnitude", "--calibration", calfile, "--json", *more]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out), cap.err


def test_bench_strategies_predicts_from_an_earlier_run(tmp_path, calfile, capsys):
    """One block count: an untimed run before the timed ones records the history that predicts
    them, as a job run again on the same machine; nothing of it reaches the host's history."""
    doc, err = _tiny_run(capsys, calfile, "--dir", str(tmp_path / "files"))
    assert doc["history"] == "earlier" and doc["options"]["history"] == "earlier"
    assert doc["history_source"] == strategies.HISTORY_SOURCES["earlier"]
    assert doc["history_source"] in err
    (m,) = doc["kernels"]
    for s in ("store", "stats"):
        assert m["write"][s]["source_history"] == "history"
    for s in strategies.STRATEGIES:
        r = m["queries"][0]["read"][s]
        assert r["source_history"] == "history" and r["total_predicted_history"] > 0
    assert not os.path.exists(os.environ["LAMINA_HISTORY"])
    assert not any((tmp_path / "files").iterdir())


def test_bench_strategies_host_history_without_samples(tmp_path, calfile, capsys):
    """--history host on a host without history: the model on history has nothing to say."""
    doc, _ = _tiny_run(capsys, calfile, "--history", "host")
    assert doc["history_source"] == strategies.HISTORY_SOURCES["host"]
    (m,) = doc["kernels"]
    assert m["write"]["store"]["source_history"] != "history"


def test_bench_strategies_bad_options(capsys):
    assert lamina.bench.main(["strategies", "--history", "others", "--blocks", "8"]) == 2
    assert "two block counts" in capsys.readouterr().err
    assert lamina.bench.main(["strategies", "--history", "nope"]) == 2
    assert lamina.bench.main(["strategies", "--kernels", "nope"]) == 2
    assert lamina.bench.main(["strategies", "--fractions", "0"]) == 2
    assert lamina.bench.main(["strategies", "--blocks", "0"]) == 2
    assert lamina.bench.main(["strategies", "--blocks", "8,8"]) == 2
    assert lamina.bench.main(["strategies", "--blocks", "8,x"]) == 2
    assert "strategies" in lamina.bench.BENCHMARKS


def test_expression_computes_what_the_model_counts(tmp_path):
    """Eq. 2's factor a for a vector kept as an expression is what the derived layer computes:
    the candidates twice (once to find them, once for the other components) unless every
    block is a candidate (the layer still holds the box the condition was computed over)."""
    from lamina.perf.model import _again

    case = strategies.CASES["curl"]
    blocks = 8
    shape = strategies.grid(1 << 20, blocks)
    n = math.prod(shape)
    paths = {s: str(tmp_path / f"{s}.lam") for s in ("store", "expression")}
    fields = case.fields(shape)
    for s, p in paths.items():
        strategies.write_file(p, case, fields, blocks, s)
    fractions = [1 / blocks, 0.5, 1.0]
    xs = strategies.thresholds(paths["store"], case, blocks, fractions)
    for q, x in zip(fractions, xs, strict=True):
        with lamina.open(paths["expression"], "r") as f:
            layer = f._engine
            while not hasattr(layer, "_computed"):
                layer = layer.inner
            res = f.query(f"{case.cond} < {x!r}", select=[case.derived], exact=False)
            got = res.candidate_elements / n
            assert got == pytest.approx(q)
            # halos: a candidate computed again reads its neighbours' planes, not more elements
            assert layer._computed == pytest.approx(_again(3, got) * n, rel=0.01)


def test_bench_strategies_shows_both_models_errors(tmp_path, calfile, capsys):
    """The derived model's errors of this run beside the background I/O model's last recorded
    run on this host, in one table; this run's recorded for the other benchmark to show."""
    from lamina.perf import checks

    earlier = checks.Check.of("async", [(1.0, 1.25), (2.0, 2.0)], "lamina bench async --ranks 2")
    checks.record([earlier])
    doc, err = _tiny_run(capsys, calfile)
    mc = doc["model_checks"]
    assert list(mc) == ["derived-history", "derived-calibration", "async"]
    reads = [r for m in doc["kernels"] for q in m["queries"] for r in q["read"].values()]
    assert mc["derived-calibration"]["pairs"] == [
        [r["total_predicted"], r["total_measured"]] for r in reads
    ]
    assert mc["derived-history"]["pairs"] == [
        [r["total_predicted_history"], r["total_measured"]] for r in reads
    ]
    assert mc["async"]["pairs"] == [[1.0, 1.25], [2.0, 2.0]]
    assert mc["async"]["summary"]["within_goal"] == 1
    rows = [ln for ln in err.splitlines() if ln.startswith(("| derived-", "| async"))]
    assert len(rows) == 3 and all("this run" in r for r in rows[:2])
    assert "this run" not in rows[2] and "2 of 2" in rows[2]
    assert "lamina bench async --ranks 2" in err
    got = checks.load()
    assert got["async"] == earlier
    assert [list(p) for p in got["derived-history"].pairs] == mc["derived-history"]["pairs"]
