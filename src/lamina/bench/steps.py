"""``lamina bench steps``: what a step costs by the number of datasets written in it.

A simulation writes many variables per step; each is a block of its own
dataset.  One process writes ``--steps`` steps of D datasets (one 1-D
float64 block of ``--elements`` values each, the same arrays every time
but for their first value, the step's own, set between steps),
for each D of ``--datasets``, with every method on the same data, the
methods in rotated order ``--repeat`` times:

``numpy``       one raw file, a buffered ``write`` per dataset, ``flush`` at the end of a step
``adios2 BP5``  ADIOS2 BP5 from PyPI, D variables, ``Put`` (deferred) per variable, ``EndStep``
``h5py``        D datasets of shape (steps, elements), chunked a step per chunk, ``ds[s] = a``,
                ``flush`` at the end of a step
``lamina``      native, ``durable=False``, ``ds.write(a, copy=False)`` per dataset in
                ``with f.step():``
``lamina ds[...]``  the same with ``ds[...] = a`` (h5py's spelling: a copy of the values)

A baseline whose package is not installed (ADIOS2 is an optional extra)
is left out with a note; lamina's rows are printed all the same.

Then every method reads its file back as a time series is read: for
every step, every dataset's block, each into a new array, with the
handles (h5py datasets, ADIOS2 variables, lamina datasets) taken once
after the open:

``numpy``       ``os.preadv`` of the block's bytes at its offset into a new array
``adios2 BP5``  ``FileReader``, ``set_step_selection([s, 1])`` and ``read`` per variable
``h5py``        ``ds[s]``
``lamina``      ``ds.read(step=s)`` (both lamina methods)

Timed: the steps only, written or read, each step on its own clock (open,
the definitions, close and what happens between steps are not;
``--warmup`` untimed steps come first in both phases).  Reported:
microseconds per step and per dataset in a step, and lamina's ratio to
each baseline (< 1: lamina cheaper).  What every method read at every
step is compared with what was written at that step, untimed.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ..text import table
from . import common

METHODS = ("numpy", "adios2 BP5", "h5py", "lamina", "lamina ds[...]")


def stamp(arrays: list[np.ndarray], step: int) -> list[np.ndarray]:
    """Set the first value of every array to *step*'s own (the random values lie in [0, 1)),
    so that every step's data differ; the arrays."""
    for i, a in enumerate(arrays):
        a[0] = 1 + step + i / len(arrays)
    return arrays


def _steps(step, arrays: list[np.ndarray], steps: int, warmup: int) -> float:
    """``step(s)`` for every step, each with the arrays stamped for it (untimed); seconds of
    the steps from *warmup* on."""
    took = 0.0
    for s in range(warmup + steps):
        stamp(arrays, s)
        t0 = time.perf_counter()
        step(s)
        if s >= warmup:
            took += time.perf_counter() - t0
    return took


def _numpy(path: str, arrays: list[np.ndarray], steps: int, warmup: int) -> float:
    with open(path, "wb") as f:

        def step(s: int) -> None:
            for a in arrays:
                f.write(a.data)
            f.flush()

        return _steps(step, arrays, steps, warmup)


def _adios2(path: str, arrays: list[np.ndarray], steps: int, warmup: int) -> float:
    import adios2

    n = arrays[0].size
    ad = adios2.Adios()
    io = ad.declare_io("lamina-bench-steps")
    io.set_engine("BP5")
    vs = [io.define_variable(f"v{i}", a, [n], [0], [n]) for i, a in enumerate(arrays)]
    e = io.open(path, adios2.bindings.Mode.Write)
    try:

        def step(s: int) -> None:
            e.begin_step()
            for v, a in zip(vs, arrays, strict=True):
                e.put(v, a)
            e.end_step()

        return _steps(step, arrays, steps, warmup)
    finally:
        e.close()


def _h5py(path: str, arrays: list[np.ndarray], steps: int, warmup: int) -> float:
    import h5py

    n = arrays[0].size
    with h5py.File(path, "w") as f:
        dss = [
            f.create_dataset(f"v{i}", (warmup + steps, n), "f8", chunks=(1, n))
            for i in range(len(arrays))
        ]

        def step(s: int) -> None:
            for ds, a in zip(dss, arrays, strict=True):
                ds[s] = a
            f.flush()

        return _steps(step, arrays, steps, warmup)


