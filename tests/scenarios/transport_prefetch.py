"""Read-ahead over the in situ transport: a consumer task streams with ``iter_steps(prefetch=True)``.

    transport_prefetch.py produce NAME STEPS        n producer ranks write u and p for STEPS steps
    transport_prefetch.py produce-forget NAME STEPS ... keeping the tables of one released step
    transport_prefetch.py same NAME STEPS           m consumer ranks read the same boxes at every step
    transport_prefetch.py change NAME STEPS         ... and other boxes from step STEPS // 2 on
    transport_prefetch.py early NAME STEPS          ... and close after 3 steps, with reads in flight
    transport_prefetch.py explicit NAME STEPS       ... with iter_steps() and ds.prefetch(box, k + 1)
    transport_prefetch.py plain NAME STEPS          ... with iter_steps() and plain f["u"] reads
    transport_prefetch.py threads NAME STEPS        ... many boxes and statistics from 4 threads

The consumer opens the name with ``engine="mpi", io="async"``: its reads
ask producer ranks for their pieces over MPI, on the read-ahead thread
while the program computes (a short sleep per step) as well as on the
program's thread.  Every value read is checked (each is a function of its
global index and the step); each consumer rank reads boxes of its own
that cross the producers' blocks.  ``io_stats`` must show read-ahead hits
once the first step has taught the pattern, and, after a change of
selections, misses at that step and hits again after it.  Prints
``OK produce`` and ``OK consume MODE: ...`` on rank 0 of each task.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from _common import check_equal
from transport_common import cuts, say

import lamina
from lamina.catalog import ReleasedStep
from lamina.engines.transport import producer
from lamina.geometry import Box

U = (30, 20)  # float64: producers write row slabs of uneven height
NP = 101  # int64: producers write uneven ranges
COMPUTE = 0.03  # seconds of simulated work per step on the consumer
FIRST = 0.3  # ... at its first step
QUEUE = 4  # steps a producer may hold: it runs ahead of the consumer, which can read ahead
EARLY = 3  # steps the 'early' consumer reads before it closes


def u_values(box: Box, step: int) -> np.ndarray:
    i, j = np.meshgrid(
        np.arange(box.start[0], box.stop[0]), np.arange(box.start[1], box.stop[1]), indexing="ij"
    )
    return (i * 1000 + j + step * 1_000_000).astype(np.float64)


def p_values(a: int, b: int, step: int) -> np.ndarray:
    return np.arange(a, b, dtype=np.int64) * 7 + step * 100_000


def produce(name: str, steps: int, forget: bool = False) -> None:
    """Write *steps* steps; with *forget*, a producer that keeps the tables of one released
    step only (RECORDS_KEPT of one byte): the oldest steps' blocks are then a StepError."""
    if forget:
        producer.RECORDS_KEPT = 1
    with lamina.open(name, "w", engine="mpi", queue_limit=QUEUE) as f:
        rank, size = f.comm.rank, f.comm.size
        f.create_dataset("u", U, np.float64)
        f.create_dataset("p", (NP,), np.int64)
        for k in range(steps):
            with f.step():
                a, b = cuts(U[0], [r + 1 for r in range(size)])[rank]
                box = Box((a, 0), (b, U[1]))
                f["u"][box.slices] = u_values(box, k)
                a, b = cuts(NP, [(r + k) % 3 + 1 for r in range(size)])[rank]
                f["p"][a:b] = p_values(a, b, k)
        if forget:
            forgotten(f, steps)
        # the producer keeps what it wrote of every step, released or not, as a file's
        # writer does (a consumer's release made its blocks a StepError here), within
        # RECORDS_KEPT
        elif len(f["u"].blocks(0)) != size or not f["u"].coverage(0):
            raise AssertionError(f"step 0's blocks: {f['u'].blocks(0)}")
    if rank == 0:
        say(f"OK produce {name}: {steps} steps from {size} ranks")


def forgotten(f, steps: int) -> None:
    """Steps 0 and 1, released (the queue holds QUEUE steps) and older than the one released
    step kept, raise StepError naming the limit; the last step still answers; the tables
    kept of released steps are one step's."""
    for k in (0, 1):
        try:
            f["u"].blocks(k)
        except lamina.StepError as e:
            if f"step {k} was released by every consumer" not in str(
                e
            ) or "RECORDS_KEPT" not in str(e):
                raise
        else:
            raise AssertionError(f"step {k}'s blocks kept past RECORDS_KEPT")
    if len(f["u"].blocks(steps - 1)) != f.comm.size:
        raise AssertionError(f"the last step's blocks: {f['u'].blocks(steps - 1)}")
    cat = f.engine.stack()[-1].catalog
    released = sum(isinstance(s, ReleasedStep) for s in cat.steps)
    if released < steps - QUEUE - 1:
        raise AssertionError(
            f"{released} of {steps} steps forgotten, expected {steps - QUEUE - 1} or more"
        )


