"""In situ transport: producer and consumer programs of one MPMD launch.

The scenario programs (``scenarios/transport_producer.py`` and
``transport_consumer.py``) contain no transport code: the same scripts run
with ``LAMINA_TRANSPORT=file`` (a native file, followed by the consumer)
and ``=memory`` (served over MPI).  The consumer checks every value of the
LowFive benchmark data (a uint64 grid written by row slabs and read by
uneven column slabs, n x 3 float32 particles in uneven ranges, a 3-D
complex field through random uneven grids on both sides), over several
steps, with groups and attributes; n > m and n < m; fan-out, fan-in and a
chain; and faults give TransportError within the timeout.
"""

from __future__ import annotations

import os
import re
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios"))

import mpi_util as mu  # noqa: E402
from transport_flow import LATEST_DELAY  # noqa: E402

import lamina  # noqa: E402
from lamina.errors import LaminaError, ModeError, TransportError  # noqa: E402
from lamina.workflow import routes as transport  # noqa: E402
from lamina.workflow.routes import Route, Workflow, route_for  # noqa: E402

pytest.importorskip("mpi4py")

TIMEOUT = 60  # per launch


def mpmd(*programs) -> list[str]:
    """``mpiexec -n N1 python -m mpi4py A args : -n N2 ... B args``: one program per (n, script, *args)."""
    cmd = [mu.mpiexec()]
    for i, (n, script, *args) in enumerate(programs):
        if i:
            cmd.append(":")
        cmd += ["-n", str(n), sys.executable, "-m", "mpi4py", mu.scenario(script), *map(str, args)]
    return cmd


def run_mpmd(
    *programs, cwd, env: dict, timeout: float = TIMEOUT, expect_ok: str = "OK"
) -> mu.Result:
    cmd = mpmd(*programs)
    t0 = time.monotonic()
    env = {"LAMINA_TRANSPORT_TIMEOUT": "20", **env}
    proc = mu.start(cmd, env=env, cwd=str(cwd))
    return mu.check(mu.finish(proc, cmd, timeout, t0), expect_ok)


def _skip_without_mpiexec():
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        pytest.skip("no mpiexec")


# ----------------------------------------------------------------- MPMD runs


def test_producer_consumer_under_io_auto(tmp_path):
    """The same programs under LAMINA_IO=auto, the steps going to the consumers and to the
    file alongside: every step arrives, and the file holds every decision rank 0 made, in
    order (handed down with the steps through the transport's layers)."""
    _skip_without_mpiexec()
    from lamina.perf.asyncmodel import read_decisions

    steps = 6
    res = run_mpmd(
        (2, "transport_producer", "bench.lam", steps),
        (1, "transport_consumer", "bench.lam", steps),
        cwd=tmp_path,
        env={
            "LAMINA_TRANSPORT": "both",
            "LAMINA_IO": "auto",
            "LAMINA_HISTORY": str(tmp_path / "history.json"),
        },
    )
    [cons] = res.lines("OK consumer")
    assert f"{steps} steps on 1 ranks" in cons, res.describe()
    with lamina.open(tmp_path / "bench.lam", "r") as f:
        assert f.steps == steps
        got, complete = read_decisions(f.engine.catalog.ext)
    assert complete and [d["step"] for d in got] == list(range(steps)), got


@pytest.mark.parametrize("mode", ["memory", "file", "both"])
@pytest.mark.parametrize("n,m", [(3, 2), (2, 3), (1, 1)])
def test_producer_consumer(tmp_path, mode, n, m):
    """The same unmodified programs, n producer ranks and m consumer ranks, under each transport."""
    _skip_without_mpiexec()
    steps = 3
    res = run_mpmd(
        (n, "transport_producer", "bench.lam", steps),
        (m, "transport_consumer", "bench.lam", steps),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": mode},
    )
    [prod] = res.lines("OK producer")
    [cons] = res.lines("OK consumer")
    want = "native" if mode == "file" else "mpi" if mode == "memory" else "both"
    assert want in cons and f"{steps} steps on {m} ranks" in cons, res.describe()
    assert f"{n} ranks" in prod
    # what was read is counted whichever way it came (the memory transport counted nothing)
    compared, moved = map(int, re.search(r"(\d+) values compared, (\d+) bytes read", cons).groups())
    assert moved >= compared > 0, cons
    on_disk = (tmp_path / "bench.lam").exists()
    assert on_disk == (mode != "memory"), sorted(os.listdir(tmp_path))
    if mode == "both":  # the file written alongside holds every step too
        with lamina.open(tmp_path / "bench.lam", "r") as f:
            assert f.steps == steps
            assert f.attrs["title"] == "lowfive benchmark"
            assert int(f.at(2)["grid"][4, 5]) == 4 * 17 + 5 + 2 * 100_000


