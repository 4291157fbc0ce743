"""The model behind io='auto': epoch times, the rate fitted to history, the history kept per host.

No timing is asserted: fits are checked on synthetic samples whose answer is
known, decisions on predictions forced by a stub, and real runs only for what
they record (every decision with its predictions and measured outcome).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time

import numpy as np
import pytest

import lamina
from lamina.cli import main as cli_main
from lamina.errors import FormatError
from lamina.perf import asyncmodel as am
from lamina.perf.command import main as model_cli
from lamina.perf.history import History, load_history, save_history, wait_saves

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_util  # noqa: E402


@pytest.fixture
def history_path(tmp_path, monkeypatch):
    path = tmp_path / "history.json"
    monkeypatch.setenv("LAMINA_HISTORY", str(path))
    return path


def _samples(rate_of, sizes=(1 << 20, 4 << 20, 16 << 20, 64 << 20), ranks=(1, 2, 4)):
    return [(b, r, b / rate_of(b, r)) for b in sizes for r in ranks]


def _history(io=(), copy_rates=()):
    h = History()
    for b, r, t in io:
        h.add(am.IO_SERIES, b, r, t)
    for rate in copy_rates:
        h.add(am.COPY_SERIES, 1 << 30, 1, (1 << 30) / rate)
    return h


# -- the epoch model ------------------------------------------------------------------------


def test_epoch_times_and_the_choice():
    m = am.AsyncModel(_history(io=[(1 << 30, 1, 1.0)] * 3, copy_rates=[1 << 33]))
    p = m.predict(1 << 30, 1, t_comp=2.0)  # t_io 1 s, t_copy 1/8 s
    assert p.t_io == pytest.approx(1.0) and p.t_copy == pytest.approx(0.125)
    assert p.t_sync == pytest.approx(3.0) and p.t_async == pytest.approx(2.125)
    assert p.mode == "async"
    # I/O longer than the compute and the copy: the epoch waits for it (max, not t_io -
    # t_comp), and the copy of the next step is made while this one is written
    p = m.predict(1 << 30, 1, t_comp=0.25)
    assert p.t_async == pytest.approx(1.0) and p.mode == "async"
    p = m.predict(1 << 30, 1, t_comp=0.9)
    assert p.t_async == pytest.approx(0.9 + 0.125)
    # nothing to overlap: the copy makes async slower
    p = m.predict(1 << 30, 1, t_comp=0.0)
    assert p.t_sync == pytest.approx(1.0) and p.mode == "sync"
    # each rank copies its share at once
    assert m.predict(1 << 30, 4, t_comp=1.0).t_copy == pytest.approx(0.125 / 4)


def test_steps_written_in_the_background_and_waited_for_are_timed_apart():
    """t_sync from the steps the program waited for, t_async from those written beside it."""
    m = am.AsyncModel(_history(io=[(1 << 30, 1, 2.0)] * 3, copy_rates=[1 << 33]))
    p = m.predict(1 << 30, 1, t_comp=1.5)  # no synchronous samples: both from the background's
    assert p.t_io == pytest.approx(2.0) and p.t_io_sync == pytest.approx(2.0)
    assert p.mode == "async"  # 2.125 < 3.5
    for _ in range(3):
        m.add_io(1 << 30, 1, 1.0, waited=True)  # alone, a step takes half as long
    p = m.predict(1 << 30, 1, t_comp=1.5)
    assert p.t_io == pytest.approx(2.0) and p.t_io_sync == pytest.approx(1.0)
    assert p.t_sync == pytest.approx(2.5) and p.t_async == pytest.approx(2.0)
    p = m.predict(1 << 30, 1, t_comp=0.5)  # too little compute to hide the slower background
    assert p.t_sync == pytest.approx(1.5) and p.t_async == pytest.approx(2.0)
    assert p.mode == "sync"
    assert m.history.samples(am.SYNC_IO_SERIES) == [(float(1 << 30), 1.0, 1.0)] * 3


def test_compute_is_a_weighted_average_of_past_phases():
    m = am.AsyncModel()
    assert m.t_comp() == 0.0
    for c in (1.0, 1.0, 4.0):
        m.add_compute(c)
    assert m.t_comp() == pytest.approx((0.25 * 1 + 0.5 * 1 + 1 * 4) / 1.75)
    m.add_compute(float("nan"))  # ignored
    assert len(m.compute) == 3


# -- io='auto' ------------------------------------------------------------------------------------


def _spy_on_takes(monkeypatch) -> list[bool]:
    """Whether each buffer the pool hands out from now on was free (warm) or new."""
    from lamina.layers.background.step import Pool

    warm: list[bool] = []
    take = Pool.take

    def spy(self, nbytes):
        got = take(self, nbytes)
        warm.append(got[1])
        return got

    monkeypatch.setattr(Pool, "take", spy)
    return warm


def _forced(modes):
    """Stands in for AsyncModel.predict: the modes to pick, one per step."""
    modes = list(modes)

    def predict(model, nbytes, ranks, t_comp=None, copied=None):
        mode = modes.pop(0)
        t_copy = 0.1 if mode == "async" else 2.0  # 1.5 s a step written directly
        t_async = am.async_epoch(0.5, 1.0, t_copy)
        return am.Prediction(nbytes, ranks, 1.0, t_copy, 0.5, 1.5, t_async, mode, "none", 0.0, 1.0)

    return predict


def test_auto_follows_the_model_per_step(tmp_path, history_path, monkeypatch, capsys):
    """The model decides at each end_step; after a step it wrote synchronously, the next
    explicit step goes straight to the engine (no copy at put) and its decision is for the
    step after it.  The first step goes straight to the engine too (its size is known only
    at its end)."""
    forced = ["sync", "async", "async", "sync", "sync"]
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(list(forced)))
    path = str(tmp_path / "auto.lam")
    a = np.arange(1 << 16, dtype=np.float64)
    with lamina.open(path, "w", io="auto") as f:
        assert f.io == "auto"
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(5):
            with f.step():
                f["x"][...] = a + k
                if k in (0, 1, 4):  # direct: nothing copied, nothing in flight
                    assert f.io_stats["inflight_bytes"] == 0
                else:  # copied (steps before may still be in flight too)
                    assert f.io_stats["inflight_bytes"] >= a.nbytes
            if k == 0:  # written before end_step returned, by the program's thread
                assert f.io_stats["steps_direct"] == 1 and f.io_stats["steps_background"] == 0
        s = f.io_stats
    assert s["steps_auto_sync"] == 4 and s["steps_auto_async"] == 1
    assert s["steps_direct"] == 3 and s["steps_background"] == 2
    d = s["decisions"]
    assert [x["predicted"] for x in d] == forced
    # steps 0, 1 and 4 were written directly (sync) whatever their own decision said
    assert [x["mode"] for x in d] == ["sync", "sync", "async", "sync", "sync"]
    for x in d:
        assert x["nbytes"] == a.nbytes and x["ranks"] == 1
        assert {"t_io", "t_copy", "t_comp", "t_sync", "t_async", "fit", "r2"} <= set(x)
        assert x["t_io_measured"] > 0
    assert all("epoch_measured" in x and "t_comp_measured" in x for x in d[:-1])
    with lamina.open(path) as f:
        assert f.steps == 5
        for k in range(5):
            np.testing.assert_array_equal(f.at(k)["x"][...], a + k)
    # what the run measured is kept for the next runs on this host
    h = load_history(str(history_path))
    io, waited = h.samples(am.IO_SERIES), h.samples(am.SYNC_IO_SERIES)
    assert len(io) == 1 and len(waited) == 4  # step 2 in the background; 0, 1, 3, 4 waited for
    assert all(b == a.nbytes and r == 1 for b, r, _ in io + waited)
    # and the decisions are in the file: lamina ls shows them
    assert cli_main(["ls", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = doc["io_decisions"]
    assert [x["mode"] for x in got] == ["sync", "sync", "async", "sync", "sync"]
    assert all(x["t_io"] == 1.0 and x["t_io_measured"] > 0 for x in got)
    assert cli_main(["ls", path]) == 0
    assert (
        "io='auto' wrote 5 steps: 1 in the background, 4 synchronously" in capsys.readouterr().out
    )


def test_every_decision_of_a_long_run_is_in_the_file(tmp_path, history_path, monkeypatch, capsys):
    """A run of more steps than io_stats keeps (the last 64) has every decision in the file,
    each with its outcome, read back after the file is opened again (it kept the last 64).
    Rank 0 encodes each as soon as its step is done, not the whole list at every step, and
    the file holds them in records of a bounded size."""
    n = 100
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["async", "sync", "async", "async"] * n))
    monkeypatch.setattr(am, "DECISIONS_PART_BYTES", 4096)  # a few records, not one
    path = str(tmp_path / "long.lam")
    a = np.arange(1 << 13, dtype=np.float64)
    with lamina.open(path, "w", io="auto") as f:
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(n):
            with f.step():
                f["x"][...] = a + k
            # encoded as their steps are done: the last decision and those of steps in flight
            # wait (every 4th step is written directly, after the steps in flight)
            layer = f.engine
            assert len(layer._decisions_open) <= 4
            handed = sum(
                len(am.decode_decisions(raw))
                for key, raw in layer._handed
                if key != am.DECISIONS_KEY
            )
            assert len(layer._decisions_open) + len(layer._decision_rows) + handed == k + 1
        s = f.io_stats
    assert len(s["decisions"]) == am.DECISIONS_KEPT
    with lamina.open(path) as f:
        assert f.steps == n
        got, complete = am.read_decisions(f.engine.catalog.ext)
        assert complete and len(got) == n
        assert sum(1 for k in f.engine.catalog.ext if k.startswith(am.DECISIONS_KEY)) > 2
    assert [d["step"] for d in got] == list(range(n))
    assert all(d["t_io_measured"] > 0 for d in got)
    assert all(d["epoch_measured"] > 0 for d in got[:-1])
    assert [d["predicted"] for d in got] == (["async", "sync", "async", "async"] * n)[:n]
    assert cli_main(["ls", path, "--json"]) == 0
    assert [d["step"] for d in json.loads(capsys.readouterr().out)["io_decisions"]] == list(
        range(n)
    )
    assert cli_main(["ls", path]) == 0
    assert f"io='auto' wrote {n} steps: " in capsys.readouterr().out


def test_a_step_written_directly_behaves_as_a_synchronous_one(tmp_path, history_path, monkeypatch):
    """Errors at the put that made them, discard_step, implicit steps and close, in a step
    io='auto' writes straight to the engine."""
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["sync"] * 8))
    path = str(tmp_path / "direct.lam")
    with lamina.open(path, "w", io="auto") as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        with f.step():  # copied, then written at end_step: the model said sync
            ds[...] = 0.0
        f.begin_step()  # direct from here on
        assert f.engine.in_step
        ds[0:2] = 1.0
        with pytest.raises(lamina.OverlapError, match="overlaps"):
            ds[1:3] = 9.0
        with pytest.raises(IndexError, match="out of bounds"):
            ds.write(np.zeros((5, 6)))
        ds[2:4] = 1.0  # the refused boxes may be written
        f.end_step()
        with pytest.raises(RuntimeError, match="mid-step"):
            with f.step():
                ds[...] = 99.0
                raise RuntimeError("the program fails mid-step")  # the step is discarded
        assert not f.engine.in_step
        with f.step():
            ds[...] = 2.0
        ds[...] = 3.0  # an implicit step (no begin_step): copied, as always
        f.end_step()
        f.begin_step()
        ds[...] = 4.0  # left open: close commits it, as without the layer
        s = f.io_stats
    assert s["steps_direct"] >= 2
    with lamina.open(path) as f:
        got = [float(f.at(k)["x"][0, 0]) for k in range(f.steps)]
    assert got == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_auto_measures_compute_phases_and_decides(tmp_path, history_path):
    path = str(tmp_path / "auto.lam")
    a = np.ones(1 << 18)
    with lamina.open(path, "w", io="auto") as f:
        time.sleep(0.3)  # set-up before the definitions: not the first compute phase
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(5):
            with f.step():
                f["x"][...] = a * k
            sum(range(20000))  # a compute phase
        s = f.io_stats
    assert s["steps_auto_sync"] + s["steps_auto_async"] == 5
    d = s["decisions"]
    # the first phase runs from open to the first end_step (less the writes): the program's
    # work before it, here the definitions
    assert 0 < d[0]["t_comp"] < 0.2
    assert all(x["t_comp_measured"] > 0 for x in d[:-1])
    assert d[-1]["t_comp"] > 0  # the average of the phases before it


def test_copies_are_one_sample_per_step_into_reused_buffers(tmp_path, history_path):
    """t_copy's rate comes from each step's copies together (here 4 puts of 128 KiB a step),
    copies into buffers of earlier steps only: the first step's go into new memory."""
    with lamina.open(str(tmp_path / "c.lam"), "w", io="async") as f:
        f.create_dataset("x", (4, 1 << 14), "f8")
        for k in range(3):
            with f.step():
                for r in range(4):
                    f["x"][r] = k
            f.wait()  # written: the step's buffers serve the next one
    got = load_history(str(history_path)).samples(am.COPY_SERIES)
    assert len(got) == 2 and all(x1 == 4 << 17 for x1, _, _ in got)


