"""``lamina bench async``: background I/O (``io='async'``) against synchronous I/O and ADIOS2 BP5 AsyncWrite.

Two kernels from the HDF5 asynchronous I/O papers, at this machine's scale,
one MPI job per rank count:

**write (VPIC-IO-like)**: every rank holds 8 particle properties (``x y z
px py pz id1 id2``, 1-D float32, ``--mib`` MiB per rank per step for the 8
together; rank r owns elements ``[r n, (r+1) n)`` of each global dataset)
and writes ``--steps`` steps.  A step is a compute phase, then the 8 writes
and ``end_step``.

**read (BD-CATS-IO-like)**: the file written is read back step by step
(``iter_steps``), each rank its own range of the 8 properties, then a
compute phase on what it read.

First, in the same job (after an untimed warm-up): ``t_io``, the mean time
of a step of a synchronous lamina write without compute (the 8 writes and
``end_step``; median of 3 runs); ``t_read``, the same for a synchronous
read (steps after the first); ``t_copy``, one ``memcpy`` of a step's bytes
into arrays already touched (best of 3, slowest rank; the copy into new
arrays, as a copy at put makes, is reported beside it).  Then for every compute factor c the
compute phase lasts ``c x t_io`` (writes) or ``c x t_read`` (reads).

**The compute phase sleeps** (``time.sleep``).  A busy loop would make
every rank hold a core for the whole phase; with several ranks and their
background threads on 2 shared cores that measures the scheduler, not the
overlap (it overstates contention).  Sleeping understates it: the
background thread has a core to itself while the program computes.  Real
numpy compute lies in between (it releases the GIL but uses a core).

Write methods (each ``--repeat`` times per compute factor, order rotated):

``sync``              lamina native, ``io='sync'``
``async``             ``io='async'``, the default budget (1 GiB: every step of a run fits)
``async 2 in flight`` ``io='async'``, ``max_inflight_bytes`` = 2 steps (the step being
                      committed and the next one), like ADIOS2's one buffer in flight
``auto``              ``io='auto'``: run if lamina accepts it, otherwise reported as n/a
``numpy thread``      hand-written: two sets of buffers allocated once, a step copied
                      into the free one (its *copy*, timed alone), a thread writing
                      the raw bytes to a file per rank with ``os.pwrite``
``adios2 BP5``        ADIOS2 BP5 from PyPI, a file per rank, Deferred puts
``adios2 BP5 async``  the same with engine parameter ``AsyncWrite=On``

lamina runs with ``aggregators=R`` (a subfile per rank, as ADIOS2's file per
rank) and ``durable=False`` unless ``--durable`` (then ``durable=True`` and
ADIOS2's files are fsynced after close).  Timed per run: the loop (every
step: compute, then the calls; the time of the calls is the step's *submit*
time), then the end (``f.wait()`` and ``close``; ADIOS2's ``close``).
Open and the dataset definitions are not timed.  ``epoch`` = loop / steps;
``epoch steps >= 2``: the median of one step's compute and calls from step 2
on, the steady state the target is judged on (the copies of steps 0 and 1
go into new memory, 5x a warm copy here, when step 0 is still being
written; a run of 6 steps carries that in its mean, a simulation of
hundreds of steps does not; the mean is shown beside it);
``run/step`` = (loop + end) / steps (what the steps cost including the
backlog left at the end).  Read methods: ``sync`` and ``async prefetch``
(``io='async'``, ``iter_steps(prefetch=True)``); the *wait* of a step is
the time in the 8 read calls, each of which allocates its result
(``view[p].read(box)``, as h5py's ``ds[...]``), so a step read ahead is
handed over without a copy.

The data differ by step: the compute phase of step k starts with setting
the first value of each property to a value of that step's own.  Checks,
untimed: the file of each write method (lamina's sync, async, async 2 in
flight and auto, and the baselines' raw and BP5 files) is read back once
per compute factor, every step whole;
every read run compares every step's first values, the last step's
properties whole, and the number of steps read with the steps written.
A failed check is reported (``DATA CHECK FAILED``) and the exit status is 1.

Predictions (docs/background.md): sync epoch = t_io + t_comp; async epoch =
max(t_comp + t_copy, t_io); the epoch target keeps the issue's
max(t_comp, t_io) + t_copy.  The targets take t_copy, and the submit target
its memcpy, as ``numpy thread``'s copy at the same compute factor: a memcpy
of the step's bytes where the program makes it, after a compute phase
(1.1-2.1x the warm back-to-back memcpy of the calibration on the
development machine; the info rows beside the targets use that one).  For
``auto`` the report also gives the error of the model's own per-step
predictions (fitted to the measured history) from step 3 on: |measured
epoch / predicted epoch of the mode taken - 1|.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from ..geometry import Box
from ..perf import checks
from ..perf.asyncmodel import async_epoch
from ..perf.checks import Check
from ..text import fmt_bytes, table
from . import common, launch

PROPS = ("x", "y", "z", "px", "py", "pz", "id1", "id2")
SYNC = "sync"
ASYNC = "async"
ASYNC2 = "async 2 in flight"
AUTO = "auto"
#: io='auto' may be this much slower than the better of sync and async (the issue: 5 %)
AUTO_TOL = 1.05
BP5 = "adios2 BP5"
BP5A = "adios2 BP5 async"
#: the hand-written asynchronous writer: copy into one of two buffer sets, a thread pwrites it
HAND = "numpy thread"
WRITES = (SYNC, ASYNC, ASYNC2, AUTO, HAND, BP5, BP5A)
#: the write methods whose files lamina reads back
LAMINA_WRITES = (SYNC, ASYNC, ASYNC2, AUTO)
PREFETCH = "async prefetch"
READS = (SYNC, PREFETCH)
SUBMIT_SLACK = 50e-6  # s: the submit target is 1.1 x memcpy + this
#: the first step whose copies can go into buffers of a written step (steps 0 and 1 copy
#: into new memory when step 0 is still being written): the steady state's epochs from here
STEADY_FROM = 2
WAIT_TOL = 0.1  # prefetching readers "wait ~0": at most this share of a synchronous read
MODEL_TOL = 0.15  # the model's prediction error after 3 steps of history (the target)


# ------------------------------------------------------------------ worker (MPI side)
class Worker:
    """One rank of the job: its 8 properties, the timing and the runs."""

    def __init__(self, ns) -> None:
        from .. import comm as lcomm
        from .harness import Ctx  # MPI: the worker's side only

        comm = lcomm.world()
        self.ns = ns
        self.n = max(1, ns.mib * common.MiB // (len(PROPS) * 4))  # elements per property
        self.step_bytes = self.n * 4 * len(PROPS)
        rank, size = comm.rank, comm.size
        rng = np.random.default_rng([ns.seed, rank])
        self.props = [rng.random(self.n, dtype=np.float32) for _ in PROPS]
        self.box = Box((rank * self.n,), ((rank + 1) * self.n,))
        self.gshape = (size * self.n,)
        self.ctx = Ctx(
            comm,
            rank,
            size,
            self.props[0],
            self.box,
            self.gshape,
            ns.dir,
            ns.durable,
            False,
            ns.repeat,
            0,
            [size],
            list(WRITES),
            ns.seed,
        )
        self.tag = 0

    # ------------------------------------------------------------ helpers
    def path(self, what: str) -> str:
        self.tag += 1
        return os.path.join(self.ns.dir, f"{what}-{self.tag}")

    def clean(self) -> None:
        ctx = self.ctx
        ctx.barrier()
        if ctx.rank == 0:
            for name in os.listdir(self.ns.dir):
                if not name.startswith("read-source"):
                    common.remove(os.path.join(self.ns.dir, name))
        ctx.barrier()

    def mark(self, step: int) -> np.ndarray:
        """The first value of each property at *step*: its own per step and property (the
        random values lie in [0, 1))."""
        return np.arange(2, 2 + len(PROPS), dtype=np.float32) + np.float32(len(PROPS) * step)

    def stamp(self, step: int) -> None:
        """Set the first value of each property to *step*'s (:meth:`mark`): every step's data differ."""
        for a, v in zip(self.props, self.mark(step), strict=True):
            a[0] = v

    def check_file(self, path: str) -> bool:
        """Collective, untimed: *path* holds every step this rank wrote, whole (each rank its
        range of the 8 properties)."""
        import lamina

        ok, n = True, 0
        with lamina.open(path, "r", comm=self.ctx.comm) as f:
            for view in f.iter_steps():
                got = [view[p].read(self.box) for p in PROPS]
                ok = ok and self.same(got, n, whole=True)
                n += 1
        return self.ctx.all_true(ok and n == self.ns.steps)

    def check_baseline(self, method: str, path: str) -> bool:
        """Collective, untimed: the file of baseline *method* (this rank's own) holds every
        step this rank wrote, whole, as :meth:`check_file` reads lamina's."""
        ok, n = True, 0
        try:
            if method == HAND:  # the 8 properties back to back, step after step
                raw = np.fromfile(path, dtype=np.float32)
                steps = raw.reshape(-1, len(PROPS), self.n) if raw.size else raw
                for k, got in enumerate(steps):
                    ok = ok and self.same(list(got), k, whole=True)
                n = len(steps)
            else:
                with common.adios2_reader(path) as r:
                    for k in range(self.ns.steps):
                        got = []
                        for p in PROPS:
                            var = r.inquire_variable(p)
                            var.set_selection([list(self.box.start), [self.n]])
                            var.set_step_selection([k, 1])
                            got.append(np.asarray(r.read(var)).reshape(-1))
                        ok = ok and self.same(got, k, whole=True)
                        n += 1
        except Exception:  # noqa: BLE001 - a file that does not read back is a failed check
            ok = False
        return self.ctx.all_true(ok and n == self.ns.steps)

    def same(self, got: list[np.ndarray], step: int, whole: bool) -> bool:
        """Whether *got* (the 8 properties read at *step*) hold that step's marks, and with
        *whole* everything else too."""
        if not all(g[0] == v for g, v in zip(got, self.mark(step), strict=True)):
            return False
        return not whole or all(
            np.array_equal(g[1:], a[1:]) for g, a in zip(got, self.props, strict=True)
        )

    def memcpy(self) -> tuple[float, float]:
        """Seconds to copy one step's bytes (the 8 properties), best of 3, slowest rank.

        (into arrays already touched, into new arrays): the second pays for
        the allocation and the first touch of its pages, as a copy at put does.
        """
        dst = [np.empty_like(a) for a in self.props]
        for d, a in zip(dst, self.props, strict=True):
            np.copyto(d, a)  # touch the pages
        best = fresh = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for d, a in zip(dst, self.props, strict=True):
                np.copyto(d, a)
            t1 = time.perf_counter()
            copies = [a.copy() for a in self.props]
            t2 = time.perf_counter()
            del copies
            best, fresh = min(best, t1 - t0), min(fresh, t2 - t1)
        return self.ctx.max(best), self.ctx.max(fresh)

    # ------------------------------------------------------------ writers
    def steps(
        self, t_comp: float, step: Callable[[], None]
    ) -> tuple[float, float, list[float], list[float]]:
        """The timed loop of a write run: ``--steps`` times a compute phase of *t_comp*
        seconds, then *step* (the calls).  (start, end, each step's submit: its calls, each
        step's epoch: its compute phase and calls).  The compute phase starts with setting
        the first value of each property to the step's own (:meth:`stamp`, 8 numbers)."""
        submit, epochs = [], []
        t0 = e0 = time.perf_counter()
        for k in range(self.ns.steps):
            self.stamp(k)
            if t_comp > 0:
                time.sleep(t_comp)
            s0 = time.perf_counter()
            step()
            e1 = time.perf_counter()
            submit.append(e1 - s0)
            epochs.append(e1 - e0)
            e0 = e1
        return t0, time.perf_counter(), submit, epochs

    def lamina_write(
        self, io: str, t_comp: float, budget: int | None = None, what: str = "lamina"
    ) -> dict:
        import lamina

        opts: dict = {"comm": self.ctx.comm, "aggregators": self.ctx.size}
        opts["durable"] = self.ns.durable
        if budget is not None:
            opts["max_inflight_bytes"] = budget
        path = self.path(what) + ".lam"
        f = lamina.open(path, "w", io=io, **opts)
        try:
            dss = [f.create_dataset(p, self.gshape, np.float32) for p in PROPS]
            mode = f.io
            self.ctx.barrier()

            def step() -> None:
                f.begin_step()
                for ds, a in zip(dss, self.props, strict=True):
                    ds.write(a, offset=self.box.start)
                f.end_step()

            t0, t1, submit, epochs = self.steps(t_comp, step)
            f.wait()
            t2 = time.perf_counter()
            stats = f.io_stats
        finally:
            f.close()
        t3 = time.perf_counter()
        return {
            "loop": t1 - t0,
            "drain": t2 - t1,
            "end": t3 - t1,
            "submit": submit,
            "epochs": epochs,
            "io": mode,
            "io_stats": stats,
            "path": path,
        }

    def adios2_write(self, asynchronous: bool, t_comp: float) -> dict:
        import adios2

        path = self.path(f"adios2.{self.ctx.rank}") + ".bp"
        ad = adios2.Adios()
        io = ad.declare_io("lamina-bench-async")
        io.set_engine("BP5")
        if asynchronous:
            io.set_parameter("AsyncWrite", "On")
        deferred = adios2.bindings.Mode.Deferred
        s = adios2.Stream(io, path, "w")
        try:
            variables = [
                io.define_variable(p, a, list(self.gshape), list(self.box.start), [self.n])
                for p, a in zip(PROPS, self.props, strict=True)
            ]
            self.ctx.barrier()

            def step() -> None:
                s.begin_step()
                for v, a in zip(variables, self.props, strict=True):
                    s.engine.put(v, a, deferred)
                s.end_step()

            t0, t1, submit, epochs = self.steps(t_comp, step)
        finally:
            s.close()
        if self.ns.durable:
            common.fsync_path(path)
        return _timed_run(t0, t1, time.perf_counter(), submit, epochs, path)

    def hand_write(self, t_comp: float) -> dict:
        """The asynchronous writer a program would write by hand, the bar for ``io='async'``.

        Double buffering: two sets of the 8 buffers, allocated and touched once; a step waits
        until its set's earlier write is done, copies the properties into it (``np.copyto``;
        the time of these copies alone is the step's *copy*: a memcpy of the step's bytes at
        the same point of the loop as lamina's submit) and hands it to a thread that writes
        the raw bytes to a file per rank with ``os.pwrite``.  No statistics, checksums,
        index or commit: the cost of moving the bytes in the background and nothing else.
        """
        import queue
        import threading

        path = self.path(f"numpy-thread.{self.ctx.rank}") + ".raw"
        sets = [[np.empty_like(a) for a in self.props] for _ in range(2)]
        for bufs in sets:
            for d, a in zip(bufs, self.props, strict=True):
                np.copyto(d, a)  # touch the pages once, as a program allocating up front does
        free = [threading.Event(), threading.Event()]
        for e in free:
            e.set()
        todo: queue.SimpleQueue = queue.SimpleQueue()
        errors: list[BaseException] = []
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

        def writer() -> None:
            try:
                while (item := todo.get()) is not None:
                    k, off = item
                    for d in sets[k]:
                        view = memoryview(d).cast("B")
                        while view:
                            n = os.pwrite(fd, view, off)
                            view, off = view[n:], off + n
                    free[k].set()
            except BaseException as e:  # surfaced at the next step or after the loop
                errors.append(e)
                for ev in free:
                    ev.set()

        thread = threading.Thread(target=writer, name="bench-numpy-thread", daemon=True)
        thread.start()
        copies: list[float] = []
        count = [0]

        def step() -> None:
            k = count[0] % 2
            free[k].wait()
            if errors:  # the writer failed: raised now, never waited for again
                raise errors[0]
            free[k].clear()
            c0 = time.perf_counter()
            for d, a in zip(sets[k], self.props, strict=True):
                np.copyto(d, a)
            copies.append(time.perf_counter() - c0)
            todo.put((k, count[0] * self.step_bytes))
            count[0] += 1

        try:
            t0, t1, submit, epochs = self.steps(t_comp, step)
        finally:
            todo.put(None)
            thread.join()
            if self.ns.durable and not errors:
                os.fsync(fd)
            os.close(fd)
        t3 = time.perf_counter()
        if errors:
            raise errors[0]
        return {**_timed_run(t0, t1, t3, submit, epochs, path), "copies": copies}

    def write(self, method: str, t_comp: float) -> dict:
        if method == HAND:
            return self.hand_write(t_comp)
        if method == SYNC:
            return self.lamina_write("sync", t_comp)
        if method == ASYNC:
            return self.lamina_write("async", t_comp)
        if method == ASYNC2:
            return self.lamina_write("async", t_comp, budget=2 * self.step_bytes)
        if method == AUTO:
            return self.lamina_write("auto", t_comp)
        return self.adios2_write(method == BP5A, t_comp)

    def sync_step(self) -> float:
        """Mean seconds of a step of a synchronous write without compute (slowest rank); the file removed."""
        t = self.reduce_write(self.lamina_write("sync", 0.0))["submit_mean"]
        self.clean()
        return t

    # ------------------------------------------------------------ readers
    def read(self, path: str, prefetch: bool, t_comp: float) -> dict:
        import lamina

        # each read allocates its result, as an analysis in Python does (h5py's ds[...]): a step
        # read ahead is handed over as it is, without a copy.  The step before's arrays are let
        # go before the reads are timed: freeing them is the program's work, not the reads' (the
        # first step's, new memory, took 0.4-0.6 ms to free, which the wait at step 1 counted)
        # Every step's marks (the first value of each property, 8 numbers) are compared in the
        # loop, the last step's properties whole after it, and the steps counted
        bufs: list[np.ndarray] = []
        waits = []
        ok = True
        with lamina.open(path, "r", comm=self.ctx.comm, io="async" if prefetch else "sync") as f:
            self.ctx.barrier()
            t0 = time.perf_counter()
            for view in f.iter_steps(prefetch=prefetch):
                bufs = []
                s0 = time.perf_counter()
                bufs = [view[p].read(self.box) for p in PROPS]
                waits.append(time.perf_counter() - s0)
                ok = ok and self.same(bufs, len(waits) - 1, whole=False)
                if t_comp > 0:
                    time.sleep(t_comp)
            loop = time.perf_counter() - t0
            stats = f.io_stats
        ok = ok and len(waits) == self.ns.steps and self.same(bufs, len(waits) - 1, whole=True)
        return {"loop": loop, "waits": waits, "io_stats": stats, "ok": ok}

    # ------------------------------------------------------------ reductions
    def reduce_write(self, r: dict) -> dict:
        """Slowest rank's loop, end and per-step submit times; rank 0's io_stats."""
        mx = self.ctx.max
        steps = self.ns.steps
        loop, end = mx(r["loop"]), mx(r["end"])
        sub = [mx(x) for x in r["submit"]]
        steady = [mx(x) for x in r["epochs"][STEADY_FROM:]] or [loop / steps]
        out = {
            "epoch": loop / steps,
            "epoch_steady": common.summarize(steady)["median"],
            "run_step": (loop + end) / steps,
            "submit_mean": sum(sub) / steps,
            "submit_median": common.summarize(sub)["median"],
            "submit_steady": common.summarize(sub[STEADY_FROM:] or sub)["median"],
            "end": end,
            "drain": mx(r["drain"]),
        }
        if "copies" in r:  # the hand-written writer's copies alone (into touched buffers)
            out["copy_median"] = common.summarize([mx(x) for x in r["copies"]])["median"]
        if "io_stats" in r:
            out["io"] = r["io"]
            out["io_stats"] = r["io_stats"]
        return out

    def reduce_read(self, r: dict) -> dict:
        mx = self.ctx.max
        waits = [mx(x) for x in r["waits"]]
        later, rest = waits[1:], waits[2:]
        return {
            "epoch": mx(r["loop"]) / max(1, len(waits)),
            "wait_first": waits[0] if waits else 0.0,
            "wait_second": waits[1] if len(waits) > 1 else 0.0,
            "wait_later": sum(later) / len(later) if later else 0.0,
            "wait_rest": sum(rest) / len(rest) if rest else None,
            "steps_read": len(waits),
            "io_stats": r["io_stats"],
            "ok": self.ctx.all_true(r["ok"]),
        }

    # ------------------------------------------------------------ the job
    def run(self) -> dict:
        from ..errors import ConfigError
        from .baselines import available

        ctx = self.ctx
        ns = self.ns
        notes: list[str] = []
        methods = list(WRITES)
        why = available("adios2")
        if why:
            methods = [m for m in methods if m not in (BP5, BP5A)]
            notes.append(why)
        # io='auto': run it if lamina accepts it, else say why not (never faked)
        auto_na = None
        try:
            self.lamina_write("auto", 0.0)
        except ConfigError as e:
            auto_na = str(e)
        if auto_na:
            methods.remove(AUTO)
        self.clean()
        # calibration: untimed warm-up, then t_io (sync, no compute), t_copy, t_read
        self.lamina_write("sync", 0.0)
        self.clean()
        t_io = median(self.sync_step() for _ in range(3))
        t_copy, t_copy_new = self.memcpy()
        # the file every read run reads: kept by clean() (its name starts with read-source)
        source = self.lamina_write("sync", 0.0, what="read-source")["path"]
        self.clean()
        self.read(source, False, 0.0)  # warm-up
        key = "wait_later" if ns.steps > 1 else "wait_first"
        t_read = median(self.reduce_read(self.read(source, False, 0.0))[key] for _ in range(3))
        ctx.progress("calibration")
        writes: list[dict] = []
        reads: list[dict] = []
        bad: list[str] = []
        for c in ns.compute:
            tc = c * t_io
            runs: dict[str, list[dict]] = {m: [] for m in methods}
            for rep in range(ns.repeat):
                k = rep % len(methods)
                for m in methods[k:] + methods[:k]:
                    if ctx.rank == 0:
                        os.sync()
                    ctx.barrier()
                    run = self.write(m, tc)
                    runs[m].append(self.reduce_write(run))
                    # every file read back, once per configuration (untimed): lamina's, and
                    # the baselines', whose times are reported beside it
                    if rep == 0:
                        right = (
                            self.check_file(run["path"])
                            if m in LAMINA_WRITES
                            else self.check_baseline(m, run["path"])
                        )
                        if not right:
                            bad.append(f"write {m}")
                    self.clean()
                    ctx.progress(f"write c={c:g} {m} ({rep + 1}/{ns.repeat})")
            for m in methods:
                writes.append({"compute": c, "t_comp": tc, "method": m, **merge(runs[m])})
            tr = c * t_read
            rruns: dict[str, list[dict]] = {m: [] for m in READS}
            for rep in range(ns.repeat):
                order = READS if rep % 2 == 0 else READS[::-1]
                for m in order:
                    ctx.barrier()
                    r = self.reduce_read(self.read(source, m == PREFETCH, tr))
                    if not r["ok"] and f"read {m}" not in bad:
                        bad.append(f"read {m}")
                    rruns[m].append(r)
                    ctx.progress(f"read c={c:g} {m} ({rep + 1}/{ns.repeat})")
            for m in READS:
                reads.append({"compute": c, "t_comp": tr, "method": m, **merge(rruns[m])})
        ctx.barrier()
        if ctx.rank == 0:
            for name in os.listdir(ns.dir):
                common.remove(os.path.join(ns.dir, name))
        ctx.barrier()
        return {
            "ranks": ctx.size,
            "steps": ns.steps,
            "step_bytes": self.step_bytes,
            "elements": self.n,
            "durable": ns.durable,
            "t_io": t_io,
            "t_copy": t_copy,
            "t_copy_new": t_copy_new,
            "t_read": t_read,
            "auto": auto_na,
            "writes": writes,
            "reads": reads,
            "failed_checks": bad,
            "notes": notes,
        }


def _timed_run(
    t0: float, t1: float, t3: float, submit: list[float], epochs: list[float], path: str
) -> dict:
    """A write run of a baseline without a background drain: the loop from *t0* to *t1*, its
    end (close) until *t3*."""
    return {
        "loop": t1 - t0,
        "drain": 0.0,
        "end": t3 - t1,
        "submit": submit,
        "epochs": epochs,
        "path": path,
    }


def median(xs) -> float:
    return common.summarize(list(xs))["median"]


def merge(runs: list[dict]) -> dict:
    """Repetitions of one (compute, method): medians of the numbers, every run's run/step, the last io_stats."""
    out: dict = {"repeats": len(runs)}
    for key, v in runs[0].items():
        if isinstance(v, bool):
            out[key] = all(r[key] for r in runs)
        elif isinstance(v, (int, float)):
            out[key] = common.summarize([r[key] for r in runs])["median"]
        else:
            out[key] = runs[-1][key]
    # for paired ratios (common.speedup): the per-repetition times
    main = "run_step" if "run_step" in runs[0] else "wait_later"
    out.update(
        {k: v for k, v in common.summarize([r[main] for r in runs]).items() if k != "median"}
    )
    out["median"] = out[main]
    return out


def worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m lamina.bench.background")
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--compute", required=True)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--durable", action="store_true")
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--out", required=True)
    ns = p.parse_args(argv)
    ns.compute = [float(x) for x in ns.compute.split(",") if x]
    w = Worker(ns)
    doc = w.run()
    if w.ctx.rank == 0:
        with open(ns.out, "w") as f:
            json.dump(doc, f)
    return 0


