"""Killed peers of the in situ transport: a rank dies by SIGKILL; the other side gets TransportError, never a hang.

Each test launches a producer program and a consumer program
(``scenarios/transport_kill.py``) in one MPMD launch in which one rank
SIGKILLs itself in the middle of the run, and judges the reports the
surviving ranks write (what each call did, when, which error):

- a consumer rank dies after reading step 1 (``memory``): every producer
  rank gets TransportError from ``end_step`` of step 2 (the queue is full
  with step 1 never released) within the timeout after the death, and its
  ``close`` ends within the timeout too;
- the same under ``both``: the native file the producers wrote holds every
  step they committed (the step whose ``end_step`` raised included: the file
  commits before the transport serves), values intact, and its close record;
- a producer rank dies after writing step 1 (``memory``): consumer ranks get
  TransportError reading step 1 (blocks of the dead rank), from
  ``f.at(2)`` and from ``wait_for_step(2, timeout=None)``.

Such a launch needs care (see ``mpi_util.survivable`` and ``mpi_util.watch``):
hydra kills every rank when one is killed by a signal unless each rank runs
under a shell; the survivors cannot finish ``MPI_Finalize`` (it waits for the
dead rank), so they leave with ``os._exit`` after writing their reports; and
a rank stuck in a collective of its own program (whose other rank died) is
told to leave by the test, through a file, once the reports that matter are
in.  MPICH reports nothing about the dead peer (no error from sends,
receives or probes on the intercommunicator): the transport's timeouts are
what notice it.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios"))

import mpi_util as mu  # noqa: E402

pytest.importorskip("mpi4py")

from transport_kill import FILL, SHAPE, expected  # noqa: E402

import lamina  # noqa: E402
from lamina.errors import StepError  # noqa: E402

pytestmark = pytest.mark.timeout(180)

TIMEOUT = 3.0  # LAMINA_TRANSPORT_TIMEOUT of the launches
MARGIN = 10.0  # scheduling on a loaded machine: an error must come within TIMEOUT + MARGIN
REPORTS_WITHIN = 90.0  # seconds from the launch until the reports that matter are in
ENDS_WITHIN = 20.0  # seconds from asking every program to leave until the launch has ended
NAME = "kill.lam"


def _skip_without_mpiexec():
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        pytest.skip("no mpiexec")


def command(*programs) -> list[str]:
    """One MPMD launch that survives a killed rank: ``(n, role, *args)`` per program."""
    cmd = [mu.mpiexec(), *mu.KEEP_GOING]
    for i, (n, *args) in enumerate(programs):
        if i:
            cmd.append(":")
        rank = [sys.executable, "-m", "mpi4py", mu.scenario("transport_kill"), *map(str, args)]
        cmd += ["-n", str(n), *mu.survivable(rank)]
    return cmd


class Launch:
    """A finished launch: its result, the reports of the surviving ranks, the death markers."""

    def __init__(self, res: mu.Result, folder, asked_at: float | None):
        self.res = res
        self.asked_at = asked_at  # monotonic seconds since the launch when DIR/finish was made
        self.reports = {}
        self.deaths = {}
        for name in os.listdir(folder):
            if not name.endswith(".json"):
                continue
            with open(os.path.join(folder, name)) as fh:
                data = json.load(fh)
            if name.startswith("died."):
                _, role, rank, _ = name.split(".")
                self.deaths[(role, int(rank))] = data
            else:
                role, rank, _ = name.split(".")
                self.reports[(role, int(rank))] = data

    def describe(self) -> str:
        return f"{self.res.describe()}\n--- reports ---\n{json.dumps(self.reports, indent=1)[-8000:]}\n--- deaths ---\n{self.deaths}"

    def report(self, role: str, rank: int) -> dict:
        rep = self.reports.get((role, rank))
        assert rep is not None, f"no report from {role} rank {rank}\n{self.describe()}"
        return rep

    def death(self, role: str, rank: int) -> float:
        d = self.deaths.get((role, rank))
        assert d is not None, f"{role} rank {rank} did not die\n{self.describe()}"
        return float(d["t"])


def launch(tmp_path, mode: str, programs, need) -> Launch:
    """Run *programs*; once the reports in *need* (``(role, rank)``) are in, ask every program to leave.

    The launch must then end within ENDS_WITHIN seconds (no rank hangs).
    """
    folder = tmp_path / "reports"
    folder.mkdir()
    args = [(n, role, NAME, steps, folder, *extra) for n, role, steps, *extra in programs]
    cmd = command(*args)
    env = {"LAMINA_TRANSPORT": mode, "LAMINA_TRANSPORT_TIMEOUT": TIMEOUT}
    t0 = time.monotonic()
    asked = []

    def tick():
        if asked:
            return
        have = all((folder / f"{role}.{rank}.json").exists() for role, rank in need)
        if have or time.monotonic() - t0 > REPORTS_WITHIN:
            (folder / "finish").write_text("leave\n")
            asked.append(time.monotonic() - t0)

    proc = mu.start(cmd, env=env, cwd=str(tmp_path))
    res = mu.watch(proc, cmd, REPORTS_WITHIN + ENDS_WITHIN + 30, t0, tick=tick)
    run = Launch(res, folder, asked[0] if asked else None)
    assert res.returncode != -9999, f"the launch hung\n{run.describe()}"
    if run.asked_at is not None:
        assert res.seconds - run.asked_at < ENDS_WITHIN, (
            f"the launch did not end when asked\n{run.describe()}"
        )
    for role, rank in need:
        run.report(role, rank)
    return run


def events(rep: dict) -> dict:
    return {e["what"]: e for e in rep["events"]}


def assert_ok(run: Launch, rep: dict, *whats: str) -> None:
    ev = events(rep)
    for what in whats:
        assert what in ev and ev[what]["error"] is None, (
            f"{rep['role']} {rep['rank']}: {what}\n{run.describe()}"
        )


def assert_transport_error(
    run: Launch, rep: dict, what: str, after: float, waits: int = 1
) -> float:
    """*what* raised TransportError within *waits* timeouts (+ margin) of *after* (a time, or the call's start)."""
    ev = events(rep).get(what)
    who = f"{rep['role']} rank {rep['rank']}: {what}"
    assert ev is not None, f"{who} never ran (stuck in {rep['stuck_in']!r})\n{run.describe()}"
    assert ev["error"] is not None, f"{who} succeeded; expected TransportError\n{run.describe()}"
    assert ev["transport"], (
        f"{who} raised {ev['error']}, not TransportError: {ev['message']}\n{ev['trace']}"
    )
    took = ev["t1"] - max(ev["t0"], after)
    assert took <= waits * TIMEOUT + MARGIN, (
        f"{who}: TransportError only after {took:.1f} s\n{run.describe()}"
    )
    assert ev["t1"] >= after, f"{who}: TransportError before the death\n{run.describe()}"
    return took


def assert_ends(run: Launch, rep: dict, what: str, allowed=("TransportError",)) -> None:
    """*what* ran and ended (well, or with one of *allowed*) within one timeout + margin."""
    ev = events(rep).get(what)
    who = f"{rep['role']} rank {rep['rank']}: {what}"
    assert ev is not None, f"{who} never ended (stuck in {rep['stuck_in']!r})\n{run.describe()}"
    assert ev["error"] in (None, *allowed), (
        f"{who} raised {ev['error']}: {ev['message']}\n{ev.get('trace')}"
    )
    assert ev["t1"] - ev["t0"] <= TIMEOUT + MARGIN, (
        f"{who} took {ev['t1'] - ev['t0']:.1f} s\n{run.describe()}"
    )


def check_producers_after_consumer_death(run: Launch, nproducers: int, died: float) -> None:
    """Every producer rank committed steps 0..2; end_step of step 2 raised; close ended; no rank hung."""
    for r in range(nproducers):
        rep = run.report("producer", r)
        assert rep["stuck_in"] is None, (
            f"producer rank {r} stuck in {rep['stuck_in']}\n{run.describe()}"
        )
        assert_ok(run, rep, "open", "step 0", "step 1")
        # step 1 is never released by the dead rank: with queue_limit 2, step 2 commits, then waits
        assert_transport_error(run, rep, "step 2", died)
        assert rep["steps"] == 3, f"producer rank {r} counts {rep['steps']} steps\n{run.describe()}"
        assert "step 3" not in events(rep)
        assert_ends(run, rep, "close")


# ----------------------------------------------------------------- the tests


def test_killed_consumer_memory(tmp_path):
    """2 producers, 2 consumers; consumer rank 1 SIGKILLs itself after reading step 1.

    Every producer rank gets TransportError from end_step within the timeout
    of the death (the live consumer rank keeps reading meanwhile: requests
    from one rank do not hide the silence of another), and close ends too.
    """
    _skip_without_mpiexec()
    run = launch(
        tmp_path,
        "memory",
        [(2, "produce", 6), (2, "consume", 6, "--die-rank", 1, "--die-after", 1)],
        need=[("producer", 0), ("producer", 1)],
    )
    died = run.death("consumer", 1)
    check_producers_after_consumer_death(run, 2, died)
    # the surviving consumer rank read every step the producers made, then learnt that no
    # more come (the producers' timeout and its own race: TransportError or StepError);
    # its close is a collective of its own program, whose other rank is dead
    live = run.report("consumer", 0)
    assert_ok(run, live, "open", "at 0", "read 0", "at 1", "read 1", "at 2", "read 2")
    ev = events(live).get("at 3")
    assert ev is not None and ev["error"] in ("TransportError", "StepError"), run.describe()
    assert not (tmp_path / NAME).exists()


def test_killed_consumer_both(tmp_path):
    """``both``: a consumer dies after reading step 1; the file holds every committed step, closed.

    The producers get TransportError from end_step of step 2 after it was
    committed to the file, close (the file's close record first, then the
    transport, which raises after the timeout), and the file reads back here,
    in-process: exactly the producers' step count, every value, complete coverage.
    """
    _skip_without_mpiexec()
    run = launch(
        tmp_path,
        "both",
        [(2, "produce", 6), (1, "consume", 6, "--die-rank", 0, "--die-after", 1)],
        need=[("producer", 0), ("producer", 1)],
    )
    died = run.death("consumer", 0)
    check_producers_after_consumer_death(run, 2, died)
    steps = run.report("producer", 0)["steps"]
    with lamina.open(tmp_path / NAME, "r") as f:
        assert f.steps == steps, run.describe()
        assert f.engine.writer_closed, "the file has no close record"
        assert f.attrs["run"] == "kill"
        for k in range(steps):
            view = f.at(k)
            np.testing.assert_array_equal(view["x"][...], expected(k), err_msg=f"step {k}")
            cover = view["x"].coverage()
            assert sum(b.size for b in cover) == SHAPE[0] * SHAPE[1], cover
            assert view["x"][...].min() != FILL
        with pytest.raises(StepError):
            f.at(steps)


def test_killed_producer_memory(tmp_path):
    """2 producers, 2 consumers; producer rank 1 SIGKILLs itself after writing step 1.

    Every consumer rank gets TransportError reading step 1 (half of it is on
    the dead rank), waiting for step 2 with ``f.at(2)`` (independent) and with
    ``wait_for_step(2, timeout=None)`` (collective: only the transport's
    timeout ends it); its close then ends.  The surviving producer rank is
    left in a collective of its own program (its other rank is dead) until
    the test asks it to leave.
    """
    _skip_without_mpiexec()
    run = launch(
        tmp_path,
        "memory",
        [
            (2, "produce", 6, "--die-rank", 1, "--die-after", 1),
            (2, "consume", 6, "--die-after", 1, "--await-death", "--collective-wait"),
        ],
        need=[("consumer", 0), ("consumer", 1)],
    )
    died = run.death("producer", 1)
    for r in range(2):
        rep = run.report("consumer", r)
        assert rep["stuck_in"] is None, (
            f"consumer rank {r} stuck in {rep['stuck_in']}\n{run.describe()}"
        )
        assert_ok(run, rep, "open", "at 0", "read 0", "at 1", "await death")
        assert_transport_error(run, rep, "read 1", died)
        # at(2) sends a release (its wait has a timeout), then waits for the record: two timeouts at most
        assert_transport_error(run, rep, "at 2", died, waits=2)
        assert_transport_error(run, rep, "wait_for_step 2", died)
        assert rep["steps"] == 2
        assert_ends(run, rep, "close")
    prod = run.report("producer", 0)
    assert_ok(run, prod, "open", "step 0", "step 1")
    # step 2 waits for the dead rank in the commit's barrier: a TransportError or still there
    ev = events(prod).get("step 2")
    assert (ev is None and prod["stuck_in"] == "step 2") or (
        ev and ev["error"] == "TransportError"
    ), run.describe()