def _steps_one_at_a_time(f) -> None:
    """Three steps of 4 puts of 128 KiB, each written before the next is opened."""
    f.create_dataset("x", (4, 1 << 14), "f8")
    for k in range(3):
        with f.step():
            for r in range(4):
                f["x"][r] = k
        f.wait()


def test_t_copy_is_the_step_s_hand_over_once_one_was_timed(tmp_path, history_path):
    """A step's calls cost more than its copies (the calls' own work): the steps' hand-overs
    (one sample a step, beside the copies') predict t_copy, this run's before the history's;
    without any, the copy rate does.  Only hand-overs made while no step was being written
    are samples (a write beside them slows them, and the I/O then bounds the epoch)."""
    m = am.AsyncModel(_history(io=[(1 << 30, 1, 1.0)] * 3, copy_rates=[1 << 33]))
    assert m.predict(1 << 30, 1, t_comp=2.0).t_copy == pytest.approx(0.125)
    for _ in range(3):  # another run's, at this size: the history's median
        m.history.add(am.SUBMIT_SERIES, 1 << 30, 1, 0.5)
    assert m.predict(1 << 30, 1, t_comp=2.0).t_copy == pytest.approx(0.5)
    assert m.predict(1 << 30, 4, t_comp=2.0).t_copy == pytest.approx(0.125 / 4)  # other size
    m.add_submit(1 << 30, 0.25)  # this run's
    p = m.predict(1 << 30, 1, t_comp=2.0)
    assert p.t_copy == pytest.approx(0.25) and p.t_async == pytest.approx(2.25)
    # steps handed over with nothing in flight leave their hand-over: at least their copies
    with lamina.open(str(tmp_path / "s.lam"), "w", io="async") as f:
        _steps_one_at_a_time(f)
    h = load_history(str(history_path))
    copies, submits = h.samples(am.COPY_SERIES), h.samples(am.SUBMIT_SERIES)
    assert len(submits) == len(copies) == 2
    assert all(s[0] == 4 << 17 and s[2] >= c[2] for s, c in zip(submits, copies, strict=True))
    # a step opened while the one before is being written gives none
    gate = threading.Event()
    with lamina.open(str(tmp_path / "t.lam"), "w", io="async") as f:
        _steps_one_at_a_time(f)
        layer = f.engine
        inner_end = layer.inner.end_step

        def slow_end_step():
            gate.wait(10)
            inner_end()

        layer.inner.end_step = slow_end_step
        with f.step():  # written on the thread, held there
            f["x"][0] = 9
        with f.step():  # handed over beside it
            f["x"][1] = 9
        gate.set()
    got = load_history(str(history_path)).samples(am.SUBMIT_SERIES)
    # steps 1, 2 and 3 of this file (step 0 copied into new buffers), not step 4
    assert len(got) == len(submits) + 3


