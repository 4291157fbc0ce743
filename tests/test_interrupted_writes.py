"""Ctrl-C (KeyboardInterrupt) at an unlucky point of a write or a close, caught as a REPL, a
notebook or ``try: ... except KeyboardInterrupt: f.close()`` catches it: the file stays
readable, no step is committed with blocks missing, and a close cut short can be made again.

The interrupt is injected where a signal's handler would raise it: at the entry of a function
the write or the close calls, once (the function is put back first).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

import lamina  # noqa: E402
from lamina.engines import staging
from lamina.errors import StepError

pytestmark = pytest.mark.usefixtures("fast_native")


def interrupt_once(monkeypatch, owner, name: str, exc: type[BaseException] = KeyboardInterrupt):
    """``owner.name`` raises *exc* the first time it is called, then is itself again."""
    real = getattr(owner, name)

    def cut(*args, **kwargs):
        monkeypatch.setattr(owner, name, real)
        raise exc("injected")

    monkeypatch.setattr(owner, name, cut)


def first_step(path: str, io: str = "sync", shape=(64, 1024)) -> lamina.File:
    """A writer with step 0 committed (dataset "x" all 0), no step open."""
    f = lamina.open(path, "w", io=io, durable=False)
    x = f.create_dataset("x", shape, "f8")
    with f.step():
        x[...] = 0.0
    return f


def steps_of(path: str) -> list[float]:
    """Each committed step's one value of dataset "x" (every step written whole, one value),
    after checking that the writer closed the file."""
    with lamina.open(path) as r:
        assert r.engine.writer_closed
        out = []
        for k in range(r.steps):
            v = r.at(k)["x"][...]
            assert (v == v.flat[0]).all(), f"step {k} has blocks missing"
            out.append(float(v.flat[0]))
        return out


# ------------------------------------------------------------------ a write cut short


def _small_rows(x, value: float) -> None:
    for i in range(x.shape[0]):  # 4 KiB blocks: staged
        x.write(np.full((1, x.shape[1]), value), (i, 0))


@pytest.mark.parametrize(
    "where",
    [
        "PutLog._add_box",  # a large block: written, its box not logged yet
        "Chunk.add",  # a small block: its columns logged, not its bytes
        "PutLog.add_staged",
        "PutLog.stage_run",  # a batch: its rows logged, not staged
    ],
)
def test_a_write_cut_short_then_close_keeps_the_file_and_drops_the_step(
    native_path, monkeypatch, where
):
    """The close of a step a write into was cut short wrote a record the reader refused
    ("record 1: block section of dataset 'x' ... is inconsistent": the whole file, step 0
    included, could not be opened), raised a bare IndexError, or committed the step with
    blocks missing (they read as the fill value). Now the step is dropped, as an error out
    of ``with lamina.open(...)`` drops it, and the file closes properly."""
    owner, name = where.split(".")
    f = first_step(native_path, shape=(64, 512))
    x = f["x"]
    f.begin_step()
    interrupt_once(monkeypatch, getattr(staging, owner), name)
    with pytest.raises(KeyboardInterrupt):
        if name == "stage_run":
            corners = np.stack([np.arange(64), np.zeros(64, dtype=np.int64)], 1)
            x.write_blocks(np.ones((64, 1, 512)), corners)
        elif name == "_add_box":
            x[...] = 1.0
        else:
            _small_rows(x, 1.0)
    f.close()
    assert steps_of(native_path) == [0.0]
    with lamina.open(native_path, "a") as g:  # the file goes on, in this process too
        with g.step():
            g["x"][...] = 2.0
    assert steps_of(native_path) == [0.0, 2.0]


def test_end_step_after_a_write_cut_short_raises_and_drops_the_step(native_path, monkeypatch):
    """end_step refuses the step (StepError), as when a put failed; the next step commits."""
    f = first_step(native_path)
    x = f["x"]
    f.begin_step()
    interrupt_once(monkeypatch, staging.PutLog, "_add_box")
    with pytest.raises(KeyboardInterrupt):
        x[...] = 1.0
    x[...] = 1.0  # written again in full: the step still lacks nothing, but is refused
    with pytest.raises(
        StepError, match="step 1 .* is not committed: a write into it .* interrupted"
    ):
        f.end_step()
    assert f.steps == 1 and not f.engine.in_step
    with f.step():
        x[...] = 2.0
    f.close()
    assert steps_of(native_path) == [0.0, 2.0]


def test_a_write_cut_short_in_a_step_of_its_own_is_dropped(native_path, monkeypatch):
    """A write outside begin_step opens a step (committed by close): cut short, it is not."""
    f = first_step(native_path)
    interrupt_once(monkeypatch, staging.PutLog, "_add_box")
    with pytest.raises(KeyboardInterrupt):
        f["x"][...] = 1.0
    f.close()
    assert steps_of(native_path) == [0.0]


def test_a_put_log_left_inconsistent_is_never_committed(native_path, monkeypatch):
    """An error between the parts of a block's logging (not an interrupt: the write raises it
    as its own) left a log whose record no reader can open; the commit refuses it instead."""
    f = first_step(native_path)
    x = f["x"]
    f.begin_step()
    interrupt_once(monkeypatch, staging.PutLog, "_add_box", RuntimeError)
    with pytest.raises(RuntimeError, match="injected"):
        x[:32] = 1.0
    x[32:] = 1.0
    with pytest.raises(StepError, match="left inconsistent by a write that failed partway"):
        f.end_step()
    with f.step():
        x[...] = 2.0
    f.close()
    assert steps_of(native_path) == [0.0, 2.0]


# ------------------------------------------------------------------ before the engine, or above it

IOS = ["sync", "async"]


def _cut_write(monkeypatch, f, how: str) -> None:
    """A write of dataset "x" (all 1.0) into the open step, cut short by an interrupt: in the
    API's part of the call (*how*: ``write``, ``setitem``, ``lend``), before anything reaches
    the engine, or in the background layer's copy (``copy``)."""
    import lamina.api.dataset as dataset_mod
    from lamina.layers.background.step import Pool

    x = f["x"]
    if how == "write":
        interrupt_once(monkeypatch, dataset_mod, "box_of")
    elif how == "setitem":
        interrupt_once(monkeypatch, dataset_mod, "parse")
    elif how == "lend":
        interrupt_once(monkeypatch, staging.LentBlocks, "take")
    else:
        interrupt_once(monkeypatch, Pool, "take")
    with pytest.raises(KeyboardInterrupt):
        if how == "setitem":
            x[...] = 1.0
        elif how == "lend":
            x.write(np.ones((1, x.shape[1])), (0, 0), copy=False)
        else:
            x.write(np.ones(x.shape), (0, 0))


