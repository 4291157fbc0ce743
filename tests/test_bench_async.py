"""``lamina bench async`` with tiny sizes: every method runs, async runs in the background, the report has the targets."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

from lamina.bench import background  # noqa: E402

pytest.importorskip("mpi4py")


def test_predict():
    assert background.predict(background.SYNC, 2.0, 1.0, 0.1) == 3.0
    assert background.predict(background.ASYNC, 2.0, 1.0, 0.1) == pytest.approx(2.1)
    assert background.predict(background.ASYNC2, 0.5, 1.0, 0.1) == pytest.approx(1.0)
    assert background.predict(background.ASYNC2, 0.95, 1.0, 0.1) == pytest.approx(1.05)
    assert background.predict(background.BP5A, 0.5, 1.0, 0.1) is None


def test_auto_errors_take_the_mode_taken_from_step_3():
    d = {"t_sync": 1.0, "t_async": 2.0}
    r = {
        "io_stats": {
            "decisions": [
                {"step": 2, "mode": "sync", "epoch_measured": 5.0, **d},  # too early
                {"step": 3, "mode": "async", "epoch_measured": 2.5, **d},
                {"step": 4, "mode": "sync", "epoch_measured": 0.9, **d},
                {"step": 5, "mode": "sync", "epoch_measured": None, **d},  # not measured yet
            ]
        }
    }
    assert background.auto_errors(r) == [pytest.approx(0.25), pytest.approx(0.1)]
    assert background.auto_errors({}) == []


def test_auto_run_error_compares_the_run_with_the_mean_predicted_epoch():
    d = {"t_sync": 1.0, "t_async": 2.0}
    modes = ["sync", "async", "async", "sync"]  # predicted epochs 1, 2, 2, 1: mean 1.5
    r = {"run_step": 1.8, "io_stats": {"decisions": [{"mode": m, **d} for m in modes]}}
    assert background.auto_run_error(r) == pytest.approx(0.2)
    assert background.auto_run_error({"run_step": 1.0}) is None


def test_steady_epoch_leaves_the_first_steps_out():
    """The steady epoch is the median of the per-step epochs from step STEADY_FROM on, the
    slowest rank's each; the loop's mean keeps the first steps' copies into new memory."""
    from types import SimpleNamespace

    ctx = SimpleNamespace(max=lambda x: x)
    w = SimpleNamespace(ctx=ctx, ns=SimpleNamespace(steps=6))
    epochs = [9.0, 5.0, 1.0, 1.2, 1.1, 3.0]  # two slow first steps, one outlier later
    r = {"loop": sum(epochs), "end": 0.5, "submit": [0.1] * 6, "epochs": epochs, "drain": 0.0}
    out = background.Worker.reduce_write(w, r)
    assert background.STEADY_FROM == 2
    assert out["epoch_steady"] == pytest.approx(1.15)  # median of 1.0, 1.2, 1.1, 3.0
    assert out["epoch"] == pytest.approx(sum(epochs) / 6)
    r2 = {**r, "epochs": epochs[:2], "loop": 14.0}
    w.ns.steps = 2  # no step after the first two: the loop's mean stands in
    assert background.Worker.reduce_write(w, r2)["epoch_steady"] == pytest.approx(7.0)


