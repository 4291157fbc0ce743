"""Background I/O (``io='async'``) under mpiexec.

``background.py fault PATH put|commit``
    two ranks; rank 1's replayed put (``put``) or its part of the commit
    (``commit``: the native engine's block move) fails in step 3 on the
    background thread.  Both ranks must raise the error at the same call,
    naming step 3; the file goes on from step 3 and reads back.
``background.py leave PATH``
    two ranks; three steps are in flight (the background thread is slow)
    when rank 1 fails on its own inside ``with f:``; rank 0 hears it at
    its next ``end_step`` (a RemoteError that says rank 1 left), and the
    three steps both ranks ended are in the file.
``background.py stress PATH STEPS``
    any number of ranks; random compute times (seeded), a small budget so
    that end_step waits, reads of committed steps and of steps in flight,
    a dataset defined while steps are in flight, ``wait``, a stored
    derived quantity with a stencil (halo exchange on the background
    thread), and a second file written synchronously in the same loop,
    whose derived values must be the same.  Every value is checked
    at the end.

``background.py collective PATH STEPS``
    any number of ranks; after each step, a collective read of step 0
    while the step just ended is in flight, rank 1 handing its steps to
    its background thread late (so that its read would come first on the
    inner communicator, before its share of the step's commit).  No rank
    may hang, and every read and step must hold what was written.

``background.py auto PATH STEPS``
    any number of ranks under ``io='auto'``; rank 0 computes nothing
    between steps, the others sleep (their compute phases differ, so do
    their predictions): every rank must write every step the same way (one
    agreed mode per step), and the file reads back.

``background.py race PATH``
    two ranks; rank 1's replayed put fails in step 3.  Rank 1 hands step 4
    to its background thread before that thread has failed step 3 (so it
    is queued when the failure cancels what is queued), rank 0 only once
    its thread has failed step 3 (queued after the cancelling): both must
    cancel step 4 (rank 0 wrote it and waited forever in its commit), raise
    the failure at the next collective call naming step 3, and go on.
``background.py implicit PATH``
    two ranks; rank 1's replayed put fails in step 2; rank 0 alone opens
    the next step with a put (a step opened by a put), and both ranks'
    ``end_step`` raises the failure.  The file must go on: every rank counts
    the step dropped there, not only the one that had it open (later steps
    were refused as "a step apart").
``background.py ahead PATH``
    any number of ranks reading with ``io='async'``: rank 0 has a box read
    ahead (``ds.prefetch``), then every rank reads it collectively; and
    ``iter_steps(prefetch=True)`` with a collective read of a box per rank,
    one of them too large to be read ahead.  A collective read is one on
    every rank (rank 0 took its read-ahead array and left the others in
    the collective).

``background.py switches PATH STEPS SEED DISCARD``
    any number of ranks under ``io='auto'`` (a third of the seeds:
    ``'async'``), each rank's model picking sync or async at random
    (seeded) so that the agreed mode switches between steps (steps written
    directly and in the background), with random compute times, and
    between steps, chosen alike on every rank: collectives of the
    application, ``wait``, ``flush``, collective and independent reads,
    definitions, implicit steps (a put, then ``end_step``), steps that fail
    on every rank (a box out of bounds), and a second file written
    synchronously.  With DISCARD 1, one rank drops one step on its own (an
    error inside ``with f.step()``) and the program goes on writing steps
    (with waits, flushes, reads and definitions for half of the seeds),
    then closes: the ranks are a call apart until a point or the close
    pairs them again, so calls may raise (lamina errors only), but none
    may hang.  Every step ended on every rank before that must be in the
    file, and every step after it must hold one program step's values on
    every rank.

``background.py apart PATH IO MODE OP``
    two ranks; rank 0 drops step 1 of four on its own (an error inside
    ``with f.step()``).  IO is ``async`` or ``auto`` with the model's
    choice forced to MODE (``sync``: steps written directly; ``async``).
    OP ``close``: the program closes after step 1 (rank 0 closes while
    rank 1 ends step 1); ``wait``, ``flush``, ``define``, ``read`` (a
    collective read): the program makes that call after each step, then
    writes steps 2 and 3 and closes; ``join``: as ``wait``, rank 1 ending
    step 1 without beginning it or writing; ``first``: steps opened by a
    put, a wait after each, rank 0 dropping the first (before io='auto'
    judged it: it owes the others that judgement), steps 1-3 kept.  Rank 1's end of step 1 must raise
    CollectiveMismatchError and be dropped there too; rank 0's call must
    wait for rank 1's, so that the ranks pair again: steps 2 and 3 are
    committed and both closes succeed.  Nothing hangs.
``background.py joined PATH MODE``
    two ranks under ``io='auto'`` with the model's choice forced to MODE:
    a first step rank 0 begins and rank 1 opens by a put (the model's
    first judgement made at rank 0's begin_step and rank 1's end_step),
    a step rank 0 ends without beginning it or writing (legal: it joins
    the step), one rank 0 writes without ``begin_step`` (opened by the
    put) while rank 1 begins it, and one both begin.  With steps written
    directly (``sync``) the ranks' end_step went different ways (direct
    on rank 1, in the background on rank 0) and waited for each other.

Prints ``OK`` on rank 0 when everything held (``RAISED`` on each rank that
raised the injected error).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import lamina
from lamina import comm as comm_mod
from lamina.perf.asyncmodel import DECISIONS_KEY, read_decisions

ROWS = 4  # rows of x per rank
COLS = 6


def block(k: int, rank: int) -> np.ndarray:
    base = np.arange(ROWS * COLS, dtype=np.float64).reshape(ROWS, COLS) + rank * ROWS * COLS
    return base + 1000.0 * k


def whole(k: int, size: int) -> np.ndarray:
    return np.concatenate([block(k, r) for r in range(size)])


def fault(path: str, where: str) -> None:
    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    f = lamina.open(path, "w", io="async")
    ds = f.create_dataset("x", (ROWS * size, COLS), "f8")
    native = f.engine.stack()[-1]
    bad = 3
    if rank == 1 and where == "put":
        orig_put = native.put

        def put(name, box, arr, copy=True):
            if len(native.catalog.steps) == bad:
                raise OSError("injected put failure")
            orig_put(name, box, arr, copy)

        native.put = put
    elif rank == 1:
        orig_move = native._move

        def move(heads):
            if len(native.catalog.steps) == bad:
                raise OSError("injected move failure")
            return orig_move(heads)

        native._move = move
    raised = None
    try:
        for k in range(7):
            with f.step():
                ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
            time.sleep(0.01)
        f.wait()
    except OSError as e:
        raised = e
    assert raised is not None, "the injected failure was never raised"
    text = str(raised)
    assert "background step 3 " in text and "not committed" in text, text
    assert "injected" in text and "rank 1" in text, text
    if where == "put":
        assert "dataset 'x'" in text, text
    os.write(1, f"RAISED rank {rank}: {text}\n".encode())  # one write: rank 0's OK never cuts it
    # every rank raised at the same call: the file goes on, together, from step 3
    assert f.steps == bad, f.steps
    native.put = type(native).put.__get__(native)
    native._move = type(native)._move.__get__(native)
    with f.step() as k:
        assert k == bad
        ds[rank * ROWS : (rank + 1) * ROWS, :] = block(99, rank)
    f.close()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == bad + 1, r.steps
            for k in range(bad):
                np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, size))
            np.testing.assert_array_equal(r.at(bad)["x"][...], whole(99, size))
        print("OK", flush=True)


def leave(path: str) -> None:
    comm = comm_mod.world()
    rank = comm.rank
    f = lamina.open(path, "w", io="async")
    native = f.engine.stack()[-1]
    orig = native.end_step

    def slow() -> None:
        time.sleep(0.1)
        orig()

    native.end_step = slow
    try:
        with f:
            ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
            for k in range(5):
                with f.step():
                    ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
                if k == 2 and rank == 1:
                    raise RuntimeError("rank 1 fails on its own")
    except RuntimeError as e:
        text = str(e)
        assert ("rank 1 fails on its own" in text) if rank == 1 else ("rank 1 left" in text), text
    else:
        raise AssertionError("no error")
    assert f.engine.closed
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == 3, r.steps
            for k in range(3):
                np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, comm.size))
        print("OK", flush=True)


def stress(path: str, steps: int) -> None:
    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng([7, rank])
    step_bytes = ROWS * COLS * 8 + 3 * 8
    f = lamina.open(path, "w", io="async", max_inflight_bytes=3 * step_bytes)
    g = lamina.open(path + "-sync", "w", io="sync")
    ds = f.create_dataset("x", (ROWS * size, COLS), "f8")
    gs = g.create_dataset("x", (ROWS * size, COLS), "f8")
    # a stencil: its halo exchange runs on the background thread, the sync file's in the program
    f.derive("lap", "laplacian(x * x)", "store")
    g.derive("lap", "laplacian(x * x)", "store")
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    y = None
    for k in range(steps):
        time.sleep(float(rng.uniform(0, 0.01)))  # compute
        with f.step():
            ds[mine, :] = block(k, rank)
            if y is not None:
                y[rank * 3 : rank * 3 + 3] = [k, k, k]
            if rank == 0:
                f.attrs["k"] = k
        with g.step():
            gs[mine, :] = block(k, rank)
        what = int(rng.integers(0, 5))
        if what == 0:  # the step just ended (maybe in flight): waits for it
            np.testing.assert_array_equal(ds[mine, :], block(k, rank))
        elif what == 1 and k >= 2:  # a step long committed, another rank's rows
            other = (rank + 1) % size
            view = f.at(k - 2)["x"]
            np.testing.assert_array_equal(
                view[other * ROWS : (other + 1) * ROWS, :], block(k - 2, other)
            )
        elif what == 2:
            np.testing.assert_array_equal(gs[mine, :], block(k, rank))
        if k % 11 == 5:
            f.wait()
        if k == steps // 2:  # collective metadata while steps are in flight
            y = f.create_dataset("y", (3 * size,), "i8")
    stats = f.io_stats
    g.close()
    f.close()
    assert stats["steps_background"] >= 1, stats
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == steps, r.steps
            assert r.attrs["k"] == steps - 1
            for k in range(steps):
                np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, size))
            last = r.at(steps - 1)["y"][...]
            np.testing.assert_array_equal(last, np.full(3 * size, steps - 1))
            with lamina.open(path + "-sync", "r", comm=comm_mod.self_comm()) as s:
                for k in range(steps):
                    np.testing.assert_array_equal(r.at(k)["lap"][...], s.at(k)["lap"][...])
        print(f"OK {stats}", flush=True)


def collective(path: str, steps: int) -> None:
    import threading

    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    f = lamina.open(path, "w", io="async")
    ds = f.create_dataset("x", (ROWS * size, COLS), "f8")
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    with f.step():
        ds[mine, :] = block(0, rank)
    f.wait()
    layer = f.engine
    if rank == 1:
        submit = layer._submit
        layer._submit = lambda step: threading.Timer(0.05, submit, [step]).start()
    for k in range(1, steps):
        with f.step():
            ds[mine, :] = block(k, rank)
        got = ds.read(np.s_[:, :], step=0, collective=True)
        np.testing.assert_array_equal(got, whole(0, size))
    f.close()
    with lamina.open(path, "r") as r:
        assert r.steps == steps, r.steps
        for k in range(steps):
            np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, size))
    if rank == 0:
        print("OK", flush=True)


def auto(path: str, steps: int) -> None:
    comm = comm_mod.world()
    with lamina.open(path, "w", io="auto") as f:
        f.create_dataset("x", (ROWS * comm.size, COLS), np.float64)
        for k in range(steps):
            with f.step():
                f["x"][ROWS * comm.rank : ROWS * (comm.rank + 1)] = block(k, comm.rank)
            if comm.rank:
                time.sleep(0.02)  # a compute phase on every rank but 0
            if k == steps - 2:  # rank 0's decisions went into the file with the steps, alike
                f.wait()
                ext = f.engine.catalog.ext
                parts = sorted((key, v) for key, v in ext.items() if key.startswith(DECISIONS_KEY))
                if not parts or any(p != parts for p in comm.allgather(parts)):
                    raise AssertionError(f"rank {comm.rank}: decision records {parts}")
        modes = [d["mode"] for d in f.io_stats["decisions"]]
    everyone = comm.allgather(modes)
    if any(m != everyone[0] for m in everyone) or len(modes) != steps:
        raise AssertionError(f"ranks wrote steps differently: {everyone}")
    with lamina.open(path, "r") as f:
        for k in range(steps):
            np.testing.assert_array_equal(f.at(k)["x"][...], whole(k, comm.size))
        got, complete = read_decisions(f.engine.catalog.ext)
        assert complete and [d["mode"] for d in got] == modes, (got, modes)
    if comm.rank == 0:
        print(f"OK {modes}", flush=True)


def _fail_put_at(native, bad: int) -> None:
    """*native*'s put raises OSError once, when the step being written is step *bad*."""
    orig = native.put
    fired = []

    def put(name, box, arr, copy=True):
        if len(native.catalog.steps) == bad and not fired:
            fired.append(True)
            raise OSError("injected put failure")
        orig(name, box, arr, copy)

    native.put = put


