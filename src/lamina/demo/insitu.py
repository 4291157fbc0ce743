"""The demo's in situ pair: a simulation and an analysis, two plain lamina programs side by side.

::

    mpiexec -n 2 python -m mpi4py -m lamina.demo.insitu sim      PATH --shape 64x64x128 --steps 8 \\
          : -n 1 python -m mpi4py -m lamina.demo.insitu analysis PATH

The simulation (``sim``) advances the demo's flame (:mod:`lamina.demo.simulation`)
on its ranks, each rank one box of the grid, and writes every field at every
step with ``lamina.open(PATH, "w")``.  The analysis (``analysis``) opens the
same name with ``lamina.open(PATH, "r")``, follows the steps with
``iter_steps``, reads every field of each step on its own decomposition (its
own rank count) and computes, per step, the temperature range and mean, the
burnt fraction, the mean position and the speed of the flame front, the
largest speed of the flow, the fuel left and a temperature histogram.

Neither program says how the data travels.  ``LAMINA_TRANSPORT=memory``
serves the steps from the simulation's memory to the analysis over MPI
(nothing is written); ``file`` (the default) writes the native file and the
analysis follows it as it grows; ``both`` does both.  ``lamina demo`` runs
the pair once under ``memory`` and once under ``file``
(:mod:`lamina.demo.pair`) and shows that the analysis finds the same numbers.

With ``--result FILE`` each program's rank 0 writes what it measured as
JSON: times from inside the program (``time.perf_counter``; the maximum over
its ranks), bytes written or read, and for the analysis its per-step
results and a SHA-256 digest of every value it read.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time

import numpy as np

import lamina

from .. import comm as comm_mod
from ..errors import LaminaError, TransportError
from ..geometry import decompose
from . import simulation as sim
from .pair import DEFAULT_STEPS
from .phases import _max_over, _sum_over, process_grid
from .run import shape_arg, write_result

__all__ = ["analyze", "main", "simulate"]

GROUP = "flame"
#: bins of the temperature histogram, between the fresh and the burnt temperature
HIST_BINS = 8


def _field(name: str) -> str:
    return f"{GROUP}/{name}"


# --------------------------------------------------------------------------- simulation


def simulate(path: str, shape, steps: int, durable: bool = True) -> dict | None:
    """Collective over this program's ranks: advance the flame *steps* steps and write every field.

    Returns the measurements on rank 0, None on the other ranks.
    """
    shape = tuple(int(n) for n in shape)
    comm = comm_mod.task_comm()
    rank, size = comm.rank, comm.size
    dt = sim.time_step(shape, steps)
    box = decompose(shape, size)[rank]
    options = {} if durable else {"durable": False}
    compute_s = lamina_s = 0.0
    nbytes = 0

    t0 = time.perf_counter()
    f = lamina.open(path, "w", **options)
    with f:
        f.attrs["title"] = "lamina demo: in situ flame"
        f.attrs["grid_spacing"] = sim.H
        f.attrs["T_unburnt"] = sim.T_U
        f.attrs["T_burnt"] = sim.T_B
        f.attrs["Y_unburnt"] = sim.Y_U
        dsets = {}
        for name, unit in sim.FIELDS.items():
            dsets[name] = f.create_dataset(_field(name), shape, "f8")
            dsets[name].attrs["units"] = unit
            dsets[name].attrs["dims"] = list(sim.AXES)
        tds = f.create_dataset("time", (), "f8")
        tds.attrs["units"] = "s"
        engine = f.engine.name
        lamina_s += time.perf_counter() - t0
        for k in range(steps):
            t = sim.step_time(k, dt)
            c0 = time.perf_counter()
            data = sim.fields(box, shape, t) if not box.empty else {}
            compute_s += time.perf_counter() - c0
            w0 = time.perf_counter()
            with f.step():
                for name, values in data.items():
                    dsets[name].write(values, offset=box.start, copy=False)
                    nbytes += values.nbytes
                if rank == 0:
                    tds[()] = t
            lamina_s += time.perf_counter() - w0
            del data
        c0 = time.perf_counter()
    end = time.perf_counter()
    lamina_s += end - c0
    res = {
        "program": "simulation",
        "engine": engine,
        "ranks": size,
        "decomposition": list(process_grid(shape, size)),
        "steps": steps,
        "shape": list(shape),
        "bytes": _sum_over(comm, nbytes),
        "loop_s": _max_over(comm, end - t0),
        "lamina_s": _max_over(comm, lamina_s),
        "compute_s": _max_over(comm, compute_s),
    }
    return res if rank == 0 else None


# --------------------------------------------------------------------------- analysis


def open_when_ready(path: str, comm, timeout: float):
    """``lamina.open(path, "r")``, retried until the producer has created it (a file not there yet).

    Under the memory transport the first open waits for the producer by itself.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return lamina.open(path, "r")
        except TransportError:
            raise
        except (OSError, LaminaError):
            if comm_mod.allreduce_int(comm, int(time.monotonic() > deadline), "max"):
                raise
        time.sleep(0.01)


