"""MPI scenarios: the scripts of ``tests/scenarios`` under ``mpiexec`` with a timeout.

Each scenario checks every value it reads against values that encode the
global index and the step (``_common.values``), and prints ``OK ...`` from
rank 0 when every rank passed; an exception on any rank aborts the job
(``python -m mpi4py``), and a hang is killed by the timeout.

- round trip: n = 1..4 writer ranks, uneven random 1-D, 2-D and 3-D
  decompositions (some ranks with nothing to write, some with two blocks,
  holes that must read as the fill value), float32 / int64 / complex128 /
  bool (and a compressed int64, and a float64 dataset whose blocks span
  several checksum segments), aggregators 1, 2 and n, and the memory
  engine; read back by a different number of ranks with a different
  decomposition;
- many steps; append with different rank counts (and a dataset added in
  an append session); a reader following a live writer (two jobs at once);
- overlapping boxes from two ranks: OverlapError on every rank, earlier
  steps intact, the writer goes on;
- a file whose last step lost its data, opened and appended to by 2 and 3
  ranks: every rank sees the intact steps alike.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpi_util as mu  # noqa: E402

pytest.importorskip("mpi4py")

try:
    mu.mpiexec()
except RuntimeError:  # pragma: no cover - depends on the installation
    pytest.skip("no mpiexec", allow_module_level=True)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("n, m", [(2, 3), (3, 1)])
def test_many_blocks_n_to_m(tmp_path, n, m):
    """Thousands of small blocks per rank per step, shuffled, one aggregator and one per rank,
    read back by another rank count: rows across writers, odd boxes, one block, the block
    list, statistics and a query."""
    res = mu.run_mpi(n, "many_blocks", "write", tmp_path, timeout=120)
    assert "OK write" in res.stdout
    res = mu.run_mpi(m, "many_blocks", "read", tmp_path, n, timeout=120)
    assert f"OK read: {m} ranks, {n} writers" in res.stdout


@pytest.mark.parametrize("m", [2, 3])
def test_ranks_open_the_intact_steps_alike(tmp_path, m):
    """A file whose last step lost its data: rank 0 keeps the steps before it, and the other
    ranks, which decode the records while rank 0 checks them, drop that step and the dataset
    it created; appending on every rank goes on after the intact steps."""
    path = tmp_path / "cut.lam"
    assert "OK write" in mu.run_mpi(1, "open_cut", "write", path).stdout
    assert "steps 0-1 alike" in mu.run_mpi(m, "open_cut", "read", path).stdout
    assert "OK append" in mu.run_mpi(m, "open_cut", "append", path).stdout


# writer ranks -> (reader ranks, aggregator counts written)
ROUNDTRIP = {1: (3, "1"), 2: (4, "1,n"), 3: (2, "1,2,n"), 4: (1, "1,2,n")}
#: pieces sent to an aggregator (bytes) in these runs: blocks go as many pieces, two in flight
MSG_CHUNK = {2: 1 << 16, 3: 12_345}


@pytest.mark.parametrize("n", sorted(ROUNDTRIP))
def test_roundtrip_n_to_m(tmp_path, n):
    """Write with n ranks (uneven decompositions, every aggregator count), read with m != n."""
    m, aggs = ROUNDTRIP[n]
    hist = f"{n}:{100 + n}:3"
    chunk = ["--msg-chunk", MSG_CHUNK[n]] if n in MSG_CHUNK else []
    mu.run_mpi(
        n,
        "roundtrip",
        "write",
        tmp_path,
        "--history",
        hist,
        "--aggregators",
        aggs,
        "--big",
        "--memory",
        *chunk,
        timeout=90,
    )
    res = mu.run_mpi(
        m,
        "roundtrip",
        "read",
        tmp_path,
        "--history",
        hist,
        "--aggregators",
        aggs,
        "--big",
        "--rseed",
        7 * n,
        timeout=90,
    )
    assert "values compared" in res.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_differing_arguments_name_the_ranks(tmp_path, n):
    """create_dataset and open with other arguments on the last rank: every rank's
    CollectiveMismatchError says which ranks made which call (each said its own)."""
    res = mu.run_mpi(n, "open_args", "define-args", tmp_path / "d.lam", timeout=60)
    assert res.stdout.count("OK define-args") == n, res.stdout


@pytest.mark.parametrize("case", ["engine-env", "engine-arg", "transport-env", "layers-arg"])
def test_another_engine_on_one_rank_fails_the_open_everywhere(tmp_path, case):
    """Rank 1 alone chooses another engine ($LAMINA_ENGINE, engine=, $LAMINA_TRANSPORT) or
    other layers: every rank raises CollectiveMismatchError at the open naming what differs
    (the ranks waited forever in the engines' first collective calls)."""
    res = mu.run_mpi(2, "open_args", case, tmp_path / "a.lam", timeout=60)
    assert res.stdout.count(f"OK {case}") == 2, res.stdout + res.stderr


def test_one_step_named_two_ways_is_one_collective_read(tmp_path):
    """Step -1 on one rank and the last step's number on another are the same step (it was
    refused as a collective read of different steps)."""
    res = mu.run_mpi(2, "open_args", "collective-step", tmp_path / "s.lam", timeout=60)
    assert res.stdout.count("OK collective-step") == 2, res.stdout


@pytest.mark.slow
def test_many_steps(tmp_path):
    """60 steps (a different uneven decomposition each), 3 writers, 2 readers."""
    hist = "3:4242:60"
    names = "d1/i64,d2/f32,d3/c128,d2/bool"
    mu.run_mpi(
        3,
        "roundtrip",
        "write",
        tmp_path,
        "--history",
        hist,
        "--aggregators",
        "2",
        "--names",
        names,
        "--durable",
        0,
        timeout=120,
    )
    mu.run_mpi(
        2,
        "roundtrip",
        "read",
        tmp_path,
        "--history",
        hist,
        "--aggregators",
        "2",
        "--names",
        names,
        timeout=120,
    )


@pytest.mark.slow
def test_append_with_other_rank_counts(tmp_path):
    """Write with 2 ranks, append with 3 (adding a dataset), then with 1; read with 4."""
    h1 = "2:11:3"
    h2 = h1 + ",3:12:2"
    h3 = h2 + ",1:13:2"
    mu.run_mpi(
        2, "roundtrip", "write", tmp_path, "--history", h1, "--aggregators", "1,n", timeout=90
    )
    mu.run_mpi(
        3,
        "roundtrip",
        "write",
        tmp_path,
        "--history",
        h2,
        "--aggregators",
        "1,n",
        "--extra",
        timeout=90,
    )
    mu.run_mpi(
        1,
        "roundtrip",
        "write",
        tmp_path,
        "--history",
        h3,
        "--aggregators",
        "1,n",
        "--durable",
        0,
        timeout=90,
    )
    mu.run_mpi(
        4,
        "roundtrip",
        "read",
        tmp_path,
        "--history",
        h3,
        "--aggregators",
        "1,n",
        "--extra-from",
        3,
        "--rseed",
        3,
        timeout=90,
    )


def _follow(
    tmp_path, nr: int, history: str, reader_args=(), writer_args=("--wait",), timeout: float = 90
):
    """Start the reader job, then the writer job (the last session of *history*); check both."""
    path = tmp_path / "live.lam"
    nw = int(history.split(",")[-1].split(":")[0])
    t0 = time.monotonic()
    reader_cmd = mu.mpi_command(nr, "follow", "read", path, "--history", history, *reader_args)
    writer_cmd = mu.mpi_command(nw, "follow", "write", path, "--history", history, *writer_args)
    reader = mu.start(reader_cmd)
    writer = mu.start(writer_cmd)
    try:
        r = mu.finish(reader, reader_cmd, timeout, t0)
        if r.returncode != 0 and writer.poll() is None:
            mu.kill_tree(writer)  # it would wait for a reader that is gone
        w = mu.finish(writer, writer_cmd, max(5.0, timeout - (time.monotonic() - t0)), t0)
    finally:
        for p in (reader, writer):
            if p.poll() is None:
                mu.kill_tree(p)
                p.communicate()
    res = mu.check(r)
    mu.check(w)
    nsteps = sum(int(part.split(":")[2]) for part in history.split(","))
    assert f"followed {nsteps} steps" in res.stdout, res.stdout
    return path


@pytest.mark.parametrize("nw,nr", [(2, 3), (3, 1)])
def test_reader_follows_writer(tmp_path, nw, nr):
    """A writer job and a reader job started together; the reader checks each step as it arrives."""
    _follow(tmp_path, nr, f"{nw}:{900 + nw}:10")


def test_reader_follows_appending_writer(tmp_path):
    """A reader that opens a closed file while a new writer appends to it follows the new steps."""
    path = tmp_path / "live.lam"
    mu.run_mpi(2, "follow", "write", path, "--history", "2:31:3", timeout=60)
    _follow(tmp_path, 2, "2:31:3,3:32:4", reader_args=("--after-open",))


@pytest.mark.parametrize("n,aggregators", [(1, 1), (2, 1), (3, 2), (4, 4)])
def test_overlap_error_on_every_rank(tmp_path, n, aggregators):
    """Overlapping boxes from two ranks in one step: OverlapError everywhere, earlier steps intact."""
    mu.run_mpi(n, "overlap", tmp_path / "ov.lam", aggregators, timeout=60)


def test_checks_catch_wrong_data(tmp_path):
    """The scenario checks are not vacuous: reading with the wrong writer seed must fail."""
    hist = "2:5:2"
    names = "d2/i64,d3/f32"
    mu.run_mpi(
        2,
        "roundtrip",
        "write",
        tmp_path,
        "--history",
        hist,
        "--aggregators",
        "1",
        "--names",
        names,
        timeout=60,
    )
    cmd = mu.mpi_command(
        2,
        "roundtrip",
        "read",
        tmp_path,
        "--history",
        "2:6:2",
        "--aggregators",
        "1",
        "--names",
        names,
    )
    res = mu.finish(mu.start(cmd), cmd, 60)
    assert res.returncode != 0, res.describe()
    assert "AssertionError" in res.stderr, res.describe()


@pytest.mark.parametrize("case", ["disk", "implicit", "define"])
@pytest.mark.parametrize("n", [2, 3])
def test_failures_reach_every_rank(tmp_path, case, n):
    """A failure on one rank inside a collective call reaches every rank; nothing hangs."""
    mu.run_mpi(n, "faults", case, tmp_path / "f.lam", timeout=90)


#: the cases of scenarios/misuse.py, in launches of a few each (one case after another in one
#: program: a launch costs more than most cases, and each case also shows that the ones before
#: it left MPI and lamina fit for the next call)
MISTAKES = {
    "attrs": ["attrs-subset", "attrs-conflict", "groups-apart", "refused-read", "io-apart"],
    "left": ["left-writer", "left-reader", "close-after-left-sync", "close-after-left-async"],
    "steps": [
        "step-apart",
        "step-apart-async",
        "step-apart-multires",
        "step-apart-close",
        "step-apart-close-async",
    ],
    **{
        f"calls-{io}": [
            f"{c}-{io}"
            for c in ("close-in-step", "cut-write", "data-then-step", "derive-apart")
            + (
                ("refused-define", "define-apart", "flush-apart", "read-apart", "calls-apart")
                if io != "auto"
                else ()
            )
        ]
        for io in ("sync", "async", "auto")
    },
}


@pytest.mark.parametrize("group", list(MISTAKES))
@pytest.mark.parametrize("n", [2, 3])
def test_one_ranks_mistake(tmp_path, group, n):
    """Attributes from a subset of ranks; a rank's own error: no hang, the file goes on or is let go."""
    cases = MISTAKES[group]
    res = mu.run_mpi(n, "misuse", ",".join(cases), tmp_path / "f.lam", timeout=60 + 30 * len(cases))
    done = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("OK ")]
    assert done == cases, res.stdout


