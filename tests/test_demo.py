"""``lamina demo``: the analytic flame, the checker, and the whole demo end to end."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import lamina
from lamina import comm as comm_mod
from lamina.demo import insitu, launch, main, pair, phases, report
from lamina.demo import simulation as sim
from lamina.geometry import Box, decompose

SHAPE = (24, 20, 40)


# ------------------------------------------------------------------ simulation


def _random_box(rng: random.Random, shape) -> Box:
    start = [rng.randrange(n) for n in shape]
    stop = [rng.randrange(a + 1, n + 1) for a, n in zip(start, shape, strict=True)]
    return Box(tuple(start), tuple(stop))


@pytest.mark.parametrize("k", [0, 3])
def test_fields_are_box_independent_bit_for_bit(k):
    """A cell's value does not depend on the box it is computed in: readers can check exactly."""
    t = sim.step_time(k, sim.time_step(SHAPE, 4))
    whole = sim.fields(Box.from_shape(SHAPE), SHAPE, t)
    assert list(whole) == list(sim.FIELDS)
    rng = random.Random(k)
    boxes = [_random_box(rng, SHAPE) for _ in range(60)]
    boxes += decompose(SHAPE, 3) + decompose(SHAPE, 7) + [Box((5, 6, 7), (6, 7, 8))]
    for box in boxes:
        part = sim.fields(box, SHAPE, t)
        for name, arr in part.items():
            assert arr.shape == box.shape and arr.dtype == np.float64 and arr.flags.c_contiguous
            assert np.array_equal(arr, whole[name][box.slices]), (name, box)


def test_fields_are_deterministic_and_physical():
    shape = (16, 16, 128)
    t = sim.step_time(2, sim.time_step(shape, 5))
    a = sim.fields(Box.from_shape(shape), shape, t)
    b = sim.fields(Box.from_shape(shape), shape, t)
    for name in sim.FIELDS:
        assert np.array_equal(a[name], b[name])
        assert np.isfinite(a[name]).all()
    assert a["T"].min() == sim.T_U and a["T"].max() == sim.T_B  # exactly, far from the front
    assert 0.0 <= a["Y_CH4"].min() and a["Y_CH4"].max() <= sim.Y_U
    assert (a["vz"] >= sim.U0).all()  # burnt gas is accelerated, never slowed
    assert abs(a["p"].mean() - sim.P0) < 100.0


def test_fields_of_an_empty_box():
    out = sim.fields(Box((0, 3, 0), (4, 3, 5)), SHAPE, 0.0)
    assert all(v.shape == (4, 0, 5) for v in out.values())


def test_front_makes_T_uneven_across_blocks_and_moves():
    """Most blocks are uniform (all fresh or all burnt), a few hold the front; it moves in +z."""
    shape = (32, 32, 64)
    blocks = decompose(shape, 64)
    dt = sim.time_step(shape, 5)
    mean_T = []
    for k in range(5):
        t = sim.step_time(k, dt)
        kinds = {"fresh": 0, "front": 0, "burnt": 0}
        for b in blocks:
            T = sim.fields(b, shape, t)["T"]
            kinds[sim.classify_T(T.min(), T.max())] += 1
        assert kinds["front"] > 0
        assert kinds["fresh"] + kinds["burnt"] >= len(blocks) // 2, kinds
        if k == 2:
            assert kinds["fresh"] > 0 and kinds["burnt"] > 0, kinds
        mean_T.append(sim.fields(Box.from_shape(shape), shape, t)["T"].mean())
    assert all(a < b for a, b in zip(mean_T, mean_T[1:], strict=False))  # the flame advances


def test_writer_blocks_tile_the_domain():
    for nranks, per in ((1, 1), (2, 8), (4, 32), (3, 5)):
        boxes = [b for r in range(nranks) for b in phases.writer_blocks(SHAPE, nranks, r, per)]
        assert sum(b.size for b in boxes) == np.prod(SHAPE)
        from lamina.geometry import find_overlap

        assert find_overlap(boxes) is None
        assert len(boxes) == nranks * per


# ------------------------------------------------------------------ phases in process


