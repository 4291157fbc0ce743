"""Crash tests: SIGKILL a writer during step k; steps < k read back intact, and append goes on.

The writer (``scenarios/crash_writer.py``) runs as a separate process (plain
python, or a 2-rank mpiexec job), stops at a chosen point of step k -- in
the middle of its puts, or at each point of the commit protocol -- and
signals; the test then kills it with SIGKILL (every process of the job, by
pid) and checks the file here, in-process:

- exactly the committed steps exist and every value of every one of them
  reads back;
- append mode ('a') continues at the next step, and the result is readable.

A second kind kills a writer of many small steps at random moments, several
times in a row on the same file (each time appending), and checks that the
file is always readable with a prefix of the steps.
"""

from __future__ import annotations

import os
import random
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios"))

import mpi_util as mu  # noqa: E402

pytest.importorskip("mpi4py")

# the writer's datasets and values (kept in step with scenarios/crash_writer.py)
from crash_writer import DATASETS, expected, my_boxes  # noqa: E402

import lamina  # noqa: E402
from lamina.errors import StepError  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _have_mpiexec() -> bool:
    try:
        mu.mpiexec()
    except RuntimeError:
        return False
    return True


needs_mpiexec = pytest.mark.skipif(not _have_mpiexec(), reason="no mpiexec")


def _writer_cmd(nranks: int, *args) -> list[str]:
    if nranks == 1:
        return mu.python_command("crash_writer", *args)
    return mu.mpi_command(nranks, "crash_writer", *args)


def _wait_signal(proc, signal_path: str, ranks, timeout: float = 30) -> None:
    """Wait until every rank in *ranks* created its signal file; kill the writer on failure."""
    try:
        _wait_signal_or_fail(proc, signal_path, ranks, timeout)
    except BaseException:
        if proc.poll() is None:
            mu.kill_tree(proc)
            proc.communicate()
        raise


def _wait_signal_or_fail(proc, signal_path: str, ranks, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if all(os.path.exists(f"{signal_path}.{r}") for r in ranks):
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"the writer exited ({proc.returncode}) before signalling:\n{out}\n{err}"
            )
        if time.monotonic() > deadline:
            mu.kill_tree(proc)
            out, err = proc.communicate()
            raise AssertionError(f"no signal from the writer after {timeout} s:\n{out}\n{err}")
        time.sleep(0.01)


def _kill(proc) -> tuple[str, str]:
    """SIGKILL the writer (every process of it); it must still have been running."""
    alive = proc.poll() is None
    mu.kill_tree(proc)
    out, err = proc.communicate(timeout=30)
    assert alive, (
        f"the writer was not running any more when it was to be killed (exit {proc.returncode}):\n{out}\n{err}"
    )
    return out, err


def check_file(path: str, nsteps: int, closed: bool | None = None) -> None:
    """Exactly *nsteps* committed steps, every value intact."""
    with lamina.open(path, "r") as f:
        assert f.steps == nsteps, f"{f.steps} steps, expected {nsteps}"
        if closed is not None:
            assert f.engine.writer_closed is closed
        for k in range(nsteps):
            view = f.at(k)
            for name in DATASETS:
                np.testing.assert_array_equal(
                    view[name][...], expected(name, k), err_msg=f"{name} step {k}"
                )
                cover = view[name].coverage()
                assert sum(b.size for b in cover) == int(np.prod(DATASETS[name][0])), cover
        with pytest.raises(StepError):
            f.at(nsteps)


def append_and_check(path: str, k: int, extra: int = 2, nranks_before: int = 1) -> None:
    """Append *extra* steps (one rank, here) after the *k* committed ones; read everything back."""
    with lamina.open(path, "a") as f:
        assert f.steps == k, f"append opened with {f.steps} steps, expected {k}"
        for name in DATASETS:
            assert name in f
        for i in range(extra):
            with f.step() as s:
                assert s == k + i
                for name in DATASETS:
                    f[name][...] = expected(name, s)
    check_file(path, k + extra, closed=True)


def crash_at(
    tmp_path,
    phase: str,
    k: int,
    nranks: int = 1,
    aggregators: int | None = None,
    signal_ranks=(0,),
    io: str = "sync",
) -> str:
    path = str(tmp_path / "crash.lam")
    sig = str(tmp_path / "signal")
    args = [path, "--mode", "w", "--phase", phase, "--at", k, "--signal", sig, "--io", io]
    if aggregators:
        args += ["--aggregators", aggregators]
    proc = mu.start(_writer_cmd(nranks, *args))
    _wait_signal(proc, sig, signal_ranks)
    _kill(proc)
    return path


