"""What no machine measures, in the files the cost models read: measured histories,
calibrations and model-check records holding numbers too large for a float, rates of 0 or
infinity, times out of range.  Each is left out (the rest kept, with a warning), and no
model, command or rank crashes or waits for another that did."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import warnings

import mpi_util as mu
import numpy as np
import perf_util
import pytest

import lamina
from lamina.errors import FormatError, LaminaWarning
from lamina.perf import checks
from lamina.perf import history as hist
from lamina.perf.asyncmodel import IO_SERIES, SYNC_IO_SERIES
from lamina.perf.calibrate import Calibration, cached, host, save_calibration
from lamina.perf.command import main as model_cli
from lamina.perf.model import Prediction, best, predict

#: an integer JSON has and a float has not
BIG = 10**400
#: x1 and seconds of samples whose rate is 0 and infinite
ZERO_RATE = [1e-300, 1, 1e300]
INF_RATE = [1e300, 1, 1e-300]
GOOD = [8 << 20, 1, 0.004]


def _history(series: dict, **more) -> str:
    doc = {"version": hist.HISTORY_VERSION, "host": host(), "series": series, **more}
    return json.dumps(doc)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """This host's history, calibration and model checks, all in *tmp_path*."""
    paths = {k: tmp_path / f"{k}.json" for k in ("history", "calibration", "checks")}
    monkeypatch.setenv("LAMINA_HISTORY", str(paths["history"]))
    monkeypatch.setenv("LAMINA_CALIBRATION", str(paths["calibration"]))
    monkeypatch.setenv("LAMINA_MODEL_CHECKS", str(paths["checks"]))
    save_calibration(perf_util.calibration(host()), str(paths["calibration"]))
    return paths


# -- samples ------------------------------------------------------------------------------------