def selections(rank: int, size: int, changed: bool) -> tuple[Box, tuple[int, int]]:
    """This consumer rank's box of u and range of p: column slabs across every producer's rows
    (rows 1:-1, so that the box is not a whole block), an uneven range of p; others once changed."""
    if not changed:
        a, b = cuts(U[1], [size - r + 1 for r in range(size)])[rank]
        box = Box((1, a), (U[0] - 1, b))
        pa, pb = cuts(NP, [r + 2 for r in range(size)])[rank]
    else:  # row slabs of the consumer's own, offset from the producers' cuts
        a, b = cuts(U[0] - 3, [1] * size)[rank]
        box = Box((a + 3, 2), (b + 3, U[1] - 2))
        pa, pb = cuts(NP, [1] * size)[rank]
    return box, (pa, pb)


def consume(mode: str, name: str, steps: int) -> None:
    change_at = steps // 2 if mode == "change" else None
    t0 = time.monotonic()
    with lamina.open(name, "r", engine="mpi", io="async") as f:
        rank, size = f.comm.rank, f.comm.size
        if f.io != "async":
            raise AssertionError(f"the consumer reads with io={f.io!r}, not 'async'")
        seen = 0
        hits: list[int] = []  # io_stats after each step
        misses: list[int] = []
        ahead = 0  # steps read ahead whole while the program computed on the step before
        for view in f.iter_steps(prefetch=True, timeout=30):
            k = view.index
            if k != seen:
                raise AssertionError(f"step {k}, expected {seen}")
            box, (pa, pb) = selections(rank, size, change_at is not None and k >= change_at)
            u = view["u"][box.slices]
            p = view["p"][pa:pb]
            col_box = Box((0, U[1] - 1 - rank), (U[0], U[1] - rank))
            col = np.empty(col_box.shape, np.float64)
            view["u"].read(col_box, out=col)  # into the caller's buffer: a copy
            seen += 1
            if mode == "early" and seen == EARLY:
                break  # the next step is being read ahead: close must neither wait for it nor hang
            # compute; the first step is slower (setting up), so the producer runs ahead
            time.sleep(FIRST if k == 0 else COMPUTE)
            if mode == "same" and k >= 1 and f.steps > k + 1:
                # the next step is known: it is read ahead while this one computes (steps 1 to
                # k were read ahead whole, checked below), even on a loaded machine
                per_step = (box.size + (pb - pa) + col_box.size) * 8
                deadline = time.monotonic() + 10
                while f.io_stats["prefetched_bytes"] < (k + 1) * per_step:
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"step {k + 1} was not read ahead during step {k}: {f.io_stats}"
                        )
                    time.sleep(0.005)
                ahead += 1
            check_equal(u, u_values(box, k), f"u step {k} {box}")
            check_equal(p, p_values(pa, pb, k), f"p step {k} {pa}:{pb}")
            check_equal(col, u_values(col_box, k), f"u step {k} {col_box} (out=)")
            st = f.io_stats
            hits.append(st["prefetch_hits"])
            misses.append(st["prefetch_misses"])
        stats = f.io_stats
    took = time.monotonic() - t0
    want = EARLY if mode == "early" else steps
    if seen != want:
        raise AssertionError(f"saw {seen} steps, expected {want}")
    if mode != "early":
        check_counts(hits, misses, change_at)
    if mode == "same" and not ahead:
        raise AssertionError(f"the producer never ran ahead of the consumer: {stats}")
    if rank == 0:
        say(
            f"OK consume {mode}: {seen} steps on {size} ranks in {took:.2f} s, "
            f"hits {stats['prefetch_hits']} misses {stats['prefetch_misses']} "
            f"bytes {stats['prefetched_bytes']}"
            + (f", {ahead} steps read ahead during the step before" if mode == "same" else "")
        )


def explicit(name: str, steps: int) -> None:
    """Plain iter_steps(); at step k, after reading u, ``ds.prefetch`` of u at step k + 1 and of
    a step far ahead, then the rest of step k: asking for step k + 1 ahead releases no step (it
    released step k, and the read of p at step k raised StepError), and a step that has not
    arrived is not waited for (False at once)."""
    with lamina.open(name, "r", engine="mpi", io="async") as f:
        rank, size = f.comm.rank, f.comm.size
        seen = 0
        asked = 0
        for view in f.iter_steps(timeout=30):
            k = view.index
            box, (pa, pb) = selections(rank, size, False)
            check_equal(view["u"][box.slices], u_values(box, k), f"u step {k} {box}")
            t = time.monotonic()
            try:  # not yet: read when asked for (a StepError once the producer closed)
                far = view["u"].prefetch(box, step=k + 50)
            except lamina.StepError as e:
                if "will never exist" not in str(e):
                    raise
                far = False
            if far or time.monotonic() - t > 5:
                raise AssertionError(f"prefetch of step {k + 50}: {far} after waiting for it")
            if k + 1 < steps:
                asked += bool(view["u"].prefetch(box, step=k + 1))
            check_equal(view["p"][pa:pb], p_values(pa, pb, k), f"p step {k} {pa}:{pb}")
            check_equal(view["u"][box.slices], u_values(box, k), f"u step {k} {box} again")
            time.sleep(COMPUTE)
            seen += 1
        stats = f.io_stats
    if seen != steps:
        raise AssertionError(f"saw {seen} steps, expected {steps}")
    if rank == 0:
        say(f"OK consume explicit: {seen} steps on {size} ranks, {asked} read ahead, {stats}")


