"""The benchmarks check what they read, and refuse options that make no sense.

Tiny sizes, in this process (one rank) where the benchmark's worker side
allows it: a reader that returns step 0 whatever step it is asked for, one
that leaves the array it should read into, a writer's file that is not read
back, must each make the benchmark report a verification failure.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lamina.api.dataset import Dataset
from lamina.bench import main as bench

_read = Dataset.read


def stale_reads(monkeypatch) -> None:
    """lamina reads step 0, whatever step it is asked for."""

    def read(self, box=None, step=None, out=None, **kw):
        return _read(self, box, 0, out, **kw)

    monkeypatch.setattr(Dataset, "read", read)


def failures(ctx) -> list[str]:
    """Record the checks of *ctx* that fail instead of aborting the job."""
    failed: list[str] = []
    ctx.check = lambda ok, what: None if ok else failed.append(what)
    return failed


# ------------------------------------------------------------------ options
@pytest.mark.parametrize(
    "argv",
    [
        ["write", "--timeout", "0"],
        ["read", "--timeout", "-1"],
        ["blocks", "--timeout", "0"],
        ["async", "--timeout", "-5"],
        ["insitu", "--timeout", "0"],
        ["multires", "--timeout", "0"],
        ["read", "--timeout", "nan"],
    ],
)
def test_timeout_must_be_positive(argv, capsys):
    assert bench(argv) == 2
    assert "--timeout: must be more than 0 seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["write", "--size", "2GiB", "--ranks", "1"],
            "--size 2GiB on 1 ranks needs at least 2 GiB",
        ),
        (
            ["read", "--size", "1GiB", "--ranks", "1,2"],
            "--size 1GiB on 2 ranks needs at least 2 GiB",
        ),
        (["insitu", "--size", "2GiB"], "--size 2GiB on 8 ranks needs at least 2.2 GiB"),
        # each launched rank its own memory (Python, numpy, MPI) before any data
        (
            ["write", "--size", "8", "--ranks", "100000"],
            "--size 8 on 100000 ranks needs at least 2.3 TiB",
        ),
        (["multires", "--quick", "--size-grid", "1000000"], "--size-grid 1000000 needs at least"),
        (["stats", "--mib", "1024"], "--mib 1024 needs at least 2 GiB"),
        (["derived", "--mib", "2048"], "--mib 2048 needs at least 2 GiB"),
        (["strategies", "--size", "2GiB"], "--size 2GiB in --blocks 64 needs at least 4 GiB"),
        # each block at least 3 x 3 x 3, whatever --size says: 3 GB from --size 1MiB
        (["strategies", "--size", "1MiB", "--blocks", "3000000"], "--blocks 3000000 needs"),
        (["multires", "--shape", "100000", "100000", "100000"], "--shape 100000 100000 100000"),
        (
            ["blocks", "--edges", "4", "--blocks", "9999999", "--max-bytes", "1TiB"],
            "9999999 blocks of edge 4 on 4 ranks needs at least",
        ),
        (
            ["async", "--mib", "1024", "--ranks", "1,2"],
            "--mib 1024 on 2 ranks needs at least 2 GiB",
        ),
        (["steps", "--elements", "268435456", "--datasets", "1"], "needs at least 2 GiB"),
        (["catalog", "--blocks", "100000000"], "--blocks 100000000 needs at least"),
    ],
)
def test_sizes_past_the_machines_memory_are_refused(argv, message, monkeypatch, capsys):
    """Refused at the command line (exit 2), before any job starts: not killed by the kernel,
    not a numpy traceback or an MPI_Abort of every rank after the files were made."""
    from lamina.bench import common

    monkeypatch.setattr(common, "memory_bytes", lambda: 1 << 30)
    assert bench(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "this machine has 1 GiB" in err, err


@pytest.mark.parametrize(
    "argv,what",
    [
        (["write", "--size", "8", "--ranks", "2147483649"], "--ranks: 2147483649 ranks"),
        (["read", "--ranks", "1,4294967298"], "--ranks: 4294967298 ranks"),
        (["insitu", "--ranks", "99999999999999999999999"], "--ranks: 99999999999999999999999"),
        (["blocks", "--ranks", "2147483648"], "--ranks: 2147483648 ranks"),
        (["async", "--ranks", "2147483648"], "--ranks: 2147483648 ranks"),
        (["multires", "--quick", "--ranks", "2147483648"], "2147483648"),
        (
            ["multires", "--size-grid", "99999999999999999999999"],
            "--size-grid: 99999999999999999999",
        ),
    ],
)
def test_rank_counts_past_what_mpi_numbers_are_refused(argv, what, monkeypatch, capsys):
    """MPICH's mpiexec takes a count of 2**32 + 2 as 2 without a word: the benchmark ran on 2
    ranks, said it ran on as many as asked, and exited 0.  (The size grid's count went to a
    trial division that ran for ever first.)"""
    from lamina.bench import common

    monkeypatch.setattr(common, "memory_bytes", lambda: 1 << 60)
    assert bench(argv) == 2
    err = capsys.readouterr().err
    assert what in err and "more than MPI can number" in err, err


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["verify", "--mib", "1", "--block-mib", "1", "--steps", "99999999999999999999999"],
            "--steps 99999999999999999999999 of --mib 1 writes at least",
        ),
        (["catalog", "--steps", "99999999999999999999999"], "--steps 99999999999999999999999 x"),
        (["steps", "--steps", "99999999999999999999"], "--steps 99999999999999999999 (+"),
        (
            ["blocks", "--steps", "99999999999999999999", "--edges", "4", "--blocks", "64"],
            "--steps 99999999999999999999 of 64 blocks of edge 4",
        ),
        (
            ["async", "--steps", "99999999999999999999", "--mib", "8"],
            "--steps 99999999999999999999",
        ),
    ],
)
def test_files_past_the_disks_free_space_are_refused(argv, message, tmp_path, capsys):
    """verify's huge --steps gave h5py's OverflowError as a traceback; the others started
    writing and ran until killed."""
    assert bench([*argv, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "free" in err, err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["write", "--ranks", "1,,2"], "--ranks: empty entry in '1,,2'"),
        (["read", "--ranks", "1,2,"], "--ranks: empty entry in '1,2,'"),
        (["insitu", "--ranks", "2,,4"], "--ranks: empty entry in '2,,4'"),
        (["blocks", "--edges", "4,,8"], "--edges: empty entry in '4,,8'"),
        (["blocks", "--ranks", ",1"], "--ranks: empty entry in ',1'"),
        (["async", "--mib", "1,,2"], "--mib: empty entry in '1,,2'"),
        (["multires", "--size-grid", "1,,2"], "--size-grid: empty entry in '1,,2'"),
        (["write", "--ranks", "1", "--aggregators", "1,,all"], "--aggregators: empty entry"),
        (["write", "--ranks", "1", "--methods", "h5py,"], "--methods: empty entry in 'h5py,'"),
        (["blocks", "--methods", ",adios2"], "--methods: empty entry in ',adios2'"),
        (["steps", "--datasets", "1,,8"], "--datasets: empty entry in '1,,8'"),
        (["steps", "--methods", "numpy,,h5py"], "--methods: empty entry in 'numpy,,h5py'"),
        (["insitu", "--methods", "hand,"], "--methods: empty entry in 'hand,'"),
        (["async", "--compute", "1,,2"], "--compute: empty entry in '1,,2'"),
        (["derived", "--kernels", "add,"], "--kernels: empty entry in 'add,'"),
        (["strategies", "--kernels", ",magnitude"], "--kernels: empty entry in ',magnitude'"),
        (["strategies", "--fractions", "1,,5"], "--fractions: empty entry in '1,,5'"),
        (["strategies", "--blocks", "8,"], "--blocks: empty entry in '8,'"),
        (["stats", "--dtypes", "float64,,int8"], "--dtypes: empty entry in 'float64,,int8'"),
    ],
)
def test_empty_list_entries_are_refused(argv, message, capsys):
    """'1,,2' is a typo, refused at the command line naming the option and the value, not
    run as 1,2."""
    assert bench(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "error:" in err, err


def test_parse_choices():
    """Names matched without regard to case, returned as the choices spell them; an
    unknown, an empty entry or an empty list refused naming the option."""
    from lamina.bench import common

    choices = ("numpy", "adios2 BP5", "lamina")
    assert common.parse_choices(" ADIOS2 bp5,numpy", "--methods", choices) == [
        "adios2 BP5",
        "numpy",
    ]
    with pytest.raises(ValueError, match=r"--methods: unknown \['hdf'\]; choose from numpy"):
        common.parse_choices("numpy,hdf", "--methods", choices)
    for bad, why in (("", "expected comma-separated"), ("numpy,", "empty entry")):
        with pytest.raises(ValueError, match=f"--methods: {why}"):
            common.parse_choices(bad, "--methods", choices)


def test_parse_int_list():
    from lamina.bench import common

    assert common.parse_int_list(" 1, 2 ,4", "--ranks") == [1, 2, 4]
    for bad in ("1,,2", "1,", ",", "1, ,2"):
        with pytest.raises(ValueError, match=f"--ranks: empty entry in {bad!r}"):
            common.parse_int_list(bad, "--ranks")


@pytest.mark.parametrize("sub", ["write", "read", "insitu"])
def test_negative_warmup_is_refused(sub, capsys):
    assert bench([sub, "--warmup", "-1"]) == 2
    assert "--warmup must be at least 0, got -1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--rel", "-1"], "--rel: expected a number >= 0"),
        (["--rel", "nan"], "--rel: expected a number >= 0"),
        (["--shape", "0", "0", "0"], "--shape: every extent must be at least"),
        (["--shape", "7", "7", "7"], "--shape: every extent must be at least"),
        (["--ranks", "0"], "--ranks must be at least 1"),
        (["--ranks", "-2"], "--ranks must be at least 1"),
        (["--measure-grid", "0", "0", "0"], "--measure-grid: expected positive integers"),
        (["--grid-box", "2", "0", "2"], "--grid-box: expected positive integers"),
        (["--parts", "compress", "--rel", "1e-2"], "--rel: the compress part sweeps"),
    ],
)
def test_multires_refuses_nonsense(argv, message, capsys):
    assert bench(["multires", *argv]) == 2
    assert message in capsys.readouterr().err


def test_multires_quick_keeps_explicit_shape_and_repeat():
    from lamina.bench import multires

    p = multires.parser()
    args = p.parse_args(["--quick", "--shape", "64", "32", "32", "--repeat", "2"])
    multires.options(p, args)
    assert (args.shape, args.repeat, args.rel) == ([64, 32, 32], 2, 1e-3)
    args = p.parse_args(["--quick"])
    multires.options(p, args)
    assert (args.shape, args.repeat) == ([64, 64, 64], 1)
    args = p.parse_args([])
    assert multires.options(p, args) == {"write", "compress", "read", "simulate"}
    assert (args.shape, args.repeat) == ([256, 128, 128], 3)
    # --rel with a part that takes it, beside compress: accepted
    args = p.parse_args(["--parts", "compress", "read", "--rel", "0"])
    assert multires.options(p, args) == {"compress", "read"} and args.rel == 0


# ------------------------------------------------------------------ read
def _read_ctx(tmp_path, *extra: str):
    from lamina.bench import worker
    from lamina.bench.harness import make_ctx

    ns = worker.parse(
        ["read", "--size", "65536", "--dir", str(tmp_path), "--out", str(tmp_path / "o.json")]
        + ["--repeat", "2", "--warmup", "1", "--aggregators", "1", "--methods", "numpy,h5py,lamina"]
        + list(extra)
    )
    return make_ctx(ns)


def test_read_checks_the_array_read_into(tmp_path, monkeypatch):
    """A read into the program's array that fills it once and then leaves it (returning a
    new array) is caught: the array is poisoned before every repetition and checked after."""
    from lamina.bench import read

    ctx = _read_ctx(tmp_path)
    fams = ["numpy", "h5py", "lamina"]
    read.setup(ctx, fams)
    methods = read.build_methods(ctx, fams)
    names = [m.name for m in methods]
    assert {read.REF_INTO, read.H5_INTO, "lamina agg=1 out="} <= set(names)
    failed = failures(ctx)
    ctx.measure(methods)
    assert failed == []

    calls = []

    def lazy(self, box=None, step=None, out=None, **kw):
        calls.append(out is not None)
        if out is not None and calls.count(True) > 1:  # after the first: a new array
            out = None
        return _read(self, box, step, out, **kw)

    monkeypatch.setattr(Dataset, "read", lazy)
    ctx.measure(read.build_methods(ctx, fams))
    assert failed and all("lamina agg=1 out=" in f for f in failed)


def test_read_out_row_compares_with_the_reads_into_an_array():
    """The out= row's ratios are against numpy's and h5py's reads into the program's array,
    not against reads that allocate a new array."""
    from lamina.bench import common, read

    def row(name, group, t):
        return {"name": name, "family": name.split()[0], "group": group, "note": "", "min": t}

    rows = [
        row(read.REF, "same", 1.0),
        row("h5py", "same", 1.5),
        row("lamina agg=1", "same", 1.0),
        row(read.REF_INTO, "into", 0.5),
        row(read.H5_INTO, "into", 0.8),
        row("lamina agg=1 out=", "into", 0.4),
    ]
    for r in rows:
        r.update(common.summarize([r["min"]] * 2))
    o = common.common_options(read.parser().parse_args(["--ranks", "1", "--repeat", "2"]))
    job = {
        "ranks": 1,
        "bytes_per_rank": 8,
        "local_shape": [1, 1, 1],
        "global_shape": [1, 1, 1],
        "rows": rows,
    }
    text, doc = read.report(o, [job], [])
    t = {x["method"]: x for x in doc["targets"]}
    assert t["lamina agg=1 out="]["vs_numpy"] == pytest.approx(0.5 / 0.4)
    assert t["lamina agg=1 out="]["vs_h5py"] == pytest.approx(0.8 / 0.4)
    assert t["lamina agg=1"]["vs_numpy"] == pytest.approx(1.0)
    assert "own block, own array" in text


def test_read_fsync_makes_the_setup_write_durable(tmp_path, monkeypatch):
    import lamina
    from lamina.bench import read

    seen = []
    real = lamina.open

    def spy(*args, **kw):
        seen.append(kw.get("durable"))
        return real(*args, **kw)

    monkeypatch.setattr(lamina, "open", spy)
    for flags, durable in (((), False), (("--fsync",), True)):
        ctx = _read_ctx(tmp_path, *flags)
        seen.clear()
        read.setup(ctx, ["lamina"])
        assert seen == [durable]


# ------------------------------------------------------------------ blocks
def test_blocks_catches_a_read_of_another_step(tmp_path, monkeypatch):
    from lamina import comm as lcomm
    from lamina.bench import blocks
    from lamina.bench.harness import Ctx

    c = blocks.Case.make(4, 8, 3, rank=0, size=1, seed=1)
    comm = lcomm.world()
    fams = ["numpy", "lamina"]
    ctx = Ctx(comm, 0, 1, c.data, c.box, c.gshape, str(tmp_path), False, False, 1, 0, [1], fams, 1)
    failed = failures(ctx)
    for phase in blocks.PHASES:
        ctx.measure(blocks.phase_methods(ctx, c, phase, fams))
    assert failed == []
    # every step's blocks differ: the first value of each is the step's own
    assert not np.array_equal(c.block_at(0, 0), c.block_at(0, 2))
    stale_reads(monkeypatch)
    for phase in ("read-all", "read-one"):
        ctx.measure(blocks.phase_methods(ctx, c, phase, fams))
    assert failed == [
        "lamina read-all: a step's data differs from that step's",
        "lamina read-all: data differs",
        "lamina read-one: data differs",
    ]


def test_blocks_reads_back_what_write_blocks_wrote(tmp_path, monkeypatch):
    """lamina-batch has a write phase only: its file is read back once, untimed, after it is
    written (a write_blocks that stored zeros was reported with a time and no failure)."""
    import lamina
    from lamina import comm as lcomm
    from lamina.bench import blocks
    from lamina.bench.harness import Ctx

    c = blocks.Case.make(4, 8, 2, rank=0, size=1, seed=1)
    fams = [blocks.BATCH]
    ctx = Ctx(
        lcomm.world(),
        0,
        1,
        c.data,
        c.box,
        c.gshape,
        str(tmp_path),
        False,
        False,
        1,
        0,
        [1],
        fams,
        1,
    )
    failed = failures(ctx)
    ctx.measure(blocks.phase_methods(ctx, c, "write", fams))
    assert failed == []
    real = lamina.Dataset.write_blocks

    def zeros(self, arrays, starts, copy=True):
        return real(self, np.zeros_like(np.asarray(arrays)), starts, copy=True)

    monkeypatch.setattr(lamina.Dataset, "write_blocks", zeros)
    ctx.measure(blocks.phase_methods(ctx, c, "write", fams))
    assert failed and failed[0] == "lamina-batch read-all: a step's data differs from that step's"


# ------------------------------------------------------------------ steps
def test_steps_catches_a_read_of_another_step(tmp_path, monkeypatch, capsys):
    from lamina.bench import steps

    argv = ["--datasets", "2", "--elements", "4", "--steps", "3", "--warmup", "1", "--repeat", "1"]
    argv += ["--methods", "numpy,lamina", "--dir", str(tmp_path)]
    assert steps.main(argv) == 0
    capsys.readouterr()
    stale_reads(monkeypatch)
    assert steps.main(argv) == 1
    assert "verification failed: lamina read dataset v0 of step 1" in capsys.readouterr().err


# ------------------------------------------------------------------ async
def _async_worker(tmp_path, steps: int = 3):
    from lamina.bench import background

    ns = SimpleNamespace(mib=1, steps=steps, repeat=1, seed=1, dir=str(tmp_path), durable=False)
    ns.compute = [0.0]
    return background.Worker(ns)


def test_async_reads_check_every_step_and_their_number(tmp_path, monkeypatch):
    import lamina

    w = _async_worker(tmp_path)
    path = w.lamina_write("sync", 0.0)["path"]
    assert w.check_file(path)
    for prefetch in (False, True):
        r = w.read(path, prefetch, 0.0)
        assert r["ok"] and len(r["waits"]) == 3
    # one step fewer than written
    real = lamina.File.iter_steps

    def short(self, *args, **kw):
        for k, view in enumerate(real(self, *args, **kw)):
            if k < 2:
                yield view

    monkeypatch.setattr(lamina.File, "iter_steps", short)
    assert not w.read(path, False, 0.0)["ok"]
    assert not w.check_file(path)
    monkeypatch.undo()
    stale_reads(monkeypatch)
    assert not w.read(path, False, 0.0)["ok"]
    assert not w.check_file(path)


def test_async_reads_back_every_lamina_write(tmp_path, monkeypatch):
    from lamina.bench import background

    w = _async_worker(tmp_path, steps=2)
    checked = []
    real = background.Worker.check_file

    def check_file(self, path):  # the real check passes; reported as failed
        checked.append(real(self, path))
        return False

    monkeypatch.setattr(background.Worker, "check_file", check_file)
    monkeypatch.delenv("LAMINA_IO", raising=False)
    doc = w.run()
    ran = [m for m in background.LAMINA_WRITES if not (m == background.AUTO and doc["auto"])]
    assert len(checked) == len(ran) and all(checked)
    assert doc["failed_checks"] == [f"write {m}" for m in ran]


# ------------------------------------------------------------------ insitu
def _insitu(producer: bool, rank: int, P: int, C: int, steps: int):
    from lamina.bench import insitu

    w = insitu.Worker.__new__(insitu.Worker)
    w.producer, w.rank, w.P, w.C = producer, rank, P, C
    w.ns = SimpleNamespace(size=4096 * 64, steps=steps)
    w.arrays()
    return w


@pytest.mark.parametrize("stale", [False, True])
def test_insitu_consumer_checks_every_step(stale):
    """Two producers, one consumer: the steps moved by hand; a transport that hands over
    step 0 at every step must fail the consumer's check."""
    steps = 3
    prods = [_insitu(True, r, 2, 1, steps) for r in range(2)]
    cons = _insitu(False, 0, 2, 1, steps)
    first = None
    for k in range(steps):
        parts = [p.produce(k) for p in prods]
        grid = np.concatenate([g for g, _ in parts])
        part = np.concatenate([q for _, q in parts])
        if first is None:
            first = grid.copy(), part.copy()
        if stale:
            grid, part = first
        cons.grid[...] = grid[cons.g[0] : cons.g[1]]
        cons.part[...] = part[cons.p[0] : cons.p[1]]
        cons.consumed()
    assert cons.check() is not stale
    assert len(cons.gmarks) == 2 and len(cons.pmarks) == 2  # a piece from each producer
    cons.clear()
    assert not cons.check()  # nothing read


