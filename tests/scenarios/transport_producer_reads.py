"""What a producer reads back of its own steps, under each transport ($LAMINA_TRANSPORT).

    transport_producer_reads.py produce NAME   1+ ranks: one step of 'a' (rows of ones, then
                                               0..31), 'e' left unwritten, 'd' = a * 2 recomputed
                                               when read; then queries, reads and blocks()
    transport_producer_reads.py consume NAME   follows the steps

Under 'file' and 'both' the producer reads from its file: the queries answer
(one ruled out by the statistics, one that reads data) and reads give what
was written. Under 'memory' every query and every read is a ModeError,
whether or not the statistics could answer it and whether or not the box
holds blocks; its blocks carry no statistics (they are reduced for
consumers).
"""

from __future__ import annotations

import os
import sys

import numpy as np
from transport_common import say

import lamina

MESSAGE = "cannot read back what it wrote"


def produce(name: str) -> None:
    tr = os.environ.get("LAMINA_TRANSPORT", "file")
    with lamina.open(name, "w") as f:
        rank = f.comm.rank
        f.create_dataset("a", (8, 8), "f8")
        f.create_dataset("e", (4,), "f8", fill=-1.0)
        f.derive("d", "a * 2", "expression")
        want = np.ones((8, 8))
        want[4:8] = np.arange(32.0).reshape(4, 8)
        with f.step():
            if rank == 0:
                f["a"][0:4] = want[0:4]
                f["a"][4:8] = want[4:8]
        if tr == "memory":
            for what, call in (
                ("query ruled out by statistics", lambda: f.query("a > 100")),
                ("query that reads", lambda: f.query("a > 0.5")),
                ("query of no block", lambda: f.query("e > 0")),
                ("read", lambda: f["a"][...]),
                ("read of no block", lambda: f["e"][...]),
                ("read of a derived quantity", lambda: f["d"][...]),
            ):
                try:
                    call()
                except lamina.ModeError as e:
                    assert MESSAGE in str(e), (what, e)
                else:
                    raise AssertionError(f"memory producer: {what} answered")
            assert all(b.stats is None for b in f["a"].blocks())
        else:
            assert f.query("a > 100").count == 0
            assert f.query("a > 0.5").count == 63
            assert f.query("d > 61").count == 1
            assert f.query("e > 0").count == 0
            np.testing.assert_array_equal(f["a"][...], want)
            np.testing.assert_array_equal(f["e"][...], np.full(4, -1.0))
            np.testing.assert_array_equal(f["d"][...], want * 2)
            stats = [(b.stats.min, b.stats.max) for b in f["a"].blocks()]
            assert stats == [(1.0, 1.0), (0.0, 31.0)], stats
    if rank == 0:
        say(f"OK producer {tr}")


def consume(name: str) -> None:
    with lamina.open(name, "r", wait=30) as f:
        n = sum(1 for _ in f.iter_steps(timeout=30))
        if f.comm.rank == 0:
            say(f"OK consumer {n} steps")


if __name__ == "__main__":
    role, name = sys.argv[1:3]
    if role == "produce":
        produce(name)
    elif role == "consume":
        consume(name)
    else:
        raise SystemExit(f"unknown role {role!r}")
