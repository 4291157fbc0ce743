"""Which task produces a name and which tasks consume it.  Pure: no MPI.

A *workflow* names, per file name (a glob pattern), the task (MPMD appnum)
that writes it and the tasks that read it::

    LAMINA_WORKFLOW="sim.lam=0>1,2; ana.lam=1>2"

Entries are separated by ``;`` or new lines; a pattern matches the name
given to ``lamina.open`` or its last path component; the first matching
entry wins.  Names that match no entry are not transported: they stay
files.  Without a workflow, a launch of exactly two tasks needs none: the
task that opens a name for writing produces it and the other task consumes
it.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from ...errors import TransportError

ENV = "LAMINA_WORKFLOW"


@dataclass(frozen=True, slots=True)
class Route:
    """The producer task and the consumer tasks of one name."""

    producer: int
    consumers: tuple[int, ...]


def normname(path: str) -> str:
    """The name both sides compare: the path as given, normalized (``./a//b`` -> ``a/b``)."""
    return os.path.normpath(str(path))


class Workflow:
    """Parsed ``LAMINA_WORKFLOW``: ``[(pattern, Route)]`` in order."""

    def __init__(self, entries: list[tuple[str, Route]]) -> None:
        self.entries = entries

    @classmethod
    def parse(cls, text: str) -> Workflow:
        entries = []
        for raw in text.replace("\n", ";").split(";"):
            item = raw.strip()
            if not item:
                continue
            pattern, eq, rest = item.rpartition("=")
            prod, gt, cons = rest.partition(">")
            pattern = pattern.strip()
            if not eq or not gt or not pattern:
                raise ValueError(f"{ENV}: entry {item!r} is not PATTERN=PRODUCER>CONSUMER[,CONSUMER...]")
            try:
                p = int(prod)
                cs = tuple(int(c) for c in cons.split(",") if c.strip())
            except ValueError:
                raise ValueError(f"{ENV}: entry {item!r}: tasks are MPMD appnums (integers)") from None
            if not cs or p < 0 or min(cs) < 0 or p in cs or len(set(cs)) != len(cs):
                raise ValueError(
                    f"{ENV}: entry {item!r} needs one producer and distinct consumers other than the producer"
                )
            entries.append((pattern, Route(p, tuple(sorted(cs)))))
        return cls(entries)

    def route(self, name: str) -> Route | None:
        name = normname(name)
        base = os.path.basename(name)
        for pattern, route in self.entries:
            if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(base, pattern):
                return route
        return None


def from_env(env=None) -> Workflow | None:
    text = (os.environ if env is None else env).get(ENV, "").strip()
    return Workflow.parse(text) if text else None


def in_memory(name: str, env=None) -> bool:
    """Whether *name* travels in memory when the memory transport is chosen (no MPI needed)."""
    wf = from_env(env)
    return wf is None or wf.route(name) is not None


def route_for(name: str, mode: str, app: int, ntasks: int, workflow: Workflow | None) -> Route:
    """The route of *name* opened in *mode* by task *app* of *ntasks*; TransportError if there is none."""
    if ntasks < 2:
        raise TransportError(
            f"the memory transport of {name!r} needs a producer and a consumer program in one MPMD "
            "launch (mpiexec -n N producer : -n M consumer); this launch has one program"
        )
    if workflow is None:
        if ntasks != 2:
            raise TransportError(
                f"{ntasks} programs share this launch: set {ENV} (e.g. '{os.path.basename(name)}=0>1') "
                f"to say which one produces {name!r} and which consume it"
            )
        other = 1 - app
        return Route(app, (other,)) if mode != "r" else Route(other, (app,))
    route = workflow.route(name)
    if route is None:
        raise TransportError(f"{ENV} names no producer for {name!r}")
    for t in (route.producer, *route.consumers):
        if t >= ntasks:
            raise TransportError(f"{ENV} routes {name!r} through task {t}, but the launch has {ntasks} programs")
    if mode != "r" and route.producer != app:
        raise TransportError(
            f"task {app} opens {name!r} for writing, but {ENV} says task {route.producer} produces it"
        )
    if mode == "r" and app not in route.consumers:
        raise TransportError(
            f"task {app} opens {name!r} for reading, but {ENV} lists only tasks {list(route.consumers)} as its consumers"
        )
    return route