def _until(what: str, ready, seconds: float = 30.0) -> None:
    t0 = time.monotonic()
    while not ready():
        if time.monotonic() - t0 > seconds:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.001)


def race(path: str) -> None:
    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    bad = 3
    f = lamina.open(path, "w", io="async")
    ds = f.create_dataset("x", (ROWS * size, COLS), "f8")
    layer = f.engine
    if rank == 1:
        _fail_put_at(layer.stack()[-1], bad)
    submit = layer._submit

    def late(step):  # rank 0: step 4 queued only once its thread has failed step 3
        if step.index == bad + 1:
            _until("the failure of step 3", lambda: layer.stats.steps_failed)
        submit(step)

    if rank == 0:
        layer._submit = late
    raised = []
    for k in range(bad + 4):
        try:
            with f.step():
                ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
        except OSError as e:
            raised.append((k, str(e)))
    layer._submit = submit
    assert len(raised) == 1, raised
    text = raised[0][1]
    assert "background step 3 " in text and "rank 1" in text, text
    assert "cancelled" in text and "4" in text, text
    f.close()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps >= bad + 1, r.steps  # the steps after the failure go on
            for k in range(bad):
                np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, size))
            np.testing.assert_array_equal(r.at(r.steps - 1)["x"][...], whole(bad + 3, size))
        print(f"OK raised at step {raised[0][0]}: {text}", flush=True)