def test_steps_of_lent_arrays_are_handed_over_without_a_copy(tmp_path, history_path):
    """Steps of arrays written with copy=False copy nothing: their calls are their hand-over
    (they were predicted as copies of all their bytes), and io='auto' predicts them so."""
    a = np.zeros((8, 1 << 17))  # 8 MiB a step
    with lamina.open(str(tmp_path / "l.lam"), "w", io="auto") as f:
        f.create_dataset("x", a.shape, a.dtype)
        for _ in range(6):
            with f.step():
                f["x"].write(a, copy=False)
            f.wait()
        model = f.engine.model
        assert model.run.samples(am.LENT_SERIES) and not model.run.samples(am.SUBMIT_SERIES)
        p = model.predict(a.nbytes, 1, copied=0)
        assert p.t_copy < a.nbytes / model.copy_rate() / 2  # calls, not a copy of 8 MiB
        (last,) = f.io_stats["decisions"][-1:]
        assert last["t_copy"] < a.nbytes / model.copy_rate() / 2


def test_lent_steps_say_nothing_of_a_step_that_copies(tmp_path, history_path, capsys):
    """Steps of arrays lent with copy=False copy nothing: their hand-overs (the calls alone,
    about 0.1 ms) predicted the hand-over of steps that copy (64 MiB at 0.3 ms where the
    copy rate said 17 ms).  They are kept apart: a step that copies is predicted from copies,
    a step that lends from lent steps."""
    a = np.zeros((8, 1 << 17))  # 8 MiB a step
    with lamina.open(str(tmp_path / "l.lam"), "w", io="async") as f:
        f.create_dataset("x", a.shape, a.dtype)
        for _ in range(6):
            with f.step():
                f["x"].write(a, copy=False)
            f.wait()
        model = f.engine.model
        lent = model.predict(a.nbytes, 1, copied=0)
        assert lent.t_copy < a.nbytes / model.copy_rate() / 2  # the calls, not a copy
    wait_saves()
    args = ["async", "--bytes", "8MiB", "--ranks", "1", "--compute", "0"]
    assert model_cli([*args, "--history", str(history_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (p,) = doc["predictions"]
    assert p["t_copy"] >= a.nbytes / doc["copy_rate"] / 2
    m = am.AsyncModel(load_history(str(history_path)))
    assert m.predict(a.nbytes, 1).t_copy >= a.nbytes / m.copy_rate() / 2


def test_async_keeps_a_history_too(tmp_path, history_path):
    with lamina.open(str(tmp_path / "a.lam"), "w", io="async") as f:
        f.create_dataset("x", (1 << 12,), "f8")
        for k in range(3):
            with f.step():
                f["x"][...] = k
    assert len(load_history(str(history_path)).samples(am.IO_SERIES)) == 3


# -- lamina model async ----------------------------------------------------------------------------


def test_model_async_command(tmp_path, capsys):
    hist = tmp_path / "h.json"
    save_history(_history(io=_samples(lambda b, r: 1e9), copy_rates=[4e9]), str(hist))
    args = ["async", "--bytes", "64MiB", "--ranks", "2", "--compute", "0,1", "--history", str(hist)]
    assert model_cli(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["samples"] == 12 and doc["copy_rate"] == pytest.approx(4e9)
    p0, p1 = doc["predictions"]
    assert p0["t_io"] == pytest.approx((64 << 20) / 1e9, rel=1e-6)
    assert p0["mode"] == "sync" and p1["mode"] == "async"
    assert model_cli(args) == 0
    out = capsys.readouterr().out
    assert "io='auto' picks" in out and "12 background steps" in out
    assert f"{doc['fit']} fit to every step" in out and "median of the newest" not in out
    assert doc["fit"] == doc["fit_all"] != "local"
    assert model_cli(["async", "--bytes", "lots"]) == 2
    assert "--bytes" in capsys.readouterr().err
    assert model_cli(["async", "--bytes", "1MiB", "--compute", "nan"]) == 2


def test_a_new_machine_is_predicted_from_its_calibration(tmp_path, monkeypatch, capsys):
    """No step in the history: t_io is the calibration's write of the step's bytes by one
    process, t_copy its memcpy; once a step is measured the history takes over."""
    from lamina.perf.calibrate import host, save_calibration

    cal = dataclasses.replace(
        perf_util.calibration(host()), block_seconds={"write": ((1 << 20, 1e-3), (1 << 24, 8e-3))}
    )
    m = am.AsyncModel(History(), calibration=cal)
    p = m.predict(1 << 24, 2, t_comp=0.0)
    assert p.t_io == pytest.approx(8e-3) and p.t_io_sync == pytest.approx(8e-3)
    assert p.fit == "calibration"
    assert p.t_copy == pytest.approx((1 << 23) / (cal.memcpy_bandwidth / 2))
    # without a table: the calibration's write bandwidth
    bare = am.AsyncModel(History(), calibration=perf_util.calibration(host()))
    assert bare.predict(1 << 24, 1).t_io == pytest.approx((1 << 24) / 2e9)
    # a measured step wins
    m.add_io(1 << 24, 2, 0.5)
    assert (
        m.predict(1 << 24, 2).t_io == pytest.approx(0.5)
        and m.predict(1 << 24, 2).fit != "calibration"
    )
    # the command: this host's cached calibration when the history is empty
    path = tmp_path / "cal.json"
    save_calibration(cal, str(path))
    monkeypatch.setenv("LAMINA_CALIBRATION", str(path))
    empty = tmp_path / "none.json"
    args = ["async", "--bytes", "16MiB", "--ranks", "2", "--compute", "0"]
    # a history named on the command line must be there, as for `lamina model derived`
    assert model_cli([*args, "--history", str(empty)]) == 2
    assert "--history" in capsys.readouterr().err
    monkeypatch.setenv("LAMINA_HISTORY", str(empty))  # this host's, not measured yet
    assert model_cli(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))  # strict
    assert doc["fit"] == "calibration" and doc["predictions"][0]["t_io"] == pytest.approx(8e-3)
    assert doc["predictions"][0]["r2"] is None
    assert model_cli(args) == 0
    assert "this machine's calibration" in capsys.readouterr().out
    monkeypatch.setenv("LAMINA_CALIBRATION", str(tmp_path / "missing.json"))  # never measured
    assert model_cli(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["predictions"][0]["t_io"] == pytest.approx((16 << 20) / am.DEFAULT_IO_RATE)
    assert not (tmp_path / "missing.json").exists()


def test_model_async_command_names_the_rate_its_rows_used(tmp_path, capsys):
    """Three steps of the asked size and rank count: the rows' rate is their median, not the
    fit to every step, and the header says so (it named the fit before)."""
    hist = tmp_path / "h.json"
    io = _samples(lambda b, r: 1e9) + [(64 << 20, 2, (64 << 20) / 4e8)] * 3
    save_history(_history(io=io, copy_rates=[4e9]), str(hist))
    args = ["async", "--bytes", "64MiB", "--ranks", "2", "--compute", "0", "--history", str(hist)]
    assert model_cli(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fit"] == "local" and doc["r2"] is None and doc["fit_all"] != "local"
    assert doc["predictions"][0]["t_io"] == pytest.approx((64 << 20) / 4e8)
    assert model_cli(args) == 0
    out = capsys.readouterr().out
    assert "median of the newest steps of this size and rank count" in out
    assert f"not the {doc['fit_all']} fit to every step" in out


def test_steps_far_larger_than_any_measured_are_predicted_as_on_a_new_machine(
    tmp_path, capsys, monkeypatch
):
    """A history of steps of a few hundred bytes (their fixed costs dominate: 1 MB/s) said
    nothing of a step of 64 MiB, but the rate at its edge predicted one at 52 s: beyond 16x
    the largest step measured, the calibration's rate is taken, else the default one."""
    tiny = [(b, 1, b / 1e6) for b in (160, 300, 538)] * 10
    m = am.AsyncModel(_history(io=tiny, copy_rates=[4e9]))
    p = m.predict(64 << 20, 1, t_comp=0.0)
    assert p.fit == "beyond" and p.t_io == pytest.approx((64 << 20) / am.DEFAULT_IO_RATE)
    assert m.predict(8 * 538, 1, t_comp=0.0).fit != "beyond"  # within 16x: the history's
    # a slow history (1 MiB steps at 10 MB/s): past the edge, never less time than at it
    # (16 MiB took 1.7 s, and 16.1 MiB 34 ms)
    slow = am.AsyncModel(_history(io=[(1 << 20, 1, 0.1)] * 10, copy_rates=[4e9]))
    edge = slow.predict(16 << 20, 1, t_comp=0.0)
    assert edge.fit != "beyond" and edge.t_io > 1.0
    for n in ((16 << 20) + (1 << 17), 32 << 20, 1 << 30):
        past = slow.predict(n, 1, t_comp=0.0)
        assert past.fit == "beyond" and past.t_io >= edge.t_io, (n, past.t_io, edge.t_io)
    hist = tmp_path / "h.json"
    save_history(_history(io=tiny, copy_rates=[4e9]), str(hist))
    monkeypatch.setattr(sys.modules["lamina.perf.calibrate"], "cached", lambda: None)
    args = ["async", "--bytes", "64MiB", "--compute", "0", "--history", str(hist)]
    assert model_cli(args) == 0
    out = capsys.readouterr().out
    assert "no step in the history within 16x of this size: the default rate" in out
    assert "the largest 538 B: t_io assumes 0.5 GB/s;" in out


def test_model_async_footnote_says_where_the_rates_came_from(tmp_path, capsys, monkeypatch):
    """Steps in the history, none within 16x of the size asked: the footnote said "no step
    measured on this host yet" (the header said otherwise); it names the largest step, and
    the copy rate from the history's copies is not said to be the calibration's."""
    from lamina.perf.calibrate import host, save_calibration

    path = tmp_path / "cal.json"
    save_calibration(perf_util.calibration(host()), str(path))
    monkeypatch.setenv("LAMINA_CALIBRATION", str(path))
    tiny = [(b, 1, b / 1e6) for b in (160, 300, 538)] * 10
    args = ["async", "--bytes", "64MiB", "--compute", "0", "--history"]
    notes = {}
    for name, copies in (("copies", [4e9]), ("none", [])):
        hist = tmp_path / f"{name}.json"
        save_history(_history(io=tiny, copy_rates=copies), str(hist))
        assert model_cli([*args, str(hist)]) == 0
        notes[name] = capsys.readouterr().out.splitlines()[-1]
    for note in notes.values():
        assert "yet" not in note
        assert note.startswith("(no step measured on this host within 16x of this size, ")
        assert "the largest 538 B: t_io from the calibration's write" in note
    assert "t_copy" not in notes["copies"] and "t_copy from its memcpy rate" in notes["none"]
    # steps waited for, none in the background: t_io is theirs, not the default rate
    hist = tmp_path / "sync.json"
    h = History()
    for b in (1 << 20, 4 << 20):
        h.add(am.SYNC_IO_SERIES, b, 1, b / 2e9)
    save_history(h, str(hist))
    assert model_cli(["async", "--bytes", "4MiB", "--compute", "0", "--history", str(hist)]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert "no background step measured" in note and "t_io from the steps written while" in note


def test_decisions_record_round_trip_and_bad_bytes(monkeypatch):
    d = [{"step": 0, "mode": "sync", "t_io": float("nan"), "t_io_measured": 0.25}]
    (raw,) = am.encode_decisions(d)
    back = am.decode_decisions(raw)
    assert (
        back[0]["mode"] == "sync" and back[0]["t_io"] is None and back[0]["epoch_measured"] is None
    )
    for bad in (b"[1]", b'{"fields": ["a"], "decisions": [[1, 2]]}', b"\xff"):
        with pytest.raises(FormatError):
            am.decode_decisions(bad)
    # many decisions: records of a bounded size, read back in order, every one
    monkeypatch.setattr(am, "DECISIONS_PART_BYTES", 1000)
    many = [{"step": k, "mode": "async", "t_io": 0.001 * k} for k in range(200)]
    parts = am.encode_decisions(many)
    assert len(parts) > 10 and all(len(p) < 2000 for p in parts)
    ext = {am.decisions_key(i): p for i, p in enumerate(parts)}
    got, complete = am.read_decisions(ext)
    assert complete and [x["step"] for x in got] == list(range(200))
    assert am.read_decisions({}) is None
    del ext[am.decisions_key(3)]
    with pytest.raises(FormatError, match="record 3 of"):
        am.read_decisions(ext)
    # a file of an earlier version: one record, without "parts", of the run's last 64 at most
    old = json.dumps(
        {"fields": ["step", "mode"], "decisions": [[k, "sync"] for k in range(16, 80)]}
    ).encode()
    got, complete = am.read_decisions({am.DECISIONS_KEY: old})
    assert [x["step"] for x in got] == list(range(16, 80)) and not complete
    got, complete = am.read_decisions({am.DECISIONS_KEY: am.encode_decisions(many[:5])[0]})
    assert len(got) == 5 and complete
    assert am.read_decisions({am.DECISIONS_KEY: am.encode_decisions([])[0]}) == ([], True)
    with pytest.raises(FormatError, match="record 1 of 9 is missing"):
        am.read_decisions({am.DECISIONS_KEY: b'{"fields": [], "decisions": [], "parts": 9}'})
    for n in ("0", "-1", "true", "1.0"):
        raw = b'{"fields": [], "decisions": [], "parts": %s}' % n.encode()
        with pytest.raises(FormatError, match="not a number of records"):
            am.read_decisions({am.DECISIONS_KEY: raw})


def test_decisions_handed_down_while_a_writer_runs_read_back_alone():
    """Records a writer hands down with its steps (``"run"``: its first step) are read up to
    the first missing one or one of another run (left by an earlier writer of the file); the
    head of a run under way holds no row and says the decisions are not all; a closed run's
    head says how many records hold its decisions."""
    rows = [am.decision_row({"step": k, "mode": "sync"}) for k in range(12)]
    mine = am.encode_decision_parts(rows[8:12], run=8)
    assert len(mine) == 1 and am.encode_decision_parts([], run=8) == []
    stale = am.encode_decision_parts(rows[:8], run=0)  # an earlier writer's, closed
    ext = {
        am.DECISIONS_KEY: am.decisions_head(8),
        am.decisions_key(1): mine[0],
        am.decisions_key(2): stale[0],  # left over: not this run's
    }
    got, complete = am.read_decisions(ext)
    assert [d["step"] for d in got] == [8, 9, 10, 11] and not complete
    assert am.decisions_unfinished(ext)
    del ext[am.decisions_key(1)]  # the first record missing: none read
    assert am.read_decisions(ext) == ([], False)
    # closed: the head counts the records, its own included
    closed = {am.DECISIONS_KEY: am.decisions_head(8, 3), am.decisions_key(1): mine[0]}
    closed[am.decisions_key(2)] = am.encode_decision_parts([am.decision_row({"step": 12})], 8)[0]
    got, complete = am.read_decisions(closed)
    assert [d["step"] for d in got] == [8, 9, 10, 11, 12] and complete
    assert not am.decisions_unfinished(closed) and not am.decisions_unfinished({})
    assert not am.decisions_unfinished({am.DECISIONS_KEY: b"nonsense"})
    # the old single record (no "parts", no "run") is still an earlier version's last ones
    old = {am.DECISIONS_KEY: b'{"fields": ["step"], "decisions": [[3]]}'}
    assert am.read_decisions(old) == ([{"step": 3}], True) and not am.decisions_unfinished(old)


_AUTO_WRITER = """
import os, signal, sys
import numpy as np
import lamina
path, mode, first, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
a = np.arange(1 << 14, dtype=np.float64)
f = lamina.open(path, mode, io="auto", durable=False)
if mode == "w":
    f.create_dataset("x", a.shape, a.dtype)
for k in range(first, first + n):
    with f.step():
        f["x"][...] = a + k
if sys.argv[5] == "kill":
    f.wait()  # every step committed
    os.kill(os.getpid(), signal.SIGKILL)
f.close()
"""


def test_a_killed_auto_writer_leaves_the_decisions_of_its_steps(tmp_path, history_path, capsys):
    """io='auto' hands each decision down with a step once it is measured, so that a writer
    killed before its close leaves the decisions of the steps it committed (they were
    written at close only: none survived).  ``lamina ls`` and ``lamina info`` say that the
    last ones are missing.  A writer that appends to the file afterwards and closes has
    its own decisions read back, none of the killed writer's mixed in."""
    import subprocess

    path = str(tmp_path / "killed.lam")
    env = {**os.environ, "LAMINA_HISTORY": str(history_path)}
    n = 12
    proc = subprocess.run(
        [sys.executable, "-c", _AUTO_WRITER, path, "w", "0", str(n), "kill"], env=env, timeout=120
    )
    assert proc.returncode == -9, proc
    with lamina.open(path) as f:
        assert f.steps == n
        ext = dict(f.engine.catalog.ext)
    got, complete = am.read_decisions(ext)
    assert not complete and am.decisions_unfinished(ext)
    steps = [d["step"] for d in got]
    assert steps == list(range(len(steps))) and len(steps) >= n - 4, steps
    assert all(d["mode"] in ("sync", "async") and d["t_io_measured"] > 0 for d in got)
    assert cli_main(["ls", path]) == 0
    said = capsys.readouterr().out
    assert f"io='auto' wrote at least {len(steps)} steps (its writer did not close" in said, said
    assert cli_main(["info", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["io_decisions_unfinished"] is True and doc["io_decisions_all"] is False
    assert [d["step"] for d in doc["io_decisions"]] == steps
    # the next writer appends and closes: its decisions alone, every one
    proc = subprocess.run(
        [sys.executable, "-c", _AUTO_WRITER, path, "a", str(n), "5", "close"], env=env, timeout=120
    )
    assert proc.returncode == 0, proc
    with lamina.open(path) as f:
        assert f.steps == n + 5
        got, complete = am.read_decisions(f.engine.catalog.ext)
        assert complete and not am.decisions_unfinished(f.engine.catalog.ext)
    assert [d["step"] for d in got] == list(range(n, n + 5))


_KILLED_HISTORY = """
import os, signal, sys, time
import numpy as np
import lamina
import lamina.perf.history as ph
ph.FLUSH_AFTER = float(sys.argv[2])  # samples older than this are saved at the next handing-over
a = np.arange(1 << 14, dtype=np.float64)
with lamina.open(sys.argv[1], "w", io=sys.argv[3], durable=False) as f:
    f.create_dataset("x", a.shape, a.dtype)
    for k in range(8):
        with f.step():
            f["x"][...] = a + k
        f.wait() if k % 2 else time.sleep(0.01)  # a compute phase, or a wait for the step
    os.kill(os.getpid(), signal.SIGKILL)  # at its time limit, say: no close, no exit
"""


@pytest.mark.parametrize("io", ["auto", "async"])
def test_a_killed_writer_keeps_the_history_it_measured(tmp_path, history_path, io):
    """The samples a writer measured are handed over at each end_step, and those that waited
    FLUSH_AFTER seconds are saved then: a long job killed before its close keeps its
    history but the last minutes (it lost all of it: samples were handed over at close).
    With the 300 s of FLUSH_AFTER, a job as short as this one keeps none."""
    import subprocess

    env = {**os.environ, "LAMINA_HISTORY": str(history_path)}

    def killed(after: float) -> list:
        path = str(tmp_path / f"k{after}.lam")
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED_HISTORY, path, str(after), io], env=env, timeout=120
        )
        assert proc.returncode == -9, proc
        h = load_history(str(history_path))
        return h.samples(am.IO_SERIES) + h.samples(am.SYNC_IO_SERIES)

    got = killed(0.0)  # the steps measured before the last end_step: saved
    assert len(got) >= 5 and all(b == (1 << 14) * 8 and r == 1 for b, r, _ in got), got
    assert len(killed(300.0)) == len(got)  # none waited 300 s: none saved, the file unchanged


def test_a_history_that_cannot_be_saved_is_warned_of_once(tmp_path, monkeypatch):
    """Samples handed over at many end_steps and at close, then a save that fails: one
    LaminaWarning naming the history, not one for every handing-over."""
    import warnings

    from lamina.errors import LaminaWarning

    (tmp_path / "plain").write_text("a file, not a directory")
    monkeypatch.setenv("LAMINA_HISTORY", str(tmp_path / "plain" / "history.json"))
    path = str(tmp_path / "w.lam")
    a = np.arange(1 << 12, dtype=np.float64)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with lamina.open(path, "w", io="auto") as f:
            f.create_dataset("x", a.shape, a.dtype)
            for k in range(6):
                with f.step():
                    f["x"][...] = a + k
                f.wait()
                f.engine._history_handed = 0.0  # the next end_step hands samples over again
        wait_saves()
    said = [w for w in got if "cannot keep the I/O history" in str(w.message)]
    assert len(said) == 1 and issubclass(said[0].category, LaminaWarning), [
        str(w.message) for w in got
    ]


def test_a_closed_writer_is_not_held_by_its_history_waiting_to_be_saved(tmp_path):
    """The samples a closed writer handed over wait for the save at the interpreter's exit:
    what they wait with (the warning of a failed save) holds no writer alive, so that a
    program that writes many files does not keep every one's layers and catalog."""
    import gc
    import weakref

    a = np.arange(1 << 12, dtype=np.float64)
    f = lamina.open(str(tmp_path / "w.lam"), "w", io="auto")
    f.create_dataset("x", a.shape, a.dtype)
    for k in range(3):
        with f.step():
            f["x"][...] = a + k
    layer = weakref.ref(f.engine)
    f.close()
    del f
    gc.collect()
    assert layer() is None, gc.get_referrers(layer())
    wait_saves()


def test_decisions_of_a_step_that_failed_early_reach_the_file_at_close(
    tmp_path, history_path, monkeypatch
):
    """A step that holds records of decisions and fails before it hands them to the engine
    (its begin_step, in the background) leaves them out of the file: the close writes them
    again, so that the file still holds every decision (a record missing made the whole
    list unreadable)."""
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["async"] * 40))
    path = str(tmp_path / "failed.lam")
    f = lamina.open(path, "w", io="auto")
    eng = f.engine.stack()[-1]
    begin, gate, failed = eng.begin_step, threading.Event(), []
    gate.set()

    def begin_step():
        assert gate.wait(30)
        if len(eng.catalog.steps) == 3 and not failed:
            failed.append(3)
            raise OSError("injected failure in step 3")
        return begin()

    eng.begin_step = begin_step
    ds = f.create_dataset("x", (64,), "f8")
    for k in range(3):
        with f.step():
            ds[...] = float(k)
    f.wait()
    gate.clear()  # steps 3-5 queue: 3 fails before its writes, 4 and 5 are cancelled
    for k in range(3, 6):
        with f.step():
            ds[...] = float(k)
    held = {s.index: [k for k, _ in s.exts] for s in f.engine._queue}
    assert held[3] == [am.decisions_key(2)], held  # (the rows of steps 0 and 1; 2 is open)
    gate.set()
    with pytest.raises(OSError, match="injected failure in step 3"):
        f.wait()
    assert am.decisions_key(2) not in eng.catalog.ext  # never handed to the engine
    for k in range(3, 6):
        with f.step():
            ds[...] = float(k)
    decided = [d["step"] for d in f.io_stats["decisions"]]
    f.close()
    with lamina.open(path) as r:
        assert r.steps == 6
        got, complete = am.read_decisions(r.engine.catalog.ext)
    assert complete and [d["step"] for d in got] == decided


def test_copies_into_new_buffers_count_once_the_pool_has_served(tmp_path, history_path):
    """Blocks whose size changes every step never find a reused buffer: after the first
    step is written their copies into new memory are this run's copies, and are sampled;
    the first step's (before any buffer came back) are not."""
    with lamina.open(str(tmp_path / "v.lam"), "w", io="async") as f:
        f.create_dataset("x", (1 << 16,), "f8")
        for k in range(4):
            with f.step():
                f["x"][: (1 << 13) * (k + 1)] = k  # 64, 128, 192, 256 KiB
            f.wait()
    got = load_history(str(history_path)).samples(am.COPY_SERIES)
    assert [x1 for x1, _, _ in got] == [(1 << 16) * (k + 1) for k in range(1, 4)]


def test_pool_missing_and_touched_buffers():
    from lamina.layers.background.step import Pool, touched

    pool = Pool()
    assert pool.missing([8, 8, 16]) == [8, 8, 16]
    pool.give(touched([8, 16, 4096 * 3]), room=1 << 20)
    assert pool.missing([8, 8, 16, 32, 4096 * 3]) == [8, 32]
    raw, warm = pool.take(4096 * 3)
    assert warm and raw.dtype == np.uint8 and raw.nbytes == 4096 * 3


def test_new_buffers_of_copies_are_populated_at_once_where_linux_allows():
    """A new buffer of POPULATE_MIN bytes or more is mapped with its pages populated by the
    kernel (a copy into it takes no page faults), writeable, and served again by the pool; a
    smaller one comes from malloc; the pool reports what making a buffer cost."""
    import mmap

    from lamina.layers.background.step import POPULATE_MIN, Pool, new_buffer

    big, populated = new_buffer(POPULATE_MIN)
    assert populated == hasattr(mmap, "MAP_POPULATE")
    assert big.dtype == np.uint8 and big.nbytes == POPULATE_MIN and big.flags.writeable
    big[:] = 7
    assert int(big[::4096].sum()) == 7 * (POPULATE_MIN // 4096)
    small, populated = new_buffer(POPULATE_MIN - 1)
    assert not populated and small.nbytes == POPULATE_MIN - 1
    pool = Pool()
    raw, warm = pool.take(POPULATE_MIN)
    assert not warm and pool.made_seconds > 0
    ident = id(raw)
    pool.give([raw], room=1 << 30)
    del raw
    again, warm = pool.take(POPULATE_MIN)
    assert warm and id(again) == ident and pool.made_seconds == 0.0


def test_auto_readies_the_buffers_of_a_copied_step_after_a_direct_one(
    tmp_path, history_path, monkeypatch
):
    """When a step written directly decides that the next goes to the background, the worker
    makes buffers of its puts' sizes while the program computes: the next step's copies go
    into memory already touched, not into new pages."""

    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["async", "async", "async"]))
    warm = _spy_on_takes(monkeypatch)
    a, b = np.ones(1 << 15), np.ones(1 << 14, dtype=np.float32)
    with lamina.open(str(tmp_path / "w.lam"), "w", io="auto") as f:
        f.create_dataset("a", a.shape, a.dtype)
        f.create_dataset("b", b.shape, b.dtype)
        layer = f._engine
        for k in range(2):
            with f.step():  # step 0: direct; step 1: copied
                f["a"][...] = a + k
                f["b"][...] = b + k
            deadline = time.monotonic() + 10
            while k == 0 and sorted(layer._pool.free) != sorted([a.nbytes, b.nbytes]):
                assert time.monotonic() < deadline, "the buffers were not made ready"
                time.sleep(0.001)
        assert f.io_stats["steps_direct"] == 1
    assert warm == [True, True]  # step 1's two copies, both into ready buffers
    with lamina.open(str(tmp_path / "w.lam")) as f:
        np.testing.assert_array_equal(f.at(1)["a"][...], a + 1)
        np.testing.assert_array_equal(f.at(1)["b"][...], b + 1)


@pytest.mark.timeout(120)
def test_a_failure_to_make_buffers_ready_leaves_the_worker_writing(
    tmp_path, history_path, monkeypatch
):
    """Making buffers ready is only a saving: when it fails (no memory), the background thread
    goes on writing steps and the file closes."""
    from lamina.layers.background import layer as layer_mod
    from lamina.layers.background.step import Pool

    def no_memory(sizes):
        raise MemoryError("no memory for the buffers")

    monkeypatch.setattr(layer_mod, "touched", no_memory)
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["async"] * 4))
    a = np.arange(1 << 14, dtype=np.float64)
    with lamina.open(str(tmp_path / "f.lam"), "w", io="auto") as f:
        f.create_dataset("a", a.shape, a.dtype)
        layer = f._engine
        for k in range(4):
            with f.step():  # step 0 direct, its buffers fail; then the background
                f["a"][...] = a + k
            deadline = time.monotonic() + 10
            while k == 0 and layer._warm:  # the worker took the job (and failed it)
                assert time.monotonic() < deadline
                time.sleep(0.001)
        f.wait()
        assert f.io_stats["steps_background"] == 3
    with lamina.open(str(tmp_path / "f.lam")) as f:
        assert f.steps == 4
        np.testing.assert_array_equal(f.at(3)["a"][...], a + 3)
    pool = Pool()
    pool.give([np.empty(8, dtype=np.uint8)], room=64, served=False)
    assert not pool.served and pool.missing([8]) == []  # made ready: not a step come back
    pool.give([np.empty(8, dtype=np.uint8)], room=64)
    assert pool.served


@pytest.mark.parametrize("ranks_in_history, copied", [(1, True), (2, False), (None, False)])
def test_auto_judges_the_first_step_on_the_last_step_this_host_wrote(
    tmp_path, history_path, ranks_in_history, copied
):
    """The first explicit step under io='auto': its size is known only at its end, so the last
    step this host wrote with as many ranks stands in for it (with the time since open as the
    compute phase).  A history that says the background pays: the step is copied; a history
    of other rank counts, or none: written directly."""
    a = np.arange(1 << 16, dtype=np.float64)
    h = History()
    if ranks_in_history is not None:
        for _ in range(3):  # background steps far cheaper than waited ones, copies cheap
            h.add(am.IO_SERIES, a.nbytes * ranks_in_history, ranks_in_history, 1e-5)
            h.add(am.SYNC_IO_SERIES, a.nbytes * ranks_in_history, ranks_in_history, 0.05)
            h.add(am.COPY_SERIES, 1 << 30, 1, (1 << 30) / 1e10)
        save_history(h, str(history_path))
    with lamina.open(str(tmp_path / "g.lam"), "w", io="auto") as f:
        f.create_dataset("a", a.shape, a.dtype)
        time.sleep(0.02)  # the program computes before its first step
        with f.step():
            f["a"][...] = a
            assert (f.io_stats["inflight_bytes"] == a.nbytes) == copied
        assert f.io_stats["steps_direct"] == (0 if copied else 1)
    with lamina.open(str(tmp_path / "g.lam")) as f:
        np.testing.assert_array_equal(f.at(0)["a"][...], a)


def test_steps_of_the_same_size_and_ranks_predict_by_their_median_rate():
    """A history of many sizes fits a line that may miss any one size; steps of the same rank
    count within a factor 2 of the size asked (3 or more) give their median rate instead."""
    h = History()
    sizes = (1 << 20, 4 << 20, 16 << 20, 256 << 20)
    for b, r, t in _samples(lambda b, r: 1e9 if b < (32 << 20) else 4e9, sizes, ranks=(1,)):
        h.add(am.IO_SERIES, b, r, t)
    m = am.AsyncModel(h)
    p = m.predict(64 << 20, 1, t_comp=0.0)  # one step of that size: the fit
    assert p.fit != "local"
    for t in (0.020, 0.022, 0.030):  # three steps of 60 MiB on one rank: 3.0, 2.86, 2.1 GB/s
        h.add(am.IO_SERIES, 60 << 20, 1, t)  # written by earlier runs
    p = m.predict(64 << 20, 1, t_comp=0.0)
    assert p.fit == "local" and p.t_io == pytest.approx((64 << 20) / ((60 << 20) / 0.022))
    assert m.predict(64 << 20, 2, t_comp=0.0).fit != "local"  # other rank count: the fit
    assert m.predict(256 << 20, 1, t_comp=0.0).fit != "local"  # 4x the size: the fit


def test_steps_of_this_run_predict_before_the_history():
    """Other runs' steps may have been written on a busier (or quieter) machine: once this
    run wrote a step like the one asked, its own steps' median rate predicts, for each
    series apart; the history keeps every step."""
    h = History()
    for _ in range(5):  # earlier runs, on a busy machine: 16 MiB in 0.2 s in the background
        h.add(am.IO_SERIES, 16 << 20, 2, 0.2)
        h.add(am.SYNC_IO_SERIES, 16 << 20, 2, 0.006)
    m = am.AsyncModel(h)
    p = m.predict(16 << 20, 2, t_comp=0.006)
    assert p.fit == "local" and p.t_io == pytest.approx(0.2) and p.mode == "sync"
    m.add_io(16 << 20, 2, 0.005)  # this run: one step in the background, at 5 ms
    p = m.predict(16 << 20, 2, t_comp=0.006)
    assert p.fit == "run" and p.t_io == pytest.approx(0.005) and p.mode == "async"
    assert p.t_io_sync == pytest.approx(0.006)  # no step of this run waited for: the history's
    for t in (0.004, 0.009):
        m.add_io(16 << 20, 2, t)
    assert m.predict(16 << 20, 2).t_io == pytest.approx(0.005)  # their median
    assert m.predict(64 << 20, 2).fit != "run"  # 4x the size: not like this run's steps
    assert len(m.history.samples(am.IO_SERIES)) == 8


@pytest.mark.parametrize("huge", [True, False])
def test_new_buffers_cut_from_shared_regions_are_arrays_of_their_own(monkeypatch, huge):
    """Buffers smaller than a huge page are cut from shared regions where huge pages are
    given: each is populated, writeable, apart from the others, and an array of its own, so
    that a view an engine keeps refers to it and the pool does not hand it out again."""
    from lamina.layers.background import step as step_mod

    monkeypatch.setattr(step_mod, "HUGE_PAGES", huge)
    big, small = step_mod.HUGE + 4096, step_mod.POPULATE_MIN
    sizes = [small, 3 * small + 8, small, big, 100]
    got = step_mod.Regions().make(sizes)
    assert [raw.nbytes for raw, _ in got] == sizes
    assert [populated for _, populated in got][:4] == [True] * 4 and not got[4][1]
    spans = sorted((raw.ctypes.data, raw.ctypes.data + raw.nbytes) for raw, _ in got)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
    for k, (raw, _) in enumerate(got):
        raw[:] = k + 1
    for k, (raw, _) in enumerate(got):
        assert raw.flags.writeable and raw.dtype == np.uint8
        assert int(raw.min()) == int(raw.max()) == k + 1
        if huge and k < 3:  # cut from one region, each its own array over the mapping
            held = raw.view(np.float32)[1:]
            assert held.base is raw
    raws = [raw for raw, _ in got]
    del got, raw
    pool = step_mod.Pool()
    pool.give(raws, room=1 << 30)
    first, second = pool.free[small]
    held = second.view(np.float64)  # an engine keeps a view of one of them
    ident = id(first)
    del first, second
    again, warm = pool.take(small)  # the one held is skipped, the other one served
    assert warm and id(again) == ident and held.base is not again


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cores", [2, 1])
def test_buffers_of_the_next_step_are_made_while_a_step_is_written(
    tmp_path, history_path, monkeypatch, cores
):
    """A step submitted while the worker has it (or others) in flight: the buffers of the
    next step's copies are made on a thread of their own while the program computes, so the
    next step copies into memory already touched, not into new pages.  Not where the rank
    has no core beside the program's: there the thread would slow the writes."""
    import threading

    from lamina.layers.background import layer as layer_mod

    monkeypatch.setattr(layer_mod, "cores_per_rank", lambda: cores)
    gate = threading.Event()
    run = layer_mod.BackgroundLayer._run

    def held(self, step):  # the worker writes step 0 only once the test lets it
        assert gate.wait(30)
        return run(self, step)

    monkeypatch.setattr(layer_mod.BackgroundLayer, "_run", held)
    warm = _spy_on_takes(monkeypatch)
    a, b = np.arange(1 << 16, dtype=np.float64), np.arange(1 << 15, dtype=np.float32)
    with lamina.open(str(tmp_path / "m.lam"), "w", io="async") as f:
        f.create_dataset("a", a.shape, a.dtype)
        f.create_dataset("b", b.shape, b.dtype)
        layer = f._engine
        for k in range(2):
            with f.step():
                f["a"][...] = a + k
                f["b"][...] = b + k
            if k == 0 and cores == 1:
                assert layer._ahead is None and not layer._pool.free
            elif k == 0:  # step 0 is in flight: the buffers of step 1 are being made
                assert layer._ahead is not None
                layer._ahead.result(timeout=30)
                assert sorted(layer._pool.free) == sorted([a.nbytes, b.nbytes])
        gate.set()
    assert warm == [False, False, cores > 1, cores > 1]
    with lamina.open(str(tmp_path / "m.lam")) as f:
        for k in range(2):
            np.testing.assert_array_equal(f.at(k)["a"][...], a + k)
            np.testing.assert_array_equal(f.at(k)["b"][...], b + k)


def test_auto_writes_a_step_the_other_way_after_a_streak(
    tmp_path, history_path, monkeypatch, capsys
):
    """The model learns what a mode costs only from steps written that way: after
    PROBE_AFTER decisions in a row for one mode, the next step goes the other way once, and
    the streak that earns the next such step doubles."""
    from lamina.layers.background.layer import PROBE_AFTER

    n = PROBE_AFTER + 1 + 2 * PROBE_AFTER + 1 + 3
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["sync"] * n))
    a = np.arange(1 << 12, dtype=np.float64)
    path = str(tmp_path / "p.lam")
    with lamina.open(path, "w", io="auto") as f:
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(n):
            with f.step():
                f["x"][...] = a + k
        s = f.io_stats
    d = s["decisions"]
    probes = [x["step"] for x in d if x["probe"]]
    # steps 0 to PROBE_AFTER - 1 written directly, then one in the background; then twice
    # as many directly, and one in the background
    first = PROBE_AFTER
    assert probes == [first, first + 2 * PROBE_AFTER + 1] and s["probes"] == 2
    assert all(x["mode"] == ("async" if x["probe"] else "sync") for x in d)
    assert all(x["predicted"] == "sync" for x in d)
    # each probe was copied and written in the background, and so was the step after it
    # (written as decided, while the program waited: a step after one in the background is
    # copied before its decision)
    assert s["steps_background"] == 4 and s["steps_direct"] == n - 4
    assert all(x["t_sync_ranks"] == pytest.approx(1.5) for x in d)
    assert all(x["t_async_ranks"] == pytest.approx(2.5) for x in d)
    with lamina.open(path) as f:
        for k in range(n):
            np.testing.assert_array_equal(f.at(k)["x"][...], a + k)
    # the decisions in the file say so: lamina ls
    assert cli_main(["ls", path]) == 0
    out = capsys.readouterr().out
    assert f"wrote {n} steps: 2 in the background, {n - 2} synchronously, 2 of them the" in out


