"""Statistics that follow the record: consumers get every block's statistics right, on request.

    transport_stats.py produce NAME STEPS [EAGER] each rank writes three datasets per step: 128 small
                                                 float64 blocks (some with NaN), one 2 MiB float32 block
                                                 (shallow), 8 small int32 blocks; EAGER=1: reduced on
                                                 the worker thread from put on (background_stats=True),
                                                 else when a consumer first asks
    transport_stats.py check NAME STEPS FLOW     reads every step the flow gives (all, or every N-th),
                                                 compares each block's statistics with numpy's, the
                                                 values with what was written, and checks that a query
                                                 prunes with the statistics

The memory transport commits a step before its producers have reduced the
blocks; consumers ask for the statistics when they first use them.  The
check alternates reading the data before and after asking for the
statistics, so both orders are exercised.
"""

from __future__ import annotations

import sys

import numpy as np
from transport_common import say

import lamina

SLAB = (16, 16, 16)  # each rank's part of "f", cut into blocks of BLOCK
BLOCK = (2, 4, 4)
BIG = (1, 512, 1024)  # each rank's block of "big" (float32, 2 MiB: reduced on the worker thread)
INTS = 64  # each rank's part of "i", in blocks of 8


def part(name: str, step: int, rank: int) -> np.ndarray:
    """The values rank *rank* writes to *name* at *step*."""
    rng = np.random.default_rng([step, rank, len(name)])
    if name == "f":
        a = rng.normal(size=SLAB) * (step + 1)
        a[rng.random(SLAB) < 0.02] = np.nan  # some blocks hold NaN (statistics skip them)
        return a
    if name == "big":
        return rng.random(BIG, dtype=np.float32) + step
    return rng.integers(-1000, 1000, size=INTS, dtype=np.int32) * (step + 1)


def produce(name: str, steps: int, eager: bool) -> None:
    with lamina.open(name, "w", queue_limit=2, shallow=["big"], background_stats=eager) as f:
        size, rank = f.comm.size, f.comm.rank
        f.create_dataset("f", (SLAB[0] * size, *SLAB[1:]), np.float64)
        f.create_dataset("big", (size, *BIG[1:]), np.float32)
        f.create_dataset("i", (INTS * size,), np.int32)
        for k in range(steps):
            with f.step():
                a = part("f", k, rank)
                for i in range(0, SLAB[0], BLOCK[0]):
                    for j in range(0, SLAB[1], BLOCK[1]):
                        for m in range(0, SLAB[2], BLOCK[2]):
                            blk = a[i : i + BLOCK[0], j : j + BLOCK[1], m : m + BLOCK[2]]
                            f["f"].write(blk, offset=(SLAB[0] * rank + i, j, m))
                # shallow: lamina keeps this array until consumers release the step
                f["big"].write(part("big", k, rank), offset=(rank, 0, 0), copy=False)
                ints = part("i", k, rank)
                for i in range(0, INTS, 8):
                    f["i"].write(ints[i : i + 8], offset=(INTS * rank + i,))
        # the consumers' check is the test; the producer says it got through
        if rank == 0:
            say(f"OK produce: {steps} steps")


def check_stats(view, name: str, want: np.ndarray, step: int) -> int:
    blocks = view[name].blocks()
    for b in blocks:
        v = want[b.box.slices]
        st = b.stats
        if st is None:
            raise AssertionError(f"step {step}: block {b.box} of {name} has no statistics")
        ok = v[~np.isnan(v)] if v.dtype.kind == "f" else v
        expect = (ok.min(), ok.max(), ok.size)
        if (st.min, st.max, st.count) != expect or not np.isclose(st.sum, ok.sum(dtype=np.float64)):
            raise AssertionError(
                f"step {step}: block {b.box} of {name}: statistics "
                f"{(st.min, st.max, st.sum, st.count)}, numpy says {(*expect[:2], ok.sum(), ok.size)}"
            )
    return len(blocks)


def check(name: str, steps: int, flow: int) -> None:
    seen = []
    with lamina.open(name, "r", flow=flow) as f:
        rank = f.comm.rank
        for view in f.iter_steps(timeout=60, poll=1e-3):
            k = f.engine.stack()[-1].producer_step(view.index)
            seen.append(k)
            nprod = view["i"].shape[0] // INTS
            want = {n: np.concatenate([part(n, k, r) for r in range(nprod)]) for n in ("f", "big")}
            want["i"] = np.concatenate([part("i", k, r) for r in range(nprod)])
            first_data = view.index % 2 == 0
            if first_data:
                got = {n: view[n][...] for n in want}
            nblocks = {n: check_stats(view, n, want[n], k) for n in want}
            if not first_data:
                got = {n: view[n][...] for n in want}
            for n in want:
                if not np.array_equal(got[n], want[n], equal_nan=True):
                    raise AssertionError(f"step {k}: values of {n} differ from what was written")
            if nblocks["f"] != 128 * nprod:
                raise AssertionError(f"step {k}: {nblocks['f']} blocks of f")
            # the statistics prune: only blocks whose maximum reaches the threshold are read
            top = np.nanmax(want["f"])
            res = view.query(f"f >= {float(top)!r}")
            if res.count != 1 or len(res.candidates) != 1 or res.exact_blocks_read != 1:
                raise AssertionError(
                    f"step {k}: f >= max gave {res.count} matches, {len(res.candidates)} "
                    f"candidates, {res.exact_blocks_read} blocks read"
                )
    expect = list(range(0, steps, flow))
    if seen != expect:
        raise AssertionError(f"saw producer steps {seen}, expected {expect}")
    if rank == 0:
        say(f"OK check every {flow}: {len(seen)} steps")


def main() -> None:
    role, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "produce":
        produce(name, steps, len(sys.argv) > 4 and sys.argv[4] == "1")
    elif role == "check":
        check(name, steps, int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