def test_bench_async_smoke(capsys, monkeypatch, tmp_path):
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        pytest.skip("no mpiexec")
    monkeypatch.delenv("LAMINA_IO", raising=False)
    rc = background.main(
        [
            "--ranks",
            "1",
            "--mib",
            "1",
            "--steps",
            "2",
            "--compute",
            "1",
            "--repeat",
            "1",
            "--dir",
            str(tmp_path),
            "--timeout",
            "100",
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["benchmark"] == "async" and doc["options"]["durable"] is False
    (job,) = doc["jobs"]
    assert job["ranks"] == 1 and job["steps"] == 2 and not job["failed_checks"]
    assert job["t_io"] > 0 and job["t_copy"] > 0 and job["t_read"] > 0
    writes = {r["method"]: r for r in job["writes"]}
    assert {background.SYNC, background.ASYNC, background.ASYNC2, background.HAND} <= set(writes)
    # the hand-written writer: its copies timed alone, within its submit
    hand = writes[background.HAND]
    assert 0 < hand["copy_median"] <= hand["submit_median"]
    assert not job["auto"]  # io='auto' runs, beside sync and async
    assert writes[background.AUTO]["io"] == "auto"
    assert (
        writes[background.AUTO]["io_stats"]["steps_auto_sync"]
        + writes[background.AUTO]["io_stats"]["steps_auto_async"]
        == 2
    )
    for m in (background.ASYNC, background.ASYNC2):
        assert writes[m]["io"] == "async"
        assert writes[m]["io_stats"]["steps_background"] > 0  # committed in the background
    assert writes[background.SYNC]["io_stats"]["steps_background"] == 0
    for r in job["writes"]:
        assert r["epoch"] > 0 and r["run_step"] > 0 and r["submit_median"] > 0
        assert r["epoch_steady"] > 0 and r["submit_steady"] > 0
    reads = {r["method"]: r for r in job["reads"]}
    assert set(reads) == set(background.READS)
    assert all(r["steps_read"] == 2 and r["ok"] for r in reads.values())
    assert reads[background.PREFETCH]["io_stats"]["prefetch_hits"] > 0
    (t,) = doc["targets"]
    assert len(t["targets"]) >= 4
    names = [x["target"] for x in t["targets"]]
    assert any("memcpy in the loop" in n for n in names)
    for what in (
        "#### write",
        "#### read",
        "#### targets",
        "meas/pred",
        "submit",
        "steps >= 2",
        "numpy thread",
        "model errors: no model checked on this host yet",
    ):
        assert what in out.err
    # 2 steps: io='auto' decided none from step 3 on, so no check of the model is recorded
    assert doc["model_checks"] == {}
    assert not os.listdir(tmp_path)  # the job's files are removed


def test_targets_take_the_copy_in_the_loop():
    """The epoch and submit targets take t_copy as the hand-written writer's copy at the same
    compute factor; the warm memcpy of the calibration is the reference of info rows."""
    common = {"compute": 1.0, "t_comp": 1.0}
    job = {
        "t_io": 1.0,
        "t_copy": 0.1,
        "t_read": 1.0,
        "reads": [],
        "writes": [
            {
                **common,
                "method": background.ASYNC,
                "epoch": 1.4,
                "epoch_steady": 1.3,
                "submit_median": 0.3,
                "submit_steady": 0.25,
            },
            {
                **common,
                "method": background.HAND,
                "epoch": 1.2,
                "epoch_steady": 1.2,
                "submit_median": 0.21,
                "submit_steady": 0.21,
                "copy_median": 0.2,
            },
        ],
    }
    got = {t["target"]: t for t in background.targets(job)}

    def value(start: str) -> float:
        (t,) = [t for name, t in got.items() if name.startswith(start)]
        return t["value"]

    assert value("async epoch (steps >= 2) / (max") == pytest.approx(1.3 / 1.2)
    assert value("(info) the same with t_copy a warm") == pytest.approx(1.3 / 1.1)
    assert value("(info) async epoch (steps >= 2) / the hand-written") == pytest.approx(1.3 / 1.2)
    assert value("async submit (steps >= 2)") == pytest.approx(0.25 / (1.1 * 0.2 + 50e-6))
    assert value("(info) the same over all steps") == pytest.approx(0.3 / (1.1 * 0.2 + 50e-6))
    assert value("(info) the same against a warm") == pytest.approx(0.25 / (1.1 * 0.1 + 50e-6))
    # without the hand-written run, the warm memcpy stands in
    job["writes"] = job["writes"][:1]
    got = {t["target"]: t for t in background.targets(job)}
    assert value("async submit (steps >= 2)") == pytest.approx(0.25 / (1.1 * 0.1 + 50e-6))


def _hand_worker(tmp_path, steps: int):
    """A Worker with only what hand_write uses: 8 small properties, one rank."""
    from types import SimpleNamespace

    import numpy as np

    w = background.Worker.__new__(background.Worker)
    w.ns = SimpleNamespace(dir=str(tmp_path), steps=steps, durable=False)
    w.props = [np.full(1024, i, dtype=np.float32) for i in range(8)]
    w.step_bytes = 8 * 4096
    w.tag = 0
    w.ctx = SimpleNamespace(rank=0)
    return w


def test_hand_written_writer_writes_every_step(tmp_path):
    import numpy as np

    w = _hand_worker(tmp_path, 5)
    r = w.hand_write(0.0)
    assert len(r["copies"]) == len(r["submit"]) == 5
    data = np.fromfile(r["path"], dtype=np.float32).reshape(5, 8, 1024)
    # every step's own: the first value of each property is the step's mark
    want = np.broadcast_to(np.arange(8, dtype=np.float32)[None, :, None], (5, 8, 1024)).copy()
    want[:, :, 0] = [w.mark(s) for s in range(5)]
    assert np.array_equal(data, want)


def test_the_baselines_files_are_read_back(tmp_path):
    """The hand-written thread's file (and ADIOS2's, the same way) is read back after its
    write, as lamina's are: a file that lost a step's data fails the check (their times were
    reported unread)."""
    import numpy as np

    w = _hand_worker(tmp_path, 3)
    w.n = 1024
    w.box = background.Box((0,), (1024,))
    w.ctx.all_true = bool
    r = w.hand_write(0.0)
    assert w.check_baseline(background.HAND, r["path"])
    data = np.fromfile(r["path"], dtype=np.float32)
    data[8 * 1024 + 5] = -1.0  # one value of step 1
    data.tofile(r["path"])
    assert not w.check_baseline(background.HAND, r["path"])
    with open(r["path"], "r+b") as fh:  # a step short
        fh.truncate(2 * 8 * 1024 * 4)
    assert not w.check_baseline(background.HAND, r["path"])


def test_hand_written_writer_raises_its_threads_error(tmp_path, monkeypatch):
    """A failed write on the thread is raised at the program's next step: never a hang."""
    real = os.pwrite
    calls = []

    def full(fd, data, off):
        calls.append(off)
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        return real(fd, data, off)

    monkeypatch.setattr(os, "pwrite", full)
    w = _hand_worker(tmp_path, 6)
    with pytest.raises(OSError, match="No space left"):
        w.hand_write(0.0)


@pytest.mark.parametrize("compute", ["nan", "inf", "1e300", "-1", "x"])
def test_bench_async_refuses_compute_factors_no_run_can_make(compute, capsys):
    """nan gave numpy's ValueError, inf and 1e300 an OverflowError from time.sleep and an
    MPI_Abort: one line naming --compute, exit 2, before any launch."""
    with pytest.raises(SystemExit) as ei:
        background.main(["--ranks", "1", "--mib", "1", "--compute", compute])
    assert ei.value.code == 2
    assert "--compute: expected" in capsys.readouterr().err


@pytest.mark.parametrize("steps", ["1", "0"])
def test_bench_async_refuses_too_few_steps_to_judge(steps, capsys):
    """--steps 1 judged the prefetch target on no step after the first ("met", 0.00 s):
    at least 2, said before any launch."""
    with pytest.raises(SystemExit) as ei:
        background.main(["--ranks", "1", "--mib", "1", "--steps", steps])
    assert ei.value.code == 2
    assert "--steps must be at least 2" in capsys.readouterr().err