def test_no_probe_copies_a_step_over_the_budget(tmp_path, history_path, monkeypatch):
    """A step that does not fit max_inflight_bytes is written directly: the streak of direct
    steps earns no step in the background."""
    from lamina.layers.background.layer import PROBE_AFTER

    n = 2 * PROBE_AFTER + 3
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["async"] * n))
    a = np.arange(1 << 12, dtype=np.float64)
    with lamina.open(
        str(tmp_path / "b.lam"), "w", io="auto", max_inflight_bytes=a.nbytes // 2
    ) as f:
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(n):
            with f.step():
                f["x"][...] = a + k
        s = f.io_stats
    assert s["steps_direct"] == n and s["probes"] == 0
    assert all(x["t_async_ranks"] is None and x["mode"] == "sync" for x in s["decisions"])


def test_auto_leaves_a_history_of_slow_background_steps(tmp_path, history_path):
    """Other runs wrote steps like these in the background very slowly (a busy machine): the
    model writes the first steps directly; the step it then writes in the background (a
    probe) takes what it takes now, and this run's steps decide from there on."""
    from lamina.layers.background.layer import MARGIN, PROBE_AFTER

    a = np.ones(1 << 19, dtype=np.float64)  # 4 MiB a step
    h = History()
    for _ in range(5):
        h.add(am.IO_SERIES, a.nbytes, 1, 10.0)  # 10 s a step in the background
        h.add(am.SYNC_IO_SERIES, a.nbytes, 1, 0.004)
        h.add(am.COPY_SERIES, 1 << 30, 1, (1 << 30) / 5e9)
    save_history(h, str(history_path))
    n = PROBE_AFTER + 4
    with lamina.open(str(tmp_path / "s.lam"), "w", io="auto") as f:
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(n):
            time.sleep(0.05)  # computing: far longer than a step's I/O
            with f.step():
                f["x"][...] = a * k
            if k == PROBE_AFTER:  # the probe's write measured before the next decision
                f.wait()
        d = f.io_stats["decisions"]
    assert [x["mode"] for x in d[:PROBE_AFTER]] == ["sync"] * PROBE_AFTER
    assert d[PROBE_AFTER - 1]["fit"] == "local" and d[PROBE_AFTER - 1]["predicted"] == "sync"
    probed = d[PROBE_AFTER]  # written in the background: it measured the background
    assert probed["probe"] and probed["mode"] == "async"
    # from here this run's own steps decide, not the history's 10 s: which mode wins is
    # what this machine measures now (a copy against a direct write, a few milliseconds
    # each; a loaded machine may tip it), so a step written directly must be one the run's
    # measurements predicted no faster in the background.  The decision that made it so is
    # its own where the step before was copied (decided at its end_step), and the step
    # before's where that one was written directly (its decision, made once it was
    # written, is for the next step): then a direct step whose measurements favour the
    # background is followed by a copied one.
    for i in range(PROBE_AFTER + 1, len(d)):
        x = d[i]
        assert x["fit"] == "run" and x["t_io"] < 1.0 and not x["probe"], x
        assert x["t_async_ranks"] is not None and x["t_async_ranks"] < 1.0, x
        if x["mode"] == "sync":
            by = d[i - 1] if d[i - 1]["mode"] == "sync" else x
            assert by["t_async_ranks"] >= by["t_sync_ranks"] * (1 - MARGIN), (by, x)
            if i + 1 < len(d) and x["t_async_ranks"] < x["t_sync_ranks"] * (1 - MARGIN):
                assert d[i + 1]["mode"] == "async", (x, d[i + 1])


