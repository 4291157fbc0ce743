"""One rank's mistake or failure, on 2-4 ranks: the others hear of it, the file goes on or is let go, nobody hangs.

Usage: misuse.py CASE[,CASE...] PATH [AGGREGATORS]
  (several cases run one after another in one launch, each on a file of its own next to PATH:
  each also shows that the cases before it left MPI and lamina fit for the next program call)
  attrs-subset    attributes set by rank 0 only (as ADIOS2 programs do): committed, seen by every rank
  attrs-conflict  two ranks set one attribute differently: every rank raises, naming both; the file goes on
  fsize N         the aggregators' disk fills during put (RLIMIT_FSIZE): end_step raises on every
                  rank; once there is room the next step commits; earlier steps intact
  eacces N        the aggregators lose the permission to write during put (PermissionError
                  injected into their writes): as fsize
  left-writer     one rank's own error ends its use of the file (with lamina.open ... as f): the
                  others raise at their next collective call instead of waiting for it
  left-reader     the same for ranks following a file
  step-apart      rank 1 raises inside `with f.step()` and goes on to its next step while the
                  others end theirs: every later step's commit raises a StepError on every rank
                  naming the ranks a step ahead, none pairs one rank's step k with another's
                  k + 1, and the file closes with the steps before it
  step-apart-async  the same under io='async' (the layer drops the step before the engine
                  began it: the engine is told, Engine.skip_steps): the ranks raise the error
                  at the background step's next collective point, and no step mixes
  step-apart-close  as step-apart, rank 1 making as many steps as the others (one end_step
                  fewer): its close meets the others' last end_step, under sync and async;
                  it leaves the file (it closed, and the others waited forever in their
                  close; under async it dropped no step just before, so the ranks are not a
                  call apart, and it does not wait for their close either); every rank
                  raises and returns, and the first step is in the file
  cut-write IO    the last rank's write is cut short by an interrupt (Ctrl-C, caught): every
                  rank's end_step raises StepError and drops the step, the next commits; a
                  step opened by writes, one cut short so, is dropped by every rank's close,
                  which closes the file
  close-in-step IO  rank 0 writes outside a step (a step opened by the write) and closes the
                  file while the others begin, write and end that step: the counts of steps
                  agree, but the close met an end_step: every rank raises and returns (the
                  ranks went on in different collective calls and waited forever), the step
                  before is in the file
  data-then-step IO  create_dataset(data=...) (written by rank 0: a step opened by its write)
                  then `with f.step()` on every rank: rank 0's begin_step takes the step its
                  write opened (it raised StepError there alone); the data and the step's
                  writes are step 0
  derive-apart IO  rank 0 declares a derived quantity that the others do not, then every
                  rank writes a step: the derive met the others' end_step; every rank raises
                  CollectiveMismatchError (they waited forever in different collectives), the
                  step is dropped everywhere, the step before is in the file
  io-apart        the last rank opens with io='async' (as under $LAMINA_IO set on some ranks),
                  the others with 'sync': every rank raises CollectiveMismatchError at the open
                  (the background layer's own collectives made the ranks wait forever), and
                  the file opened alike next writes
  refused-define IO  the last rank passes create_dataset arguments its own checks refuse (a
                  negative or float shape, a string dtype, a fill that does not fit, an
                  unknown codec, data that does not cast, a '..' name): every rank raises
                  that error's class (the others waited forever in the definition), nothing
                  is defined, and the file goes on and closes
  define-apart IO  rank 0 creates a dataset while the others close: every rank raises
                  (CollectiveMismatchError naming both calls under sync) instead of pairing
                  the two calls, and the file holds what was committed before
  refused-read    collective reads where the last rank's arguments are refused before any
                  message (a box that is not one, a level the dataset lacks) or its box lies
                  far outside the dataset: every rank raises, nothing huge is allocated, and
                  the next collective read reads
  flush-apart IO  f.flush(durable=...) with rank 0 alone durable: every rank raises
                  CollectiveMismatchError (rank 0 waited forever for the others' fsyncs);
                  an agreed flush and the next step go on
  calls-apart IO  rank 0 creates a dataset while the others flush (no step dropped anywhere:
                  the program's ranks went different ways): every rank raises
                  CollectiveMismatchError at once (under async rank 0 waited in its call for a
                  next call of the others that never came), then an agreed collective read
                  reads, an MPI barrier passes, and every rank closes
  close-after-left IO  rank 0 ends a step while the others close: they let go of the file;
                  rank 0's next collective call raises, and its close returns without
                  waiting for ranks that are gone (it waited forever); the first step is in
                  the file
  read-apart IO   readers of a file on every rank: rank 0 makes one collective call while
                  the others make another (refresh, read(collective=True), wait_for_step,
                  close, in pairs): every rank raises CollectiveMismatchError naming both
                  calls (the ranks went on in different collectives and waited forever),
                  the pairs without a close read on together, and a close paired with
                  another call lets the file go on every rank
"""

