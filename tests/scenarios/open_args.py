"""Ranks that open a file with arguments the others were not given, and a background write that fails on one rank.

    open_args.py CASE PATH     rank 1 alone gets a bad argument; every rank must raise at the
                               open (none waits in its first collective call): io-env, io-arg,
                               budget, option; gpu: device='gpu' everywhere, with a GPU
                               on rank 0 alone (simulated)
    open_args.py CASE PATH     rank 1 alone chooses another engine or stack: every rank raises
                               CollectiveMismatchError naming what differs and which rank chose
                               what (the ranks waited forever in the engines' first collective
                               call): engine-env ($LAMINA_ENGINE), engine-arg (engine=),
                               transport-env ($LAMINA_TRANSPORT), layers-arg (layers=)
    open_args.py enospc PATH   rank 1's subfile write fails (ENOSPC) in background step 2: every
                               rank raises an error naming rank 1, the dataset and the box
    open_args.py collective-step PATH   a collective read of the last step, as -1 and as 1
    open_args.py auto-hints PATH   derive(strategy='auto') with other hints on rank 1: every
                               rank raises CollectiveMismatchError (rank 0's were taken for all)
    open_args.py define-args PATH   create_dataset with another shape on the last rank, then
                               another codec alone, then open with another path: every rank
                               raises CollectiveMismatchError naming which ranks made which call

Each rank prints ``OK <case> <rank>: <error>`` when it saw what it should.
"""

from __future__ import annotations

import errno
import os
import sys

import numpy as np

from lamina import comm as lcomm

#: what every rank's error says where rank 1 alone chose another engine or stack
STACK_CASES = {
    "engine-env": (
        "different engines",
        "rank 0: engine 'native' (the default)",
        "rank 1: engine 'memory' ($LAMINA_ENGINE)",
    ),
    "engine-arg": ("different engines", "rank 1: engine 'memory' (engine=)"),
    "transport-env": (
        "different engines",
        "rank 1: engine 'mpi' (transport 'memory' from $LAMINA_TRANSPORT)",
    ),
    "layers-arg": ("different layers", "rank 0: layers ['derived']", "rank 1: layers []"),
}


def bad_open(case: str, path: str) -> None:
    c = lcomm.world()
    kw: dict = {}
    if c.rank == 1:
        if case == "io-env":
            os.environ["LAMINA_IO"] = "fast"
        elif case == "io-arg":
            kw = {"io": "bogus"}
        elif case == "budget":
            kw = {"io": "async", "max_inflight_bytes": -1}
        elif case == "option":
            kw = {"bogus_option": 1}
        elif case == "engine-env":
            os.environ["LAMINA_ENGINE"] = "memory"
        elif case == "engine-arg":
            kw = {"engine": "memory"}
        elif case == "transport-env":
            os.environ["LAMINA_TRANSPORT"] = "memory"
        elif case == "layers-arg":
            kw = {"layers": []}
    if case == "gpu":
        from lamina.derived import compute

        kw = {"device": "gpu"}
        there = c.rank == 0
        compute.gpu_missing = lambda: None if there else "CuPy sees no CUDA device (simulated)"
    import lamina

    try:
        with lamina.open(path, "w", comm=c, **kw):
            pass
    except Exception as e:  # noqa: BLE001 - the scenario reports what every rank got
        if case in STACK_CASES:
            want = STACK_CASES[case]
            assert isinstance(e, lamina.CollectiveMismatchError), repr(e)
            assert all(w in str(e) for w in want), (want, str(e))
        print(f"OK {case} {c.rank}: {type(e).__name__}: {e}", flush=True)
        return
    raise AssertionError(f"rank {c.rank} opened {path} although rank 1 was given {kw}")