def implicit(path: str) -> None:
    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    f = lamina.open(path, "w", io="async")
    ds = f.create_dataset("x", (size, COLS), "f8")
    layer = f.engine
    if rank == 1:
        _fail_put_at(layer.stack()[-1], 2)
    for k in range(3):
        with f.step():
            ds[rank] = block(k, rank)[0]
    _until("the failure of step 2", lambda: layer.stats.steps_failed)
    if rank == 0:
        ds[0] = block(50, 0)[0]  # a step opened by a put, on rank 0 alone
    try:
        f.end_step()
        raise AssertionError("the failure of step 2 was not raised")
    except OSError as e:
        assert "background step 2 " in str(e), e
    assert f.steps == 2, f.steps
    for k in (3, 4):
        with f.step():
            ds[rank] = block(k, rank)[0]
        f.wait()
    assert f.steps == 4, f.steps
    f.close()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            want = [0, 1, 3, 4]
            assert r.steps == len(want), r.steps
            for s, k in enumerate(want):
                np.testing.assert_array_equal(
                    r.at(s)["x"][...], np.stack([block(k, q)[0] for q in range(size)])
                )
        print("OK", flush=True)


def ahead(path: str) -> None:
    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    rows = 16 * size
    if rank == 0:
        with lamina.open(path, "w", comm=comm_mod.self_comm()) as w:
            x = w.create_dataset("x", (rows, COLS), "f8")
            for k in range(4):
                with w.step():
                    x[...] = whole(k, 4 * size)
    comm.Barrier()
    with lamina.open(path, "r", io="async", max_inflight_bytes=8 * COLS * 8) as f:
        ds = f["x"]
        box = np.s_[0:4, :]
        if rank == 0:
            assert ds.prefetch(box, 1)
        got = ds.read(box, step=1, collective=True)
        np.testing.assert_array_equal(got, whole(1, 4 * size)[box])
        # a box per rank, rank 0's small enough to be read ahead, the others' not
        mine = np.s_[0:2, :] if rank == 0 else np.s_[2 * rank : rows, :]
        for view in f.iter_steps(prefetch=True, timeout=30):
            got = view["x"].read(mine, collective=True)
            np.testing.assert_array_equal(got, whole(view.index, 4 * size)[mine])
    if rank == 0:
        print("OK", flush=True)


