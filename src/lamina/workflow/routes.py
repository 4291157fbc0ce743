"""Which task produces a name and which tasks consume it.  Pure: no MPI.

A *workflow* names, per file name (a glob pattern), the task (MPMD appnum)
that writes it and the tasks that read it::

    LAMINA_WORKFLOW="sim.lam=0>1,2; ana.lam=1>2"

Entries are separated by ``;`` or new lines; a pattern matches the name
given to ``lamina.open`` or its last path component; the first matching
entry wins.  A consumer may carry a flow policy, ``CONSUMER:FLOW`` with
FLOW ``all`` (every step, the default), ``latest`` (the newest step
whenever it is ready; stale steps are dropped) or N (every N-th step)::

    LAMINA_WORKFLOW="sim.lam=0>1:latest,2:10"

An entry may end with options for the producer of its names, each after a
``|``: ``queue_limit=N`` (N >= 2) and ``shallow=GLOB[,GLOB...]`` (datasets
served without a copy)::

    LAMINA_WORKFLOW="sim.lam=0>1 | queue_limit=3 | shallow=particles,grid/*"

They are defaults: the producer's own ``lamina.open`` options win (see
:func:`options_for`).  ``lamina run`` writes this variable from a workflow
file.  Names that match no entry are not transported: they stay
files.  Without a workflow, a launch of exactly two tasks needs none: the
task that opens a name for writing produces it and the other task consumes
it.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, TransportError

ENV = "LAMINA_WORKFLOW"

#: flow policy code of ``latest``; N >= 1 means every N-th step (1: every step)
LATEST = 0

#: producer options an entry may carry after ``|`` (defaults for ``lamina.open``)
OPTION_KEYS = ("queue_limit", "shallow")


#: the largest N of a flow 'every N-th step' (the rendezvous sends it as 32 bits, LATEST apart)
MAX_FLOW = (1 << 32) - 1


def parse_flow(value) -> int:
    """``'all'`` -> 1, ``'latest'`` -> :data:`LATEST`, N or ``'N'`` (1 <= N <= :data:`MAX_FLOW`)
    -> N; ValueError otherwise."""
    n = None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return 1
        if text == "latest":
            return LATEST
        if text.isdigit():
            n = int(text)
    elif isinstance(value, int | np.integer) and not isinstance(value, bool):
        n = int(value)
    if n is not None and 1 <= n <= MAX_FLOW:
        return n
    raise ValueError(
        "flow must be 'all', 'latest' or an integer N from 1 to "
        f"{MAX_FLOW} (every N-th step), got {value!r}"
    )


def flow_name(code: int) -> str:
    return "latest" if code == LATEST else "all" if code == 1 else str(code)


@dataclass(frozen=True, slots=True)
class Route:
    """The producer task and the consumer tasks of one name."""

    producer: int
    consumers: tuple[int, ...]


def normname(path: str) -> str:
    """The name both sides compare: the path as given, normalized (``./a//b`` -> ``a/b``)."""
    return os.path.normpath(str(path))


def parse_options(text: str) -> dict:
    """``'queue_limit=3'`` or ``'shallow=a,b/*'`` -> ``{'queue_limit': 3}`` / ``{'shallow': ('a', 'b/*')}``."""
    key, eq, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not eq or key not in OPTION_KEYS:
        raise ValueError(
            f"option {text.strip()!r} is not one of " + ", ".join(f"{k}=..." for k in OPTION_KEYS)
        )
    if key == "queue_limit":
        if not value.isdigit() or int(value) < 2:
            raise ValueError(f"queue_limit must be an integer >= 2, got {value!r}")
        return {key: int(value)}
    globs = tuple(
        g.strip().lstrip("/") for g in value.split(",")
    )  # dataset paths have no leading '/'
    if not globs or not all(globs):
        raise ValueError(f"shallow needs dataset globs separated by ',', got {value!r}")
    return {key: globs}


def format_options(options: dict) -> str:
    """The ``| key=value`` suffix of an entry (inverse of :func:`parse_options`)."""
    out = []
    for key in OPTION_KEYS:
        if key not in options:
            continue
        value = options[key]
        out.append(f"{key}={','.join(value) if key == 'shallow' else int(value)}")
    return "".join(f" | {o}" for o in out)


class Workflow:
    """Parsed ``LAMINA_WORKFLOW``: ``[(pattern, Route)]`` in order, with flows and producer options."""

    def __init__(
        self,
        entries: list[tuple[str, Route]],
        flows: list[dict[int, int]] | None = None,
        options: list[dict] | None = None,
    ) -> None:
        self.entries = entries
        self.flows = (
            flows if flows is not None else [{} for _ in entries]
        )  # per entry: consumer -> flow
        self.options = (
            options if options is not None else [{} for _ in entries]
        )  # per entry: producer options

    @classmethod
    def parse(cls, text: str) -> Workflow:
        entries = []
        flows = []
        options = []
        for raw in text.replace("\n", ";").split(";"):
            item = raw.strip()
            if not item:
                continue
            head, *opts = item.split("|")
            opt: dict = {}
            for o in opts:
                try:
                    opt.update(parse_options(o))
                except ValueError as e:
                    raise ValueError(f"{ENV}: entry {item!r}: {e}") from None
            pattern, eq, rest = head.strip().rpartition("=")
            prod, gt, cons = rest.partition(">")
            pattern = pattern.strip()
            if not eq or not gt or not pattern:
                raise ValueError(
                    f"{ENV}: entry {item!r} is not PATTERN=PRODUCER>CONSUMER[,CONSUMER...]"
                )
            fl: dict[int, int] = {}
            try:
                p = int(prod)
                cs_list = []
                for c in cons.split(","):
                    if not c.strip():
                        continue
                    task, colon, policy = c.partition(":")
                    cs_list.append(int(task))
                    if colon:
                        fl[int(task)] = parse_flow(policy)
                cs = tuple(cs_list)
            except ValueError as e:
                if "flow" in str(e):
                    raise ValueError(f"{ENV}: entry {item!r}: {e}") from None
                raise ValueError(
                    f"{ENV}: entry {item!r}: tasks are MPMD appnums (integers)"
                ) from None
            if not cs or p < 0 or min(cs) < 0 or p in cs or len(set(cs)) != len(cs):
                raise ValueError(
                    f"{ENV}: entry {item!r} needs one producer and distinct consumers other than the producer"
                )
            entries.append((pattern, Route(p, tuple(sorted(cs)))))
            flows.append(fl)
            options.append(opt)
        return cls(entries, flows, options)

    def text(self) -> str:
        """The ``LAMINA_WORKFLOW`` value of this workflow (:meth:`parse` reads it back)."""
        items = []
        for (pattern, route), fl, opt in zip(self.entries, self.flows, self.options, strict=True):
            cons = ",".join(
                f"{c}:{flow_name(fl[c])}" if c in fl else str(c) for c in route.consumers
            )
            items.append(f"{pattern}={route.producer}>{cons}{format_options(opt)}")
        return "; ".join(items)

    def _match(self, name: str) -> int | None:
        name = normname(name)
        base = os.path.basename(name)
        full = None
        for i, (pattern, _) in enumerate(self.entries):
            # (a name such as 'out[1].lam' is itself: as a pattern '[1]' is a class of one)
            if pattern in (name, base) or matches(name, pattern) or matches(base, pattern):
                return i
            if os.path.isabs(pattern):  # (lamina run: a name with a directory, made real)
                full = full or os.path.realpath(name)
                if pattern == full:
                    return i
        return None

    def route(self, name: str) -> Route | None:
        i = self._match(name)
        return None if i is None else self.entries[i][1]

    def flow(self, name: str, consumer: int) -> int | None:
        """The flow policy the workflow gives *consumer* for *name* (None: not said)."""
        i = self._match(name)
        return None if i is None else self.flows[i].get(consumer)


def matches(name: str, pattern: str) -> bool:
    """Whether *name* matches the glob *pattern* (``fnmatch``, case-sensitive)."""
    return fnmatch.fnmatchcase(name, pattern)


def _glob_atoms(pattern: str) -> list[str]:
    """*pattern* as its one-character parts: ``*``, ``?``, a class ``[...]``, or a character."""
    atoms, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] in "!^":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 1
            if j < len(pattern):  # a class; an unclosed '[' is the character itself
                atoms.append(pattern[i : j + 1])
                i = j + 1
                continue
        atoms.append(c)
        i += 1
    return atoms


