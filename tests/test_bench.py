"""Smoke test of ``lamina bench write|read``: a tiny run that must finish and print its ratios.

Benchmarks are programs, not timed tests: nothing here checks a speed, only
that every method runs on 1 and 2 ranks, the data it wrote reads back (the
benchmark verifies that itself and fails otherwise), and the report has
the method names, the ratios and the targets.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from mpi_util import finish, start


def bench(tmp_path, *args, timeout=90):
    cmd = [
        sys.executable,
        "-m",
        "lamina.bench",
        *args,
        "--size",
        "1MiB",
        "--ranks",
        "1,2",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--dir",
        str(tmp_path),
    ]
    res = finish(start(cmd), cmd, timeout)
    assert res.returncode == 0, res.describe()
    return res


def test_bench_write_smoke(tmp_path):
    res = bench(tmp_path, "write")
    out = res.stdout
    for name in (
        "numpy tofile",
        "h5py 1 file",
        "adios2 BP5",
        "lamina agg=1",
        "lamina agg=2",
        "lamina agg=2 no-stats",
        "stats+crc only",
        "vs numpy",
        "vs h5py",
        "vs adios2",
        "### targets",
        "stats+crc overhead",
    ):
        assert name in out, f"{name!r} missing from the report:\n{out}"
    assert "1.00x" in out  # the reference against itself
    assert list(tmp_path.iterdir()) == [] or all(
        p.is_dir() and not any(p.iterdir()) for p in tmp_path.iterdir()
    )


def test_bench_read_smoke_json(tmp_path):
    res = bench(tmp_path, "read", "--json")
    doc = json.loads(res.stdout)
    assert doc["benchmark"] == "read"
    assert [j["ranks"] for j in doc["jobs"]] == [1, 2]
    names = {r["name"] for j in doc["jobs"] for r in j["rows"]}
    assert {
        "numpy fromfile",
        "h5py",
        "adios2 BP5",
        "lamina agg=1",
        "lamina agg=2",
        "lamina agg=1 out=",
        "lamina agg=2 out=",
        "lamina agg=2 slabs",
    } <= names
    assert all(t["vs_numpy"] and t["vs_numpy"] > 0 for t in doc["targets"])
    probe = doc["jobs"][-1]["probe"]
    whole = next(r for r in probe["rows"] if r["what"] == "one whole block")
    assert (
        whole["rchar"] == whole["box_bytes"] == 1 << 20
    )  # one block of 8: only its bytes are read
    assert "one block of a large file" in res.stderr  # the table goes to stderr with --json


def test_bench_usage_errors():
    from lamina.bench import main

    assert main([]) == 2
    assert main(["nosuch"]) == 2
    assert main(["write", "--size", "lots"]) == 2


@pytest.mark.parametrize(
    "text,n", [("64MiB", 64 << 20), ("1GiB", 1 << 30), ("512k", 512 << 10), ("4096", 4096)]
)
def test_parse_size(text, n):
    from lamina.bench.common import parse_size

    assert parse_size(text) == n


_READ_ONCE = """
import os, sys
import adios2, numpy as np
from lamina.bench import common
path = sys.argv[1]
with adios2.Stream(adios2.Adios().declare_io("w"), path, "w") as s:
    for _ in s.steps(1):
        s.write("x", np.arange(4.0))
with common.adios2_reader(path) as r:
    assert r.read("x").tolist() == [0.0, 1.0, 2.0, 3.0]