# ------------------------------------------------------------------ parent
def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}" if x >= 0.01 else f"{x * 1e3:.2f}"


def predict(method: str, t_comp: float, t_io: float, t_copy: float) -> float | None:
    """The model's epoch time (docs/background.md): sync t_io + t_comp, async
    max(t_comp + t_copy, t_io) (:func:`lamina.perf.asyncmodel.async_epoch`)."""
    if method == SYNC:
        return t_io + t_comp
    if method in (ASYNC, ASYNC2, AUTO):
        return async_epoch(t_comp, t_io, t_copy)
    return None


def _decisions(r: dict) -> list[dict]:
    """The decisions ``io="auto"`` logged in a run (rank 0's, from ``io_stats``)."""
    return (r.get("io_stats") or {}).get("decisions") or []


def _predicted(d: dict) -> float | None:
    """The epoch a decision predicted for the mode it took: the slowest rank's, where the
    decision has it (the ranks' epochs are the slowest one's), else this rank's."""
    mode = "async" if d.get("mode") == "async" else "sync"
    return d.get(f"t_{mode}_ranks") or d.get(f"t_{mode}")


def auto_pairs(r: dict) -> list[tuple[float, float]]:
    """(predicted, measured) epochs of the steps ``io="auto"`` decided from step 3 on (the
    prediction of the mode it took; rank 0's decisions, from ``io_stats``)."""
    out = []
    for d in _decisions(r):
        pred = _predicted(d)
        meas = d.get("epoch_measured")
        if d.get("step", 0) >= 3 and pred and meas:
            out.append((pred, meas))
    return out