def _share_char(a: str, b: str) -> bool:
    """Whether the one-character patterns *a* and *b* (``?``, a class or a character) accept
    a common character.

    Exact: each accepts a union of ranges of code points whose bounds are characters its
    text names (a range's ends, a member) or the ones after them (a negated class starts
    again after what it leaves out), or the first character.  So does their intersection:
    if it is not empty, its lowest character is one of those, and those are all tried."""
    tries = {"\x01"}  # (a name holds no NUL)
    for c in (a if a != "?" else "") + (b if b != "?" else ""):
        tries.add(c)
        if ord(c) < 0x10FFFF:
            tries.add(chr(ord(c) + 1))
    return any(matches(c, a) and matches(c, b) for c in tries)


def globs_meet(x: str, y: str) -> bool:
    """Whether some name matches both glob patterns *x* and *y* (a search over pairs of
    positions in the two: ``*`` may match nothing or go on by a character)."""
    p, q = _glob_atoms(x), _glob_atoms(y)
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(p) and j == len(q):
            return True
        a = p[i] if i < len(p) else None
        b = q[j] if j < len(q) else None
        if a == "*":
            todo.append((i + 1, j))  # matches nothing more
        if b == "*":
            todo.append((i, j + 1))
        if a is not None and b is not None:  # one character both take
            if a == "*" and b == "*":
                todo.append((i, j + 1))
            elif a == "*":
                if _share_char(b, "?"):  # the star takes b's character (a class may take none)
                    todo.append((i, j + 1))
            elif b == "*":
                if _share_char(a, "?"):
                    todo.append((i + 1, j))
            elif _share_char(a, b):
                todo.append((i + 1, j + 1))
    return False


