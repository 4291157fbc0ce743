"""Killed peers of the in situ transport: one rank dies by SIGKILL in the middle of a run.

    transport_kill.py produce NAME STEPS DIR [--die-rank R --die-after K]
    transport_kill.py consume NAME STEPS DIR [--die-rank R --die-after K] [--await-death] [--collective-wait]

``produce`` writes up to STEPS steps of ``x`` (int64, 8 x 6, rows split over
the ranks; cell i of step k holds i + 1000 k), then closes.  ``consume``
follows the steps with ``f.at(k)`` and checks every value of each, then
closes.  With ``--die-rank R --die-after K``, rank R of the program writes
``DIR/died.ROLE.R.json`` (the time) and SIGKILLs itself once step K is
committed (producer) or read and checked (consumer).  With
``--await-death`` a consumer waits for a producer's death marker after
``f.at(K)`` and before reading step K, so that its reads meet a dead rank;
with ``--collective-wait`` it also waits for the step it could not get with
``f.wait_for_step(k, timeout=None)`` (collective: no user timeout, only the
transport's).

Every call is timed; an exception is recorded (class, message), never
raised.  Each surviving rank writes ``DIR/ROLE.RANK.json``: its events
(what, start, end, error class), ``steps`` (the file's step count as the
program sees it after the last step call) and ``stuck_in`` (the call it was
in when the test asked every program to leave, by creating ``DIR/finish``;
None if it finished by itself).  Then it leaves with ``os._exit``: under
MPICH, ``MPI_Finalize`` waits for every process of the launch, the dead one
included, and would never return.

Launch with ``mpi_util.KEEP_GOING`` and ``mpi_util.survivable`` (otherwise
hydra ends every rank when one is killed), ``LAMINA_TRANSPORT=memory`` or
``both`` and a short ``LAMINA_TRANSPORT_TIMEOUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import traceback

import numpy as np

import lamina
from lamina.errors import TransportError

SHAPE = (8, 6)
FILL = -1


def rows(rank: int, size: int) -> tuple[int, int]:
    """Producer *rank*'s rows: uneven slabs, every rank at least one row."""
    edges = np.linspace(0, SHAPE[0], size + 1).round().astype(int)
    return int(edges[rank]), int(edges[rank + 1])


def expected(step: int, a: int = 0, b: int = SHAPE[0]) -> np.ndarray:
    idx = np.arange(SHAPE[0] * SHAPE[1], dtype=np.int64).reshape(SHAPE)
    return idx[a:b] + 1000 * step


def _write_json(path: str, data) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


class Report:
    """What one rank saw; written once, then the process leaves (see the module docstring)."""

    def __init__(self, role: str, rank: int, folder: str) -> None:
        self.path = os.path.join(folder, f"{role}.{rank}.json")
        self.finish = os.path.join(folder, "finish")
        self.data = {
            "role": role,
            "rank": rank,
            "pid": os.getpid(),
            "events": [],
            "steps": None,
            "stuck_in": None,
        }
        self.doing: str | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._watchdog, daemon=True).start()

    def run(self, what: str, fn):
        """Call *fn* and record it; returns ``(True, result)`` or ``(False, None)`` after an exception."""
        self.doing = what
        t0 = time.time()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - every outcome is recorded for the test to judge
            self.data["events"].append(
                {
                    "what": what,
                    "t0": t0,
                    "t1": time.time(),
                    "error": type(e).__name__,
                    "transport": isinstance(e, TransportError),
                    "message": str(e)[:500],
                    "trace": ""
                    if isinstance(e, TransportError)
                    else traceback.format_exc()[-2000:],
                }
            )
            return False, None
        finally:
            self.doing = None
        self.data["events"].append({"what": what, "t0": t0, "t1": time.time(), "error": None})
        return True, out

    def leave(self, stuck: str | None = None) -> None:
        with self._lock:  # once: the watchdog and the program's thread may both get here
            self.data["stuck_in"] = stuck
            _write_json(self.path, self.data)
            os._exit(0)

    def _watchdog(self) -> None:
        while not os.path.exists(self.finish):
            time.sleep(0.05)
        self.leave(stuck=self.doing or "between calls")


def die(folder: str, role: str, rank: int, after: str) -> None:
    _write_json(
        os.path.join(folder, f"died.{role}.{rank}.json"),
        {"t": time.time(), "after": after, "pid": os.getpid()},
    )
    os.kill(os.getpid(), signal.SIGKILL)


def produce(a, rank: int, size: int, rep: Report) -> None:
    ok, f = rep.run("open", lambda: lamina.open(a.name, "w"))
    if not ok:
        rep.leave()
    f.create_dataset("x", SHAPE, np.int64, fill=FILL)
    f.attrs["run"] = "kill"
    lo, hi = rows(rank, size)

    def one_step(k: int) -> None:
        with f.step():
            f["x"][lo:hi] = expected(k, lo, hi)

    for k in range(a.steps):
        ok, _ = rep.run(f"step {k}", lambda k=k: one_step(k))
        rep.data["steps"] = f.steps
        if not ok:
            break
        if rank == a.die_rank and k == a.die_after:
            die(a.dir, "producer", rank, f"step {k}")
    rep.run("close", f.close)
    rep.leave()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X")


def _await_death(folder: str, timeout: float = 60) -> None:
    """Wait until a producer rank wrote its death marker and its process is gone."""
    deadline = time.monotonic() + timeout
    while True:
        marks = [
            n for n in os.listdir(folder) if n.startswith("died.producer.") and n.endswith(".json")
        ]
        pids = []
        for n in marks:
            with open(os.path.join(folder, n)) as fh:
                pids.append(json.load(fh)["pid"])
        if pids and all(_gone(p) for p in pids):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no producer died within {timeout} s")
        time.sleep(0.02)


def _check(view, k: int) -> None:
    got = view["x"][...]
    if not np.array_equal(got, expected(k)):
        raise AssertionError(f"step {k}: wrong values\n{got}")


def consume(a, rank: int, size: int, rep: Report) -> None:
    ok, f = rep.run("open", lambda: lamina.open(a.name, "r"))
    if not ok:
        rep.leave()
    missing = None
    for k in range(a.steps):
        ok, view = rep.run(f"at {k}", lambda k=k: f.at(k))
        if not ok:
            missing = k
            break
        if a.await_death and k == a.die_after:
            rep.run("await death", lambda: _await_death(a.dir))
        ok, _ = rep.run(f"read {k}", lambda view=view, k=k: _check(view, k))
        if ok and rank == a.die_rank and k == a.die_after:
            die(a.dir, "consumer", rank, f"read {k}")
    if missing is not None and a.collective_wait:
        rep.run(f"wait_for_step {missing}", lambda: f.wait_for_step(missing, timeout=None))
    rep.data["steps"] = f.steps
    rep.run("close", f.close)
    rep.leave()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["produce", "consume"])
    p.add_argument("name")
    p.add_argument("steps", type=int)
    p.add_argument("dir")
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-after", type=int, default=-1)
    p.add_argument("--await-death", action="store_true")
    p.add_argument("--collective-wait", action="store_true")
    a = p.parse_args()
    comm = (
        lamina.comm.task_comm()
    )  # collective over the launch: every program makes this call first
    role = "producer" if a.role == "produce" else "consumer"
    rep = Report(role, comm.rank, a.dir)
    (produce if a.role == "produce" else consume)(a, comm.rank, comm.size, rep)


if __name__ == "__main__":
    main()