@pytest.mark.parametrize("mode", ["memory", "file", "both"])
def test_what_a_producer_reads_back(tmp_path, mode):
    """A producer's queries and reads: under 'both' from its file, as under 'file' (they
    answered only when statistics ruled out every block, and raised ModeError otherwise);
    under 'memory' a ModeError whatever the values and boxes."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_producer_reads", "produce", "pr.lam"),
        (1, "transport_producer_reads", "consume", "pr.lam"),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": mode},
    )
    assert res.lines(f"OK producer {mode}") and res.lines("OK consumer 1 steps"), res.describe()


@pytest.mark.parametrize("mode", ["memory", "file"])
def test_consumer_ranks_at_a_step_see_one_namespace(tmp_path, mode):
    """A dataset and an attribute made at step 1 reach one consumer rank while it reads step
    0 alone: every rank still sees step 0's datasets and attributes until they take step 1
    up together (in memory, that rank saw them at step 0 and the job aborted)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_namespace", "produce", "ns.lam"),
        (2, "transport_namespace", "consume", "ns.lam"),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": mode},
    )
    assert res.lines("OK producer") and res.lines("OK consumer"), res.describe()


def test_fan_out(tmp_path):
    """One producer task, two consumer tasks of different sizes."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_producer", "a", 3),
        (1, "transport_consumer", "a", 3),
        (2, "transport_consumer", "a", 3),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory", "LAMINA_WORKFLOW": "a=0>1,2"},
    )
    assert len(res.lines("OK consumer a: 3 steps")) == 2


def test_fan_in(tmp_path):
    """Two producer tasks, one consumer task reading both names step by step."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_producer", "a", 3),
        (1, "transport_producer", "b", 3),
        (2, "transport_consumer", "a,b", 3),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory", "LAMINA_WORKFLOW": "a=0>2; b=1>2"},
    )
    assert res.lines("OK consumer a,b: 3 steps on 2 ranks")


def test_chain(tmp_path):
    """A -> B -> C: the middle task reads a, writes b through its own decomposition; C checks b.

    Some names stay files: the workflow routes only ``a`` and ``b`` in memory.
    """
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_producer", "a", 3),
        (3, "transport_consumer", "a", 3, "--relay", "b"),
        (2, "transport_consumer", "b", 3),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory", "LAMINA_WORKFLOW": "a=0>1\nb=1>2"},
    )
    assert res.lines("OK consumer a: 3 steps on 3 ranks")
    assert res.lines("OK consumer b: 3 steps on 2 ranks")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("nprod,how", [(3, "ordered"), (1, "numbered")])
def test_own_task_communicators(nprod, how):
    """One program splits the world itself (set_task_comm): 3 -> 1 and 1 -> 2 ranks in memory."""
    _skip_without_mpiexec()
    res = mu.run_mpi(
        3 if how == "numbered" else 4,
        "transport_split",
        "s",
        2,
        nprod,
        how,
        env={"LAMINA_TRANSPORT": "memory", "LAMINA_TRANSPORT_TIMEOUT": "20"},
        timeout=TIMEOUT,
    )
    assert res.lines("OK split: 2 steps"), res.describe()


def test_own_task_communicators_refused():
    """Task numbers that differ inside one task: ValueError on every rank; after an open, RuntimeError."""
    _skip_without_mpiexec()
    res = mu.run_mpi(3, "transport_split", "s", 2, 2, "bad", timeout=TIMEOUT)
    assert res.lines("OK bad split refused"), res.describe()
    lamina.comm.task_comm()
    with pytest.raises(RuntimeError, match="before the first lamina.open"):
        lamina.comm.set_task_comm(lamina.comm.world())


def test_nobody_produces(tmp_path):
    """A consumer of a name nobody produces gets TransportError within the timeout."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_faults", "orphan-idle"),
        (2, "transport_faults", "orphan-read", "nothing"),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory", "LAMINA_TRANSPORT_TIMEOUT": "2"},
        timeout=40,
    )
    assert res.lines("OK orphan")


def test_a_consumer_that_opens_again_pairs_with_a_late_producer(tmp_path):
    """A consumer opens again after its open timed out (no producer yet): the producer's
    open pairs with the retry (it answered the first open's stale greeting and waited for
    ever in MPI's intercommunicator creation)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_retry", "produce", "r.lam"),
        (1, "transport_retry", "consume", "r.lam"),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory"},
        timeout=60,
    )
    assert res.lines("OK produce") and res.lines("OK consume"), res.describe()


def test_a_producer_answering_a_consumer_that_gave_up_for_good_raises(tmp_path):
    """The consumer's open gave up before the producer opened, and it never opened again:
    the producer's answer to its greeting was sent all the same (a small message), and the
    producer waited in MPI's intercommunicator creation for ever.  It now waits for the
    consumer to say it took the answer, within its timeout."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_retry", "produce-alone", "g.lam"),
        (1, "transport_retry", "consume-once", "g.lam"),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory"},
        timeout=60,
    )
    assert res.lines("OK produce-alone") and res.lines("OK consume-once"), res.describe()


@pytest.mark.parametrize("mode", ["memory", "both"])
def test_producer_ranks_a_step_apart(tmp_path, mode):
    """An error inside one producer rank's step puts its ranks a step apart: later commits
    raise StepError on every rank, the close is clean, and consumers read the one step
    committed (under both, the file's refused commit left the served step open: every later
    step and the close failed)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_faults", "apart-write", "s"),
        (1, "transport_faults", "apart-read", "s"),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": mode, "LAMINA_TRANSPORT_TIMEOUT": "10"},
        timeout=60,
    )
    assert res.lines("OK apart producer closed") and res.lines("OK apart consumer read step 0")