@pytest.mark.parametrize(
    "io, how",
    [(io, how) for io in IOS for how in ("write", "setitem")]
    + [("sync", "lend"), ("async", "copy")],
)
def test_a_write_cut_short_anywhere_in_the_call_is_not_committed_by_close(
    native_path, monkeypatch, io, how
):
    """An interrupt landing in ``ds.write`` or ``ds[...] =`` before the engine's put (or in the
    background layer's copy, under io='async') left the step without the block, and close
    committed it: blocks missing, read as the fill value (73 of 150 runs interrupted by a
    real SIGINT). The step is dropped instead, with either I/O mode."""
    f = first_step(native_path, io, shape=(64, 512))
    f.begin_step()
    _cut_write(monkeypatch, f, how)
    f.close()
    assert steps_of(native_path) == [0.0]


@pytest.mark.parametrize("io", IOS)
def test_end_step_refuses_a_step_a_write_into_was_cut_short(native_path, monkeypatch, io):
    """end_step raises StepError and drops the step, under io='async' too (the step went to
    the background and was committed without the block); the next step commits."""
    f = first_step(native_path, io, shape=(64, 512))
    f.begin_step()
    _cut_write(monkeypatch, f, "copy" if io == "async" else "write")
    with pytest.raises(
        StepError, match="step 1 .* is not committed: a write into it .* interrupted"
    ):
        f.end_step()
    with f.step():
        f["x"][...] = 2.0
    _cut_write(monkeypatch, f, "write")  # a step opened by the write: close drops it
    f.close()
    assert steps_of(native_path) == [0.0, 2.0]


def test_a_write_cut_short_before_begin_step_is_of_no_step(native_path, monkeypatch):
    """A write cut short before it opened a step, then begin_step: the step begun is a new
    one, committed as usual."""
    f = first_step(native_path)
    _cut_write(monkeypatch, f, "write")
    with f.step():
        f["x"][...] = 1.0
    f.close()
    assert steps_of(native_path) == [0.0, 1.0]


@pytest.mark.parametrize("io", IOS)
def test_a_step_dropped_by_its_with_block_takes_the_write_cut_short_along(
    native_path, monkeypatch, io
):
    """``with f.step()`` drops its step at the interrupt: the write cut short was of that
    step, and the step a later write opens is committed as usual."""
    import lamina.api.dataset as dataset_mod

    f = first_step(native_path, io)
    interrupt_once(monkeypatch, dataset_mod, "box_of")
    with pytest.raises(KeyboardInterrupt):
        with f.step():
            f["x"].write(np.ones(f["x"].shape), (0, 0))
    f["x"][...] = 1.0
    f.close()
    assert steps_of(native_path) == [0.0, 1.0]


@pytest.mark.parametrize("io", IOS)
def test_a_write_cut_short_with_derived_quantities(native_path, monkeypatch, io):
    """With a derived quantity, close ended the step left open itself (computing its
    quantities): a step a write into was cut short is left to the engine, which drops it."""
    f = first_step(native_path, io, shape=(64, 512))
    f.derive("y", "x * 2")
    with f.step():
        f["x"][...] = 1.0
    f.begin_step()
    _cut_write(monkeypatch, f, "write")
    f.close()
    assert steps_of(native_path) == [0.0, 1.0]
    with lamina.open(native_path) as r:
        assert float(r.at(1)["y"][0, 0]) == 2.0


