"""Starting the tasks of a workflow file as one MPMD job, and stopping it.

The words of the workflow file never reach ``mpiexec``'s command line,
where a ``:`` would start another program and a leading ``-genv`` would be
an option of ``mpiexec`` itself.  :func:`command` is ``mpiexec -n N1 PY
EXEC 0 : -n N2 PY EXEC 1 ...`` (a section per task, task order being the
MPI appnum), where ``PY EXEC I`` is the small program :mod:`.exec`, which
reads task I's command, directory and variables from ``LAMINA_RUN_TASK_<I>``
(set by :func:`environment`) and replaces itself with the command.
:func:`check_programs` finds every task's program (and a Python command's
script) before anything starts, :func:`script` is an equivalent shell
script (``lamina run --dry-run``) and :func:`run` the launch itself, killed
whole on timeout, Ctrl-C, SIGTERM or SIGHUP, and (Linux) when ``lamina
run`` itself is killed.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys

from .. import launch
from . import exec as trampoline
from . import routes as wfmod
from .file import RESERVED_ENV, WorkflowFile, WorkflowFileError

#: a command starting with one of these runs under the Python that runs ``lamina run``
PYTHONS = ("python", "python3")
#: what each rank runs: this Python, isolated, on the trampoline's file (see :mod:`.exec`)
TRAMPOLINE = (sys.executable, "-I", os.path.abspath(trampoline.__file__))
#: longest ``NAME=value`` an environment variable may be (Linux: MAX_ARG_STRLEN, 32 pages)
MAX_VARIABLE_BYTES = 128 * 1024


def task_argv(words: tuple[str, ...] | list[str]) -> list[str]:
    """A task's command as it runs: ``python``/``python3`` first becomes the running Python."""
    out = list(words)
    if out and out[0] in PYTHONS:
        out[0] = sys.executable
    return out


def task_directory(wf: WorkflowFile, i: int) -> str:
    """Where task *i* runs: its ``cwd``, else the workflow file's directory."""
    return wf.tasks[i].cwd or wf.directory


def task_variables(wf: WorkflowFile) -> dict[str, str]:
    """``LAMINA_RUN_TASK_<I>`` for every task: what :mod:`.exec` runs on its ranks."""
    out = {}
    for i, t in enumerate(wf.tasks):
        name = trampoline.PREFIX + str(i)
        value = trampoline.encode(t.name, task_argv(t.command), task_directory(wf, i), t.env)
        size = len(name) + 1 + len(value.encode("utf-8"))
        if size > MAX_VARIABLE_BYTES:
            raise WorkflowFileError(
                wf.path,
                f"the command and variables take {size} bytes, more than the "
                f"{MAX_VARIABLE_BYTES} one environment variable may hold",
                f"{t.name!r} (tasks[{i}])",
                "command",
            )
        out[name] = value
    return out


def environment(wf: WorkflowFile, transport: str | None = None) -> dict[str, str]:
    """The job's whole environment: ours without an outer launcher's, lamina importable,
    ``wf.variables()`` and each task's ``LAMINA_RUN_TASK_<I>``."""
    env = launch.child_env()
    for k in RESERVED_ENV:
        env.pop(k, None)
    for k in [k for k in env if k.startswith(trampoline.PREFIX)]:
        del env[k]
    env.update(wf.variables(transport))
    env.update(task_variables(wf))
    return env


def command(wf: WorkflowFile, mpiexec: str, oversubscribe: bool = False) -> list[str]:
    """``mpiexec -n N1 PY EXEC 0 : -n N2 PY EXEC 1 ...``: a section per task, in order.

    Only lamina's own words are on this line: each section runs
    :data:`TRAMPOLINE` with the task's index, which runs the task's command
    (from :func:`environment`) in the task's directory with its variables.
    *oversubscribe* adds Open MPI's ``--oversubscribe``.  ValueError for more ranks than MPI
    numbers (:func:`lamina.launch.check_ranks`: a file loaded with a *max_ranks* above it).
    """
    launch.check_ranks(wf.ranks, f"{wf.path}: its tasks")
    cmd = [mpiexec]
    if oversubscribe:
        cmd.append("--oversubscribe")
    for i, t in enumerate(wf.tasks):
        if i:
            cmd.append(":")
        cmd += ["-n", str(t.ranks), *TRAMPOLINE, str(i)]
    return cmd


def find_program(program: str, cwd: str, path: str | None) -> str | None:
    """Where ``os.execvpe`` in *cwd* with ``PATH`` *path* finds *program*; None if nowhere.

    A name with a ``/`` is relative to *cwd*; a bare name is looked up in
    each directory of *path* (relative ones from *cwd*).
    """
    if os.sep in program:
        candidates = [os.path.join(cwd, program)]
    else:
        dirs = (os.defpath if path is None else path).split(os.pathsep)
        candidates = [os.path.join(cwd, d or os.curdir, program) for d in dirs]
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