def _force(mode) -> None:
    """io='auto' picks *mode* (a str, or a callable giving one) at every decision."""
    import lamina.perf.asyncmodel as am

    def predict(model, nbytes, ranks, t_comp=None, copied=None):
        # a rank that picks sync copies slowly: the ranks together (the slowest copy) pick
        # the background only where every rank does
        m = mode() if callable(mode) else mode
        t_copy = 1e-4 if m == "async" else 5e-3
        return am.Prediction(
            nbytes, ranks, 1e-3, t_copy, 1e-3, 2e-3, 1e-3 + t_copy, m, "none", 0.0, 1e-3
        )

    am.AsyncModel.predict = predict


def apart(path: str, io: str, mode: str, op: str) -> None:
    from lamina.errors import CollectiveMismatchError, LaminaError

    comm = comm_mod.world()
    rank = comm.rank
    _force(mode)
    f = lamina.open(path, "w", io=io)
    ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
    raised = []
    for k in range(2 if op == "close" else 4):
        try:
            if op == "join" and k == 1 and rank == 1:
                f.end_step()  # nothing to write: it joins the step (which rank 0 drops)
                continue
            if op == "first":  # steps opened by a put; rank 0 drops the first before it ends
                ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
                if k == 0 and rank == 0:
                    f.engine.discard_step()
                else:
                    f.end_step()
                continue
            with f.step():
                ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
                if k == 1 and rank == 0:
                    raise RuntimeError("rank 0 fails on its own")
        except (LaminaError, RuntimeError) as e:
            raised.append((k, e))
        finally:
            if op in ("join", "first"):
                f.wait()
        if op == "wait":
            f.wait()
        elif op == "flush":
            f.flush(durable=False)
        elif op == "define":
            f.create_dataset(f"y{k}", (comm.size,), "i8")
        elif op == "read":
            got = ds.read(np.s_[:, :], step=0, collective=True)
            np.testing.assert_array_equal(got, whole(0, comm.size))
    f.close()
    dropped = 0 if op == "first" else 1
    if op == "first" and rank == 0:
        assert raised == [], raised
    else:
        assert [k for k, _ in raised] == [dropped], raised
    if rank == 0:
        assert op == "first" or isinstance(raised[0][1], RuntimeError), raised
    else:  # its end of the dropped step met rank 0's next call
        assert isinstance(raised[0][1], CollectiveMismatchError), raised
        assert "the ranks are a call apart" in str(raised[0][1])
    comm.Barrier()
    if rank == 0:
        kept = {"close": [0], "first": [1, 2, 3]}.get(op, [0, 2, 3])
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == len(kept), r.steps
            for j, k in enumerate(kept):
                np.testing.assert_array_equal(r.at(j)["x"][...], whole(k, comm.size))
        print("OK", flush=True)