@pytest.mark.parametrize("ratio, switched", [(0.97, False), (0.9, True)])
def test_auto_changes_mode_where_the_other_is_better_by_a_margin(
    tmp_path, history_path, monkeypatch, ratio, switched
):
    """Within MARGIN of each other the predictions are noise and a change of mode costs what
    the model leaves out: the mode of the last steps is kept; beyond it, changed."""
    from lamina.layers.background.layer import MARGIN

    assert 1 - ratio < MARGIN if not switched else 1 - ratio > MARGIN
    calls = []

    def predict(model, nbytes, ranks, t_comp=None, copied=None):
        calls.append(1)
        # the first decisions: sync clearly; then the background a little (or much) faster
        t_copy = 2.0 if len(calls) <= 2 else 1.5 * ratio - 0.5
        t_async = am.async_epoch(0.5, 1.0, t_copy)  # 1.5 x ratio: compute and copy the longer
        mode = "async" if t_async < 1.5 else "sync"
        return am.Prediction(nbytes, ranks, 1.0, t_copy, 0.5, 1.5, t_async, mode, "none", 0.0, 1.0)

    monkeypatch.setattr(am.AsyncModel, "predict", predict)
    a = np.arange(1 << 12, dtype=np.float64)
    with lamina.open(str(tmp_path / "m.lam"), "w", io="auto") as f:
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(5):
            with f.step():
                f["x"][...] = a + k
        f.wait()
        d = f.io_stats["decisions"]
    assert [x["predicted"] for x in d] == ["sync"] * 2 + ["async"] * 3
    assert [x["mode"] for x in d][3:] == (["async"] * 2 if switched else ["sync"] * 2)