def test_samples_out_of_bounds_are_left_out_one_by_one(tmp_path):
    """An integer too large for a float raised OverflowError; one bad sample discarded the
    whole file, silently, and the next save wrote over it."""
    path = tmp_path / "h.json"
    text = _history(
        {"async.io": [GOOD, [BIG, 1, 1.0], ZERO_RATE, INF_RATE], "write": [[1, 0.5, 1]]}
    )
    path.write_text(text)
    with pytest.warns(LaminaWarning, match="4 unusable samples or series left out"):
        got = hist.load_history(str(path))
    assert got.series == {"async.io": [tuple(map(float, GOOD))]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hist.load_history(str(path)).series == got.series  # warned once per file
        more = hist.History()
        more.add("read", 1 << 20, 1 << 20, 0.001)
        hist.save_history(more, str(path))  # the repair is written
    back = hist.History.from_json(path.read_text())
    assert sorted(back.series) == ["async.io", "read"] and back.dropped == 0


def test_a_rate_of_zero_or_infinity_is_no_sample():
    """Both passed the checks of x1, x2 and seconds: a rate of 0 divided by zero, an infinite
    one predicted t_io 0 with r^2 1."""
    h = hist.History()
    for s in (ZERO_RATE, INF_RATE, [1e19, 1, 1.0], [1, 1, 1e10]):
        h.add("async.io", *s)
    assert h.series == {}
    bad = hist.History(series={"async.io": [tuple(ZERO_RATE)]})
    with pytest.raises(FormatError):  # from rank 0, to the other ranks
        hist.unpack_series(hist.pack_series(bad, ["async.io"]), ["async.io"])
    # a fit given them anyway: r^2 is not defined, and says 0
    with np.errstate(all="ignore"):
        assert hist.fit_rate([tuple(INF_RATE)] * 3).r2 == 0.0
    assert hist.fit_rate([(1000 * k, 1, k / 1e6) for k in (1, 2, 3)]).r2 == 1.0  # equal rates


def test_models_and_commands_survive_a_hostile_history(files, tmp_path, capsys):
    from lamina.perf.history import signature

    sig = signature("magnitude(vx, vy, vz)", "f8")
    files["history"].write_text(
        _history(
            {
                IO_SERIES: [[BIG, 1, 1.0]],
                SYNC_IO_SERIES: [ZERO_RATE] * 3,
                "async.copy": [INF_RATE] * 3,
                f"derive.store.{sig}": [ZERO_RATE] * 3,
                f"compute.{sig}": [INF_RATE] * 3,
            }
        )
    )
    a = np.ones((8, 8, 8))
    with pytest.warns(LaminaWarning, match="measured history"):
        with lamina.open(str(tmp_path / "a.lam"), "w", io="auto", durable=False) as f:
            f.create_dataset("x", a.shape, a.dtype)
            for k in range(3):
                with f.step():
                    f["x"][...] = a + k
            assert all(math.isfinite(d["t_io"]) for d in f.io_stats["decisions"])
    hist.wait_saves()  # the samples it measured: written over the file
    assert hist.History.from_json(files["history"].read_text()).dropped == 0
    files["history"].write_text(_history({f"derive.store.{sig}": [[BIG, 1, 1]]}))
    with pytest.warns(LaminaWarning, match="measured history"):
        with lamina.open(str(tmp_path / "d.lam"), "w") as f:
            for c in ("vx", "vy", "vz"):
                f.create_dataset(c, a.shape)
            f.derive("m", "magnitude(vx, vy, vz)", strategy="auto")
    big = tmp_path / "big.json"
    big.write_text(_history({IO_SERIES: [[BIG, 1, 1.0], GOOD]}))
    with pytest.warns(LaminaWarning):
        assert model_cli(["async", "--bytes", "8MiB", "--history", str(big)]) == 0
    capsys.readouterr()
    big.write_text(_history({IO_SERIES: [[BIG, 1, 1.0]], "x": [ZERO_RATE]}))  # nothing left
    args = ["derived", "--expr", "a + b", "--shape", "64", "--blocks", "4"]
    args += ["--calibration", str(files["calibration"]), "--history", str(big)]
    assert model_cli(args) == 2  # what was left out said in the error, one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no samples of this host" in err, err


def test_model_async_refuses_a_history_that_is_not_there(files, capsys):
    """As ``lamina model derived`` does (the async model fell back to the defaults)."""
    missing = str(files["history"]) + ".missing"
    assert model_cli(["async", "--bytes", "64MiB", "--history", missing]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--history" in err


_MPI_SCRIPT = """
import json, sys
from mpi4py import MPI
import numpy as np
import lamina
import lamina.layers.background.layer as layer

rank = MPI.COMM_WORLD.rank
a = np.ones(64)


def write(path):
    with lamina.open(path, "w", io="auto", durable=False) as f:
        f.create_dataset("x", (2 * 64,), a.dtype)
        for k in range(2):
            with f.step():
                f["x"][rank * 64 : (rank + 1) * 64] = a + k


write(sys.argv[1] + "/a.lam")  # rank 0 meets an unusable history
print(f"OK unusable {rank}", flush=True)
if rank == 0:
    def broken():
        raise RuntimeError("no history today")
    layer.load_history = broken
try:
    write(sys.argv[1] + "/b.lam")
except Exception as e:
    print(f"OK raised {rank} {'no history today' in str(e)}", flush=True)
"""


def test_no_rank_waits_for_a_history_rank_0_could_not_load(files, tmp_path):
    """Rank 0 raised loading the history while rank 1 waited for it in the broadcast."""
    files["history"].write_text(_history({IO_SERIES: [[BIG, 1, 1.0]]}))
    script = tmp_path / "shared_history.py"
    script.write_text(_MPI_SCRIPT)
    env = {"LAMINA_HISTORY": files["history"], "LAMINA_CALIBRATION": files["calibration"]}
    res = mu.run_mpi(2, str(script), tmp_path, timeout=60, env=env)
    # (the ranks' lines may come interleaved)
    assert sorted(re.findall(r"OK unusable (\d)", res.stdout)) == ["0", "1"]
    raised = sorted(re.findall(r"OK raised (\d) (True|False)", res.stdout))
    assert raised == [("0", "True"), ("1", "True")]  # rank 0's error, on every rank


# -- saves --------------------------------------------------------------------------------------

_SAVER = """
import os, sys, time
from lamina.perf.history import History, save_history
path, me, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
open(go + f".ready{me}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
for r in range(rounds):
    h = History()
    h.add(f"p{me}", 1000 + r, 1, 0.001)
    save_history(h, path)
"""


def test_processes_saving_together_lose_no_sample(tmp_path):
    """Each save read, merged and replaced the file unlocked: 6 processes of 20 saves kept 32
    of their 120 samples."""
    path, go = tmp_path / "h.json", tmp_path / "go"
    procs, rounds = 3, 8
    env = mu.child_env()
    run = [
        subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(path), str(i), str(rounds), str(go)], env=env
        )
        for i in range(procs)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"go.ready{i}").exists() for i in range(procs)):
            assert time.monotonic() < deadline, "the savers did not start"
            time.sleep(0.01)
        go.touch()
        assert [p.wait(timeout=60) for p in run] == [0] * procs
    finally:
        for p in run:
            if p.poll() is None:
                p.kill()
    got = hist.History.from_json(path.read_text()).series
    assert {n: len(v) for n, v in got.items()} == {f"p{i}": rounds for i in range(procs)}
    assert not (tmp_path / "h.json.lock").exists()  # removed by the last save