@pytest.mark.parametrize("serve", ["thread", "calls"])
def test_stalled_producer(tmp_path, serve):
    """A producer busy outside lamina: its serving thread still answers reads (without one, reads
    fail with TransportError); waiting for a step it does not make fails; both sides close cleanly."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_faults", "stall-write", "s", tmp_path),
        (2, "transport_faults", "stall-read", "s", tmp_path),
        cwd=tmp_path,
        env={
            "LAMINA_TRANSPORT": "memory",
            "LAMINA_TRANSPORT_TIMEOUT": "2",
            "LAMINA_TRANSPORT_SERVE": serve,
        },
        timeout=40,
    )
    want = "answered in" if serve == "thread" else "TransportError after"
    assert res.lines(f"OK stall: step 1 {want}")
    assert res.lines("OK stalled producer closed")


@pytest.mark.parametrize("mode,n,m", [("same", 2, 3), ("change", 3, 2), ("early", 2, 3)])
def test_read_ahead(tmp_path, mode, n, m):
    """A consumer task streams with iter_steps(prefetch=True) under io='async': its read-ahead
    thread asks producer ranks for the next step while the program computes on this one.

    Every value is right; reads after the first step are served by the read-ahead, and some
    steps were fetched whole during the step before (``same``); other selections from the
    middle on miss at that step and hit again after it (``change``); a consumer that closes
    after 3 of 8 steps with reads in flight, and the producer that goes on without it,
    finish (``early``).  (Reading step k+1 ahead used to release step k on the consumer: the
    program's next read of step k failed with StepError, 'step k of 'a' was released'.)
    """
    _skip_without_mpiexec()
    res = run_mpmd(
        (n, "transport_prefetch", "produce", "a", 8),
        (m, "transport_prefetch", mode, "a", 8),
        cwd=tmp_path,
        env={},
    )
    assert res.lines("OK produce a: 8 steps"), res.describe()
    [line] = res.lines(f"OK consume {mode}:")
    assert f"{3 if mode == 'early' else 8} steps on {m} ranks" in line, res.describe()
    assert not os.listdir(tmp_path)


def test_producer_forgets_released_steps_past_its_limit(tmp_path):
    """A producer keeps the block tables of steps its consumers released within
    RECORDS_KEPT, the newest first: past it the oldest are a StepError naming the limit
    (a stream of many steps kept every step's tables, about 100 bytes a block a step)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_prefetch", "produce-forget", "a", 8),
        (1, "transport_prefetch", "plain", "a", 8),
        cwd=tmp_path,
        env={},
    )
    assert res.lines("OK produce a: 8 steps"), res.describe()
    assert res.lines("OK consume plain: 8 steps"), res.describe()


@pytest.mark.parametrize("n,m", [(2, 1)])
def test_threads_of_a_consumer_read_at_once(tmp_path, n, m):
    """Reads and statistics of one consumer from 4 threads at once (docs/api.md, "Threads")
    give every value written: the answers of one producer rank to two threads' requests went
    to whichever receive was posted first (wrong values, or MPI's truncation error)."""
    _stream_of_six(tmp_path, n, m, "threads")


def _stream_of_six(tmp_path, n: int, m: int, role: str) -> None:
    """n producer ranks write 6 steps, m consumer ranks read them in scenario *role*."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (n, "transport_prefetch", "produce", "a", 6),
        (m, "transport_prefetch", role, "a", 6),
        cwd=tmp_path,
        env={},
    )
    assert res.lines("OK produce a: 6 steps"), res.describe()
    assert res.lines(f"OK consume {role}: 6 steps"), res.describe()


@pytest.mark.parametrize("n,m", [(1, 1), (2, 2)])
def test_prefetch_of_the_next_step_leaves_this_one_readable(tmp_path, n, m):
    """ds.prefetch(box, k + 1) on a consumer task at step k: step k stays readable (the
    step's resolution released it: the next read of step k raised StepError), and a step far
    ahead, not yet sent, is not waited for (False at once)."""
    _stream_of_six(tmp_path, n, m, "explicit")


@pytest.mark.parametrize("n,m", [(1, 1), (1, 2)])
def test_a_plain_read_takes_the_agreed_latest_step_and_releases_nothing(tmp_path, n, m):
    """A plain f[...] on a consumer reads f.steps - 1 (the step every consumer rank has, as a
    file's latest committed step) and releases nothing: the step iter_steps gave stays
    readable.  It read this rank's latest received step and released the one iterated over."""
    _stream_of_six(tmp_path, n, m, "plain")


# ----------------------------------------------------------------- in process


def test_names_two_patterns_share_and_names_that_are_their_own_entry():
    """Two written patterns clash where one name matches both (neither need match the other:
    'a*' and '*b.lam' share 'ab.lam'), checked against every name of up to six characters;
    an entry equal to a name with glob characters routes it ('out[1].lam' went by file)."""
    import fnmatch
    import itertools
    import random

    from lamina.workflow.routes import globs_meet, routes_meet

    assert routes_meet("a*", "*b.lam") and routes_meet("out.lam", "run/out.lam")
    assert not routes_meet("step_*.lam", "grid_*.lam") and not routes_meet("*.lam", "*.h5")
    rnd = random.Random(3)

    def against_every_name(atoms, alphabet, longest, pairs, most):
        """*pairs* random patterns of up to *most* atoms, judged against every name of up to
        *longest* characters of *alphabet*."""
        names = [
            "".join(t) for n in range(longest + 1) for t in itertools.product(alphabet, repeat=n)
        ]
        for _ in range(pairs):
            x = "".join(rnd.choice(atoms) for _ in range(rnd.randint(0, most)))
            y = "".join(rnd.choice(atoms) for _ in range(rnd.randint(0, most)))
            want = any(fnmatch.fnmatchcase(s, x) and fnmatch.fnmatchcase(s, y) for s in names)
            assert globs_meet(x, y) == want, (x, y)

    against_every_name(["a", "b", "?", "*", "[ab]", "[!a]", "[a]"], "abc", 6, 1500, 4)
    wf = Workflow.parse("out[1].lam=0>1")
    assert wf.route("out[1].lam") == Route(0, (1,)) and wf.route("run/out[1].lam") == Route(0, (1,))
    # classes with ranges and negations: every character outside a-e (named by none) behaves
    # as 'f' does, so names over a-f decide; two classes that leave out every character the
    # search used to try beside theirs ('[!a-z0-9_.x-]' twice) share 'B'
    assert globs_meet("[!a-z0-9_.x-]", "[!0-9a-z_.x-]") and not globs_meet("[a-c]", "[d-f]")
    atoms = ["a", "e", "?", "*", "[a-c]", "[!b-d]", "[c-e]", "[!a]", "[!a-e]", "[b]", "[e-a]"]
    against_every_name(atoms, "abcdef", 4, 600, 3)


def test_workflow_parse_and_route():
    wf = Workflow.parse("sim*.lam=0>2,1; out/ana.lam = 1>2\n")
    assert wf.route("sim3.lam") == Route(0, (1, 2))
    assert wf.route("./dir/sim3.lam") == Route(0, (1, 2))  # the last path component matches too
    assert wf.route("out/ana.lam") == Route(1, (2,))
    assert wf.route("other.lam") is None
    for bad in ("x=0", "x=a>1", "x=0>0", "=0>1", "x=0>1,1"):
        with pytest.raises(ValueError):
            Workflow.parse(bad)
    # the default of two tasks: whoever writes produces, the other task consumes
    assert route_for("x", "w", 1, 2, None) == Route(1, (0,))
    assert route_for("x", "r", 1, 2, None) == Route(0, (1,))
    with pytest.raises(TransportError, match="one MPMD"):
        route_for("x", "w", 0, 1, None)
    with pytest.raises(TransportError, match="LAMINA_WORKFLOW"):
        route_for("x", "w", 0, 3, None)
    with pytest.raises(TransportError, match="task 0 produces"):
        route_for("sim1.lam", "w", 2, 3, wf)
    with pytest.raises(TransportError, match="consumers"):
        route_for("out/ana.lam", "r", 0, 3, wf)
    assert issubclass(TransportError, LaminaError) and issubclass(TransportError, ConnectionError)


def test_engine_choice(monkeypatch):
    monkeypatch.delenv("LAMINA_TRANSPORT", raising=False)
    monkeypatch.delenv("LAMINA_WORKFLOW", raising=False)
    assert transport.engine_for("x.lam", "w") is None
    assert transport.engine_for("x.lam", "w", "memory") == "mpi"
    assert transport.engine_for("x.lam", "w", "both") == "both"
    monkeypatch.setenv("LAMINA_TRANSPORT", "memory")
    assert transport.engine_for("x.lam", "r") == "mpi"
    assert transport.engine_for("x.lam", "r", "file") is None
    monkeypatch.setenv("LAMINA_WORKFLOW", "sim.lam=0>1")
    assert transport.engine_for("log.lam", "w") is None  # not in the workflow: stays a file
    assert transport.engine_for("run/sim.lam", "w") == "mpi"
    with pytest.raises(ValueError, match="transport must be"):
        transport.engine_for("x.lam", "w", "disk")


def test_file_transport_ignores_transport_options(tmp_path, monkeypatch):
    """A program that passes transport options runs unchanged when its files are written."""
    monkeypatch.delenv("LAMINA_TRANSPORT", raising=False)
    with lamina.open(
        tmp_path / "a.lam", "w", transport="file", shallow=["x"], queue_limit=3, timeout=5
    ) as f:
        f.create_dataset("x", (3,), np.int32)
        with f.step():
            f["x"][:] = [1, 2, 3]
    with lamina.open(tmp_path / "a.lam", "r") as f:
        assert list(f.at(0)["x"][:]) == [1, 2, 3]


def test_memory_transport_needs_mpmd(tmp_path):
    """One program alone cannot transport: TransportError at open, nothing written."""
    with pytest.raises(TransportError, match="MPMD"):
        lamina.open(tmp_path / "x.lam", "w", transport="memory")
    with pytest.raises(ModeError):
        lamina.open(tmp_path / "x.lam", "a", transport="memory")
    with pytest.raises(ValueError, match="queue_limit"):
        lamina.open(tmp_path / "x.lam", "w", transport="memory", queue_limit=1)
    with pytest.raises(ValueError, match="stats must be True or False"):
        lamina.open(tmp_path / "x.lam", "w", transport="memory", stats="no")
    with pytest.raises(ValueError, match="serve must be one of thread, calls"):
        lamina.open(tmp_path / "x.lam", "w", transport="memory", serve="sometimes")
    assert not os.listdir(tmp_path)


def test_a_serve_mode_from_the_environment_is_named_so(tmp_path, monkeypatch):
    """LAMINA_TRANSPORT_SERVE=bogus was refused as the option 'serve', which the program
    never passed: the error names the variable, as $LAMINA_TRANSPORT_SPIN's does."""
    monkeypatch.setenv("LAMINA_TRANSPORT_SERVE", "bogus")
    want = r"^\$LAMINA_TRANSPORT_SERVE must be one of thread, calls, got 'bogus'$"
    with pytest.raises(ValueError, match=want):
        lamina.open(tmp_path / "x.lam", "w", transport="memory")
    with pytest.raises(TransportError, match="MPMD"):  # the option wins over the variable
        lamina.open(tmp_path / "x.lam", "w", transport="memory", serve="calls")
    with pytest.raises(ValueError, match="^serve must be one of thread, calls, got 'Bogus'$"):
        lamina.open(tmp_path / "x.lam", "w", transport="memory", serve="Bogus")
    assert not os.listdir(tmp_path)


# ----------------------------------------------------------------- flow control


def test_flow_latest(tmp_path):
    """A slow consumer with flow='latest' sees an increasing subsequence ending at the last step.

    The producer never waits for it (its 12 steps take about 12 x 20 ms, the consumer
    300 ms per step) and holds at most queue_limit (2) steps in memory.  (The consumer
    took 120 ms a step, and the bound was 12 x 120 ms: the producer took 0.7 s of that
    with its 3 ranks on one loaded core, too close.)
    """
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_flow", "produce", "f", 12),
        (1, "transport_flow", "latest", "f", 12),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory"},
    )
    [prod] = res.lines("OK produce:")
    held = int(prod.split("held at most ")[1].split()[0])
    took = float(prod.split(" in ")[1].split()[0])
    assert held <= 2, res.describe()
    assert took < 12 * LATEST_DELAY, res.describe()
    assert res.lines("OK latest:"), res.describe()


AHEAD = {"LAMINA_TRANSPORT": "memory", "LAMINA_TRANSPORT_TIMEOUT": "10"}


def _took(res: mu.Result, role: str) -> float:
    [line] = res.lines(f"OK {role}:")
    return float(line.split(" in ")[1].split()[0])


@pytest.mark.parametrize("role, args", [("start", (8,)), ("wait", ()), ("every", (8,))])
def test_a_step_asked_for_ahead_releases_the_ones_before(tmp_path, role, args):
    """``iter_steps(start=3)``, ``wait_for_step(3)`` and ``f.at(3)`` of every second step ask
    for a step the producer has not committed while it waits for releases (queue_limit 2):
    the steps before are released, so it goes on at once instead of both sides waiting out
    the timeout and failing."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_ahead", "produce", "s", 8),
        (1, "transport_ahead", role, "s", *args),
        cwd=tmp_path,
        env=AHEAD,
    )
    assert res.lines(f"OK {role}:"), res.describe()
    assert _took(res, "produce") < 8, res.describe()  # no timeout (10 s) waited


@pytest.mark.parametrize("role", ["every", "every-wait"])
def test_a_step_ahead_of_a_slow_producer_with_a_flow(tmp_path, role):
    """With flow=2 the producer's number of a step not arrived is not known: each step that
    arrives before it is released as it comes (the first release named the steps received
    and no later one, and the producer waited for releases until the timeout)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_ahead", "slow", "s", 10, 0.15),
        (1, "transport_ahead", role, "s", 10),
        cwd=tmp_path,
        env=AHEAD,
    )
    assert res.lines(f"OK {role}:"), res.describe()
    assert _took(res, "produce") < 8, res.describe()


@pytest.mark.parametrize(
    "role, steps, gap", [("latest-last", 4, 0.2), ("keep-up", 12, 0.15)], ids=["last", "keep-up"]
)
def test_a_latest_consumer_waiting_for_a_newer_step(tmp_path, role, steps, gap):
    """flow='latest' with iter_steps: a consumer waiting for its next step says it wants a
    newer one (Request.WANT) and keeps the one it holds.  ``last``: that step is still read
    once the stream ends; ``keep-up``: the producer sends each step it commits to a consumer
    quicker than it (it saw the first and the last of 12)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_ahead", "slow", "l", steps, gap),
        (1, "transport_ahead", role, "l", steps),
        cwd=tmp_path,
        env=AHEAD,
    )
    assert res.lines(f"OK {role}"), res.describe()


def test_lent_blocks_reach_the_file_under_both(tmp_path):
    """Under ``transport="both"`` a block lent (``write(copy=False)``) goes to the file too."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_ahead", "produce", "b.lam", 6),
        (1, "transport_ahead", "start", "b.lam", 6),
        cwd=tmp_path,
        env={**AHEAD, "LAMINA_TRANSPORT": "both"},
    )
    assert res.lines("OK start:"), res.describe()
    with lamina.open(tmp_path / "b.lam") as f:
        assert f.steps == 6
        for k in range(6):
            np.testing.assert_array_equal(f.at(k)["x"][...], np.arange(4) + 10 * k)