def test_a_probe_of_writing_directly_is_one_step(tmp_path, history_path, monkeypatch):
    """After PROBE_AFTER steps in the background, one is written directly: it was copied, so
    it is written while the program waits, and the step after it is copied again (a step
    decided sync otherwise sends the next one straight to the engine)."""
    from lamina.layers.background.layer import PROBE_AFTER

    n = PROBE_AFTER + 4
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["async"] * (n + 1)))  # + the first
    h = History()
    for _ in range(3):  # the first step judged on the history: in the background
        h.add(am.IO_SERIES, 1 << 15, 1, 1e-5)
        h.add(am.SYNC_IO_SERIES, 1 << 15, 1, 0.05)
    save_history(h, str(history_path))
    a = np.arange(1 << 12, dtype=np.float64)
    with lamina.open(str(tmp_path / "d.lam"), "w", io="auto") as f:
        f.create_dataset("x", a.shape, a.dtype)
        time.sleep(0.01)
        for k in range(n):
            with f.step():
                f["x"][...] = a + k
        f.wait()
        s = f.io_stats
    d = s["decisions"]
    assert [x["step"] for x in d if x["probe"]] == [PROBE_AFTER - 1] and s["probes"] == 1
    assert [x["mode"] for x in d] == ["async"] * (PROBE_AFTER - 1) + ["sync"] + ["async"] * 4
    assert s["steps_direct"] == 0 and s["steps_background"] == n


