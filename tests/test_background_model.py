"""The model behind io='auto': epoch times, the rate fitted to history, the history kept per host.

No timing is asserted: fits are checked on synthetic samples whose answer is
known, decisions on predictions forced by a stub, and real runs only for what
they record (every decision with its predictions and measured outcome).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import lamina
from lamina.cli import main as cli_main
from lamina.errors import FormatError
from lamina.perf import asyncmodel as am
from lamina.perf.command import main as model_cli


@pytest.fixture
def history_path(tmp_path, monkeypatch):
    path = tmp_path / "async-history.json"
    monkeypatch.setenv("LAMINA_ASYNC_HISTORY", str(path))
    return path


# -- the fit -----------------------------------------------------------------------------


def _samples(rate_of, sizes=(1 << 20, 4 << 20, 16 << 20, 64 << 20), ranks=(1, 2, 4)):
    return [(b, r, b / rate_of(b, r)) for b in sizes for r in ranks]


def test_linear_rate_is_recovered():
    fit = am.fit_rate(_samples(lambda b, r: 1e8 + 2.0 * b + 3e7 * r))
    assert fit.kind == "linear" and fit.r2 == pytest.approx(1.0) and fit.samples == 12
    assert fit.coef == pytest.approx((1e8, 2.0, 3e7), rel=1e-6)
    assert fit.rate(8 << 20, 2, 1.0) == pytest.approx(1e8 + 2.0 * (8 << 20) + 6e7, rel=1e-6)


def test_linear_log_rate_is_recovered_and_preferred():
    fit = am.fit_rate(_samples(lambda b, r: 5e7 * math.log(b) + 1e8 * math.log(r) + 1e8))
    assert fit.kind == "linear-log" and fit.r2 == pytest.approx(1.0)
    lin = am.fit_rate(_samples(lambda b, r: 5e7 * math.log(b) + 1e8 * math.log(r) + 1e8))
    assert lin.r2 >= 0.999  # the better of the two is kept


def test_few_samples_use_the_mean_rate_and_none_a_default():
    fit = am.fit_rate([(1 << 20, 1, 0.01), (1 << 20, 1, 0.02)])
    assert fit.kind == "mean" and math.isnan(fit.r2)
    assert fit.coef[0] == pytest.approx(((1 << 20) / 0.01 + (1 << 20) / 0.02) / 2)
    assert am.fit_rate([]).kind == "none"
    assert am.fit_rate([]).rate(1, 1, 1.0) == am.DEFAULT_IO_RATE


def test_noisy_samples_report_their_r2():
    rng = np.random.default_rng(0)
    samples = [(b, r, s * rng.uniform(0.5, 1.5)) for b, r, s in _samples(lambda b, r: 1e9)]
    fit = am.fit_rate(samples)
    assert 0.0 <= fit.r2 < 1.0


# -- the epoch model ------------------------------------------------------------------------


def test_epoch_times_and_the_choice():
    m = am.AsyncModel(am.History(io=[(1 << 30, 1, 1.0)] * 3, copy_rates=[1 << 33]))
    p = m.predict(1 << 30, 1, t_comp=2.0)  # t_io 1 s, t_copy 1/8 s
    assert p.t_io == pytest.approx(1.0) and p.t_copy == pytest.approx(0.125)
    assert p.t_sync == pytest.approx(3.0) and p.t_async == pytest.approx(2.125)
    assert p.mode == "async"
    # I/O longer than the compute: the epoch waits for it (max, not t_io - t_comp)
    p = m.predict(1 << 30, 1, t_comp=0.25)
    assert p.t_async == pytest.approx(1.0 + 0.125) and p.mode == "async"
    # nothing to overlap: the copy makes async slower
    p = m.predict(1 << 30, 1, t_comp=0.0)
    assert p.t_sync == pytest.approx(1.0) and p.mode == "sync"
    # each rank copies its share at once
    assert m.predict(1 << 30, 4, t_comp=1.0).t_copy == pytest.approx(0.125 / 4)


def test_compute_is_a_weighted_average_of_past_phases():
    m = am.AsyncModel()
    assert m.t_comp() == 0.0
    for c in (1.0, 1.0, 4.0):
        m.add_compute(c)
    assert m.t_comp() == pytest.approx((0.25 * 1 + 0.5 * 1 + 1 * 4) / 1.75)
    m.add_compute(float("nan"))  # ignored
    assert len(m.compute) == 3


# -- the history -------------------------------------------------------------------------------


def test_history_round_trip_and_bounds(tmp_path):
    h = am.History(io=[(1000 + i, 2, 0.5) for i in range(am.MAX_SAMPLES + 10)], copy_rates=[1e9])
    path = tmp_path / "h.json"
    am.save_history(h, str(path))
    back = am.load_history(str(path))
    assert len(back.io) == am.MAX_SAMPLES and back.io[-1] == (1000 + am.MAX_SAMPLES + 9, 2, 0.5)
    assert back.copy_rates == [1e9]


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        json.dumps({"version": 99, "host": am.host(), "io": [], "copy_rates": []}),
        json.dumps(
            {"version": am.HISTORY_VERSION, "host": "elsewhere", "io": [], "copy_rates": []}
        ),
        json.dumps(
            {"version": am.HISTORY_VERSION, "host": am.host(), "io": [[1, 1]], "copy_rates": []}
        ),
        json.dumps(
            {"version": am.HISTORY_VERSION, "host": am.host(), "io": [[1, 1, -2]], "copy_rates": []}
        ),
        json.dumps(
            {"version": am.HISTORY_VERSION, "host": am.host(), "io": [], "copy_rates": [True]}
        ),
        json.dumps({"version": am.HISTORY_VERSION, "host": am.host(), "io": {}, "copy_rates": []}),
    ],
)
def test_unusable_history_is_a_format_error_and_ignored(tmp_path, doc):
    with pytest.raises(FormatError):
        am.History.from_json(doc)
    path = tmp_path / "h.json"
    path.write_text(doc)
    assert am.load_history(str(path)).io == []  # a fresh history: measured again


# -- io='auto' ------------------------------------------------------------------------------------


def _forced(modes):
    """Stands in for AsyncModel.predict: the modes to pick, one per step."""
    modes = list(modes)

    def predict(model, nbytes, ranks, t_comp=None):
        mode = modes.pop(0)
        return am.Prediction(nbytes, ranks, 1.0, 0.1, 0.5, 1.5, 1.1, mode, "none", float("nan"))

    return predict


def test_auto_follows_the_model_per_step(tmp_path, history_path, monkeypatch, capsys):
    monkeypatch.setattr(am.AsyncModel, "predict", _forced(["sync", "async", "async", "sync"]))
    path = str(tmp_path / "auto.lam")
    a = np.arange(1 << 16, dtype=np.float64)
    with lamina.open(path, "w", io="auto") as f:
        assert f.io == "auto"
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(4):
            with f.step():
                f["x"][...] = a + k
            if k == 0:  # written before end_step returned: committed already
                assert f.io_stats["steps_background"] == 1
        s = f.io_stats
    assert s["steps_auto_sync"] == 2 and s["steps_auto_async"] == 2
    d = s["decisions"]
    assert [x["mode"] for x in d] == ["sync", "async", "async", "sync"]
    for x in d:
        assert x["nbytes"] == a.nbytes and x["ranks"] == 1
        assert {"t_io", "t_copy", "t_comp", "t_sync", "t_async", "fit", "r2"} <= set(x)
        assert x["t_io_measured"] > 0
    assert all("epoch_measured" in x and "t_comp_measured" in x for x in d[:-1])
    with lamina.open(path) as f:
        assert f.steps == 4
        for k in range(4):
            np.testing.assert_array_equal(f.at(k)["x"][...], a + k)
    # what the run measured is kept for the next runs on this host
    h = am.load_history(str(history_path))
    assert len(h.io) == 4 and all(b == a.nbytes and r == 1 for b, r, _ in h.io)
    # and the decisions are in the file: lamina ls shows them
    assert cli_main(["ls", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = doc["io_decisions"]
    assert [x["mode"] for x in got] == ["sync", "async", "async", "sync"]
    assert all(x["t_io"] == 1.0 and x["t_io_measured"] > 0 for x in got)
    assert cli_main(["ls", path]) == 0
    assert (
        "io='auto' wrote 4 steps: 2 in the background, 2 synchronously" in capsys.readouterr().out
    )


def test_auto_measures_compute_phases_and_decides(tmp_path, history_path):
    path = str(tmp_path / "auto.lam")
    a = np.ones(1 << 18)
    with lamina.open(path, "w", io="auto") as f:
        f.create_dataset("x", a.shape, a.dtype)
        for k in range(5):
            with f.step():
                f["x"][...] = a * k
            sum(range(20000))  # a compute phase
        s = f.io_stats
    assert s["steps_auto_sync"] + s["steps_auto_async"] == 5
    d = s["decisions"]
    assert d[0]["t_comp"] == 0.0  # nothing measured yet
    assert all(x["t_comp_measured"] > 0 for x in d[:-1])
    assert d[-1]["t_comp"] > 0  # the average of the phases before it


def test_async_keeps_a_history_too(tmp_path, history_path):
    with lamina.open(str(tmp_path / "a.lam"), "w", io="async") as f:
        f.create_dataset("x", (1 << 12,), "f8")
        for k in range(3):
            with f.step():
                f["x"][...] = k
    assert len(am.load_history(str(history_path)).io) == 3


# -- lamina model async ----------------------------------------------------------------------------


def test_model_async_command(tmp_path, capsys):
    hist = tmp_path / "h.json"
    am.save_history(am.History(io=_samples(lambda b, r: 1e9), copy_rates=[4e9]), str(hist))
    args = ["async", "--bytes", "64MiB", "--ranks", "2", "--compute", "0,1", "--history", str(hist)]
    assert model_cli(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["samples"] == 12 and doc["copy_rate"] == 4e9
    p0, p1 = doc["predictions"]
    assert p0["t_io"] == pytest.approx((64 << 20) / 1e9, rel=1e-6)
    assert p0["mode"] == "sync" and p1["mode"] == "async"
    assert model_cli(args) == 0
    out = capsys.readouterr().out
    assert "io='auto' picks" in out and "12 background steps" in out
    assert model_cli(["async", "--bytes", "lots"]) == 2
    assert "--bytes" in capsys.readouterr().err
    assert model_cli(["async", "--bytes", "1MiB", "--compute", "nan"]) == 2


def test_decisions_record_round_trip_and_bad_bytes():
    d = [{"step": 0, "mode": "sync", "t_io": float("nan"), "t_io_measured": 0.25}]
    back = am.decode_decisions(am.encode_decisions(d))
    assert (
        back[0]["mode"] == "sync" and back[0]["t_io"] is None and back[0]["epoch_measured"] is None
    )
    for bad in (b"[1]", b'{"fields": ["a"], "decisions": [[1, 2]]}', b"\xff"):
        with pytest.raises(FormatError):
            am.decode_decisions(bad)