def test_collective_read_of_a_consumer(tmp_path):
    """``read(..., collective=True)`` on a memory consumer reads as on a file (it raised a bare
    NotImplementedError)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_ahead", "rows", "g"),
        (2, "transport_ahead", "columns", "g"),
        cwd=tmp_path,
        env=AHEAD,
    )
    assert len(res.lines("OK columns")) == 2, res.describe()


def test_a_consumer_leaving_after_an_error_says_goodbye(tmp_path):
    """Consumer ranks that leave after an error (one raises, the other is told) say goodbye
    as close does: the producer finishes its steps instead of waiting for releases that never
    come."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_ahead", "goes-on", "l", 5),
        (2, "transport_ahead", "leave", "l"),
        cwd=tmp_path,
        env=AHEAD,
    )
    assert len(res.lines("OK leave")) == 2, res.describe()
    assert _took(res, "produce") < 8, res.describe()


@pytest.mark.parametrize(
    "producers, how", [(2, "one"), (2, "all"), (1, "alone"), (2, "async"), (2, "close")]
)
def test_consumers_hear_at_once_that_the_producer_left(tmp_path, producers, how):
    """Producer ranks that leave the file after an error (one raised, the other was told; an
    error every rank raised; the one rank raised; a step that failed in the background,
    raised at a later call or at close; a close that failed committing the step left open)
    end their consumers' record streams: the consumers raise at once that the producer left,
    instead of waiting out their timeout twice (the read, then the close), or of seeing a
    stream that ended as if finished (the background failure raised at close sent the close
    record; the failed close sent nothing)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (producers, "transport_ahead", "fails", "p", how),
        (2, "transport_ahead", "follows", "p"),
        cwd=tmp_path,
        env=AHEAD,
    )
    lines = res.lines("OK follows")
    assert len(lines) == 2, res.describe()
    assert all(float(x.split(" in ")[1].split()[0]) < 8 for x in lines), res.describe()


@pytest.mark.parametrize("how", ["one", "close"])
def test_under_both_a_producer_rank_leaving_reaches_the_others_in_the_file(tmp_path, how):
    """Under ``both`` the other producer ranks wait in the file's collective calls (its
    commit comes before the step is served): the producer's leave alone met them nowhere, and
    they waited for ever; the file keeps the steps committed before."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_ahead", "fails", "p", how),
        (2, "transport_ahead", "follows", "p"),
        cwd=tmp_path,
        env={**AHEAD, "LAMINA_TRANSPORT": "both"},
    )
    lines = res.lines("OK follows")
    assert len(lines) == 2 and len(res.lines("OK fails")) == 2, res.describe()
    assert all(float(x.split(" in ")[1].split()[0]) < 8 for x in lines), res.describe()
    with lamina.open(str(tmp_path / "p")) as f:
        assert f.steps >= 2 and [int(f.at(k)["x"][0]) // 10 for k in range(2)] == [0, 1]


@pytest.mark.parametrize(
    "io, how", [("async", "ahead"), ("async", "plain"), ("async", "skip"), ("sync", "ahead")]
)
def test_steps_received_before_the_producer_left_are_handed_out(tmp_path, io, how):
    """A producer that leaves after step 3 ended on every rank (rank 1 raised, queue_limit 3),
    its consumer slow at step 2: every step received (0 to 3) is handed out, reads the
    producer no longer answers and the end of the stream raise "the producer left" at once.

    (The read-ahead thread that met the producer's end of the stream first kept that error
    to itself: the program's own read of step 3 then waited the whole timeout for data that
    never came and raised "the producer does not answer"; and a refresh that took in step
    3's record and the end together raised before handing out step 3.)"""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_ahead", "fails-late", "p", io),
        (1, "transport_ahead", "hands-out", "p", how),
        cwd=tmp_path,
        env=AHEAD,
    )
    assert res.lines("OK hands-out"), res.describe()
    assert len(res.lines("OK fails-late")) == 2, res.describe()
    assert _took(res, "hands-out") < 8, res.describe()  # no timeout (10 s) waited


