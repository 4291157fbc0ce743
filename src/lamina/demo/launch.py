"""Starting the demo's MPI programs with ``mpiexec``, under a timeout."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import dataclass

from .. import launch as _launch

#: set in the environment of the programs the demo starts
CHILD_ENV = "LAMINA_DEMO_CHILD"


def find_mpiexec() -> str | None:
    """``mpiexec`` next to the running Python, else on PATH; None if there is none."""
    return _launch.find_mpiexec(required=False)


def child_env() -> dict[str, str]:
    """Environment for the ranks: ours, minus any outer launcher's, plus lamina on the path."""
    return _launch.child_env({CHILD_ENV: "1"})


@dataclass
class Launched:
    """What one mpiexec run did."""

    command: list[str]
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False


def mpi_command(mpiexec: str, nranks: int, module_args: list[str]) -> list[str]:
    return _launch.mpi_command(mpiexec, nranks, "lamina.demo.run", module_args)


def mpmd_command(mpiexec: str, programs: list[tuple[int, str, list[str]]]) -> list[str]:
    """One MPMD launch: ``mpiexec -n N1 python -m mpi4py -m MODULE1 ARGS1 : -n N2 ...``."""
    _launch.check_ranks(sum(n for n, _, _ in programs), "mpiexec (every program's ranks)")
    cmd = [mpiexec]
    if _launch.is_open_mpi(mpiexec):
        cmd.append("--oversubscribe")
    for i, (nranks, module, module_args) in enumerate(programs):
        if i:
            cmd.append(":")
        cmd += ["-n", str(nranks), sys.executable, "-m", "mpi4py", "-m", module, *module_args]
    return cmd


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> Launched:
    """Run *cmd* in its own process group; on timeout (or Ctrl-C) end the whole group.

    *env*: the environment of the ranks (default :func:`child_env`).
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env() if env is None else env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout if math.isfinite(timeout) else None)
        return Launched(cmd, proc.returncode, out, time.perf_counter() - t0)
    except subprocess.TimeoutExpired:
        _end_group(proc)
        out, _ = proc.communicate()
        return Launched(
            cmd,
            proc.returncode if proc.returncode is not None else -1,
            out,
            time.perf_counter() - t0,
            timed_out=True,
        )
    except BaseException:
        _end_group(proc)
        raise


def _end_group(proc: subprocess.Popen) -> None:
    """End the job we started: mpiexec and every rank (ranks run in sessions of their own)."""
    _launch.kill_job(proc)