# per rank and step, the partial results, in this order (float64), then the histogram counts
_PARTS = ("min_T", "max_T", "sum_T", "burnt", "sum_c", "max_v2", "sum_Y", "cells")


def _partials(a: dict[str, np.ndarray], T_U: float, T_B: float) -> np.ndarray:
    T = a["T"]
    if T.size == 0:
        return np.array([np.inf, -np.inf] + [0.0] * (len(_PARTS) - 2) + [0.0] * HIST_BINS)
    c = (T - T_U) / (T_B - T_U)  # progress variable: 0 fresh, 1 burnt
    v2 = a["vx"] ** 2 + a["vy"] ** 2 + a["vz"] ** 2
    hist, _ = np.histogram(T, bins=HIST_BINS, range=(T_U, T_B))
    vals = [
        T.min(),
        T.max(),
        T.sum(),
        np.count_nonzero(c > 0.5),
        c.sum(),
        v2.max(),
        a["Y_CH4"].sum(),
        T.size,
    ]
    return np.array([float(v) for v in vals] + [float(h) for h in hist])


def _combine(parts: list[np.ndarray], shape, t: float, attrs: dict, prev: dict | None) -> dict:
    """Rank 0: one step's results from every rank's partials (summed in rank order: reproducible)."""
    p = np.stack(parts)
    col = {name: p[:, i] for i, name in enumerate(_PARTS)}
    cells = float(col["cells"].sum())
    nx, ny, _ = shape
    front = float(col["sum_c"].sum()) / (nx * ny)  # mean height of the burnt gas, in cells
    speed = None
    if prev is not None and t > prev["time"]:
        speed = (front - prev["front_z"]) * attrs["H"] / (t - prev["time"])
    return {
        "time": t,
        "min_T": float(col["min_T"].min()),
        "max_T": float(col["max_T"].max()),
        "mean_T": float(col["sum_T"].sum()) / cells,
        "burnt": float(col["burnt"].sum()) / cells,
        "front_z": front,
        "front_speed": speed,
        "max_speed": math.sqrt(float(col["max_v2"].max())),
        "fuel_left": float(col["sum_Y"].sum()) / (attrs["Y_U"] * cells),
        "T_histogram": [int(h) for h in p[:, len(_PARTS) :].sum(axis=0)],
    }