#: a program that is a Python interpreter: ``python``, ``python3``, ``python3.12``, or a path to one
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def python_script(words: tuple[str, ...] | list[str]) -> str | None:
    """The script file a Python command runs, as written: FILE of ``python [OPTIONS] FILE
    ...`` or of ``python [OPTIONS] -m mpi4py [-rc ...] FILE ...``.

    None when the program is not a Python interpreter or runs no file: code (``-c``),
    another module (``-m``), standard input (``-``, nothing), ``--help`` and the like.
    Interpreter options that take a value (``-W arg``, ``-X opt``) are skipped with it.
    """
    if not words or not _PYTHON.fullmatch(os.path.basename(words[0])):
        return None
    rest, i = list(words[1:]), 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "-":
        word = rest[i]
        if word == "--":  # the end of the options
            i += 1
            break
        if word.startswith("--"):
            if word != "--check-hash-based-pycs":
                return None  # --help, --version: no script
            i += 2
            continue
        for j, c in enumerate(word[1:], 2):
            if c in "WX":  # a value: the rest of the word, else the next word
                i += 0 if word[j:] else 1
                break
            if c == "m":
                module = word[j:] or (rest[i + 1] if i + 1 < len(rest) else "")
                after = rest[i + (1 if word[j:] else 2) :]
                return _mpi4py_script(after) if module == "mpi4py" else None
            if c in "chV?":  # code, help, the version: no script
                return None
        i += 1
    return rest[i] if i < len(rest) and rest[i] != "-" else None


def _mpi4py_script(words: list[str]) -> str | None:
    """FILE of the arguments of ``python -m mpi4py``: ``[-rc KEY=VALUE] FILE ...``; None for
    ``-m MODULE``, ``-c CODE``, ``-`` or an option that prints and exits."""
    i = 0
    while i < len(words) and words[i].startswith("-"):
        if words[i] in ("-rc", "--rc"):
            i += 2
        elif words[i].startswith("--rc="):
            i += 1
        else:
            return None
    return words[i] if i < len(words) else None


def check_programs(wf: WorkflowFile, env: dict[str, str]) -> list[WorkflowFileError]:
    """For each task whose program cannot be found (in its directory, on its ``PATH``), or
    whose Python script (:func:`python_script`) is not in its directory, the error.

    A missing script ends its task before ``MPI_Init``, where the other tasks wait for it
    until the job is killed: it is refused here, as a missing program is.
    """
    errors = []
    for i, t in enumerate(wf.tasks):
        argv = task_argv(t.command)
        cwd = task_directory(wf, i)
        path = t.env.get("PATH", env.get("PATH"))
        if find_program(argv[0], cwd, path) is not None:
            script = python_script(t.command)
            if script is None or os.path.exists(os.path.join(cwd, script)):
                continue
            where = "" if os.path.isabs(script) else f" in {cwd}"
            why = f"script {script!r} is not found{where}"
        else:
            where = f"in {cwd}" if os.sep in argv[0] else "on PATH"
            exists = os.path.exists(os.path.join(cwd, argv[0])) and os.sep in argv[0]
            how = "is not an executable file" if exists else f"is not found {where}"
            why = f"program {argv[0]!r} {how}"
        errors.append(WorkflowFileError(wf.path, why, f"{t.name!r} (tasks[{i}])", "command"))
    return errors


def _comment(line: str) -> str:
    """A comment line of the dry-run script that stays one line: a control character of a
    task's name, command or variables (a new line would end the comment, and the shell run
    the rest) written as its escape."""
    return "".join(
        c if " " <= c != "\x7f" else c.encode("unicode_escape").decode("ascii") for c in line
    )


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
    note = ignored_flows(wf, transport)
    if note:
        lines.append(f"#   note: {note}")
    return [_comment(x) for x in lines]


def _flow_note(flow: int | None) -> str:
    return "" if flow is None else f" ({wfmod.flow_name(flow)})"


