"""Collective calls that differ between the ranks of one side of an in situ stream: every
rank raises CollectiveMismatchError, none waits for ever, and the other side hears at once.

    transport_mismatch.py write-define NAME   rank 0 defines a dataset while rank 1 ends a step
    transport_mismatch.py write-close NAME    rank 0 closes while rank 1 defines a dataset
    transport_mismatch.py write-caught NAME   rank 0 ends one step more than rank 1; both catch
                                              the error and close
    transport_mismatch.py write-slow NAME     writes 4 steps, 0.3 s apart, and closes
    transport_mismatch.py read NAME           reads every step, then closes
    transport_mismatch.py read-close NAME     rank 1 closes after the first step while rank 0
                                              waits for the next

Each rank says ``RESULT <role> <rank> <error class or OK> <seconds>``; run with
``LAMINA_TRANSPORT=memory``.
"""

from __future__ import annotations

import sys
import time

from transport_common import say

import lamina


def close_and_say(f, role: str, got: str, t0: float) -> None:
    """Close *f* as a program would after *got* (the error of the calls before, or OK), and
    say both: ``RESULT role rank got[,close's error] seconds``."""
    rank = f.comm.rank
    try:
        f.close()
    except Exception as e:  # noqa: BLE001
        got += "," + type(e).__name__
    say(f"RESULT {role} {rank} {got} {time.monotonic() - t0:.1f}")


def write(role: str, name: str) -> None:
    t0 = time.monotonic()
    f = lamina.open(name, "w")
    rank = f.comm.rank
    u = f.create_dataset("u", shape=(4 * f.comm.size,))
    got = "OK"
    try:
        with f.step():
            u[4 * rank : 4 * rank + 4] = 1
        if role == "write-slow":
            for k in range(3):
                time.sleep(0.3)
                with f.step():
                    u[4 * rank : 4 * rank + 4] = k
        elif role == "write-define":
            if rank == 0:
                f.create_dataset("w", shape=(3,))
            else:
                with f.step():
                    u[4:8] = 2
        elif role == "write-close":
            if rank == 0:
                f.close()
            else:
                f.create_dataset("w", shape=(3,))
        elif role == "write-caught" and rank == 0:  # one step more on rank 0
            with f.step():
                u[0:4] = 2
    except Exception as e:  # noqa: BLE001 - said, and the file closed as a program would
        got = type(e).__name__
    close_and_say(f, role, got, t0)


def read(role: str, name: str) -> None:
    t0 = time.monotonic()
    f = lamina.open(name, "r", wait=30)
    rank = f.comm.rank
    got = "OK"
    try:
        for _ in f.iter_steps(timeout=60):
            if role == "read-close" and rank == 1:
                break
    except Exception as e:  # noqa: BLE001
        got = type(e).__name__
    close_and_say(f, role, got, t0)


def main() -> None:
    role, name = sys.argv[1], sys.argv[2]
    if role.startswith("write"):
        write(role, name)
    else:
        read(role, name)


if __name__ == "__main__":
    main()