def test_one_poll_loop_takes_every_message_that_arrived(tmp_path):
    """``poll_bytes`` until it finds nothing takes every message waiting (a consumer's refresh
    took up one record a call: MPICH's Iprobe finds what an earlier call moved)."""
    _skip_without_mpiexec()
    res = mu.run_mpi(2, "transport_ahead", "drain", tmp_path / "sent", timeout=TIMEOUT)
    assert res.lines("OK drain"), res.describe()


def test_steps_seen_on_arrival(tmp_path):
    """iter_steps() with its default polling sees a memory step when its record arrives.

    Steps come every 2 s; a file reader polling with the default growing delay
    (0.05 s up to 1 s) would see them up to ~0.5 s late; the transport wakes
    the waiting consumer when the record arrives.
    """
    _skip_without_mpiexec()
    res = run_mpmd(
        (1, "transport_flow", "slow", "s", 3, 2.0),
        (2, "transport_flow", "punctual", "s", 3),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory"},
    )
    [line] = res.lines("OK punctual:")
    late = [float(t) for t in line.split("late ")[1].split()]
    assert max(late[1:]) < 0.25, res.describe()  # step 0 also waits for the open


#: two programs of transport_flow.py, (ranks, role) each, and what the consumer says at the end
FLOW_PAIRS = {
    # stats=False: blocks travel without statistics; values and queries stay right (no
    # pruning). A derived quantity kept as statistics keeps them (it reached consumers with
    # none at all).
    "no statistics": ((2, "bare"), (1, "bare-read"), "OK bare: 3 steps"),
    # f.at(k) past the steps the consumer ranks agreed on: the derived quantities the producer
    # declared meanwhile are there, as on a file (an expression's values were NaN). The HTML
    # reprs of the file, the view and a dataset say the steps released (they raised
    # StepError once a step was).
    "a step read alone takes up its definitions": (
        (1, "late-derive"),
        (2, "at-read"),
        "OK at-read: 3 steps",
    ),
}


