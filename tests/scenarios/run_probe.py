"""A task of a ``lamina run`` workflow that reports what the workflow gave it.

    run_probe.py write NAME STEPS     writes x = [k] * 8 and grid = [k] * 4 at step k, with no options
    run_probe.py read NAME STEPS      reads and checks every step

Rank 0 of each task prints one line ``PROBE {json}``: its appnum, the
transport and workflow it sees in its environment, the producer defaults
``workflow.options_for`` gives it for NAME, and (writer) the ``queue_limit``
and ``shallow`` its engine uses.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from transport_common import say

import lamina
from lamina.comm import appnum
from lamina.workflow import routes as workflow


def main() -> None:
    role, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    comm = lamina.comm.task_comm()
    app = appnum()
    wf = workflow.from_env()
    report = {
        "app": app,
        "role": role,
        "transport": os.environ.get("LAMINA_TRANSPORT"),
        "workflow": os.environ.get(workflow.ENV),
        "timeout": os.environ.get("LAMINA_TRANSPORT_TIMEOUT"),
        "marker": os.environ.get("RUN_PROBE_MARKER"),
        "cwd": os.getcwd(),
        "options": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in workflow.options_for(name, role[0], app, wf).items()
        },
    }
    if role == "write":
        with lamina.open(name, "w") as f:
            f.create_dataset("x", (8,), np.int64)
            f.create_dataset("grid", (4,), np.int64)
            for k in range(steps):
                with f.step():
                    a, b = f.comm.rank * 8 // f.comm.size, (f.comm.rank + 1) * 8 // f.comm.size
                    f["x"][a:b] = np.full(b - a, k)
                    if f.comm.rank == 0:
                        f["grid"][:] = np.full(4, k)
            report["engine"] = f.engine.name
            report["queue_limit"] = getattr(f.engine.stack()[-1], "queue_limit", None)
            report["shallow"] = list(getattr(f.engine.stack()[-1], "shallow", ()))
    else:
        seen = 0
        with lamina.open(name, "r") as f:
            for view in f.iter_steps(timeout=60, poll=1e-3):
                x, g = view["x"][:], view["grid"][:]
                if not (x == view.index).all() or not (g == view.index).all():
                    raise AssertionError(f"step {view.index}: x={x} grid={g}")
                seen += 1
            report["engine"] = f.engine.name
        if seen != steps:
            raise AssertionError(f"saw {seen} steps, expected {steps}")
        report["steps"] = seen
    if comm.rank == 0:
        say("PROBE " + json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