def auto_errors(r: dict) -> list[float]:
    """|measured / predicted - 1| of :func:`auto_pairs` (the issue's error: of the
    prediction; the side-by-side table of ``lamina.perf.checks`` takes both models' errors
    relative to the measured time)."""
    return [abs(meas / pred - 1) for pred, meas in auto_pairs(r)]


def model_checks(jobs: list[dict], command: str) -> list[Check]:
    """The background I/O model's check of this run: every job's ``auto`` pairs."""
    pairs = [p for j in jobs for r in j["writes"] if r["method"] == AUTO for p in auto_pairs(r)]
    return [Check.of("async", pairs, command)] if pairs else []


def auto_run_error(r: dict) -> float | None:
    """|run/step / the mean predicted epoch of the modes ``io="auto"`` took - 1| over the whole
    run (Eq. 1: the run is the sum of its epochs): unlike a step's epoch in the loop, run/step
    holds the backlog of background steps a run leaves for ``close``.  None without decisions."""
    preds = [p for p in map(_predicted, _decisions(r)) if p]
    if not preds or not r.get("run_step"):
        return None
    return abs(r["run_step"] / (sum(preds) / len(preds)) - 1)


def targets(job: dict) -> list[dict]:
    """The issue's targets for one job: value, threshold and verdict of each."""
    t_io, t_copy, t_read = job["t_io"], job["t_copy"], job["t_read"]
    w = {(r["compute"], r["method"]): r for r in job["writes"]}
    out = []

    # t_copy: the memcpy of a step's bytes as the program pays it at that point of its loop
    # (after a compute phase, its caches and clocks as the phase left them), timed in the
    # hand-written writer's run at the same compute; the warm back-to-back memcpy is the
    # reference of the info rows
    def loop_copy(c: float) -> float:
        h = w.get((c, HAND))
        return h["copy_median"] if h and h.get("copy_median") else t_copy

    # 1. async epoch <= 1.1 x (max(t_comp, t_io) + t_copy) when compute >= I/O
    #    (the steady state: a step's epoch from step STEADY_FROM on, median; the loop's mean
    #    with the first steps' copies into new memory is shown beside it)
    def epoch_vals(key: str, warm: bool = False) -> list[tuple[float, float]]:
        return [
            (
                r[key] / (max(r["t_comp"], t_io) + (t_copy if warm else loop_copy(r["compute"]))),
                r["compute"],
            )
            for r in job["writes"]
            if r["method"] == ASYNC and r["compute"] >= 1 and key in r
        ]

    out.append(
        _target(
            f"async epoch (steps >= {STEADY_FROM}) / (max(t_comp, t_io) + t_copy in the loop), "
            "compute >= I/O",
            epoch_vals("epoch_steady"),
            1.1,
            False,
            "x",
        )
    )
    _info(
        out,
        "(info) the same with t_copy a warm back-to-back memcpy",
        epoch_vals("epoch_steady", warm=True),
        1.1,
        "x",
    )
    _info(
        out,
        "(info) the same for the loop's mean epoch, the first steps' new buffers included",
        epoch_vals("epoch"),
        1.1,
        "x",
    )
    vals = [
        (r["epoch_steady"] / h["epoch_steady"], r["compute"])
        for r in job["writes"]
        if r["method"] == ASYNC
        and r["compute"] >= 1
        and (h := w.get((r["compute"], HAND)))
        and h.get("epoch_steady")
    ]
    _info(
        out,
        f"(info) async epoch (steps >= {STEADY_FROM}) / the hand-written {HAND}'s, compute >= I/O",
        vals,
        1.1,
        "x",
    )
    # 2. async with 2 steps in flight beats ADIOS2 BP5 AsyncWrite when t_io > t_comp (run/step)
    vals = []
    for c in sorted({r["compute"] for r in job["writes"] if r["compute"] < 1}):
        a, b = w.get((c, ASYNC2)), w.get((c, BP5A))
        if a and b:
            med, _best = common.speedup(a, b)  # a's time / b's time, paired
            if med is not None:
                vals.append((med, c))
    out.append(
        _target(
            "async 2 in flight / adios2 BP5 async (run/step), compute < I/O",
            vals,
            1.0,
            False,
            "x",
            strict=True,
        )
    )

    # 3. submit cost <= 1.1 x memcpy + 50 us (the default budget never waits here): the
    #    memcpy of the step's bytes at the same point of the loop (see loop_copy); steps from
    #    STEADY_FROM on, as the epoch (the first steps copy into new memory, where the
    #    hand-written writer allocated its buffers before its loop)
    def submit_vals(key: str, warm: bool = False) -> list[tuple[float, float]]:
        return [
            (
                r[key] / (1.1 * (t_copy if warm else loop_copy(r["compute"])) + SUBMIT_SLACK),
                r["compute"],
            )
            for r in job["writes"]
            if r["method"] == ASYNC and key in r
        ]

    out.append(
        _target(
            f"async submit (steps >= {STEADY_FROM}) / (1.1 x memcpy in the loop + 50 us)",
            submit_vals("submit_steady"),
            1.0,
            False,
            "x",
        )
    )
    _info(out, "(info) the same over all steps", submit_vals("submit_median"), 1.0, "x")
    _info(
        out,
        "(info) the same against a warm back-to-back memcpy "
        f"(1.1 x + 50 us = {_ms(1.1 * t_copy + SUBMIT_SLACK)} ms)",
        submit_vals("submit_steady", warm=True),
        1.0,
        "x",
    )
    # 3b. auto never more than 5 % slower than the better of sync and async (run/step)
    vals = []
    for c in sorted({r["compute"] for r in job["writes"]}):
        a, s, y = w.get((c, AUTO)), w.get((c, SYNC)), w.get((c, ASYNC))
        if a and s and y:
            vals.append((a["run_step"] / min(s["run_step"], y["run_step"]), c))
    if vals:
        out.append(
            _target("auto / the better of sync and async (run/step)", vals, AUTO_TOL, False, "x")
        )
    # 3c. the model's epoch prediction for the steps io="auto" decided, after 3 steps of history
    vals = []
    for r in job["writes"]:
        if r["method"] == AUTO:
            errs = auto_errors(r)
            if errs:
                vals.append((median(errs), r["compute"]))
    if vals:
        out.append(
            _target(
                "auto: model error |measured epoch / predicted - 1|, steps >= 3 (median)",
                vals,
                MODEL_TOL,
                False,
                "",
            )
        )
    # (info) the same over the whole run, backlog included (Eq. 1)
    vals = [
        (e, r["compute"])
        for r in job["writes"]
        if r["method"] == AUTO and (e := auto_run_error(r)) is not None
    ]
    _info(out, "(info) auto: model error over the run, |run/step / mean predicted epoch - 1|", vals)
    # 4. prefetching readers wait ~0 after the first step when compute >= I/O
    vals = [
        (r["wait_later"] / t_read if t_read > 0 else math.inf, r["compute"])
        for r in job["reads"]
        if r["method"] == PREFETCH and r["compute"] >= 1
    ]
    out.append(
        _target(
            "prefetch wait after step 0 / sync read of a step, compute >= I/O",
            vals,
            WAIT_TOL,
            False,
            "x",
        )
    )
    vals = [
        (r["wait_rest"] / t_read if t_read > 0 else math.inf, r["compute"])
        for r in job["reads"]
        if r["method"] == PREFETCH and r["compute"] >= 1 and r.get("wait_rest") is not None
    ]
    _info(out, "(info) the same for steps >= 2 alone", vals, WAIT_TOL, "x")
    return out


