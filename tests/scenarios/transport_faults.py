"""Transport faults: each must give TransportError within the timeout, never a hang.

    transport_faults.py orphan-idle          a program that opens nothing transported
    transport_faults.py orphan-read NAME     opens NAME for reading; nobody produces it
    transport_faults.py stall-write NAME DIR writes steps 0 and 1, then is busy elsewhere until DIR/gave-up exists
    transport_faults.py apart-write NAME     two ranks a step apart (an error inside one rank's step)
    transport_faults.py apart-read NAME      reads the one step committed, then the end of the stream
    transport_faults.py stall-read NAME DIR  reads step 0, then step 1 and step 2 while the producer is busy:
                                             with a serving thread (LAMINA_TRANSPORT_SERVE=thread) step 1 is
                                             answered and only step 2 fails; serving in calls only, both fail

Run with ``LAMINA_TRANSPORT=memory`` and a short ``LAMINA_TRANSPORT_TIMEOUT``.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from transport_common import say

import lamina
from lamina.errors import TransportError


def expect_transport_error(fn, what: str) -> float:
    limit = float(os.environ["LAMINA_TRANSPORT_TIMEOUT"])
    t0 = time.monotonic()
    try:
        fn()
    except TransportError as e:
        took = time.monotonic() - t0
        if not isinstance(e, ConnectionError):
            raise AssertionError("TransportError is not a ConnectionError") from e
        if took > limit + 10:
            raise AssertionError(
                f"{what}: TransportError only after {took:.1f} s (timeout {limit} s)"
            ) from e
        return took
    raise AssertionError(f"{what}: no TransportError")


def main() -> None:
    role = sys.argv[1]
    comm = lamina.comm.task_comm()  # every program of the launch takes part in the task split
    if role == "orphan-idle":
        time.sleep(0.2)
        say("OK idle")
    elif role == "orphan-read":
        took = expect_transport_error(
            lambda: lamina.open(sys.argv[2], "r"), "open of a name nobody produces"
        )
        if comm.rank == 0:
            say(f"OK orphan: TransportError after {took:.1f} s")
    elif role == "stall-write":
        marker = os.path.join(sys.argv[3], "gave-up")
        with lamina.open(sys.argv[2], "w") as f:
            f.create_dataset("x", (4,), np.int64)
            for k in range(2):
                with f.step():
                    if f.comm.rank == 0:
                        f["x"][:] = np.arange(4) + k
            # busy elsewhere: no step 2; step 1 is served by the serving thread, if any, until close
            while not os.path.exists(marker):
                time.sleep(0.05)
        if comm.rank == 0:
            say("OK stalled producer closed")
    elif role == "stall-read":
        with lamina.open(sys.argv[2], "r") as f:
            if list(f.at(0)["x"][:]) != [0, 1, 2, 3]:
                raise AssertionError("step 0")
            view = f.at(1)  # releases step 0: the producer leaves end_step and is busy elsewhere
            comm.Barrier()
            time.sleep(0.5)  # every consumer rank released step 0: give the producer time to leave
            if os.environ.get("LAMINA_TRANSPORT_SERVE", "thread") == "thread":
                t0 = time.monotonic()
                if list(view["x"][:]) != [1, 2, 3, 4]:
                    raise AssertionError("step 1 from a busy producer")
                took = time.monotonic() - t0
                what = "answered in"
            else:
                took = expect_transport_error(
                    lambda: view["x"][:], "reading from a producer that does not answer"
                )
                what = "TransportError after"
            took2 = expect_transport_error(lambda: f.at(2), "waiting for a step that never comes")
            comm.Barrier()
            if comm.rank == 0:
                with open(os.path.join(sys.argv[3], "gave-up"), "w") as m:
                    m.write("x\n")
            # close: the producer answers again in its close, late answers are dropped
        if comm.rank == 0:
            say(f"OK stall: step 1 {what} {took:.3f} s, step 2: TransportError after {took2:.1f} s")
    elif role == "apart-write":
        # rank 1 fails inside its step 1 and goes on, one step more than the others make: the
        # commits that would mix two steps raise StepError on every rank, the close is clean
        said = []
        with lamina.open(sys.argv[2], "w") as f:
            x = f.create_dataset("x", (f.comm.size,), np.float64)
            for k in range(5 if f.comm.rank == 1 else 4):
                try:
                    with f.step():
                        if f.comm.rank == 1 and k == 1:
                            raise ValueError("rank 1 fails in its step")
                        x[f.comm.rank] = 10 * k + f.comm.rank
                except ValueError:
                    pass
                except lamina.LaminaError as e:
                    said.append(type(e).__name__)
        if not said or set(said) != {"StepError"}:
            raise AssertionError(f"rank {comm.rank}: {said}")
        comm.Barrier()
        if comm.rank == 0:
            say(f"OK apart producer closed after {len(said)} StepErrors")
    elif role == "apart-read":
        with lamina.open(sys.argv[2], "r") as f:
            got = [view["x"][...].tolist() for view in f.iter_steps()]
        if got != [[0.0, 1.0]]:
            raise AssertionError(f"steps read: {got}")
        if comm.rank == 0:
            say("OK apart consumer read step 0 alone")
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
