"""``lamina bench insitu`` with tiny sizes: every method runs, data checks pass, the report has the targets."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

from lamina.bench import insitu  # noqa: E402

pytest.importorskip("mpi4py")


def test_layout():
    lay = insitu.layout(64 << 20, 3, 1)
    assert lay["bytes"] <= 64 << 20 and lay["bytes"] > 63 << 20
    assert lay["rows"] * insitu.ROW * 8 == 32 << 20
    tiny = insitu.layout(100, 6, 2)  # at least one row and particle per producer/consumer pair
    assert tiny["rows"] >= 12 and tiny["npart"] >= 12


def test_bench_insitu_smoke(capsys, monkeypatch, tmp_path):
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        pytest.skip("no mpiexec")
    monkeypatch.delenv("LAMINA_TRANSPORT", raising=False)
    rc = insitu.main(
        [
            "--ranks",
            "2,4",
            "--size",
            "256KiB",
            "--steps",
            "2",
            "--repeat",
            "2",
            "--warmup",
            "0",
            "--dir",
            str(tmp_path),
            "--timeout",
            "50",
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert [(j["producers"], j["consumers"]) for j in doc["jobs"]] == [(1, 1), (3, 1)]
    for j in doc["jobs"]:
        assert not j["failed_checks"]
        assert [r["name"] for r in j["rows"]] == list(insitu.METHODS)
        assert all(len(r["times"]) == 2 and r["min"] > 0 for r in j["rows"])
        assert j["memcpy_floor_s"] > 0 and j["bytes"] == 2 * j["step_bytes"]
    for what in (
        "lamina memory / hand-written",
        "lamina file / lamina memory",
        "lamina file / native write+read",
        "oversubscribed" if (os.cpu_count() or 1) < 4 else "3 producer + 1 consumer",
    ):
        assert what in out.err
    assert not os.listdir(tmp_path)  # the job's files are removed


class _Opened(Exception):
    """Raised by the stand-in for lamina.open once it has recorded its arguments."""


def _file_worker(durable: bool) -> insitu.Worker:
    """A producer Worker without MPI, enough to call its file methods."""
    w = insitu.Worker.__new__(insitu.Worker)
    w.producer = True
    w.ns = insitu.worker_parser().parse_args(
        ["--size", "1024", "--steps", "1", "--dir", "d", "--out", "o"]
        + (["--durable"] if durable else [])
    )
    return w


@pytest.mark.parametrize("durable", [False, True])
def test_insitu_file_methods_durable_option(monkeypatch, durable):
    """The file methods open with durable=False (no fsync at every commit, as the memory and
    hand-written methods never touch the disk) unless --durable."""
    import lamina

    calls = []

    def fake_open(path, mode="r", **options):
        calls.append((mode, options))
        raise _Opened

    monkeypatch.setattr(lamina, "open", fake_open)
    w = _file_worker(durable)
    for method in (w.file, w.plain):
        with pytest.raises(_Opened):
            method("x.lam")
    assert calls == [("w", {"transport": "file", "durable": durable})] * 2


@pytest.mark.parametrize("durable", [False, True])
def test_insitu_durable_reaches_jobs_and_report(monkeypatch, capsys, tmp_path, durable):
    seen = []

    def fake_launch(producers, consumers, args, timeout):
        ns = insitu.worker_parser().parse_args(args + ["--out", "o"])
        seen.append(ns.durable)
        return {
            "producers": producers,
            "consumers": consumers,
            "steps": 1,
            "step_bytes": 8,
            "bytes": 8,
            "grid": [1, insitu.ROW],
            "particles": 1,
            "memcpy_floor_s": 1e-6,
            "durable": ns.durable,
            "rows": [],
            "failed_checks": [],
        }

    monkeypatch.setattr(insitu, "launch_job", fake_launch)
    argv = ["--ranks", "2", "--size", "64KiB", "--steps", "1", "--dir", str(tmp_path)]
    assert insitu.main(argv + (["--durable"] if durable else [])) == 0
    out = capsys.readouterr().out
    assert seen == [durable]
    want = "durable=True (lamina fsyncs" if durable else "durable=False (page cache, nobody fsyncs)"
    assert want in out.splitlines()[0]