profile = f"/tmp/{os.path.basename(path)}_{os.getpid():x}_profiling.json"
print(profile, os.path.exists(profile))
"""


def test_adios2_baseline_reads_leave_no_profile_in_tmp(tmp_path):
    """ADIOS2's BP5 reader writes a profile into /tmp at every close; a benchmark that reads
    with it must not leave one behind per process."""
    import subprocess

    pytest.importorskip("adios2")
    path = tmp_path / f"lamina-test-{tmp_path.name}.bp"
    done = subprocess.run(
        [sys.executable, "-c", _READ_ONCE, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    profile, existed = done.stdout.split()
    assert existed == "True"  # ADIOS2 still writes it: the check below means something
    assert not os.path.exists(profile)


#: the functions of lamina.stats that compute a written block's statistics or checksums
_STATS_FUNCS = (
    "compute",
    "summarize",
    "summarize_flat",
    "summarize_rows",
    "piece_crcs",
    "segment_crcs",
)


@pytest.mark.parametrize(
    "shapes",
    [
        [(8192,)],  # one block of 64 KiB (stats.SMALL): staged, summarize_flat
        [(16,)] * 5,  # small blocks staged together: summarize_flat with piece_crcs
        [(1 << 17,)],  # one block of 1 MiB: compute
    ],
)
def test_write_no_stats_row_computes_no_statistics(tmp_path, monkeypatch, shapes):
    """The write bench's no-stats row patches out every statistics path, the one of small
    blocks (staged in chunks, summarized by summarize_flat) as well as compute."""
    import numpy as np

    import lamina
    from lamina import stats
    from lamina.bench import write

    calls: list[str] = []
    for name in _STATS_FUNCS:
        real = getattr(stats, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(stats, name, spy)

    def write_blocks(path):
        n = sum(s[0] for s in shapes)
        with lamina.open(str(path), "w", durable=False) as f:
            ds = f.create_dataset("u", (n,), np.float64)
            with f.step():
                at = 0
                for s in shapes:
                    ds.write(np.arange(at, at + s[0], dtype=np.float64), offset=(at,), copy=False)
                    at += s[0]

    write_blocks(tmp_path / "with.lam")
    assert calls  # the spies see the statistics of this write
    calls.clear()
    with write._stats_off():
        write_blocks(tmp_path / "without.lam")
    assert calls == []
    assert stats.compute.__name__ == "spy"  # restored afterwards


def test_json_documents_are_strict_json(capsys):
    """A measurement that is not a number (the r^2 of a fit of one point) is null in --json
    output: `lamina bench async --json` printed NaN, which JSON readers refuse."""
    import json

    from lamina.bench.common import emit

    emit(True, "table", {"r2": float("nan"), "rates": [1.5, float("inf")], "n": 2.0})
    out = capsys.readouterr()
    assert out.err.strip() == "table"

    def refuse(c):
        raise ValueError(c)

    assert json.loads(out.out, parse_constant=refuse) == {
        "r2": None,
        "rates": [1.5, None],
        "n": 2.0,
    }


def test_a_dir_that_cannot_be_made_is_one_line(tmp_path, capsys):
    """--dir naming a file (or a place that cannot be made) is one line naming it, status 1:
    eight benchmarks ended in a traceback."""
    from lamina.bench import main

    there = tmp_path / "a-file"
    there.write_text("x")
    argv = ["catalog", "--steps", "2", "--blocks", "4", "--repeat", "1", "--dir", str(there)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert (
        "Traceback" not in err
        and err.strip() == f"lamina bench catalog: [Errno 17] File exists: {str(there)!r}"
    )


def test_sigterm_removes_what_the_benchmark_made(tmp_path):
    """SIGTERM (timeout, a batch scheduler's limit, kill) unwinds as Ctrl-C does: the
    benchmark's directory is removed and it ends with status 143 (it was left: 1.1 GB)."""
    import signal
    import subprocess
    import time

    env = dict(os.environ, TMPDIR=str(tmp_path))
    argv = [sys.executable, "-m", "lamina.bench", "catalog", "--steps", "1000"]
    p = subprocess.Popen(
        [*argv, "--blocks", "100000", "--repeat", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(tmp_path.iterdir()), "the benchmark made no directory"
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "lamina bench: terminated" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_adios2_profiles_of_a_killed_reader_go_with_the_benchmarks_files(tmp_path):
    """ADIOS2's BP5 reader leaves /tmp/<name>_<pid>_profiling.json at every close; a worker
    killed before its exit (a timeout, Ctrl-C, SIGTERM) left it there for good.  Readers list
    it beside the files they read, and the benchmark's clean-up removes it."""
    import subprocess

    pytest.importorskip("adios2")
    from lamina.bench import common

    job = tmp_path / "job"
    job.mkdir()
    bp = str(job / f"killed-{os.getpid()}.bp")
    code = f"""
import os, numpy as np, adios2
from lamina.bench import common
with adios2.Stream({bp!r}, "w") as s:
    s.begin_step()
    s.write("x", np.arange(4.0), [4], [0], [4])
    s.end_step()
with common.adios2_reader({bp!r}) as r:
    r.read("x")
print(f"/tmp/{{os.path.basename({bp!r})}}_{{os.getpid():x}}_profiling.json", flush=True)
os._exit(0)  # as a kill: no exit handlers
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    profile = out.stdout.strip()
    assert os.path.exists(profile), "ADIOS2 wrote no profile here: nothing to test"
    assert os.listdir(job) == [os.path.basename(bp)]  # (the list is the file's own)
    common.remove(bp)
    assert not os.path.exists(profile) and not os.path.exists(bp)