def test_the_least_recently_added_series_are_left_out(tmp_path, monkeypatch):
    """The oldest-named went first: the io='auto' model's own series (``async.*``), and a
    new series could be left out by the save that added it, the file then disagreeing with
    what this process kept in memory."""
    monkeypatch.setattr(hist, "MAX_SERIES", 4)
    path = str(tmp_path / "h.json")

    def save(*names):
        h = hist.History()
        for n in names:
            h.add(n, 1 << 20, 1, 0.001)
        hist.save_history(h, path)
        kept = hist.load_history(path).series
        assert kept == hist.History.from_json(open(path).read()).series  # memory is the file
        return sorted(kept)

    save("zz.old")
    save(IO_SERIES)
    save("b1", "b2")
    assert save("b3") == [IO_SERIES, "b1", "b2", "b3"]  # the least recently added went
    assert save("a0") == ["a0", "b1", "b2", "b3"]  # the one just added stays
    loaded = hist.load_history(path)  # a history loaded, then added to and saved
    loaded.add("c0", 1 << 20, 1, 0.001)
    hist.save_history(loaded, path)
    assert sorted(loaded.series) == ["a0", "b2", "b3", "c0"] == save()
    used = json.loads(open(path).read())["used"]
    assert used["c0"] >= used["a0"] > used["b3"] > used["b2"]
    # a file of more series than kept: the least recently added are left out
    doc = {n: [GOOD] for n in ("a", "b", "c", "d", "e")}
    times = {"a": 5.0, "b": 1.0, "c": 4.0, "d": 3.0, "e": 1e300}  # a time to come: now
    got = hist.History.from_json(_history(doc, used=times))
    assert sorted(got.series) == ["a", "c", "d", "e"] and got.dropped == 1
    assert got.used["e"] <= time.time()


# -- calibrations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"block_seconds": {"query": [[0.5, 1e308]]}},
        {"block_seconds": {"write": [[1, 1e308]]}},
        {"block_seconds": {"read": [[1, 1e300], [2, 1e308]]}},
        {"block_seconds": {"stats": [[1e20, 1e-3]]}},
        {"memcpy_bandwidth": 5e-324},
        {"write_bandwidth": 1e300},
        {"fresh_copy_bandwidth": 5e-324},
    ],
)
def test_a_calibration_out_of_physical_bounds_is_refused(files, change, capsys):
    """Each passed validation: derive(strategy='auto') raised ValueError from min() of no
    total, ``lamina model async`` divided by zero, ``--json`` printed Infinity."""
    doc = {**json.loads(perf_util.calibration(host()).to_json()), **change}
    with pytest.raises(ValueError, match="must be"):
        Calibration.from_json(json.dumps(doc))
    files["calibration"].write_text(json.dumps(doc))
    with pytest.warns(LaminaWarning, match="calibration .* ignored"):
        assert cached() is None
    with pytest.warns(LaminaWarning):
        assert model_cli(["async", "--bytes", "64MiB", "--json"]) == 0
    out = capsys.readouterr().out
    json.loads(out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))