def test_the_first_step_of_an_open_is_not_one_of_the_run_s_samples(
    tmp_path, history_path, monkeypatch
):
    """The first step an open writes creates the file's first bytes (several times a later
    step's time): the history keeps it, the run's own samples (which predict first) do not."""
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["sync"] * 20))
    seen = []
    add_io = am.AsyncModel.add_io

    def spy(self, *args, run=True, **kw):
        seen.append(run)
        return add_io(self, *args, run=run, **kw)

    monkeypatch.setattr(am.AsyncModel, "add_io", spy)
    a = np.arange(1 << 12, dtype=np.float64)
    for mode in ("w", "a"):
        seen.clear()
        with lamina.open(str(tmp_path / "r.lam"), mode, io="auto") as f:
            f.create_dataset("x", a.shape, a.dtype) if mode == "w" else None
            for k in range(4):
                with f.step():
                    f["x"][...] = a + k
        assert seen == [False, True, True, True], mode
    m = am.AsyncModel()
    m.add_io(1 << 20, 1, 0.5, run=False)
    assert m.history.samples(am.IO_SERIES) and not m.run.samples(am.IO_SERIES)


def test_the_model_s_series_packed_for_the_other_ranks_and_bad_bytes():
    """Rank 0 sends its history's series to the other ranks as packed floats: they come back
    as they were; bytes that are not that are refused (FormatError), never half-read."""
    import struct

    from lamina.errors import FormatError
    from lamina.perf.history import pack_series, unpack_series

    h = History()
    for k in range(5):
        h.add(am.IO_SERIES, (k + 1) << 20, 2, 0.01 * (k + 1))
    h.add(am.COPY_SERIES, 1 << 30, 1, 0.1)
    names = (am.IO_SERIES, am.SYNC_IO_SERIES, am.COPY_SERIES, am.SUBMIT_SERIES)
    raw = pack_series(h, names)
    got = unpack_series(raw, names)
    assert got.series == {k: v for k, v in h.series.items() if v}
    assert not got.added and unpack_series(pack_series(History(), names), names).series == {}
    bad = [
        raw[:-1],  # truncated
        raw + b"\0",  # bytes left over
        struct.pack("<q", -1) + raw[8:],  # a negative count
        struct.pack("<q", 1 << 40) + raw[8:],  # a count past the bytes
        raw[:8] + struct.pack("<d", float("nan")) + raw[16:],  # a sample not usable
        raw[:8] + struct.pack("<d", -1.0) + raw[16:],
        b"",
    ]
    for b in bad:
        with pytest.raises(FormatError):
            unpack_series(b, names)


