"""A reader under io="async" that leaves the file after an error of its own, on 2 ranks.

Usage: reader_leaves.py PATH

Both ranks write 4 steps, then read them back with ``iter_steps(prefetch=True)``; rank 1
raises inside the loop at step 1, rank 0 hears it (RemoteError).  Once out of ``with``, no
``lamina-prefetch`` thread is left on either rank and no read-ahead array is held (the rank
that left kept both).  Prints ``OK <rank>``.
"""

import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import lamina

comm = MPI.COMM_WORLD
rank = comm.rank
path = sys.argv[1]


class Boom(Exception):
    pass


with lamina.open(path, "w") as f:
    x = f.create_dataset("x", (2, 100_000), "f8")
    for k in range(4):
        with f.step():
            x[rank] = np.full(100_000, k + rank / 10)
prefetcher = None
try:
    with lamina.open(path, "r", io="async") as f:
        prefetcher = f.engine._prefetch
        for view in f.iter_steps(prefetch=True, timeout=30):
            view["x"][rank]
            time.sleep(0.2)  # the next step read ahead meanwhile
            if rank == 1 and view.index == 1:
                raise Boom("rank 1 fails")
except (Boom, lamina.RemoteError):
    pass
time.sleep(0.2)
left = [t.name for t in threading.enumerate() if t.name == "lamina-prefetch"]
if left or prefetcher is None or prefetcher.held:
    raise SystemExit(f"rank {rank}: threads {left}, {prefetcher and prefetcher.held} bytes held")
print(f"OK {rank}", flush=True)
