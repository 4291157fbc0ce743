"""``lamina run WORKFLOW.yaml``: workflow files, their checks, and the MPMD jobs they launch.

The end-to-end tests launch the unmodified transport scenario programs
(``scenarios/transport_producer.py`` and ``transport_consumer.py``, which
checks every value) from a workflow file under each transport, per-consumer
flows from the file, and the producer options (``queue_limit``,
``shallow``) the file gives a task.  The checks of the file are fast unit
tests without MPI.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

from lamina import cli, launch  # noqa: E402
from lamina.errors import LaminaError  # noqa: E402
from lamina.workflow import command as command_mod  # noqa: E402
from lamina.workflow import exec as exec_mod  # noqa: E402
from lamina.workflow import file as wr  # noqa: E402
from lamina.workflow import launcher  # noqa: E402
from lamina.workflow import routes as wfmod  # noqa: E402

yaml = pytest.importorskip("yaml")

TIMEOUT = 120  # per launch: the machine may be shared

#: a task command's program: prints its arguments, directory and two variables as JSON (one
#: write: ranks share the job's output, unbuffered)
PRINT_ARGS = (
    "import json, os, sys; sys.stdout.write('ARGS ' + json.dumps([sys.argv[1:], os.getcwd(), "
    "os.environ.get('SHARED'), os.environ.get('OWN')]) + '\\n')"
)


def write(tmp_path, data, name="wf.yaml") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return str(path)


def py(script: str, *args) -> list[str]:
    """A task command: ``python -m mpi4py scenarios/SCRIPT args`` (``python`` becomes this Python)."""
    return ["python", "-m", "mpi4py", mu.scenario(script), *map(str, args)]


def lamina_run(path: str, *args, timeout: float = TIMEOUT, env: dict | None = None) -> mu.Result:
    """``python -m lamina.cli run PATH args`` in its own session, killed as a tree on a hang."""
    cmd = [sys.executable, "-m", "lamina.cli", "run", path, *args]
    t0 = time.monotonic()
    proc = mu.start(cmd, env={"LAMINA_TRANSPORT_TIMEOUT": "30", **(env or {})})
    return mu.finish(proc, cmd, timeout, t0)


def _skip_without_mpiexec():
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        pytest.skip("no mpiexec")


def probes(res: mu.Result) -> dict[str, dict]:
    out = {}
    for line in res.lines("PROBE"):
        rec = json.loads(line)
        out[rec["role"]] = rec
    return out


# ----------------------------------------------------------------- end to end


@pytest.mark.parametrize("transport", ["memory", "file", "both"])
def test_run_producer_consumer(tmp_path, transport):
    """2 producer ranks and 1 consumer rank of the unmodified scenario programs, from a workflow file."""
    _skip_without_mpiexec()
    steps = 3
    path = write(
        tmp_path,
        {
            "transport": transport,
            "timeout": 30,
            "tasks": [
                {
                    "name": "sim",
                    "command": py("transport_producer", "bench.lam", steps),
                    "ranks": 2,
                    "writes": ["bench.lam"],
                },
                {
                    "name": "ana",
                    "command": py("transport_consumer", "bench.lam", steps),
                    "ranks": 1,
                    "reads": ["bench.lam"],
                },
            ],
        },
    )
    res = mu.check(lamina_run(path, "--timeout", str(TIMEOUT - 10)), "OK consumer")
    [prod] = res.lines("OK producer")
    [cons] = res.lines("OK consumer")
    want = "native" if transport == "file" else "mpi" if transport == "memory" else "both"
    assert want in cons and f"{steps} steps on 1 ranks" in cons, res.describe()
    assert "2 ranks" in prod, res.describe()
    # names are relative to the workflow file's directory: the job ran there
    assert (tmp_path / "bench.lam").exists() == (transport != "memory"), sorted(
        os.listdir(tmp_path)
    )


@pytest.mark.parametrize(
    "transport, linked", [("memory", False), ("file", False), ("memory", True)]
)
def test_a_name_with_a_directory_pairs_from_a_task_s_own_cwd(tmp_path, transport, linked):
    """The consumer runs in run/ and opens out.lam, the file the producer, above it, writes as
    run/out.lam (as the workflow names it): under memory they never met (the name did not
    match run/out.lam) and the producer gave up waiting for its consumer.  The workflow's
    directory reached through a link: its tasks' working directories are the real ones."""
    _skip_without_mpiexec()
    if linked:
        (tmp_path / "real").mkdir()
        os.symlink(tmp_path / "real", tmp_path / "link")
        tmp_path = tmp_path / "link"
    (tmp_path / "run").mkdir()
    path = write(
        tmp_path,
        {
            "transport": transport,
            "timeout": 30,
            "tasks": [
                {
                    "name": "sim",
                    "command": py("transport_producer", "run/out.lam", 3),
                    "ranks": 1,
                    "writes": ["run/out.lam"],
                },
                {
                    "name": "ana",
                    "command": py("transport_consumer", "out.lam", 3),
                    "ranks": 1,
                    "cwd": "run",
                    "reads": ["run/out.lam"],
                },
            ],
        },
    )
    res = mu.check(lamina_run(path, "--timeout", str(TIMEOUT - 10)), "OK consumer")
    [cons] = res.lines("OK consumer")
    assert "3 steps on 1 ranks" in cons, res.describe()
    assert (tmp_path / "run" / "out.lam").exists() == (transport == "file")


def test_run_flows_from_the_file(tmp_path):
    """Per-consumer flows in the file: one consumer task takes the latest step, another every 3rd."""
    _skip_without_mpiexec()
    path = write(
        tmp_path,
        """
tasks:
  - name: producer
    command: python -m mpi4py {flow} produce f 10
    ranks: 2
    writes: [f]
  - name: slow
    command: python -m mpi4py {flow} latest f 10 -
    ranks: 1
    reads: [{{name: f, flow: latest}}]
  - name: thin
    command: python -m mpi4py {flow} every f 10 3
    ranks: 1
    reads:
      - name: f
        flow: 3
""".format(flow=shlex.quote(mu.scenario("transport_flow"))),
    )
    res = mu.check(lamina_run(path), "OK latest:")
    assert res.lines("OK every 3: [0, 3, 6, 9]"), res.describe()


