"""Flow control per consumer: ``latest`` drops stale steps, ``N`` takes every N-th step.

    transport_flow.py produce NAME STEPS          writes x = [k, k, k, k] at step k, a little work per step
    transport_flow.py latest NAME STEPS [FLOW]    a slow consumer (flow 'latest' unless the workflow says)
    transport_flow.py every NAME STEPS N          a consumer that must see steps 0, N, 2N, ...
    transport_flow.py slow NAME STEPS GAP         writes a step every GAP seconds
    transport_flow.py punctual NAME STEPS         iter_steps() with its default polling: reports how
                                                  late after its commit each step was seen
    transport_flow.py bare NAME STEPS             writes x = arange(8) + k with stats=False, and
                                                  derives s = x * 2 kept as statistics
    transport_flow.py bare-read NAME STEPS        blocks of x carry no statistics, those of s theirs;
                                                  reads and queries still right
    transport_flow.py late-derive NAME STEPS      derives e = x * 2 (expression) and t = x + 1
                                                  (stats) after step 0
    transport_flow.py at-read NAME STEPS          reads step 0, then f.at(k) of each later step
                                                  alone: e and t there, e's values right, the
                                                  reprs say the steps released

The producer reports how many steps it held at most after each ``end_step``
(its memory) and how long its steps took (it never waits for a latest
consumer); consumers check what they saw and report it.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from transport_common import say

import lamina

#: seconds a latest consumer spends on each step it sees: far longer than a producer's step
#: (20 ms, and up to about 60 ms where 3 ranks share one loaded core), so that it sees a
#: few steps only and a producer that waited for it would take 12 x LATEST_DELAY
LATEST_DELAY = 0.3


def produce(name: str, steps: int) -> None:
    with lamina.open(name, "w", queue_limit=2) as f:
        f.create_dataset("x", (4,), np.int64)
        held = 0
        t0 = time.monotonic()
        for k in range(steps):
            with f.step():
                if f.comm.rank == 0:
                    f["x"][:2] = k
                else:
                    f["x"][2:] = k
            held = max(held, len(f.engine.inner._data))  # steps kept in this rank's memory
            time.sleep(0.02)
        took = time.monotonic() - t0
        rank = f.comm.rank
    if rank == 0:
        say(f"OK produce: {steps} steps in {took:.2f} s, held at most {held} steps")


def consume(name: str, steps: int, flow, delay: float) -> list[int]:
    opts = {} if flow is None else {"flow": flow}
    seen, index = [], []
    with lamina.open(name, "r", **opts) as f:
        for view in f.iter_steps(timeout=60, poll=1e-3):
            x = view["x"][:]
            if len(set(x.tolist())) != 1:
                raise AssertionError(f"step {view.index} mixes steps: {x}")
            seen.append(int(x[0]))
            index.append(view.index)
            real = f.engine.stack()[-1].producer_step(view.index)  # as docs/transport.md says
            if real != seen[-1]:
                raise AssertionError(
                    f"step {view.index} is the producer's step {seen[-1]}, not {real}"
                )
            time.sleep(delay)
    if index != list(range(len(index))):
        raise AssertionError(f"the consumer's step numbers are not 0, 1, ...: {index}")
    return seen


def slow(name: str, steps: int, gap: float) -> None:
    with lamina.open(name, "w") as f:
        f.create_dataset("x", (4,), np.int64)
        for k in range(steps):
            time.sleep(gap)
            with f.step():
                if f.comm.rank == 0:
                    f["x"][:] = k


def punctual(name: str, steps: int) -> list[float]:
    late = []
    with lamina.open(name, "r") as f:
        for view in f.iter_steps():
            late.append(time.time() - view.time)  # the step's commit time, same machine
            if list(view["x"][:]) != [view.index] * 4:
                raise AssertionError(f"step {view.index}: {view['x'][:]}")
    if len(late) != steps:
        raise AssertionError(f"saw {len(late)} of {steps} steps")
    return late


def bare(name: str, steps: int) -> None:
    with lamina.open(name, "w", stats=False) as f:
        f.create_dataset("x", (8,), np.int64)
        f.derive("s", "x * 2", "stats")  # its statistics are all it keeps: stats=False spares them
        for k in range(steps):
            with f.step():
                a, b = 8 * f.comm.rank // f.comm.size, 8 * (f.comm.rank + 1) // f.comm.size
                f["x"].write(np.arange(a, b) + k, offset=(a,))


def bare_read(name: str, steps: int) -> None:
    with lamina.open(name, "r") as f:
        n = 0
        for view in f.iter_steps():
            k = view.index
            if any(b.stats is not None for b in view["x"].blocks()):
                raise AssertionError("a block of a stats=False producer carries statistics")
            if list(view["x"][:]) != list(range(k, k + 8)):
                raise AssertionError(f"step {k}: {view['x'][:]}")
            res = view.query("x > 5")
            # no statistics to prune with: the query reads every block to decide
            if res.count != min(8, k + 2) or res.candidate_blocks_read != len(view["x"].blocks()):
                raise AssertionError(
                    f"step {k}: query x > 5 gave {res.count} matches, read {res.candidate_blocks_read} blocks"
                )
            s = (np.arange(8) + k) * 2
            for blk in view["s"].blocks():
                st, v = blk.stats, s[blk.box.slices]
                if st is None or (st.min, st.max, st.sum, st.count) != (
                    v.min(),
                    v.max(),
                    v.sum(),
                    v.size,
                ):
                    raise AssertionError(f"step {k}: block {blk.box} of s has statistics {st}")
            res = view.query("s > 1000")  # the statistics rule out every block: nothing read
            if res.count or res.candidates or res.candidate_blocks_read or res.exact_blocks_read:
                raise AssertionError(f"step {k}: query s > 1000 read blocks: {res}")
            if view.query("s > 10").count != int((s > 10).sum()):
                raise AssertionError(f"step {k}: query s > 10 gave {view.query('s > 10').count}")
            n += 1
    if n != steps:
        raise AssertionError(f"saw {n} of {steps} steps")


def late_derive(name: str, steps: int) -> None:
    with lamina.open(name, "w") as f:
        f.create_dataset("x", (4,), np.int64)
        for k in range(steps):
            if k == 1:  # declared mid-run, between steps
                f.derive("e", "x * 2", "expression")
                f.derive("t", "x + 1", "stats")
            with f.step():
                if f.comm.rank == 0:
                    f["x"][...] = np.arange(4) + k


def at_read(name: str, steps: int) -> None:
    """f.at(k) past the steps the ranks agreed on takes up the step's records alone: the
    definitions they bring too (a definition read as an expression gave NaN, kept as
    statistics a FormatError, on the memory transport)."""
    with lamina.open(name, "r", wait=30) as f:
        f.at(0)["x"][...]
        for k in range(1, steps):
            v = f.at(k)
            if sorted(f.derived) != ["e", "t"]:
                raise AssertionError(f"step {k}: derived {sorted(f.derived)}")
            if list(v["e"][...]) != list(2 * (np.arange(4) + k)):
                raise AssertionError(f"step {k}: e = {v['e'][...]}")
            if [b.stats.max for b in v["t"].blocks()] != [k + 4]:
                raise AssertionError(f"step {k}: t's blocks {v['t'].blocks()}")
            # the reprs read no data: released steps are said, not asked for (StepError)
            f._repr_html_()
            v._repr_html_()
            if k == steps - 1 and "released" not in v["x"]._repr_html_():
                raise AssertionError(f"step {k}: {v['x']._repr_html_()}")


def main() -> None:
    role, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    comm = lamina.comm.task_comm()
    if role == "produce":
        produce(name, steps)
    elif role == "latest":
        flow = sys.argv[4] if len(sys.argv) > 4 else None
        seen = consume(name, steps, None if flow == "-" else flow or "latest", LATEST_DELAY)
        if any(b <= a for a, b in zip(seen, seen[1:], strict=False)) or seen[-1] != steps - 1:
            raise AssertionError(
                f"latest: not an increasing sequence ending at {steps - 1}: {seen}"
            )
        if len(seen) >= steps:
            raise AssertionError(f"latest: a slow consumer saw every step: {seen}")
        if comm.rank == 0:
            say(f"OK latest: {seen}")
    elif role == "every":
        n = int(sys.argv[4])
        seen = consume(name, steps, None, 0.0)
        if seen != list(range(0, steps, n)):
            raise AssertionError(f"every {n}: saw {seen}")
        if comm.rank == 0:
            say(f"OK every {n}: {seen}")
    elif role == "slow":
        slow(name, steps, float(sys.argv[4]))
    elif role == "bare":
        bare(name, steps)
    elif role == "bare-read":
        bare_read(name, steps)
        if comm.rank == 0:
            say(f"OK bare: {steps} steps without statistics")
    elif role == "late-derive":
        late_derive(name, steps)
    elif role == "at-read":
        at_read(name, steps)
        if comm.rank == 0:
            say(f"OK at-read: {steps} steps")
    elif role == "punctual":
        late = punctual(name, steps)
        if comm.rank == 0:
            say("OK punctual: late " + " ".join(f"{t:.3f}" for t in late))
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