# ------------------------------------------------------------------ derived
def test_derived_checks_every_lamina_row(monkeypatch, capsys):
    import lamina.derived
    from lamina.bench import derived

    doc = derived.run(1, 1, ["add"])
    assert doc["checks"] == {"add": True}
    real = lamina.derived.evaluate

    def wrong_new_result(e, arrays, *args, out=None, **kw):
        got = real(e, arrays, *args, out=out, **kw)
        return got if out is not None else [g + 1 for g in got]

    monkeypatch.setattr(lamina.derived, "evaluate", wrong_new_result)
    doc = derived.run(1, 1, ["add"])
    assert doc["checks"] == {"add": False}
    ok = {r["impl"]: r["ok"] for r in doc["rows"] if r["impl"].startswith("lamina")}
    assert ok == {"lamina": False, "lamina out=": True}
    assert "RESULTS DIFFER from numpy: add (lamina)" in derived.report(doc)
    assert derived.main(["--mib", "1", "--repeat", "1", "--kernels", "add"]) == 1


# ------------------------------------------------------------------ catalog
def test_catalog_checks_read_one_and_alternates_the_tools(tmp_path, monkeypatch, capsys):
    from lamina.bench import catalog

    order = []

    def logged(tool, phases):
        def make(*args):
            return {
                k: (lambda fn=fn: order.append(tool) or fn()) for k, fn in phases(*args).items()
            }

        return make

    monkeypatch.setattr(catalog, "_lamina_phases", logged("lamina", catalog._lamina_phases))
    monkeypatch.setattr(catalog, "_adios2_phases", logged("adios2", catalog._adios2_phases))
    argv = ["--steps", "3", "--blocks", "10", "--repeat", "2", "--dir", str(tmp_path), "--json"]
    assert catalog.main(argv) == 0
    assert order == ["lamina"] * 3 + ["adios2"] * 6 + ["lamina"] * 3
    capsys.readouterr()
    stale_reads(monkeypatch)
    assert catalog.main(argv) == 1
    assert "verification failed: lamina read one" in capsys.readouterr().err


