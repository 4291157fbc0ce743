"""Starting lamina programs under ``mpiexec`` from a running program, and stopping them.

Used by ``lamina demo``, ``lamina bench`` and ``lamina run`` (and by anything
that launches MPI jobs of its own).  MPICH's launcher starts each rank in a
session of its own, so ending ``mpiexec``'s process group does not reach the
ranks: :func:`kill_job` finds every descendant through ``/proc`` and kills it
by pid.  :func:`parent_death_signal` ties a job to the process that started
it (Linux), and :func:`orphaned_segments` finds the shared-memory segments a
job that ended by itself (an exception, ``MPI_Abort``) left behind.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

# variables a launcher sets for its ranks; a nested mpiexec must not inherit them
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")


def find_mpiexec(required: bool = True) -> str | None:
    """``mpiexec`` next to the running Python (a venv with the mpich wheel), else on PATH.

    Returns None when there is none and *required* is False.
    """
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    import shutil  # (here: 4 ms of every process's start otherwise)

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


#: most ranks of one launch: MPI numbers ranks with a C int, and MPICH's ``mpiexec`` takes a
#: larger count modulo 2**32 without a word (``-n 4294967298`` starts 2 ranks)
MAX_RANKS = 2**31 - 1
#: a launched rank's own memory before any data, a lower bound: Python, numpy, mpi4py and lamina
#: take about 47 MiB resident a rank, 27 MiB of it private (the libraries' pages are shared
#: among the ranks of a machine); a launch of many ranks on this machine is refused where
#: they would not fit
RANK_MEMORY = 24 << 20


def check_ranks(n: int, what: str) -> int:
    """*n*, a count of ranks that *what* asks for; ValueError above :data:`MAX_RANKS`."""
    if n > MAX_RANKS:
        raise ValueError(
            f"{what}: {n} ranks is more than MPI can number (at most {MAX_RANKS:,} in a launch)"
        )
    return n


def mpi_command(mpiexec: str, nranks: int, module: str, args: list[str]) -> list[str]:
    """``mpiexec -n N python -m mpi4py -m MODULE ARGS`` (Open MPI: with ``--oversubscribe``, so
    that more ranks than cores may run, as MPICH allows)."""
    check_ranks(nranks, "mpiexec -n")
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


#: where MPICH's shared-memory segments live, and how their names start
SHM_DIR, SHM_PREFIX = "/dev/shm", "mpich_shm_"
#: prctl(2) option: the signal a process gets when the thread that started it ends
PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets *sig* when the thread
    that started it ends, however it ends (SIGKILL included).

    Linux's ``prctl(PR_SET_PDEATHSIG)``, which the child keeps across ``exec``;
    a child whose starter died before the call gets *sig* at once.  Given
    to ``mpiexec``, it takes the ranks down with it.  None where there is no
    such call (not Linux): the caller then starts the child plainly.

    A ``preexec_fn`` runs between fork and exec: the caller must not run
    other Python threads at that point (``lamina run`` runs none).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    starter = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)  # fails only for a bad signal number
        if os.getppid() != starter:  # the starter died before the call above
            os.kill(os.getpid(), sig)

    return preexec


def shm_listing(directory: str = SHM_DIR) -> set[str]:
    """The MPICH shared-memory segments (``/dev/shm/mpich_shm_*``) that we own."""
    try:
        names = os.listdir(directory)
    except OSError:
        return set()
    uid, out = os.geteuid(), set()
    for name in names:
        if not name.startswith(SHM_PREFIX):
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid == uid:
                out.add(path)
        except OSError:
            pass
    return out


def _all_pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def orphaned_segments(
    before: Iterable[str], directory: str = SHM_DIR, grace: float = 1.0
) -> set[str]:
    """Segments of :func:`shm_listing` that are not in *before* and that no process maps.

    What a job that ended by itself (an exception, ``MPI_Abort``, a rank
    killed) leaves: its ranks could not run ``MPI_Finalize``, which removes
    them.  Note :func:`shm_listing` before the launch and remove these
    (:func:`remove_files`) after the job has ended.  A segment another job
    maps is left alone; so is one created less than *grace* seconds ago
    and still unmapped (its creator maps it right after creating it): this
    waits until it is *grace* seconds old and looks again.
    """
    new = shm_listing(directory) - set(before)
    if not new:
        return set()
    newest = 0.0
    for path in new:
        try:
            newest = max(newest, os.stat(path).st_ctime)
        except OSError:
            pass
    wait = newest + grace - time.time()
    if wait > 0:
        time.sleep(min(wait, grace))
    new = {p for p in new if os.path.exists(p)}
    return new - shm_segments(_all_pids(), directory) if new else set()


def shm_segments(pids: list[int], directory: str = SHM_DIR) -> set[str]:
    """MPICH shared-memory segments (``/dev/shm/mpich_shm_*``) mapped by *pids*.

    ``MPI_Finalize`` removes them; ranks that are killed (or cannot finish
    it because a peer died) leave them behind, so whoever ends such a job
    collects them first and removes them after (:func:`remove_files`).
    """
    prefix = os.path.join(directory, SHM_PREFIX)
    out = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/maps") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6 and parts[5].startswith(prefix):
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
    if proc.poll() is not None:  # ended and reaped: its pid may be another process's by now
        return
    pids = descendants(proc.pid)
    shm = shm_segments([proc.pid, *pids])
    for p in [proc.pid, *pids]:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    remove_files(shm)