@pytest.mark.parametrize("n,aggregators", [(2, 1), (2, 2), (3, 1), (4, 2), (4, 4)])
def test_write_faults_during_put(tmp_path, n, aggregators):
    """The aggregators' writes fail at put (a full disk, a lost permission): end_step raises on
    every rank, no hang (both faults in one launch, a file each)."""
    res = mu.run_mpi(n, "misuse", "fsize,eacces", tmp_path / "f.lam", aggregators, timeout=120)
    done = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("OK ")]
    assert done == ["fsize", "eacces"], res.stdout


@pytest.mark.parametrize("n,writers", [(2, 2), (3, 2), (4, 3)])
def test_collective_read(tmp_path, n, writers):
    """ds.read(box, collective=True): any boxes, every value checked; misuse and damage raise everywhere."""
    res = mu.run_mpi(n, "collective_read", tmp_path / "c.lam", writers, timeout=120)
    assert "OK collective reads" in res.stdout


@pytest.mark.parametrize(
    "case, n",
    [
        ("not-initialized", 1),
        ("comm-null", 1),
        ("intercomm", 2),
        ("intercomm", 3),
        ("finalize-async", 1),
        ("finalize-async", 2),
        ("finalize-sync", 2),
    ],
)
def test_mpi_not_in_the_state_a_file_needs(tmp_path, case, n):
    """MPI not initialized, finalized by the program, or a communicator a file cannot use:
    clear errors on every rank, where MPICH ended the process with no Python error, one
    rank raised a bare AssertionError and the others hung, or a background step met a
    finalized MPI (a segfault, its steps lost). Steps ended before a finalize are kept."""
    import numpy as np

    import lamina

    path = tmp_path / "f.lam"
    mu.run_mpi(n, "mpi_state", case, path, timeout=90)
    if case.startswith("finalize"):
        with lamina.open(path) as f:
            assert f.steps == 3
            np.testing.assert_array_equal(f.at(2)["u"][...], 200 + np.arange(8.0 * n))