@pytest.mark.parametrize("mode", ["memory", "both"])
@pytest.mark.parametrize("case", FLOW_PAIRS)
def test_flow_pairs(tmp_path, case, mode):
    """Each pair of FLOW_PAIRS, 3 steps, through memory and through memory and a file."""
    _skip_without_mpiexec()
    (np_, producer), (nc, consumer), said = FLOW_PAIRS[case]
    res = run_mpmd(
        (np_, "transport_flow", producer, "s", 3),
        (nc, "transport_flow", consumer, "s", 3),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": mode},
    )
    assert res.lines(said), res.describe()


def test_flow_workflow(tmp_path):
    """Flows from LAMINA_WORKFLOW: one consumer task takes the latest step, another every 3rd."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_flow", "produce", "f", 10),
        (1, "transport_flow", "latest", "f", 10, "-"),
        (1, "transport_flow", "every", "f", 10, 3),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory", "LAMINA_WORKFLOW": "f=0>1:latest,2:3"},
    )
    assert res.lines("OK latest:"), res.describe()
    assert res.lines("OK every 3: [0, 3, 6, 9]"), res.describe()


def test_flow_parse():
    from lamina.workflow.routes import LATEST, parse_flow

    assert parse_flow("all") == 1 and parse_flow("latest") == LATEST and parse_flow(4) == 4
    assert parse_flow("3") == 3 and parse_flow(2**32 - 1) == 2**32 - 1
    # 2**32 does not fit the rendezvous' 32 bits: it was a struct.error there, and the
    # producer waited its whole timeout
    for bad in ("sometimes", 0, -2, True, "0", 2**32, str(2**32)):
        with pytest.raises(ValueError, match="flow must be .* from 1 to 4294967295"):
            parse_flow(bad)
    wf = Workflow.parse("a=0>1:latest,2:5; b=1>2")
    assert wf.route("a") == Route(0, (1, 2))
    assert wf.flow("a", 1) == LATEST and wf.flow("a", 2) == 5 and wf.flow("b", 2) is None
    with pytest.raises(ValueError, match="flow"):
        Workflow.parse("a=0>1:never")


def test_request_before_the_rank_holds_the_step(tmp_path):
    """A consumer asks a producer rank for a step it has not finished committing: it waits for it.

    Consumers get a step's record from one producer rank and ask all of them
    for their blocks at once; on an oversubscribed node a producer rank can
    still be inside the commit.  It used to answer 'not held', and the read
    failed with 'producer rank R no longer holds ...' (seen in lamina bench
    insitu at 6+2 ranks on 2 cores).
    """
    _skip_without_mpiexec()
    res = run_mpmd(
        (3, "transport_late_rank", "produce", "late.lam", 4),
        (2, "transport_late_rank", "consume", "late.lam", 4),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory"},
    )
    assert res.lines("OK late rank")


def test_small_pieces_travel_packed(tmp_path):
    """A read's small pieces come many in one message from each producer rank (cut where a
    message would pass its count of pieces or its bytes), large ones each in their own, in one
    read together: every value as written, big-endian and 0-D too (transport_packed.py)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (2, "transport_packed", "produce", "p", 2),
        (2, "transport_packed", "check", "p", 2),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory"},
    )
    assert res.lines("OK check: 2 steps"), res.describe()