def test_write_then_read_in_process_and_checker_catches_a_wrong_value(tmp_path, monkeypatch):
    path = str(tmp_path / "flame.lam")
    world = comm_mod.world()
    if world.size != 1:
        pytest.skip("runs on one rank")
    w = phases.write(path, world, SHAPE, 3, blocks_per_rank=4, durable=False)
    assert w["bytes"] == 3 * len(sim.FIELDS) * np.prod(SHAPE) * 8
    r = phases.read(path, world)
    assert r["ok"], r["errors"]
    assert r["values_checked"] == 3 * len(sim.FIELDS) * np.prod(SHAPE)
    assert r["blocks_checked"] == 3 * len(sim.FIELDS) * 4
    # storage counts the blocks whose bytes it counts: the fields' and those of the derived
    # quantity kept with "store"; the other derived blocks hold statistics only
    assert r["blocks_total"] == 3 * (len(sim.FIELDS) + 1) * 4
    assert r["stored_bytes"] == 3 * (len(sim.FIELDS) + 1) * np.prod(SHAPE) * 8
    assert r["stats_blocks"] == 3 * (1 + 3) * 4  # speed_stats and vorticity/x, y, z
    text = report.format_report(w | {"disk_bytes": 1, "subfiles": 1}, r, path, True, 1.0, "test")
    blocks = 3 * (len(sim.FIELDS) + 1) * 4
    assert f"storage  {blocks:,} blocks, " in text and "+ 48 blocks of statistics only" in text
    assert [s["step"] for s in r["per_step"]] == [0, 1, 2]
    with lamina.open(path) as f:
        assert f.steps == 3
        assert f["flame/T"].attrs["units"] == "K"
        assert f.attrs["dt"] == sim.time_step(SHAPE, 3)
        assert f.at(2)["time"][()] == 2 * f.attrs["dt"]

    # the check is not vacuous: a simulation that disagrees in one cell is caught
    real = sim.fields

    def off_by_one_cell(box, shape, t):
        out = real(box, shape, t)
        if box.contains(Box((1, 2, 3), (2, 3, 4))):
            out["T"][(1 - box.start[0], 2 - box.start[1], 3 - box.start[2])] += 1e-9
        return out

    monkeypatch.setattr(sim, "fields", off_by_one_cell)
    bad = phases.read(path, world)
    assert not bad["ok"]
    assert bad["mismatched"] == 3  # one cell, three steps
    assert any("T[1, 2, 3]" in e for e in bad["errors"])
    text = report.format_report(w | {"disk_bytes": 1, "subfiles": 1}, bad, path, True, 1.0, "test")
    assert "FAILED" in text and text.endswith("lamina demo: FAILED")


# ------------------------------------------------------------------ the demo, end to end

DEMO_ARGS = [
    "--shape",
    "16x16x32",
    "--ranks",
    "2",
    "--readers",
    "3",
    "--steps",
    "2",
    "--blocks",
    "4",
    "--timeout",
    "120",
]