# ------------------------------------------------------------------ multires
def test_multires_reads_are_checked(tmp_path, monkeypatch):
    from lamina.bench import multires

    x = multires.field("uneven", (64, 64, 32))
    rows = multires.reads(x, 1e-3, str(tmp_path), 1)
    assert len(rows) > 2 and all(r["ok"] for r in rows)
    assert all(c["ok"] for c in multires.compression(x, [1e-3]))
    assert multires.failed_checks({"read": {"uneven": rows}}) == []

    def coarse_wrong(self, box=None, step=None, out=None, *, level=0, **kw):
        got = _read(self, box, step, out, level=level, **kw)
        return got + 1 if level == 2 else got

    monkeypatch.setattr(Dataset, "read", coarse_wrong)
    rows = multires.reads(x, 1e-3, str(tmp_path), 1)
    assert [r["level"] for r in rows if not r["ok"]] == [2]
    doc = {"read": {"uneven": rows}}
    doc["failed_checks"] = multires.failed_checks(doc)
    assert doc["failed_checks"] == ["read uneven level 2"]
    assert "DATA CHECK FAILED for: read uneven level 2" in multires.report(doc)


def test_multires_write_is_read_back(tmp_path):
    import lamina
    from lamina import comm as lcomm
    from lamina.bench import multires

    x = multires.field("uneven", (64, 32, 32))
    tol = multires._tolerance(x, 1e-3)
    path = str(tmp_path / "mr.lam")
    with lamina.open(path, "w", durable=False) as f:
        layout = lamina.Multires(patch=multires.PATCH, tolerance=tol)
        f.create_dataset("T", x.shape, np.float32, layout=layout)
        f["T"][...] = x
    comm = lcomm.world()
    assert multires._check_write(comm, path, x, (10, 50), tol)
    y = x.copy()
    y[20, 5, 5] += 10 * tol
    assert not multires._check_write(comm, path, y, (10, 50), tol)
    doc = {"write": {"rows": [{"field": "uneven", "distribution": "balanced"}]}}
    doc["write"]["rows"][0].update(aggregation="counts", aggregators=2, checked=False)
    assert multires.failed_checks(doc) == ["write uneven balanced/counts F=2"]