def apart_steps(path: str, io: str, end: str) -> None:
    """Rank 0 drops step 1 on its own; every rank then writes steps 2 and 3 (no other
    collective call), then *end* (``close``, or ``wait`` and close).  Those steps end one with
    the other ranks' step before it, and the engine refuses them (the ranks' step counts are
    apart): that failure is raised on every rank, and the ranks pair again at the wait or
    close, which closes the file properly on every rank with step 0 in it.  Before, the
    rank ahead met the others' last end_step at its wait or close, was judged to have made
    another call (it had begun a step since its drop), and let go of the file."""
    from lamina.errors import LaminaError, StepError

    comm = comm_mod.world()
    rank = comm.rank
    f = lamina.open(path, "w", io=io)
    ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
    raised = []
    for k in range(4):
        try:
            with f.step():
                ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
                if k == 1 and rank == 0:
                    raise RuntimeError("rank 0 fails on its own")
        except (LaminaError, RuntimeError) as e:
            raised.append((k, type(e).__name__))
    for call in (f.wait, f.close) if end == "wait" else (f.close,):
        try:
            call()
        except StepError as e:  # the refused steps' failure, raised once on each rank
            raised.append((call.__name__, type(e).__name__))
    names = [n for _, n in raised]
    assert names.count("StepError") == 1, raised  # the failure, once on every rank
    assert names.count("RemoteError") == 0, raised  # no rank let go of the file
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == 1, r.steps
            np.testing.assert_array_equal(r.at(0)["x"][...], whole(0, comm.size))
        print("OK", raised, flush=True)


def attrs_between(path: str, io: str) -> None:
    """Every rank sets attribute a = 1 in step 0; rank 0 alone sets a = 2 between steps and
    b in step 1, while step 0 is still in flight (slow to write: large enough blocks).  Each
    change goes with its own step's record: step 0 commits a = 1 from both ranks, step 1
    rank 0's a = 2.  They went with step 0's record on rank 0, beside rank 1's a = 1: the
    step failed, step 1 was cancelled, and the file kept no step."""
    comm = comm_mod.world()
    rank = comm.rank
    with lamina.open(path, "w", io=io) as f:
        d = f.create_dataset("d", (2 * comm.size, 1 << 16), "f8")
        with f.step():
            d[2 * rank : 2 * rank + 2] = rank + 1.0
            f.attrs["a"] = 1.0
        if rank == 0:
            f.attrs["a"] = 2.0
        assert f.attrs["a"] == (2.0 if rank == 0 else 1.0)  # the writing rank's, at once
        with f.step():
            d[2 * rank : 2 * rank + 2] = rank + 10.0
            if rank == 0:
                f.attrs["b"] = "in step 1"
                del f.attrs["a"]
                assert "a" not in f.attrs and f.attrs["b"] == "in step 1"
                f.attrs["a"] = 3.0
                assert dict(f.attrs) == {"a": 3.0, "b": "in step 1"}, dict(f.attrs)
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == 2, r.steps
            assert r.attrs["a"] == 3.0 and r.attrs["b"] == "in step 1", dict(r.attrs)
            for k, base in ((0, 1.0), (1, 10.0)):
                got = r.at(k)["d"][:, 0]
                want = np.repeat(np.arange(comm.size) + base, 2)
                np.testing.assert_array_equal(got, want)
        print("OK", flush=True)


def joined(path: str, mode: str) -> None:
    comm = comm_mod.world()
    rank = comm.rank
    _force(mode)
    with lamina.open(path, "w", io="auto") as f:
        ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
        mine = slice(rank * ROWS, (rank + 1) * ROWS)
        # the first step, begun on rank 0 (judged at its begin_step) and opened by the put on
        # rank 1 (judged at its end_step, with rank 0)
        if rank == 0:
            with f.step():
                ds[mine, :] = block(0, rank)
        else:
            ds[mine, :] = block(0, rank)
            f.end_step()
        if rank == 0:
            f.end_step()  # nothing written here: rank 0 joins rank 1's step
        else:
            with f.step():
                ds[mine, :] = block(1, rank)
        if rank == 0:
            ds[mine, :] = block(2, rank)  # opened by the put
            f.end_step()
        else:
            with f.step():
                ds[mine, :] = block(2, rank)
        with f.step():
            ds[mine, :] = block(3, rank)
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == 4, r.steps
            for k in (0, 2, 3):
                np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, comm.size))
            got = r.at(1)["x"][...]
            np.testing.assert_array_equal(got[ROWS:], whole(1, comm.size)[ROWS:])
        print("OK", flush=True)


