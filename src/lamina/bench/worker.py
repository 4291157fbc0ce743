"""The MPI side of ``lamina bench``: ``mpiexec -n R python -m mpi4py -m lamina.bench.worker MODE ...``.

Launched by the parent (``lamina bench write|read``), not meant to be run
by hand.  Rank 0 writes the job's results as JSON to ``--out`` and reports
progress on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import common


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lamina.bench.worker")
    p.add_argument("mode", choices=("write", "read"))
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--aggregators", default="1,all")
    p.add_argument("--dir", required=True)
    p.add_argument("--methods", default=",".join(common.FAMILIES))
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--fsync", action="store_true")
    p.add_argument("--drop-caches", action="store_true")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if argv is None else argv)
    from .harness import make_ctx

    ctx = make_ctx(ns)
    if ns.mode == "write":
        from .write import worker
    else:
        from .read import worker
    result = worker(ctx)
    ctx.barrier()
    if ctx.rank == 0:
        doc = {
            "mode": ns.mode,
            "ranks": ctx.size,
            "bytes_per_rank": ctx.nbytes,
            "local_shape": list(ctx.local.shape),
            "global_shape": list(ctx.gshape),
            "aggregators": ctx.aggregators,
            "fsync": ctx.fsync,
            "drop_caches": bool(ctx.drop_caches and ctx.dropped),
            "notes": ctx.notes,
            **result,
        }
        with open(ns.out, "w") as f:
            json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