# phase -> steps committed when the writer dies at that phase of step k
PHASES = {
    "midstep": 0,
    "before_meta": 0,
    "torn_meta": 0,
    "before_commit": 0,
    "torn_commit": 0,
    "garbled_commit": 0,
    "after_commit": 1,
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_kill_one_rank_writer(tmp_path, phase):
    """SIGKILL a one-rank writer at *phase* of step 3: steps 0..2 (plus 3 if committed) survive."""
    k = 3
    path = crash_at(tmp_path, phase, k)
    committed = k + PHASES[phase]
    check_file(path, committed, closed=False)
    append_and_check(path, committed)


@pytest.mark.parametrize(
    "phase,aggregators", [("midstep", 1), ("midstep", 2), ("before_commit", 1), ("after_commit", 2)]
)
def test_kill_two_rank_writer(tmp_path, phase, aggregators):
    """The same with a 2-rank mpiexec writer (every process of the job is killed)."""
    k = 2
    ranks = (0, 1) if phase == "midstep" else (0,)
    path = crash_at(tmp_path, phase, k, nranks=2, aggregators=aggregators, signal_ranks=ranks)
    committed = k + PHASES[phase]
    check_file(path, committed, closed=False)
    append_and_check(path, committed)
    # and a 2-rank append after that, through the writer script's own loop (killed again)
    sig = str(tmp_path / "signal2")
    proc = mu.start(_writer_cmd(2, path, "--mode", "a", "--phase", "loop", "--signal", sig))
    _wait_signal(proc, sig, (0, 1))
    time.sleep(0.3)
    out, err = _kill(proc)
    _check_prefix(path, committed + 2, sig, err)


@pytest.mark.parametrize(
    "phase,nranks",
    [("before_meta", 1), ("before_commit", 1), ("after_commit", 1), ("before_commit", 2)],
)
def test_kill_async_writer(tmp_path, phase, nranks):
    """io='async': killed while its background thread is in the commit of step k and steps k+1,
    k+2 wait behind it; every step committed before the kill reads back, the rest is gone."""
    k = 2
    path = crash_at(tmp_path, phase, k, nranks=nranks, io="async")
    committed = k + PHASES[phase]
    check_file(path, committed, closed=False)
    append_and_check(path, committed)


def _progress(sig: str) -> list[str]:
    with open(sig + ".progress") as fh:
        return fh.read().splitlines()


def _check_prefix(path: str, start: int, sig: str, err: str) -> int:
    """After killing a 'loop' writer that started at *start*: steps are a prefix, all intact."""
    lines = _progress(sig)
    assert lines and lines[0] == f"start {start}", (
        f"writer progress {lines[:3]}, expected start {start}"
    )
    printed = [int(line.split()[1]) for line in lines if line.startswith("committed ")]
    lower = printed[-1] if printed else start
    with lamina.open(path, "r") as f:
        n = f.steps
    # the writer may have committed one more step than it managed to print
    assert lower <= n <= lower + 1, (
        f"file has {n} steps, writer printed {printed[-3:]} (start {start})\n{err}"
    )
    check_file(path, n, closed=False)
    return n


def test_append_after_a_writer_killed_while_creating(tmp_path):
    """A writer killed between making the commit log and writing its header leaves a log of
    no bytes: nothing was committed, so 'a' starts the file afresh (it refused it as not a
    lamina file)."""
    path = str(tmp_path / "c.lam")
    with lamina.open(path, "w"):
        pass
    for name in os.listdir(path):
        if name.startswith("data."):
            os.unlink(os.path.join(path, name))
    with open(os.path.join(path, "lamina.commit"), "r+b") as fh:
        fh.truncate(0)
    with open(os.path.join(path, "lamina.meta"), "r+b") as fh:
        fh.truncate(32)  # its header alone
    with lamina.open(path, "a") as f:
        d = f.create_dataset("x", (3,), "f4")
        with f.step():
            d[...] = 1
    with lamina.open(path) as f:
        assert f.steps == 1 and f["x"][...].tolist() == [1.0, 1.0, 1.0]


def test_truncated_commit_tail_by_hand(tmp_path):
    """Kill during the commit, simulated on the bytes: a partial or garbled last commit entry is no commit."""
    path = str(tmp_path / "t.lam")
    with lamina.open(path, "w") as f:
        for name, (shape, dtype, fill) in DATASETS.items():
            f.create_dataset(name, shape, dtype, fill=fill)
        for k in range(4):
            with f.step():
                for name in DATASETS:
                    f[name][...] = expected(name, k)
    commit = os.path.join(path, "lamina.commit")
    size = os.path.getsize(commit)
    # the last entry is the close record; drop it and the one of step 3 to simulate kills
    entry = 32
    with open(commit, "r+b") as fh:
        fh.truncate(size - entry)  # close record not committed
    check_file(path, 4, closed=False)
    with open(commit, "r+b") as fh:
        fh.truncate(size - entry - 10)  # step 3's entry torn (22 of 32 bytes)
    check_file(path, 3, closed=False)
    with open(commit, "r+b") as fh:
        fh.seek(size - 2 * entry)
        fh.write(b"\0" * entry)  # step 3's entry all zeros (extended, never written)
    check_file(path, 3, closed=False)
    append_and_check(path, 3)


@pytest.mark.slow
def test_random_kills_many_small_steps(tmp_path):
    """Kill a writer of many small steps at random moments, 8 times, appending each time."""
    rnd = random.Random(20240611)
    path = str(tmp_path / "loop.lam")
    n = 0
    for i in range(8):
        sig = str(tmp_path / f"sig{i}")
        args = [
            path,
            "--mode",
            "w" if i == 0 else "a",
            "--phase",
            "loop",
            "--signal",
            sig,
            "--durable",
            i % 2,
        ]
        proc = mu.start(_writer_cmd(1, *args))
        _wait_signal(proc, sig, (0,))
        time.sleep(rnd.uniform(0.0, 0.3))
        out, err = _kill(proc)
        n = _check_prefix(path, n, sig, err)
    assert n > 0
    append_and_check(path, n, extra=1)


@needs_mpiexec
def test_random_kills_two_ranks(tmp_path):
    """The same with a 2-rank mpiexec writer, 3 times."""
    rnd = random.Random(7)
    path = str(tmp_path / "loop2.lam")
    n = 0
    for i in range(3):
        sig = str(tmp_path / f"sig{i}")
        args = [
            path,
            "--mode",
            "w" if i == 0 else "a",
            "--phase",
            "loop",
            "--signal",
            sig,
            "--aggregators",
            1 + i % 2,
        ]
        proc = mu.start(_writer_cmd(2, *args))
        _wait_signal(proc, sig, (0, 1))
        time.sleep(rnd.uniform(0.05, 0.4))
        out, err = _kill(proc)
        n = _check_prefix(path, n, sig, err)
    append_and_check(path, n, extra=1)


def test_follower_of_a_killed_writer(tmp_path):
    """A reader following a writer that is killed sees intact steps, then times out (no hang, no error)."""
    from lamina.errors import StepTimeoutError

    path = str(tmp_path / "f.lam")
    sig = str(tmp_path / "sig")
    proc = mu.start(
        _writer_cmd(1, path, "--mode", "w", "--phase", "loop", "--signal", sig, "--durable", 0)
    )
    _wait_signal(proc, sig, (0,))
    seen = 0
    try:
        with lamina.open(path, "r") as f:
            with pytest.raises(StepTimeoutError):
                for view in f.iter_steps(timeout=1.5, poll=0.01):
                    assert view.index == seen
                    for name in DATASETS:
                        np.testing.assert_array_equal(view[name][...], expected(name, view.index))
                    seen += 1
                    if seen == 5:
                        _kill(proc)
            assert f.steps >= 5
            assert not f.engine.writer_closed
    finally:
        if proc.poll() is None:
            mu.kill_tree(proc)
            proc.communicate()
    assert seen >= 5
    check_file(path, seen, closed=False)


def test_my_boxes_tile_the_datasets():
    """The crash writer's decomposition covers each dataset exactly (so a full read checks every value)."""
    for name, (shape, _, _) in DATASETS.items():
        for size in (1, 2, 3):
            for step in range(5):
                cells = sum(my_boxes(name, step, r, size).size for r in range(size))
                assert cells == int(np.prod(shape))