@pytest.mark.parametrize("eager", [0, 1])
def test_statistics_follow_the_record(tmp_path, eager):
    """Producers reduce their blocks after the commit; consumers fetch the statistics when used.

    Reduced when a consumer first asks (the default), or on the worker thread from put on
    (``background_stats=True``).

    3 producer ranks write many small staged blocks (some with NaN), a large
    shallow block and integer blocks; one consumer task follows every step,
    another every 2nd (its steps are numbered differently from the
    producer's).  Every block's statistics equal numpy's and queries prune.
    """
    _skip_without_mpiexec()
    res = run_mpmd(
        (3, "transport_stats", "produce", "s", 5, eager),
        (2, "transport_stats", "check", "s", 5, 1),
        (1, "transport_stats", "check", "s", 5, 2),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory", "LAMINA_WORKFLOW": "s=0>1,2"},
    )
    assert res.lines("OK check every 1: 5 steps"), res.describe()
    assert res.lines("OK check every 2: 3 steps"), res.describe()


@pytest.mark.parametrize(
    "producer,consumer,want",
    [
        # rank 0 defines a dataset while rank 1 ends a step (the end_step met the define's
        # agreement and both ranks went on to collectives of their own: a hang)
        (
            (2, "write-define"),
            (1, "read"),
            {
                "write-define 0": "CollectiveMismatchError",
                "write-define 1": "CollectiveMismatchError",
                "read 0": "OK",
            },
        ),
        # rank 0 closes while rank 1 defines: the same with the close
        (
            (2, "write-close"),
            (1, "read"),
            {
                "write-close 0": "CollectiveMismatchError",
                "write-close 1": "CollectiveMismatchError,RemoteError",
                "read 0": "TransportError",
            },
        ),
        # the ranks a step apart, the error caught and the file closed: rank 0's close hears
        # that rank 1 left, and its consumer hears at once that the producer left (it waited
        # for its timeout: rank 0 did not end its stream after a RemoteError)
        (
            (2, "write-caught"),
            (1, "read"),
            {
                "write-caught 0": "CollectiveMismatchError,RemoteError",
                "write-caught 1": "OK,CollectiveMismatchError",
                "read 0": "TransportError",
            },
        ),
        # a consumer rank closes while the other waits for the next step (it waited for ever)
        (
            (1, "write-slow"),
            (2, "read-close"),
            {
                "write-slow 0": "OK",
                "read-close 0": "CollectiveMismatchError,RemoteError",
                "read-close 1": "OK,CollectiveMismatchError",
            },
        ),
    ],
    ids=["define-vs-end_step", "close-vs-define", "caught-and-closed", "consumer-close-vs-wait"],
)
def test_ranks_of_one_side_in_different_collective_calls_raise_not_hang(
    tmp_path, producer, consumer, want
):
    """In situ (memory), the ranks of one program in different collective calls: every rank
    raises CollectiveMismatchError (as on files) within a second or two, where the producer's
    end_step and close and the consumer's close met any other call and waited for ever; the
    other side hears at once, not after its timeout (20 s here)."""
    _skip_without_mpiexec()
    res = run_mpmd(
        (producer[0], "transport_mismatch", producer[1], "s.lam"),
        (consumer[0], "transport_mismatch", consumer[1], "s.lam"),
        cwd=tmp_path,
        env={"LAMINA_TRANSPORT": "memory"},
        expect_ok="RESULT",
    )
    got = {}
    for line in res.lines("RESULT"):
        role, rank, what, seconds = line.split()
        got[f"{role} {rank}"] = what
        assert float(seconds) < 10, res.describe()
    assert got == want, res.describe()