def script(
    wf: WorkflowFile, cmd: list[str], env: dict[str, str], transport: str | None = None
) -> str:
    """A shell script equivalent to the launch.

    ``cd``, the variables that differ from ours, then per task a comment
    with what its ranks run (directory, variables, the command, quoted) and
    the ``LAMINA_RUN_TASK_<I>`` that says it to :mod:`.exec`, then the
    ``mpiexec`` line.  A program that cannot be found is noted.
    """
    lines = describe(wf, transport)
    lines.append(f"cd {shlex.quote(wf.directory)}")
    tasks = task_variables(wf)
    for k in sorted(set(os.environ) - set(env)):
        lines.append(f"unset {k}")
    for k, v in env.items():
        if os.environ.get(k) != v and k not in tasks:
            lines.append(f"export {k}={shlex.quote(v)}")
    lines.append(
        f"# each rank of task I runs {shlex.join(TRAMPOLINE)} I, which runs the command in "
        f"${trampoline.PREFIX}I (python -m lamina.workflow.exec I is the same)"
    )
    missing = {e.task: e for e in check_programs(wf, env)}
    for i, t in enumerate(wf.tasks):
        label = f"{t.name!r} (tasks[{i}])"
        run = shlex.join(task_argv(t.command))
        if t.env:
            run = shlex.join(["env", *(f"{k}={v}" for k, v in t.env.items())]) + " " + run
        lines.append(
            _comment(f"# task {i} {t.name}: cd {shlex.quote(task_directory(wf, i))} && {run}")
        )
        if label in missing:
            lines.append(
                _comment(f"#   warning: {missing[label].reason}: the launch would stop here")
            )
        name = trampoline.PREFIX + str(i)
        lines.append(f"export {name}={shlex.quote(tasks[name])}")
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


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rank_map(wf: WorkflowFile) -> str:
    """The world ranks of each task, one line: ``ranks 0-1: task 0 'sim' (python sim.py); ...``.

    The index is the task's MPI appnum, the number the transport's messages
    give a task.
    """
    parts, first = [], 0
    for i, t in enumerate(wf.tasks):
        last = first + t.ranks - 1
        parts.append(f"ranks {first}-{last}: task {i} {t.name!r} ({_short(shlex.join(t.command))})")
        first = last + 1
    return _comment("; ".join(parts))


def ignored_flows(wf: WorkflowFile, transport: str | None = None) -> str | None:
    """A note when the job runs with the file transport and the file gives a flow other than
    ``all``, which only the memory transport follows (a file's reader gets every step); None
    otherwise."""
    if wf.transport_for(transport) != "file":
        return None
    reads = [
        f"task {t.name!r} reads {r.name!r} with flow {wfmod.flow_name(r.flow)}"
        for t in wf.tasks
        for r in t.reads
        if r.flow is not None and r.flow != 1
    ]
    if not reads:
        return None
    return _comment(
        "flow is ignored under the file transport, every reader gets every step: "
        + "; ".join(reads)
    )


class _Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    raise _Terminated(signum)


#: the signals that kill the job and end ``lamina run`` with 128 + the signal's number
#: (SIGHUP: the terminal closed; left alone when it is ignored, as under nohup)
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def run(
    wf: WorkflowFile,
    transport: str | None = None,
    timeout: float | None = None,
    mpiexec: str | None = None,
) -> int:
    """Launch the job, its output going to ours; returns its exit status.

    Every task's program is looked for first (:func:`check_programs`): the
    first one missing raises its WorkflowFileError and nothing starts.
    After *timeout* seconds, on Ctrl-C, SIGTERM or SIGHUP the whole job is
    killed (mpiexec and every rank) and 124, 130, 143 or 129 returned.  On
    Linux the job also dies with this process when it is killed outright
    (SIGKILL): ``mpiexec`` gets SIGKILL (:func:`~lamina.launch.parent_death_signal`)
    and takes its ranks down.  A job that fails by itself is named: its
    status and which world ranks ran which task (:func:`rank_map`) on
    stderr; a rank killed by signal N gives MPICH's status N, which this
    cannot tell from a rank's exit status N.  However the job ends, the MPICH shared-memory segments it left
    (no process maps them) are removed.
    """
    exe = mpiexec or launch.find_mpiexec(required=True)
    assert exe is not None  # required: FileNotFoundError otherwise
    env = environment(wf, transport)
    missing = check_programs(wf, env)
    if missing:
        raise missing[0]
    cmd = command(wf, exe, oversubscribe=launch.is_open_mpi(exe))
    note = ignored_flows(wf, transport)
    if note:
        print(f"lamina run: note: {note}", file=sys.stderr)
    before = launch.shm_listing()
    old = {}
    try:
        for sig in _ENDING_SIGNALS:
            if signal.getsignal(sig) != signal.SIG_IGN:
                old[sig] = signal.signal(sig, _on_signal)
    except ValueError:  # not the main thread: no handler, Ctrl-C and the timeout still work
        pass
    proc: subprocess.Popen | None = None
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=wf.directory,
            env=env,
            start_new_session=True,
            preexec_fn=launch.parent_death_signal(),
        )
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        print(f"lamina run: the job ran past --timeout {timeout:g} s: killed", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        _kill(proc)
        print("lamina run: interrupted: job killed", file=sys.stderr)
        return 130
    except _Terminated as e:
        _kill(proc)
        what = "hangup" if e.signum == signal.SIGHUP else "terminated"
        print(f"lamina run: {what}: job killed", file=sys.stderr)
        return 128 + e.signum
    except BaseException:
        _kill(proc)
        raise
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        launch.remove_files(launch.orphaned_segments(before))
    rc = rc if rc >= 0 else 128 - rc
    if rc:
        print(f"lamina run: job exited with status {rc}; {rank_map(wf)}", file=sys.stderr)
    return rc


def _kill(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        launch.kill_job(proc)