def _lamina(
    path: str, arrays: list[np.ndarray], steps: int, warmup: int, setitem: bool = False
) -> float:
    import lamina

    n = arrays[0].size
    with lamina.open(path, "w", durable=False) as f:
        dss = [f.create_dataset(f"v{i}", (n,), "f8") for i in range(len(arrays))]

        def step(s: int) -> None:
            with f.step():
                for ds, a in zip(dss, arrays, strict=True):
                    if setitem:
                        ds[...] = a
                    else:
                        ds.write(a, copy=False)

        return _steps(step, arrays, steps, warmup)


# -- reads: every dataset at every step; (seconds of the timed steps, the steps that differ)
def _read_steps(read_step, arrays: list[np.ndarray], steps: int, warmup: int) -> tuple[float, list]:
    """``read_step(s)`` for every step, each on its own clock from step *warmup* on; what
    each step read is compared (untimed) with *arrays* as written at that step.  (seconds,
    the (step, dataset) pairs read back different)."""
    took, bad = 0.0, []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        got = read_step(s)
        if s >= warmup:
            took += time.perf_counter() - t0
        want = stamp(arrays, s)
        bad += [
            (s, i)
            for i, (g, a) in enumerate(zip(got, want, strict=True))
            if not np.array_equal(g, a)
        ]
        del got
    return took, bad


def _numpy_read(path: str, arrays: list[np.ndarray], steps: int, warmup: int) -> tuple[float, list]:
    d, n = len(arrays), arrays[0].size
    fd = os.open(path, os.O_RDONLY)

    def step(s: int) -> list:
        got = []
        for i in range(d):
            a = np.empty(n)
            os.preadv(fd, [a], (s * d + i) * n * 8)
            got.append(a)
        return got

    try:
        return _read_steps(step, arrays, steps, warmup)
    finally:
        os.close(fd)


def _adios2_read(
    path: str, arrays: list[np.ndarray], steps: int, warmup: int
) -> tuple[float, list]:
    with common.adios2_reader(path) as r:
        vs = [r.inquire_variable(f"v{i}") for i in range(len(arrays))]

        def step(s: int) -> list:
            got = []
            for v in vs:
                v.set_step_selection([s, 1])
                got.append(r.read(v))
            return got

        return _read_steps(step, arrays, steps, warmup)


def _h5py_read(path: str, arrays: list[np.ndarray], steps: int, warmup: int) -> tuple[float, list]:
    import h5py

    with h5py.File(path, "r") as f:
        dss = [f[f"v{i}"] for i in range(len(arrays))]
        return _read_steps(lambda s: [ds[s] for ds in dss], arrays, steps, warmup)


def _lamina_read(
    path: str, arrays: list[np.ndarray], steps: int, warmup: int
) -> tuple[float, list]:
    import lamina

    with lamina.open(path, "r") as f:
        dss = [f[f"v{i}"] for i in range(len(arrays))]
        return _read_steps(lambda s: [ds.read(step=s) for ds in dss], arrays, steps, warmup)


RUN = {
    "numpy": _numpy,
    "adios2 BP5": _adios2,
    "h5py": _h5py,
    "lamina": _lamina,
    "lamina ds[...]": functools.partial(_lamina, setitem=True),
}
READ = {
    "numpy": _numpy_read,
    "adios2 BP5": _adios2_read,
    "h5py": _h5py_read,
    "lamina": _lamina_read,
    "lamina ds[...]": _lamina_read,
}
PHASES = ("write", "read")
#: the baselines that need a package of their own, checked with :func:`.baselines.available`
PACKAGE = {"adios2 BP5": "adios2", "h5py": "h5py"}


def usable(methods: list[str]) -> tuple[list[str], list[str]]:
    """*methods* less those whose package cannot be imported here, and a note for each left out."""
    from .baselines import available

    keep, notes = [], []
    for m in methods:
        why = available(PACKAGE[m]) if m in PACKAGE else None
        if why:
            notes.append(f"{m} left out: {why}")
        else:
            keep.append(m)
    return keep, notes


SUFFIX = {
    "numpy": ".raw",
    "adios2 BP5": ".bp",
    "h5py": ".h5",
    "lamina": ".lam",
    "lamina ds[...]": ".lam",
}