import functools
import resource
import signal
import sys

import numpy as np
from mpi4py import MPI

import lamina

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
case, path = sys.argv[1], sys.argv[2]


def attrs_subset() -> None:
    with lamina.open(path, "w", durable=False) as f:
        x = f.create_dataset("x", (size,))
        if rank == 0:
            f.attrs["title"] = "run 7"
            x.attrs["units"] = "K"
        if rank == size - 1:
            x.attrs["scale"] = 2.5
        with f.step():
            x[rank] = rank
        assert f.attrs["title"] == "run 7" and x.attrs["units"] == "K" and x.attrs["scale"] == 2.5
        if rank == 0:
            del x.attrs["units"]
        with f.step():
            x[rank] = 10 + rank
        assert "units" not in x.attrs
    with lamina.open(path, comm=MPI.COMM_SELF) as f:
        assert f.steps == 2 and f.attrs["title"] == "run 7" and dict(f["x"].attrs) == {"scale": 2.5}


def attrs_conflict() -> None:
    with lamina.open(path, "w", durable=False) as f:
        x = f.create_dataset("x", (size,))
        with f.step():
            x[rank] = 1.0
        x.attrs["units"] = "K" if rank == 0 else "C"
        f.attrs["ok"] = 1  # agreed: committed with the next step
        try:
            with f.step():
                x[rank] = 2.0
        except lamina.CollectiveMismatchError as e:
            msg = str(e)
            assert "'units'" in msg and "'K'" in msg and "'C'" in msg and "rank 0" in msg, msg
        else:
            raise AssertionError("conflicting attribute values were committed")
        assert "units" not in x.attrs  # the refused changes are undone on every rank
        x.attrs["units"] = "K"
        with f.step():
            x[rank] = 3.0
    with lamina.open(path, comm=MPI.COMM_SELF) as f:
        assert f.steps == 2, f.steps
        assert np.all(f.at(0)["x"][...] == 1.0) and np.all(f.at(1)["x"][...] == 3.0)
        assert f["x"].attrs["units"] == "K" and "ok" not in f.attrs


