"""The launcher's side of the demo's in situ pair: run it under each transport and compare.

:mod:`lamina.demo.insitu` holds the two programs; this module starts them
as one MPMD job per transport (``mpiexec -n P ... sim : -n C ... analysis``
with ``LAMINA_TRANSPORT`` set), collects what each program measured, and
says whether the analysis found the same results every time.  It never
imports the programs, so ``python -m lamina.demo.insitu`` runs them fresh.
"""

from __future__ import annotations

import json
import math
import os
import shutil

from ..engines.native.format import COMMIT_NAME
from . import launch
from . import simulation as sim
from .phases import _dir_size

__all__ = ["compare", "run_demo", "run_pair"]

#: the transports ``lamina demo`` compares, in the order it runs them
TRANSPORTS = ("memory", "file")
#: the engine each transport should end up in
ENGINES = {"memory": "mpi", "file": "native", "both": "both"}
#: defaults of ``lamina demo``
DEFAULT_STEPS = 8
DEFAULT_RANKS = (2, 1)
PROGRAM = "lamina.demo.insitu"


def step_bytes(shape) -> int:
    """Bytes the simulation writes per step: every field, float64."""
    return len(sim.FIELDS) * math.prod(shape) * 8


def remove(path: str) -> None:
    """Remove what an earlier run left at *path*: a native file (a directory) or a results file.

    Anything else there stays (the simulation's open then refuses it and the
    demo says so): a directory is removed only if it is a lamina file or empty.
    """
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, COMMIT_NAME)) or not os.listdir(path):
            shutil.rmtree(path, ignore_errors=True)
    elif os.path.isfile(path) and path.endswith(".json"):
        os.remove(path)


def run_pair(
    mpiexec: str,
    transport: str,
    path: str,
    work: str,
    shape,
    steps: int,
    ranks: tuple[int, int] = DEFAULT_RANKS,
    timeout: float = 300.0,
    durable: bool = True,
) -> dict:
    """One MPMD launch of the simulation and the analysis under ``LAMINA_TRANSPORT=transport``.

    Returns both programs' measurements, the job's wall time and what is
    left at *path* afterwards; or, when the job failed, ``error`` and the
    tail of its output.
    """
    remove(path)
    results = {p: os.path.join(work, f"insitu-{transport}-{p}.json") for p in ("sim", "analysis")}
    for r in results.values():
        remove(r)
    common = ["--shape", "x".join(map(str, shape)), "--result"]
    sim_args = ["sim", path, "--steps", str(steps), *common, results["sim"]]
    if not durable:
        sim_args.append("--no-fsync")
    ana_args = [
        "analysis",
        path,
        "--timeout",
        str(min(timeout, 120.0)),
        *common,
        results["analysis"],
    ]
    cmd = launch.mpmd_command(
        mpiexec, [(ranks[0], PROGRAM, sim_args), (ranks[1], PROGRAM, ana_args)]
    )
    env = launch.child_env()
    for k in ("LAMINA_ENGINE", "LAMINA_WORKFLOW"):  # two programs: the producer and its consumer
        env.pop(k, None)
    env["LAMINA_TRANSPORT"] = transport
    done = launch.run(cmd, timeout, env=env)
    out = {"transport": transport, "job_s": done.seconds, "command": done.command}
    if (
        done.timed_out
        or done.returncode != 0
        or not all(os.path.exists(r) for r in results.values())
    ):
        if done.timed_out:
            out["error"] = f"timed out after {timeout:g} s"
        elif done.returncode != 0:
            out["error"] = f"exited with status {done.returncode}"
        else:
            out["error"] = "a program left no results"
        out["output"] = done.output.strip().splitlines()[-20:]
        return out
    for p, r in results.items():
        with open(r) as fh:
            out[p] = json.load(fh)
    out["left_bytes"], _ = _dir_size(path)
    out["left"] = os.path.lexists(path)
    return out


def compare(runs: dict[str, dict], shape, steps: int) -> dict:
    """The verdict on runs of the same pair under several transports (``run_pair`` results)."""
    expected = steps * step_bytes(shape)
    problems: list[str] = []
    for t, r in runs.items():
        if "error" in r:
            problems.append(f"{t}: the job {r['error']}")
            continue
        s, a = r["sim"], r["analysis"]
        if s["engine"] != ENGINES[t] or a["engine"] != ENGINES[t]:
            problems.append(f"{t}: engines {s['engine']} / {a['engine']}, expected {ENGINES[t]}")
        if a["steps"] != steps or len(a["results"]) != steps:
            problems.append(f"{t}: the analysis saw {a['steps']} steps, expected {steps}")
        if s["bytes"] != expected or a["bytes"] != expected:
            problems.append(
                f"{t}: {s['bytes']} bytes written, {a['bytes']} read, expected {expected}"
            )
        if t == "memory" and r["left"]:
            problems.append("memory: something was written under the name")
        if t != "memory" and not r["left"]:
            problems.append(f"{t}: no file was written")
    ok_runs = [r for r in runs.values() if "error" not in r]
    identical = len(ok_runs) == len(runs) and len(ok_runs) > 1
    if identical:
        first = ok_runs[0]["analysis"]
        for r in ok_runs[1:]:
            a = r["analysis"]
            if a["results"] != first["results"] or a["sha256"] != first["sha256"]:
                identical = False
                problems.append(
                    f"the analysis results differ between {ok_runs[0]['transport']} and {r['transport']}"
                )
    return {
        "steps": steps,
        "shape": list(shape),
        "step_bytes": step_bytes(shape),
        "expected_bytes": expected,
        "runs": runs,
        "identical": identical,
        "problems": problems,
        "ok": identical and not problems,
    }


def run_demo(
    mpiexec: str,
    directory: str,
    work: str,
    shape,
    steps: int = DEFAULT_STEPS,
    ranks: tuple[int, int] = DEFAULT_RANKS,
    timeout: float = 300.0,
    durable: bool = True,
    progress=None,
) -> dict:
    """The in situ part of ``lamina demo``: the pair under each of :data:`TRANSPORTS`, then :func:`compare`.

    The name is ``DIRECTORY/insitu.lam`` (under ``file`` the native file,
    left there; under ``memory`` nothing is written).
    """
    path = os.path.join(os.path.abspath(directory), "insitu.lam")
    load = os.getloadavg()[0]
    runs = {}
    for t in TRANSPORTS:
        if progress:
            progress(t)
        runs[t] = run_pair(mpiexec, t, path, work, shape, steps, ranks, timeout, durable)
    out = compare(runs, shape, steps)
    out["ranks"] = list(ranks)
    out["path"] = path
    out["cpus"] = os.cpu_count() or 1
    out["load"] = load
    return out
