"""What the programs of a workflow do at run time: start, meet, find their files, end.

Each test launches small programs written into its own directory as one
MPMD job (``mpiexec -n N1 python -m mpi4py A : -n N2 ... B``) with the
variables ``lamina run`` sets, under a wall-clock limit:

* under the file transport a reader waiting for a name of the workflow
  takes the file this run writes, never one an earlier run left;
* a task that never opens a lamina file ends
  the launch with a message instead of leaving the others waiting;
* a consumer that ends without ``close`` lets its producer finish;
* one file spelled two ways pairs in memory as it is one file on disk.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
import warnings

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

import lamina  # noqa: E402
from lamina import comm as comm_mod  # noqa: E402
from lamina.engines.native import engine as native  # noqa: E402
from lamina.engines.transport import common, rendezvous  # noqa: E402
from lamina.errors import LaminaWarning  # noqa: E402
from lamina.workflow.routes import Workflow  # noqa: E402

pytest.importorskip("mpi4py")

LIMIT = 28  # seconds a launch may take: past it, it is killed and the test fails

#: writes NAME: STEPS steps of x = SEED * 1000 + step, after sleeping DELAY seconds
PRODUCER = """
import os, sys, time
import numpy as np
import lamina
name, steps, seed, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
where = os.environ.get("PRODUCER_DIR")
if where:
    os.chdir(where)
time.sleep(delay)
with lamina.open(name, "w") as f:
    r, n = f.comm.rank, f.comm.size
    x = f.create_dataset("x", (4 * n,), "f8")
    for k in range(steps):
        with f.step():
            x[4 * r : 4 * (r + 1)] = seed * 1000 + k
if f.comm.rank == 0:
    os.write(1, f"OK producer {steps}\\n".encode())  # one write: lines of ranks never mix
"""

#: reads NAME as MODE says: 'close' every step, then close; 'all' every step, no close;
#: 'early' one step, no close
CONSUMER = """
import os
import sys
import lamina
name, mode = sys.argv[1], sys.argv[2]
f = lamina.open(name, "r", wait=20)
got = []
for v in f.iter_steps(timeout=20):
    got.append(float(v["x"][0]))
    if mode == "early":
        break
if mode == "close":
    f.close()
if f.comm.rank == 0:
    os.write(1, f"OK consumer {got}\\n".encode())
