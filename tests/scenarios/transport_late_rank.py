"""A producer rank that finishes its commits late: consumers ask it before it holds the step.

    transport_late_rank.py produce NAME STEPS    2+ ranks; the last rank takes its time after each commit
    transport_late_rank.py consume NAME STEPS    reads every step whole, at once

Consumers get each step's record from producer rank 0 (or another early
rank) and ask every producer rank for its block at once; the late rank gets
the request before it has kept the step's blocks.  It must answer once it
has them, not say that it no longer holds them.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from transport_common import say

import lamina
from lamina.engines.transport import producer

LATE = 0.4  # seconds the last producer rank waits before it keeps a committed step


def produce(name: str, steps: int) -> None:
    comm = lamina.comm.task_comm()
    if comm.rank == comm.size - 1:
        original = producer.Producer._committed

        def late(self, raw):
            time.sleep(LATE)
            original(self, raw)

        producer.Producer._committed = late  # type: ignore[method-assign]
    with lamina.open(name, "w", queue_limit=4) as f:
        x = f.create_dataset("x", (comm.size, 1000), np.int64)
        for k in range(steps):
            with f.step():
                x[comm.rank] = np.full(1000, 1000 * k + comm.rank)


def consume(name: str, steps: int) -> None:
    with lamina.open(name, "r") as f:
        n = 0
        for view in f.iter_steps(timeout=60, poll=1e-3):
            x = view["x"][...]
            expect = 1000 * view.index + np.arange(x.shape[0])[:, None]
            if not (x == expect).all():
                raise AssertionError(f"step {view.index}: wrong values")
            n += 1
    if n != steps:
        raise AssertionError(f"saw {n} of {steps} steps")
    if f.comm.rank == 0:
        say(f"OK late rank: {steps} steps read whole")


if __name__ == "__main__":
    role, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    produce(name, steps) if role == "produce" else consume(name, steps)
