"""Background I/O (``io='async'``): the copy at put, the thread, the budget, errors, zero copy.

In-process tests hold the background thread at a gate (the native engine's
``end_step`` waits for an event), so that steps are in flight exactly when
a test says; the tests under ``mpiexec`` run ``scenarios/background.py``.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

import lamina
from lamina import comm as comm_mod
from lamina.engines import registry
from lamina.errors import (
    BoundsError,
    ConfigError,
    LaminaWarning,
    OverlapError,
    ShapeError,
    StepError,
)
from lamina.geometry import Box

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class Gate:
    """The native engine's end_step under a file's layers, held at an event (and failing on request)."""

    def __init__(self, f, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.eng = f.engine.stack()[-1]
        self.orig = self.eng.end_step
        self.open = threading.Event()
        self.open.set()
        self.fail_at = fail_at
        self.delay = delay
        self.seen: list[int] = []
        self.eng.end_step = self.end_step

    def end_step(self) -> None:
        k = len(self.eng.catalog.steps)
        self.seen.append(k)
        assert self.open.wait(30), "the gate was never opened"
        if self.delay:
            time.sleep(self.delay)
        if k == self.fail_at:
            raise OSError(f"injected failure in step {k}")
        self.orig()

    def hold(self) -> None:
        self.open.clear()


def values(k: int, shape=(4, 6)) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 100.0 * k


def read_all(path: str) -> list[np.ndarray]:
    with lamina.open(path, "r") as f:
        return [f.at(k)["x"][...] for k in range(f.steps)]


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "bg.lam")


# -- choosing the mode ---------------------------------------------------------


def test_io_values(path, monkeypatch):
    monkeypatch.delenv("LAMINA_IO", raising=False)
    with pytest.raises(
        ConfigError, match=r"io='bogus' is not an I/O mode; allowed: \['sync', 'async', 'auto'\]"
    ):
        lamina.open(path, "w", io="bogus")
    with pytest.raises(ConfigError, match=r"io='' is not an I/O mode"):
        lamina.open(path, "w", io="")  # the argument said nothing: not taken as unset
    with lamina.open(path, "w", io="auto") as f:
        assert f.io == "auto" and f.io_stats["mode"] == "auto"
    with lamina.open(path, "w") as f:
        assert f.io == "sync"
    with lamina.open(path, "w", io="async") as f:
        assert f.io == "async"
        assert f.io_stats["mode"] == "async"


def test_io_environment(path, monkeypatch):
    """$LAMINA_IO switches a program unchanged; the argument wins; readers read as they are."""
    monkeypatch.setenv("LAMINA_IO", "async")
    with lamina.open(path, "w", max_inflight_bytes=1 << 20) as f:
        assert f.io == "async"
        assert f.io_stats["max_inflight_bytes"] == 1 << 20
    with lamina.open(path, "w", io="sync", max_inflight_bytes=1 << 20) as f:
        assert f.io == "sync"  # and the background option is accepted and ignored
    with lamina.open(path, "r") as f:
        assert f.io == "async"  # a reader may read ahead (iter_steps(prefetch=True))
    with lamina.open(path, "r", io="sync") as f:
        assert f.io == "sync"
    monkeypatch.setenv("LAMINA_IO", "fast")
    with pytest.raises(ConfigError, match=r"\$LAMINA_IO='fast'.*allowed"):
        lamina.open(path, "w")


def test_io_and_layers_must_agree(path):
    with pytest.raises(ConfigError, match="io='sync' contradicts"):
        lamina.open(path, "w", io="sync", layers=["derived", "background"])
    with lamina.open(path, "w", layers=["background"]) as f:  # the layer by name is async I/O
        assert f.io == "async"
        assert [type(e).__name__ for e in f.engine.stack()] == ["BackgroundLayer", "NativeEngine"]
    with lamina.open(path, "w", io="sync") as f:
        f.wait()  # nothing in flight: a no-op
        assert f.io_stats["steps_background"] == 0


def test_append_in_the_background(path):
    _write_steps(path, 2)
    with lamina.open(path, "a", io="async") as f:
        assert f.steps == 2
        for k in (2, 3):
            with f.step() as s:
                assert s == k
                f["x"][...] = values(k)
                f["y"][...] = np.arange(5) + k
    got = read_all(path)
    assert len(got) == 4
    for k, a in enumerate(got):
        np.testing.assert_array_equal(a, values(k))


@pytest.mark.parametrize("io", ["sync", "async", "auto"])
def test_budget_option_checked(path, io):
    """Checked under io='sync' too, where it is ignored: a program that runs both ways
    (LAMINA_IO) fails alike (sync took any value and async refused it at open)."""
    for bad in (0, -1, 1.5, "8", True, None, np.float64(8)):
        with pytest.raises(ConfigError, match="max_inflight_bytes must be an int > 0"):
            lamina.open(path, "w", io=io, max_inflight_bytes=bad)
    with lamina.open(path, "w", io=io, max_inflight_bytes=np.int64(4096)) as f:
        if io != "sync":
            assert f.io_stats["max_inflight_bytes"] == 4096  # numpy's integers too


@pytest.mark.parametrize("io", ["sync", "async"])
def test_wait_and_flush_after_close_behave_alike(path, io):
    """wait() after close has nothing to wait for, in every mode (async raised); flush()
    after close says it cannot flush (async said it could not wait)."""
    f = lamina.open(path, "w", io=io)
    f.close()
    f.wait()
    with pytest.raises(ValueError, match="cannot flush: file .* is closed"):
        f.flush()


@pytest.mark.parametrize("io", ["sync", "async", "auto"])
def test_a_refused_write_opens_the_step_as_without_the_layer(path, io):
    """A write refused (or empty) outside a step opens the step all the same; its end_step
    commits it, empty, in every mode alike, and the next step is written as it should be
    (under async it was replayed without its begin, failed in the background, and the
    error took the next step with it)."""
    with lamina.open(path, "w", io=io) as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        n = f.create_dataset("n", (4,), "i4")
        with pytest.raises(TypeError, match="unsafe cast"):
            n.write(np.zeros(4))
        f.end_step()
        ds.write(np.zeros((0, 6)), offset=(2, 0))  # empty: nothing stored
        f.end_step()
        with f.step():
            ds[...] = values(2)
        f.wait()
        assert f.steps == 3
    with lamina.open(path, "r") as r:
        assert r.steps == 3
        assert r.at(0)["x"].blocks(0) == [] and r.at(1)["n"].blocks(1) == []
        np.testing.assert_array_equal(r.at(2)["x"][...], values(2))


@pytest.mark.parametrize("io", ["sync", "auto"])
def test_a_large_block_lent_is_read_only_until_its_step_ends(path, io, monkeypatch):
    """A block above the staging size written with ``copy=False`` is kept by reference (written
    at once while its statistics and checksum are taken on a thread): changing it before the
    step ends raises numpy's error instead of leaving a block whose checksum is not that of
    its bytes; it is writeable again once the step ends (as under io='async')."""
    monkeypatch.setenv("LAMINA_HISTORY", os.path.join(os.path.dirname(path), "history.json"))
    big = np.zeros((256, 1024))  # 2 MiB
    with lamina.open(path, "w", io=io) as f:
        ds = f.create_dataset("x", big.shape, "f8")
        with f.step():
            ds.write(big, copy=False)
            assert not big.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                big[0, 0] = -1
        assert big.flags.writeable
        big[0, 0] = 7.0  # after the step: the caller's again
        stacked = np.ones((2, 128, 1024))
        with f.step():
            ds.write_blocks(stacked, [(0, 0), (128, 0)], copy=False)
            assert not stacked.flags.writeable
        f.wait()  # (io='auto' may write this step in the background: written once waited for)
        assert stacked.flags.writeable
    with lamina.open(path, "r") as r:
        assert float(r.at(0)["x"][0, 0]) == 0.0 and float(r.at(1)["x"][0, 0]) == 1.0


@pytest.mark.parametrize("io", ["sync", "async"])
def test_an_array_and_views_of_it_lent_in_one_step_are_writeable_afterwards(path, io):
    """An array and views of it written with copy=False in one step, in either order, large
    and small: each is read-only while the step is in flight and all are writeable again
    after it (numpy refuses to thaw a view before its base: the views wait for their base)."""
    with lamina.open(path, "w", io=io) as f:
        a = f.create_dataset("a", (64, 4096), "f8")
        b = f.create_dataset("b", (4096,), "f8")
        c = f.create_dataset("c", (16, 4096), "f8")
        base = np.ones((64, 4096))
        row, part = base[0], base[:16]  # views: 32 KiB (lent), 512 KiB (held)
        with f.step():
            c.write(part, offset=(0, 0), copy=False)
            a.write(base, offset=(0, 0), copy=False)
            b.write(row, offset=(0,), copy=False)
            assert not base.flags.writeable
        f.wait()
        assert base.flags.writeable and row.flags.writeable and part.flags.writeable
        base[0, 0] = 5.0
    with lamina.open(path, "r") as r:
        assert float(r["a"][0, 0]) == 1.0 and float(r["b"][0]) == 1.0


def test_write_blocks_copies_into_the_buffers_of_written_steps(path, monkeypatch):
    """A step of write_blocks takes its copy's buffer with its share of the budget: a step
    over half the budget still reuses the buffer of the step before (the pool, trimmed for
    the budget, let go of it first)."""
    from lamina.layers.background import step as st

    warm = []
    take = st.Pool.take
    monkeypatch.setattr(st.Pool, "take", lambda self, n: (r := take(self, n), warm.append(r[1]))[0])
    mib = 1 << 20
    with lamina.open(path, "w", io="async", max_inflight_bytes=3 * mib // 2) as f:
        ds = f.create_dataset("x", (16, 8192), "f8")
        a = np.ones((16, 1, 8192))  # 1 MiB
        corners = np.stack([np.arange(16), np.zeros(16, dtype=np.int64)], axis=1)
        for _ in range(4):
            with f.step():
                ds.write_blocks(a, corners)
            f.wait()
    assert warm == [False, True, True, True], warm


def test_auto_writes_directly_steps_over_the_budget(path, monkeypatch):
    """io='auto' with steps larger than the budget: each is written directly (a copy of it would
    be refused), none fails, and every decision after the first says sync."""
    monkeypatch.setenv("LAMINA_HISTORY", os.path.join(os.path.dirname(path), "history.json"))
    with lamina.open(path, "w", io="auto", max_inflight_bytes=1000) as f:
        ds = f.create_dataset("x", (64, 64), "f8")  # 32 KiB a step
        for k in range(5):
            with f.step():
                ds[...] = k
        modes = [d["mode"] for d in f.io_stats["decisions"]]
    assert modes == ["sync"] * 5, modes
    with lamina.open(path, "r") as r:
        assert r.steps == 5 and float(r.at(4)["x"][0, 0]) == 4.0


def test_pool_stays_within_the_budget_with_what_is_in_flight(path):
    """Buffers kept for copies of one size give way to copies of another: the pool and the
    copies in flight together never hold more than the budget."""
    mib = 1 << 20
    with lamina.open(path, "w", io="async", max_inflight_bytes=8 * mib) as f:
        Gate(f, delay=0.02)
        ds = f.create_dataset("x", (4096, 1024), "f8")
        layer = f.engine
        peak = 0
        for rows in (128, 96, 64, 48):  # two blocks of 1 MiB a step, then smaller ones
            for k in range(6):
                with f.step():
                    ds[0:rows] = k
                    ds[rows : 2 * rows] = k
                    peak = max(peak, layer.stats.inflight_bytes + layer._pool.nbytes)
            f.wait()
    assert 0 < peak <= 8 * mib, peak


def _waits_in_a_put(thread: threading.Thread) -> bool:
    """Whether *thread* waits for the budget in a put (the layer's _reserve)."""
    frame = sys._current_frames().get(thread.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names[:1] == ["wait"] and "_reserve" in names


def test_buffers_made_ahead_count_in_the_budget_while_they_are_made(path, monkeypatch):
    """The buffers made for the next step's copies while the step before is written hold
    their share of the budget while they are made: the copies in flight, the pool and the
    buffers being made never exceed it together (a put of the next step that would exceed
    it waits until they are in the pool), and the next step's copies go into them."""
    from lamina.layers.background import layer as layer_mod
    from lamina.layers.background import step as st

    mib = 1 << 20
    budget = 4 * mib
    main = threading.current_thread()
    counted: list[int] = []  # in flight + pool + the buffers just made, before they are given
    puts_done = threading.Event()
    real_touched = layer_mod.touched

    def slow_touched(sizes):
        # made slowly: until the program has made its puts, or waits in one
        deadline = time.monotonic() + 20
        while not (puts_done.is_set() or _waits_in_a_put(main)):
            assert time.monotonic() < deadline, "the program neither put nor waited"
            time.sleep(0.002)
        out = real_touched(sizes)
        with layer._cond:
            counted.append(
                layer.stats.inflight_bytes + layer._pool.nbytes + sum(r.nbytes for r in out)
            )
        return out

    warm = []
    take = st.Pool.take
    monkeypatch.setattr(st.Pool, "take", lambda self, n: (r := take(self, n), warm.append(r[1]))[0])
    monkeypatch.setattr(layer_mod, "touched", slow_touched)
    with lamina.open(path, "w", io="async", max_inflight_bytes=budget) as f:
        gate = Gate(f)
        ds = f.create_dataset("x", (256, 1024), "f8")  # two blocks of 1 MiB a step
        layer = f.engine
        layer._spare_core = True  # buffers made ahead whatever the cores of this machine
        gate.hold()
        with f.step():  # held at the gate: in flight while the next step is copied
            ds[0:128] = 0.0
            ds[128:256] = 0.0
        # its end_step had the buffers of the next step's copies made on their own thread
        with f.step():
            ds[0:128] = 1.0
            ds[128:256] = 1.0
            puts_done.set()
        gate.open.set()
        f.wait()
        assert layer._ahead is not None
        layer._ahead.result(timeout=30)
        assert getattr(layer, "_making", 0) == 0  # none left counted as being made
    assert len(counted) == 1 and counted[0] <= budget, (counted, budget)
    assert warm == [False, False, True, True], warm  # the second step copied into them
    got = read_all(path)
    assert [float(a[0, 0]) for a in got] == [0.0, 1.0]


def test_below_thread_multiple_writes_synchronously(path, monkeypatch):
    monkeypatch.setattr(comm_mod, "thread_level", lambda: 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = lamina.open(path, "w", io="async")
    assert any(
        issubclass(x.category, LaminaWarning) and "MPI_THREAD_MULTIPLE" in str(x.message) for x in w
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        lamina.open(path.replace(".lam", "-auto.lam"), "w", io="auto").close()
    assert any("io='auto' needs MPI_THREAD_MULTIPLE" in str(x.message) for x in w)  # not 'async'
    with f:
        assert f.io == "sync"
        ds = f.create_dataset("x", (4, 6), "f8")
        with f.step():
            ds[...] = values(0)
    assert len(read_all(path)) == 1
    # a reader so opened streams without read-ahead, as its open warned: the program runs on
    # (iter_steps(prefetch=True) told it to open the file with io='async', which it had)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = lamina.open(path, "r", io="async")
    assert any("read without read-ahead" in str(x.message) for x in w)
    with r:
        seen = [float(v["x"][0, 0]) for v in r.iter_steps(prefetch=True, timeout=0.1)]
        assert seen == [0.0] and r["x"].prefetch(step=0) is False


# -- the transaction -----------------------------------------------------------


def test_round_trip_and_stats(path):
    with lamina.open(path, "w", io="async") as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        for k in range(6):
            with f.step() as s:
                assert s == k
                ds[...] = values(k)
                f.attrs["k"] = k
            assert f.steps == k + 1  # ended: committed or in flight
        f.wait()
        stats = f.io_stats
    assert stats["steps_background"] == 6
    assert stats["inflight_bytes"] == 0
    got = read_all(path)
    assert len(got) == 6
    for k, a in enumerate(got):
        np.testing.assert_array_equal(a, values(k))
    with lamina.open(path, "r") as f:
        assert f.attrs["k"] == 5


def test_buffer_reusable_after_put(path):
    """The copy is made at put: the caller may change its array before end_step returns."""
    with lamina.open(path, "w", io="async") as f:
        gate = Gate(f)
        ds = f.create_dataset("x", (4, 6), "f8")
        buf = values(0)
        gate.hold()
        for k in range(3):
            with f.step():
                buf[...] = values(k)
                ds[...] = buf
            buf[...] = -1  # the step is in flight (the gate is closed): its copy must not change
        assert f.io_stats["inflight_bytes"] == 3 * buf.nbytes
        gate.open.set()
    for k, a in enumerate(read_all(path)):
        np.testing.assert_array_equal(a, values(k))


def test_put_errors_at_put(path):
    """Checks happen at put, as without the layer: shape, overlap, unknown names."""
    with lamina.open(path, "w", io="async") as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        f.begin_step()
        ds[0:2, :] = values(0)[0:2]
        with pytest.raises(OverlapError, match="overlaps"):
            ds[1:3, :] = values(0)[1:3]
        with pytest.raises(IndexError, match="out of bounds"):
            ds.write(np.zeros((5, 6)))
        with pytest.raises(ShapeError, match=r"shape \(2, 6\)"):
            f.engine.put("x", Box((3, 0), (4, 6)), np.zeros((2, 6)))
        with pytest.raises(TypeError, match="unsafe cast"):
            f.engine.put("x", Box((3, 0), (4, 6)), np.full((1, 6), "a"))
        with pytest.raises(KeyError, match="no dataset"):
            f.engine.put("nope", Box((0,), (1,)), np.zeros(1))
        ds[2:4, :] = values(0)[2:4]  # the refused boxes may be written
        f.end_step()
    np.testing.assert_array_equal(read_all(path)[0], values(0))


def test_implicit_step_discard_and_close(path):
    """A put opens a step; a failed `with f.step()` discards it; close commits a step left open."""
    with lamina.open(path, "w", io="async") as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        ds[...] = values(0)  # implicit step 0
        f.end_step()
        with pytest.raises(RuntimeError, match="oops"), f.step():
            ds[...] = values(99)
            raise RuntimeError("oops")
        assert not f.engine.in_step
        with pytest.raises(StepError, match="without begin_step"):
            f.end_step()
        ds[...] = values(1)  # left open: close commits it
    got = read_all(path)
    assert len(got) == 2
    np.testing.assert_array_equal(got[1], values(1))


@pytest.mark.parametrize("io, in_flight", [("sync", False), ("async", False), ("async", True)])
def test_attributes_set_in_a_step_that_raises_are_kept_as_without_the_layer(path, io, in_flight):
    """A step that raises drops its data, not the attribute changes made in it: the engine's
    discard keeps them (committed with the next step or close), so io='async' does too (it
    dropped them with the step's writes)."""
    with lamina.open(path, "w", io=io) as f:
        x = f.create_dataset("x", (4, 6), "f8")
        gate = Gate(f)
        with f.step():
            x[...] = values(0)
            x.attrs["time"] = 0.0
        f.wait()
        if in_flight:  # a step ended before it is still being written
            gate.hold()
            with f.step():
                x[...] = values(1)
        try:
            with pytest.raises(FloatingPointError), f.step():
                x[...] = values(2)
                x.attrs["time"] = 2.0
                x.attrs["converged"] = False
                del f["x"].attrs["time"]
                x.attrs["time"] = 2.5
                raise FloatingPointError("diverged")
            assert dict(x.attrs) == {"time": 2.5, "converged": False}
        finally:
            gate.open.set()
    with lamina.open(path) as r:
        assert r.steps == 1 + in_flight
        assert dict(r["x"].attrs) == {"time": 2.5, "converged": False}


def _second_step_held(f):
    """Step 0 of dataset "x" committed, step 1 held at the gate for 0.3 s from now: "x" and
    the gate (a call that waited for step 1 returns with ``gate.open`` set; a clock read after
    this returns may start late on a loaded machine, and then measures less than 0.3 s)."""
    gate = Gate(f)
    ds = f.create_dataset("x", (4, 6), "f8")
    with f.step():
        ds[...] = values(0)
    f.wait()
    gate.hold()
    with f.step():
        ds[...] = values(1)
    threading.Timer(0.3, gate.open.set).start()
    return ds, gate


def test_read_of_a_step_in_flight_waits(path):
    with lamina.open(path, "w", io="async") as f:
        ds, gate = _second_step_held(f)
        np.testing.assert_array_equal(ds[...], values(1))  # the last step ended: waits for it
        assert gate.open.is_set()  # returned only once step 1 was let go
        np.testing.assert_array_equal(f.at(-2)["x"][...], values(0))
        np.testing.assert_array_equal(f.at(0)["x"][...], values(0))
        with pytest.raises(StepError):
            f.at(2)


def test_metadata_waits_for_steps_in_flight(path):
    """define is collective on the inner engine: it comes after the steps in flight."""
    with lamina.open(path, "w", io="async") as f:
        gate = Gate(f, delay=0.05)
        ds = f.create_dataset("x", (4, 6), "f8")
        for k in range(3):
            with f.step():
                ds[...] = values(k)
        y = f.create_dataset("y", (3,), "i4")
        assert gate.seen == [0, 1, 2]
        with f.step():
            ds[...] = values(3)
            y[...] = [1, 2, 3]
    assert len(read_all(path)) == 4


# -- the budget ------------------------------------------------------------------


def test_budget_makes_end_step_wait(path):
    block = values(0).nbytes
    with lamina.open(path, "w", io="async", max_inflight_bytes=2 * block) as f:
        Gate(f, delay=0.05)
        ds = f.create_dataset("x", (4, 6), "f8")
        for k in range(6):
            with f.step():
                ds[...] = values(k)
            assert f.io_stats["inflight_bytes"] <= 2 * block
        stats = f.io_stats
    assert stats["waits"] >= 1
    assert stats["wait_seconds"] > 0
    assert stats["peak_inflight_bytes"] == 2 * block
    assert len(read_all(path)) == 6


def test_lent_arrays_wait_for_the_budget_but_are_never_refused(path):
    """copy=False arrays count in the budget's waits: a program lending a new array every step
    cannot run ahead of its writes without bound (nothing held it: under the in situ
    transport's queue_limit its memory grew with the steps).  One larger than the budget is
    still taken (once nothing else is in flight)."""
    block = values(0).nbytes
    with lamina.open(path, "w", io="async", max_inflight_bytes=2 * block) as f:
        Gate(f, delay=0.05)
        ds = f.create_dataset("x", (4, 6), "f8")
        big = f.create_dataset("big", (8, 6), "f8")
        for k in range(6):
            with f.step():
                ds.write(values(k), copy=False)
            assert f.io_stats["inflight_bytes"] <= 2 * block
        with f.step():
            big.write(values(6, (8, 6)), copy=False)  # twice the budget alone
        f.wait()
        stats = f.io_stats
    assert stats["waits"] >= 1 and stats["peak_inflight_bytes"] == 2 * block
    assert stats["inflight_bytes"] == 0
    assert len(read_all(path)) == 7


def test_budget_smaller_than_a_block(path):
    with lamina.open(path, "w", io="async", max_inflight_bytes=100) as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        with pytest.raises(ConfigError, match=r"192 bytes does not fit max_inflight_bytes=100"):
            ds[...] = values(0)
    with lamina.open(path, "w", io="async", max_inflight_bytes=150) as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        ds[0:2] = values(0)[0:2]  # 96 bytes
        with pytest.raises(ConfigError, match=r"96 bytes this step already holds.*at least 192"):
            ds[2:4] = values(0)[2:4]
        ds[2:3] = values(0)[2:3]  # 48 more fit; the refused box was not taken
        f.end_step()
    assert len(read_all(path)) == 1


# -- zero copy ---------------------------------------------------------------------


def test_zero_copy_freezes_until_on_disk(path):
    with lamina.open(path, "w", io="async") as f:
        gate = Gate(f)
        ds = f.create_dataset("x", (4, 6), "f8")
        a = values(0)
        ro = values(1)
        ro.flags.writeable = False
        gate.hold()
        with f.step():
            ds.write(a, copy=False)
        with f.step():
            ds.write(ro, copy=False)
        # kept by reference (frozen, below), counted in the budget's waits
        assert f.io_stats["inflight_bytes"] == 2 * a.nbytes
        with pytest.raises(ValueError, match="read-only"):
            a[0, 0] = -1
        gate.open.set()
        f.wait()
        assert a.flags.writeable  # restored, as it was
        assert not ro.flags.writeable  # it was read-only before
        a[0, 0] = -1
    got = read_all(path)
    np.testing.assert_array_equal(got[0], values(0))
    np.testing.assert_array_equal(got[1], values(1))


def test_zero_copy_same_array_in_two_steps(path):
    """An array in two steps in flight thaws when the later one is written, not before."""
    with lamina.open(path, "w", io="async") as f:
        gate = Gate(f)
        ds = f.create_dataset("x", (4, 6), "f8")
        a = values(7)
        gate.hold()
        for _ in range(2):
            with f.step():
                ds.write(a, copy=False)
        assert not a.flags.writeable
        gate.open.set()
        f.wait()
        assert a.flags.writeable
    assert [float(x[0, 0]) for x in read_all(path)] == [700.0, 700.0]


def test_zero_copy_of_a_view_then_its_base_in_the_next_step(path):
    """A view lent in one step and its base in the next: the view's step is done while the
    base is still held read-only, and numpy keeps a view of a read-only base read-only; it
    thaws with the base (it stayed read-only for good)."""
    with lamina.open(path, "w", io="async") as f:
        gate = Gate(f)
        ds = f.create_dataset("x", (4, 6), "f8")
        base = values(3)
        top = base[:2]
        gate.hold()
        with f.step():
            ds.write(top, copy=False)
        with f.step():
            ds.write(base, copy=False)
        gate.open.set()
        f.wait()
        assert base.flags.writeable and top.flags.writeable
        top[0, 0] = 1.0  # the program's again
        # a view whose base the program itself made read-only stays so, and is not kept
        own = values(4)
        view = own[:2]
        with f.step():
            ds.write(view, copy=False)
        own.flags.writeable = False
        f.wait()
        assert not view.flags.writeable
        assert not f.engine.stack()[0]._frozen.pending
    assert [float(x[0, 0]) for x in read_all(path)] == [300.0, 300.0, 400.0]


def test_zero_copy_gives_back_the_flag_the_array_had_at_the_put(path):
    """An array lent with copy=False gets back the flag it had at the put once its step is
    done: the layer cannot tell the program's own read-only setting, made while the step is
    in flight, from its own (docs/background.md, "Zero copy")."""
    with lamina.open(path, "w", io="async") as f:
        gate = Gate(f)
        ds = f.create_dataset("x", (4, 6), "f8")
        a = values(0)
        gate.hold()
        with f.step():
            ds.write(a, copy=False)
        a.flags.writeable = False  # the program's own, while the layer holds it read-only
        gate.open.set()
        f.wait()
        assert a.flags.writeable  # writeable at the put: writeable again
        a.flags.writeable = False  # set once the step is done: the program's for good
        with f.step():
            ds.write(a, copy=False)
        f.wait()
        assert not a.flags.writeable
    assert [float(x[0, 0]) for x in read_all(path)] == [0.0, 0.0]


def test_zero_copy_of_another_dtype_is_copied(path):
    with lamina.open(path, "w", io="async") as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        a = values(0).astype(np.float32)
        with f.step():
            ds.write(a, copy=False)  # cast: a copy is made, the array stays writeable
            assert a.flags.writeable
    np.testing.assert_array_equal(read_all(path)[0], values(0))


# -- errors --------------------------------------------------------------------------


def _three_then_fail(path, fail_at=2, more=2):
    """Steps 0..fail_at+more ended; step fail_at fails in the background, the later ones queue."""
    f = lamina.open(path, "w", io="async")
    gate = Gate(f, fail_at=fail_at)
    ds = f.create_dataset("x", (4, 6), "f8")
    for k in range(fail_at):
        with f.step():
            ds[...] = values(k)
    f.wait()
    gate.hold()
    for k in range(fail_at, fail_at + more + 1):
        with f.step():
            ds[...] = values(k)
    gate.open.set()
    return f, ds, gate


def test_failed_step_raised_at_wait(path):
    f, ds, gate = _three_then_fail(path)
    with pytest.raises(OSError, match=r"background step 2 .*failed on rank 0") as e:
        f.wait()
    assert "step(s) [3, 4] queued after it were cancelled" in str(e.value)
    assert "injected failure in step 2" in str(e.value)
    stats = f.io_stats
    assert (stats["steps_failed"], stats["steps_cancelled"]) == (1, 2)
    assert stats["inflight_bytes"] == 0
    # the file goes on from the last committed step
    gate.fail_at = None
    assert f.steps == 2
    with f.step() as k:
        assert k == 2
        ds[...] = values(20)
    f.close()
    got = read_all(path)
    assert len(got) == 3
    np.testing.assert_array_equal(got[1], values(1))
    np.testing.assert_array_equal(got[2], values(20))


def test_failed_step_raised_at_end_step(path):
    f, ds, _ = _three_then_fail(path, more=0)
    deadline = time.monotonic() + 10
    while f.io_stats["steps_failed"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    f.begin_step()
    ds[...] = values(3)
    with pytest.raises(OSError, match="background step 2"):
        f.end_step()
    assert not f.engine.in_step
    assert f.steps == 2
    f.close()
    assert len(read_all(path)) == 2


def test_the_step_whose_end_step_raises_a_failure_is_cancelled_too(path):
    """The step whose end_step raises a background failure is dropped: the error names it
    among the cancelled steps, and io_stats counts it."""
    f, ds, gate = _three_then_fail(path)  # step 2 fails, steps 3 and 4 queued behind it
    deadline = time.monotonic() + 10
    while f.io_stats["steps_failed"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    f.begin_step()
    ds[...] = values(5)
    with pytest.raises(OSError, match=r"background step 2 .*failed on rank 0") as e:
        f.end_step()
    assert "step(s) [3, 4, 5] queued after it were cancelled" in str(e.value), e.value
    assert f.io_stats["steps_cancelled"] == 3 and f.io_stats["steps_failed"] == 1
    assert f.steps == 2
    gate.fail_at = None
    with f.step() as k:
        assert k == 2
        ds[...] = values(6)
    f.close()
    assert [float(a[0, 0]) for a in read_all(path)] == [0.0, 100.0, 600.0]


def _held_at_exit(f, monkeypatch, n=4):
    """Steps 0..n-1 ended, step 0 held at its commit, the rest queued; the exit hook sees this
    file alone. Returns the gate."""
    from lamina.layers.background import layer as layer_mod

    gate = Gate(f)
    ds = f.create_dataset("x", (4, 6), "f8")
    gate.hold()
    for k in range(n):
        with f.step():
            ds[...] = values(k)
    deadline = time.monotonic() + 10
    while not gate.seen and time.monotonic() < deadline:  # step 0 at its commit
        time.sleep(0.01)
    assert gate.seen == [0]
    monkeypatch.setattr(layer_mod, "_LIVE", weakref.WeakSet([f.engine]))
    return gate


def _exit_hook_warnings() -> list[str]:
    from lamina.layers.background import layer as layer_mod

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        layer_mod._at_exit()
    return [str(w.message) for w in got if issubclass(w.category, LaminaWarning)]


def test_the_exit_hook_says_what_it_is_still_writing(path, monkeypatch):
    """A file never closed, its steps in flight at exit: the exit hook writes them, saying so
    (the process seemed to hang with nothing said)."""
    f = lamina.open(path, "w", io="async")
    gate = _held_at_exit(f, monkeypatch)
    bg = f.engine
    real = bg._drain

    def drain():
        gate.open.set()
        real()

    monkeypatch.setattr(bg, "_drain", drain)
    try:
        said = _exit_hook_warnings()
    finally:
        gate.open.set()
    assert len(said) == 1, said
    assert "at exit: the file was not closed; writing steps 0-3 still in flight" in said[0], said
    f.close()
    assert len(read_all(path)) == 4


def test_an_interrupt_of_the_exit_hook_says_which_steps_were_not_written(path, monkeypatch):
    """Ctrl-C while the exit hook writes the steps of a file never closed: it said nothing but
    'Exception ignored in threading' (and the process exited 0). It now says which steps
    were not written; the step being committed is finished."""
    f = lamina.open(path, "w", io="async")
    gate = _held_at_exit(f, monkeypatch)
    bg = f.engine

    def drain():
        raise KeyboardInterrupt  # while the hook waits for the steps

    real_cancel = bg._cancel_queued

    def cancel(failure):
        real_cancel(failure)
        gate.open.set()  # step 0 commits once the others are cancelled

    monkeypatch.setattr(bg, "_drain", drain)
    monkeypatch.setattr(bg, "_cancel_queued", cancel)
    try:
        said = _exit_hook_warnings()
    finally:
        gate.open.set()
    assert len(said) == 2, said
    assert "writing steps 0-3 still in flight" in said[0], said
    assert (
        f"background I/O of {path!r} interrupted at exit: steps 1-3 were not written; step 0, "
        "being committed, is finished first" in said[1]
    ), said
    assert f.io_stats["steps_cancelled"] == 3 and f.io_stats["steps_background"] == 1
    monkeypatch.undo()
    f.close()
    assert len(read_all(path)) == 1


def test_failed_step_raised_at_close(path):
    f, _, _ = _three_then_fail(path, more=1)
    with pytest.raises(OSError, match=r"background step 2.*\[3\]"):
        f.close()
    assert f.engine.closed
    got = read_all(path)
    assert len(got) == 2
    with lamina.open(path, "r") as r:
        assert r.engine.writer_closed


class SolverDiverged(Exception):
    pass


def test_a_program_s_error_out_of_the_file_is_not_replaced_by_a_background_failure(path):
    """On one rank a background failure met by the close after the program's own error
    replaced that error (SolverDiverged only as its __context__); on more ranks the
    program's error propagated and the failure was said in a LaminaWarning. Now on every
    rank count: the program's error, unchanged, and the failure in a LaminaWarning."""
    with pytest.warns(LaminaWarning, match=r"after SolverDiverged.*background step 2 .*failed"):
        with pytest.raises(SolverDiverged, match="residual is NaN") as e:
            with lamina.open(path, "w", io="async") as f:
                gate = Gate(f, fail_at=2)
                ds = f.create_dataset("x", (4, 6), "f8")
                for k in range(3):
                    with f.step():
                        ds[...] = values(k)
                f.engine._drain()  # step 2 failed in the background; nothing raised it yet
                assert f.io_stats["steps_failed"] == 1
                with f.step():
                    ds[...] = values(3)
                    raise SolverDiverged("residual is NaN")
    assert type(e.value) is SolverDiverged and e.value.__context__ is None
    assert gate.seen == [0, 1, 2] and f.engine.closed
    assert [float(a[0, 0]) for a in read_all(path)] == [0.0, 100.0]


def test_read_of_a_failed_step(path):
    f, ds, _ = _three_then_fail(path, more=0)
    with pytest.raises(StepError, match="step 2 .* was not committed"):
        ds.read(step=2)
    with pytest.raises(OSError, match="background step 2"):
        f.close()


def _interrupt_once(monkeypatch, when=lambda *a, **k: True):
    """The next agreement of the program's thread (for which *when* holds) raises
    KeyboardInterrupt, as a Ctrl-C while it waits for the other ranks."""
    real, armed = comm_mod.agree, [True]

    def agree(*args, **kw):
        if armed[0] and threading.current_thread() is threading.main_thread() and when(*args):
            armed[0] = False
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(comm_mod, "agree", agree)
    return armed


def test_an_interrupt_in_end_step_keeps_the_steps_ended_before(path, monkeypatch):
    """Ctrl-C while end_step waits for the other ranks: the steps every rank ended before
    are still written (by close); only the step being ended is dropped. They were cancelled
    as if a background step had failed."""
    f = lamina.open(path, "w", io="async")
    gate = Gate(f)
    ds = f.create_dataset("x", (4, 6), "f8")
    gate.hold()  # steps 0-3 in flight: step 0 at its commit, 1-3 queued
    for k in range(4):
        with f.step():
            ds[...] = values(k)
    f.begin_step()
    ds[...] = values(4)
    _interrupt_once(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        f.end_step()
    assert f.io_stats["steps_cancelled"] == 0
    assert not f.engine.in_step and f.steps == 4
    gate.open.set()
    f.close()
    assert f.io_stats["steps_background"] == 4
    assert [float(a[0, 0]) for a in read_all(path)] == [0.0, 100.0, 200.0, 300.0]


def test_steps_queued_wait_for_room_beyond_the_queues_length(path):
    """A program of small steps faster than their writes queued every one (a thousand steps
    took half a minute to write after a Ctrl-C): end_step now waits for room beyond
    QUEUE_STEPS, counted as a wait for the budget is, and every step is written."""
    from lamina.layers.background.step import QUEUE_STEPS

    f = lamina.open(path, "w", io="async")
    Gate(f, delay=0.003)  # each step's commit 3 ms: the program runs ahead
    ds = f.create_dataset("x", (4, 6), "f8")
    n = 3 * QUEUE_STEPS
    longest = 0
    for k in range(n):
        with f.step():
            ds[...] = values(k)
        longest = max(longest, len(f.engine._queue))
    waits = f.io_stats["waits"]
    f.close()
    assert longest == QUEUE_STEPS and waits > 0, (longest, waits)
    assert [float(a[0, 0]) for a in read_all(path)] == [100.0 * k for k in range(n)]


def test_an_interrupt_while_end_step_waits_for_room_drops_that_step_alone(path):
    """Ctrl-C while end_step waited for room in the queue, once the step was numbered: the
    writer counted a step more than the file held (a read of step k gave step k+1's values),
    the array lent to it stayed read-only for good and its bytes in the budget.  The wait is
    now before end_step's meeting: as an interrupt there, only that step is dropped."""
    from lamina.layers.background.step import QUEUE_STEPS

    f = lamina.open(path, "w", io="async")
    gate = Gate(f)
    ds = f.create_dataset("x", (4, 6), "f8")
    gate.hold()  # step 0 at its commit, the next QUEUE_STEPS queued
    n = QUEUE_STEPS + 1
    for k in range(n):
        with f.step():
            ds[...] = values(k)
    eng = f.engine
    inflight = f.io_stats["inflight_bytes"]
    real = eng._cond.wait

    def wait(timeout=None):
        if threading.current_thread() is threading.main_thread():
            eng._cond.wait = real
            raise KeyboardInterrupt
        return real(timeout)

    eng._cond.wait = wait
    lent = values(n)
    f.begin_step()
    ds.write(lent, copy=False)
    with pytest.raises(KeyboardInterrupt):
        f.end_step()
    assert f.steps == n and not eng.in_step
    assert lent.flags.writeable and f.io_stats["inflight_bytes"] == inflight
    gate.open.set()
    for k in range(n + 1, n + 4):  # the program goes on (a notebook's interrupted cell)
        with f.step():
            ds[...] = values(k)
    assert f.steps == n + 3
    assert float(ds.read(step=n)[0, 0]) == 100.0 * (n + 1)
    f.close()
    want = [100.0 * k for k in range(n)] + [100.0 * k for k in range(n + 1, n + 4)]
    assert [float(a[0, 0]) for a in read_all(path)] == want


def test_a_hold_of_the_lock_an_interrupt_left_does_not_stop_the_close(path):
    """An interrupt raised as the program's thread entered ``with`` on the layer's condition
    (in Condition.__enter__, once it took the lock) leaves the lock held, no ``with`` to let go
    of it: close then joined the background thread, which waited for that lock for ever."""
    f = lamina.open(path, "w", io="async")
    ds = f.create_dataset("x", (4, 6), "f8")
    for k in range(2):
        with f.step():
            ds[...] = values(k)
    done = threading.Event()

    def closer() -> None:  # (on a thread of its own: the test ends where the close hangs)
        f.engine._cond.acquire()  # the hold the interrupt left, never let go of
        f.close()
        done.set()

    threading.Thread(target=closer, daemon=True).start()
    assert done.wait(30), "close waited for the background thread for ever"
    assert [float(a[0, 0]) for a in read_all(path)] == [0.0, 100.0]


def test_an_interrupt_in_wait_keeps_the_steps_ended(path, monkeypatch):
    """Ctrl-C while wait() waits for the steps in flight: they are still written."""
    f = lamina.open(path, "w", io="async")
    gate = Gate(f)
    ds = f.create_dataset("x", (4, 6), "f8")
    gate.hold()
    for k in range(4):
        with f.step():
            ds[...] = values(k)
    bg = f.engine
    real, calls = bg._drain, [0]

    def drain():
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt  # in the wait for the steps in flight
        gate.open.set()
        real()

    monkeypatch.setattr(bg, "_drain", drain)
    with pytest.raises(KeyboardInterrupt):
        f.wait()
    assert f.io_stats["steps_cancelled"] == 0
    gate.open.set()
    f.close()
    assert [float(a[0, 0]) for a in read_all(path)] == [0.0, 100.0, 200.0, 300.0]


def test_a_failure_taken_when_an_interrupt_came_is_raised_at_the_next_call(path, monkeypatch):
    """A background failure this rank was reporting when Ctrl-C reached end_step is not
    lost: the next collective call raises it (and the file goes on from there)."""
    f, ds, gate = _three_then_fail(path, more=0)  # step 2 fails
    deadline = time.monotonic() + 10
    while f.io_stats["steps_failed"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    f.begin_step()
    ds[...] = values(3)
    _interrupt_once(monkeypatch, lambda comm, exc, *a: exc is not None)
    with pytest.raises(KeyboardInterrupt):
        f.end_step()
    with pytest.raises(OSError, match=r"background step 2 .*failed on rank 0"):
        f.wait()
    gate.fail_at = None
    with f.step() as k:
        assert k == 2
        ds[...] = values(5)
    f.close()
    assert [float(a[0, 0]) for a in read_all(path)] == [0.0, 100.0, 500.0]


def test_a_step_whose_commit_met_a_rank_leaving_is_not_called_a_failure():
    """Rank 0 let go of the file (Ctrl-C) while rank 1's thread waited in a step's commit: the
    report names rank 0's leaving, not a background failure on rank 0."""
    from lamina.layers.background.step import BackgroundError, same_report

    left = comm_mod._error_from_payload(comm_mod._error_payload(KeyboardInterrupt(), left=True), 0)
    err = BackgroundError(5, left, 1, "r.lam", "committing").build()
    text = str(err)
    assert "failed" not in text, text
    assert text.startswith("background step 5 of 'r.lam' was abandoned by rank 0 and "), text
    assert "rank 0 left the file after an error of its own (KeyboardInterrupt)" in text, text
    assert same_report(err)


# -- reading ahead ---------------------------------------------------------------


def _write_steps(path: str, n: int) -> None:
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("x", (4, 6), "f8")
        y = f.create_dataset("y", (5,), "i4")
        for k in range(n):
            with f.step():
                ds[...] = values(k)
                y[...] = np.arange(5) + k


def test_prefetch_serves_the_next_steps(path):
    _write_steps(path, 6)
    with lamina.open(path, "r", io="async") as f:
        slow = f.engine.stack()[-1]
        orig = slow.get

        def get(name, box, step, out):
            time.sleep(0.01)  # slow storage: the read ahead has something to hide
            orig(name, box, step, out)

        slow.get = get
        seen = []
        for view in f.iter_steps(prefetch=True, timeout=5):
            k = view.index
            np.testing.assert_array_equal(view["x"][1:3, 2:], values(k)[1:3, 2:])
            np.testing.assert_array_equal(view["y"][...], np.arange(5) + k)
            if k == 3:  # another selection at one step: read directly, still right
                np.testing.assert_array_equal(view["x"][0], values(k)[0])
            time.sleep(0.02)  # compute
            seen.append(k)
        stats = f.io_stats
    assert seen == list(range(6))
    # step 0 teaches the pattern and starts step 1's reads at once: steps 1..5 are read
    # ahead (two selections each), step 1 included
    assert stats["prefetch_hits"] >= 10, stats
    assert stats["prefetched_bytes"] > 0


def test_dataset_prefetch_reads_a_box_of_a_step_ahead(path):
    """``ds.prefetch(box, step)`` on a reader opened with io='async': the box is read on the
    read-ahead thread while the program works, and the later read of that box at that step
    takes it (a hit, the values of that step); other reads read as usual; the budget bounds
    what is read ahead; a step the file lacks is a StepError, a file without read-ahead a
    ConfigError."""
    _write_steps(path, 4)
    with lamina.open(path, "r", io="async", max_inflight_bytes=400) as f:
        ds = f["x"]
        fetched = []
        eng = f.engine.stack()[-1]
        orig = eng.get

        def get(name, box, step, out):
            fetched.append((threading.current_thread().name, step))
            orig(name, box, step, out)

        eng.get = get
        assert ds.prefetch(np.s_[1:3, 2:], step=2)
        assert ds.prefetch(step=3)  # everything: 192 bytes, 224 with the box above
        assert not ds.prefetch(step=1)  # past the budget: read when asked for
        # read on the read-ahead thread while the program does not read (a fixed sleep could
        # end before a loaded machine ran that thread)
        deadline = time.monotonic() + 30
        while not {("lamina-prefetch", 2), ("lamina-prefetch", 3)} <= set(fetched):
            assert time.monotonic() < deadline, fetched
            time.sleep(0.01)
        np.testing.assert_array_equal(ds.read(np.s_[1:3, 2:], step=2), values(2)[1:3, 2:])
        np.testing.assert_array_equal(f.at(3)["x"][...], values(3))
        np.testing.assert_array_equal(ds.read(step=1), values(1))  # not read ahead
        assert f.io_stats["prefetch_hits"] == 2, f.io_stats
        with pytest.raises(StepError):
            ds.prefetch(step=9)
        # asked for and never read: a request for step k lets go of those before step k - 1
        assert ds.prefetch(step=0) and ds.prefetch(step=1)  # 384 bytes held
        assert not ds.prefetch(np.s_[0:1, :], step=1)  # 48 more: over the budget
        assert ds.prefetch(step=3)  # steps 0 and 1 give way
        np.testing.assert_array_equal(ds.read(step=3), values(3))
        assert f.io_stats["prefetch_hits"] == 3, f.io_stats
    with lamina.open(path, "r") as f, pytest.raises(ConfigError, match="io='async'"):
        f["x"].prefetch(step=0)
    with lamina.open(path + "-w", "w", io="async") as f, pytest.raises(ConfigError):
        f.create_dataset("x", (4, 6), "f8").prefetch()


def test_dataset_prefetch_of_a_box_out_of_bounds_raises_as_its_read(path):
    """``ds.prefetch`` of a box outside the dataset raises the BoundsError its read raises,
    at the call, with nothing read ahead nor held of the budget."""
    _write_steps(path, 3)
    with lamina.open(path, "r", io="async") as f:
        ds = f["x"]  # (4, 6)
        ahead = f._background()._prefetch
        for box in (Box((0, 0), (5, 6)), Box((0, 0), (8000, 8000)), Box((0,), (4,))):
            with pytest.raises(BoundsError) as read:
                ds.read(box, step=1)
            with pytest.raises(BoundsError) as asked:
                ds.prefetch(box, step=1)
            assert str(asked.value) == str(read.value)
            assert not ahead.cache and ahead.held == 0
        assert ds.prefetch(Box((0, 0), (4, 6)), step=1)  # inside: read ahead
        np.testing.assert_array_equal(ds.read(Box((0, 0), (4, 6)), step=1), values(1))
        assert f.io_stats["prefetch_hits"] == 1


def test_a_read_ahead_box_into_a_bad_buffer_is_refused_by_name_and_kept(path):
    """A read into a buffer it cannot fill is refused as any read is (naming the dataset)
    when the box was read ahead too, before the read-ahead array is taken: a retry into a
    good buffer still finds it (numpy's own errors came first, and the array was gone)."""
    _write_steps(path, 3)
    with lamina.open(path, "r", io="async") as f:
        ds = f["x"]
        assert ds.prefetch(step=1)
        time.sleep(0.1)
        frozen = np.zeros((4, 6))
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="dataset '.*x'.*read-only"):
            ds.read(step=1, out=frozen)
        with pytest.raises(TypeError, match="dataset '.*x'.*numpy array, not list"):
            ds.read(step=1, out=[[0.0] * 6] * 4)
        out = np.zeros((4, 6))
        assert ds.read(step=1, out=out) is out
        np.testing.assert_array_equal(out, values(1))
        assert f.io_stats["prefetch_hits"] == 1, f.io_stats


def test_a_closed_file_reads_nothing(path):
    """A dataset of a closed file reads nothing, as h5py's (it reopened its subfiles and
    read), prefetches nothing (async returned False), and says the file is closed."""
    _write_steps(path, 2)
    for io in ("sync", "async"):
        f = lamina.open(path, "r", io=io)
        ds = f["x"]
        f.close()
        with pytest.raises(ValueError, match="cannot read: file .* is closed"):
            ds.read()
        with pytest.raises(ValueError, match="cannot read: file .* is closed"):
            ds[0:2]
        with pytest.raises(ValueError, match="cannot read: file .* is closed"):
            ds.blocks(0)
        with pytest.raises(ValueError, match="cannot read: file .* is closed"):
            f.at(0)
        if io == "async":
            with pytest.raises(ValueError, match="is closed"):
                ds.prefetch(step=0)


def test_prefetch_reads_the_second_step_during_the_first(path):
    """The first step's reads are read ahead at the second step at once: by the end of the
    first step's compute the second step's selections are fetched (not when it is handed out)."""
    _write_steps(path, 3)
    with lamina.open(path, "r", io="async") as f:
        for view in f.iter_steps(prefetch=True, timeout=5):
            np.testing.assert_array_equal(view["x"][1:3], values(view.index)[1:3])
            if view.index == 0:
                deadline = time.monotonic() + 10
                while f.io_stats["prefetched_bytes"] == 0 and time.monotonic() < deadline:
                    time.sleep(0.005)  # compute on step 0
                assert f.io_stats["prefetched_bytes"] == 2 * 6 * 8  # x[1:3] of step 1
        # step 0 read directly (one miss, counted once), steps 1 and 2 read ahead
        assert (f.io_stats["prefetch_hits"], f.io_stats["prefetch_misses"]) == (2, 1)


def test_prefetch_hands_its_arrays_over_without_a_copy(path, monkeypatch):
    """A read of a whole selection that was read ahead returns the array fetched: the copy path
    (Prefetcher.get, which fills a buffer the caller gave) is not taken."""
    from lamina.layers.background.prefetch import Prefetcher

    _write_steps(path, 4)

    copying = Prefetcher.get

    def no_copy(self, name, box, step, out):
        assert not copying(self, name, box, step, out), "copied out of the read-ahead buffer"
        return False

    monkeypatch.setattr(Prefetcher, "get", no_copy)
    with lamina.open(path, "r", io="async") as f:
        for view in f.iter_steps(prefetch=True, timeout=5):
            got = view["x"][...]
            np.testing.assert_array_equal(got, values(view.index))
            got[0, 0] = -1.0  # the caller owns it
        assert f.io_stats["prefetch_hits"] >= 3


def test_a_read_waiting_for_a_fetch_ends_when_the_file_is_closed(path):
    """A thread reading a selection queued for read-ahead while another thread closes the
    file gets its values or the ValueError of a closed file, at once: the close emptied the
    queue without marking its fetches done, and the read waited for ever."""
    sh = (400, 100)
    with lamina.open(path, "w") as f:
        f.create_dataset("u", shape=sh, dtype="f8")
        with f.step():
            f["u"][...] = np.arange(sh[0] * sh[1], dtype="f8").reshape(sh)
    f = lamina.open(path, "r", io="async")
    u = f["u"]
    boxes = [np.s_[i * 10 : (i + 1) * 10 + j, :] for j in range(3) for i in range(39)]
    for b in boxes:
        assert u.prefetch(b)
    pf = f.engine._prefetch
    with pf.cond:  # the worker stopped: every fetch stays queued
        pf.waiting = 0
        pf.reading = 1
    res: dict = {}

    def reader() -> None:
        try:
            res["value"] = u[boxes[-1]]
        except ValueError as e:
            res["error"] = e

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not pf.waiting and time.monotonic() < deadline:  # the read waits on its fetch
        time.sleep(0.001)
    assert pf.waiting
    f.close()
    t.join(30)
    assert not t.is_alive(), "the read waited for ever"
    if "value" in res:
        np.testing.assert_array_equal(res["value"], np.arange(sh[0] * sh[1]).reshape(sh)[boxes[-1]])
    else:
        assert "is closed" in str(res["error"])


def test_two_threads_reading_one_fetched_selection_get_arrays_of_their_own(path):
    """A selection read ahead and read by two threads at once: one is handed the fetch, the
    other reads its own (both were given the one array: a change by one showed in the
    other's)."""
    _write_steps(path, 2)
    with lamina.open(path, "r", io="async") as f:
        x = f["x"]
        for trial in range(20):
            assert x.prefetch(np.s_[0:4, 0:6], step=1), trial
            got: list = [None, None]
            barrier = threading.Barrier(2)

            def read(i: int, got=got, barrier=barrier) -> None:
                barrier.wait()
                got[i] = f.at(1)["x"][0:4, 0:6]

            ts = [threading.Thread(target=read, args=(i,)) for i in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(30)
            assert got[0] is not got[1]
            np.testing.assert_array_equal(got[0], values(1))
            got[0][0, 0] = -1.0
            np.testing.assert_array_equal(got[1], values(1))


def test_breaking_out_of_a_stream_drops_what_it_read_ahead(path):
    """A loop over iter_steps(prefetch=True) left by break: what was read ahead of the next
    steps goes, and reads at the step left read nothing ahead (kept until the close, within
    the budget of every later read)."""
    _write_steps(path, 6)
    with lamina.open(path, "r", io="async") as f:
        pf = f.engine._prefetch
        for view in f.iter_steps(prefetch=True, timeout=5):
            view["x"][...]
            if view.index == 2:
                deadline = time.monotonic() + 10  # step 3 is read ahead meanwhile
                while not any(k[0] == 3 for k in pf.cache) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert any(k[0] == 3 for k in pf.cache)
                break
        assert pf.stream is None and not pf.cache and pf.held == 0
        np.testing.assert_array_equal(f.at(2)["x"][0:2, :], values(2)[0:2])
        assert not pf.cache and pf.held == 0


def test_hits_and_misses_add_up_to_the_reads_after_a_request(path):
    """With ds.prefetch (no stream), every read after the first request is a hit or a miss:
    one that came once the cache was empty was neither."""
    _write_steps(path, 3)
    with lamina.open(path, "r", io="async") as f:
        x = f["x"]
        assert x.prefetch(np.s_[0:2, :], 1) and x.prefetch(np.s_[2:4, :], 1)
        for box, step in ((np.s_[0:1, :], 1), (np.s_[0:2, :], 1), (np.s_[2:4, :], 1)):
            x.read(box, step)
        x.read(np.s_[0:1, :], 1)  # the cache empty now
        x.read(np.s_[0:1, :], 2)
        st = f.io_stats
        assert (st["prefetch_hits"], st["prefetch_misses"]) == (2, 3)


def test_prefetch_needs_async(path):
    _write_steps(path, 2)
    with lamina.open(path, "r", io="sync") as f, pytest.raises(ConfigError, match="io='async'"):
        next(iter(f.iter_steps(prefetch=True)))


def test_prefetch_over_budget_reads_directly(path):
    _write_steps(path, 4)
    with lamina.open(path, "r", io="async", max_inflight_bytes=8) as f:
        for view in f.iter_steps(prefetch=True, timeout=5):
            np.testing.assert_array_equal(view["x"][...], values(view.index))
        assert f.io_stats["prefetch_hits"] == 0


# -- under mpiexec -------------------------------------------------------------------


def _have_mpiexec() -> bool:
    try:
        mu.mpiexec()
    except RuntimeError:
        return False
    return True


needs_mpiexec = pytest.mark.skipif(not _have_mpiexec(), reason="no mpiexec")


@needs_mpiexec
@pytest.mark.parametrize("where", ["put", "commit"])
def test_one_rank_fails_in_the_background(tmp_path, where):
    """Rank 1's replayed put (or its part of the commit) fails at step 3: both ranks raise it."""
    res = mu.run_mpi(2, "background", "fault", tmp_path / "f.lam", where, timeout=90)
    assert res.stdout.count("RAISED") == 2, res.stdout


@needs_mpiexec
@pytest.mark.parametrize("case", ["io-env", "io-arg", "budget", "option"])
def test_an_argument_given_to_one_rank_fails_the_open_everywhere(tmp_path, case):
    """Rank 1 alone is given an unknown I/O mode ($LAMINA_IO or io=), a negative budget or an
    unknown option: every rank raises at the open (rank 0 waited forever in its first
    collective call)."""
    res = mu.run_mpi(2, "open_args", case, tmp_path / "a.lam", timeout=60)
    assert res.stdout.count(f"OK {case}") == 2, res.stdout


@needs_mpiexec
def test_a_failed_background_write_is_named_on_every_rank(tmp_path):
    """A subfile write of rank 1 fails in a background step: every rank's error names rank 1
    (not rank 0, which failed second-hand in the commit), the dataset and the box."""
    res = mu.run_mpi(2, "open_args", "enospc", tmp_path / "e.lam", timeout=90)
    assert res.stdout.count("OK enospc") == 2, res.stdout


SAME_WORDS = """
import sys, threading, time
import lamina
from lamina import comm as comm_mod

comm = comm_mod.world()
rank = comm.rank
f = lamina.open(sys.argv[1], "w", io="async", comm=comm)
layer = f.engine
native = layer.stack()[-1]
ds = f.create_dataset("x", (comm.size, 6), "f8")
fired, held = threading.Event(), threading.Event()
if rank == 1:  # its put of step 2 fails on its background thread
    put, run, meet = native.put, layer._run, layer._meet

    def failing_put(name, box, arr, copy=True):
        if len(native.catalog.steps) == 2 and not fired.is_set():  # once
            fired.set()
            raise OSError("injected put failure")
        put(name, box, arr, copy)

    def late_run(step):  # its thread records its own failure only once its end_step agrees
        try:
            run(step)
        except BaseException:
            held.wait(30)
            raise

    def meet_then_record(*args, **kw):
        if fired.is_set():
            held.set()
        return meet(*args, **kw)

    native.put, layer._run, layer._meet = failing_put, late_run, meet_then_record


def until(ready):
    deadline = time.monotonic() + 30
    while not ready():
        assert time.monotonic() < deadline, "waited 30 s"
        time.sleep(0.002)


for k in range(3):
    with f.step():
        ds[rank] = float(k)
# rank 0 learnt of the failure in the step's agreement; rank 1's own is not recorded yet, so
# rank 0's report is raised on every rank
until(lambda: layer.stats.steps_failed if rank == 0 else fired.is_set())
try:
    with f.step():
        ds[rank] = 3.0
    raise AssertionError("the failure of step 2 was not raised")
except OSError as e:
    words = str(e)
stats = f.io_stats
counts = f"{stats['steps_failed']} {stats['steps_cancelled']} {f.steps}"
for r, (w, c) in enumerate(comm.gather((words, counts), root=0) or ()):  # rank 0 says all
    print(f"WORDS {r}: {w}", flush=True)
    print(f"COUNTS {r}: {c}", flush=True)
with f.step():
    ds[rank] = 4.0
f.close()
if rank == 0:
    with lamina.open(sys.argv[1], "r", comm=comm_mod.self_comm()) as r:
        assert [float(r.at(k)["x"][0, 0]) for k in range(r.steps)] == [0.0, 1.0, 4.0]
    print("OK", flush=True)
"""


@needs_mpiexec
def test_every_rank_words_a_background_failure_alike(tmp_path):
    """Rank 1 fails step 2 on its own; rank 0, which learnt of it in the step's agreement,
    reports it first: every rank raises the same words, naming rank 1 and what it was doing
    (rank 1 got rank 0's words with rank 0 in front, and no rank it failed on), and the step
    whose end_step raises it among the cancelled, counted alike."""
    script = tmp_path / "same_words.py"
    script.write_text(SAME_WORDS)
    res = mu.run_mpi(2, str(script), tmp_path / "w.lam", timeout=90)
    words = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in res.lines("WORDS")}
    assert set(words) == {"0", "1"} and words["0"] == words["1"], res.stdout
    text = words["0"]
    assert text.startswith("background step 2 of "), text
    assert "failed on rank 1 (writing dataset" in text and "box [1:2, 0:6])" in text, text
    assert "step(s) [3] queued after it were cancelled" in text, text
    assert text.endswith("earlier steps are intact: OSError: injected put failure"), text
    assert sorted(res.lines("COUNTS")) == ["0: 1 1 2", "1: 1 1 2"], res.stdout


def test_auto_first_step_from_another_program_s_history_fits_or_goes_direct(tmp_path, monkeypatch):
    """The history's last step (any program's) stands in for io='auto''s first step; a step
    of this program that may not fit the budget is written directly instead of refused at its
    first put (it depended on what another program had written)."""
    monkeypatch.setenv("LAMINA_HISTORY", str(tmp_path / "history.json"))
    with lamina.open(tmp_path / "small.lam", "w", io="async") as f:  # small background steps
        ds = f.create_dataset("y", (4,), "f8")
        for k in range(4):
            with f.step():
                ds[...] = k
    with lamina.open(tmp_path / "big.lam", "w", io="auto", max_inflight_bytes=20000) as f:
        ds = f.create_dataset("x", (64, 64), "f8")  # 32 KiB a step
        for k in range(3):
            with f.step():
                ds[...] = np.full((64, 64), float(k))
        assert f.io_stats["steps_direct"] == 3
    with lamina.open(tmp_path / "big.lam") as f:
        np.testing.assert_array_equal(f["x"][...], np.full((64, 64), 2.0))


@needs_mpiexec
def test_a_step_ended_while_another_fails_is_cancelled_on_every_rank(tmp_path):
    """Rank 1 queues step 4 before its thread fails step 3, rank 0 only after: both cancel
    step 4 and say so (rank 0 wrote it and waited forever in its commit), and go on."""
    res = mu.run_mpi(2, "background", "race", tmp_path / "r.lam", timeout=90)
    # step 4, and the step whose end_step raised it (4 or 5)
    assert "OK raised" in res.stdout, res.stdout
    assert re.search(r"\[4(, 5)?\] queued after it were cancelled", res.stdout), res.stdout


@needs_mpiexec
def test_a_failure_raised_at_a_step_opened_on_one_rank_leaves_the_file_going_on(tmp_path):
    """The failure is raised by the end_step of a step opened by a put on rank 0 alone: every
    rank counts that step dropped, so later steps commit (they were refused as a step apart)."""
    res = mu.run_mpi(2, "background", "implicit", tmp_path / "i.lam", timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_collective_read_is_collective_whatever_was_read_ahead(tmp_path, n):
    """A box read ahead on rank 0 only, then read collectively by every rank; iter_steps with
    prefetch and a collective read of a box per rank, only rank 0's small enough to be read
    ahead: rank 0 took its read-ahead array and left the others in the collective."""
    res = mu.run_mpi(n, "background", "ahead", tmp_path / "a.lam", timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
def test_one_rank_leaves_with_steps_in_flight(tmp_path):
    """An error on rank 1 alone: the other rank hears it at its next end_step, the steps both
    ranks ended are written, and nobody waits forever."""
    mu.run_mpi(2, "background", "leave", tmp_path / "l.lam", timeout=90)


@needs_mpiexec
def test_a_rank_interrupted_in_a_steps_meeting_leaves_no_rank_waiting(tmp_path):
    """A signal's exception on rank 1 while it waits in end_step for rank 0: rank 0 met it
    and handed the step to its thread, which waited for ever in the commit for rank 1's
    (and rank 0 in its exit). Rank 1 now meets that commit as it leaves."""
    res = mu.run_mpi(2, "background", "interrupted", tmp_path / "i.lam", timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
def test_ranks_leaving_at_once_one_of_them_halfway_through_a_steps_meeting(tmp_path):
    """As above, and rank 0 then fails on its own before its next collective call: both
    ranks leave in one agreement, which closed the file together although rank 0's thread
    held step 1, which rank 1 dropped (both waited for ever). Now both let go of the file,
    rank 0's commit of step 1 meeting rank 1's leave."""
    res = mu.run_mpi(2, "background", "interrupted-both", tmp_path / "i.lam", timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
def test_a_rank_interrupted_once_a_steps_meeting_completed_leaves_no_rank_waiting(tmp_path):
    """A signal's exception on rank 1 after end_step's meeting completed there, before the
    step went to its thread: rank 0's thread waited for ever in the step's commit (rank 0 in
    its drain). Rank 1 now meets that commit as it leaves, as when cut in the meeting."""
    res = mu.run_mpi(2, "background", "handing-cut", tmp_path / "h.lam", timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_many_steps_no_deadlock(tmp_path, n):
    """Many steps, random compute times, reads of committed and in-flight steps, mixed with sync."""
    mu.run_mpi(n, "background", "stress", tmp_path / "s.lam", 40, timeout=120)


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_collective_reads_with_steps_in_flight(tmp_path, n):
    """A collective read after each step, while the step is in flight and one rank hands its
    steps to its thread late: the read waits for the steps in flight, so that no rank's read
    meets another rank's commit on the inner communicator (it hung)."""
    res = mu.run_mpi(n, "background", "collective", tmp_path / "c.lam", 8, timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
@pytest.mark.parametrize(
    ("io", "mode", "op"),
    [
        ("async", "-", "close"),
        ("auto", "sync", "close"),  # steps written directly
        ("auto", "async", "close"),
        ("async", "-", "wait"),
        ("auto", "sync", "flush"),
        ("auto", "async", "define"),
        ("auto", "sync", "read"),
        ("async", "-", "read"),
        ("async", "-", "join"),
        ("auto", "sync", "join"),
        ("auto", "async", "first"),
        ("auto", "sync", "first"),
    ],
)
def test_a_step_dropped_on_one_rank_then_the_ranks_pair_again(tmp_path, io, mode, op):
    """Rank 0 drops step 1 on its own (*first*: step 0, opened by a put, before io='auto'
    judged it); the program then closes, or makes *op* after each step and writes two more.  Rank 1's end of step 1 meets rank 0's next call: it raises
    CollectiveMismatchError and drops the step too, rank 0's call waits for rank 1's, and
    the steps after are committed; both closes succeed.  Before, each of these waited
    forever: a close left while rank 1's thread (or the engine, for a step written
    directly) waited in a commit rank 0 never made, and a point met an end_step."""
    res = mu.run_mpi(2, "background", "apart", tmp_path / "a.lam", io, mode, op, timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
@pytest.mark.parametrize("io", ["async", "auto", "sync"])
def test_attributes_set_while_steps_are_in_flight_go_with_their_own_step(tmp_path, io):
    """Rank 0 alone changes an attribute every rank set in step 0 while step 0 is in flight:
    the change went with step 0's record, beside the other ranks' value, and the step
    failed (both steps lost)."""
    res = mu.run_mpi(2, "background", "attrs-between", tmp_path / "a.lam", io, timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
@pytest.mark.parametrize("io", ["async", "auto"])
@pytest.mark.parametrize("end", ["close", "wait"])
def test_steps_after_a_step_dropped_on_one_rank_then_the_ranks_pair_again(tmp_path, io, end):
    """Rank 0 drops a step, then every rank writes two more steps before a wait or close:
    the failure of the steps refused while the ranks are a call apart is raised once on
    every rank, and the wait or close pairs them again (it let go of the file: RemoteError
    on the others)."""
    res = mu.run_mpi(2, "background", "apart-steps", tmp_path / "s.lam", io, end, timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_auto_a_rank_joins_a_step_it_did_not_begin(tmp_path, mode):
    """Under io='auto', a rank that ends a step without beginning it or writing, and one
    that writes without begin_step, take part in the step as the ranks that began it do:
    written directly (*mode* sync), their end_step went to the background and waited for
    collective calls the others never made."""
    res = mu.run_mpi(2, "background", "joined", tmp_path / "j.lam", mode, timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
@pytest.mark.parametrize("ranks", [2, 3])
def test_auto_decides_on_the_ranks_predictions_together(tmp_path, monkeypatch, ranks):
    """io='auto' where rank 0 measured its background steps slow (it waited in them for the
    others) and its model alone prefers writing directly: the ranks' predictions combined
    (the least I/O, the slowest compute and copy) send every step to the background (each
    rank's vote had to say so before: every step was written directly)."""
    monkeypatch.setenv("LAMINA_HISTORY", str(tmp_path / "history.json"))
    res = mu.run_mpi(ranks, "background", "slowest", tmp_path / "s.lam", timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
def test_auto_a_rank_that_writes_nothing_does_not_decide_the_io(tmp_path):
    """A rank that takes part in every step and writes nothing predicts no I/O at all: the
    ranks that write decide the step's I/O (their least), and the background pays."""
    res = mu.run_mpi(2, "background", "empty", tmp_path / "e.lam", timeout=90)
    assert "OK" in res.stdout


@needs_mpiexec
def test_auto_ranks_share_rank_0_s_history(tmp_path, monkeypatch):
    """Rank 0 keeps what a process measured (saved at its exit): a second file's first step
    is judged on it on every rank alike, not on each rank's own load of the file."""
    monkeypatch.setenv("LAMINA_HISTORY", str(tmp_path / "history.json"))
    res = mu.run_mpi(2, "background", "shared", tmp_path / "h.lam", timeout=90)
    assert "OK" in res.stdout


#: extra seeds of the randomized switches test: LAMINA_STRESS_RUNS=50 make test (0 in CI)
STRESS_RUNS = int(os.environ.get("LAMINA_STRESS_RUNS", "0"))
SWITCHES = [(2, 1, 0), (3, 2, 1), (2, 8, 1), (4, 1, 1)] + [
    (2 + seed % 3, 100 + seed, seed % 2) for seed in range(STRESS_RUNS)
]


@needs_mpiexec
@pytest.mark.parametrize(("n", "seed", "discard"), SWITCHES)
def test_random_switches_never_hang(tmp_path, n, seed, discard):
    """40 steps under io='auto' whose mode each rank's model picks at random (so steps go
    directly and to the background by turns; io='async' for a third of the seeds), random
    compute times, the program's own
    collectives, waits, flushes, reads, definitions, implicit steps, steps refused on every
    rank, a synchronous file beside; with *discard*, a step dropped on one rank alone, then
    steps, waits, flushes, reads and definitions.  Nothing may hang (the timeout); the file
    holds the steps every rank ended before, then steps of one program step each."""
    res = mu.run_mpi(
        n, "background", "switches", tmp_path / "s.lam", 40, seed, discard, timeout=120
    )
    assert "OK" in res.stdout


@needs_mpiexec
def test_auto_decides_alike_on_every_rank(tmp_path):
    """io='auto' on 2 ranks whose compute phases differ: one mode per step, the same on both."""
    res = mu.run_mpi(2, "background", "auto", tmp_path / "a.lam", 8, timeout=90)
    assert "OK [" in res.stdout


EXIT_PROGRAM = """
import sys, time
import lamina
f = lamina.open(sys.argv[1], "w", io="async")
ds = f.create_dataset("x", (int(sys.argv[2]),), "f8")
eng = f.engine.stack()[-1]
orig = eng.end_step
def slow():
    time.sleep(0.1)
    orig()
eng.end_step = slow
for k in range(4):
    with f.step():
        ds[...] = k
print("left with", f.steps - f.io_stats["steps_background"], "step(s) in flight")
"""


@pytest.mark.parametrize("n", [4, 1 << 18], ids=["small", "2MiB"])
def test_program_ending_without_close_loses_no_step(path, tmp_path, n):
    """Steps ended but still in flight when the program ends are written before it exits;
    blocks of 2 MiB too, whose statistics take a thread pool (the pools' own exit call, which
    refuses work, must come after the one that writes the steps)."""
    script = tmp_path / "noclose.py"
    script.write_text(EXIT_PROGRAM)
    res = mu.finish(mu.start(mu.python_command(str(script), path, n)), "noclose", 60)
    assert res.returncode == 0, res.describe()
    assert "in flight" in res.stdout
    got = read_all(path)
    assert [float(a[0]) for a in got] == [0.0, 1.0, 2.0, 3.0]


FAILING_EXIT_PROGRAM = EXIT_PROGRAM.replace(
    'print("left with"',
    'eng._move = lambda h: (_ for _ in ()).throw(OSError("disk gone"))\nprint("left with"',
)


def test_a_failure_found_at_exit_is_said(path, tmp_path):
    """A program that ends without close while its steps fail in the background: nobody is
    left to raise the failure to, so it is said, as a LaminaWarning naming the step."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING_EXIT_PROGRAM)
    res = mu.finish(mu.start(mu.python_command(str(script), path, 4)), "failing", 60)
    assert "LaminaWarning" in res.stderr and "disk gone" in res.stderr, res.describe()
    assert "was not committed" in res.stderr, res.describe()


def test_pool_reuses_buffers_nobody_else_holds():
    """Copies of later steps go into the buffers of written steps, unless something still holds them."""
    from lamina.layers.background.step import Pool

    p = Pool()
    (b0, w0), (b1, w1) = p.take(64), p.take(64)
    assert not w0 and not w1  # new: their pages not touched yet
    bufs = [b0, b1]
    del b0, b1
    ids = [id(x) for x in bufs]
    held = bufs[1].view(np.float64)  # an engine that kept a block by reference
    p.give(bufs, room=1 << 20)
    assert p.nbytes == 128 and not bufs
    got, warm = p.take(64)  # the held buffer is skipped (and forgotten), the other one reused
    assert warm and id(got) == ids[0] and held.base is not got and p.nbytes == 0
    p.give([got], room=64)
    p.give([np.empty(64, np.uint8)], room=64)  # over the room: not kept
    assert p.nbytes == 64
    p.clear()
    assert p.nbytes == 0 and p.take(32)[0].nbytes == 32


def test_copies_reuse_the_buffers_of_written_steps(path):
    a = np.arange(1 << 16, dtype=np.float64)
    with lamina.open(path, "w", io="async") as f:
        f.create_dataset("x", a.shape, a.dtype)
        bg = f._background()
        seen = []
        for k in range(6):
            with f.step():
                f["x"][...] = a + k
            f.wait()  # written: its buffer is back in the pool
            if bg._ahead is not None:  # and one made for the next step while it was written
                bg._ahead.result(timeout=30)
            seen.append(bg._pool.nbytes)
        # buffers reused: the pool never grows past a step more than was in flight
        assert max(seen) <= 2 * a.nbytes and len(set(seen[1:])) == 1
    with lamina.open(path) as f:
        for k in range(6):
            np.testing.assert_array_equal(f.at(k)["x"][...], a + k)


def test_a_failed_copy_buffer_leaves_the_budget_and_the_box_as_they_were(path, monkeypatch):
    """No memory for a put's copy: the put raises, nothing of it stays counted in flight,
    and its box may be written again."""
    from lamina.layers.background.step import Pool

    a = np.arange(1024, dtype=np.float64)
    with lamina.open(path, "w", io="async") as f:
        f.create_dataset("x", a.shape, a.dtype)
        bg = f._background()
        real = Pool.take
        calls = {"n": 0}

        def once(self, nbytes):
            calls["n"] += 1
            if calls["n"] == 1:
                raise MemoryError("no memory for the copy")
            return real(self, nbytes)

        monkeypatch.setattr(Pool, "take", once)
        with f.step():
            with pytest.raises(MemoryError):
                f["x"][...] = a
            assert bg.stats.inflight_bytes == 0
            f["x"][...] = a + 1  # the same box again
        f.wait()
        assert bg.stats.inflight_bytes == 0
    with lamina.open(path) as r:
        assert np.array_equal(r["x"][...], a + 1)


def _fsynced(monkeypatch) -> list[str]:
    """The names of the files and directories lamina fsyncs from now on (the last path part)."""
    from lamina.engines.native import engine as native

    names: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(native.os, "fsync", fsync)
    return names


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
@pytest.mark.parametrize("io", ["sync", "async"])
def test_flush_makes_the_steps_ended_so_far_durable(path, monkeypatch, io):
    """``f.flush()`` on a file opened with ``durable=False``: every step ended before it is
    committed (a background step waited for) and fsynced: the subfile, then the metadata and
    commit logs and the directory.  ``flush(durable=False)`` only waits; a reader, a file
    opened durable and the memory engine have nothing to do; a closed file refuses."""
    synced = _fsynced(monkeypatch)
    f = lamina.open(path, "w", io=io, durable=False)
    ds = f.create_dataset("x", (4, 6), "f8")
    for s in range(3):
        with f.step():
            ds[...] = values(s)
    f.flush(durable=False)
    assert synced == []
    with lamina.open(path, "r") as r:  # committed: another open sees every step
        assert r.steps == 3
        r.flush()
    assert synced == []
    f.flush()
    assert synced[0].startswith("data.") and synced[1:] == [
        "lamina.meta",
        "lamina.commit",
        os.path.basename(path),
    ]
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.flush()
    with lamina.open(path, "a") as f:  # durable: every commit fsynced already, flush too
        with f.step():
            f["x"][...] = values(3)
        synced.clear()
        f.flush()
        assert len(synced) == 4
    with lamina.open("flushed", "w", engine="memory") as m:
        m.flush()
    assert len(read_all(path)) == 4


@pytest.mark.parametrize("io", ["sync", "async"])
def test_durable_must_be_a_bool(path, io):
    """``durable=`` of ``flush`` and of ``lamina.open``: a bool (numpy's too); anything else
    is a TypeError naming the argument and the value (``flush(durable="no")`` was taken as
    True and fsynced, ``durable="yes"`` at open alike), also where the engine ignores it."""
    bad = ("yes", "no", 1, 0, None, 1.0, np.array([True]))
    for v in bad:
        with pytest.raises(TypeError, match=r"durable must be a bool \(True or False\), got"):
            lamina.open(path, "w", io=io, durable=v)
        with pytest.raises(TypeError, match=r"durable must be a bool"):  # mpi ignores it
            registry.build("ignored", "w", engine="mpi", options={"durable": v}, io=io)
    with lamina.open(path, "w", io=io, durable=np.bool_(False)) as f:
        assert f.engine.stack()[-1].durable is False
        with f.step():
            f.create_dataset("x", (4, 6), "f8")[...] = values(0)
        for v in bad:
            with pytest.raises(TypeError, match=r"flush\(\): durable must be a bool .*got"):
                f.flush(durable=v)
        with pytest.raises(TypeError, match="got 'yes'"):
            f.flush("yes")
        f.flush(durable=np.True_)
        f.flush(np.False_)
        f.flush(durable=False)
    with lamina.open("flushed", "w", engine="memory") as m:
        with pytest.raises(TypeError, match=r"flush\(\): durable must be a bool"):
            m.flush(durable="yes")
        m.flush(durable=np.True_)
    assert len(read_all(path)) == 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
def test_flush_after_a_failed_step_makes_the_steps_before_it_durable(path, monkeypatch):
    """A flush that raises a background failure has made the steps committed before it
    durable all the same (a caller that catches the error may count on them)."""
    f, _, _ = _three_then_fail(path)
    f.engine.stack()[-1].durable = False
    synced = _fsynced(monkeypatch)
    with pytest.raises(OSError, match="background step 2"):
        f.flush()
    assert synced[0].startswith("data.") and "lamina.commit" in synced
    f.close()
    assert len(read_all(path)) == 2


def test_flush_waits_for_the_steps_in_flight(path):
    """A step held in the background: ``flush`` returns only once it is committed."""
    with lamina.open(path, "w", io="async", durable=False) as f:
        _, gate = _second_step_held(f)
        f.flush()
        assert gate.open.is_set()  # returned only once step 1 was let go
        with lamina.open(path, "r") as r:
            assert r.steps == 2


@pytest.mark.parametrize("io", ["sync", "async", "auto"])
@pytest.mark.parametrize("opened", ["begin_step", "write"])
def test_derive_inside_a_step_is_refused_in_every_io_mode(tmp_path, io, opened):
    """docs/derived.md: inside an open step (begun, or opened by a write) derive raises
    ModeError.  Under io='async' the step is the layer's, not the engine's yet, and the
    declaration was taken and computed for the open step; under 'auto' it depended on
    whether the model wrote the step directly."""
    with lamina.open(tmp_path / "d.lam", "w", io=io, durable=False) as f:
        x = f.create_dataset("x", (4,))
        with f.step():
            x[...] = 1.0
        if opened == "begin_step":
            f.begin_step()
        x[...] = 2.0
        with pytest.raises(lamina.ModeError, match="declare it between steps"):
            f.derive("twice", "`x` * 2", strategy="store")
        f.end_step()
        assert "twice" not in f.derived
        f.derive("twice", "`x` * 2", strategy="store")  # between steps: taken
        with f.step():
            x[...] = 3.0
    with lamina.open(tmp_path / "d.lam") as f:
        assert f.steps == 3 and f["twice"].read(step=2).tolist() == [6.0] * 4


#: calls put_stats and put_stats_many refuse: (method, name, box or corners, array)
BAD_STATS = [
    ("put_stats", "d", Box((0,), (4,)), np.arange(3.0)),  # shape
    ("put_stats", "d", Box((4,), (6,)), np.ones(2) + 1j),  # unsafe cast
    ("put_stats", "d", Box((6,), (10,)), np.ones(4)),  # out of bounds
    ("put_stats", "d", Box((0,), (2,)), np.float64(1.0)),  # a scalar is not broadcast
    ("put_stats", "nope", Box((0,), (2,)), np.ones(2)),  # unknown dataset
    ("put_stats_many", "d", np.array([[6]]), [np.arange(4.0)]),  # out of bounds
    ("put_stats_many", "d", np.array([[0], [1]]), np.ones((2, 2))),  # blocks that meet
]
#: calls that meet the statistics-only block [0:2] kept before them in the step
MEETING = [
    ("put_stats", "d", Box((1,), (3,)), np.ones(2)),
    ("put_stats_many", "d", np.array([[4], [1]]), np.ones((2, 2))),
    ("put", "d", Box((1,), (2,)), np.ones(1)),
]


def _refused(eng, calls, error) -> list[tuple[type, str]]:
    """Make each of *calls* on engine *eng*; each must raise *error*: their types and messages."""
    got = []
    for method, *args in calls:
        with pytest.raises(error) as err:
            getattr(eng, method)(*args)
        got.append((type(err.value), str(err.value)))
    return got


@pytest.mark.parametrize("layers", [[], None])  # the engine alone, or under the derived layer
def test_put_stats_errors_at_the_call_and_the_step_goes_on(path, layers):
    """docs/background.md: put_stats and put_stats_many make the checks they make without the
    layer at the same call (unknown dataset, bounds, shape, unsafe cast, overlap within the
    step; under the derived layer, its refusal of statistics-only blocks from a program); a
    refused call leaves the step, and its good writes, to be committed."""
    errors = {}
    for io in ("sync", "async"):
        with lamina.open(path, "w", io=io, layers=layers, durable=False) as f:
            f.create_dataset("d", (8,), "f8")
            x = f.create_dataset("x", (8,), "f8")
            with f.step():
                x[...] = 1.0
            e = f.engine
            with f.step():
                x[...] = 2.0
                errors[io] = _refused(e, BAD_STATS, lamina.errors.LaminaError)
                if layers == []:  # the engine alone keeps them: overlap with a block kept
                    e.put_stats("d", Box((0,), (2,)), np.ones(2))
                    errors[io] += _refused(e, MEETING, OverlapError)
                    e.put_stats_many("d", np.array([[2], [4]]), np.full((2, 2), 3.0))
            if io == "async":
                f.wait()  # the step was written: nothing failed in the background
        with lamina.open(path, layers=layers) as f:
            assert f.steps == 2 and f["x"].read(step=1).tolist() == [2.0] * 8
            kept = [(b.box.start, b.stats.max) for b in f["d"].blocks(1)]
            assert kept == ([((0,), 1.0), ((2,), 3.0), ((4,), 3.0)] if layers == [] else [])
    assert errors["async"] == errors["sync"]  # the same errors, with the same messages
    if layers is None:  # under the derived layer every put_stats from a program is refused
        kinds = [k for k, _ in errors["async"]]
        assert kinds.count(lamina.ModeError) == 6 and kinds.count(lamina.NotFoundError) == 1


@pytest.mark.parametrize("io", ["sync", "async"])
def test_a_writer_iterates_the_steps_it_committed_and_waits_for_none_of_its_own(path, io):
    """iter_steps on a file open for writing waited for a step only this process could
    write: a 30 s hang, then StepTimeoutError.  It now yields the steps committed (the
    background ones waited for) and ends; wait_for_step of a step not ended is a StepError
    at once, in 'w' and in 'a'."""
    for mode in ("w", "a"):
        t0 = time.monotonic()
        with lamina.open(path, mode, io=io) as f:
            ds = f["u"] if mode == "a" else f.create_dataset("u", (4,))
            for s in range(3):
                with f.step():
                    ds[...] = s
            got = [float(v["u"][0]) for v in f.iter_steps(timeout=20)]
            assert got == [0.0, 1.0, 2.0] * (1 if mode == "w" else 2)
            assert [float(v["u"][0]) for v in f.iter_steps(start=-2, timeout=20)] == [1.0, 2.0]
            assert float(f.wait_for_step(-1, timeout=20)["u"][0]) == 2.0
            with pytest.raises(StepError, match=r"this process writes it and has committed"):
                f.wait_for_step(f.steps, timeout=20)
        assert time.monotonic() - t0 < 15  # (nothing waited for the timeout)
