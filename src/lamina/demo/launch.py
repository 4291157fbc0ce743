"""Starting the demo's MPI programs with ``mpiexec``, under a timeout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

#: set in the environment of the programs the demo starts
CHILD_ENV = "LAMINA_DEMO_CHILD"

# variables a launcher sets for its ranks; a nested mpiexec must not inherit them
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")


def find_mpiexec() -> str | None:
    """``mpiexec`` next to the running Python (a venv with the mpich wheel), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or shutil.which("mpirun")


def _is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out or "OpenRTE" in out


def child_env() -> dict[str, str]:
    """Environment for the ranks: ours, minus any outer launcher's, plus lamina on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_LAUNCHER_PREFIXES)
        and not (k.startswith("OMPI_") and not k.startswith("OMPI_MCA_"))
    }
    import lamina

    src = os.path.dirname(os.path.dirname(os.path.abspath(lamina.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env[CHILD_ENV] = "1"
    return env


@dataclass
class Launched:
    """What one mpiexec run did."""

    command: list[str]
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False


def mpi_command(mpiexec: str, nranks: int, module_args: list[str]) -> list[str]:
    cmd = [mpiexec]
    if _is_open_mpi(mpiexec):
        cmd.append("--oversubscribe")
    return [
        *cmd,
        "-n",
        str(nranks),
        sys.executable,
        "-m",
        "mpi4py",
        "-m",
        "lamina.demo.run",
        *module_args,
    ]


def run(cmd: list[str], timeout: float) -> Launched:
    """Run *cmd* in its own process group; on timeout (or Ctrl-C) end the whole group."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
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
    """SIGTERM the process group we started, then SIGKILL what is left of it."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