def slowest(path: str) -> None:
    """io='auto' on ranks whose models disagree: rank 0 measured its steps in the background
    at 8 ms (it came to them first and waited for the others in their commits), the others
    at 2 ms; every rank computes 3 ms a step, copies in 0.3 ms and measured a step written
    directly at 2 ms.  Taken alone rank 0's model writes directly (5 against 8.3 ms), the
    others' in the background (3.3 against 5).  Together (the least I/O, the slowest
    compute and copy) the background pays: 3.3 against 5 ms, and every step goes there (a
    vote, or the largest of each rank's epochs, wrote them all directly); the first too."""
    import lamina.perf.asyncmodel as am

    comm = comm_mod.world()
    rank = comm.rank
    t_io = 8e-3 if rank == 0 else 2e-3

    def predict(model, nbytes, ranks, t_comp=None, copied=None):
        t_sync, t_async = 2e-3 + 3e-3, max(3e-3, t_io) + 0.3e-3
        mode = "async" if t_async < t_sync else "sync"
        return am.Prediction(
            nbytes, ranks, t_io, 0.3e-3, 3e-3, t_sync, t_async, mode, "none", 0.0, 2e-3
        )

    am.AsyncModel.predict = predict
    # the first step is judged on the last step this host wrote with as many ranks
    if rank == 0:
        h = am.History()
        h.add(am.IO_SERIES, ROWS * COLS * 8 * comm.size, comm.size, 1e-3)
        am.save_history(h, os.environ["LAMINA_HISTORY"])
    comm.Barrier()
    with lamina.open(path, "w", io="auto") as f:
        ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
        mine = slice(rank * ROWS, (rank + 1) * ROWS)
        for k in range(4):
            with f.step():
                ds[mine, :] = block(k, rank)
        f.wait()
        s = f.io_stats
    d = s["decisions"]
    assert s["steps_direct"] == 0 and s["steps_background"] == 4, s
    assert [x["mode"] for x in d] == ["async"] * 4, d
    assert all(x["t_async_ranks"] == 3.3e-3 and x["t_sync_ranks"] == 5e-3 for x in d), d
    assert all(x["predicted"] == ("sync" if rank == 0 else "async") for x in d), d
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            for k in range(4):
                np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, comm.size))
        print("OK", flush=True)


def shared(path: str) -> None:
    """io='auto', two files one after the other in one process, on a host without history:
    the first file's steps are measured (rank 0 keeps them, saved at the process's exit);
    the second file's first step is judged on them on every rank, so it goes to the
    background (every rank computes far longer than a step's I/O).  Each rank loaded the
    history itself before: the others had none, and the first step was written directly."""
    comm = comm_mod.world()
    rank = comm.rank
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    for name, steps in (("one", 3), ("two", 2)):
        with lamina.open(f"{path}.{name}", "w", io="auto") as f:
            ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
            for k in range(steps):
                # computing: far longer than a step's I/O even on a loaded machine (with 0.03 s,
                # a background step measured at 0.08 s under a full test run made the
                # second file's steps go directly)
                time.sleep(0.25)
                with f.step():
                    ds[mine, :] = block(k, rank)
            f.wait()
            s = f.io_stats
        if name == "one":  # nothing measured before: the first step written directly
            assert s["steps_direct"] >= 1, s
    assert s["steps_direct"] == 0 and s["steps_background"] == 2, s
    comm.Barrier()
    if rank == 0:
        with lamina.open(f"{path}.two", "r", comm=comm_mod.self_comm()) as r:
            for k in range(2):
                np.testing.assert_array_equal(r.at(k)["x"][...], whole(k, comm.size))
        print("OK", flush=True)


def empty(path: str) -> None:
    """io='auto' where the last rank writes nothing (it takes part in every step): its model
    predicts a step of no bytes, written in no time either way, which says nothing of the
    step's I/O.  The others' I/O decides: 8.4 ms a step, 3 ms of compute, so every step
    after the first goes to the background (taking the least I/O over the ranks, the
    empty rank's nothing, wrote every step directly)."""
    import lamina.perf.asyncmodel as am

    comm = comm_mod.world()
    rank = comm.rank
    writer = rank < comm.size - 1

    def predict(model, nbytes, ranks, t_comp=None, copied=None):  # 1 GB/s, copies at 10 GB/s
        t_io, t_copy = nbytes / 1e9, nbytes / ranks / 1e10
        t_sync, t_async = t_io + 3e-3, max(3e-3, t_io) + t_copy
        mode = "async" if t_async < t_sync else "sync"
        return am.Prediction(
            nbytes, ranks, t_io, t_copy, 3e-3, t_sync, t_async, mode, "none", 0.0, t_io
        )

    am.AsyncModel.predict = predict
    rows = (1 << 20) // COLS  # 8 MiB of float64 a writing rank
    with lamina.open(path, "w", io="auto") as f:
        ds = f.create_dataset("x", (rows * comm.size, COLS), "f8")
        for k in range(4):
            with f.step():
                if writer:
                    ds[rank * rows : (rank + 1) * rows, :] = k
        f.wait()
        d = f.io_stats["decisions"]
    assert [x["mode"] for x in d][1:] == ["async"] * 3, d
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == 4
            got = r.at(3)["x"][: rows * (comm.size - 1)]
            assert (got == 3).all()
        print("OK", flush=True)