def routes_meet(x: str, y: str) -> bool:
    """Whether names written as *x* and as *y* (names or patterns) can be one name as routing
    sees them: the whole name, or its last component, matching each (:meth:`Workflow._match`)."""
    bx, by = x.rsplit("/", 1)[-1], y.rsplit("/", 1)[-1]
    return x == y or globs_meet(x, y) or globs_meet(x, by) or globs_meet(bx, y)


def options_for(name: str, mode: str, app: int, wf: Workflow | None) -> dict:
    """Defaults the workflow gives the producer task *app* for *name* opened in *mode*.

    ``{'queue_limit': 3, 'shallow': ('grid/*',)}`` or a part of it; empty for
    a consumer, a name no entry matches, a task other than the entry's
    producer, or no workflow.  The caller's own options win over these.
    """
    if wf is None or mode == "r":
        return {}
    i = wf._match(name)
    if i is None or wf.entries[i][1].producer != app:
        return {}
    return dict(wf.options[i])


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
            raise TransportError(
                f"{ENV} routes {name!r} through task {t}, but the launch has {ntasks} programs"
            )
    if mode != "r" and route.producer != app:
        raise TransportError(
            f"task {app} opens {name!r} for writing, but {ENV} says task {route.producer} produces it"
        )
    if mode == "r" and app not in route.consumers:
        raise TransportError(
            f"task {app} opens {name!r} for reading, but {ENV} lists only tasks {list(route.consumers)} as its consumers"
        )
    return route


# --------------------------------------------------------------------------
# the transport choice

TRANSPORT_ENV = "LAMINA_TRANSPORT"
#: seconds without progress before a transport peer counts as gone (a default for every open)
TIMEOUT_ENV = "LAMINA_TRANSPORT_TIMEOUT"
TRANSPORTS = ("file", "memory", "both")


def transport_choice(transport: str | None = None) -> str:
    """*transport*, else ``$LAMINA_TRANSPORT``, else ``'file'``; ConfigError (a ValueError)
    if unknown or not a string."""
    if transport is not None and (not isinstance(transport, str) or not transport):
        # (an empty argument is no default: io='' and engine='' are refused too)
        raise ConfigError(
            f"transport must be one of {list(TRANSPORTS)} (a string) or None, got {transport!r}"
        )
    choice = (transport or os.environ.get(TRANSPORT_ENV) or "file").strip().lower()
    if choice not in TRANSPORTS:
        raise ConfigError(
            f"transport must be one of {list(TRANSPORTS)} (argument or ${TRANSPORT_ENV}), got {choice!r}"
        )
    return choice


def engine_for(path: str, mode: str, transport: str | None = None) -> str | None:
    """The engine the transport choice asks for *path* (``'mpi'`` or ``'both'``), or None for a file."""
    choice = transport_choice(transport)
    if choice == "file" or not in_memory(path):
        return None
    return "mpi" if choice == "memory" else "both"
