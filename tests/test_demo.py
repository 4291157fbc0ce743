"""``lamina demo``: the analytic flame, the checker, and the whole demo end to end."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import lamina
from lamina import comm as comm_mod
from lamina.demo import launch, main, phases, report
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
    rc = main([*DEMO_ARGS, "--out", str(tmp_path)])
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
    rc = main([*DEMO_ARGS, "--quiet", "--aggregators", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip().count("\n") == 0 and out.startswith("lamina demo: OK")
    assert os.listdir(tmp_path) == []


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


def test_demo_without_mpiexec_runs_in_process(monkeypatch, capsys):
    if comm_mod.world().size != 1:
        pytest.skip("runs on one rank")
    monkeypatch.setattr(launch, "find_mpiexec", lambda: None)
    rc = main([*DEMO_ARGS, "--no-fsync"])
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    assert "no mpiexec found" in captured.err
    assert "in this process" in captured.out and "lamina demo: OK" in captured.out


def test_usage_errors_return_2(capsys):
    assert main(["--shape", "1x2"]) == 2
    assert main(["--ranks", "0"]) == 2
    assert main(["--help"]) == 0
    capsys.readouterr()


def test_launch_times_out_and_ends_the_process_group():
    done = launch.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert done.timed_out and done.seconds < 30