def test_the_choice_survives_totals_that_are_not_numbers():
    def p(s, total, storage):
        return Prediction(s, 0.0, 0.0, 0.0, total, storage)

    nan = {s: p(s, math.nan, n) for s, n in (("store", 3), ("stats", 2), ("expression", 1))}
    assert best(nan) == "expression"
    assert best({**nan, "store": p("store", 1.0, 3)}) == "store"
    inf = {s: p(s, math.inf, n) for s, n in (("store", 3), ("stats", 2), ("expression", 1))}
    assert best({**inf, "stats": p("stats", math.nan, 2)}) == "expression"


# -- counts -------------------------------------------------------------------------------------


def test_counts_too_large_for_a_float_are_refused(files, tmp_path, capsys):
    cal = ["--calibration", str(files["calibration"])]
    derived = ["derived", "--expr", "a + b", "--shape", "64", "--history", "none", *cal]
    for args in (
        [*derived, "--readers", str(BIG)],
        [*derived, "--blocks", str(BIG)],
        [*derived, "--blocks", "65"],  # more blocks than elements
        ["derived", "--expr", "a + b", "--shape", "4,4,4", "--blocks", "1000", *cal],
        ["derived", "--expr", "a + b", "--shape", "-5,4,4", *cal],  # (was: expected one argument)
        ["derived", "--expr", "a + b", "--shape", "\u00b2,4", *cal],  # (int() raised)
        ["derived", "--expr", "a + b", "--shape", "\u0663,4", *cal],  # (taken as 3)
        ["async", "--bytes", "64MiB", "--ranks", str(BIG)],
        ["async", "--bytes", "64MiB", "--ranks", str(1 << 31)],
    ):
        assert model_cli(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and len(err) < 300, err
    assert model_cli([*derived, "--blocks", "64"]) == 0
    capsys.readouterr()
    assert model_cli(["derived", "--expr", "a + b", "--shape", "-5,4,4", *cal]) == 2
    assert "--shape: a size is an integer >= 0, got -5 in '-5,4,4'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="readers"):
        predict("a + b", 64, readers=BIG, calibration=perf_util.calibration(host()))
    with pytest.raises(ValueError, match="shape"):
        predict("a + b", (1 << 30,) * 3, calibration=perf_util.calibration(host()))
    a = np.ones(8)
    with lamina.open(str(tmp_path / "r.lam"), "w") as f:
        for c in ("a", "b"):
            f.create_dataset(c, a.shape)
        with pytest.raises(ValueError, match="readers"):
            f.derive("s", "a + b", strategy="auto", readers=BIG)


# -- model checks -------------------------------------------------------------------------------


def test_model_check_records_out_of_range_are_left_out_one_by_one(files, capsys):
    """A time beyond gmtime's range, or a pair too large for a float, raised OverflowError
    from ``lamina model checks`` and at the end of both benchmarks."""
    good = {"command": "c", "when": 1.7e9, "host": host(), "pairs": [[1.0, 2.0]]}
    doc = {
        "version": checks.VERSION,
        "checks": {
            "async": {**good, "when": 1e300},
            "derived-history": {**good, "pairs": [[BIG, 1]]},
            "derived-calibration": good,
        },
    }
    files["checks"].write_text(json.dumps(doc))
    assert list(checks.load()) == ["derived-calibration"]
    for when in (-1e20, 1e20, 253402300800):
        doc["checks"]["async"]["when"] = when
        files["checks"].write_text(json.dumps(doc))
        assert list(checks.load()) == ["derived-calibration"]
    assert model_cli(["checks"]) == 0 and "derived-calibration" in capsys.readouterr().out
    assert model_cli(["checks", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["derived-calibration"]
    assert checks._utc(1e300) == "-"
    assert checks._pair([1e300, 1e-300]) is None
