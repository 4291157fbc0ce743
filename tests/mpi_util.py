"""Run the scenario scripts of ``tests/scenarios`` under ``mpiexec`` with a timeout.

Every launch has a wall-clock limit so that a hang fails the test instead of
blocking the run.  MPICH's hydra puts each rank in a session of its own, so
killing ``mpiexec``'s process group does not reach the ranks: on a timeout
(and in :func:`kill_tree`) every descendant process is found through
``/proc`` and killed by its pid.

Launches in which a rank is meant to die (SIGKILL) and the others to go on
need more (see :func:`survivable` and :func:`watch`): hydra's proxy kills
every rank as soon as one of them is killed by a signal, and the survivors
of such a launch cannot finish ``MPI_Finalize``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lamina.launch import descendants, remove_files, shm_segments

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
SRC = Path(__file__).resolve().parent.parent / "src"


def mpiexec() -> str:
    """The ``mpiexec`` next to this Python (the mpich wheel's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found next to sys.executable or on PATH")
    return found


def scenario(name: str) -> str:
    path = SCENARIOS / name
    if not path.suffix:
        path = path.with_suffix(".py")
    return str(path)


def child_env(extra: dict | None = None) -> dict:
    """Environment for a child: lamina importable, no engine override, quiet warnings."""
    env = dict(os.environ)
    env.pop("LAMINA_ENGINE", None)
    env.pop("LAMINA_TRANSPORT", None)
    pp = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + pp if pp else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def mpi_command(n: int, script: str, *args, flags=()) -> list[str]:
    """``mpiexec [FLAGS] -n N python -m mpi4py scenarios/SCRIPT args...``."""
    return [
        mpiexec(),
        *flags,
        "-n",
        str(n),
        sys.executable,
        "-m",
        "mpi4py",
        scenario(script),
        *map(str, args),
    ]


def python_command(script: str, *args) -> list[str]:
    return [sys.executable, scenario(script), *map(str, args)]


def start(cmd: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    """Start *cmd* in a new session (so it can be killed as a tree), text pipes."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(env),
        start_new_session=True,
        **kw,
    )


def start_mpi(n: int, script: str, *args, env: dict | None = None) -> subprocess.Popen:
    return start(mpi_command(n, script, *args), env=env)


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send *sig* to *proc*, its process group and every descendant (by pid).

    With SIGKILL, also remove the MPICH shared-memory segments the killed
    ranks had mapped (a normal MPI_Finalize would have removed them).
    """
    pids = descendants(proc.pid)
    shm = shm_segments([proc.pid, *pids]) if sig == signal.SIGKILL else set()
    for p in [proc.pid, *pids]:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    if sig == signal.SIGKILL:
        # the ranks were reparented when their launcher died: wait until they are gone
        deadline = time.monotonic() + 10
        for p in pids:
            while time.monotonic() < deadline:
                try:
                    os.kill(p, 0)
                except ProcessLookupError:
                    break
                if _is_zombie(p):
                    break
                time.sleep(0.02)
        remove_files(shm)


def _is_zombie(pid: int) -> bool:
    """True when *pid* has exited (a zombie waiting to be reaped), every thread of it too.

    A killed process's leading thread turns zombie before its other threads
    are gone, and its files (the writer lock of a native file) are released
    only with the last of them.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].split()[0] == "Z" and threads <= 1


class Result:
    """What a finished launch produced."""

    def __init__(self, cmd, returncode: int, stdout: str, stderr: str, seconds: float):
        self.cmd = cmd
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds

    def describe(self) -> str:
        return (
            f"command: {' '.join(self.cmd)}\nexit status: {self.returncode} after {self.seconds:.1f} s\n"
            f"--- stdout ---\n{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-12000:]}"
        )

    def lines(self, prefix: str) -> list[str]:
        return [
            ln[len(prefix) :].strip() for ln in self.stdout.splitlines() if ln.startswith(prefix)
        ]


def finish(proc: subprocess.Popen, cmd, timeout: float, t0: float | None = None) -> Result:
    """Wait for *proc* at most *timeout* s; on timeout kill the whole tree and report."""
    t0 = time.monotonic() if t0 is None else t0
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        err = (err or "") + f"\n*** killed: no result after {timeout} s (hang?) ***\n"
        rc = -9999
    except BaseException:
        # the test itself was stopped (pytest-timeout, ^C): no rank may outlive it, spinning
        # in a collective and taking the cores of the tests after it
        kill_tree(proc)
        raise
    return Result(cmd, rc, out or "", err or "", time.monotonic() - t0)


def check(res: Result, expect_ok: str | None = "OK") -> Result:
    """Assert that a launch exited 0 (and printed a line starting with *expect_ok*)."""
    if res.returncode != 0:
        sys.stderr.write(res.describe() + "\n")
        raise AssertionError(f"launch failed:\n{res.describe()}")
    if expect_ok is not None and not res.lines(expect_ok):
        sys.stderr.write(res.describe() + "\n")
        raise AssertionError(f"launch did not report {expect_ok!r}:\n{res.describe()}")
    return res


def run_mpi(
    n: int,
    script: str,
    *args,
    timeout: float = 60,
    env: dict | None = None,
    expect_ok: str | None = "OK",
    flags=(),
) -> Result:
    """``mpiexec [FLAGS] -n N python -m mpi4py scenarios/SCRIPT args...``; asserts success."""
    cmd = mpi_command(n, script, *args, flags=flags)
    t0 = time.monotonic()
    proc = start(cmd, env=env)
    return check(finish(proc, cmd, timeout, t0), expect_ok)


def run_python(
    script: str, *args, timeout: float = 60, env: dict | None = None, expect_ok: str | None = "OK"
) -> Result:
    """``python scenarios/SCRIPT args...`` (one rank, no mpiexec); asserts success."""
    cmd = python_command(script, *args)
    t0 = time.monotonic()
    proc = start(cmd, env=env)
    return check(finish(proc, cmd, timeout, t0), expect_ok)


# ----------------------------------------------------------------- launches that lose a rank

#: mpiexec flags for a launch whose ranks may die while the others go on: without it
#: hydra ends the whole launch when a rank exits with an error
KEEP_GOING = ("-disable-auto-cleanup",)

_SHIM = 'trap "" USR1; "$@"; exit $?'


def survivable(cmd: list[str]) -> list[str]:
    """*cmd* (one program of a launch) run under a shell, so that the launch survives a rank killed by a signal.

    Hydra's proxy SIGKILLs every rank of the launch as soon as one of its
    children is *killed by a signal*, even with ``-disable-auto-cleanup``
    (that flag only covers ranks that exit with an error status).  Under
    ``sh -c '...; exit $?'`` the proxy's child is the shell, which outlives
    the rank and exits with status 128 + signal.  The shell (and so the
    rank) ignores SIGUSR1, which the proxy sends to every other rank when
    one leaves without ``MPI_Finalize``.  Use with :data:`KEEP_GOING`.
    """
    return ["sh", "-c", _SHIM, "rank", *cmd]


def watch(
    proc: subprocess.Popen, cmd, timeout: float, t0: float | None = None, tick=None
) -> Result:
    """:func:`finish` for a launch that loses ranks: calls *tick()* about every 0.2 s while it runs.

    MPICH removes its shared-memory segments (``/dev/shm/mpich_shm_*``) in
    ``MPI_Finalize``, which a launch that lost a rank never completes (it
    waits for every process, the dead one included; the survivors leave with
    ``os._exit``).  The segments its processes map are collected while it
    runs and removed once it ended.
    """
    t0 = time.monotonic() if t0 is None else t0
    shm: set[str] = set()
    out, err = "", ""
    rc = None
    try:
        while True:
            shm |= shm_segments([proc.pid, *descendants(proc.pid)])
            try:
                o, e = proc.communicate(timeout=0.2)
                out, err, rc = o or "", e or "", proc.returncode
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - t0 > timeout:
                kill_tree(proc)
                o, e = proc.communicate()
                out, err = (
                    o or "",
                    (e or "") + f"\n*** killed: no result after {timeout} s (hang?) ***\n",
                )
                rc = -9999
                break
            if tick is not None:
                tick()
    except BaseException:
        if proc.poll() is None:
            kill_tree(proc)
            proc.communicate()
        raise
    finally:
        remove_files(shm)
    return Result(cmd, rc, out, err, time.monotonic() - t0)
