"""strategy="auto": the cost model chooses, and the choice and its predictions are recorded in the file."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import lamina
from lamina.perf.calibrate import host, save_calibration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_util  # noqa: E402

SHAPE = (16, 16, 16)


@pytest.fixture
def calibration(tmp_path, monkeypatch):
    cal = perf_util.calibration(host())
    path = tmp_path / "calibration.json"
    save_calibration(cal, str(path))
    monkeypatch.setenv("LAMINA_CALIBRATION", str(path))
    return cal


def _write(path, **hints):
    rng = np.random.default_rng(1)
    data = {c: rng.random(SHAPE) for c in ("vx", "vy", "vz")}
    with lamina.open(path, "w", durable=False) as f:
        for c in data:
            f.create_dataset(c, SHAPE)
        f.derive("vmag", "magnitude(vx, vy, vz)", strategy="auto", **hints)
        with f.step():
            for c, a in data.items():
                f[c][...] = a
    return data


def test_auto_without_readers_keeps_the_expression(tmp_path, calibration):
    path = str(tmp_path / "a.lam")
    _write(path, readers=0)
    with lamina.open(path) as f:
        d = f.derived["vmag"]
        assert d.strategy == "expression"
        assert d.info["requested"] == "auto" and d.info["chosen"] == "expression"
        assert set(d.info["predicted"]) == {"store", "stats", "expression"}
        assert d.info["hints"] == {"readers": 0}
        assert f["vmag"].blocks(0) == []


def test_auto_with_many_selective_readers_stores(tmp_path, calibration):
    path = str(tmp_path / "b.lam")
    data = _write(path, readers=100, query_fraction=0.01)
    with lamina.open(path) as f:
        d = f.derived["vmag"]
        assert d.strategy == "store"
        totals = {s: p["total_s"] for s, p in d.info["predicted"].items()}
        assert totals["store"] == min(totals.values())
        assert [b.codec for b in f["vmag"].blocks(0)] == ["raw"]
        np.testing.assert_allclose(
            f["vmag"][...], np.sqrt(data["vx"] ** 2 + data["vy"] ** 2 + data["vz"] ** 2), rtol=1e-15
        )


def test_auto_rejects_unknown_hints(tmp_path, calibration):
    with lamina.open(str(tmp_path / "c.lam"), "w", durable=False) as f:
        f.create_dataset("a", SHAPE)
        with pytest.raises(ValueError, match="unknown hints.*readrs"):
            f.derive("b", "a * 2", strategy="auto", readrs=3)
        assert "b" not in f
        f.derive("b", "a * 2", strategy="stats")  # the name is still free


@pytest.mark.parametrize("strategy", ["stats", "store", "expression", "auto"])
def test_hints_are_checked_and_kept_as_numbers_with_any_strategy(tmp_path, calibration, strategy):
    """Out-of-range hints were kept in the file with an explicit strategy (a NaN bandwidth
    as a JSON NaN token in lamina.meta); numpy numbers crashed the JSON encoding."""
    path = str(tmp_path / "k.lam")
    with lamina.open(path, "w", durable=False) as f:
        f.create_dataset("a", SHAPE)
        for hints, said in (
            ({"readers": -5}, "readers must be >= 0"),
            ({"query_fraction": 7.0}, r"query_fraction must be in \[0, 1\]"),
            ({"read_bandwidth": float("nan")}, "read_bandwidth must be finite"),
            ({"readers": 2.5}, "readers must be an integer"),
        ):
            with pytest.raises(ValueError, match=f"derived quantity 'b': {said}"):
                f.derive("b", "a * 2", strategy=strategy, **hints)
            assert "b" not in f
        f.derive("b", "a * 2", strategy, readers=np.int64(2), query_fraction=np.float32(0.5))
        with f.step():
            f["a"][...] = 1.0
    with lamina.open(path) as f:
        hints = f.derived["b"].info["hints"]
        assert hints == {"readers": 2, "query_fraction": 0.5}
        assert type(hints["readers"]) is int and type(hints["query_fraction"]) is float
    with open(f"{path}/lamina.meta", "rb") as meta:
        assert b"NaN" not in meta.read()


def test_auto_follows_the_measured_history(tmp_path, calibration):
    """With the calibration alone, no readers keep the expression; a history in which writing
    the statistics costs nothing and recomputing is slow does not change that (no reader ever
    recomputes), but one reader of a hundredth then picks stats over expression."""
    from lamina.perf.history import History, save_history, signature

    sig = signature("magnitude(vx, vy, vz)", "f8")
    h = History()
    for x2 in (1e2, 1e3, 1e4):
        h.add(f"derive.stats.{sig}", 1e6, x2, 1e-6)  # free
        h.add(f"derive.store.{sig}", 1e6, x2, 10.0)  # very slow
        h.add(f"compute.{sig}", 1e6, x2, 10.0)  # very slow
    save_history(h)  # to $LAMINA_HISTORY, this test's own
    path = str(tmp_path / "h.lam")
    _write(path, readers=1, query_fraction=0.01)
    with lamina.open(path) as f:
        d = f.derived["vmag"]
        assert d.strategy == "stats"
        assert {p["source"] for p in d.info["predicted"].values()} >= {"history"}