def switches(path: str, steps: int, seed: int, discard: bool) -> None:
    from lamina.errors import BoundsError, LaminaError

    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    alike = np.random.default_rng([seed])  # choices every rank makes the same
    own = np.random.default_rng([seed, rank, 1])  # this rank's compute times and predictions

    _force(lambda: "async" if own.random() < 0.5 else "sync")
    where = int(alike.integers(steps // 3, steps)) if discard else -1
    who = int(alike.integers(0, size))
    calls = bool(alike.integers(0, 2))  # after the dropped step: other calls too, or steps only
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    f = lamina.open(path, "w", io=str(alike.choice(["auto", "auto", "async"])))
    g = lamina.open(path + "-sync", "w", io="sync")
    ds = f.create_dataset("x", (ROWS * size, COLS), "f8")
    gs = g.create_dataset("x", (ROWS * size, COLS), "f8")
    committed: list[int] = []  # the program steps every rank ended, in file order
    defined = 0
    for k in range(steps):
        time.sleep(float(own.uniform(0, 0.004)))  # compute
        if k >= where >= 0:
            # the ranks may be a call apart from here: calls of this file only (a collective
            # of the program's, or of the other file, would wait for a rank a call behind, as
            # in MPI); a rank behind raises, one ahead at a point or close waits for it
            try:
                with f.step():
                    ds[mine, :] = block(k, rank)
                    if k == where and rank == who:
                        raise RuntimeError("rank fails on its own")
            except (LaminaError, RuntimeError):
                pass
            op = alike.choice(
                ["none", "none", "wait", "read", "flush", "define"] if calls else ["none"]
            )
            try:
                if op == "wait":
                    f.wait()
                elif op == "read":
                    got = ds.read(np.s_[:, :], step=0, collective=True)
                    np.testing.assert_array_equal(got, whole(committed[0], size))
                elif op == "flush":
                    f.flush(durable=False)
                elif op == "define":
                    f.create_dataset(f"z{k}", (size,), "i8")
            except LaminaError:
                pass
            continue
        kind = alike.choice(["step", "step", "step", "implicit", "fails"])
        if kind == "fails":  # refused on every rank: dropped everywhere
            try:
                with f.step():
                    ds[mine, :] = block(k, rank)
                    ds[ROWS * size : ROWS * size + 1, :] = 0.0
            except BoundsError:
                pass
            else:
                raise AssertionError("a box out of bounds was written")
        else:
            if kind == "implicit":  # a step opened by the put
                ds[mine, :] = block(k, rank)
                f.end_step()
            else:
                with f.step():
                    ds[mine, :] = block(k, rank)
                    if rank == 0:
                        f.attrs["k"] = k
            committed.append(k)
        with g.step():
            gs[mine, :] = block(k, rank)
        op = alike.choice(["none", "wait", "app", "read", "mine", "flush", "define"])
        if op == "wait":
            f.wait()
        elif op == "app":  # a collective of the program's own, steps in flight
            assert comm.allreduce(k + rank) == size * k + size * (size - 1) // 2
        elif op == "read" and committed:
            j = int(alike.integers(0, len(committed)))
            got = ds.read(np.s_[:, :], step=j, collective=True)
            np.testing.assert_array_equal(got, whole(committed[j], size))
        elif op == "mine" and kind != "fails":  # the step just ended: waits for it
            np.testing.assert_array_equal(ds[mine, :], block(k, rank))
        elif op == "flush":
            f.flush(durable=False)
        elif op == "define" and defined < 3:
            f.create_dataset(f"y{defined}", (size,), "i8")
            defined += 1
    decided = [d["step"] for d in f.io_stats.get("decisions", [])]
    closed = True
    try:  # first: a rank a call behind makes it here while the others close
        f.close()
    except LaminaError:  # a refused step's failure, raised at the close on every rank
        if where < 0:
            raise
        closed = False
    g.close()
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps >= len(committed), (r.steps, committed)
            for j, k in enumerate(committed):
                np.testing.assert_array_equal(r.at(j)["x"][...], whole(k, size))
            # after the dropped step: steps the ranks wrote together again, never one that
            # mixes program steps (every rank's rows are those of one step k > where)
            later = []
            for j in range(len(committed), r.steps):
                got = r.at(j)["x"][...]
                k = int(got[0, 0]) // 1000
                np.testing.assert_array_equal(got, whole(k, size))
                later.append(k)
            assert all(where < a < b for a, b in zip(later[:-1], later[1:], strict=True)), later
            assert not later or later[0] > where, later
            # io='auto': rank 0's decisions in the file, every one where the close went through
            # (else those handed down with the committed steps, the first ones)
            got = read_decisions(r.engine.catalog.ext)
            steps = [d["step"] for d in got[0]] if got is not None else []
            if closed:
                assert steps == decided and (got is None or got[1]), (steps, decided)
            else:
                assert steps == decided[: len(steps)], (steps, decided)
        print(
            f"OK {len(committed)} steps, then {len(later)}; dropped at {where} on rank {who}",
            flush=True,
        )


def _step_0_alone(path: str, comm) -> None:
    """Collective, once every rank left the file: rank 0 checks that it holds step 0 alone,
    whole, and says OK."""
    comm.Barrier()
    if comm.rank == 0:
        with lamina.open(path, "r", comm=comm_mod.self_comm()) as r:
            assert r.steps == 1, r.steps
            np.testing.assert_array_equal(r.at(0)["x"][...], whole(0, comm.size))
        print("OK", flush=True)


def _interrupted(path: str, both: bool) -> None:
    """Rank 1 waits in end_step of step 1 for a slow rank 0 when a signal handler raises on
    it: it leaves the step's meeting halfway; with *both*, rank 0 then fails on its own in
    step 2, before any collective call (see :func:`interrupted`, :func:`interrupted_both`).
    Either way step 0 is in the file, step 1 (being ended on rank 1) is not."""
    comm = comm_mod.world()
    rank = comm.rank

    def on_alarm(*_):
        raise TimeoutError("rank 1's own time limit")

    if rank == 1:
        signal.signal(signal.SIGALRM, on_alarm)
    try:
        with lamina.open(path, "w", io="async") as f:
            ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
            for k in range(3):
                with f.step():
                    ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
                    if k == 1:
                        if rank == 0:
                            time.sleep(3)  # slow in step 1
                        else:
                            signal.alarm(1)  # fires while rank 1 waits in end_step
                    if both and k == 2 and rank == 0:
                        raise TimeoutError("rank 0's own time limit")
    except (TimeoutError, lamina.RemoteError) as e:
        text = str(e)
        if both:
            assert isinstance(e, TimeoutError) and f"rank {rank}'s own" in text, e
        else:
            assert ("own time limit" in text) if rank == 1 else ("rank 1 left" in text), text
    else:
        raise AssertionError("no error")
    _step_0_alone(path, comm)


def interrupted(path: str) -> None:
    """Rank 1 is interrupted halfway through step 1's meeting; rank 0 met it and handed step 1
    to its background thread, which waited for ever in its commit, and rank 0 in its exit."""
    _interrupted(path, both=False)


def interrupted_both(path: str) -> None:
    """As :func:`interrupted`, and rank 0 then fails on its own in step 2: every rank leaves
    in the same agreement.  They closed the file together, rank 0's drain waiting for ever
    in the commit of step 1, rank 1's close for rank 0's.  Now every rank lets go of it."""
    _interrupted(path, both=True)


def handing_cut(path: str) -> None:
    """A signal handler's exception on rank 1 once step 1's meeting completed there, before
    it handed the step to its thread (as in ``_submit``, where an interrupt can come): rank 0
    handed it, and its thread waited for ever in its commit, rank 0 in its drain, as rank 1
    left without meeting that commit.  Now rank 1 meets it as it leaves."""
    from lamina.layers.background.layer import BackgroundLayer

    comm = comm_mod.world()
    rank = comm.rank
    if rank == 1:
        real = BackgroundLayer._submit

        def submit(self, step):
            if step.index == 1:
                raise TimeoutError("rank 1's own time limit")
            real(self, step)

        BackgroundLayer._submit = submit  # type: ignore[method-assign]
    try:
        with lamina.open(path, "w", io="async") as f:
            ds = f.create_dataset("x", (ROWS * comm.size, COLS), "f8")
            for k in range(3):
                with f.step():
                    ds[rank * ROWS : (rank + 1) * ROWS, :] = block(k, rank)
    except (TimeoutError, lamina.RemoteError) as e:
        text = str(e)
        assert ("own time limit" in text) if rank == 1 else ("rank 1 left" in text), text
    else:
        raise AssertionError("no error")
    _step_0_alone(path, comm)


#: the scenarios that take the file's path alone
BY_PATH = {
    "handing-cut": handing_cut,
    "interrupted": interrupted,
    "interrupted-both": interrupted_both,
    "empty": empty,
    "shared": shared,
    "slowest": slowest,
    "race": race,
    "implicit": implicit,
    "ahead": ahead,
    "leave": leave,
}

if __name__ == "__main__":
    if sys.argv[1] in BY_PATH:
        BY_PATH[sys.argv[1]](sys.argv[2])
    elif sys.argv[1] == "joined":
        joined(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "apart":
        apart(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "attrs-between":
        attrs_between(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "apart-steps":
        apart_steps(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "switches":
        switches(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
    elif sys.argv[1] == "auto":
        auto(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "fault":
        fault(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "collective":
        collective(sys.argv[2], int(sys.argv[3]))
    else:
        stress(sys.argv[2], int(sys.argv[3]))
