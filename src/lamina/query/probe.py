"""A query's own time, measured for the cost model's calibration (:mod:`lamina.perf.calibrate`).

The calibration package sits below the query engine and cannot call it;
``lamina.query`` registers :func:`probe`, which :func:`lamina.perf.calibrate.calibrate`
calls.  It writes, through the native engine alone, a 1-D dataset of
:data:`~lamina.perf.calibrate.QUERY_BLOCKS` blocks of :data:`BLOCK` elements
each, and times a query whose condition matches one block: its statistics
tables, units, judging and the read and selection of that block, about
all a query costs besides moving its data.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from .. import comm as comm_mod
from ..catalog import DatasetSpec
from ..engines.native import NativeEngine
from ..geometry import Box
from ..perf.calibrate import QUERY_BLOCKS
from .core import run

#: elements of a block of the probe's dataset (small: its read is a small part of the query)
BLOCK = 64


def probe(directory: str | None, quick: bool) -> dict[str, list[tuple[float, float]]]:
    """``{"query": [(blocks, seconds of one query), ...]}`` at the calibration's block counts
    (the best of a few queries, each on a file opened anew as a reader would)."""
    counts = QUERY_BLOCKS[:2] if quick else QUERY_BLOCKS
    runs = 3 if quick else 5
    base = tempfile.mkdtemp(prefix="lamina-calibrate-query-", dir=directory)
    try:
        points = []
        for nb in counts:
            path = os.path.join(base, f"q{nb}.lam")
            _write(path, nb)
            points.append((float(nb), _best_query(path, runs)))
        return {"query": points}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _write(path: str, nb: int) -> None:
    eng = NativeEngine()
    eng.open(path, "w", comm_mod.self_comm(), {"durable": False})
    try:
        eng.define(DatasetSpec("x", (nb * BLOCK,), np.dtype("f8")))
        eng.begin_step()
        for i in range(nb):  # block i holds i*BLOCK ...: "x < 1" matches the first block only
            eng.put(
                "x",
                Box((i * BLOCK,), ((i + 1) * BLOCK,)),
                np.arange(i * BLOCK, (i + 1) * BLOCK, dtype="f8"),
            )
        eng.end_step()
    finally:
        eng.close()


def _best_query(path: str, runs: int) -> float:
    times = []
    for r in range(runs + 1):  # the first untimed: imports, parsing caches
        eng = NativeEngine()
        eng.open(path, "r", comm_mod.self_comm(), {})
        try:
            t = time.perf_counter()
            got = run(eng, path, "x < 1", select=["x"])
            dt = time.perf_counter() - t
        finally:
            eng.close()
        if got.count != 1:  # pragma: no cover - the probe's own file
            raise AssertionError(f"calibration query found {got.count} elements, not 1")
        if r:
            times.append(dt)
    return max(min(times), 1e-9)