def _info(out: list[dict], name: str, vals: list, limit: float = MODEL_TOL, unit: str = "") -> None:
    """A row shown beside the targets, not one of them (its verdict in parentheses)."""
    info = _target(name, vals, limit, False, unit)
    if info["value"] is not None:
        info["verdict"] = f"info ({info['verdict']})"
        out.append(info)


def _target(
    name: str, vals: list, limit: float, higher: bool, unit: str, strict: bool = False
) -> dict:
    if not vals:
        return {"target": name, "value": None, "at": None, "limit": limit, "verdict": "n/a"}
    worst = min(vals) if higher else max(vals)
    ok = (
        (worst[0] > limit if strict else worst[0] >= limit)
        if higher
        else (worst[0] < limit if strict else worst[0] <= limit)
    )
    return {
        "target": name,
        "value": worst[0],
        "at": worst[1],
        "limit": limit,
        "strict": strict,
        "verdict": "met" if ok else "NOT met",
    }


def report(o: dict, jobs: list[dict], argv: list[str]) -> tuple[str, dict]:
    cpus = os.cpu_count() or 1
    out = [
        f"lamina bench async: VPIC-IO-like write and BD-CATS-IO-like read, 8 float32 properties, "
        f"{','.join(map(str, o['mib']))} MiB per rank per step, {o['steps']} steps, repeat {o['repeat']}, "
        + ("durable=True (fsync)" if o["durable"] else "durable=False (page cache, nobody fsyncs)")
        + "; compute phase = time.sleep; medians over repetitions, slowest rank",
        "epoch = (compute + I/O calls) per step in the loop; epoch steps >= "
        f"{STEADY_FROM} = the median of a step's compute + I/O calls from step {STEADY_FROM} on "
        "(the steady state: steps 0 and 1 may copy into new memory); "
        "run/step = (loop + wait + close) / steps; "
        "submit = time of a step's write + end_step calls; meas/pred = epoch / the model's epoch",
    ]
    all_targets = []
    for j in jobs:
        R = j["ranks"]
        over = (
            f" ({R} ranks on {cpus} cores: oversubscribed with the I/O threads)"
            if R >= cpus
            else ""
        )
        out.append("")
        out.append(
            f"### {R} rank(s){over}: {fmt_bytes(j['step_bytes'])} per rank per step "
            f"(8 x {j['elements']:,} float32); t_io {_ms(j['t_io'])} ms (sync write of a step), "
            f"t_copy {_ms(j['t_copy'])} ms (memcpy; {_ms(j['t_copy_new'])} ms into new arrays), t_read {_ms(j['t_read'])} ms (sync read of a step)"
        )
        body = []
        for r in j["writes"]:
            pred = predict(r["method"], r["t_comp"], j["t_io"], j["t_copy"])
            st = r.get("io_stats") or {}
            body.append(
                [
                    f"{r['compute']:g}",
                    _ms(r["t_comp"]),
                    r["method"],
                    _ms(r["epoch"]),
                    _ms(r.get("epoch_steady")),
                    _ms(pred),
                    "-" if pred is None else f"{r['epoch'] / pred:.2f}",
                    _ms(r["submit_median"]),
                    _ms(r.get("submit_steady")),
                    _ms(r.get("copy_median")),
                    _ms(r["end"]),
                    _ms(r["run_step"]),
                    "-" if not st else f"{st.get('steps_background', 0)}",
                    "-" if not st else f"{st.get('waits', 0)} / {_ms(st.get('wait_seconds', 0.0))}",
                ]
            )
            if r["method"] == ASYNC2 and j["auto"]:
                body.append(
                    [
                        f"{r['compute']:g}",
                        _ms(r["t_comp"]),
                        AUTO,
                        "n/a (io='auto' not implemented)",
                        *["-"] * 10,
                    ]
                )
        out.append("#### write")
        out.append(
            table(
                [
                    "compute x t_io",
                    "t_comp ms",
                    "method",
                    "epoch ms",
                    f"epoch steps >= {STEADY_FROM} ms",
                    "pred ms",
                    "meas/pred",
                    "submit ms",
                    f"submit steps >= {STEADY_FROM} ms",
                    "copy ms",
                    "wait+close ms",
                    "run/step ms",
                    "bg steps",
                    "budget waits / ms",
                ],
                body,
                "rrlrrrrrrrrrrr",
            )
        )
        body = []
        for r in j["reads"]:
            st = r.get("io_stats") or {}
            body.append(
                [
                    f"{r['compute']:g}",
                    _ms(r["t_comp"]),
                    r["method"],
                    _ms(r["epoch"]),
                    _ms(r["wait_first"]),
                    _ms(r["wait_later"]),
                    _ms(r["wait_second"]),
                    _ms(r.get("wait_rest")),
                    "-"
                    if r["method"] == SYNC
                    else f"{st.get('prefetch_hits', 0)} / {st.get('prefetch_misses', 0)}",
                ]
            )
        out.append("#### read")
        out.append(
            table(
                [
                    "compute x t_read",
                    "t_comp ms",
                    "method",
                    "epoch ms",
                    "wait step 0 ms",
                    "wait steps >= 1 ms",
                    "step 1",
                    "steps >= 2",
                    "prefetch hits / misses",
                ],
                body,
                "rrlrrrrrr",
            )
        )
        ts = targets(j)
        all_targets.append({"ranks": R, "targets": ts})
        out.append("#### targets")
        out.append(
            table(
                ["target", "value (worst)", "at compute", "limit", "verdict"],
                [
                    [
                        t["target"],
                        "-" if t["value"] is None else f"{t['value']:.2f}x",
                        "-" if t["at"] is None else f"{t['at']:g}",
                        ("< " if t.get("strict") else "<= ") + f"{t['limit']:.2f}x",
                        t["verdict"],
                    ]
                    for t in ts
                ],
                "lrrrl",
            )
        )
        if j["auto"]:
            out.append(f"auto: n/a (io='auto' not implemented): {j['auto']}")
        for n in j.get("notes", []):
            out.append(f"note ({R} ranks): {n}")
        if j.get("loadavg"):
            out.append(
                f"load average before/after the {R}-rank job: "
                f"{j['loadavg'][0]:.2f} / {j['loadavg'][1]:.2f} on {cpus} CPUs"
            )
        if j["failed_checks"]:
            out.append(f"DATA CHECK FAILED for: {', '.join(j['failed_checks'])}")
    command = "lamina bench async " + " ".join(argv)
    out.append(f"command: {command}")
    doc = {
        "benchmark": "async",
        "options": {**o, "machine": common.machine(), "command": command},
        "jobs": jobs,
        "targets": all_targets,
    }
    return "\n".join(out), doc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lamina bench async",
        description="Background I/O (io='async') vs sync and ADIOS2 BP5 AsyncWrite: a VPIC-IO-like "
        "write and a BD-CATS-IO-like read, compute swept as multiples of the I/O time.",
    )
    p.add_argument("--ranks", default="1,2,4", help="rank counts, one MPI job each (default 1,2,4)")
    p.add_argument(
        "--mib",
        default="8,32",
        help="MiB per rank per step, the 8 properties together (default 8,32)",
    )
    p.add_argument("--steps", type=int, default=6, help="steps per run (default 6, at least 2)")
    p.add_argument(
        "--compute",
        default="0.1,0.5,1,2,10",
        help="compute phase as multiples of the measured sync I/O time of a step (default 0.1,0.5,1,2,10)",
    )
    p.add_argument("--repeat", type=int, default=2, help="timed repetitions (default 2)")
    p.add_argument(
        "--durable",
        action="store_true",
        help="lamina durable=True and ADIOS2's files fsynced (default: page cache, nobody fsyncs)",
    )
    common.add_job_arguments(p)
    return p


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    try:
        ranks = common.parse_ranks(ns.ranks)
        mibs = common.parse_int_list(ns.mib, "--mib")
        compute = common.parse_list(ns.compute, "--compute", float, "numbers")
        # (multiples of an I/O time: 1e300 of them is no sleep a run can make)
        if not all(0 <= c <= 1e6 for c in compute):
            raise ValueError(
                f"--compute: expected numbers from 0 to 1e6 (multiples of the I/O time), "
                f"got {ns.compute!r}"
            )
        if ns.steps < 2 or ns.repeat < 1:
            # (a step alone judged the prefetch target on nothing: "met", 0.00 s)
            raise ValueError(
                "--steps must be at least 2 (the targets judge the steps after the first) "
                "and --repeat at least 1"
            )
        for mib in mibs:  # every rank's arrays at once, on this machine
            common.check_memory(
                mib * common.MiB * max(ranks), f"--mib {mib} on {max(ranks)} ranks", max(ranks)
            )
        common.check_disk(  # one run's file of the largest size, at least
            max(mibs) * common.MiB * max(ranks) * ns.steps,
            ns.dir,
            f"--steps {ns.steps} of --mib {max(mibs)} on {max(ranks)} ranks",
        )
    except ValueError as e:
        p.error(str(e))
    per_run = len(WRITES) + len(READS)
    runs = len(compute) * ns.repeat * per_run + 1
    own = ns.dir is None
    base = tempfile.mkdtemp(prefix="lamina-bench-async-") if own else os.path.abspath(ns.dir)
    os.makedirs(base, exist_ok=True)
    bar = launch.make_bar(runs * len(ranks) * len(mibs), "bench async")
    jobs = []
    try:
        for mib in mibs:
            for r in ranks:
                timeout = ns.timeout
                if timeout is None:  # generous: 4 s per GiB written or read per rank, 3x over
                    t_io = max(0.02, mib * common.MiB / common.GiB * 4 * r)
                    timeout = 120 + 3 * ns.steps * runs * t_io * (1 + max(compute))
                d = os.path.join(base, f"async-np{r}-{mib}mib")
                os.makedirs(d, exist_ok=True)
                args = [
                    "--mib",
                    str(mib),
                    "--steps",
                    str(ns.steps),
                    "--compute",
                    ",".join(f"{c:g}" for c in compute),
                    "--repeat",
                    str(ns.repeat),
                    "--seed",
                    str(ns.seed),
                    "--dir",
                    d,
                ]
                if ns.durable:
                    args.append("--durable")
                try:
                    jobs.append(
                        launch.run_job(r, args, bar, timeout, module="lamina.bench.background")
                    )
                finally:
                    common.remove(d)
    except (RuntimeError, FileNotFoundError) as e:
        print(f"lamina bench async: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
        if own:
            common.remove(base)
    o = {
        "ranks": ranks,
        "mib": mibs,
        "steps": ns.steps,
        "compute": compute,
        "repeat": ns.repeat,
        "durable": ns.durable,
    }
    text, doc = report(o, jobs, argv)
    text = checks.add_to_report(model_checks(jobs, doc["options"]["command"]), text, doc)
    common.emit(ns.json, text, doc)
    return 0 if not any(j["failed_checks"] for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
