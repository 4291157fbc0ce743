"""Parent side of ``lamina bench``: launch one MPI job per rank count and collect its results.

``mpiexec -n R python -m mpi4py -m lamina.bench.worker MODE ...`` runs every
method in one job; the worker reports progress lines on stdout (they advance
a tqdm bar here) and writes its results as JSON to a file we name.  A job
that fails or runs past its time limit is killed, ranks included.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from ..launch import child_env, find_mpiexec
from ..launch import kill_job as _kill_job
from . import common
from .common import PROGRESS, CommonOptions, remove


def run_json_job(
    command: Callable[[str], list[str]],
    what: str,
    timeout: float,
    on_progress: Callable[[str], None],
    on_output: Callable[[str], None],
    env: dict | None = None,
) -> dict:
    """Run the MPI job ``command(out)`` and return the JSON it writes to the file *out*.

    Lines starting with :data:`PROGRESS` go to *on_progress* (without the
    prefix), other output lines to *on_output*.  Raises RuntimeError, naming
    the job as *what*, if it fails or runs past *timeout* seconds (the job is
    then killed, ranks included).  *env* adds variables to the child's.
    """
    fd, out = tempfile.mkstemp(prefix="lamina-bench-", suffix=".json")
    os.close(fd)
    cmd = command(out)
    tail: list[str] = []
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(env),
        bufsize=1,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_job(proc)
                raise RuntimeError(
                    f"{what} timed out after {timeout:.0f} s (use --timeout to allow more)\n"
                    + "".join(tail[-20:])
                )
            if not sel.select(timeout=min(left, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(PROGRESS):
                on_progress(line[len(PROGRESS) :])
                continue
            tail.append(line)
            on_output(line)
        rc = proc.wait()
        if rc != 0:
            raise RuntimeError(
                f"{what} failed (exit {rc}): {' '.join(cmd)}\n" + "".join(tail[-20:])
            )
        with open(out) as f:
            return json.load(f)
    except BaseException:
        if proc.poll() is None:
            _kill_job(proc)
        raise
    finally:
        try:
            os.remove(out)
        except OSError:
            pass


def run_job(
    ranks: int, args: list[str], bar, timeout: float, module: str = "lamina.bench.worker"
) -> dict:
    """Launch ``mpiexec -n ranks python -m mpi4py -m MODULE ...``; return its JSON.

    Progress lines from the worker advance *bar* (a tqdm); other output goes
    to stderr.  Raises RuntimeError if the job fails or times out (the job
    is then killed, ranks included).
    """

    def command(out: str) -> list[str]:
        worker = [sys.executable, "-m", "mpi4py", "-m", module]
        return [find_mpiexec(), "-n", str(ranks), *worker, *args, "--out", out]

    def progress(text: str) -> None:
        parts = text.split(None, 1)
        if parts and parts[0] == "step":
            bar.update(1)
            if len(parts) > 1:
                bar.set_postfix_str(f"{ranks} rank(s): {parts[1].strip()}", refresh=False)

    load0 = os.getloadavg()
    doc = run_json_job(
        command,
        f"benchmark job with {ranks} ranks",
        timeout,
        progress,
        lambda line: bar.write(line.rstrip("\n"), file=sys.stderr),
    )
    doc["loadavg"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
    return doc


def make_bar(total: int, desc: str):
    """A tqdm bar on stderr (disabled when there is nothing to show)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        file=sys.stderr,
        unit="run",
        dynamic_ncols=True,
        disable=None if total > 0 else True,
        leave=False,
    )


def worker_args(mode: str, o: CommonOptions, directory: str) -> list[str]:
    args = [
        mode,
        "--size",
        str(o.size),
        "--repeat",
        str(o.repeat),
        "--warmup",
        str(o.warmup),
        "--aggregators",
        ",".join(o.aggregators),
        "--dir",
        directory,
        "--methods",
        ",".join(o.methods),
        "--seed",
        str(o.seed),
    ]
    if o.fsync:
        args.append("--fsync")
    if o.drop_caches:
        args.append("--drop-caches")
    return args


def run_all(mode: str, o: CommonOptions, steps_for: Callable[[int], int], desc: str) -> list[dict]:
    """Run one job per rank count; returns the jobs' JSON results, in order."""
    own_dir = o.dir is None
    base = tempfile.mkdtemp(prefix=f"lamina-bench-{mode}-") if own_dir else os.path.abspath(o.dir)
    os.makedirs(base, exist_ok=True)
    results = []
    bar = make_bar(sum(steps_for(r) for r in o.ranks), desc)
    try:
        for r in o.ranks:
            d = os.path.join(base, f"{mode}-np{r}")
            os.makedirs(d, exist_ok=True)
            try:
                results.append(run_job(r, worker_args(mode, o, d), bar, o.timeout))
            finally:
                if not o.keep:
                    remove(d)
    finally:
        bar.close()
        if own_dir and not o.keep:
            remove(base)
    return results


def run_and_report(
    mode: str, o: CommonOptions, steps_for: Callable[[int], int], report, argv: list[str]
) -> int:
    """Run every rank count's job for ``lamina bench MODE``, then print (or emit as JSON) the report."""
    try:
        jobs = run_all(mode, o, steps_for, f"bench {mode}")
    except (RuntimeError, FileNotFoundError) as e:
        print(f"lamina bench {mode}: {e}", file=sys.stderr)
        return 1
    text, doc = report(o, jobs, argv)
    common.emit(o.json, text, doc)
    return 0