# ------------------------------------------------------------------ a close cut short


def _records(path: str) -> int:
    """How many records the file's commit log holds."""
    import os

    from lamina.engines.native import format as fmt

    commit, meta = os.path.join(path, fmt.COMMIT_NAME), os.path.join(path, fmt.META_NAME)
    with open(commit, "rb") as fh:
        entries, _, _ = fmt.parse_commits(fh.read(), os.path.getsize(meta))
    return len(entries)


NATIVE, BLOCK, LOCK = (
    "lamina.engines.native.engine",
    "lamina.engines.block",
    "lamina.engines.native.lock",
)
CLOSE_POINTS = {
    # before the first record of the close is written (the metadata's, or the close record)
    "meta-record": (NATIVE, "NativeEngine", "_write_record", True),
    "close-record": (NATIVE, "NativeEngine", "_write_record", False),
    # after it, while it is applied
    "meta-applied": (BLOCK, "BlockEngine", "_committed", True),
    "close-applied": (BLOCK, "BlockEngine", "_committed", False),
    # as the files are closed, the lock last
    "storage": (NATIVE, "NativeEngine", "_close_storage", True),
    "lock": (LOCK, "WriterLock", "release", True),
}


@pytest.mark.parametrize("io", IOS)
@pytest.mark.parametrize("where", sorted(CLOSE_POINTS))
def test_a_close_cut_short_is_completed_by_a_close_again(native_path, monkeypatch, where, io):
    """A close cut short marked the file closed all the same: a close again returned at once,
    leaving no close record (an interrupt before it) or the writer lock held for good (an
    interrupt as it was released: LockError at every open for writing in this process). The
    close again completes what was left, and commits nothing twice."""
    import importlib

    module, cls, name, meta = CLOSE_POINTS[where]
    f = first_step(native_path, io)
    with f.step():
        f["x"][...] = 1.0
    if meta:
        f.attrs["note"] = "pending"  # a metadata record at close
    f.wait()
    interrupt_once(monkeypatch, getattr(importlib.import_module(module), cls), name)
    with pytest.raises(KeyboardInterrupt):
        f.close()
    f.close()
    assert f.engine.closed
    assert steps_of(native_path) == [0.0, 1.0]
    assert _records(native_path) == 3 + meta  # two steps, the metadata, one close record
    with lamina.open(native_path, "a") as g:  # not locked in this process
        assert g.attrs.get("note") == ("pending" if meta else None)


def test_a_close_cut_short_in_the_commit_of_the_open_step(native_path, monkeypatch):
    """An interrupt in the commit of the step close ends, before its record: the step is
    dropped (as an end_step cut short there drops it), and a close again closes the file."""
    from lamina.engines.native.engine import NativeEngine

    f = first_step(native_path)
    f["x"][...] = 1.0  # a step opened by the write, committed by close
    interrupt_once(monkeypatch, NativeEngine, "_write_record")
    with pytest.raises(KeyboardInterrupt):
        f.close()
    f.close()
    assert steps_of(native_path) == [0.0]


EXIT_AFTER_CTRL_C = r"""
import shutil, signal, sys, threading, time
import numpy as np, lamina
path, io, name = sys.argv[1], sys.argv[2], sys.argv[3]
main = threading.main_thread().ident
def watch():  # Ctrl-C the moment lamina's thread of that name comes up
    while not any(t.name.startswith(name) for t in threading.enumerate()):
        time.sleep(0)
    signal.pthread_kill(main, signal.SIGINT)
threading.Thread(target=watch, daemon=True).start()
try:
    with lamina.open(path, "w", io=io, durable=False) as f:
        f.create_dataset("u", (128, 64, 32), "f8")
        for k in range(20):
            with f.step():
                f["u"][...] = np.full((128, 64, 32), float(k))
except KeyboardInterrupt:
    pass
with lamina.open(path) as g:
    print("steps", g.steps, flush=True)
print("end of program", flush=True)
"""


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs pthread_kill")
@pytest.mark.parametrize("io, name", [("async", "lamina-buffers"), ("sync", "lamina-stats")])
def test_ctrl_c_as_a_worker_thread_starts_leaves_a_program_that_exits(tmp_path, io, name):
    """A thread pool starts its worker at the first submit and registers it for Python's exit
    after starting it: a KeyboardInterrupt between the two left a thread that exit waited for
    for ever (every run, Ctrl-C sent as lamina's first worker came up)."""
    res = subprocess.run(
        [sys.executable, "-c", EXIT_AFTER_CTRL_C, str(tmp_path / "f.lam"), io, name],
        env=mu.child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "end of program" in res.stdout, res.stdout + res.stderr