def fsize(naggs: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    n = 4096  # float64 per rank and step: 32 KiB
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    with lamina.open(path, "w", aggregators=naggs, durable=False) as f:
        x = f.create_dataset("x", (size * n,))
        with f.step():
            x[rank * n : (rank + 1) * n] = 1.0 + rank
        # the disk is full for the aggregators' next writes (made at put time for their own
        # blocks): no file may grow past the smallest subfile written so far
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * n * (size // naggs), hard))
        try:
            with f.step():
                x[rank * n : (rank + 1) * n] = 100.0
                x.attrs["tried"] = 1
        except OSError as e:
            assert "too large" in str(e).lower() or "no space" in str(e).lower(), e
        else:
            raise AssertionError("the step committed although its data could not be written")
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
        with f.step():
            x[rank * n : (rank + 1) * n] = 200.0 + rank
    with lamina.open(path, comm=MPI.COMM_SELF) as f:
        assert f.steps == 2, f.steps
        assert np.array_equal(f.at(0)["x"][...], np.repeat(1.0 + np.arange(size), n))
        assert np.array_equal(f.at(1)["x"][...], np.repeat(200.0 + np.arange(size), n))
        assert f["x"].attrs["tried"] == 1  # kept: only the blocks of the failed step were lost


def eacces(naggs: int) -> None:
    import lamina.engines.native.engine as native

    n = 1024
    real = native._pwrite_all
    state = {"deny": False}

    def denied(fd, buf, off):
        if state["deny"]:
            raise PermissionError(13, "Permission denied (injected)")
        return real(fd, buf, off)

    native._pwrite_all = denied
    try:
        with lamina.open(path, "w", aggregators=naggs, durable=False) as f:
            x = f.create_dataset("x", (size * n,))
            with f.step():
                x[rank * n : (rank + 1) * n] = 1.0
            state["deny"] = True
            try:
                with f.step():
                    x[rank * n : (rank + 1) * n] = 2.0
            except PermissionError as e:
                assert "Permission denied" in str(e), e
            else:
                raise AssertionError("the step committed although its data could not be written")
            state["deny"] = False
            with f.step():
                x[rank * n : (rank + 1) * n] = 3.0
    finally:
        native._pwrite_all = real
    with lamina.open(path, comm=MPI.COMM_SELF) as f:
        assert f.steps == 2 and np.all(f.at(0)["x"][...] == 1.0) and np.all(f["x"][...] == 3.0)


def left_writer() -> None:
    try:
        with lamina.open(path, "w", durable=False) as f:
            x = f.create_dataset("x", (size, 3))
            with f.step():
                x[rank] = 1.0
            with f.step():
                if rank == 1:
                    x[rank] = np.ones(
                        4
                    )  # a mistake of rank 1 alone: ShapeError, out of the with blocks
                else:
                    x[rank] = 2.0
    except lamina.ShapeError:
        assert rank == 1
    except lamina.RemoteError as e:
        assert rank != 1 and "rank 1 left the file" in str(e) and "ShapeError" in str(e), e
    else:
        raise AssertionError(f"rank {rank}: no error")
    comm.Barrier()
    with lamina.open(path, comm=MPI.COMM_SELF) as f:
        assert f.steps == 1 and np.all(f["x"][...] == 1.0)


def left_reader() -> None:
    if rank == 0:  # the writer of the file, on its own
        with lamina.open(path, "w", comm=MPI.COMM_SELF, durable=False) as f:
            f.create_dataset("x", (3,))[...] = 1.0
    comm.Barrier()
    readers = comm.Split(0, rank)
    try:
        with lamina.open(path, "r", comm=readers) as f:
            for view in f.iter_steps(timeout=30):
                if readers.rank == readers.size - 1:
                    raise KeyError("this rank's own mistake")
                assert view["x"][0] == 1.0
    except KeyError:
        assert readers.rank == readers.size - 1
    except lamina.RemoteError as e:
        assert "left the file" in str(e), e
    else:
        raise AssertionError(f"rank {rank}: no error")


def _apart(f, x, extra: bool = True) -> list[tuple[int, str]]:
    """Rank 1 fails inside its step 1 and goes on, one ``with f.step()`` more than the others
    make (*extra*; else as many, so one end_step fewer): the lamina errors each rank caught,
    with the loop's step."""
    said = []
    for s in range(5 if rank == 1 and extra else 4):
        try:
            with f.step():
                if rank == 1 and s == 1:
                    raise ValueError("rank 1 fails in its step")
                x[rank] = 10 * s + rank
        except ValueError:
            assert rank == 1 and s == 1
        except lamina.LaminaError as e:
            said.append((s, str(e)))
    return said


def _only_the_first_step(closed: bool = True) -> None:
    """The file holds dataset 'x' alone and its first step (every rank's cell), and the close
    record where *closed* (a file every rank let go of has none)."""
    comm.Barrier()
    with lamina.open(path, comm=MPI.COMM_SELF) as g:
        assert g.steps == 1 and list(g.keys()) == ["x"], (g.steps, list(g))
        assert g.engine.writer_closed or not closed
        np.testing.assert_array_equal(g["x"][...], np.arange(size, dtype=float))


def step_apart() -> None:
    f = lamina.open(path, "w", durable=False)
    said = _apart(f, f.create_dataset("x", (size,)))
    for _, text in said:
        assert "have opened more steps than rank" in text and "[1]" in text, text
    assert [s for s, _ in said] == ([2, 3, 4] if rank == 1 else [1, 2, 3]), said
    f.close()  # no step to commit: the close record pairs
    _only_the_first_step()


def step_apart_multires() -> None:
    # a multiresolution dataset's patches are encoded before the commit checks its step: ranks
    # a step apart must get the same verdict there, not one step's boxes against another's
    # (each step the ranks write each other's cells of the step before)
    f = lamina.open(path, "w", durable=False)
    x = f.create_dataset("x", (size,), layout=lamina.Multires(patch=1, tolerance=0.0))
    said = []
    for s in range(5 if rank == 1 else 4):
        try:
            with f.step():
                if rank == 1 and s == 1:
                    raise ValueError("rank 1 fails in its step")
                x[(rank + s) % size] = 10 * s + rank
        except ValueError:
            assert rank == 1 and s == 1
        except lamina.LaminaError as e:
            said.append((s, f"{type(e).__name__}: {e}"))
    for _, text in said:
        assert "StepError" in text and "have opened more steps than rank" in text, text
    assert [s for s, _ in said] == ([2, 3, 4] if rank == 1 else [1, 2, 3]), said
    f.close()
    _only_the_first_step()


def step_apart_async() -> None:
    f = lamina.open(path, "w", durable=False, io="async")
    said = [text for _, text in _apart(f, f.create_dataset("x", (size,)))]
    try:
        f.close()
    except lamina.LaminaError as e:
        said.append(str(e))
    assert said and all("have opened more steps than rank" in t for t in said), said
    _only_the_first_step()


def step_apart_close(io: str) -> None:
    f = lamina.open(path, "w", durable=False, io=io)
    said = [text for _, text in _apart(f, f.create_dataset("x", (size,)), extra=False)]
    try:
        f.close()  # rank 1's close meets the others' last end_step: it leaves, they hear it
    except lamina.LaminaError as e:
        said.append(f"close: {e}")
    assert said, "no rank a step apart raised"
    _only_the_first_step(closed=False)


def _one_step_written(io: str):
    """A new file (*io*) and its dataset 'x', every rank's cell written in step 0."""
    f = lamina.open(path, "w", durable=False, io=io)
    x = f.create_dataset("x", (size,))
    with f.step():
        x[rank] = rank
    return f, x


def close_in_step(io: str) -> None:
    f, x = _one_step_written(io)
    said = []
    try:
        if rank == 0:
            x[0] = -1.0  # a step opened by the write, never ended here
            f.close()
        else:
            with f.step():
                x[rank] = -1.0
            f.close()
    except lamina.LaminaError as e:
        said.append(str(e))
        try:
            f.close()  # (a rank whose end_step raised: the file is still open here)
        except lamina.LaminaError as e2:
            said.append(str(e2))
    assert said, "the close met an end_step and nobody raised"
    _only_the_first_step(closed=False)  # (the close record: maybe not written)


def cut_write(io: str) -> None:
    """The last rank's write into step 1 is cut short by an interrupt (KeyboardInterrupt,
    injected in the API's part of the call), caught: every rank's end_step raises StepError
    and the step is dropped everywhere; the next step commits. Then a step opened by the
    writes, the last rank's cut short again: every rank's close drops it and closes the
    file (a close record), with the two steps before."""
    import lamina.api.dataset as dataset_mod

    def cut_once() -> None:
        real = dataset_mod.box_of

        def cut(*args):
            dataset_mod.box_of = real
            raise KeyboardInterrupt

        dataset_mod.box_of = cut

    def write(value: float) -> None:
        if rank == size - 1:
            cut_once()
        try:
            x.write(np.full(1, value), (rank,))
        except KeyboardInterrupt:
            assert rank == size - 1
        else:
            assert rank != size - 1

    f, x = _one_step_written(io)
    f.begin_step()
    write(1.0)
    try:
        f.end_step()
    except lamina.StepError as e:
        assert "interrupted" in str(e), e
    else:
        raise AssertionError(f"rank {rank}: a step a write into was cut short was committed")
    with f.step():
        x[rank] = 2.0
    write(3.0)
    f.close()
    comm.Barrier()
    with lamina.open(path, comm=MPI.COMM_SELF) as r:
        assert r.engine.writer_closed and r.steps == 2, (r.engine.writer_closed, r.steps)
        np.testing.assert_array_equal(r.at(0)["x"][...], np.arange(size))
        np.testing.assert_array_equal(r.at(1)["x"][...], np.full(size, 2.0))


def data_then_step(io: str) -> None:
    with lamina.open(path, "w", durable=False, io=io) as f:
        d = f.create_dataset("d", data=np.arange(4.0))
        x = f.create_dataset("x", (size,))
        with f.step() as k:
            assert k == 0, k
            x[rank] = rank
        with f.step() as k:
            assert k == 1, k
            x[rank] = 10 + rank
    comm.Barrier()
    with lamina.open(path, comm=MPI.COMM_SELF) as g:
        assert g.steps == 2, g.steps
        np.testing.assert_array_equal(g["d"].read(step=0), np.arange(4.0))
        np.testing.assert_array_equal(g["x"].read(step=0), np.arange(size, dtype=float))
    del d


def derive_apart(io: str) -> None:
    said = []
    with lamina.open(path, "w", durable=False, io=io) as f:
        x = f.create_dataset("x", (size,))
        with f.step():
            x[rank] = rank
        try:
            if rank == 0:
                f.derive("twice", "`x` * 2", strategy="store")
            with f.step():
                x[rank] = 10 + rank
        except lamina.CollectiveMismatchError as e:
            said.append(str(e))
    assert said, "a derive on one rank met the others' end_step and nobody raised"
    if io == "sync":
        assert "derive" in said[0] and "end_step" in said[0], said
    _only_the_first_step(closed=False)


def io_apart() -> None:
    io = "async" if rank == size - 1 else "sync"
    try:
        lamina.open(path, "w", io=io)
        raise AssertionError("ranks opened with different io modes")
    except lamina.CollectiveMismatchError as e:
        assert "different I/O modes" in str(e) and repr(io) in str(e), e
    with lamina.open(path, "w", io="async") as f:
        x = f.create_dataset("x", (size,))
        with f.step():
            x[rank] = rank
    with lamina.open(path, "r") as f:
        np.testing.assert_array_equal(f["x"][...], np.arange(size))


def refused_define(io: str) -> None:
    last = size - 1
    # (name, the others' arguments, the last rank's, the error every rank raises)
    cases = [
        ("c", dict(shape=(4,)), dict(shape=(-1,)), lamina.ShapeError),
        ("c", dict(shape=(4,)), dict(shape=(4.0,)), lamina.ShapeError),
        ("c", dict(shape=(4,)), dict(shape=(4,), dtype="U3"), lamina.DTypeError),
        (
            "c",
            dict(shape=(4,), dtype="i4"),
            dict(shape=(4,), dtype="i4", fill=1.5),
            lamina.DTypeError,
        ),
        ("c", dict(shape=(4,)), dict(shape=(4,), compression="zstdd"), lamina.CodecError),
        (
            "c",
            dict(dtype="i4", data=np.arange(4)),
            dict(dtype="i4", data=np.arange(4.0) + 0.5),
            lamina.DTypeError,
        ),
        ("../c" if rank == last else "c", dict(shape=(4,)), dict(shape=(4,)), ValueError),
    ]
    with lamina.open(path, "w", durable=False, io=io) as f:
        x = f.create_dataset("x", (size,))
        with f.step():
            x[rank] = rank
        for name, good, bad, kind in cases:
            try:
                f.create_dataset(name, **(bad if rank == last else good))
            except kind as e:
                if rank != last:  # the last rank's own error, said by rank
                    assert str(e).startswith(f"rank {last}:"), e
            else:
                raise AssertionError(f"rank {rank}: {bad} on rank {last} was not refused")
            assert "c" not in f and f.steps == 1 and not f.engine.in_step, (bad, list(f))
        c = f.create_dataset("c", (size,), "i4")
        with f.step():
            x[rank] = 10 + rank
            c[rank] = rank
    comm.Barrier()
    with lamina.open(path, comm=MPI.COMM_SELF) as g:
        assert g.steps == 2 and sorted(g.keys()) == ["c", "x"], (g.steps, list(g))
        np.testing.assert_array_equal(g["c"][...], np.arange(size))
        np.testing.assert_array_equal(g.at(0)["x"][...], np.arange(size, dtype=float))


def define_apart(io: str) -> None:
    f, x = _one_step_written(io)
    said = []
    try:
        if rank == 0:
            f.create_dataset("c", (4,))  # the others close meanwhile
        f.close()
    except lamina.LaminaError as e:
        said.append(f"{type(e).__name__}: {e}")
        try:
            f.close()  # (a rank whose call raised: the file is still open here)
        except lamina.LaminaError as e2:
            said.append(f"{type(e2).__name__}: {e2}")
    if rank == 0:
        assert said and said[0].startswith("CollectiveMismatchError"), said
        if io == "sync":
            assert "create_dataset" in said[0] and "close" in said[0], said
    _only_the_first_step(closed=False)


def groups_apart() -> None:
    """Each rank creates a group of its own name: the commit raises on every rank, naming
    the groups rank 0 made (it said only 'different metadata changes'); none is kept and
    the file goes on."""
    f, x = _one_step_written("sync")
    f.create_group(f"grp{rank}")
    f.begin_step()
    try:
        f.end_step()
    except lamina.CollectiveMismatchError as e:
        assert "create_group '/grp0'" in str(e) and "different metadata changes" in str(e), e
    else:
        raise AssertionError(f"rank {rank}: groups of different names were committed")
    f.close()
    with lamina.open(f.filename) as g:
        assert not any(k.startswith("grp") for k in g), list(g)


def refused_read() -> None:
    last = size - 1
    with lamina.open(path, "w", durable=False) as f:
        a = f.create_dataset("a", (size, 6))
        with f.step():
            a[rank] = rank
        whole = np.repeat(np.arange(size, dtype=float), 6).reshape(size, 6)
        row = lamina.Box((rank, 0), (rank + 1, 6))
        huge = lamina.Box((0, 0), (2**62, 2**40))  # 2**105 bytes: no array of it is made
        # (the last rank's arguments, the error every rank raises, words of its message)
        for bad, kind, words in [
            (dict(box="0:2"), TypeError, "takes a lamina.Box"),
            (dict(box=row, level=1), lamina.BoundsError, "one level"),
            (dict(box=huge), lamina.BoundsError, "out of bounds"),
        ]:
            try:
                a.read(collective=True, **(bad if rank == last else dict(box=row)))
            except kind as e:
                assert words in str(e) or (rank != last and f"rank {last}" in str(e)), e
            else:
                raise AssertionError(f"rank {rank}: {bad} on rank {last} was not refused")
        if size > 2:  # two ranks refuse, each its own way: the lower one's class everywhere
            mine = {1: dict(box="0:2"), 2: dict(box=row, level=3)}.get(rank, dict(box=row))
            try:
                a.read(collective=True, **mine)
            except TypeError as e:
                assert rank == 1 or "rank 1" in str(e), e
            else:
                raise AssertionError(f"rank {rank}: two ranks' refusals went unraised")
        corner = lamina.Box(np.array([rank, 0]), np.array([rank + 1, 6]))  # numpy's ints
        np.testing.assert_array_equal(a.read(corner, collective=True), whole[rank : rank + 1])
        np.testing.assert_array_equal(a.read(collective=True), whole)


def flush_apart(io: str) -> None:
    with lamina.open(path, "w", durable=False, io=io) as f:
        x = f.create_dataset("x", (size,))
        with f.step():
            x[rank] = rank
        try:
            f.flush(durable=rank == 0)
        except lamina.CollectiveMismatchError as e:
            assert "durable" in str(e) and "flush" in str(e), e
        else:
            raise AssertionError(f"rank {rank}: flushes with different durable= went on")
        f.flush()
        with f.step():
            x[rank] = 10 + rank
    comm.Barrier()
    with lamina.open(path, comm=MPI.COMM_SELF) as g:
        assert g.steps == 2, g.steps
        np.testing.assert_array_equal(g["x"][...], 10 + np.arange(size, dtype=float))


def calls_apart(io: str) -> None:
    f, x = _one_step_written(io)
    try:
        if rank == 0:
            f.create_dataset("c", (4,))
        else:
            f.flush()
    except lamina.CollectiveMismatchError as e:
        # naming both calls, under io="async" too (it named none there)
        said = str(e)
        assert "different collective calls" in said and "create_dataset" in said, e
        assert "flush" in said, e
    else:
        raise AssertionError(f"rank {rank}: create_dataset against flush went on")
    row = lamina.Box((rank,), (rank + 1,))
    np.testing.assert_array_equal(x.read(row, step=0, collective=True), [float(rank)])
    comm.Barrier()  # no rank is left inside its call
    f.close()
    _only_the_first_step()


def close_after_left(io: str) -> None:
    f, x = _one_step_written(io)
    try:
        if rank == 0:
            with f.step():
                x[0] = -1.0
        else:
            f.close()
    except lamina.LaminaError:
        pass
    else:
        raise AssertionError(f"rank {rank}: end_step against close went on")
    if rank == 0:
        try:
            x.read(lamina.Box((0,), (1,)), collective=True)
        except lamina.LaminaError:
            pass
        else:
            raise AssertionError("a collective read with ranks that closed went on")
        try:
            f.close()  # nobody is left to close with: it lets go
        except lamina.RemoteError as e:
            assert "left the file" in str(e), e
    _only_the_first_step(closed=False)


def read_apart(io: str) -> None:
    writer = None
    if rank == 0:  # the writer, on its own, open throughout: wait_for_step(2) waits
        writer = lamina.open(path, "w", comm=MPI.COMM_SELF, durable=False)
        x = writer.create_dataset("x", (size, 4))
        for s in range(2):
            with writer.step():
                x[...] = np.full((size, 4), float(s))
    comm.Barrier()
    row = lamina.Box((rank, 0), (rank + 1, 4))
    calls = {
        "refresh": lambda f: f.refresh(),
        "read(collective=True)": lambda f: f["x"].read(row, step=1, collective=True),
        "wait_for_step": lambda f: f.wait_for_step(2, timeout=30),
        "close": lambda f: f.close(),
    }
    names = list(calls)
    for a in names:
        for b in names[names.index(a) + 1 :]:
            for first, other in ((a, b), (b, a)):
                f = lamina.open(path, "r", io=io)
                mine = first if rank == 0 else other
                try:
                    calls[mine](f)
                except lamina.CollectiveMismatchError as e:
                    said = str(e)
                    if io == "sync":
                        assert first in said and other in said, (mine, said)
                except lamina.RemoteError as e:  # a close's rank left and told this one
                    assert "left the file" in str(e), e
                else:
                    raise AssertionError(f"rank {rank}: {mine} against {first}/{other} went on")
                if "close" not in (first, other):
                    # the file goes on: a collective read pairs as it should
                    got = f["x"].read(row, step=1, collective=True)
                    np.testing.assert_array_equal(got, np.ones((1, 4)))
                try:
                    f.close()
                except lamina.RemoteError as e:  # the others closed after the mismatch
                    assert "left the file" in str(e), e
                comm.Barrier()
    if writer is not None:
        writer.close()


CASES = {
    "attrs-subset": attrs_subset,
    "attrs-conflict": attrs_conflict,
    "left-writer": left_writer,
    "left-reader": left_reader,
    "step-apart": step_apart,
    "step-apart-async": step_apart_async,
    "step-apart-multires": step_apart_multires,
    "io-apart": io_apart,
    "step-apart-close": lambda: step_apart_close("sync"),
    "step-apart-close-async": lambda: step_apart_close("async"),
    "refused-read": refused_read,
    "groups-apart": groups_apart,
    **{
        f"{name}-{io}": functools.partial(fn, io)
        for name, fn in (
            ("close-in-step", close_in_step),
            ("cut-write", cut_write),
            ("data-then-step", data_then_step),
            ("derive-apart", derive_apart),
            ("refused-define", refused_define),
            ("define-apart", define_apart),
            ("flush-apart", flush_apart),
            ("read-apart", read_apart),
            ("calls-apart", calls_apart),
            ("close-after-left", close_after_left),
        )
        for io in ("sync", "async", "auto")
    },
}

if len(sys.argv) > 3:  # the aggregators of the write faults
    naggs = int(sys.argv[3])
    CASES.update(fsize=lambda: fsize(naggs), eacces=lambda: eacces(naggs))
base = path
for k, one in enumerate(case.split(",")):
    path = f"{base}.{k}" if k else base
    CASES[one]()
    comm.Barrier()
    if rank == 0:
        print("OK", one, flush=True)