def plain(name: str, steps: int) -> None:
    """Plain iter_steps() (no read-ahead), the producer running ahead: at step k, after a
    pause in which later steps arrive, a plain ``f["u"]`` reads the latest step every rank
    has (``f.steps - 1``, as for a file) and releases nothing: the view of step k reads
    again.  (It read this rank's latest received step and released step k: the view's
    next read raised StepError.)"""
    with lamina.open(name, "r", engine="mpi") as f:
        rank, size = f.comm.rank, f.comm.size
        seen = ahead = 0
        for view in f.iter_steps(timeout=30):
            k = view.index
            box, _ = selections(rank, size, False)
            check_equal(view["u"][box.slices], u_values(box, k), f"u step {k} {box}")
            time.sleep(COMPUTE * 3)  # the producer commits the next steps meanwhile
            latest = f.steps - 1
            check_equal(f["u"][box.slices], u_values(box, latest), f"plain u, step {latest}")
            check_equal(view["u"][box.slices], u_values(box, k), f"u step {k} {box} again")
            ahead += latest > k
            seen += 1
        # the steps released are gone from memory (a stream kept every step's record and
        # tables): a read of one says so
        cat = f.engine.stack()[-1].catalog
        kept = [j for j in range(seen - 1) if not isinstance(cat.steps[j], ReleasedStep)]
        if kept:
            raise AssertionError(f"released steps {kept} still held")
        try:
            f.at(0)["u"][box.slices]
        except lamina.StepError as e:
            if "step 0 of 'a' was released" not in str(e):
                raise
        else:
            raise AssertionError("step 0 read after its release")
    if seen != steps:
        raise AssertionError(f"saw {seen} steps, expected {steps}")
    if rank == 0:
        say(f"OK consume plain: {seen} steps on {size} ranks, {ahead} with a later step read")


def threads(name: str, steps: int) -> None:
    """Plain iter_steps(); at each step 4 threads read 40 boxes of u (each across the
    producers' blocks) and p, and the blocks' statistics, at once: every value as written
    (the answers to two threads' requests to one producer rank took each other's buffers:
    wrong values, or MPI's truncation error)."""
    from concurrent.futures import ThreadPoolExecutor

    boxes = [Box((i, j), (i + 9, j + 7)) for i in range(0, 21, 4) for j in range(0, 13, 3)]
    with lamina.open(name, "r", engine="mpi") as f, ThreadPoolExecutor(4) as pool:
        rank, size = f.comm.rank, f.comm.size
        seen = 0
        for view in f.iter_steps(timeout=30):
            k = view.index

            def read(box: Box, k: int = k, view=view) -> None:
                check_equal(view["u"][box.slices], u_values(box, k), f"u step {k} {box}")
                a = box.start[0] * 3
                check_equal(view["p"][a : a + 20], p_values(a, a + 20, k), f"p step {k} {a}")

            def stats(k: int = k, view=view) -> None:
                got = max(b.stats.max for b in view["u"].blocks())
                check_equal(np.array(got), np.array(u_values(Box((0, 0), U), k).max()), "max")

            jobs = [pool.submit(read, b) for b in boxes] + [pool.submit(stats) for _ in range(4)]
            for j in jobs:
                j.result()
            seen += 1
    if seen != steps:
        raise AssertionError(f"saw {seen} steps, expected {steps}")
    if rank == 0:
        say(f"OK consume threads: {seen} steps on {size} ranks, {len(boxes)} boxes a step")


def check_counts(hits: list[int], misses: list[int], change_at: int | None) -> None:
    """Read-ahead served every read after the first step; changed selections miss, then hit again."""
    where = f"hits after each step {hits}, misses {misses}"
    if hits[0] != 0:
        raise AssertionError(f"the first step teaches the pattern, nothing to hit: {where}")
    for k in range(1, len(hits)):
        got, missed = hits[k] - hits[k - 1], misses[k] - misses[k - 1]
        if k == change_at:  # a new box of u and range of p; the column as before
            if (got, missed) != (1, 2):
                raise AssertionError(f"step {k}, the change: {got} hits, {missed} misses: {where}")
        elif (got, missed) != (3, 0):
            raise AssertionError(f"step {k}: {got} hits, {missed} misses, not 3 and 0: {where}")


def main() -> None:
    role, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role in ("produce", "produce-forget"):
        produce(name, steps, forget=role == "produce-forget")
    elif role in ("same", "change", "early"):
        consume(role, name, steps)
    elif role == "explicit":
        explicit(name, steps)
    elif role == "plain":
        plain(name, steps)
    elif role == "threads":
        threads(name, steps)
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
