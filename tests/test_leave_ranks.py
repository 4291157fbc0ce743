"""Leaving ``with lamina.open(...)`` by an exception on several ranks.

Ctrl-C: every rank ends within a few seconds (``tests/scenarios/interrupt.py``), with
``-m mpi4py`` and without.  An error on every rank: the file is closed as one rank closes it
(``tests/scenarios/all_fail.py``)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

pytest.importorskip("mpi4py")

try:
    mu.mpiexec()
except RuntimeError:  # pragma: no cover - depends on the installation
    pytest.skip("no mpiexec", allow_module_level=True)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("io", ["sync", "async"])
@pytest.mark.parametrize("n", [2, 3])
def test_ctrl_c_while_a_rank_waits_in_end_step(tmp_path, n, io):
    """SIGINT on every rank while rank 0 waits in end_step: each leaves within seconds."""
    res = mu.run_mpi(n, "interrupt", "ctrlc", io, tmp_path / "c.lam", timeout=90)
    assert res.stdout.count(" out after ") == n, res.describe()


@pytest.mark.parametrize("io, n", [("sync", 2), ("async", 2), ("sync", 3)])
def test_an_interrupt_between_an_agreements_two_phases(tmp_path, n, io):
    """A KeyboardInterrupt raised just after an agreement's allreduce completed: the rank
    still takes its part in the rest, and raises it; nobody waits for it."""
    res = mu.run_mpi(n, "interrupt", "cut", io, tmp_path / "c.lam", timeout=90)
    assert res.stdout.count(" out after ") == n, res.describe()


def test_held_interrupts_raise_the_first_at_the_end_and_a_second_at_once():
    import os
    import signal

    import lamina
    from lamina import comm as comm_mod

    done = []
    with pytest.raises(KeyboardInterrupt):
        with comm_mod.HeldInterrupts():
            os.kill(os.getpid(), signal.SIGINT)
            done.append(1)  # (the protocol goes on)
    assert done == [1] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        with comm_mod.HeldInterrupts():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the user insists: raised here
            done.append(2)
    assert done == [1]
    err = lamina.RemoteError("rank 1 left")
    err.lamina_left = True
    with pytest.raises(KeyboardInterrupt) as ei:
        with comm_mod.HeldInterrupts():
            os.kill(os.getpid(), signal.SIGINT)
            raise err
    assert ei.value.lamina_left and ei.value.__cause__ is err
    with pytest.raises(KeyboardInterrupt):  # nested (end_step, then its commit): one holds
        with comm_mod.HeldInterrupts(), comm_mod.HeldInterrupts():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            done.append(3)
    assert done == [1]
    with comm_mod.HeldInterrupts():  # nothing held: nothing raised
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("n", [2, 3])
def test_ctrl_c_inside_a_commit_is_raised_once_it_is_done(tmp_path, n):
    """SIGINT on one rank just before the heads' allgather of end_step's commit: it raised at
    once and the others waited in the allgather for ever; now the step is committed, then
    that rank raises, and the others hear at their next end_step that it left."""
    res = mu.run_mpi(n, "interrupt", "in-commit", "sync", tmp_path / "c.lam", timeout=90)
    assert res.stdout.count(" out after ") == n, res.describe()
    assert res.stdout.count("(told)") == n - 1, res.describe()


@pytest.mark.parametrize("io", ["sync", "async"])
def test_ctrl_c_without_mpi4py_main_ends_the_job(tmp_path, io):
    """The KeyboardInterrupt not caught, under plain ``python`` (no MPI_Abort): each rank
    exits by itself, none is left waiting (one waited for ever in a broadcast)."""
    cmd = [mu.mpiexec(), "-n", "2", sys.executable, mu.scenario("interrupt")]
    cmd += ["uncaught", io, str(tmp_path / "u.lam")]
    res = mu.finish(mu.start(cmd), cmd, 60)
    assert res.returncode not in (0, -9999), res.describe()
    assert res.stderr.count("KeyboardInterrupt") >= 2, res.describe()
    assert res.seconds < 20, res.describe()


@pytest.mark.parametrize("io, n", [("sync", 1), ("sync", 2), ("sync", 3), ("async", 2)])
def test_an_error_on_every_rank_closes_the_file(tmp_path, io, n):
    """The datasets and attributes defined before the error are committed by the close, and
    the file is closed, on one rank as on several (there each rank left the file); the
    error between steps, inside one, after writes that opened one, of different classes
    (one launch, a file each)."""
    cases = ["between", "in-step", "implicit", "mixed"]
    res = mu.run_mpi(n, "all_fail", ",".join(cases), io, tmp_path / "a.lam", timeout=120)
    done = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("OK ")]
    assert done == cases, res.describe()


def test_a_reader_that_leaves_after_its_error_lets_its_read_ahead_go(tmp_path):
    """A rank of an io="async" reader that leaves the file after an error of its own stops
    its read-ahead thread and drops what it read ahead, as the others do (it kept both)."""
    res = mu.run_mpi(2, "reader_leaves", tmp_path / "r.lam", timeout=120)
    assert sorted(res.stdout.split()) == ["0", "1", "OK", "OK"], res.describe()