def test_ls_says_when_it_shows_the_last_decisions_only():
    """A writer of an earlier version kept its last 64 decisions: a longer run is said to have
    written at least that many steps, and which ones the line counts (it said 'wrote 64
    steps' of 80).  A file that holds every decision says how many."""
    from lamina.cli.files import _decisions_line

    many = [
        {"step": k, "mode": "async" if k % 8 else "sync", "probe": False} for k in range(16, 80)
    ]
    line = _decisions_line(many, complete=False)
    assert line.startswith("io='auto' wrote at least 64 steps; of the last 64, steps 16-79: 56")
    assert _decisions_line(many[:5]).startswith("io='auto' wrote 5 steps: 4 in the background")
    assert _decisions_line(many).startswith("io='auto' wrote 64 steps: 56 in the background")
    assert am.DECISIONS_KEPT == 64


def test_the_t_io_error_compares_the_prediction_for_the_way_a_step_was_written():
    """A synchronous step's measured write is compared with t_io_sync, the series of steps
    written while the program waits (it was compared with t_io, the background's, and an
    info line said 'within 57746%' of steps all written synchronously)."""
    from lamina.cli.files import _decisions_line, _decisions_table

    steps = [
        {"step": 0, "mode": "sync", "t_io": 7.5, "t_io_sync": 0.02, "t_io_measured": 0.025},
        {"step": 1, "mode": "async", "t_io": 0.03, "t_io_sync": 9.0, "t_io_measured": 0.025},
        {"step": 2, "mode": "sync", "t_io": 7.5, "t_io_measured": 0.025},  # (an older file)
    ]
    assert "t_io predicted within 20% (median)" in _decisions_line(steps)
    table = _decisions_table(steps)
    assert "7.5" not in table.splitlines()[1] and "20.0 ms" in table.splitlines()[1], table