@pytest.mark.skipif(launch.find_mpiexec() is None, reason="needs mpiexec")
def test_demo_end_to_end(tmp_path, capsys):
    rc = main([*DEMO_ARGS, "--out", str(tmp_path), "--skip-insitu"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "lamina demo: OK" in out.splitlines()[-1]
    assert "write    2 ranks" in out and "read     3 ranks" in out
    assert "bit-identical" in out and "block statistics match" in out
    assert "MiB/s" in out and "query T > 1000 K" in out
    # derived quantities: checked against numpy, and the query read less with statistics
    assert "max relative error vs numpy.gradient" in out and "T where speed <" in out
    unit = {"KiB": 1, "MiB": 1024}
    reads = {
        w[0]: float(w[1].replace(",", "")) * unit[w[2]]
        for w in (line.split() for line in out.splitlines())
        if w and w[0] in ("store", "stats", "expression")
    }
    assert reads["store"] == reads["stats"] < reads["expression"], out
    # the picture of the flame, where the demo says it is
    if importlib.util.find_spec("matplotlib") is not None:
        assert (
            f"a picture of the flame (flame/T at step 1, y=8, block outlines): {tmp_path}/flame.png"
            in out
        )
        assert (tmp_path / "flame.png").stat().st_size > 5000
    # the file stays in --out and is an ordinary lamina file
    with lamina.open(str(tmp_path / "flame.lam")) as f:
        assert f.steps == 2
        derived = {"speed_store", "speed_stats", "speed_expression", "vorticity"}
        assert sorted(f["flame"].keys()) == sorted([*sim.FIELDS, *derived])
        assert len(f["flame/T"].blocks(0)) == 2 * 4
        assert {d.strategy for d in f.derived.values()} == {"store", "stats", "expression"}
        assert [b.codec for b in f["flame/speed_stats"].blocks(0)] == ["stats-only"] * 8


@pytest.mark.skipif(launch.find_mpiexec() is None, reason="needs mpiexec")
def test_demo_quiet_and_cleans_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the demo makes its directory
    rc = main([*DEMO_ARGS, "--quiet", "--aggregators", "1", "--insitu-steps", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip().count("\n") == 0 and out.startswith("lamina demo: OK")
    assert "every value checked; in situ: 2 steps" in out and "same analysis results" in out
    assert os.listdir(tmp_path) == []  # the flame, the in situ file and the results are gone


@pytest.mark.skipif(launch.find_mpiexec() is None, reason="needs mpiexec")
def test_demo_in_place_under_mpiexec():
    """``mpiexec -n 3 lamina demo``: writer on 3 ranks, reader on 2, report from rank 0."""
    cmd = [
        launch.find_mpiexec(),
        "-n",
        "3",
        sys.executable,
        "-m",
        "mpi4py",
        "-m",
        "lamina.demo",
        "--shape",
        "12",
        "--steps",
        "2",
        "--blocks",
        "2",
    ]
    env = launch.child_env()
    env.pop(launch.CHILD_ENV)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("lamina demo: OK") == 1
    assert "write    3 ranks" in done.stdout and "read     2 ranks" in done.stdout
    assert "in situ  skipped: it needs a launch of its own" in done.stdout


def test_demo_without_mpiexec_runs_in_process(monkeypatch, capsys):
    if comm_mod.world().size != 1:
        pytest.skip("runs on one rank")
    monkeypatch.setattr(launch, "find_mpiexec", lambda: None)
    rc = main([*DEMO_ARGS, "--no-fsync"])
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    assert "no mpiexec found" in captured.err
    assert "in this process" in captured.out and "lamina demo: OK" in captured.out
    assert "in situ  skipped: no mpiexec" in captured.out
    # asked for the in situ part alone, it says why it cannot run it
    assert main([*DEMO_ARGS, "--insitu-only"]) == 1
    assert "no mpiexec found" in capsys.readouterr().err


def test_usage_errors_return_2(capsys):
    assert main(["--shape", "1x2"]) == 2
    assert main(["--ranks", "0"]) == 2
    assert main(["--insitu-ranks", "2"]) == 2
    assert main(["--insitu-ranks", "0:1"]) == 2
    assert main(["--insitu-only", "--skip-insitu"]) == 2
    assert main(["--help"]) == 0
    capsys.readouterr()


def test_rank_counts_mpi_cannot_number_or_this_machine_hold_are_refused(capsys, monkeypatch):
    """--ranks 10^23 was printed as asked while mpiexec ran a rank; 2^31 - 1 ranks of one
    in situ launch plus one more wrapped the same way; 100,000 ranks of ~50 MiB each do not fit."""
    import lamina.demo as demo

    assert main(["--ranks", "99999999999999999999999"]) == 2
    assert "more than MPI can number" in capsys.readouterr().err
    assert main(["--insitu-ranks", "2147483647:1"]) == 2
    assert "more than MPI can number" in capsys.readouterr().err
    monkeypatch.setattr(demo, "usable_memory", lambda: 1 << 30)
    assert main(["--ranks", "100000"]) == 2
    err = capsys.readouterr().err
    assert "a launch of 100000 ranks needs at least" in err and "has 1 GiB" in err, err


@pytest.mark.parametrize("value", ["-1", "0", "nan", "soon"])
def test_a_timeout_that_is_no_time_is_refused(value, capsys, monkeypatch):
    """--timeout -1 or 0 started the writer and reported it "timed out after -1 s"; nan gave
    a traceback.  Refused as lamina bench refuses it, before anything is launched."""
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("a program was launched"))
    assert main(["--timeout", value, "--skip-insitu"]) == 2
    err = capsys.readouterr().err
    assert "--timeout:" in err and "seconds" in err and "Traceback" not in err


def test_launch_without_a_time_limit():
    """--timeout inf: no limit (a traceback before: communicate() takes no infinite timeout)."""
    done = launch.run([sys.executable, "-c", "print('ran')"], timeout=float("inf"))
    assert not done.timed_out and done.returncode == 0 and "ran" in done.output


def test_launch_times_out_and_ends_the_process_group():
    done = launch.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert done.timed_out and done.seconds < 30


# ------------------------------------------------------------------ in situ: simulation and analysis side by side

INSITU_SHAPE = (16, 16, 32)


def _expected_step(shape, t: float) -> dict:
    """What the analysis should find at time *t*, from the whole grid at once."""
    a = sim.fields(Box.from_shape(shape), shape, t)
    c = (a["T"] - sim.T_U) / (sim.T_B - sim.T_U)
    return {
        "mean_T": a["T"].mean(),
        "burnt": np.count_nonzero(c > 0.5) / c.size,
        "front_z": c.sum() / (shape[0] * shape[1]),
        "max_speed": np.sqrt((a["vx"] ** 2 + a["vy"] ** 2 + a["vz"] ** 2).max()),
        "fuel_left": a["Y_CH4"].mean() / sim.Y_U,
    }


def test_insitu_programs_in_process(tmp_path, monkeypatch):
    """One rank each, through a file: the analysis reads every step and finds what the simulation made."""
    if comm_mod.world().size != 1:
        pytest.skip("runs on one rank")
    monkeypatch.delenv("LAMINA_TRANSPORT", raising=False)
    path = str(tmp_path / "insitu.lam")
    s = insitu.simulate(path, INSITU_SHAPE, 3, durable=False)
    assert s["engine"] == "native" and s["steps"] == 3
    assert s["bytes"] == 3 * pair.step_bytes(INSITU_SHAPE) == 3 * 6 * 16 * 16 * 32 * 8
    a = insitu.analyze(path, timeout=10)
    assert a["steps"] == 3 and a["bytes"] == s["bytes"] and len(a["results"]) == 3
    dt = sim.time_step(INSITU_SHAPE, 3)
    for k, got in enumerate(a["results"]):
        assert got["step"] == k and got["time"] == sim.step_time(k, dt)
        T = sim.fields(Box.from_shape(INSITU_SHAPE), INSITU_SHAPE, got["time"])["T"]
        assert got["min_T"] == T.min() and got["max_T"] == T.max()
        assert sum(got["T_histogram"]) == np.prod(INSITU_SHAPE)
        for key, want in _expected_step(INSITU_SHAPE, got["time"]).items():
            assert got[key] == pytest.approx(want, rel=1e-12), key
        if k:
            assert got["front_speed"] == pytest.approx(sim.S_T, rel=1e-3)
    assert a["results"][0]["front_speed"] is None
    # the same file read again gives the same digest and numbers
    again = insitu.analyze(path, timeout=10)
    assert again["sha256"] == a["sha256"] and again["results"] == a["results"]


def test_insitu_compare_catches_differences():
    def run(t, results, sha="x", engine=None, left=None, nbytes=None):
        nbytes = 2 * pair.step_bytes(INSITU_SHAPE) if nbytes is None else nbytes
        eng = engine or pair.ENGINES[t]
        times = {
            "loop_s": 2.0,
            "lamina_s": 1.0,
            "compute_s": 0.5,
            "read_s": 0.5,
            "decomposition": [1, 1, 1],
        }
        return {
            "transport": t,
            "job_s": 3.0,
            "sim": {"engine": eng, "bytes": nbytes, **times},
            "analysis": {
                "engine": eng,
                "bytes": nbytes,
                "steps": 2,
                "results": results,
                "sha256": sha,
                **times,
            },
            "left": t == "file" if left is None else left,
            "left_bytes": 0,
        }

    row = {
        "time": 0.0,
        "burnt": 0.5,
        "front_z": 3.0,
        "front_speed": None,
        "max_speed": 4.0,
        "fuel_left": 0.5,
    }
    steps = [
        {**row, "step": 0, "mean_T": 1.0},
        {**row, "step": 1, "mean_T": 2.0, "front_speed": 2.0},
    ]
    good = pair.compare(
        {"memory": run("memory", steps), "file": run("file", steps)}, INSITU_SHAPE, 2
    )
    assert good["ok"] and good["identical"] and not good["problems"]
    other = [steps[0], {**steps[1], "mean_T": 2.0000000001}]
    bad = pair.compare(
        {"memory": run("memory", steps), "file": run("file", other)}, INSITU_SHAPE, 2
    )
    assert not bad["ok"] and not bad["identical"]
    bad = pair.compare(
        {"memory": run("memory", steps), "file": run("file", steps, sha="y")}, INSITU_SHAPE, 2
    )
    assert not bad["ok"]
    bad = pair.compare(
        {"memory": run("memory", steps, engine="native"), "file": run("file", steps)},
        INSITU_SHAPE,
        2,
    )
    assert not bad["ok"] and "engines" in bad["problems"][0]
    bad = pair.compare(
        {"memory": run("memory", steps, left=True), "file": run("file", steps)}, INSITU_SHAPE, 2
    )
    assert not bad["ok"] and "written" in bad["problems"][0]
    bad = pair.compare(
        {"memory": run("memory", steps), "file": run("file", steps, nbytes=8)}, INSITU_SHAPE, 2
    )
    assert not bad["ok"] and "bytes" in bad["problems"][0]
    failed = {"transport": "memory", "error": "exited with status 1", "output": ["boom"]}
    bad = pair.compare({"memory": failed, "file": run("file", steps)}, INSITU_SHAPE, 2)
    assert not bad["ok"] and "exited with status 1" in bad["problems"][0]
    bad["ranks"], bad["path"], bad["cpus"], bad["load"] = [2, 1], "x.lam", 2, 0.0
    text = "\n".join(report.insitu_lines(bad))
    assert "FAILED: the job exited with status 1" in text and "| boom" in text


@pytest.mark.skipif(launch.find_mpiexec() is None, reason="needs mpiexec")
def test_insitu_pair_memory_and_file(tmp_path):
    """The pair in one MPMD launch (2 simulation ranks, 1 analysis rank) under memory, then file."""
    d = pair.run_demo(
        launch.find_mpiexec(), str(tmp_path), str(tmp_path), INSITU_SHAPE, 3, (2, 1), timeout=120
    )
    assert d["ok"], d["problems"]
    assert d["identical"] and list(d["runs"]) == ["memory", "file"]
    expected = 3 * pair.step_bytes(INSITU_SHAPE)
    assert d["expected_bytes"] == expected
    for t, run in d["runs"].items():
        s, a = run["sim"], run["analysis"]
        assert s["engine"] == a["engine"] == pair.ENGINES[t]
        assert (s["ranks"], a["ranks"]) == (2, 1)
        assert s["bytes"] == a["bytes"] == expected and a["steps"] == 3
        assert 0 < a["read_s"] <= a["lamina_s"] <= a["loop_s"] <= run["job_s"]
        assert 0 < s["lamina_s"] <= s["loop_s"] <= run["job_s"]
    assert not d["runs"]["memory"]["left"]  # memory: nothing written
    assert d["runs"]["file"]["left_bytes"] >= expected  # file: the native file is there, readable
    with lamina.open(d["path"]) as f:
        assert f.steps == 3 and f["flame/T"].shape == INSITU_SHAPE
    mem, fil = (d["runs"][t]["analysis"] for t in ("memory", "file"))
    assert mem["sha256"] == fil["sha256"] and mem["results"] == fil["results"]
    assert [r["front_speed"] for r in mem["results"][1:]] == pytest.approx([sim.S_T] * 2, rel=1e-3)


@pytest.mark.skipif(launch.find_mpiexec() is None, reason="needs mpiexec")
def test_demo_insitu_only_report(tmp_path, capsys):
    rc = main(
        [
            "--insitu-only",
            "--shape",
            "16x16x32",
            "--insitu-steps",
            "2",
            "--no-fsync",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "write    " not in out  # only the in situ part ran
    table = [line.split() for line in out.splitlines() if line.startswith(" " * 13)]
    rows = {w[0]: w for w in table if w[0] in ("memory", "file")}
    assert rows["memory"][1] == "mpi" and rows["file"][1] == "native"
    moved = 2 * pair.step_bytes((16, 16, 32))  # 768 KiB
    for w in rows.values():
        assert float(w[2]) * {"KiB": 2**10, "MiB": 2**20}[w[3]] == moved, w
    assert rows["memory"][-1] == "nothing" and rows["file"][-1] in ("KiB", "MiB")
    assert "MiB/s" in rows["memory"] and "MiB/s" in rows["file"]
    assert "file time / memory time:" in out
    assert "analysis identical under memory and file" in out
    assert "(the simulation moves the front at 2 m/s)" in out
    last = out.splitlines()[-1]
    assert last.startswith("lamina demo: OK (in situ: 2 steps") and "through memory in" in last
    assert os.path.isdir(tmp_path / "insitu.lam") and not os.path.exists(tmp_path / "flame.lam")
