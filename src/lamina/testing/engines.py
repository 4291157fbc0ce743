"""The behaviour every lamina engine must show, as a reusable pytest base class.

::

    from lamina.testing.engines import EngineTests

    class TestMyEngine(EngineTests):
        engine = "myengine"                       # its registered name
        capabilities = frozenset({"random_access", "writer_reads", "stored_codecs", "reopen"})

Every round trip of :mod:`lamina.testing.cases` becomes a test
``test_round_trip[CASE]``; a case that needs a capability the engine lacks is
skipped, saying which (``lamina.testing.cases.CAPABILITIES``).

:class:`LaunchedEngineTests` runs the same cases as real programs under
``mpiexec``: ``writers`` ranks write, ``readers`` ranks read, one launch
after the other (engines that write files), or side by side in one MPMD
launch (``mpmd = True``: the in situ transport, where the reader is a second
program).  One launch runs every case, as launches cost seconds; each test
then reports its own case's outcome, with the failing rank's traceback.

The launched programs are this module: ``python -m mpi4py -m
lamina.testing.engines --role write|read ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from typing import Any, ClassVar

import pytest

import lamina
from lamina import comm as comm_mod
from lamina import launch

from .cases import CAPABILITIES, CASES, Case, Context

#: seconds a launched program may wait for its peer before a case fails (transport options)
PEER_TIMEOUT = 30.0


def filename(case: Case) -> str:
    """A file name for *case* (its name, with what a file system dislikes replaced)."""
    return re.sub(r"[^A-Za-z0-9_.+=,-]", "_", case.name)


def run_side(
    role: str,
    case: Case,
    path: str,
    engine: str,
    capabilities: frozenset[str],
    comm=None,
    options=None,
    timeout: float = 60.0,
    writers: int | None = None,
) -> None:
    """Collective over *comm* (default: the task's): one side of *case* on *path* with *engine*.

    *role* ``'write'`` opens the file for writing and runs ``case.write``;
    ``'read'`` opens it for reading and runs ``case.read``, knowing that
    *writers* ranks wrote it.
    """
    write = role == "write"
    opts = {**(options or {}), **(case.options() if write else {})}
    f = lamina.open(path, "w" if write else "r", comm=comm, engine=engine, **opts)
    n = f.comm.size if write else (writers or 1)
    ctx = Context(case.name, engine, capabilities, f.comm.rank, f.comm.size, n, timeout)
    with f:
        (case.write if write else case.read)(f, ctx)


class EngineTests:
    """The round trips, in this process, for an engine whose files outlive their writer."""

    #: the registered name of the engine under test
    engine: ClassVar[str] = ""
    #: what the engine can do (keys of lamina.testing.cases.CAPABILITIES)
    capabilities: ClassVar[frozenset[str]] = frozenset(CAPABILITIES)
    #: options for every writer's lamina.open
    options: ClassVar[dict[str, Any]] = {}
    #: options for every reader's lamina.open
    read_options: ClassVar[dict[str, Any]] = {}

    def location(self, directory: str, case: Case) -> str:
        """Where *case*'s file goes (a path under *directory*, or a name for an engine without files)."""
        return os.path.join(directory, filename(case) + ".lam")

    def cleanup(self, path: str) -> None:
        """Forget what a case left at *path* (files under the test's directory go with it)."""

    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    def test_round_trip(self, case: Case, tmp_path, request) -> None:
        missing = sorted(case.needs - self.capabilities)
        if missing:
            pytest.skip(
                f"engine {self.engine!r} lacks {', '.join(missing)}: "
                + "; ".join(CAPABILITIES[m] for m in missing)
            )
        self.run_case(case, str(tmp_path), request)

    def run_case(self, case: Case, directory: str, request) -> None:
        path = self.location(directory, case)
        try:
            run_side("write", case, path, self.engine, self.capabilities, options=self.options)
            run_side("read", case, path, self.engine, self.capabilities, options=self.read_options)
        finally:
            self.cleanup(path)


class LaunchedEngineTests(EngineTests):
    """The round trips as programs under ``mpiexec``, ``writers`` ranks writing and ``readers`` reading."""

    writers: ClassVar[int] = 2
    readers: ClassVar[int] = 3
    #: writer and reader side by side in one MPMD launch (else the readers run after the writers)
    mpmd: ClassVar[bool] = False
    #: seconds for a whole launch (every case) before it is killed (below pytest-timeout's 300)
    launch_timeout: ClassVar[float] = 240.0
    #: after the launch, read every case's file again with this engine (for an engine that also
    #: writes files, such as 'both'), with every capability
    reread_engine: ClassVar[str | None] = None

    @pytest.fixture(scope="class")
    @classmethod
    def launch_outcomes(cls, tmp_path_factory) -> dict[tuple[str, str], str | None]:
        directory = str(tmp_path_factory.mktemp(f"{cls.engine}-cases"))
        cases = [c for c in CASES if not (c.needs - cls.capabilities)]
        return run_launches(cls, cases, directory)

    def run_case(self, case: Case, directory: str, request) -> None:
        outcomes = request.getfixturevalue("launch_outcomes")
        roles = ("write", "read", "reread") if self.reread_engine else ("write", "read")
        problems = [
            f"{role}: {outcomes[(role, case.name)]}"
            for role in roles
            if outcomes[(role, case.name)] is not None
        ]
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)


