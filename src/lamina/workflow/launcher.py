"""Starting the tasks of a workflow file as one MPMD job, and stopping it.

:func:`command` is the ``mpiexec -n N1 CMD1 : -n N2 CMD2 ...`` line (a
section per task, task order being the MPI appnum), :func:`environment` the
job's variables, :func:`script` an equivalent shell script (``lamina run
--dry-run``), :func:`run` the launch itself, killed whole on timeout, Ctrl-C
or SIGTERM.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

from .. import launch
from . import routes as wfmod
from .file import RESERVED_ENV, WorkflowFile

#: a command starting with one of these runs under the Python that runs ``lamina run``
PYTHONS = ("python", "python3")


def environment(wf: WorkflowFile, transport: str | None = None) -> dict[str, str]:
    """The job's whole environment: ours without an outer launcher's, lamina importable, ``wf.variables()``."""
    env = launch.child_env()
    for k in RESERVED_ENV:
        env.pop(k, None)
    env.update(wf.variables(transport))
    return env


def command(wf: WorkflowFile, mpiexec: str, oversubscribe: bool = False) -> list[str]:
    """``mpiexec -n N1 CMD1 : -n N2 CMD2 ...``: a section per task, in order.

    A task's ``cwd`` becomes ``-wdir DIR`` and its ``env`` an ``env NAME=VALUE``
    prefix of its command; ``python``/``python3`` as the first word becomes
    the running Python.  *oversubscribe* adds Open MPI's ``--oversubscribe``.
    """
    cmd = [mpiexec]
    if oversubscribe:
        cmd.append("--oversubscribe")
    for i, t in enumerate(wf.tasks):
        if i:
            cmd.append(":")
        cmd += ["-n", str(t.ranks)]
        if t.cwd is not None:
            cmd += ["-wdir", t.cwd]
        if t.env:
            cmd += ["env", *(f"{k}={v}" for k, v in t.env.items())]
        words = list(t.command)
        if words[0] in PYTHONS:
            words[0] = sys.executable
        cmd += words
    return cmd


def describe(wf: WorkflowFile, transport: str | None = None) -> list[str]:
    """Comment lines: the tasks and who sends what to whom."""
    choice = wf.transport_for(transport)
    lines = [
        f"# {wf.path}: {len(wf.tasks)} task(s), {wf.ranks} rank(s), transport {choice}",
    ]
    for i, t in enumerate(wf.tasks):
        lines.append(f"#   task {i} {t.name}: {t.ranks} rank(s): {shlex.join(t.command)}")
    flow_of = {(c, r.name): r.flow for c, t in enumerate(wf.tasks) for r in t.reads}
    for t in wf.tasks:
        for w in t.writes:
            readers = [
                wf.tasks[c].name + _flow_note(flow_of[c, w.name])
                for c in range(len(wf.tasks))
                if (c, w.name) in flow_of
            ]
            if readers:
                lines.append(f"#   {w.name}: {t.name} -> {', '.join(readers)}")
            else:
                lines.append(f"#   {w.name}: written by {t.name}, read by no task: stays a file")
    return lines


def _flow_note(flow: int | None) -> str:
    return "" if flow is None else f" ({wfmod.flow_name(flow)})"


def script(
    wf: WorkflowFile, cmd: list[str], env: dict[str, str], transport: str | None = None
) -> str:
    """A shell script equivalent to the launch: ``cd``, the variables that differ from ours, the command."""
    lines = describe(wf, transport)
    lines.append(f"cd {shlex.quote(wf.directory)}")
    for k in sorted(set(os.environ) - set(env)):
        lines.append(f"unset {k}")
    for k, v in env.items():
        if os.environ.get(k) != v:
            lines.append(f"export {k}={shlex.quote(v)}")
    sections: list[list[str]] = []
    cur: list[str] = []
    for word in cmd:
        if word == ":":
            sections.append(cur)
            cur = []
        else:
            cur.append(word)
    sections.append(cur)
    lines.append(" \\\n  : ".join(shlex.join(s) for s in sections))
    return "\n".join(lines)


class _Terminated(Exception):
    pass


def _on_term(signum, frame):
    raise _Terminated()


def run(
    wf: WorkflowFile,
    transport: str | None = None,
    timeout: float | None = None,
    mpiexec: str | None = None,
) -> int:
    """Launch the job, its output going to ours; returns its exit status.

    After *timeout* seconds, on Ctrl-C or on SIGTERM the whole job is killed
    (mpiexec and every rank) and 124, 130 or 143 returned.
    """
    exe = mpiexec or launch.find_mpiexec(required=True)
    assert exe is not None  # required: FileNotFoundError otherwise
    cmd = command(wf, exe, oversubscribe=launch.is_open_mpi(exe))
    env = environment(wf, transport)
    proc = subprocess.Popen(cmd, cwd=wf.directory, env=env, start_new_session=True)
    old = None
    try:
        old = signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread: no handler, Ctrl-C and the timeout still work
        pass
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        launch.kill_job(proc)
        print(f"lamina run: the job ran past --timeout {timeout:g} s: killed", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        launch.kill_job(proc)
        print("lamina run: interrupted: job killed", file=sys.stderr)
        return 130
    except _Terminated:
        launch.kill_job(proc)
        print("lamina run: terminated: job killed", file=sys.stderr)
        return 143
    except BaseException:
        launch.kill_job(proc)
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return rc if rc >= 0 else 128 - rc
