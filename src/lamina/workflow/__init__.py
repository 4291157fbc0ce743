"""Workflows: which program of an MPMD launch produces which name, and launching them.

* :mod:`.routes` -- ``LAMINA_WORKFLOW``: per name, the producer task, the
  consumer tasks, their flow policies and producer options (pure; the in situ
  transport reads it);
* :mod:`.file` -- workflow files (YAML): the programs, their ranks and the
  names they write and read, checked, turned into ``LAMINA_WORKFLOW``;
* :mod:`.launcher` -- one ``mpiexec A : B : C`` job for the tasks of a file;
* :mod:`.exec` -- what each rank of that job runs: a task's command, read
  from a variable, so that no word of the file is on ``mpiexec``'s line;
* :mod:`.command` -- ``lamina run WORKFLOW.yaml``;
* :mod:`.standalone` -- the same command in a process without MPI, which
  ``lamina run`` turns into before it launches.
"""

from typing import TYPE_CHECKING

from .. import lazy

if TYPE_CHECKING:
    from .file import WorkflowFile, WorkflowFileError, load
    from .routes import Route, Workflow

#: where each name below lives: imported at its first use (lamina.lazy)
_WHERE = {
    "WorkflowFile": ".file",
    "WorkflowFileError": ".file",
    "load": ".file",
    "Route": ".routes",
    "Workflow": ".routes",
}

__getattr__ = lazy.getattr_for(__name__, _WHERE, globals())


__all__ = ["Route", "Workflow", "WorkflowFile", "WorkflowFileError", "load"]
