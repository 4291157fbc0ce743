"""``lamina run WORKFLOW.yaml``: workflow files, their checks, and the MPMD jobs they launch.

The end-to-end tests launch the unmodified transport scenario programs
(``scenarios/transport_producer.py`` and ``transport_consumer.py``, which
checks every value) from a workflow file under each transport, per-consumer
flows from the file, and the producer options (``queue_limit``,
``shallow``) the file gives a task.  The checks of the file are fast unit
tests without MPI.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

from lamina import cli  # noqa: E402
from lamina.workflow import file as wr  # noqa: E402
from lamina.workflow import launcher  # noqa: E402
from lamina.workflow import routes as wfmod  # noqa: E402

yaml = pytest.importorskip("yaml")

TIMEOUT = 120  # per launch: the machine may be shared


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
    assert f"-n 6 {sys.executable} sim.py --steps 10" in out
    assert "\\\n  : -n 2 env 'A=x y' ./ana 'two words'" in out
    assert cli.main(["run", path, "--dry-run", "--transport", "file"]) == 0
    assert "export LAMINA_TRANSPORT=file" in capsys.readouterr().out


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
    assert launcher.command(wf, "MPIEXEC") == [
        "MPIEXEC",
        "-n",
        "3",
        sys.executable,
        "a.py",
        "x y",
        ":",
        "-n",
        "1",
        "-wdir",
        str(tmp_path / "sub"),
        "env",
        "K=2",
        "prog",
        "7",
        "2.5",
    ]
    assert launcher.command(wf, "M", oversubscribe=True)[:2] == ["M", "--oversubscribe"]
    env = launcher.environment(wf)
    assert (
        env["LAMINA_TRANSPORT"] == "both" and env["LAMINA_WORKFLOW"] == "a.lam=0>1 | queue_limit=4"
    )
    assert "PMI_RANK" not in env and "LAMINA_TRANSPORT_TIMEOUT" not in wf.variables()
    assert launcher.environment(wf, "file")["LAMINA_TRANSPORT"] == "file"
    assert wf.ranks == 4 and wf.directory == str(tmp_path)


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
    (_set("tasks", 1, "writes", ["*.lam"]), "'ana' (tasks[1])", "writes", "patterns overlap"),
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
