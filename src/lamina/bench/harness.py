"""Worker side of the benchmarks: the context of one MPI job and the timing loop.

Every method runs on the same per-rank array in the same job.  A timed run
starts when all ranks leave a barrier and ends when the slowest rank is
done (the maximum over ranks of each rank's elapsed time).  Waits that are
the benchmark's own (barriers around timed regions, the h5py token) sleep
between polls instead of spinning, because MPICH busy-waits and several
ranks on few cores would otherwise steal the CPU from the rank doing I/O.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import comm as lcomm
from ..geometry import Box
from . import common

MPI = lcomm.MPI
TAG_TOKEN = 4242


@dataclass
class Method:
    """One row of the table: *run* is timed; *prepare* and *after* are not."""

    name: str
    family: str
    run: Callable[[], object]
    prepare: Callable[[], None] | None = None
    after: Callable[[object, int], None] | None = None  # (result, repetition index)
    group: str = "same"  # read: 'same' or 'slabs' decomposition
    note: str = ""


@dataclass
class Ctx:
    comm: object
    rank: int
    size: int
    local: np.ndarray
    box: Box
    gshape: tuple[int, ...]
    dir: str
    fsync: bool
    drop_caches: bool
    repeat: int
    warmup: int
    aggregators: list[int]
    families: list[str]
    seed: int
    notes: list[str] = field(default_factory=list)
    dropped: bool | None = None

    @property
    def nbytes(self) -> int:
        """Bytes per rank."""
        return int(self.local.nbytes)

    # ----------------------------------------------------- communication
    def wait(self, req) -> None:
        """Complete an MPI request, sleeping between polls (no busy-wait)."""
        delay = 1e-5
        while not req.Test():
            time.sleep(delay)
            delay = min(delay * 2, 5e-4)

    def barrier(self) -> None:
        if self.size > 1:
            self.wait(self.comm.Ibarrier())

    def max(self, x: float) -> float:
        if self.size == 1:
            return float(x)
        self.barrier()
        return float(self.comm.allreduce(float(x), op=MPI.MAX))

    def all_true(self, ok: bool) -> bool:
        if self.size == 1:
            return bool(ok)
        self.barrier()
        return bool(self.comm.allreduce(int(bool(ok)), op=MPI.MIN))

    def token_wait(self) -> None:
        """Wait for the turn of this rank (rank r after rank r-1)."""
        if self.rank > 0:
            buf = np.zeros(1, dtype=np.int64)
            self.wait(self.comm.Irecv(buf, source=self.rank - 1, tag=TAG_TOKEN))

    def token_pass(self) -> None:
        if self.rank + 1 < self.size:
            self.wait(
                self.comm.Isend(np.ones(1, dtype=np.int64), dest=self.rank + 1, tag=TAG_TOKEN)
            )

    def in_turn(self, fn: Callable[[], None]) -> None:
        """Run *fn* on one rank at a time, in rank order (untimed set-up)."""
        self.token_wait()
        fn()
        self.token_pass()
        self.barrier()

    # ---------------------------------------------------------- helpers
    def progress(self, label: str) -> None:
        if self.rank == 0:
            sys.stdout.write(f"{common.PROGRESS}step {label}\n")
            sys.stdout.flush()

    def note(self, text: str) -> None:
        if self.rank == 0 and text not in self.notes:
            self.notes.append(text)

    def settle(self) -> None:
        """Untimed: write back dirty pages (and drop the cache if asked) before a timed run."""
        if self.rank == 0:
            if self.drop_caches:
                ok = common.drop_caches()
                if not ok and self.dropped is None:
                    self.note(
                        "--drop-caches: not permitted here (needs root); the page cache was kept"
                    )
                self.dropped = ok if self.dropped is None else (self.dropped and ok)
            else:
                import os

                os.sync()
        self.barrier()

    def timed(self, fn: Callable[[], object]) -> tuple[float, object]:
        """Collective: run *fn* on every rank from a common start; (slowest rank's seconds, local result)."""
        self.barrier()
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        return self.max(dt), out

    def measure(self, methods: list[Method]) -> list[dict]:
        """Time every method *repeat* times, rotating their order between repetitions."""
        times: dict[str, list[float]] = {m.name: [] for m in methods}
        n = len(methods)
        for w in range(
            self.warmup
        ):  # untimed: first-call costs (imports, MPI connections, thread start)
            for m in methods:
                if m.prepare is not None:
                    m.prepare()
                self.settle()
                _, out = self.timed(m.run)
                if m.after is not None:
                    m.after(out, -1 - w)
                del out
                self.barrier()
            self.progress(f"warm-up {w + 1}")
        for rep in range(self.repeat):
            order = methods[rep % n :] + methods[: rep % n] if n else []
            for m in order:
                if m.prepare is not None:
                    m.prepare()
                self.settle()
                dt, out = self.timed(m.run)
                if m.after is not None:
                    m.after(out, rep)
                del out
                self.barrier()
                times[m.name].append(dt)
                self.progress(f"{m.name} ({rep + 1}/{self.repeat})")
        rows = []
        for m in methods:
            s = common.summarize(times[m.name])
            rows.append({"name": m.name, "family": m.family, "group": m.group, "note": m.note, **s})
        return rows

    def check(self, ok: bool, what: str) -> None:
        """Collective: fail the job (all ranks) if *ok* is False on any rank."""
        if not self.all_true(ok):
            if self.rank == 0:
                print(f"lamina bench: verification failed: {what}", file=sys.stderr, flush=True)
            self.comm.Abort(3)


def make_ctx(ns) -> Ctx:
    comm = lcomm.world()
    rank, size = comm.rank, comm.size
    shape = common.block_shape(ns.size)
    local = common.make_local(shape, rank, ns.seed)
    gshape = (shape[0] * size, *shape[1:])
    box = Box.from_offset((shape[0] * rank, 0, 0), shape)
    fams = [f for f in ns.methods.split(",") if f]
    aggs = common.resolve_aggregators(common.parse_aggregators(ns.aggregators), size)
    return Ctx(
        comm,
        rank,
        size,
        local,
        box,
        gshape,
        ns.dir,
        ns.fsync,
        ns.drop_caches,
        ns.repeat,
        ns.warmup,
        aggs,
        fams,
        ns.seed,
    )
