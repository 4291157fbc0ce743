"""``lamina bench insitu``: the LowFive synthetic benchmark at this machine's scale, every method in one run.

A producer program and a consumer program share one MPMD launch
(``mpiexec -n P ... : -n C ...``, producers : consumers = 3 : 1).  Every
step, each producer rank holds a row slab of a uint64 grid and a range of
particles (n x 3 float32); each consumer rank reads its own row slab of the
grid and its own range of particles (a different decomposition, so pieces
come from one or two producer ranks).  Per job, each method moves the same
``--steps`` x ``--size`` bytes, ``--repeat`` times, in rotated order:

``memcpy floor``        bytes moved / memcpy bandwidth (one rank copies, others wait; measured in this run)
``hand-written mpi4py`` the same redistribution by hand: intersections precomputed, ``Isend``/``Irecv``
                        over an intercommunicator straight from and into the arrays, ``Waitall``
``lamina memory``       ``lamina.open(..., transport="memory", shallow=[...])``: producers write steps,
                        consumers ``iter_steps`` and ``read(box, out=...)``
``lamina memory deep``  the same without ``shallow`` (each block copied at ``write``)
``lamina memory no stats`` the same as ``lamina memory`` with ``stats=False``: blocks travel without
                        statistics (consumer queries cannot prune them), like ADIOS2's ``StatsLevel=0``
``lamina file``         the same programs with ``transport="file"``: the producers write the native file,
                        the consumers follow it (``iter_steps``) and read every step from it
``native write+read``   plain lamina native: the producers write all steps, then the consumers read them

The two file methods open with ``durable=False`` (page cache: nobody
fsyncs, as the other methods never touch the disk) unless ``--durable``
(then ``durable=True``: lamina fsyncs at every commit).

The data differ by step: each producer rank holds two sets of its arrays
and writes step k from set k % 2 (a step's arrays stay as they are until
its consumers are done with it, as ``shallow`` asks), after setting the
first value of each piece a consumer rank takes from it to step k's own (a
few numbers).  Consumers keep those values of every step they read (a few
numbers) and, after every run (untimed), each step's are compared with
what was written and the last step's arrays whole.

A timed run goes from a common (sleeping) barrier of all ranks of both
programs, through open, every step and close, to the slowest rank's end.
Targets: lamina memory <= 1.1x hand-written; lamina memory >= 5x faster
than lamina file; lamina file within 1.1x of native write+read.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

from ..text import fmt_bytes, table
from . import common

MEMCPY = "memcpy floor"
HAND = "hand-written mpi4py"
MEMORY = "lamina memory"
DEEP = "lamina memory deep"
NOSTATS = "lamina memory no stats"
FILE = "lamina file"
PLAIN = "native write+read"
METHODS = (HAND, MEMORY, DEEP, NOSTATS, FILE, PLAIN)
PARTICLE = 12  # bytes: 3 x float32
ROW = 1024  # grid columns (uint64)


# ------------------------------------------------------------------ sizes
def layout(size: int, producers: int, consumers: int) -> dict:
    """Global sizes for *size* bytes per step: half grid rows of ROW uint64, half particles."""
    rows = max(producers * consumers, size // 2 // (ROW * 8))
    npart = max(producers * consumers, (size - rows * ROW * 8) // PARTICLE)
    return {"rows": int(rows), "npart": int(npart), "bytes": int(rows * ROW * 8 + npart * PARTICLE)}


def split(n: int, parts: int, i: int) -> tuple[int, int]:
    return n * i // parts, n * (i + 1) // parts


# ------------------------------------------------------------------ worker (MPI side)
class Worker:
    """One rank of the launch: a producer (appnum 0) or a consumer (appnum 1)."""

    def __init__(self, ns) -> None:
        from .. import comm as lcomm

        self.lcomm = lcomm
        self.MPI = lcomm.MPI
        self.world = lcomm.world()
        self.task = lcomm.task_comm()
        self.app = lcomm.appnum()
        self.producer = self.app == 0
        self.P = lcomm.task_size(0)
        self.C = lcomm.task_size(1)
        self.rank = self.task.rank
        self.ns = ns
        self.arrays()

    def arrays(self) -> None:
        """This rank's sizes, pieces and arrays (from ``P``, ``C``, ``rank``, ``producer``, ``ns``)."""
        ns = self.ns
        lay = layout(ns.size, self.P, self.C)
        self.rows, self.npart, self.step_bytes = lay["rows"], lay["npart"], lay["bytes"]
        parts = self.P if self.producer else self.C
        self.g = split(self.rows, parts, self.rank)  # my grid rows
        self.p = split(self.npart, parts, self.rank)  # my particles
        self.plan = self.pieces()
        # the first grid row and particle of every piece exchanged with a peer: a step's marks
        self.gmarks = np.array([ga for _, (ga, gb), _ in self.plan if gb > ga], dtype=np.intp)
        self.pmarks = np.array([pa for _, _, (pa, pb) in self.plan if pb > pa], dtype=np.intp)
        if self.producer:  # two sets: step k is written from set k % 2
            self.sets = [self.expected() for _ in range(2)]
            self.grid, self.part = self.sets[0]
        else:
            a, b = self.g
            self.grid = np.zeros((b - a, ROW), dtype=np.uint64)
            a, b = self.p
            self.part = np.zeros((b - a, 3), dtype=np.float32)
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []  # consumer: every step's marks
        self.notes: list[str] = []

    def pieces(self) -> list:
        """(peer, grid rows a:b, particles a:b), relative to this rank's own, of every rank of
        the other program: the parts of this rank's arrays that go to or come from it."""
        out = []
        for q in range(self.C if self.producer else self.P):
            qg = split(self.rows, self.C if self.producer else self.P, q)
            qp = split(self.npart, self.C if self.producer else self.P, q)
            ga, gb = max(self.g[0], qg[0]), min(self.g[1], qg[1])
            pa, pb = max(self.p[0], qp[0]), min(self.p[1], qp[1])
            out.append((q, (ga - self.g[0], gb - self.g[0]), (pa - self.p[0], pb - self.p[0])))
        return out

    def expected(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's grid rows and particles as the producers make them, without marks."""
        a, b = self.g
        grid = np.arange(a * ROW, b * ROW, dtype=np.uint64).reshape(b - a, ROW)
        a, b = self.p
        return grid, (np.arange(a * 3, b * 3, dtype=np.float32) * 0.5).reshape(b - a, 3)

    @staticmethod
    def marks(step: int) -> tuple[np.uint64, np.float32]:
        """Step *step*'s value of the first element of every piece (no other value is either)."""
        return np.uint64(2**63 + step), np.float32(-1 - step)

    def produce(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Producer: the arrays of *step* (set step % 2), its pieces marked with the step's values."""
        grid, part = self.grid, self.part = self.sets[step % 2]
        grid[self.gmarks, 0], part[self.pmarks, 0] = self.marks(step)
        return grid, part

    def consumed(self) -> None:
        """Consumer: keep the marks of the step just read."""
        self.seen.append((self.grid[self.gmarks, 0], self.part[self.pmarks, 0]))

    # ------------------------------------------------------------ sync
    def wait(self, req) -> None:
        delay = 1e-5
        while not req.Test():
            time.sleep(delay)
            delay = min(2 * delay, 5e-4)

    def barrier(self) -> None:
        self.wait(self.world.Ibarrier())

    def max(self, x: float) -> float:
        self.barrier()
        return float(self.world.allreduce(float(x), op=self.MPI.MAX))

    def timed(self, fn) -> float:
        self.barrier()
        t0 = time.perf_counter()
        fn()
        return self.max(time.perf_counter() - t0)

    # ------------------------------------------------------------ checks
    def check(self) -> bool:
        """Consumer: every step read, each with its own marks, and the arrays hold what the
        producers wrote at the last step (producers: True)."""
        if self.producer:
            return True
        if len(self.seen) != self.ns.steps:
            return False
        for k, (gs, ps) in enumerate(self.seen):
            gm, pm = self.marks(k)
            if not ((gs == gm).all() and (ps == pm).all()):
                return False
        grid, part = self.expected()
        grid[self.gmarks, 0], part[self.pmarks, 0] = self.marks(self.ns.steps - 1)
        return bool(np.array_equal(self.grid, grid) and np.array_equal(self.part, part))

    def clear(self) -> None:
        if not self.producer:
            self.grid[...] = 0
            self.part[...] = 0
            self.seen = []

    # ------------------------------------------------------------ methods
    def memcpy(self) -> float:
        """Seconds one rank needs to copy one step's bytes (best of 3), measured on world rank 0."""
        secs = 0.0
        if self.world.rank == 0:
            src = np.ones(self.step_bytes // 8, dtype=np.uint64)
            dst = np.empty_like(src)
            dst[...] = src  # touch the pages
            best = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                np.copyto(dst, src)
                best = min(best, time.perf_counter() - t0)
            secs = best
        self.barrier()
        return float(self.world.bcast(secs, root=0))

    def hand(self) -> None:
        """The redistribution by hand: Isend/Irecv of precomputed intersections over an intercommunicator."""
        MPI = self.MPI
        inter = self.lcomm.intercomm(self.task, 1 - self.app, 777)
        try:
            for k in range(self.ns.steps):
                grid, part = self.produce(k) if self.producer else (self.grid, self.part)
                reqs = []
                for q, (ga, gb), (pa, pb) in self.plan:
                    if gb > ga:
                        buf = grid[ga:gb]
                        reqs.append(
                            inter.Isend(buf, q, 2 * k)
                            if self.producer
                            else inter.Irecv(buf, q, 2 * k)
                        )
                    if pb > pa:
                        buf = part[pa:pb]
                        reqs.append(
                            inter.Isend(buf, q, 2 * k + 1)
                            if self.producer
                            else inter.Irecv(buf, q, 2 * k + 1)
                        )
                MPI.Request.Waitall(reqs)
                if not self.producer:
                    self.consumed()
        finally:
            inter.Free()

    def _produce(self, path: str, **options) -> None:
        import lamina

        with lamina.open(path, "w", **options) as f:
            g = f.create_dataset("grid", (self.rows, ROW), np.uint64)
            p = f.create_dataset("particles", (self.npart, 3), np.float32)
            n = self.ns.blocks
            for k in range(self.ns.steps):
                grid, part = self.produce(k)
                with f.step():
                    if n == 1:
                        g.write(grid, offset=(self.g[0], 0), copy=False)
                        p.write(part, offset=(self.p[0], 0), copy=False)
                        continue
                    for ds, a, first in ((g, grid, self.g[0]), (p, part, self.p[0])):
                        # n blocks of rows (fewer where the rank has fewer rows), in one call
                        m = min(n, len(a))  # (a loop of n, not of the rows: --blocks 10^20)
                        cuts = sorted({len(a) * i // m for i in range(m + 1)})
                        ds.write_blocks(
                            [a[x:y] for x, y in zip(cuts, cuts[1:], strict=False)],
                            [(first + x, 0) for x in cuts[:-1]],
                            copy=False,
                        )

    def _consume(self, f) -> None:
        from ..geometry import Box

        gbox = Box((self.g[0], 0), (self.g[1], ROW))
        pbox = Box((self.p[0], 0), (self.p[1], 3))
        n = 0
        for view in f.iter_steps(timeout=120, poll=1e-3):
            view["grid"].read(gbox, out=self.grid)
            view["particles"].read(pbox, out=self.part)
            self.consumed()
            n += 1
        if n != self.ns.steps:
            raise RuntimeError(f"consumer saw {n} steps, expected {self.ns.steps}")

    def _open_reader(self, path: str, **options):
        import lamina

        from ..errors import LaminaError

        deadline = time.monotonic() + 120
        while True:
            try:
                return lamina.open(path, "r", **options)
            except (OSError, LaminaError):  # the producers have not created it yet
                late = time.monotonic() > deadline
                if self.lcomm.allreduce_int(self.task, int(late), "max"):
                    raise
            time.sleep(1e-3)

    def memory(self, path: str, shallow: bool, stats: bool = True) -> None:
        if self.producer:
            self._produce(
                path,
                transport="memory",
                shallow=["grid", "particles"] if shallow else (),
                stats=stats,
            )
        else:
            import lamina

            with lamina.open(path, "r", transport="memory") as f:
                self._consume(f)

    def file(self, path: str) -> None:
        if self.producer:
            self._produce(path, transport="file", durable=self.ns.durable)
        else:
            with self._open_reader(path, transport="file") as f:
                self._consume(f)

    def plain(self, path: str) -> None:
        if self.producer:
            self._produce(path, transport="file", durable=self.ns.durable)
        self.barrier()
        if not self.producer:
            with self._open_reader(path, transport="file") as f:
                self._consume(f)

    # ------------------------------------------------------------ the run
    def run(self) -> dict:
        d = self.ns.dir
        tag = [0]

        def path() -> str:
            tag[0] += 1
            return os.path.join(d, f"insitu-{tag[0]}.lam")

        def remove_files() -> None:
            self.barrier()
            if self.world.rank == 0:
                for name in os.listdir(d):
                    common.remove(os.path.join(d, name))
            self.barrier()

        runs = {
            HAND: self.hand,
            MEMORY: lambda: self.memory(path(), True),
            DEEP: lambda: self.memory(path(), False),
            NOSTATS: lambda: self.memory(path(), True, stats=False),
            FILE: lambda: self.file(path()),
            PLAIN: lambda: self.plain(path()),
        }
        methods = [m for m in METHODS if m in self.ns.methods]
        times: dict[str, list[float]] = {m: [] for m in methods}
        bad: list[str] = []
        for rep in range(-self.ns.warmup, self.ns.repeat):
            k = max(rep, 0) % len(methods)
            for m in methods[k:] + methods[:k]:
                self.clear()
                if self.world.rank == 0:
                    os.sync()
                dt = self.timed(runs[m])
                ok = self.world.allreduce(int(self.check()), op=self.MPI.MIN)
                if not ok and m not in bad:
                    bad.append(m)
                remove_files()
                if rep >= 0:
                    times[m].append(dt)
                if self.world.rank == 0:
                    sys.stdout.write(f"{common.PROGRESS}step {m} ({rep + 1}/{self.ns.repeat})\n")
                    sys.stdout.flush()
        copy = self.memcpy()
        moved = self.step_bytes * self.ns.steps
        rows = [{"name": m, **common.summarize(times[m])} for m in methods]
        return {
            "producers": self.P,
            "consumers": self.C,
            "steps": self.ns.steps,
            "step_bytes": self.step_bytes,
            "bytes": moved,
            "grid": [self.rows, ROW],
            "particles": self.npart,
            "memcpy_step_s": copy,
            "memcpy_floor_s": copy * self.ns.steps,
            "durable": bool(self.ns.durable),
            "blocks": self.ns.blocks,
            "rows": rows,
            "failed_checks": bad,
        }


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lamina.bench.insitu")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--durable", action="store_true")
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    return p


def worker_main(argv: list[str]) -> int:
    ns = worker_parser().parse_args(argv)
    ns.methods = [m for m in ns.methods.split(",") if m]
    w = Worker(ns)
    doc = w.run()
    if w.world.rank == 0:
        with open(ns.out, "w") as f:
            json.dump(doc, f)
    return 0


# ------------------------------------------------------------------ parent side
def launch_job(producers: int, consumers: int, args: list[str], timeout: float) -> dict:
    """``mpiexec -n P python -m mpi4py -m lamina.bench.insitu ... : -n C ...``; the job's JSON.

    Progress lines are shown on stderr; other output too.  A job that fails or
    runs past *timeout* seconds is killed, ranks included (RuntimeError).
    """
    from ..launch import find_mpiexec
    from .launch import run_json_job

    def command(out: str) -> list[str]:
        prog = [sys.executable, "-m", "mpi4py", "-m", "lamina.bench.insitu", *args, "--out", out]
        return [find_mpiexec(), "-n", str(producers), *prog, ":", "-n", str(consumers), *prog]

    def progress(text: str) -> None:
        print(
            f"  {producers}+{consumers} ranks: {text.split(None, 1)[-1].strip()}",
            file=sys.stderr,
            flush=True,
        )

    return run_json_job(
        command,
        f"job of {producers}+{consumers} ranks",
        timeout,
        progress,
        sys.stderr.write,
        env={"LAMINA_TRANSPORT": "file"},
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lamina bench insitu",
        description="In situ transport vs hand-written MPI, files and the memcpy floor (the LowFive synthetic "
        "benchmark): producers:consumers = 3:1, grid (uint64) + particles (3 x float32).",
    )
    p.add_argument(
        "--ranks",
        default="4,8",
        help="total ranks per job, producers:consumers = 3:1 (default 4,8)",
    )
    p.add_argument(
        "--size",
        default="64MiB",
        help="bytes moved per step, all producers together (default 64MiB)",
    )
    p.add_argument(
        "--steps", type=int, default=4, help="steps per run (default 4: 256 MiB per run)"
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="timed repetitions of every method (default 3)"
    )
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed runs of every method first (default 1)"
    )
    p.add_argument(
        "--methods",
        default=",".join(SHORT),
        help=f"comma-separated subset of {','.join(SHORT)} (default all)",
    )
    p.add_argument(
        "--durable",
        action="store_true",
        help="lamina file and native write+read open with durable=True: an fsync at every commit "
        "(default: durable=False, page cache, nobody fsyncs)",
    )
    p.add_argument(
        "--blocks",
        type=int,
        default=1,
        help="blocks each producer rank writes its grid rows in, and its particles in, each "
        "step (one write_blocks call each; default 1: one block each): the cost of many small "
        "blocks against the hand-written exchange of whole pieces",
    )
    common.add_timeout_argument(p, help="seconds per MPI job (default: from the sizes)")
    common.add_dir_json(p)
    return p


SHORT = {
    "hand": HAND,
    "memory": MEMORY,
    "deep": DEEP,
    "nostats": NOSTATS,
    "file": FILE,
    "plain": PLAIN,
}


def mode(durable: bool) -> str:
    """The report's line on what the file methods do with the disk."""
    what = (
        "durable=True (lamina fsyncs at every commit)"
        if durable
        else "durable=False (page cache, nobody fsyncs)"
    )
    return f"lamina file, native write+read: {what}; the other methods never touch the disk"


def report(jobs: list[dict], command: str, durable: bool = False) -> str:
    out = [mode(durable)]
    cpus = os.cpu_count() or 1
    for j in jobs:
        total = j["producers"] + j["consumers"]
        over = f"; {total} ranks on {cpus} cores: oversubscribed" if total > cpus else ""
        out.append(
            f"{j['producers']} producer + {j['consumers']} consumer ranks{over}: {j['steps']} steps x "
            f"{fmt_bytes(j['step_bytes'])} = {fmt_bytes(j['bytes'])} moved per run "
            f"(grid {j['grid'][0]} x {j['grid'][1]} uint64, {j['particles']} particles"
            + (
                f"; each producer rank writes each in {j['blocks']} blocks"
                if j.get("blocks", 1) > 1
                else ""
            )
            + ")"
        )
        rows = {r["name"]: r for r in j["rows"]}
        hand = rows.get(HAND)
        body = [
            [
                MEMCPY,
                f"{j['memcpy_floor_s']:.3f}",
                "-",
                f"{common.gibps(j['bytes'], j['memcpy_floor_s']):.2f}",
                "-",
            ]
        ]
        for r in j["rows"]:
            vs = (
                common.ratio_cell(common.speedup(r, hand)) if hand and r is not hand else "-"
            )  # r / hand
            body.append(
                [
                    r["name"],
                    f"{r['median']:.3f}",
                    f"{r['min']:.3f}",
                    f"{common.gibps(j['bytes'], r['median']):.2f}",
                    vs,
                ]
            )
        out.append(
            table(["method", "median s", "min s", "GiB/s", "time / hand-written (best)"], body)
        )

        def ratio(
            a, b, rows=rows
        ):  # time of a / time of b: paired median over repetitions, and min / min
            if a not in rows or b not in rows:
                return None, None
            return common.speedup(rows[a], rows[b])

        checks = []
        for name in (MEMORY, NOSTATS):
            mh = ratio(name, HAND)
            if mh[0] is not None:
                checks.append(
                    [
                        f"{name} / hand-written",
                        common.ratio_cell(mh),
                        "<= 1.10x",
                        common.verdict(mh[0], 1.1, False, mh[1]),
                    ]
                )
        fm = ratio(FILE, MEMORY)
        if fm[0] is not None:
            checks.append(
                [
                    "lamina file / lamina memory",
                    common.ratio_cell(fm),
                    ">= 5.00x",
                    common.verdict(fm[0], 5.0, True, fm[1]),
                ]
            )
        fp = ratio(FILE, PLAIN)
        if fp[0] is not None:
            checks.append(
                [
                    "lamina file / native write+read",
                    common.ratio_cell(fp),
                    "<= 1.10x",
                    common.verdict(fp[0], 1.1, False, fp[1]),
                ]
            )
        if MEMORY in rows:
            checks.append(
                [
                    "lamina memory / memcpy floor",
                    f"{rows[MEMORY]['median'] / j['memcpy_floor_s']:.2f}x",
                    "-",
                    "info",
                ]
            )
        out.append(
            table(
                ["ratio (paired median, best case)", "value", "target", "verdict"],
                checks,
                align="lrrl",
            )
        )
        if j["failed_checks"]:
            out.append(f"DATA CHECK FAILED for: {', '.join(j['failed_checks'])}\n")
    out.append(f"command: {command}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    try:
        ranks = common.parse_ranks(ns.ranks)
        size = common.parse_size(ns.size)
        methods = [SHORT[m] for m in common.parse_choices(ns.methods, "--methods", list(SHORT))]
    except ValueError as e:
        p.error(str(e))
    if any(r < 2 for r in ranks):
        p.error("--ranks: every job needs at least 2 ranks (a producer and a consumer)")
    if ns.steps < 1 or ns.repeat < 1:
        p.error("--steps and --repeat must be at least 1")
    if ns.warmup < 0:
        p.error(f"--warmup must be at least 0, got {ns.warmup}")
    if ns.blocks < 1:
        p.error(f"--blocks must be at least 1, got {ns.blocks}")
    try:
        common.check_memory(size, f"--size {ns.size} on {max(ranks)} ranks", max(ranks))
    except ValueError as e:
        p.error(str(e))
    if not methods:
        p.error("--methods: give at least one")
    timeout = ns.timeout
    if timeout is None:
        timeout = (
            120 + 30 * size * ns.steps / common.GiB * (ns.repeat + ns.warmup) * len(methods) * 4
        )
    own = ns.dir is None
    base = tempfile.mkdtemp(prefix="lamina-bench-insitu-") if own else os.path.abspath(ns.dir)
    os.makedirs(base, exist_ok=True)
    jobs = []
    try:
        for r in ranks:
            prod = max(1, (3 * r) // 4)
            cons = r - prod
            d = os.path.join(base, f"np{r}")
            os.makedirs(d, exist_ok=True)
            args = [
                "--size",
                str(size),
                "--steps",
                str(ns.steps),
                "--repeat",
                str(ns.repeat),
                "--warmup",
                str(max(0, ns.warmup)),
                "--methods",
                ",".join(methods),
                "--blocks",
                str(ns.blocks),
                "--dir",
                d,
            ]
            if ns.durable:
                args.append("--durable")
            try:
                jobs.append(launch_job(prod, cons, args, timeout))
            except (RuntimeError, FileNotFoundError) as e:
                print(f"lamina bench insitu: {e}", file=sys.stderr)
                return 1
            finally:
                common.remove(d)
    finally:
        if own:
            common.remove(base)
    command = "lamina bench insitu " + " ".join(argv)
    common.emit(
        ns.json,
        report(jobs, command, ns.durable),
        {"command": command, "machine": common.machine(), "durable": ns.durable, "jobs": jobs},
    )
    return 0 if not any(j["failed_checks"] for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
