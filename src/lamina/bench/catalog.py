"""``lamina bench catalog``: opening a file of many steps of many blocks, and what its index costs.

One process writes ``--steps`` steps of ``--blocks`` blocks each (rows of a
2-D float32 dataset, 16 bytes a block of random values: the data is
negligible, the index is what is measured), with lamina (native, ``durable=False``) and with ADIOS2
BP5 (``Put`` deferred, one ``SetSelection`` per block), ``--write-repeat``
times (default once: at the default sizes a write takes tens of seconds),
the tools' order alternating between repetitions, both packages imported
before any clock starts; the median is reported.  Then, each
``--repeat`` times, in turn (the tools' order alternating between repetitions):

``open``        open the file and close it again (lamina decodes no step's blocks here)
``step index``  open, then the block index of the middle step: lamina's
                ``block_table`` (the step's block section decoded), ADIOS2's
                ``blocks_info`` (per-block start, count, min and max)
``read one``    open, read one block of the middle step, close (what it read is checked,
                untimed: the block read differs by step, its first value the step's own)

It also reports the index on disk (lamina: ``lamina.meta``; ADIOS2:
``md.0`` + ``md.idx`` + ``mmd.0``) and lamina's memory (Python's
``tracemalloc``): after open, per block of the whole file, and for one
decoded step, per block of that step.  Targets (the issue "Blocks at
scale"): open well under a second for 100 steps x 100,000 blocks; memory
per block in tens of bytes.

Without ADIOS2 (an optional extra) its rows are left out with a note and
lamina's are printed all the same.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc

import numpy as np

from ..text import fmt_bytes, table
from . import common

ROW = 4  # float32 values per block: a block is one row


def _rows(blocks: int) -> list[np.ndarray]:
    """The blocks both tools write at every step: rows of random values, each block's own,
    so that no statistic is the same in every block (a decoded lamina step keeps a column
    whose rows all hold one value as that value once)."""
    data = np.random.default_rng(0).random((blocks, 1, ROW)).astype(np.float32)
    return list(data)


def _marked(blocks: int) -> int:
    """The block ``read one`` reads: its first value is set to each step's own (:func:`_stamp`)."""
    return blocks // 2


def _stamp(rows: list[np.ndarray], step: int) -> np.ndarray:
    """Set the first value of the block ``read one`` reads to *step*'s (the random values lie
    in [0, 1)); that block."""
    row = rows[_marked(len(rows))]
    row[0, 0] = 1 + step
    return row


def _write_lamina(path: str, steps: int, blocks: int) -> None:
    import lamina

    rows = _rows(blocks)
    with lamina.open(path, "w", durable=False) as f:
        ds = f.create_dataset("u", (blocks, ROW), np.float32)
        for s in range(steps):
            _stamp(rows, s)
            with f.step():
                for i, row in enumerate(rows):
                    ds.write(row, offset=(i, 0), copy=False)


def _write_adios2(path: str, steps: int, blocks: int) -> None:
    import adios2

    rows = _rows(blocks)
    ad = adios2.Adios()
    io = ad.declare_io("lamina-bench-catalog")
    io.set_engine("BP5")
    deferred = adios2.bindings.Mode.Deferred
    with adios2.Stream(io, path, "w") as s:
        var = io.define_variable("u", rows[0], [blocks, ROW], [0, 0], [1, ROW])
        for step in range(steps):
            _stamp(rows, step)
            s.begin_step()
            for i, row in enumerate(rows):
                var.set_selection([[i, 0], [1, ROW]])
                s.engine.put(var, row, deferred)
            s.end_step()


def _lamina_phases(path: str, step: int, row: int):
    import lamina
    from lamina.geometry import Box

    def open_close() -> None:
        lamina.open(path, "r").close()

    def step_index() -> None:
        with lamina.open(path, "r") as f:
            f.engine.block_table("u", step)

    def read_one() -> np.ndarray:
        with lamina.open(path, "r") as f:
            return f["u"].read(Box((row, 0), (row + 1, ROW)), step=step)

    return {"open": open_close, "step index": step_index, "read one": read_one}


