"""A producer program: writes the benchmark datasets of ``transport_common`` for a few steps.

    transport_producer.py NAME STEPS

The same code writes a file or serves consumers in memory: the transport is
chosen outside, by ``LAMINA_TRANSPORT``.
"""

from __future__ import annotations

import sys

from transport_common import define, say, write_step

import lamina


def main() -> None:
    name, nsteps = sys.argv[1], int(sys.argv[2])
    with lamina.open(name, "w", shallow=["particles"]) as f:
        define(f, nsteps)
        for k in range(nsteps):
            with f.step():
                write_step(f, k, f.comm.rank, f.comm.size)
        rank = f.comm.rank
        size = f.comm.size
    if rank == 0:
        engine = "transport" if f.engine.name == "mpi" else f.engine.name
        say(f"OK producer {name}: {nsteps} steps from {size} ranks ({engine})")


if __name__ == "__main__":
    main()