def test_run_options_reach_the_tasks(tmp_path):
    """The file's transport, timeout, env, cwd and producer options reach each task's environment."""
    _skip_without_mpiexec()
    (tmp_path / "work").mkdir()
    path = write(
        tmp_path,
        {
            "transport": "memory",
            "timeout": 25,
            "env": {"RUN_PROBE_MARKER": "all"},
            "tasks": [
                {
                    "name": "w",
                    "command": py("run_probe", "write", "p.lam", 4),
                    "ranks": 2,
                    "cwd": "work",
                    "writes": [{"name": "p.lam", "shallow": ["/x"], "queue_limit": 3}],
                },
                {
                    "name": "r",
                    "command": py("run_probe", "read", "p.lam", 4),
                    "ranks": 1,
                    "cwd": "work",
                    "env": {"RUN_PROBE_MARKER": "reader"},
                    "reads": ["p.lam"],
                },
            ],
        },
    )
    res = mu.check(lamina_run(path), None)
    p = probes(res)
    assert set(p) == {"write", "read"}, res.describe()
    w, r = p["write"], p["read"]
    assert (w["app"], r["app"]) == (0, 1)
    assert w["transport"] == r["transport"] == "memory"
    assert w["workflow"] == r["workflow"] == "p.lam=0>1 | queue_limit=3 | shallow=x"
    assert w["timeout"] == "25"
    assert (w["marker"], r["marker"]) == ("all", "reader")
    assert w["cwd"] == r["cwd"] == str(tmp_path / "work")
    assert w["options"] == {"queue_limit": 3, "shallow": ["x"]} and r["options"] == {}
    assert w["engine"] == r["engine"] == "mpi" and r["steps"] == 4
    assert (w["queue_limit"], w["shallow"]) == (3, ["x"]), res.describe()  # what the engine applied


def test_run_exit_status_and_timeout(tmp_path):
    """The job's exit status comes back; --timeout kills the whole job (status 124)."""
    _skip_without_mpiexec()
    fails = write(
        tmp_path,
        {"tasks": [{"command": ["python", "-c", "import sys; sys.exit(3)"], "ranks": 1}]},
        "fails.yaml",
    )
    res = lamina_run(fails)
    assert res.returncode == 3, res.describe()
    hangs = write(
        tmp_path,
        {
            "tasks": [
                {
                    "command": [
                        "python",
                        "-c",
                        "import time; print('started', flush=True); time.sleep(300)",
                    ],
                    "ranks": 2,
                }
            ]
        },
        "hangs.yaml",
    )
    t0 = time.monotonic()
    res = lamina_run(hangs, "--timeout", "3")
    assert res.returncode == 124, res.describe()
    assert "ran past --timeout 3 s" in res.stderr and res.stdout.count("started") == 2, (
        res.describe()
    )
    assert time.monotonic() - t0 < 60


# ----------------------------------------------------------------- words mpiexec must not read

#: prints its rank in the launch (one rank a task: the task's index) and its arguments; no MPI
#: (a program that never initializes MPI would leave MPI ones of the same launch waiting)
PRINT_APP = (
    "import json, os, sys; rank = os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')); "
    "sys.stdout.write('APP ' + json.dumps([int(rank), sys.argv[1:]]) + '\\n')"
)


def test_run_passes_colons_and_options_to_the_command(tmp_path):
    """':' in a command was mpiexec's section separator: it started 'echo pwned' as a task of its
    own and shifted the numbering of the tasks after it; 'prog --select :' did not start."""
    _skip_without_mpiexec()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hello = bin_dir / "hello"
    hello.write_text('#!/bin/sh\necho "HELLO $*"\n')
    hello.chmod(0o755)
    path = write(
        tmp_path,
        {
            "tasks": [
                {
                    "name": "a",
                    "command": ["python", "-c", PRINT_APP, "x", ":", "-n", "1", "echo", "pwned"],
                    "ranks": 1,
                },
                {
                    "name": "b",
                    "command": f"python -c {shlex.quote(PRINT_APP)} --select :",
                    "ranks": 1,
                },
                {
                    "name": "c",
                    "command": "hello -genv A B :",
                    "ranks": 1,
                    "env": {"PATH": str(bin_dir)},
                },
            ]
        },
    )
    res = mu.check(lamina_run(path), None)
    got = sorted(json.loads(line) for line in res.lines("APP "))
    assert got == [[0, ["x", ":", "-n", "1", "echo", "pwned"]], [1, ["--select", ":"]]], (
        res.describe()
    )
    assert res.lines("HELLO") == ["-genv A B :"], res.describe()
    assert "pwned" not in res.stdout.replace('"pwned"', ""), res.describe()


def test_run_refuses_a_leading_genv_and_missing_programs(tmp_path):
    """A command starting with -genv set variables of the whole job (the docs say they come from
    the file only); now it is a program name, which does not exist: nothing starts."""
    _skip_without_mpiexec()
    marker = tmp_path / "started"
    touch = ["python", "-c", f"open({str(marker)!r}, 'w').close()"]
    path = write(
        tmp_path,
        {
            "transport": "memory",
            "tasks": [
                {"name": "ok", "command": touch, "ranks": 1},
                {
                    "name": "sneaky",
                    "command": ["-genv", "LAMINA_TRANSPORT", "file", *touch],
                    "ranks": 1,
                },
            ],
        },
    )
    res = lamina_run(path)
    assert res.returncode == 2, res.describe()
    assert res.stderr.strip() == (
        f"lamina run: error: {path}: task 'sneaky' (tasks[1]): command: "
        "program '-genv' is not found on PATH"
    ), res.describe()
    assert not marker.exists()  # nothing started, not even the other task


def test_check_programs(tmp_path):
    (tmp_path / "sub").mkdir()
    script = tmp_path / "sub" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    data = tmp_path / "sub" / "data.txt"
    data.write_text("x")
    path = write(
        tmp_path,
        {
            "tasks": [
                {"name": "py", "command": "python -c pass", "ranks": 1},
                {"name": "rel", "command": "./run.sh", "ranks": 1, "cwd": "sub"},
                {"name": "path", "command": "sh -c true", "ranks": 1},
                {"name": "gone", "command": "./missing.sh", "ranks": 1},
                {"name": "plain", "command": "./data.txt", "ranks": 1, "cwd": "sub"},
                {"name": "nowhere", "command": "no-such-program-here", "ranks": 1},
                {"name": "ownpath", "command": "run.sh x", "ranks": 1, "env": {"PATH": "sub"}},
            ]
        },
    )
    wf = wr.load(path)
    env = launcher.environment(wf)
    errors = {e.task: e for e in launcher.check_programs(wf, env)}
    assert sorted(errors) == ["'gone' (tasks[3])", "'nowhere' (tasks[5])", "'plain' (tasks[4])"]
    assert (
        errors["'gone' (tasks[3])"].reason == f"program './missing.sh' is not found in {tmp_path}"
    )
    assert errors["'plain' (tasks[4])"].reason == "program './data.txt' is not an executable file"
    assert (
        errors["'nowhere' (tasks[5])"].reason
        == "program 'no-such-program-here' is not found on PATH"
    )
    assert all(e.field == "command" and e.path == path for e in errors.values())
    # a relative PATH entry of the task's own env is relative to its directory (as for execvpe)
    assert launcher.find_program("run.sh", str(tmp_path), "sub") == str(script)
    assert launcher.find_program("run.sh", str(tmp_path), "/nonexistent") is None