def _adios2_phases(path: str, step: int, row: int):
    def open_close() -> None:
        with common.adios2_reader(path):
            pass

    def step_index() -> None:
        with common.adios2_reader(path) as r:
            r.engine.blocks_info("u", step)

    def read_one() -> np.ndarray:
        out = np.empty((1, ROW), dtype=np.float32)
        with common.adios2_reader(path) as r:
            var = r.inquire_variable("u")
            var.set_selection([[row, 0], [1, ROW]])
            var.set_step_selection([step, 1])
            r.read_in_buffer(var, out)
        return out

    return {"open": open_close, "step index": step_index, "read one": read_one}


def _lamina_memory(path: str, step: int, steps: int, blocks: int) -> dict:
    import lamina

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        f = lamina.open(path, "r")
        opened = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        f.engine.block_table("u", step)
        decode = time.perf_counter() - t0
        decoded = tracemalloc.get_traced_memory()[0]
        f.close()
    finally:
        tracemalloc.stop()
    return {
        "open_bytes_per_block": (opened - base) / (steps * blocks),
        "step_bytes_per_block": (decoded - opened) / blocks,
        "step_decode_s": decode,
    }


def _dir_bytes(path: str, names) -> int:
    return sum(
        os.path.getsize(os.path.join(path, n))
        for n in names
        if os.path.exists(os.path.join(path, n))
    )


def run(ns) -> dict:
    from .baselines import available

    d = ns.dir or tempfile.mkdtemp(prefix="lamina-bench-catalog-")
    os.makedirs(d, exist_ok=True)
    lam, bp = os.path.join(d, "catalog.lam"), os.path.join(d, "catalog.bp")
    step, row = ns.steps // 2, _marked(ns.blocks)
    want = _stamp(_rows(ns.blocks), step)  # the block read one reads, as written
    notes = []
    why = available("adios2")
    if why:
        notes.append(f"adios2 BP5 left out: {why}")
    else:
        import adios2  # noqa: F401  (here, so that no write's time holds the import)
    import lamina  # noqa: F401

    writers = [("lamina", _write_lamina, lam)] + (
        [] if why else [("adios2 BP5", _write_adios2, bp)]
    )
    writes: dict[str, list[float]] = {name: [] for name, _, _ in writers}
    try:
        for rep in range(ns.write_repeat):
            for name, fn, path in writers if rep % 2 == 0 else writers[::-1]:
                common.remove(path)  # the last repetition's files are the ones read
                print(
                    f"writing {name}: {ns.steps} steps x {ns.blocks} blocks "
                    f"({rep + 1}/{ns.write_repeat})",
                    file=sys.stderr,
                )
                t0 = time.perf_counter()
                fn(path, ns.steps, ns.blocks)
                writes[name].append(time.perf_counter() - t0)
        phases = {"lamina": _lamina_phases(lam, step, row)}
        if not why:
            phases["adios2 BP5"] = _adios2_phases(bp, step, row)
        times: dict[tuple[str, str], list[float]] = {}
        tools = list(phases)
        for rep in range(ns.repeat):
            for tool in tools if rep % 2 == 0 else tools[::-1]:
                for phase, fn in phases[tool].items():
                    t0 = time.perf_counter()
                    got = fn()
                    times.setdefault((tool, phase), []).append(time.perf_counter() - t0)
                    if phase == "read one" and not np.array_equal(got, want):  # untimed
                        raise common.DataCheckError(
                            f"{tool} read one: block {row} of step {step} differs from the one written"
                        )
        mem = _lamina_memory(lam, step, ns.steps, ns.blocks)
        index = {
            "lamina": _dir_bytes(lam, ["lamina.meta", "lamina.commit"]),
            "adios2 BP5": _dir_bytes(bp, ["md.0", "md.idx", "mmd.0"]),
        }
    finally:
        if not ns.dir:
            shutil.rmtree(d, ignore_errors=True)
        else:
            for p in (lam, bp):
                shutil.rmtree(p, ignore_errors=True)
    n = ns.steps * ns.blocks
    rows = []
    for tool in tools:
        w = common.summarize(writes[tool])
        row_ = {
            "tool": tool,
            "write_s": w["median"],
            "write_times": w["times"],
            "write_us_per_block": w["median"] / n * 1e6,
            "index_bytes": index[tool],
            "index_bytes_per_block": index[tool] / n,
        }
        for phase in ("open", "step index", "read one"):
            row_[phase] = common.summarize(times[(tool, phase)])
        rows.append(row_)
    return {
        "steps": ns.steps,
        "blocks": ns.blocks,
        "repeat": ns.repeat,
        "write_repeat": ns.write_repeat,
        "rows": rows,
        "memory": mem,
        "notes": notes,
    }