def test_transfers_look_at_the_oldest_requests_each_time(monkeypatch):
    """A read of thousands of small blocks puts thousands of requests in flight and finishes a
    few a call: each call of Transfers.test looks at the oldest WINDOW only (every one was
    passed to Testsome each time: 4,000 one-element blocks took 14 s, 16,000 minutes), and
    every request finishes, with its byte count."""
    from lamina.engines.transport import wire

    comm = wire.MPI.COMM_SELF
    n = 5 * wire.WINDOW + 3
    bufs = [np.full(k % 7 + 1, -1, np.int64) for k in range(n)]
    xfer = wire.Transfers()
    for k, b in enumerate(bufs):
        xfer.recv(comm, [b, wire.MPI.INT64_T], None, 0, k)
    seen: list[int] = []
    real = wire.MPI

    class Request:
        @staticmethod
        def Testsome(reqs, statuses):
            seen.append(len(reqs))
            return real.Request.Testsome(reqs, statuses)

    class Seen:  # MPI, with Testsome counted (mpi4py's types take no attribute)
        def __getattr__(self, name):
            return Request if name == "Request" else getattr(real, name)

    monkeypatch.setattr(wire, "MPI", Seen())
    for k in reversed(range(n)):  # the newest answered first: found once the window reaches it
        xfer.send(comm, [np.full(k % 7 + 1, k, np.int64), wire.MPI.INT64_T], None, 0, k)
    while len(xfer):
        xfer.test()
    assert max(seen) <= wire.WINDOW and len(seen) >= 2 * n // wire.WINDOW
    assert all((b == k).all() for k, b in enumerate(bufs))
    assert xfer.counts[:n] == [(k % 7 + 1) * 8 for k in range(n)]  # (the receives')