@pytest.mark.parametrize(
    "words, script",
    [
        ("python ana.py x", "ana.py"),
        ("python3 -u -O -X dev -W error ana.py", "ana.py"),
        ("python -Xdev -uB -- ana.py", "ana.py"),
        ("python -m mpi4py ana.py --steps 3", "ana.py"),
        ("python -um mpi4py -rc threads=0 sub/ana.py", "sub/ana.py"),
        ("python -mmpi4py --rc=threads=0 ana.py", "ana.py"),
        ("/usr/bin/python3.12 ana.py", "ana.py"),
        ("./venv/bin/python ana.py", "ana.py"),
        ("python -m other ana.py", None),
        ("python -c pass ana.py", None),
        ("python -uc pass", None),
        ("python -m mpi4py -m mod", None),
        ("python -m mpi4py -c pass", None),
        ("python -m mpi4py", None),
        ("python - ana.py", None),
        ("python --version", None),
        ("python", None),
        ("prog ana.py", None),
        ("pythonic ana.py", None),
    ],
)
def test_python_script(words, script):
    assert launcher.python_script(shlex.split(words)) == script


def test_missing_python_script_is_refused(tmp_path, capsys):
    """A misspelled script passed the check (it looked at 'python' only): its task died before
    MPI_Init and the others waited there until --timeout, or for ever.  It is refused before
    anything starts, with status 2, and --dry-run warns of it."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ana.py").write_text("pass\n")
    (tmp_path / "sim.py").write_text("pass\n")
    path = write(
        tmp_path,
        {
            "tasks": [
                {"name": "sim", "command": "python -m mpi4py sim.py", "ranks": 1},
                {"name": "ana", "command": "python -m mpi4py ana.py", "ranks": 1},
                {"name": "plain", "command": ["python3", "-u", "gone.py"], "ranks": 1},
                {"name": "abs", "command": "python /nonexistent/x.py", "ranks": 1},
                {"name": "here", "command": "python ana.py", "ranks": 1, "cwd": "sub"},
                {"name": "code", "command": "python -c pass", "ranks": 1},
            ]
        },
    )
    wf = wr.load(path)
    errors = {e.task: e.reason for e in launcher.check_programs(wf, launcher.environment(wf))}
    assert errors == {
        "'ana' (tasks[1])": f"script 'ana.py' is not found in {tmp_path}",
        "'plain' (tasks[2])": f"script 'gone.py' is not found in {tmp_path}",
        "'abs' (tasks[3])": "script '/nonexistent/x.py' is not found",
    }
    assert cli.main(["run", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        f"#   warning: script 'ana.py' is not found in {tmp_path}: the launch would stop here"
    ) in out.splitlines()
    # the launch: nothing starts, status 2, the task and the file named
    _skip_without_mpiexec()
    path = write(
        tmp_path,
        {
            "tasks": [
                {"name": "sim", "command": "python -m mpi4py sim.py", "ranks": 1},
                {"name": "ana", "command": "python -m mpi4py ana.py", "ranks": 1},
            ]
        },
        "launch.yaml",
    )
    res = lamina_run(path, "--timeout", "30")
    assert res.returncode == 2, res.describe()
    assert res.stderr.strip() == (
        f"lamina run: error: {path}: task 'ana' (tasks[1]): command: "
        f"script 'ana.py' is not found in {tmp_path}"
    ), res.describe()


def _trampoline(env: dict, *args: str) -> mu.Result:
    cmd = [*launcher.TRAMPOLINE, *args]
    return mu.finish(mu.start(cmd, env=env), cmd, 60)


def test_trampoline_runs_the_task(tmp_path):
    """exec.py: the task's directory and variables, its command in place of itself."""
    (tmp_path / "d").mkdir()
    spec = exec_mod.encode(
        "t",
        ["sh", "-c", 'echo "$OWN|$(pwd)|$0|$1"', "a : b", "-genv"],
        str(tmp_path / "d"),
        {"OWN": "x y"},
    )
    res = _trampoline({"LAMINA_RUN_TASK_3": spec, "LAMINA_RUN_TASK_4": "stale"}, "3")
    assert res.returncode == 0, res.describe()
    assert res.stdout.strip() == f"x y|{tmp_path / 'd'}|a : b|-genv"
    # its own variables are not passed on
    spec = exec_mod.encode(
        "t", ["sh", "-c", "env | grep -c LAMINA_RUN_TASK_ || true"], str(tmp_path), {}
    )
    res = _trampoline({"LAMINA_RUN_TASK_0": spec, "LAMINA_RUN_TASK_1": "x"}, "0")
    assert res.stdout.strip() == "0", res.describe()
    # the exit status is the command's own
    spec = exec_mod.encode("t", ["sh", "-c", "exit 5"], str(tmp_path), {})
    assert _trampoline({"LAMINA_RUN_TASK_0": spec}, "0").returncode == 5


@pytest.mark.parametrize(
    "env, args, status, words",
    [
        ({}, ["0"], 127, "LAMINA_RUN_TASK_0 is not set"),
        ({"LAMINA_RUN_TASK_0": "[" * 5000}, ["0"], 127, "not JSON"),
        ({"LAMINA_RUN_TASK_0": '{"name": "t"}'}, ["0"], 127, "name, argv, cwd and env"),
        ({}, ["x"], 2, "usage"),
        ({}, [], 2, "usage"),
        (
            {"LAMINA_RUN_TASK_0": exec_mod.encode("t", ["./nope"], "/", {})},
            ["0"],
            127,
            "task 't': cannot run './nope' in /: No such file or directory",
        ),
    ],
)
def test_trampoline_failures(env, args, status, words):
    res = _trampoline(env, *args)
    assert res.returncode == status and words in res.stderr, res.describe()


# ----------------------------------------------------------------- dry run and the launch line