def run(ns) -> dict:
    d = ns.dir or tempfile.mkdtemp(prefix="lamina-bench-steps-")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(ns.seed)
    rows = []
    methods, notes = usable(ns.methods)
    try:
        for k, nd in enumerate(ns.datasets):
            arrays = [rng.random(ns.elements) for _ in range(nd)]
            times: dict[str, dict[str, list[float]]] = {
                ph: {m: [] for m in methods} for ph in PHASES
            }
            for rep in range(ns.repeat):
                order = methods[(rep + k) % len(methods) :] + methods[: (rep + k) % len(methods)]
                for m in order:
                    path = os.path.join(d, f"steps-{nd}{SUFFIX[m]}")
                    common.remove(path)
                    took = RUN[m](path, arrays, ns.steps, ns.warmup)
                    times["write"][m].append(took / ns.steps)
                    took, bad = READ[m](path, arrays, ns.steps, ns.warmup)
                    times["read"][m].append(took / ns.steps)
                    common.remove(path)
                    if bad:
                        s, i = bad[0]
                        raise common.DataCheckError(
                            f"{m} read dataset v{i} of step {s} back different"
                            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                        )
            row: dict = {"datasets": nd, "elements": ns.elements}
            for ph in PHASES:
                row[ph] = {m: common.summarize(times[ph][m]) for m in methods}
            rows.append(row)
    finally:
        if not ns.dir:
            shutil.rmtree(d, ignore_errors=True)
    return {
        "datasets": ns.datasets,
        "elements": ns.elements,
        "steps": ns.steps,
        "warmup": ns.warmup,
        "repeat": ns.repeat,
        "methods": methods,
        "notes": notes,
        "rows": rows,
    }


def _phase_table(o: dict, phase: str) -> str:
    methods = o["methods"]
    base = [m for m in methods if not m.startswith("lamina")]
    head = ["datasets", *[f"{m} us/step" for m in methods]]
    if "lamina" in methods:
        head += ["lamina us/dataset", *[f"lamina/{m}" for m in base]]
    body = []
    for r in o["rows"]:
        t = r[phase]
        line = [f"{r['datasets']:,}", *[f"{t[m]['median'] * 1e6:.0f}" for m in methods]]
        if "lamina" in methods:
            lam = t["lamina"]["median"]
            line.append(f"{lam / r['datasets'] * 1e6:.1f}")
            line += [f"{lam / t[m]['median']:.2f}x" for m in base]
        body.append(line)
    return f"{phase}\n{table(head, body)}"


def report(o: dict) -> str:
    return "\n\n".join(
        [
            f"lamina bench steps: one process, {o['steps']} timed steps after {o['warmup']} untimed, "
            f"each dataset one float64 block of {o['elements']:,} values a step, written, then "
            f"read back a step at a time; medians of {o['repeat']} runs in rotated order; "
            "ratios: lamina's time over the baseline's",
            *[_phase_table(o, ph) for ph in PHASES],
            *["\n".join(f"note: {n}" for n in o["notes"])][: 1 if o["notes"] else 0],
        ]
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lamina bench steps",
        description="The cost of a step by the number of datasets written in it (one block "
        "each), written and read back: numpy, ADIOS2 BP5, h5py, lamina native, one process.",
    )
    p.add_argument(
        "--datasets", default="1,8,32,128", help="datasets per step (default 1,8,32,128)"
    )
    p.add_argument("--elements", type=int, default=16, help="float64 values per block (default 16)")
    p.add_argument("--steps", type=int, default=50, help="timed steps (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--repeat", type=int, default=3, help="runs per method (default 3)")
    p.add_argument("--methods", default=",".join(METHODS), help="methods (default: all)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the data")
    common.add_dir_json(p)
    return p


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    try:
        ns.datasets = common.parse_int_list(ns.datasets, "--datasets")
        ns.methods = common.parse_choices(ns.methods, "--methods", METHODS)
        common.check_memory(
            ns.elements * 8 * max(ns.datasets),
            f"--elements {ns.elements} in {max(ns.datasets)} datasets",
        )
    except ValueError as e:
        p.error(str(e))
    if ns.elements < 1 or ns.steps < 1 or ns.warmup < 0 or ns.repeat < 1 or ns.seed < 0:
        p.error("need --elements >= 1, --steps >= 1, --warmup >= 0, --repeat >= 1, --seed >= 0")
    try:  # one method's file of the most datasets, at least
        steps = ns.steps + ns.warmup
        common.check_disk(
            steps * ns.elements * 8 * max(ns.datasets),
            ns.dir,
            f"--steps {ns.steps} (+ --warmup {ns.warmup}) of {max(ns.datasets)} datasets",
        )
    except ValueError as e:
        p.error(str(e))
    try:
        o = run(ns)
    except common.DataCheckError as e:
        print(f"lamina bench steps: verification failed: {e}", file=sys.stderr)
        return 1
    text = report(o) + f"\n\ncommand: lamina bench steps {' '.join(argv)}".rstrip()
    common.emit(ns.json, text, o)
    return 0
