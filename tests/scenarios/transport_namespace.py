"""Consumer ranks at one step see one namespace, whenever each took records in.

    transport_namespace.py produce NAME     1 rank: 'a' every step; at step 1, after a pause,
                                            dataset 'late' and attribute v = 1
    transport_namespace.py consume NAME     2+ ranks: at step 0, rank 1 waits, then reads
                                            alone (its records come in meanwhile); every rank
                                            then reads each dataset of the step collectively

A consumer applied records as they arrived, in independent calls too: rank 1
saw 'late' and v = 1 at step 0 while rank 0 did not, made one collective read
more than rank 0, and the job aborted (CollectiveMismatchError).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from transport_common import say

import lamina
from lamina.geometry import Box


def produce(name: str) -> None:
    with lamina.open(name, "w") as f:
        a = f.create_dataset("a", (4,), "f8")
        f.attrs["v"] = 0
        for k in range(3):
            if k == 1:
                time.sleep(0.5)
                f.create_dataset("late", (4,), "f8", fill=-1.0)
                f.attrs["v"] = 1
            with f.step():
                a[...] = np.arange(4.0) + k
                if k >= 1:
                    f["late"][0:2] = float(k)
    say("OK producer")


def consume(name: str) -> None:
    seen = []
    with lamina.open(name, "r", wait=30) as f:
        r = f.comm.rank
        for view in f.iter_steps(timeout=60):
            k = view.step
            if r == 1 and k == 0:
                time.sleep(1.0)
                f.at(0)["a"][0:1]  # alone: the records that came meanwhile are taken in
            keys = sorted(view.keys())
            v = int(f.attrs["v"])
            everyone = f.comm.allgather((keys, v))
            assert all(e == everyone[0] for e in everyone), (k, everyone)
            for p in keys:  # the same collective reads on every rank
                got = view[p].read(Box((2 * (r % 2),), (2 * (r % 2) + 2,)), collective=True)
                if p == "a":
                    np.testing.assert_array_equal(got, np.arange(2 * (r % 2), 2 * (r % 2) + 2) + k)
            seen.append((k, keys, v))
    assert [k for k, _, _ in seen] == [0, 1, 2], seen
    assert seen[0][1] == ["a"] and seen[-1][1] == ["a", "late"], seen
    if r == 0:
        say(f"OK consumer {seen}")


if __name__ == "__main__":
    {"produce": produce, "consume": consume}[sys.argv[1]](sys.argv[2])
