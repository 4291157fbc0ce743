"""Consumers that ask for steps ahead, read collectively or leave after an error; lent blocks under ``both``.

    transport_ahead.py produce NAME STEPS          x = arange(4) + 10 k at step k (rank 0 writes
                                                   it, lent: ``write(copy=False)``), queue_limit 2
    transport_ahead.py start NAME STEPS            iter_steps(start=3): steps 3.. (no hang while
                                                   the producer waits for releases)
    transport_ahead.py wait NAME                   wait_for_step(1), then wait_for_step(3)
    transport_ahead.py every NAME STEPS            flow=2: at(0), then at(3) (the producer's 6)
    transport_ahead.py every-wait NAME STEPS       flow=2: wait_for_step(3) (the producer's 6)
    transport_ahead.py slow NAME STEPS GAP         as produce, GAP seconds before each step
    transport_ahead.py latest-last NAME STEPS      flow='latest', iter_steps, then the last step
                                                   read again after the loop ends
    transport_ahead.py keep-up NAME STEPS          flow='latest', iter_steps, a consumer quicker
                                                   than the producer: sees most steps
    transport_ahead.py rows NAME                   2 producer ranks: an 8 x 8 grid by row slabs
    transport_ahead.py columns NAME                reads it by column slabs, independently and with
                                                   ``collective=True``
    transport_ahead.py leave NAME                  rank 1 raises inside ``with``: both ranks leave
    transport_ahead.py goes-on NAME STEPS          a producer that must finish its steps although
                                                   its consumer left
    transport_ahead.py fails NAME [HOW]            rank 1 raises after step 1 (HOW 'one', 2 ranks),
                                                   or rank 0 of 1 ('alone'), or step 2 overlaps on
                                                   every rank ('all': a collective OverlapError); the
                                                   program leaves the file on every rank
    transport_ahead.py follows NAME                iter_steps: TransportError "the producer left"
                                                   at once after steps 0 and 1, not after a timeout
    transport_ahead.py fails-late NAME IO          2 ranks, queue_limit 3, io IO: rank 1 raises
                                                   after step 3 ended on every rank
    transport_ahead.py hands-out NAME HOW          io='async', iter_steps with read-ahead ('ahead')
                                                   or without ('plain'; 'skip': step 2 not read),
                                                   slow at step 2: steps 0 to 3 handed out, then
                                                   "the producer left" at once
    transport_ahead.py drain SENT                  2 ranks of one program: rank 0 sends 8 messages,
                                                   makes SENT; rank 1 takes them all in one poll loop

Each program prints ``OK <role>: ...`` when what it saw is right.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from transport_common import say

import lamina
from lamina import comm as lcomm


def expected(k: int) -> np.ndarray:
    return np.arange(4) + 10 * k


def produce(name: str, steps: int, gap: float = 0.0) -> None:
    t0 = time.monotonic()
    with lamina.open(name, "w", queue_limit=2) as f:
        x = f.create_dataset("x", (4,), np.int64, fill=-1)
        for k in range(steps):
            time.sleep(gap)
            with f.step():
                if f.comm.rank == 0:
                    x.write(expected(k), copy=False)
        rank = f.comm.rank
    if rank == 0:
        say(f"OK produce: {steps} steps in {time.monotonic() - t0:.2f} s")


def start(name: str, steps: int) -> None:
    seen = []
    with lamina.open(name, "r") as f:
        for v in f.iter_steps(start=3, timeout=60):
            got = v["x"][...]
            if not np.array_equal(got, expected(v.index)):
                raise AssertionError(f"step {v.index}: {got}")
            seen.append(v.index)
    if seen != list(range(3, steps)):
        raise AssertionError(f"saw steps {seen}")
    say(f"OK start: steps {seen}")


def wait(name: str) -> None:
    with lamina.open(name, "r") as f:
        one = f.wait_for_step(1, timeout=60)["x"][...]
        three = f.wait_for_step(3, timeout=60)["x"][...]
    if not (np.array_equal(one, expected(1)) and np.array_equal(three, expected(3))):
        raise AssertionError(f"steps 1 and 3: {one} {three}")
    say("OK wait: steps 1 and 3")


def every(name: str, steps: int) -> None:
    with lamina.open(name, "r", flow=2) as f:
        zero = f.at(0)["x"][...]
        three = f.at(3)["x"][...]  # the producer's step 6
        real = f.engine.stack()[-1].producer_step(3)
    if not (np.array_equal(zero, expected(0)) and np.array_equal(three, expected(6))):
        raise AssertionError(f"steps 0 and 3: {zero} {three}")
    if real != 6:
        raise AssertionError(f"step 3 is the producer's {real}")
    say("OK every: steps 0 and 3 (the producer's 6)")


def every_wait(name: str) -> None:
    with lamina.open(name, "r", flow=2) as f:
        three = f.wait_for_step(3, timeout=60)["x"][...]  # the producer's step 6
    if not np.array_equal(three, expected(6)):
        raise AssertionError(f"step 3: {three}")
    say("OK every-wait: step 3 (the producer's 6)")


def keep_up(name: str, steps: int) -> None:
    seen = []
    with lamina.open(name, "r", flow="latest") as f:
        for v in f.iter_steps(timeout=60):
            got = v["x"][...]
            seen.append(int(got[0]) // 10)
            if not np.array_equal(got, expected(seen[-1])):
                raise AssertionError(f"step {v.index}: {got}")
    if seen != sorted(set(seen)) or seen[-1] != steps - 1 or len(seen) < steps // 2:
        raise AssertionError(f"saw the producer's steps {seen}")
    say(f"OK keep-up: saw {len(seen)} of {steps} steps: {seen}")


def latest_last(name: str, steps: int) -> None:
    with lamina.open(name, "r", flow="latest") as f:
        for _ in f.iter_steps(timeout=60):
            pass
        got = f["x"][...]  # the last step, still held once the stream ended
    if not np.array_equal(got, expected(steps - 1)):
        raise AssertionError(f"the last step read {got}")
    say("OK latest-last")


GRID = np.arange(64, dtype=np.int64).reshape(8, 8)


def rows(name: str) -> None:
    with lamina.open(name, "w") as f:
        g = f.create_dataset("g", GRID.shape, GRID.dtype)
        r = f.comm.rank
        with f.step():
            g[4 * r : 4 * r + 4] = GRID[4 * r : 4 * r + 4]
        rank = f.comm.rank
    if rank == 0:
        say("OK rows")


def columns(name: str) -> None:
    with lamina.open(name, "r") as f:
        r = f.comm.rank
        v = f.at(0)["g"]
        cols = np.s_[:, 4 * r : 4 * r + 4]
        alone = v.read(cols)
        together = v.read(cols, collective=True)
    for got in (alone, together):
        if not np.array_equal(got, GRID[cols]):
            raise AssertionError(f"rank {r}: {got}")
    say(f"OK columns {r}: independent and collective")


def leave(name: str) -> None:
    rank = lcomm.task_comm().rank
    try:
        with lamina.open(name, "r") as f:
            for v in f.iter_steps(timeout=60):
                v["x"][...]
                if f.comm.rank == 1:
                    raise ValueError("rank 1 of the consumer fails")
    except ValueError:
        if rank != 1:
            raise
    except lamina.errors.RemoteError as e:
        if rank != 0 or not getattr(e, "lamina_left", False):
            raise
    say(f"OK leave {rank}")


def goes_on(name: str, steps: int) -> None:
    produce(name, steps)


def fails(name: str, how: str = "one") -> None:
    """Producer ranks that fail after step 1: one rank raises ('one', 'alone'), every rank
    finds the ranks' overlap at step 2 ('all'), in the background where the program may
    have ended every step by then ('async'), or in close, which commits step 2 left open
    ('close')."""
    rank = lcomm.task_comm().rank
    try:
        with lamina.open(name, "w", io="async" if how == "async" else "sync") as f:
            x = f.create_dataset("x", (4,), np.int64)
            for k in range(5):
                if how == "close" and k == 2:
                    x.write(expected(k))  # every rank: close commits the step and finds them meet
                    break
                with f.step():
                    if f.comm.rank == 0 or (how in ("all", "async") and k == 2):
                        x.write(expected(k))  # (at step 2 under 'all': the ranks overlap)
                if k == 1 and f.comm.rank == f.comm.size - 1 and how in ("one", "alone"):
                    raise RuntimeError(f"producer rank {f.comm.rank} fails")
    except Exception as e:  # noqa: BLE001 - every rank leaves, one way or another
        say(f"OK fails {rank}: {type(e).__name__}")


def follows(name: str) -> None:
    rank = lcomm.task_comm().rank
    seen = []
    t0 = time.monotonic()
    try:
        with lamina.open(name, "r") as f:
            for v in f.iter_steps(timeout=60):
                seen.append(int(v["x"][0]) // 10)
    except (lamina.errors.TransportError, lamina.RemoteError) as e:
        # (RemoteError: another consumer rank heard it first and left.)  The producer left
        # after step 1 was committed: whether its data were served before is a race, so the
        # steps read are a prefix of 0, 1
        took = time.monotonic() - t0
        if "the producer left the stream" in str(e) and seen == [0, 1][: len(seen)]:
            say(f"OK follows {rank}: in {took:.2f} s after {seen}")
            return
        raise
    raise AssertionError(f"rank {rank}: the stream ended without an error after {seen}")


def fails_late(name: str, io: str) -> None:
    """Producer ranks (2, each writing half of x) that leave after step 3 ended on every rank:
    rank 1 raises, rank 0 is told.  With queue_limit 3 the producer ends step 3 only once its
    consumer asked for step 2 (released step 1), so steps 0 and 1 are always served."""
    rank = lcomm.task_comm().rank
    try:
        with lamina.open(name, "w", io=io, queue_limit=3) as f:
            x = f.create_dataset("x", (4,), np.int64)
            r = f.comm.rank
            for k in range(6):
                with f.step():
                    x[2 * r : 2 * r + 2] = expected(k)[2 * r : 2 * r + 2]
                if k == 3 and r == 1:
                    raise RuntimeError("producer rank 1 fails after step 3")
    except Exception as e:  # noqa: BLE001 - every rank leaves, one way or another
        say(f"OK fails-late {rank}: {type(e).__name__}")


def hands_out(name: str, how: str) -> None:
    """One consumer rank, io='async', iter_steps with read-ahead ('ahead') or without ('plain';
    'skip' reads nothing at step 2, so that the records of step 3 and of the producer's end
    arrive together at the wait for step 3) of the producer of ``fails-late``; it lingers at
    step 2 while the producer leaves.

    Every step received (0 to 3) is handed out before the stream ends; a read of a step's
    data gives its values or, where the producer left before serving them, "the producer
    left" at once (each failure is caught and the stream goes on); the stream then ends with
    "the producer left ... (4 received)" at once: no timeout (10 s) is waited anywhere."""
    handed: list[int] = []
    read: list[int] = []
    t0 = time.monotonic()
    try:
        with lamina.open(name, "r", io="async") as f:
            for v in f.iter_steps(timeout=60, prefetch=how == "ahead"):
                handed.append(v.index)
                if v.index == 2:
                    time.sleep(1.0)  # the producer, released up to step 2, leaves meanwhile
                    if how == "skip":
                        continue
                t = time.monotonic()
                try:
                    got = v["x"][...]
                except lamina.errors.TransportError as e:
                    if "the producer left the stream" not in str(e) or time.monotonic() - t > 2:
                        raise
                    continue
                if not np.array_equal(got, expected(v.index)):
                    raise AssertionError(f"step {v.index}: {got}")
                read.append(v.index)
    except lamina.errors.TransportError as e:
        took = time.monotonic() - t0
        if (
            "the producer left the stream" in str(e)
            and "(4 received)" in str(e)
            and handed == [0, 1, 2, 3]
            and read == [k for k in handed if k != 2 or how != "skip"][: len(read)]
            and len(read) >= 2
        ):
            say(f"OK hands-out: handed out {handed}, read {read}, in {took:.2f} s")
            return
        raise AssertionError(f"handed out {handed}, read {read}, after {took:.1f} s: {e}") from e
    raise AssertionError(f"the stream ended without an error after {handed}")


def drain(sent: str) -> None:
    """Messages that arrived are all taken by one loop of polls (``lcomm.poll_bytes`` until it
    finds none): MPICH's ``Iprobe`` finds at one call what an earlier one moved.  Rank 0 makes
    the file *sent* once its sends are complete; rank 1 waits for it without an MPI call (a
    sleep alone ran out before a rank 0 slower to start had sent anything)."""
    c = lcomm.world()
    if c.rank == 0:
        reqs = [c.Isend(np.full(300, i, np.uint8), 1, 11) for i in range(8)]
        lcomm.MPI.Request.Waitall(reqs)
        with open(sent, "w") as fh:
            fh.write("sent\n")
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(sent):
            if time.monotonic() > deadline:
                raise AssertionError("rank 0 did not send within 60 s")
            time.sleep(0.01)
        time.sleep(0.5)  # every message arrived, none probed yet
        got = []
        while (m := lcomm.poll_bytes(c, 0, 11)) is not None:
            got.append(int(m[1][0]))
        if got != list(range(8)):
            raise AssertionError(f"one loop of polls took {got}")
        say("OK drain: 8 messages in one loop")
    c.Barrier()


if __name__ == "__main__":
    role, name, *rest = [*sys.argv[1:], ""][:2] + sys.argv[3:]
    if role == "produce":
        produce(name, int(rest[0]))
    elif role == "start":
        start(name, int(rest[0]))
    elif role == "wait":
        wait(name)
    elif role == "every":
        every(name, int(rest[0]))
    elif role == "every-wait":
        every_wait(name)
    elif role == "slow":
        produce(name, int(rest[0]), float(rest[1]))
    elif role == "latest-last":
        latest_last(name, int(rest[0]))
    elif role == "keep-up":
        keep_up(name, int(rest[0]))
    elif role == "rows":
        rows(name)
    elif role == "columns":
        columns(name)
    elif role == "leave":
        leave(name)
    elif role == "goes-on":
        goes_on(name, int(rest[0]))
    elif role == "drain":
        drain(name)
    elif role == "fails":
        fails(name, *rest)
    elif role == "follows":
        follows(name)
    elif role == "fails-late":
        fails_late(name, *rest)
    elif role == "hands-out":
        hands_out(name, *rest)
    else:
        raise SystemExit(f"unknown role {role!r}")