def analyze(path: str, timeout: float = 120.0) -> dict | None:
    """Collective over this program's ranks: follow the steps of *path*, read every field, analyse.

    Each rank reads its box of ``decompose(shape, ranks)``; rank 0 combines
    the partial results of every rank, in rank order.  Returns the
    measurements and results on rank 0, None on the other ranks.
    """
    comm = comm_mod.task_comm()
    rank, size = comm.rank, comm.size
    names = list(sim.FIELDS)
    digest = hashlib.sha256()
    lamina_s = read_s = compute_s = 0.0
    nbytes = seen = 0
    results: list[dict] = []
    shape = box = attrs = arrays = None

    t0 = time.perf_counter()
    f = open_when_ready(path, comm, timeout)
    with f:
        engine = f.engine.name
        lamina_s += time.perf_counter() - t0
        w0 = time.perf_counter()
        for view in f.iter_steps(timeout=timeout, poll=1e-3):
            if box is None:  # the first step: the grid and the constants, from the file
                shape = view[_field("T")].shape
                box = decompose(shape, size)[rank]
                attrs = {
                    "H": float(view.attrs["grid_spacing"]),
                    "T_U": float(view.attrs["T_unburnt"]),
                    "T_B": float(view.attrs["T_burnt"]),
                    "Y_U": float(view.attrs["Y_unburnt"]),
                }
            t = float(view["time"][()])
            if arrays is None:  # one buffer per field, reused at every step
                arrays = {n: np.empty(box.shape, dtype=view[_field(n)].dtype) for n in names}
            r0 = time.perf_counter()
            for n in names:
                view[_field(n)].read(box, out=arrays[n])
            read_s += time.perf_counter() - r0
            lamina_s += time.perf_counter() - w0
            c0 = time.perf_counter()
            for n in names:
                nbytes += arrays[n].nbytes
                digest.update(arrays[n].data)
            part = _partials(arrays, attrs["T_U"], attrs["T_B"])
            gathered = comm_mod.gather_bytes(comm, part.tobytes())
            if rank == 0:
                parts = [np.frombuffer(g, dtype=np.float64) for g in gathered]
                step = _combine(parts, shape, t, attrs, results[-1] if results else None)
                results.append({"step": view.index, **step})
            compute_s += time.perf_counter() - c0
            seen += 1
            w0 = time.perf_counter()
        c0 = time.perf_counter()
    end = time.perf_counter()
    lamina_s += (c0 - w0) + (end - c0)  # the last wait (the end of the stream) and the close
    digests = comm_mod.gather_bytes(comm, digest.digest())
    res = {
        "program": "analysis",
        "engine": engine,
        "ranks": size,
        "decomposition": list(process_grid(shape, size)) if shape else [],
        "steps": seen,
        "bytes": _sum_over(comm, nbytes),
        "loop_s": _max_over(comm, end - t0),
        "lamina_s": _max_over(comm, lamina_s),
        "read_s": _max_over(comm, read_s),
        "compute_s": _max_over(comm, compute_s),
    }
    if rank != 0:
        return None
    res["sha256"] = hashlib.sha256(b"".join(digests)).hexdigest()
    res["results"] = results
    return res


# --------------------------------------------------------------------------- the programs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lamina.demo.insitu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("program", choices=["sim", "analysis"])
    p.add_argument("path", help="the name both programs open")
    p.add_argument("--shape", type=shape_arg, default=sim.DEFAULT_SHAPE, help="global grid (sim)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps to write (sim)")
    p.add_argument("--no-fsync", action="store_true", help="open with durable=False (sim)")
    p.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for a step (analysis)"
    )
    p.add_argument("--result", default=None, help="JSON file for rank 0's measurements")
    return p


def _say(text: str) -> None:
    """One line with a single write: lines of the programs sharing the launch's output never mix."""
    os.write(1, (text + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.program == "sim":
        res = simulate(args.path, args.shape, args.steps, durable=not args.no_fsync)
        if res is not None:
            _say(
                f"simulation: {res['steps']} steps, {res['bytes'] / 2**20:.1f} MiB written by "
                f"{res['ranks']} ranks ({res['engine']}) in {res['loop_s']:.2f} s"
            )
    else:
        res = analyze(args.path, timeout=args.timeout)
        if res is not None:
            last = res["results"][-1] if res["results"] else None
            tail = f", last step: mean T {last['mean_T']:.0f} K" if last else ""
            _say(
                f"analysis: {res['steps']} steps, {res['bytes'] / 2**20:.1f} MiB read by "
                f"{res['ranks']} ranks ({res['engine']}) in {res['loop_s']:.2f} s{tail}"
            )
    if res is not None and args.result:
        write_result(args.result, res)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