def test_dry_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LAMINA_WORKFLOW", "stale=0>1")
    path = write(
        tmp_path,
        """
transport: both
timeout: 60
env: {OMP_NUM_THREADS: 1}
tasks:
  - name: sim
    command: python sim.py --steps 10
    ranks: 6
    writes: [sim.lam, log.lam]
    shallow: ["/particles/*"]
  - name: analysis
    command: [./ana, "two words"]
    ranks: 2
    env: {A: "x y"}
    reads: [{name: sim.lam, flow: latest}]
""",
    )
    assert cli.main(["run", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"cd {tmp_path}" in out
    assert "export LAMINA_TRANSPORT=both" in out and "export LAMINA_TRANSPORT_TIMEOUT=60" in out
    assert "export LAMINA_WORKFLOW='sim.lam=0>1:latest | shallow=particles/*'" in out
    assert "export OMP_NUM_THREADS=1" in out
    assert "log.lam: written by sim, read by no task: stays a file" in out
    # each task's command, quoted, in a comment a person reads ...
    assert f"# task 0 sim: cd {tmp_path} && {sys.executable} sim.py --steps 10" in out
    assert f"# task 1 analysis: cd {tmp_path} && env 'A=x y' ./ana 'two words'" in out
    assert "#   warning: program './ana' is not found in" in out  # nothing named ana there
    # ... and in the variable the launch reads
    py = shlex.join(launcher.TRAMPOLINE)
    assert "\nexport LAMINA_RUN_TASK_1='{" in out and '"argv":["./ana","two words"]' in out
    assert f"-n 6 {py} 0 \\\n  : -n 2 {py} 1" in out
    assert cli.main(["run", path, "--dry-run", "--transport", "file"]) == 0
    assert "export LAMINA_TRANSPORT=file" in capsys.readouterr().out


def test_dry_run_script_runs(tmp_path):
    """The script --dry-run prints is the launch: run by sh, it gives the job's output."""
    _skip_without_mpiexec()
    (tmp_path / "sub").mkdir()
    path = write(
        tmp_path,
        {
            "env": {"SHARED": "all tasks"},
            "tasks": [
                {
                    "name": "a",
                    "command": ["python", "-c", PRINT_ARGS, "one :", ":", "-genv", "x y"],
                    "ranks": 2,
                },
                {
                    "name": "b",
                    "command": ["python", "-c", PRINT_ARGS, "it's"],
                    "ranks": 1,
                    "cwd": "sub",
                    "env": {"OWN": "b's"},
                },
            ],
        },
    )
    res = lamina_run(path, "--dry-run")
    assert res.returncode == 0, res.describe()
    proc = mu.start(["sh", "-c", res.stdout])
    out = mu.finish(proc, ["sh"], TIMEOUT)
    assert out.returncode == 0, out.describe()
    got = sorted(json.loads(line) for line in out.lines("ARGS "))
    assert got == sorted(
        [
            [["one :", ":", "-genv", "x y"], str(tmp_path), "all tasks", None],
            [["one :", ":", "-genv", "x y"], str(tmp_path), "all tasks", None],
            [["it's"], str(tmp_path / "sub"), "all tasks", "b's"],
        ]
    ), out.describe()


def test_command_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMINA_TRANSPORT", "both")  # used when the file says nothing
    monkeypatch.setenv("PMI_RANK", "3")  # an outer launcher's: not passed on
    (tmp_path / "sub").mkdir()
    path = write(
        tmp_path,
        {
            "tasks": [
                {
                    "name": "a",
                    "command": "python3 a.py 'x y'",
                    "ranks": 3,
                    "writes": ["a.lam"],
                    "queue_limit": 4,
                },
                {
                    "name": "b",
                    "command": ["prog", 7, 2.5],
                    "ranks": 1,
                    "cwd": "sub",
                    "reads": ["a.lam"],
                    "env": {"K": 2},
                },
            ]
        },
    )
    wf = wr.load(path)
    # only lamina's words on mpiexec's line: each section runs the trampoline with the task's index
    py = list(launcher.TRAMPOLINE)
    assert py[:2] == [sys.executable, "-I"] and py[2].endswith(os.path.join("workflow", "exec.py"))
    assert launcher.command(wf, "MPIEXEC") == [
        "MPIEXEC",
        "-n",
        "3",
        *py,
        "0",
        ":",
        "-n",
        "1",
        *py,
        "1",
    ]
    assert launcher.command(wf, "M", oversubscribe=True)[:2] == ["M", "--oversubscribe"]
    env = launcher.environment(wf)
    # the trampoline's instructions: the command (python replaced), its directory, its own env
    assert exec_mod.decode(env["LAMINA_RUN_TASK_0"]) == (
        "a",
        [sys.executable, "a.py", "x y"],
        str(tmp_path),
        {},
    )
    assert exec_mod.decode(env["LAMINA_RUN_TASK_1"]) == (
        "b",
        ["prog", "7", "2.5"],
        str(tmp_path / "sub"),
        {"K": "2"},
    )
    assert (
        env["LAMINA_TRANSPORT"] == "both" and env["LAMINA_WORKFLOW"] == "a.lam=0>1 | queue_limit=4"
    )
    assert "PMI_RANK" not in env and "LAMINA_TRANSPORT_TIMEOUT" not in wf.variables()
    assert launcher.environment(wf, "file")["LAMINA_TRANSPORT"] == "file"
    assert wf.ranks == 4 and wf.directory == str(tmp_path)


def test_a_bad_transport_variable_is_named(tmp_path, monkeypatch, capsys):
    """A bad $LAMINA_TRANSPORT, used when the file gives no transport, was reported as an error
    of the workflow file: the variable is named, and a transport of the file or --transport wins
    over it."""
    monkeypatch.setenv("LAMINA_TRANSPORT", "shm")
    path = write(tmp_path, GOOD)
    wf = wr.load(path)
    with pytest.raises(LaminaError) as info:
        wf.transport_for()
    assert str(info.value) == (
        "$LAMINA_TRANSPORT must be one of ['file', 'memory', 'both'], got 'shm' "
        "(the workflow file gives no transport: it comes from the environment)"
    )
    assert not isinstance(info.value, wr.WorkflowFileError)
    assert cli.main(["run", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lamina run: error: $LAMINA_TRANSPORT must be one of") and path not in err
    assert wf.transport_for("file") == "file"
    assert wr.load(write(tmp_path, {**GOOD, "transport": "both"})).transport_for() == "both"


def test_nothing_exchanged_means_files(tmp_path, monkeypatch):
    """A workflow where no task reads what another writes transports nothing: every name stays a file."""
    monkeypatch.setenv("LAMINA_WORKFLOW", "x=0>1")
    path = write(
        tmp_path,
        {
            "transport": "memory",
            "tasks": [{"command": "a", "ranks": 1, "writes": ["x"]}, {"command": "b", "ranks": 1}],
        },
    )
    wf = wr.load(path)
    assert wf.workflow() is None
    env = launcher.environment(wf)
    assert env["LAMINA_TRANSPORT"] == "file" and "LAMINA_WORKFLOW" not in env


# ----------------------------------------------------------------- LAMINA_WORKFLOW options


def test_workflow_text_options_and_round_trip():
    wf = wfmod.Workflow.parse(
        "sim.lam=0>1:latest,2:10 | queue_limit=3 | shallow=/particles, grid/*; ana.lam=1>2"
    )
    assert wf.route("run/sim.lam") == wfmod.Route(0, (1, 2))
    assert wfmod.options_for("run/sim.lam", "w", 0, wf) == {
        "queue_limit": 3,
        "shallow": ("particles", "grid/*"),
    }
    assert wfmod.options_for("sim.lam", "r", 1, wf) == {}  # consumers get none
    assert wfmod.options_for("sim.lam", "w", 1, wf) == {}  # not its producer (route_for refuses it)
    assert wfmod.options_for("ana.lam", "w", 1, wf) == {}
    assert (
        wfmod.options_for("other", "w", 0, wf) == {}
        and wfmod.options_for("sim.lam", "w", 0, None) == {}
    )
    text = wf.text()
    assert text == "sim.lam=0>1:latest,2:10 | queue_limit=3 | shallow=particles,grid/*; ana.lam=1>2"
    again = wfmod.Workflow.parse(text)
    assert again.text() == text and again.flows == wf.flows and again.options == wf.options
    # the syntax without options is unchanged
    assert wfmod.Workflow.parse("a=0>1,2; b=1>2").options == [{}, {}]
    for bad, what in [
        ("a=0>1 | queue_limit=1", "queue_limit"),
        ("a=0>1 | queue_limit=x", "queue_limit"),
        ("a=0>1 | depth=2", "not one of"),
        ("a=0>1 | shallow=", "shallow"),
        ("a=0>1 | shallow=a,,b", "shallow"),
    ]:
        with pytest.raises(ValueError, match=what):
            wfmod.Workflow.parse(bad)


# ----------------------------------------------------------------- checks of the file


GOOD = {
    "tasks": [
        {"name": "sim", "command": "python sim.py", "ranks": 2, "writes": ["sim.lam"]},
        {"name": "ana", "command": "python ana.py", "ranks": 1, "reads": ["sim.lam"]},
    ]
}


def _with(change) -> dict:
    data = json.loads(json.dumps(GOOD))
    change(data)
    return data


def _set(*keys_value):
    *keys, value = keys_value

    def change(d):
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return change


def _del(*keys):
    def change(d):
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]

    return change


BAD = [
    # (change, task named in the message or None, field, words of the message)
    (_set("tsks", []), None, "tsks", "unknown key"),
    (_set("tasks", 0, "rank", 2), "'sim' (tasks[0])", "rank", "Did you mean 'ranks'"),
    (
        _set("tasks", 1, "reads", 0, {"name": "sim.lam", "flo": 2}),
        "'ana' (tasks[1])",
        "reads[0].flo",
        "unknown key",
    ),
    (_del("tasks", 0, "command"), "'sim' (tasks[0])", "command", "missing"),
    (_del("tasks", 1, "ranks"), "'ana' (tasks[1])", "ranks", "missing"),
    (_set("tasks", 0, "ranks", 0), "'sim' (tasks[0])", "ranks", "from 1 to"),
    (_set("tasks", 0, "ranks", True), "'sim' (tasks[0])", "ranks", "integer"),
    (_set("tasks", 0, "ranks", "2"), "'sim' (tasks[0])", "ranks", "integer"),
    (_set("tasks", 0, "command", ""), "'sim' (tasks[0])", "command", "empty"),
    (_set("tasks", 0, "command", "python 'unclosed"), "'sim' (tasks[0])", "command", "shell"),
    (_set("tasks", 0, "command", {"a": 1}), "'sim' (tasks[0])", "command", "string or a list"),
    (_set("transport", "disk"), None, "transport", "file, memory, both"),
    (_set("timeout", 0), None, "timeout", "> 0"),
    (_set("timeout", "soon"), None, "timeout", "> 0"),
    (
        _set("tasks", 1, "reads", ["other.lam"]),
        "'ana' (tasks[1])",
        "reads[0]",
        "no task writes 'other.lam'",
    ),
    (
        _set("tasks", 1, "reads", ["sim.lm"]),
        "'ana' (tasks[1])",
        "reads[0]",
        "Did you mean 'sim.lam'",
    ),
    (
        _set("tasks", 1, "writes", ["sim.lam"]),
        "'ana' (tasks[1])",
        "writes",
        "written by tasks 'sim' and 'ana'",
    ),
    (_set("tasks", 1, "writes", ["*.lam"]), "'ana' (tasks[1])", "writes", "can match both"),
    # one name spelled with a directory: routing matches the last component, 'sim.lam' first
    (_set("tasks", 1, "writes", ["run/sim.lam"]), "'ana' (tasks[1])", "writes", "can match both"),
    (
        _set("tasks", 0, "reads", ["sim.lam"]),
        "'sim' (tasks[0])",
        "reads[0]",
        "which it writes itself",
    ),
    (
        _set("tasks", 1, "reads", [{"name": "sim.lam", "flow": "sometimes"}]),
        "'ana' (tasks[1])",
        "reads[0].flow",
        "latest",
    ),
    (
        _set("tasks", 1, "reads", [{"name": "sim.lam", "flow": 0}]),
        "'ana' (tasks[1])",
        "reads[0].flow",
        "positive",
    ),
    (_set("tasks", 0, "queue_limit", 1), "'sim' (tasks[0])", "queue_limit", ">= 2"),
    (
        _set("tasks", 0, "writes", [{"name": "sim.lam", "queue_limit": 1.5}]),
        "'sim' (tasks[0])",
        "writes[0].queue_limit",
        ">= 2",
    ),
    (
        _set("tasks", 1, "queue_limit", 3),
        "'ana' (tasks[1])",
        "queue_limit",
        "names this task writes",
    ),
    (_set("tasks", 0, "shallow", [""]), "'sim' (tasks[0])", "shallow", "glob"),
    (_set("tasks", 0, "shallow", ["a,b"]), "'sim' (tasks[0])", "shallow", "separator"),
    (_set("tasks", 0, "writes", ["a;b"]), "'sim' (tasks[0])", "writes[0]", "separator"),
    (
        _set("tasks", 0, "writes", ["sim.lam", "sim.lam"]),
        "'sim' (tasks[0])",
        "writes",
        "listed twice",
    ),
    (_set("tasks", 1, "name", "sim"), "'sim' (tasks[1])", "name", "must differ"),
    (_set("tasks", 0, "cwd", "nowhere"), "'sim' (tasks[0])", "cwd", "not a directory"),
    (_set("env", {"LAMINA_TRANSPORT": "file"}), None, "env.LAMINA_TRANSPORT", "field 'transport'"),
    (
        _set("tasks", 0, "env", {"LAMINA_WORKFLOW": "x"}),
        "'sim' (tasks[0])",
        "env.LAMINA_WORKFLOW",
        "set by lamina run",
    ),
    (_set("env", {"A": True}), None, "env.A", "string or a number"),
    # a task's own transport timeout, which the task read only at its first open
    *[
        (
            _set("tasks", 1, "env", {"LAMINA_TRANSPORT_TIMEOUT": bad}),
            "'ana' (tasks[1])",
            "env.LAMINA_TRANSPORT_TIMEOUT",
            f"must be a number of seconds > 0, got {shown}",
        )
        for bad, shown in (("ten", "'ten'"), (0, "'0'"), ("-1", "'-1'"), ("nan", "'nan'"))
    ],
    (_set("env", {"1A": "x"}), None, "env", "variable name"),
    (_set("tasks", []), None, "tasks", "non-empty list"),
    (_set("tasks", 0, "oops"), "tasks[0]", None, "a task must be a mapping"),
]


@pytest.mark.parametrize(
    "change,task,fld,words", BAD, ids=[f"{i}-{b[3][:20]}" for i, b in enumerate(BAD)]
)
def test_bad_files(tmp_path, change, task, fld, words):
    path = write(tmp_path, _with(change))
    with pytest.raises(wr.WorkflowFileError) as info:
        wr.load(path)
    e = info.value
    msg = str(e)
    assert isinstance(e, ValueError) and msg.startswith(path), msg
    assert (e.task, e.field) == (task, fld), msg
    assert words in msg, msg


def test_a_tasks_own_transport_timeout(tmp_path):
    """What a task takes as $LAMINA_TRANSPORT_TIMEOUT passes: seconds > 0, infinity, empty."""
    for value, want in ((10, "10"), ("2.5", "2.5"), ("inf", "inf"), ("", "")):
        path = write(tmp_path, _with(_set("tasks", 1, "env", {"LAMINA_TRANSPORT_TIMEOUT": value})))
        assert wr.load(path).tasks[1].env == {"LAMINA_TRANSPORT_TIMEOUT": want}


def test_a_workflow_file_takes_the_transport_timeout_a_task_reads(tmp_path, monkeypatch):
    """lamina run checks a task's $LAMINA_TRANSPORT_TIMEOUT with the parser the task reads
    it with (lamina.text.parse_seconds, under lamina.comm.env_seconds): a value passes
    the one exactly where it passes the other, and both name the limit."""
    from lamina import comm as comm_mod
    from lamina.text import parse_seconds

    values = ("10", "2.5", "inf", "", " 3 ", "1e-3", "1_0", "ten", "0", "-1", "nan", "-inf", "0x10")
    for value in values:
        monkeypatch.setenv("LAMINA_TRANSPORT_TIMEOUT", value)
        try:
            comm_mod.transport_patience()
            task = None
        except ValueError as e:
            task = str(e)
            assert (
                task == f"$LAMINA_TRANSPORT_TIMEOUT must be a number of seconds > 0, got {value!r}"
            )
        if value:
            with pytest.raises(ValueError) if task else contextlib.nullcontext():
                parse_seconds(value)
        path = write(tmp_path, _with(_set("tasks", 1, "env", {"LAMINA_TRANSPORT_TIMEOUT": value})))
        if task is None:
            assert wr.load(path).tasks[1].env == {"LAMINA_TRANSPORT_TIMEOUT": value}, value
        else:
            with pytest.raises(wr.WorkflowFileError, match="must be a number of seconds > 0"):
                wr.load(path)


def test_total_ranks_limit(tmp_path):
    path = write(tmp_path, GOOD)
    assert wr.load(path, max_ranks=3).ranks == 3
    with pytest.raises(
        wr.WorkflowFileError, match="3 ranks in all, more than the limit of 2"
    ) as info:
        wr.load(path, max_ranks=2)
    assert info.value.field == "tasks"
    with pytest.raises(wr.WorkflowFileError, match="from 1 to 1"):
        wr.load(path, max_ranks=1)
    # a task's own ranks past --max-ranks: the limit says where it comes from
    with pytest.raises(wr.WorkflowFileError) as info:
        wr.load(path, max_ranks=1)
    assert info.value.reason == "must be an integer from 1 to 1 (--max-ranks), got 2"
    assert info.value.field == "ranks"


def test_unreadable_files(tmp_path, capsys):
    with pytest.raises(wr.WorkflowFileError, match="cannot read"):
        wr.load(tmp_path / "missing.yaml")
    for text, words in [
        ("tasks: [\n", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("", "must be a mapping"),
        ("tasks:\n  - command: a\n    ranks: 1\n    ranks: 2\n", "duplicate key 'ranks' at line 4"),
        ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),  # safe_load only
    ]:
        path = write(tmp_path, text)
        with pytest.raises(wr.WorkflowFileError, match=words):
            wr.load(path)
    # the command line: one line on stderr, status 2
    assert cli.main(["run", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lamina run: error: ") and err.count("\n") == 1
    assert cli.main(["run", path, "--timeout", "0"]) == 2


# ----------------------------------------------------------------- hostile YAML

#: nested aliases: 9 lols, 9 of those, ... 9^9 (387 million) values in one task's command
LAUGHS = (
    "tasks:\n- name: lol\n  ranks: 1\n  command:\n  - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(
        f"  - &{x} [{', '.join(['*' + p] * 9)}]\n"
        for p, x in zip("abcdefg", "bcdefgh", strict=True)
    )
    + "  - [*h, *h, *h, *h, *h, *h, *h, *h, *h]\n"
)


@pytest.mark.timeout(60)
def test_hostile_values_are_refused_in_one_line(tmp_path, capsys):
    """A string referred to 20,000 times (20 GB once expanded, from a file under 1 MiB), an
    integer of 5,000 digits, a timeout of 400, NUL and lone surrogates, a task name with a new
    line (which ended a comment of the dry-run script and ran the rest in the shell): a
    one-line error and status 2, each, before anything is expanded or run."""
    big = "x" * (1_000_000 - 6 * 20_000 - 200)
    cases = [
        (
            "tasks:\n - command: [echo, &s " + big + ", *s" * 20_000 + "]\n   ranks: 1\n",
            "bytes of text once its aliases are expanded",
        ),
        ("tasks:\n - {command: [echo], ranks: " + "1" * 5000 + "}\n", "digits"),
        (
            "timeout: " + "1" * 400 + "\ntasks:\n - {command: [echo, hi], ranks: 1}\n",
            "at most 31536000",
        ),
        ('tasks:\n - {command: [echo, "a\\0b"], ranks: 1}\n', "NUL character"),
        ('env: {A: "a\\0b"}\ntasks:\n - {command: [echo, hi], ranks: 1}\n', "NUL character"),
        ('tasks:\n - {command: [echo, "\\ud800"], ranks: 1}\n', "UTF-8 cannot encode"),
        (
            'tasks:\n - {name: "x\\ntouch pwned #", command: [echo, hi], ranks: 1}\n',
            "no control character",
        ),
    ]
    for text, words in cases:
        path = write(tmp_path, text)
        t0 = time.monotonic()
        assert cli.main(["run", path, "--dry-run"]) == 2, words
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
        assert time.monotonic() - t0 < 10
    assert not (tmp_path / "pwned").exists()
    path = write(tmp_path, "tasks:\n - {command: [echo, hi], ranks: 1}\n")
    assert cli.main(["run", path, "--max-ranks", "0"]) == 2
    assert "--max-ranks must be from 1 to 2,147,483,647" in capsys.readouterr().err
    # a task of 2^32 + 1 ranks under such a limit: mpiexec would have run 1 rank, exit 0
    path = write(tmp_path, "tasks:\n - {command: [echo, hi], ranks: 4294967297}\n")
    assert cli.main(["run", path, "--max-ranks", "99999999999"]) == 2
    assert "got 99999999999" in capsys.readouterr().err
    wf = wr.load(path, max_ranks=2**40)  # the same through the Python API: the launch refuses
    with pytest.raises(ValueError, match="4294967297 ranks is more than MPI can number"):
        launcher.command(wf, "mpiexec")


def test_dry_run_comments_stay_comments(tmp_path, capsys):
    """A command word with a new line (the run takes it as one argument) is written in the
    dry-run script's comments as its escape: the script still parses and runs only mpiexec's
    line's equivalent."""
    path = write(tmp_path, 'tasks:\n - {name: t, command: [echo, "a\\nb"], ranks: 1}\n')
    assert cli.main(["run", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    comments = [x for x in out.splitlines() if x.startswith("#") and "echo" in x]
    assert comments and all("\\n" in x for x in comments), out


@pytest.mark.timeout(60)
def test_billion_laughs_is_refused(tmp_path, capsys):
    """Nested aliases: 400 bytes that stand for 10^9 values (the error message printed the
    command: it never finished)."""
    path = write(tmp_path, LAUGHS)
    assert len(LAUGHS) < 600
    t0 = time.monotonic()
    with pytest.raises(wr.WorkflowFileError, match="more than 100000 values once its aliases"):
        wr.load(path)
    assert time.monotonic() - t0 < 5
    assert cli.main(["run", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lamina run: error: ") and err.count("\n") == 1 and len(err) < 300


@pytest.mark.parametrize(
    "text, words",
    [
        ("tasks: " + "[" * 1000 + "]" * 1000, "nested more than 32 levels"),  # RecursionError
        ("tasks:\n" + "".join("  " * i + "- \n" for i in range(1, 60)), "nested more than 32"),
        ("a: &x [b, *x]\ntasks: []\n", "refers to a node that contains it"),
        # an alias that expands deep: each level is shallow, the whole is not
        (
            "a: &a [[[[[[[[[[x]]]]]]]]]]\nb: &b [[[[[[[[[[*a]]]]]]]]]]\n"
            "c: &c [[[[[[[[[[*b]]]]]]]]]]\ntasks: [[[[[*c]]]]]\n",
            r"nested more than 32 levels deep \(line 4\), aliases expanded",
        ),
    ],
)
def test_deep_yaml_is_refused(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(wr.WorkflowFileError, match=words) as info:
        wr.load(path)
    assert "\n" not in str(info.value)


def test_aliases_within_bounds_still_work(tmp_path):
    path = write(
        tmp_path,
        """
common: &env {OMP_NUM_THREADS: 1}
tasks:
  - {name: a, command: [prog, x], ranks: 1, env: *env, writes: [f]}
  - {name: b, command: [prog, y], ranks: 1, env: *env, reads: [f]}
""".replace("common: &env", "env: &env"),
    )
    wf = wr.load(path)
    assert wf.env == {"OMP_NUM_THREADS": "1"} and wf.tasks[1].env == {"OMP_NUM_THREADS": "1"}


def test_command_words_and_env_values_are_taken_as_written(tmp_path):
    """YAML 1.1 read an unquoted 1.10 as 1.1, 010 as 8, 1:30 as 90 and 0755 as 493: a list
    command's arguments and env's values changed silently.  They are taken as written (a
    task's env merging the top one too); the fields that are numbers stay numbers, and
    yes/no still need quotes."""
    path = write(
        tmp_path,
        """
env: &common {VERSION: 1.10, MASK: 0755, WALL: 1:30:00, ID: 010, N: 7, Q: "1.10"}
timeout: 1.5
tasks:
  - name: a
    command: [prog, --version, 1.10, --id, 010, --wall, 1:30, 0x1F, 1e3, .inf, 2024-01-01]
    ranks: 0x2
    env: {<<: *common, E: 1_000}
""",
    )
    wf = wr.load(path)
    written = {"VERSION": "1.10", "MASK": "0755", "WALL": "1:30:00", "ID": "010", "N": "7"}
    assert wf.env == {**written, "Q": "1.10"}
    [task] = wf.tasks
    assert task.command == tuple(
        "prog --version 1.10 --id 010 --wall 1:30 0x1F 1e3 .inf 2024-01-01".split()
    )
    assert task.env == {**written, "Q": "1.10", "E": "1_000"}
    assert (task.ranks, wf.timeout) == (2, 1.5)  # numbers where numbers are meant
    for bad in ("command: [prog, yes]", "command: [prog], env: {A: no}"):
        path = write(tmp_path, "tasks:\n - {ranks: 1, " + bad + "}\n")
        with pytest.raises(wr.WorkflowFileError, match="string"):
            wr.load(path)


def test_huge_values_are_shown_short(tmp_path):
    """A value in an error message is shown in one short line, however large it is."""
    path = write(tmp_path, {"tasks": [{"command": {"k": list(range(50_000))}, "ranks": 1}]})
    with pytest.raises(wr.WorkflowFileError, match="string or a list of strings") as info:
        wr.load(path)
    assert len(str(info.value)) < 300


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_workflow_file_that_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "wf.yaml"
    os.mkfifo(fifo)
    with pytest.raises(wr.WorkflowFileError, match="not a regular file"):
        wr.load(fifo)  # opening a FIFO for reading blocked until a writer came
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * wr.MAX_FILE_BYTES + "\n")
    with pytest.raises(wr.WorkflowFileError, match="more than 1048576 bytes"):
        wr.load(big)
    if os.path.exists("/dev/zero"):
        with pytest.raises(wr.WorkflowFileError, match="not a regular file"):
            wr.load("/dev/zero")


def test_help_lists_run(capsys):
    assert cli.main(["--help"]) == 0
    assert "run" in capsys.readouterr().out
    assert cli.main(["run", "--help"]) == 0
    assert "--dry-run" in capsys.readouterr().out


# ----------------------------------------------------------------- the launcher and its job

LINUX = sys.platform.startswith("linux")

#: a rank that prints its pid and waits (no MPI: nothing of it outlives the test but the process;
#: one write: ranks share the job's output, unbuffered)
SLEEPER = "import os, sys, time; sys.stdout.write(f'PID {os.getpid()}\\n'); time.sleep(120)"


def _gone(pid: int) -> bool:
    return mu._is_zombie(pid)  # True also when there is no such process


def _wait_gone(pids, seconds: float) -> list[int]:
    """Wait up to *seconds* for every one of *pids* to end; the ones still running."""
    deadline = time.monotonic() + seconds
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if not _gone(p)]
        if left:
            time.sleep(0.1)
    return left


def _describe(pid: int) -> str:
    """A process, for a failure message: its state, its kernel wait channel, its command."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError as e:
        return f"{pid}: {e}"
    return f"{pid} {state} {wchan} threads={threads}: {cmd[:200]}"


class _Running:
    """``lamina run`` of a job of sleeping ranks, started and running: its pid, the job's pids."""

    def __init__(self, tmp_path, ranks: int = 2):
        _skip_without_mpiexec()
        path = write(
            tmp_path,
            {"tasks": [{"name": "sleepy", "command": ["python", "-c", SLEEPER], "ranks": ranks}]},
        )
        self.proc = mu.start([sys.executable, "-m", "lamina.cli", "run", path])
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ranks_seen = []
        deadline = time.monotonic() + 60
        while len(ranks_seen) < ranks and time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith("PID "):
                ranks_seen.append(int(line.split()[1]))
        self.ranks = ranks_seen
        self.job = launch.descendants(self.proc.pid)  # mpiexec, its proxy, the ranks
        if len(ranks_seen) < ranks:
            tree = "\n".join(_describe(p) for p in [self.proc.pid, *self.job])
            self.close()
            pytest.fail(f"the job did not start ({ranks_seen}):\n{tree}\n{self.proc.stderr.read()}")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def close(self):
        """Kill whatever is left (by pid), so that a failing test leaves nothing running."""
        for p in [self.proc.pid, *self.job, *self.ranks]:
            if not _gone(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.wait(timeout=30)


@pytest.mark.skipif(
    not LINUX, reason="the job follows its launcher through Linux's PR_SET_PDEATHSIG"
)
def test_job_dies_with_the_launcher(tmp_path):
    """lamina run killed with SIGKILL (no chance to clean up) left mpiexec and every rank running,
    re-parented to init; now mpiexec gets SIGKILL when lamina run dies and takes its ranks down."""
    run = _Running(tmp_path)
    try:
        assert len(run.job) > len(run.ranks), run.job  # mpiexec, hydra's proxy, the ranks
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait(timeout=30)
        left = _wait_gone(run.job, 15)
        assert not left, f"still running after lamina run was killed: {left}"
    finally:
        run.close()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_launcher_is_not_an_mpi_process_and_sighup_ends_the_job(tmp_path):
    """Importing lamina initialized MPI in lamina run itself: it held a shared-memory segment,
    and UCX (loaded with libmpi) caught SIGHUP, so lamina run and its job outlived a closed
    terminal.  Now the launcher runs without MPI, and SIGHUP kills the job (status 129)."""
    started = time.time()
    run = _Running(tmp_path)
    try:
        pid = run.proc.pid
        with open(f"/proc/{pid}/maps") as f:
            libs = [ln.split()[-1] for ln in f if "libmpi" in ln or "mpich_shm" in ln]
        assert not libs, libs
        # (a segment of that name made before the launch is another process's, of a pid since
        # reused, that was never removed)
        seg = f"/dev/shm/mpich_shm_{pid:x}_0"
        try:
            made = os.stat(seg).st_ctime
        except FileNotFoundError:
            made = None
        assert made is None or made < started - 1, seg
        os.kill(pid, signal.SIGHUP)
        try:
            rc = run.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("lamina run survived SIGHUP")
        assert rc == 128 + signal.SIGHUP, rc
        assert not _wait_gone(run.job, 15)
        assert "lamina run: hangup: job killed" in run.proc.stderr.read()
    finally:
        run.close()


def test_only_the_program_replaces_itself():
    """lamina run leaves MPI by replacing its process; a program calling main() (this test) is
    never replaced."""
    assert not command_mod._is_program(["wf.yaml"])
    assert not command_mod._is_program(sys.argv[1:])


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_run_removes_the_segments_of_a_failed_job(tmp_path):
    """A job that failed by itself (MPI_Abort) left its /dev/shm/mpich_shm_* segment (MPI_Finalize
    removes it; lamina run removed segments only of jobs it killed itself)."""
    _skip_without_mpiexec()
    code = (
        "import sys; from mpi4py import MPI\n"
        "maps = [ln.split()[-1] for ln in open('/proc/self/maps') if 'mpich_shm_' in ln]\n"
        "sys.stdout.write(' '.join(['SHM', *sorted(set(maps))]) + '\\n')\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "MPI.COMM_WORLD.Abort(5) if MPI.COMM_WORLD.rank == 0 else MPI.COMM_WORLD.Barrier()\n"
    )
    path = write(
        tmp_path, {"tasks": [{"name": "aborts", "command": ["python", "-c", code], "ranks": 2}]}
    )
    res = lamina_run(path)
    segments = {s for line in res.lines("SHM") for s in line.split()}
    try:
        assert res.returncode not in (0, -9999), res.describe()
        if not segments:
            pytest.skip("MPICH made no shared-memory segment for this job")
        assert not [s for s in segments if os.path.exists(s)], res.describe()
    finally:
        launch.remove_files(segments)


def test_orphaned_segments(tmp_path):
    """Segments created since a listing and mapped by no process; the mapped and older ones stay."""
    d = str(tmp_path)

    def segment(name):
        path = os.path.join(d, launch.SHM_PREFIX + name)
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
        return path

    old = segment("old")
    before = launch.shm_listing(d)
    assert before == {old}
    mapped, left = segment("mapped"), segment("left")
    (tmp_path / "other_file").write_text("x")
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        t0 = time.monotonic()
        assert launch.orphaned_segments(before, d, grace=0.2) == {left}
        assert time.monotonic() - t0 < 5
        assert launch.orphaned_segments(before | {left}, d, grace=0.2) == set()
    assert launch.orphaned_segments(before, d, grace=0) == {left, mapped}


def test_failed_job_names_its_tasks(tmp_path):
    """A job that failed said only its status: now which world ranks ran which task of the file."""
    _skip_without_mpiexec()
    path = write(
        tmp_path,
        {
            "tasks": [
                {"name": "sim", "command": "python -c pass", "ranks": 2},
                {"name": "ana", "command": ["python", "-c", "import sys; sys.exit(3)"], "ranks": 1},
            ]
        },
    )
    res = lamina_run(path)
    assert res.returncode == 3, res.describe()
    assert (
        "lamina run: job exited with status 3; ranks 0-1: task 0 'sim' (python -c pass); "
        "ranks 2-2: task 1 'ana' (python -c 'import sys; sys.exit(3)')"
    ) in res.stderr.splitlines(), res.describe()


def test_rank_map_stays_one_short_line(tmp_path):
    path = write(
        tmp_path,
        {"tasks": [{"name": "a", "command": ["python", "-c", "x\n" + "y" * 500], "ranks": 3}]},
    )
    line = launcher.rank_map(wr.load(path))
    assert line.startswith("ranks 0-2: task 0 'a' (python -c '") and line.endswith("...)")
    assert "\n" not in line and len(line) < 120, line


FLOWS = {
    "tasks": [
        {"name": "sim", "command": "python -c pass", "ranks": 1, "writes": ["f.lam", "g.lam"]},
        {
            "name": "thin",
            "command": "python -c pass",
            "ranks": 1,
            "reads": [{"name": "f.lam", "flow": 2}, {"name": "g.lam", "flow": "all"}],
        },
    ]
}


def test_dry_run_says_flow_is_ignored_under_file(tmp_path, capsys):
    """Under --transport file the flows of the file do nothing (a file's reader gets every step):
    --dry-run said nothing of it."""
    path = write(tmp_path, FLOWS)
    note = (
        "#   note: flow is ignored under the file transport, every reader gets every step: "
        "task 'thin' reads 'f.lam' with flow 2"
    )
    assert cli.main(["run", path, "--dry-run", "--transport", "file"]) == 0
    assert note in capsys.readouterr().out.splitlines()
    for transport in ("memory", "both"):
        assert cli.main(["run", path, "--dry-run", "--transport", transport]) == 0
        assert "flow is ignored" not in capsys.readouterr().out
    only_all = json.loads(json.dumps(FLOWS))
    only_all["tasks"][1]["reads"] = [{"name": "f.lam", "flow": "all"}, "g.lam"]
    assert launcher.ignored_flows(wr.load(write(tmp_path, only_all, "all.yaml")), "file") is None


def test_launch_says_flow_is_ignored_under_file(tmp_path):
    _skip_without_mpiexec()
    res = lamina_run(write(tmp_path, FLOWS), "--transport", "file")
    assert res.returncode == 0, res.describe()
    notes = [ln for ln in res.stderr.splitlines() if "flow is ignored" in ln]
    assert notes == [
        "lamina run: note: flow is ignored under the file transport, every reader gets "
        "every step: task 'thin' reads 'f.lam' with flow 2"
    ], res.describe()
