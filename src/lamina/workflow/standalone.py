"""``lamina run`` in a process without MPI: the launcher proper.

Importing :mod:`lamina` initializes MPI (``mpi4py.MPI``, for the I/O
code), and the ``lamina`` command imports it before it reads its first
argument.  A process that starts an MPI job and waits for it must not be an
MPI process itself: it would hold a shared-memory segment of its own (left
behind when it is killed), and the communication library MPICH loads
(UCX) catches SIGHUP, so that ``lamina run`` and its job would outlive the
terminal they ran in.  So :func:`lamina.workflow.command.main`, when it is
the program (``lamina run``, ``python -m lamina run``, ``python -m
lamina.workflow.command``) and finds MPI loaded, finalizes it and replaces
itself (``os.execv``: the same process id) with this script, run as
``python -P .../lamina/workflow/standalone.py ARGS``.

This script imports :mod:`lamina.workflow.command` without running the
package's ``__init__`` (a bare ``lamina`` package stands in for it), so
neither ``mpi4py.MPI`` nor libmpi is loaded, and it tells mpi4py not to
initialize MPI should anything import it after all.  What ``lamina run``
imports (:mod:`lamina.workflow`, :mod:`lamina.launch`, :mod:`lamina.errors`,
:mod:`lamina.text`) must not need the package's ``__init__``.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

#: this file: what the ``lamina`` program replaces itself with
PATH = os.path.abspath(__file__)


def _bare_package() -> None:
    """A ``lamina`` package of this file's tree without its ``__init__`` (if none is loaded)."""
    if "lamina" in sys.modules:
        return
    where = os.path.dirname(os.path.dirname(PATH))
    spec = importlib.machinery.ModuleSpec("lamina", None, is_package=True)
    spec.submodule_search_locations = [where]
    pkg = types.ModuleType("lamina", "lamina, without its __init__ (lamina run's launcher)")
    pkg.__spec__ = spec
    pkg.__path__ = [where]
    pkg.__package__ = "lamina"
    sys.modules["lamina"] = pkg


def main(args: list[str] | None = None) -> int:
    """``lamina run ARGS`` with no MPI in this process."""
    try:
        import mpi4py
    except ImportError:  # pragma: no cover - lamina needs it, lamina run does not
        pass
    else:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
    _bare_package()
    from lamina.workflow.command import main as command_main

    return command_main(sys.argv[1:] if args is None else args)


if __name__ == "__main__":
    sys.exit(main())