def _program(
    role: str, cls: type[LaunchedEngineTests], directory: str, listing: str, out: str
) -> list[str]:
    opts = cls.options if role == "write" else cls.read_options if role == "read" else {}
    engine = cls.reread_engine if role == "reread" else cls.engine
    caps = frozenset(CAPABILITIES) if role == "reread" else cls.capabilities
    return [
        sys.executable,
        "-m",
        "mpi4py",
        "-m",
        "lamina.testing.engines",
        "--role",
        "write" if role == "write" else "read",
        "--engine",
        str(engine),
        "--capabilities",
        ",".join(sorted(caps)),
        "--options",
        json.dumps(opts),
        "--writers",
        str(cls.writers),
        "--dir",
        directory,
        "--cases",
        listing,
        "--out",
        out,
    ]


def run_launches(
    cls: type[LaunchedEngineTests], cases: list[Case], directory: str
) -> dict[tuple[str, str], str | None]:
    """Run *cases* for *cls* as one MPMD launch or two launches; ``{(role, case): error or None}``."""
    exe = launch.find_mpiexec(required=True)
    assert exe is not None
    flags = ["--oversubscribe"] if launch.is_open_mpi(exe) else []
    roles = ("write", "read", "reread") if cls.reread_engine else ("write", "read")
    outs = {role: os.path.join(directory, f"outcomes-{role}.json") for role in roles}
    listing = os.path.join(directory, "cases.json")
    with open(listing, "w") as fh:
        json.dump([c.name for c in cases], fh)
    env = launch.child_env()
    for k in ("LAMINA_ENGINE", "LAMINA_TRANSPORT", "LAMINA_WORKFLOW"):
        env.pop(k, None)
    w = ["-n", str(cls.writers), *_program("write", cls, directory, listing, outs["write"])]
    r = ["-n", str(cls.readers), *_program("read", cls, directory, listing, outs["read"])]
    jobs = [[exe, *flags, *w, ":", *r]] if cls.mpmd else [[exe, *flags, *w], [exe, *flags, *r]]
    if cls.reread_engine:
        jobs.append(
            [
                exe,
                *flags,
                "-n",
                str(cls.readers),
                *_program("reread", cls, directory, listing, outs["reread"]),
            ]
        )
    logs = []
    deadline = time.monotonic() + cls.launch_timeout
    for cmd in jobs:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            text, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            launch.kill_job(proc)
            text, _ = proc.communicate()
            text = (text or "") + f"\n*** killed after {cls.launch_timeout:g} s ***\n"
        logs.append(f"$ {' '.join(cmd)}\n(exit status {proc.returncode})\n{(text or '')[-20000:]}")
    outcomes: dict[tuple[str, str], str | None] = {}
    for role, path in outs.items():
        try:
            with open(path) as fh:
                got = json.load(fh)
        except (OSError, ValueError):
            continue
        for name, err in got.items():
            outcomes[(role, name)] = err
    for c in cases:  # a launch that died: its log is the best explanation there is
        for role in roles:
            if (role, c.name) not in outcomes:
                outcomes[(role, c.name)] = (
                    "no outcome: the launch ended before this case\n" + "\n".join(logs)
                )
    return outcomes


# ----------------------------------------------------------------- the launched program


def main(argv: list[str] | None = None) -> int:
    """One side of a launch: run every listed case in *role*, record each outcome, never stop at a failure."""
    p = argparse.ArgumentParser(prog="python -m lamina.testing.engines")
    p.add_argument("--role", choices=("write", "read"), required=True)
    p.add_argument("--engine", required=True)
    p.add_argument("--capabilities", default="")
    p.add_argument("--options", default="{}")
    p.add_argument("--writers", type=int, default=1)
    p.add_argument("--dir", required=True, help="where the cases' files go")
    p.add_argument(
        "--cases", required=True, help="a JSON file listing the names of the cases to run, in order"
    )
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=PEER_TIMEOUT)
    args = p.parse_args(argv)
    caps = frozenset(c for c in args.capabilities.split(",") if c)
    options = json.loads(args.options)
    with open(args.cases) as fh:
        wanted = json.load(fh)
    by_name = {c.name: c for c in CASES}
    comm = comm_mod.task_comm()
    mine: dict[str, str | None] = {}
    for name in wanted:
        case = by_name[name]
        path = os.path.join(args.dir, filename(case) + ".lam")
        try:
            run_side(
                args.role, case, path, args.engine, caps, comm, options, args.timeout, args.writers
            )
            mine[name] = None
        except Exception as e:  # recorded; the next case goes on
            mine[name] = f"rank {comm.rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"
            print(
                f"[{args.role} rank {comm.rank}] {name}: {type(e).__name__}: {e}",
                file=sys.stderr,
                flush=True,
            )
    everyone = comm_mod.gather_bytes(comm, json.dumps(mine).encode(), root=0)
    if comm.rank == 0:
        assert everyone is not None
        merged: dict[str, str | None] = {}
        for raw in everyone:
            for name, err in json.loads(raw).items():
                if merged.get(name) is None:
                    merged[name] = err
        with open(args.out, "w") as fh:
            json.dump(merged, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
