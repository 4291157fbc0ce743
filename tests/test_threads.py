"""Reads of one open file from several threads at once (dask's threaded scheduler, a
ThreadPoolExecutor): every value as written, no error, no file descriptor left open.

The switches that matter are made deterministic by :func:`thread_util.interleavings`;
a stress test reads many steps from many threads with thread switches as often as
CPython makes them.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from thread_util import interleavings

import lamina
from lamina.catalog.tree import KEEP_STEPS
from lamina.engines.native import engine as native_engine

#: steps of the files read: more than a catalog keeps the tables of
NSTEPS = KEEP_STEPS + 8


def _expected(step: int) -> np.ndarray:
    """Step *step* of dataset "a" (64 x 8): 16 blocks of 4 rows, each its own value."""
    rows = np.arange(64, dtype=np.float64) // 4
    return (1000.0 * step + rows)[:, None] + 0.01 * np.arange(8)


@pytest.fixture(scope="module")
def steps_file(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("threads") / "steps.lam")
    with lamina.open(path, "w", durable=False) as f:
        d = f.create_dataset("a", (64, 8), "f8")
        for k in range(NSTEPS):
            with f.step():
                v = _expected(k)
                for i in range(0, 64, 4):
                    d.write(v[i : i + 4], (i, 0))
    return path


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _forget_readers(eng) -> None:
    """The engine as opened, before its first read: no subfile or metadata reader open."""
    eng._subfiles.close()
    for fd in eng._rfds.values():
        os.close(fd)
    eng._rfds.clear()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
@pytest.mark.parametrize("which", ["subfile", "metadata"])
def test_a_file_opened_by_two_threads_at_once_is_opened_once(steps_file, which):
    """Two threads opening one of the file's subfiles (or lamina.meta, which step tables are
    read from) at once, switched at any point of it: both read through one descriptor,
    and the other one opened is closed (both kept theirs in turn: one was lost, open)."""
    with lamina.open(steps_file) as f:
        f.at(0)["a"][1:3]  # opens what a read opens
        eng = f.engine.stack()[-1]
        name = eng._subfiles.names()[0]

        def open_it(e) -> int:
            if which == "metadata":
                return e._meta_reader()
            with e._subfile(name) as fd:
                return fd

        def setup():
            _forget_readers(eng)
            setup.fds = _open_fds()  # type: ignore[attr-defined]
            return eng

        n = 0
        # (switched in the engine's code alone: the subfiles' lock is never held there, and
        # a call run at a switch inside it would wait for ever, on this one thread)
        for k, out, inner, e in interleavings([native_engine], setup, open_it, open_it):
            assert out.get() == inner.get() == open_it(e), k
            assert _open_fds() == setup.fds + 1, k  # type: ignore[attr-defined]
            n += 1
        assert n > 10
        _forget_readers(eng)
        np.testing.assert_array_equal(f.at(3)["a"][5:9], _expected(3)[5:9])


def test_threads_reading_many_steps_of_one_file_read_every_value(steps_file):
    """Threads of a pool read parts of blocks (boxes that start inside one) of every step
    of one open file, more steps than its catalog keeps, with a thread switch as often as
    CPython makes one: every value is the one written, and nothing raises (tables searched
    as their sorted order was made, checksums as their pointer was, steps kept by two
    threads at once).  By chance: the tests of each switch are in test_catalog.py."""

    def read(f, k: int, lo: int) -> tuple[int, int, bool]:
        got = f.at(k)["a"][lo : lo + 3, 1:7]
        return k, lo, bool(np.array_equal(got, _expected(k)[lo : lo + 3, 1:7]))

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for rnd in range(3):
            with lamina.open(steps_file) as f, ThreadPoolExecutor(8) as pool:
                jobs = [
                    pool.submit(read, f, (7 * j + rnd) % NSTEPS, (5 * j + rnd) % 60 + 1)
                    for j in range(6 * NSTEPS)
                ]
                wrong = [(k, lo) for k, lo, ok in (j.result() for j in jobs) if not ok]
                assert not wrong, f"round {rnd}: wrong values at (step, row) {wrong[:5]}"
    finally:
        sys.setswitchinterval(before)


def test_parsed_trees_asked_for_their_halo_by_threads_at_once_do_not_deadlock():
    """Each tree's halo, inputs and depth are computed at first use: with functools'
    cached_property, on Python 3.11 a lock per property shared by every instance of a
    class, taken in both orders by nested nodes (Compare, then Call; Call, then Ref):
    threads parsing queries and quantities at once hung for ever (every run here)."""
    import threading
    import time

    from lamina.derived import parse

    def work(k: int) -> None:
        for i in range(200):
            text = "abs(x) < 0.1" if (k + i) % 2 else "magnitude(x, y, z)"
            assert parse(text, mode="predicate" if "<" in text else "expr").halo is not None

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(3):
            threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(8)]
            for t in threads:
                t.start()
            end = time.monotonic() + 60
            for t in threads:
                t.join(max(0.0, end - time.monotonic()))
            assert not any(t.is_alive() for t in threads), "threads asking for halos hung"
    finally:
        sys.setswitchinterval(before)


@pytest.fixture(scope="module")
def derived_file(tmp_path_factory) -> str:
    """Inputs of two dtypes and quantities computed on read (a scalar of each, a vector)."""
    path = str(tmp_path_factory.mktemp("derived") / "d.lam")
    with lamina.open(path, "w", durable=False) as f:
        for name, dt in (("x", "f8"), ("k", "i2"), ("vx", "f8"), ("vy", "f8"), ("vz", "f8")):
            f.create_dataset(name, (40, 30, 4), dt)
        f.derive("a", "x + k", "expression")
        f.derive("b", "k * 2 + x", "expression")
        f.derive("w", "curl(vx, vy, vz)", "expression")
        for s in range(3):
            with f.step():
                for i0 in range(0, 40, 10):
                    for j0 in range(0, 30, 15):
                        box = np.s_[i0 : i0 + 10, j0 : j0 + 15]
                        for name, v in _derived_inputs(s).items():
                            f[name][box] = v[box]
    return path


def _derived_inputs(s: int) -> dict[str, np.ndarray]:
    i, j, _ = np.indices((40, 30, 4))
    return {
        "x": 1000.0 * s + i + j / 100,
        "k": ((7 * s + 3 * i - 2 * j) % 500).astype(np.int16),
        "vx": np.sin(i / 7 + s) * j,
        "vy": np.cos(j / 5) * i,
        "vz": 0.5 * i * j + s,
    }


def test_threads_reading_quantities_computed_on_read(derived_file):
    """Quantities kept as their expression, read from the threads of a pool (dask's
    scheduler reads so): their inputs are read into scratch buffers shared by the layer,
    and vectors' components are kept for the next read. An index into the buffers chosen,
    then popped by another thread, handed out one too small or of another dtype
    (ValueError, IndexError, ShapeError), and a vector evicted between its check and its
    read was a KeyError. Every value is checked against a single-threaded read."""
    with lamina.open(derived_file) as f:
        want = {(n, s): f.at(s)[n][...] for n in ("a", "b", "w/x", "w/y", "w/z") for s in range(3)}
    np.testing.assert_array_equal(want[("a", 1)], _derived_inputs(1)["x"] + _derived_inputs(1)["k"])

    def read(f, j: int) -> bool:
        n = ("a", "b", "w/x", "w/y", "w/z")[j % 5]
        s, i0, j0 = j % 3, (3 * j) % 30, (7 * j) % 20
        got = f.at(s)[n][i0 : i0 + 9, j0 : j0 + 8]
        return bool(np.array_equal(got, want[(n, s)][i0 : i0 + 9, j0 : j0 + 8]))

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(5):
            with lamina.open(derived_file) as f, ThreadPoolExecutor(8) as pool:
                assert all(pool.map(lambda j, f=f: read(f, j), range(120)))
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("rows", [(4, 8), (5, 7)], ids=["block", "part"])
def test_bytes_read_by_two_threads_at_once_are_all_counted(steps_file, rows):
    """Two threads reading one open file at once, the second switched to at any point of
    the first's read (a whole block, part of one): ``bytes_read`` counts
    both reads.  Added to from two threads without a lock, the count lost one of them
    when the switch fell between its load and its store."""
    from lamina.engines import block as block_engine
    from lamina.geometry import Box

    box = Box((rows[0], 0), (rows[1], 8))
    with lamina.open(steps_file) as f:
        eng = f.engine.stack()[-1]

        def read(e) -> None:
            e.get("a", box, 1, np.empty(box.shape))

        before = eng.bytes_read
        read(eng)
        one = eng.bytes_read - before
        assert one > 0

        def setup():
            setup.before = eng.bytes_read  # type: ignore[attr-defined]
            return eng

        n = 0
        modules = [block_engine, native_engine]
        for k, out, inner, e in interleavings(modules, setup, read, read, thread=True):
            out.get()
            inner.get()
            assert e.bytes_read - setup.before == 2 * one, k  # type: ignore[attr-defined]
            n += 1
        assert n > 10


@pytest.mark.parametrize("first", ["records", "values"])
def test_a_file_closed_while_another_thread_reads_waits_for_the_read(
    steps_file, monkeypatch, first
):
    """A close in one thread while another reads (a step's block records from lamina.meta,
    or values from a subfile): the close waits for the read, which gives every value, and
    reads after it raise ValueError (as h5py's lock orders them).  Closed under the read,
    its descriptor gave EBADF, or another file's bytes once its number was reused."""
    k = NSTEPS - 1
    f = lamina.open(steps_file)
    if first == "values":
        f.at(k)["a"].blocks()  # the step's records read: the read paused reads values
    entered, go = threading.Event(), threading.Event()
    pread = native_engine._pread_into

    def paused(*args, **kwargs):
        if not entered.is_set():
            entered.set()
            go.wait(30)
        return pread(*args, **kwargs)

    monkeypatch.setattr(native_engine, "_pread_into", paused)
    with ThreadPoolExecutor(1) as pool:
        read = pool.submit(lambda: f.at(k)["a"][...])
        assert entered.wait(30)
        closer = threading.Thread(target=f.close)
        closer.start()
        closer.join(0.3)
        assert closer.is_alive(), "the file was closed under a read"
        go.set()
        closer.join(30)
        assert not closer.is_alive()
        np.testing.assert_array_equal(read.result(), _expected(k))
    with pytest.raises(ValueError, match="is closed"):
        f.at(0)["a"][...]
