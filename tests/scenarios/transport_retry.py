"""A consumer that opens again after its open found no producer (a TransportError).

    transport_retry.py produce NAME    opens NAME for writing 3 s after the launch, writes a step
    transport_retry.py consume NAME    opens NAME with a 0.5 s timeout, again after each failure

    transport_retry.py produce-alone NAME   opens NAME for writing 3 s after the launch
    transport_retry.py consume-once NAME    opens NAME with a 0.5 s timeout once, then stays

The producer's open must pair with the consumer's retry: a failed open had taken the
number the rendezvous pairs opens on, the producer's first open answered the stale
greeting of the consumer's first one, and waited for ever in MPI's intercommunicator
creation.  Prints ``OK produce`` and ``OK consume: N failed opens first``.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from transport_common import say

import lamina

LATE = 3.0  # seconds the producer takes before it opens
TIMEOUT = 0.5  # the consumer's timeout for each open


def produce(name: str) -> None:
    lamina.comm.task_comm()  # (with the consumer's: the launch's first collective)
    time.sleep(LATE)
    with lamina.open(name, "w", timeout=20) as f:
        f.create_dataset("a", (4,), np.float64)
        with f.step():
            f["a"][...] = 1.5
    say("OK produce")


def consume(name: str) -> None:
    lamina.comm.task_comm()
    failed = 0
    while True:
        try:
            f = lamina.open(name, "r", timeout=TIMEOUT)
            break
        except lamina.TransportError:
            failed += 1
            if failed > 60:
                raise
    with f:
        got = [v["a"][...].tolist() for v in f.iter_steps(timeout=20)]
    if got != [[1.5] * 4]:
        raise AssertionError(f"read {got}")
    if not failed:
        raise AssertionError(f"the first open paired: the producer opened within {TIMEOUT} s")
    say(f"OK consume: {failed} failed opens first")


def produce_alone(name: str) -> None:
    """The consumer gave up before this opened, for good: the open raises within its timeout
    (it answered the stale greeting, and waited in Create_intercomm for ever)."""
    lamina.comm.task_comm()
    time.sleep(LATE)
    t0 = time.monotonic()
    try:
        lamina.open(name, "w", timeout=4)
    except lamina.TransportError as e:
        if "did not take its answer" not in str(e):
            raise
        say(f"OK produce-alone in {time.monotonic() - t0:.1f} s")
        return
    raise AssertionError("the open paired with a consumer that had given up")


def consume_once(name: str) -> None:
    lamina.comm.task_comm()
    try:
        lamina.open(name, "r", timeout=TIMEOUT)
    except lamina.TransportError:
        time.sleep(LATE + 6)  # alive, in no MPI call, while the producer opens
        say("OK consume-once")
        return
    raise AssertionError(f"the open paired: the producer opened within {TIMEOUT} s")


if __name__ == "__main__":
    role, name = sys.argv[1], sys.argv[2]
    {
        "produce": produce,
        "consume": consume,
        "produce-alone": produce_alone,
        "consume-once": consume_once,
    }[role](name)