"""


def _skip_without_mpiexec():
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        pytest.skip("no mpiexec")


def launch(tmp_path, programs, env: dict, limit: float = LIMIT) -> mu.Result:
    """Run ``(ranks, argv)`` programs as one MPMD job in *tmp_path*; the result, whatever it is."""
    _skip_without_mpiexec()
    for name, text in (("producer.py", PRODUCER), ("consumer.py", CONSUMER)):
        (tmp_path / name).write_text(textwrap.dedent(text))
    cmd = [mu.mpiexec()]
    for i, (n, argv) in enumerate(programs):
        if i:
            cmd.append(":")
        cmd += ["-n", str(n), sys.executable, *map(str, argv)]
    t0 = time.monotonic()
    proc = mu.start(cmd, env=env, cwd=str(tmp_path))
    return mu.finish(proc, cmd, limit, t0)


def producer(n: int, name: str, steps: int = 3, seed: int = 2, delay: float = 0.0):
    return (n, ["-m", "mpi4py", "producer.py", name, steps, seed, delay])


def consumer(n: int, name: str, mode: str = "close"):
    return (n, ["-m", "mpi4py", "consumer.py", name, mode])


def ok(res: mu.Result) -> mu.Result:
    assert res.returncode == 0, res.describe()
    return res


# ------------------------------------------------ files of an earlier run (file transport)


def _old_file(path, steps: int = 3, seed: int = 1) -> None:
    """A complete file of an earlier run (written here, before the launch)."""
    with lamina.open(path, "w") as f:
        x = f.create_dataset("x", (8,), "f8")
        for k in range(steps):
            with f.step():
                x[...] = seed * 1000 + k


@pytest.mark.parametrize("described", [True, False], ids=["workflow", "two-programs"])
@pytest.mark.parametrize("delay", [0.0, 2.0])
def test_a_reader_waits_for_this_runs_file_not_an_earlier_ones(tmp_path, delay, described):
    """Under the file transport the old file is there when the consumer opens it: it reads
    the new one, whether the producer re-creates it at once or seconds later, and whether
    LAMINA_WORKFLOW names the file or two programs need no description (there the consumer
    read the earlier run's steps)."""
    _old_file(tmp_path / "out.lam")
    env = {"LAMINA_TRANSPORT": "file", "LAMINA_TRANSPORT_TIMEOUT": "20"}
    if described:
        env["LAMINA_WORKFLOW"] = "out.lam=0>1"
    res = ok(
        launch(
            tmp_path,
            [producer(2, "out.lam", seed=2, delay=delay), consumer(1, "out.lam")],
            env,
        )
    )
    [got] = res.lines("OK consumer")
    assert got == "[2000.0, 2001.0, 2002.0]", res.describe()


def test_what_counts_as_a_file_written_since(tmp_path, monkeypatch):
    """The check behind it: a record committed since the start; a file being re-created
    (a log cut short, a log missing) is not there yet, never an error."""
    path = tmp_path / "f.lam"
    _old_file(path, steps=1)
    assert native._written_after(str(path), 0.0)
    assert not native._written_after(str(path), time.time() + 100)
    assert not native._written_after(str(tmp_path / "nothing.lam"), 0.0)
    commit = path / "lamina.commit"
    raw = commit.read_bytes()
    commit.write_bytes(raw[:10])  # a header being written
    assert not native._written_after(str(path), 0.0)
    commit.write_bytes(raw)
    (path / "lamina.meta").unlink()
    assert not native._written_after(str(path), 0.0)

    # which opens it applies to: readers that wait, of a name the workflow routes to them
    monkeypatch.setattr(comm_mod, "_JOB_START", 123.0)
    monkeypatch.setenv("LAMINA_WORKFLOW", f"out.lam=1>{comm_mod.appnum()}")
    assert native.written_since("out.lam", "r", 5) == 123.0
    assert native.written_since("run/out.lam", "r", 5) == 123.0
    assert native.written_since("out.lam", "r", 0) is None
    assert native.written_since("out.lam", "w", 5) is None
    assert native.written_since("other.lam", "r", 5) is None
    monkeypatch.setenv("LAMINA_WORKFLOW", "out.lam=1>2")  # not this task's
    assert native.written_since("out.lam", "r", 5) is None
    monkeypatch.delenv("LAMINA_WORKFLOW")  # two programs: each reads what the other writes
    for tasks, want in ((1, None), (2, 123.0), (3, None)):
        monkeypatch.setattr(comm_mod, "task_count", lambda tasks=tasks: tasks)
        assert native.written_since("out.lam", "r", 5) == want
    monkeypatch.setattr(comm_mod, "_JOB_START", None)  # the job's start unknown
    monkeypatch.setattr(comm_mod, "task_count", lambda: 2)
    assert native.written_since("out.lam", "r", 5) is None


# ------------------------------------------------ every task must take part


LOGGER_MPI = "import os; from mpi4py import MPI; os.write(1, b'logger up\\n')"
LOGGER_TASK = "import os, lamina; lamina.comm.task_comm(); os.write(1, b'logger up\\n')"


def test_a_task_that_never_opens_a_lamina_file(tmp_path):
    """A third program initializes MPI but never calls lamina: the others stop after the
    transport timeout, naming it, instead of waiting for ever in their first open."""
    res = launch(
        tmp_path,
        [producer(2, "a.lam"), consumer(1, "a.lam"), (1, ["-c", LOGGER_MPI])],
        {
            "LAMINA_TRANSPORT": "memory",
            "LAMINA_WORKFLOW": "a.lam=0>1",
            "LAMINA_TRANSPORT_TIMEOUT": 3,
        },
    )
    assert res.returncode not in (0, -9999), res.describe()
    assert "task 2 (world rank 3) never opened a lamina file within 3 s" in res.stderr, (
        res.describe()
    )
    assert res.seconds < 20, res.describe()


def test_a_task_that_calls_task_comm_takes_part(tmp_path):
    """The remedy: a program that opens no lamina file calls lamina.comm.task_comm() once."""
    res = ok(
        launch(
            tmp_path,
            [producer(2, "a.lam"), consumer(1, "a.lam"), (1, ["-c", LOGGER_TASK])],
            {
                "LAMINA_TRANSPORT": "memory",
                "LAMINA_WORKFLOW": "a.lam=0>1",
                "LAMINA_TRANSPORT_TIMEOUT": 10,
            },
        )
    )
    assert res.lines("OK consumer") == ["[2000.0, 2001.0, 2002.0]"]


# ------------------------------------------------ a consumer that ends without close


@pytest.mark.parametrize("mode", ["all", "early"])
def test_a_consumer_that_ends_without_close(tmp_path, mode):
    """Reading every step (or one) and leaving without f.close(): the file is closed at exit,
    so the producer finishes, under memory as under file."""
    res = ok(
        launch(
            tmp_path,
            [producer(2, "nc.lam", steps=4), consumer(1, "nc.lam", mode)],
            {"LAMINA_TRANSPORT": "memory", "LAMINA_TRANSPORT_TIMEOUT": 8},
        )
    )
    assert res.lines("OK producer") == ["4"], res.describe()
    want = "[2000.0, 2001.0, 2002.0, 2003.0]" if mode == "all" else "[2000.0]"
    assert res.lines("OK consumer") == [want], res.describe()
    assert res.seconds < 8 + 5, res.describe()  # no close waited for its timeout


class _Fake:
    def __init__(self, path: str, mode: str, log: list, fail: bool = False):
        self.path, self.mode, self.log, self.fail = path, mode, log, fail

    def close(self):
        self.log.append(("close", self.path))
        if self.fail:
            raise lamina.TransportError("the peer is gone")

    def abandon(self):
        self.log.append(("abandon", self.path))


def test_close_at_exit_order_and_failures(monkeypatch):
    """Consumers first, then producers; a close that fails is a warning and the others go
    on; after an uncaught exception files are abandoned (no collective call)."""
    log: list = []
    engines = [
        _Fake("p.lam", "w", log),
        _Fake("c1.lam", "r", log, fail=True),
        _Fake("c2.lam", "r", log),
    ]
    monkeypatch.setattr(common, "_OPEN", {id(e): e for e in engines})
    monkeypatch.delattr(sys, "last_value", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        common.close_at_exit()
    assert log == [("close", "c1.lam"), ("close", "c2.lam"), ("close", "p.lam")]
    assert [str(w.message) for w in caught if issubclass(w.category, LaminaWarning)] == [
        "c1.lam: closing it at exit (the program did not): the peer is gone"
    ]
    assert not common._OPEN
    log.clear()
    monkeypatch.setattr(common, "_OPEN", {id(e): e for e in engines})
    monkeypatch.setattr(sys, "last_value", RuntimeError("boom"), raising=False)
    common.close_at_exit()
    assert log == [("abandon", "c1.lam"), ("abandon", "c2.lam"), ("abandon", "p.lam")]


# ------------------------------------------------ one file, two spellings


def test_one_file_spelled_two_ways_pairs_in_memory(tmp_path):
    """The producer runs in run/ and opens out.lam; the consumer, above it, opens
    run/out.lam: the workflow entry out.lam routes both, and they pair."""
    (tmp_path / "run").mkdir()
    res = ok(
        launch(
            tmp_path,
            [producer(2, "out.lam"), consumer(1, "run/out.lam")],
            {
                "LAMINA_TRANSPORT": "memory",
                "LAMINA_WORKFLOW": "out.lam=0>1",
                "LAMINA_TRANSPORT_TIMEOUT": 10,
                "PRODUCER_DIR": "run",
            },
        )
    )
    assert res.lines("OK consumer") == ["[2000.0, 2001.0, 2002.0]"], res.describe()
    assert not os.listdir(tmp_path / "run")  # in memory: no file


def test_a_producer_says_what_its_consumer_opened_instead(tmp_path):
    """Without a workflow names must be equal: the producer's error names what the other
    task opened."""
    res = launch(
        tmp_path,
        [producer(1, "a.lam"), consumer(1, "elsewhere/a.lam")],
        {"LAMINA_TRANSPORT": "memory", "LAMINA_TRANSPORT_TIMEOUT": 3},
    )
    assert res.returncode not in (0, -9999), res.describe()
    assert "task 1 opened 'elsewhere/a.lam' for reading instead" in res.stderr, res.describe()


def test_rendezvous_keys():
    """The name a rendezvous pairs on: the entry and the last path component."""
    wf = Workflow.parse("out.lam=0>1; *.dat=0>2; run/*.h=0>1")
    key = rendezvous.key_for
    assert key("out.lam", wf) == key("run/out.lam", wf) == key("a/b/out.lam", wf)
    assert key("a.dat", wf) == key("x/a.dat", wf) != key("b.dat", wf)
    assert key("run/a.h", wf) != key("run/b.h", wf)
    assert key("other", wf) == "other"
    assert key("run/out.lam", None) == "run/out.lam"
    assert all(rendezvous._shown(key(n, wf)) == os.path.basename(n) for n in ("a.dat", "x/out.lam"))