def enospc(path: str) -> None:
    import lamina

    c = lcomm.world()
    fail = c.size - 1
    f = lamina.open(path, "w", io="async", comm=c)
    bg = f.engine.stack()[0]
    real = os.pwrite
    fired = [False]

    def pwrite(fd, data, off):
        s = bg._running
        if c.rank == fail and s is not None and s.index == 2 and not fired[0]:
            fired[0] = True
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, off)

    os.pwrite = pwrite
    ds = f.create_dataset("x", (c.size * 512, 1024), "f8")  # 4 MiB a rank: written at its put
    for k in range(4):
        with f.step():
            ds[512 * c.rank : 512 * (c.rank + 1)] = np.full((512, 1024), float(k))
    try:
        f.wait()
    except OSError as e:
        text = str(e)
        want = (
            f"failed on rank {fail}",
            f"writing step 2: dataset 'x' box [{512 * fail}:{512 * (fail + 1)}",
            os.path.join(path, f"data.0.{fail}"),
        )
        if all(w in text for w in want):
            print(f"OK enospc {c.rank}: {text}", flush=True)
        else:
            print(f"WRONG enospc {c.rank}: {text}", flush=True)
    f.close()


def auto_hints(path: str) -> None:
    import lamina

    c = lcomm.world()
    with lamina.open(path, "w", comm=c) as f:
        f.create_dataset("u", (8, 8), "f8")
        try:
            f.derive("g", "u * 2", "auto", query_fraction=0.1 if c.rank == 0 else 0.9)
        except lamina.errors.CollectiveMismatchError as e:
            print(f"OK auto-hints {c.rank}: {e}", flush=True)
            return
    raise AssertionError(f"rank {c.rank}: different hints were taken")


def collective_step(path: str) -> None:
    """A collective read of the last step, named -1 on rank 0 and by its number on rank 1: the
    same read (it was refused as a read of different steps)."""
    import lamina

    c = lcomm.world()
    with lamina.open(path, "w", comm=c) as f:
        x = f.create_dataset("x", (4, 4), "f8")
        for k in range(2):
            with f.step():
                x[2 * c.rank : 2 * c.rank + 2] = float(k)
    with lamina.open(path, comm=c) as f:
        got = f["x"].read(
            np.s_[:, 2 * c.rank : 2 * c.rank + 2], step=-1 if c.rank == 0 else 1, collective=True
        )
    if not np.array_equal(got, np.ones((4, 2))):
        raise AssertionError(f"rank {c.rank}: {got}")
    print(f"OK collective-step {c.rank}", flush=True)


def define_args(path: str) -> None:
    import lamina

    c = lcomm.world()
    last = c.size - 1
    others = "rank 0" if c.size == 2 else f"ranks 0-{last - 1}"
    with lamina.open(path, "w", comm=c) as f:
        try:
            f.create_dataset("a", (10 + (c.rank == last),))
        except lamina.CollectiveMismatchError as e:
            text = str(e)
            assert f"{others}: create_dataset('a', shape=(10,)" in text, text
            assert f"rank {last}: create_dataset('a', shape=(11,)" in text, text
        else:
            raise AssertionError(f"rank {c.rank}: different shapes were taken")
        try:  # the same in words, not in arguments
            f.create_dataset("b", (4,), compression="zlib" if c.rank == last else None)
        except lamina.CollectiveMismatchError as e:
            assert "alike in these words: the arguments differ elsewhere" in str(e), e
        else:
            raise AssertionError(f"rank {c.rank}: different codecs were taken")
        assert list(f.keys()) == [], list(f.keys())
        f.create_dataset("c", (4,))  # agreed: the file goes on
    theirs = path + "-last"
    try:
        lamina.open(theirs if c.rank == last else path, "w", comm=c)
    except lamina.CollectiveMismatchError as e:
        text = str(e)
        assert f"rank {last}: open({theirs!r}" in text and f"{others}: open({path!r}" in text, text
    else:
        raise AssertionError(f"rank {c.rank}: an open of different paths went on")
    print(f"OK define-args {c.rank}", flush=True)


if __name__ == "__main__":
    case, path = sys.argv[1:3]
    if case == "collective-step":
        collective_step(path)
        sys.exit()
    if case == "define-args":
        define_args(path)
        sys.exit()
    if case == "enospc":
        enospc(path)
    elif case == "auto-hints":
        auto_hints(path)
    else:
        bad_open(case, path)
