"""Starting lamina programs under ``mpiexec`` from a running program, and stopping them.

Used by ``lamina demo`` and ``lamina bench`` (and by anything that launches
MPI jobs of its own).  MPICH's launcher starts each rank in a session of its
own, so ending ``mpiexec``'s process group does not reach the ranks:
:func:`kill_job` finds every descendant through ``/proc`` and kills it by pid.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys

# variables a launcher sets for its ranks; a nested mpiexec must not inherit them
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")


def find_mpiexec(required: bool = True) -> str | None:
    """``mpiexec`` next to the running Python (a venv with the mpich wheel), else on PATH.

    Returns None when there is none and *required* is False.
    """
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None and required:
        raise FileNotFoundError("no mpiexec next to the running python or on PATH")
    return found


@functools.lru_cache(maxsize=8)
def is_open_mpi(mpiexec: str) -> bool:
    """True if *mpiexec* is Open MPI's (it then needs ``--oversubscribe`` for more ranks than cores)."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out or "OpenRTE" in out


def mpi_command(mpiexec: str, nranks: int, module: str, args: list[str]) -> list[str]:
    """``mpiexec -n N python -m mpi4py -m MODULE ARGS`` (Open MPI: with ``--oversubscribe``, so
    that more ranks than cores may run, as MPICH allows)."""
    cmd = [mpiexec, "--oversubscribe"] if is_open_mpi(mpiexec) else [mpiexec]
    return [*cmd, "-n", str(nranks), sys.executable, "-m", "mpi4py", "-m", module, *args]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for launched ranks: ours, minus any outer launcher's, with lamina importable."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_LAUNCHER_PREFIXES)
        and not (k.startswith("OMPI_") and not k.startswith("OMPI_MCA_"))
    }
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
    if extra:
        env.update(extra)
    return env


def descendants(pid: int) -> list[int]:
    """Live descendants of *pid*, found through /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def shm_segments(pids: list[int]) -> set[str]:
    """MPICH shared-memory segments (``/dev/shm/mpich_shm_*``) mapped by *pids*.

    ``MPI_Finalize`` removes them; ranks that are killed (or cannot finish
    it because a peer died) leave them behind, so whoever ends such a job
    collects them first and removes them after (:func:`remove_files`).
    """
    out = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/maps") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6 and parts[5].startswith("/dev/shm/mpich_shm_"):
                        out.add(parts[5])
        except OSError:
            pass
    return out


def remove_files(paths) -> None:
    """Unlink each of *paths*; missing ones are fine."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def kill_job(proc: subprocess.Popen) -> None:
    """Kill a launched job: the launcher and every process below it, by pid, and its shared-memory segments."""
    pids = descendants(proc.pid)
    shm = shm_segments([proc.pid, *pids])
    for p in [proc.pid, *pids]:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    remove_files(shm)