def report(o: dict) -> str:
    head = [
        "tool",
        "write us/block",
        "index on disk",
        "B/block",
        "open s",
        "step index s",
        "read one s",
    ]
    body = []
    for r in o["rows"]:
        body.append(
            [
                r["tool"],
                f"{r['write_us_per_block']:.2f}",
                fmt_bytes(r["index_bytes"]),
                f"{r['index_bytes_per_block']:.0f}",
                f"{r['open']['median']:.4f}",
                f"{r['step index']['median']:.4f}",
                f"{r['read one']['median']:.4f}",
            ]
        )
    m = o["memory"]
    lam = o["rows"][0]
    lines = [
        f"{o['steps']} steps x {o['blocks']} blocks of 1 x {ROW} float32, 1 process, medians of {o['repeat']} "
        + (
            f"(writes: {o['write_repeat']}, tools alternating)"
            if o["write_repeat"] > 1
            else "(writes: one each, lamina first)"
        ),
        table(head, body),
        "",
        f"lamina memory after open: {m['open_bytes_per_block']:.3f} B per block of the file; one decoded step: "
        f"{m['step_bytes_per_block']:.0f} B per block of that step ({m['step_decode_s'] * 1e3:.1f} ms to decode)",
        f"target: open well under 1 s ({lam['open']['median']:.4f} s: "
        f"{'met' if lam['open']['median'] < 1 else 'NOT met'}); memory per block in tens of bytes "
        f"({m['step_bytes_per_block']:.0f} B: {'met' if m['step_bytes_per_block'] < 100 else 'NOT met'})",
        *[f"note: {n}" for n in o.get("notes", [])],
    ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lamina bench catalog",
        description="Open time, step index and memory of a file of many steps of many blocks, "
        "lamina native vs ADIOS2 BP5.",
    )
    p.add_argument("--steps", type=int, default=100, help="steps written (default 100)")
    p.add_argument("--blocks", type=int, default=100_000, help="blocks per step (default 100000)")
    p.add_argument(
        "--repeat", type=int, default=3, help="timed repetitions of the reads (default 3)"
    )
    p.add_argument(
        "--write-repeat",
        type=int,
        default=1,
        help="timed writes of each tool, the order alternating (default 1: a write of the "
        "default sizes takes tens of seconds)",
    )
    common.add_dir_json(p)
    return p


def main(argv: list[str]) -> int:
    ns = parser().parse_args(argv)
    if ns.steps < 1 or ns.blocks < 2 or ns.repeat < 1 or ns.write_repeat < 1:
        print(
            "lamina bench catalog: need --steps >= 1, --blocks >= 2, --repeat >= 1, "
            "--write-repeat >= 1",
            file=sys.stderr,
        )
        return 2
    try:  # the statistics of a step's blocks, made as float64
        common.check_memory(ns.blocks * 8 * ROW, f"--blocks {ns.blocks}")
        # each block's values and its row of the block table (statistics, box, checksum...),
        # in the lamina file and, where ADIOS2 runs, in its own
        from .baselines import available

        files = 2 if available("adios2") is None else 1
        common.check_disk(
            files * ns.steps * ns.blocks * (ROW * 4 + 64),
            ns.dir,
            f"--steps {ns.steps} x --blocks {ns.blocks}",
        )
    except ValueError as e:
        print(f"lamina bench catalog: {e}", file=sys.stderr)
        return 2
    try:
        o = run(ns)
    except common.DataCheckError as e:
        print(f"lamina bench catalog: verification failed: {e}", file=sys.stderr)
        return 1
    text = report(o) + f"\n\ncommand: lamina bench catalog {' '.join(argv)}".rstrip()
    common.emit(ns.json, text, o)
    return 0
