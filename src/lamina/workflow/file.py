"""Workflow files: the YAML that lists the programs of an in situ workflow, checked.

A workflow file (YAML) lists the programs of an in situ workflow, how many
ranks each gets and which names each writes and reads::

    transport: memory            # file | memory | both
    timeout: 60                  # seconds without progress -> LAMINA_TRANSPORT_TIMEOUT
    env: {OMP_NUM_THREADS: 1}    # for every task
    tasks:
      - name: sim
        command: python -m mpi4py sim.py --steps 10
        ranks: 6
        writes: [sim.lam]
        shallow: [particles]     # datasets of sim.lam served without a copy
      - name: analysis
        command: [python, -m, mpi4py, analysis.py]
        ranks: 2
        reads: [{name: sim.lam, flow: latest}]

:func:`load` checks it (:class:`WorkflowFileError` names the file, the task
and the field), :meth:`WorkflowFile.workflow` gives the ``LAMINA_WORKFLOW``
routes the transport engine follows (with flows and producer options) and
:meth:`WorkflowFile.variables` every variable ``lamina run`` sets;
:mod:`.launcher` starts the tasks as one ``mpiexec A : B`` job (task order
is the MPI appnum).  The full schema is in
``docs/transport.md`` ("Launching a workflow: lamina run").
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import reprlib
import shlex
import stat
from dataclasses import dataclass, field

from ..errors import ConfigError, LaminaError, suggest
from ..text import parse_seconds
from . import routes as wfmod

#: upper bound of the ranks of one launch unless ``--max-ranks`` says otherwise
MAX_RANKS = 1 << 20
#: largest workflow file read (a real one is a few KiB)
MAX_FILE_BYTES = 1 << 20
#: most YAML nodes a workflow file may hold, each alias counted as what it stands for
MAX_NODES = 100_000
#: deepest nesting of a workflow file's mappings and lists, aliases expanded
MAX_DEPTH = 32
#: most characters of text a workflow file's values may hold once its aliases are expanded
#: (a string referred to thousands of times would otherwise take gigabytes)
MAX_EXPANDED_BYTES = 4 << 20
#: the longest timeout a workflow may give (a year, in seconds)
MAX_TIMEOUT = 365 * 86400
TRANSPORTS = wfmod.TRANSPORTS
DEFAULT_TRANSPORT = "memory"
TRANSPORT_ENV = wfmod.TRANSPORT_ENV
TIMEOUT_ENV = wfmod.TIMEOUT_ENV

TOP_KEYS = ("transport", "timeout", "env", "tasks")
TASK_KEYS = ("name", "command", "ranks", "cwd", "env", "writes", "reads", "shallow", "queue_limit")
WRITE_KEYS = ("name", "shallow", "queue_limit")
READ_KEYS = ("name", "flow")
#: set by ``lamina run`` itself from the fields ``transport``, ``timeout`` and the tasks
RESERVED_ENV = (TRANSPORT_ENV, wfmod.ENV, TIMEOUT_ENV)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# values from the file, shown in errors: one short line however large the value
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def _show(value) -> str:
    """A short repr of a value read from the file, for error messages."""
    return _REPR.repr(value)


_BAD_NAME_CHARS = (";", "|", "\n", "\r")  # separators of LAMINA_WORKFLOW
_BAD_GLOB_CHARS = (*_BAD_NAME_CHARS, ",")


class WorkflowFileError(LaminaError, ValueError):
    """A workflow file that cannot be read or does not follow the schema.

    ``path``, ``task`` (the task's name or ``tasks[i]``; None for a
    top-level field) and ``field`` (e.g. ``reads[0].flow``) say where.
    """

    def __init__(
        self, path: str, message: str, task: str | None = None, field: str | None = None
    ) -> None:
        self.path, self.task, self.field, self.reason = path, task, field, message
        where = str(path)
        if task is not None:
            where += f": task {task}"
        if field is not None:
            where += f": {field}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Write:
    """A name (or glob) a task writes, with the producer options the transport gets for it."""

    name: str
    shallow: tuple[str, ...] = ()
    queue_limit: int | None = None


@dataclass(frozen=True)
class Read:
    """A name a task reads from another task; *flow* is a :func:`~.workflow.parse_flow` code or None."""

    name: str
    flow: int | None = None


@dataclass(frozen=True)
class Task:
    """One program of the launch (its MPI appnum is its index in :attr:`WorkflowFile.tasks`)."""

    name: str
    command: tuple[str, ...]
    ranks: int
    cwd: str | None = None  # absolute; None: the workflow file's directory
    env: dict[str, str] = field(default_factory=dict)
    writes: tuple[Write, ...] = ()
    reads: tuple[Read, ...] = ()


@dataclass(frozen=True)
class WorkflowFile:
    """A checked workflow file."""

    path: str  # absolute
    tasks: tuple[Task, ...]
    transport: str | None = None  # None: not given in the file
    timeout: float | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def directory(self) -> str:
        """Where the job runs (relative commands and names are relative to it)."""
        return os.path.dirname(self.path)

    @property
    def ranks(self) -> int:
        return sum(t.ranks for t in self.tasks)

    def workflow(self) -> wfmod.Workflow | None:
        """The routes of every name some task reads, in task and ``writes`` order; None if there are none."""
        entries, flows, options = [], [], []
        for p, task in enumerate(self.tasks):
            for w in task.writes:
                readers = [
                    (c, r) for c, t in enumerate(self.tasks) for r in t.reads if r.name == w.name
                ]
                if not readers:
                    continue  # nobody reads it: it stays a file
                route = wfmod.Route(p, tuple(sorted(c for c, _ in readers)))
                entries.append((self._routed(w.name), route))
                flows.append({c: r.flow for c, r in readers if r.flow is not None})
                opt: dict = {}
                if w.queue_limit is not None:
                    opt["queue_limit"] = w.queue_limit
                if w.shallow:
                    opt["shallow"] = w.shallow
                options.append(opt)
        return wfmod.Workflow(entries, flows, options) if entries else None

    def _routed(self, name: str) -> str:
        """*name* as its route gives it: a name with a directory part (``run/out.lam``) made
        absolute from the workflow's directory, so that a task running in ``run/`` opening
        ``out.lam`` meets it (tasks run in their own ``cwd``); a bare name as it is (matched
        by the last component of what a task opens), a glob, or one whose path holds a glob
        character or a separator of ``LAMINA_WORKFLOW``.  The path is the real one (links
        resolved: a task's working directory is), as the routes take the names opened."""
        if "/" not in name or os.path.isabs(name) or any(c in name for c in "*?["):
            return name
        full = os.path.realpath(os.path.join(self.directory, name))
        return name if any(c in full for c in ";|\n*?[") else full

    def transport_for(self, transport: str | None = None) -> str:
        """The transport the job gets: *transport*, else the file's, else ``$LAMINA_TRANSPORT``, else memory.

        ``file`` when no task reads what another writes (nothing to transport).
        """
        given = transport or self.transport
        from_env = not given and os.environ.get(TRANSPORT_ENV)
        choice = (given or from_env or DEFAULT_TRANSPORT).strip().lower()
        if choice not in TRANSPORTS:
            if from_env:  # not the file's: the variable of our environment is wrong
                raise ConfigError(
                    f"${TRANSPORT_ENV} must be one of {list(TRANSPORTS)}, got {from_env!r} "
                    "(the workflow file gives no transport: it comes from the environment)"
                )
            raise WorkflowFileError(
                self.path, f"transport must be one of {list(TRANSPORTS)}, got {choice!r}"
            )
        return choice if self.workflow() is not None else "file"

    def variables(self, transport: str | None = None) -> dict[str, str]:
        """The variables ``lamina run`` sets for every task (the file's ``env`` and the transport's)."""
        out = dict(self.env)
        out[TRANSPORT_ENV] = self.transport_for(transport)
        wf = self.workflow()
        if wf is not None:
            out[wfmod.ENV] = wf.text()
        if self.timeout is not None:
            out[TIMEOUT_ENV] = _number(self.timeout)
        return out


# --------------------------------------------------------------------------
# loading and checking


def load(path: str | os.PathLike, max_ranks: int = MAX_RANKS) -> WorkflowFile:
    """Read and check the workflow file *path*; :class:`WorkflowFileError` if it is not valid.

    The YAML is read with the safe loader only, and checked before any
    Python object is built from it: at most :data:`MAX_FILE_BYTES` of a
    regular file, at most :data:`MAX_NODES` nodes once aliases are expanded
    (a "billion laughs" of nested aliases is refused, not expanded) and at
    most :data:`MAX_DEPTH` levels of nesting.  The words of a list command
    and the values of an ``env`` are strings as written (:func:`_keep_text`).
    """
    import yaml

    shown = os.fspath(path)
    text = _read(shown)
    try:
        _check_expansion(text, shown)
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            if root is not None:
                _check_duplicate_keys(root)
                _keep_text(root, loader)
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise WorkflowFileError(shown, f"not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise WorkflowFileError(shown, "nested too deeply for the YAML reader") from None
    except WorkflowFileError:
        raise
    except (ValueError, OverflowError) as e:  # an integer of thousands of digits, say
        raise WorkflowFileError(shown, f"a value YAML cannot read: {e}") from None
    _check_text(data, shown)
    return parse(data, os.path.abspath(shown), max_ranks=max_ranks, shown=shown)


def _check_text(data, shown: str) -> None:
    """WorkflowFileError for a string of the file (a key or a value) that no command line,
    environment or file name can hold: a NUL character, or one UTF-8 cannot encode."""
    todo = [data]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
        elif isinstance(x, str):
            if "\0" in x:
                raise WorkflowFileError(shown, f"{_show(x)} holds a NUL character")
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise WorkflowFileError(
                    shown, f"{_show(x)} holds a character UTF-8 cannot encode"
                ) from None


def _read(shown: str) -> str:
    """The text of the workflow file: a regular file of at most MAX_FILE_BYTES, UTF-8."""
    try:
        fd = os.open(shown, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WorkflowFileError(shown, "not a regular file")
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise WorkflowFileError(
            shown, f"cannot read the workflow file ({getattr(e, 'strerror', None) or e})"
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise WorkflowFileError(shown, f"more than {MAX_FILE_BYTES} bytes: not a workflow file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorkflowFileError(
            shown, f"cannot read the workflow file (not UTF-8 at byte {e.start})"
        ) from None


def _check_expansion(text: str, shown: str) -> None:
    """Refuse YAML that expands beyond MAX_NODES nodes or nests deeper than MAX_DEPTH.

    Walks the parser's events, which PyYAML produces without recursion and
    without building anything.  The expanded size and height of each
    anchored node are remembered when it ends, so an alias costs one step
    however much it stands for: nested aliases that would expand to a
    billion nodes are refused after a few hundred events.  An alias to a
    node that contains it (a recursive structure) is refused too.
    """
    import yaml

    # per open collection: [anchor, expanded nodes, height, expanded bytes of its scalars]
    stack: list[list] = []
    anchors: dict[str, tuple[int, int, int]] = {}  # closed anchored nodes: (nodes, height, bytes)
    total = [0, 0]  # nodes and bytes outside any collection

    def add(size: int, height: int, nbytes: int, line: int) -> None:
        if len(stack) + height > MAX_DEPTH:
            raise WorkflowFileError(
                shown, f"nested more than {MAX_DEPTH} levels deep (line {line}), aliases expanded"
            )
        at = stack[-1] if stack else None
        if at is not None:
            at[1] += size
            at[2] = max(at[2], height + 1)
            at[3] += nbytes
            grown, grown_bytes = at[1], at[3]
        else:
            total[0] += size
            total[1] += nbytes
            grown, grown_bytes = total
        if grown > MAX_NODES:
            raise WorkflowFileError(
                shown,
                f"more than {MAX_NODES} values once its aliases are expanded (line {line}): "
                "not a workflow file",
            )
        if grown_bytes > MAX_EXPANDED_BYTES:
            raise WorkflowFileError(
                shown,
                f"more than {MAX_EXPANDED_BYTES} bytes of text once its aliases are expanded "
                f"(line {line}): not a workflow file",
            )

    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        line = ev.start_mark.line + 1 if ev.start_mark is not None else 0
        if isinstance(ev, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise WorkflowFileError(
                    shown, f"nested more than {MAX_DEPTH} levels deep (line {line})"
                )
            stack.append([ev.anchor, 1, 1, 0])
        elif isinstance(ev, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            anchor, size, height, nbytes = stack.pop()
            if anchor is not None:
                anchors[anchor] = (size, height, nbytes)
            add(size, height, nbytes, line)
        elif isinstance(ev, yaml.ScalarEvent):
            if ev.anchor is not None:
                anchors[ev.anchor] = (1, 1, len(ev.value))
            add(1, 1, len(ev.value), line)
        elif isinstance(ev, yaml.AliasEvent):
            if any(frame[0] == ev.anchor for frame in stack):
                raise WorkflowFileError(
                    shown,
                    f"the alias *{ev.anchor[:40]} refers to a node that contains it (line {line})",
                )
            if ev.anchor in anchors:  # else undefined: the composer says so
                add(*anchors[ev.anchor], line)


def _check_duplicate_keys(root) -> None:
    """YAML keeps the last of two equal keys of a mapping: refuse them instead (a lost ``reads:``, say)."""
    import yaml

    todo, visited = [root], set()
    while todo:
        node = todo.pop()
        if id(node) in visited:  # an alias: each node once, however often it is referred to
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in keys:
                        raise yaml.YAMLError(
                            f"duplicate key {k.value!r} at line {k.start_mark.line + 1}"
                        )
                    keys.add(k.value)
                todo.append(v)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)


#: tags YAML 1.1 gives plain scalars that read as numbers or dates (``1.10`` is 1.1, ``010``
#: is 8, ``1:30`` is 90, ``2024-01-01`` a date)
_NOT_TEXT = frozenset(f"tag:yaml.org,2002:{kind}" for kind in ("int", "float", "timestamp"))


def _keep_text(root, loader) -> None:
    """Make the words of a list ``command`` and the values of an ``env`` strings exactly as
    written, in the composed document *root*, before anything is built from it.

    YAML 1.1 reads an unquoted ``1.10`` as the number 1.1, ``010`` as 8 and ``1:30`` as 90:
    a command's argument or a variable's value would change silently.  Booleans and nulls
    keep their tags (and are refused by the checks: ``yes`` is meant as text or not).
    """
    import yaml

    def get(node, key: str):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == key:
                    return v
        return None

    def text(node):
        if isinstance(node, yaml.ScalarNode) and node.tag in _NOT_TEXT:
            return yaml.ScalarNode(
                "tag:yaml.org,2002:str", node.value, node.start_mark, node.end_mark, node.style
            )
        return node

    envs = [get(root, "env")]
    tasks = get(root, "tasks")
    for task in tasks.value if isinstance(tasks, yaml.SequenceNode) else ():
        envs.append(get(task, "env"))
        command = get(task, "command")
        if isinstance(command, yaml.SequenceNode):
            command.value = [text(w) for w in command.value]
    for env in envs:
        if isinstance(env, yaml.MappingNode):
            loader.flatten_mapping(env)  # the values of a merge key (<<: *common) too
            env.value = [(k, text(v)) for k, v in env.value]


def parse(data, path: str, max_ranks: int = MAX_RANKS, shown: str | None = None) -> WorkflowFile:
    """Check the loaded YAML *data* of the workflow file at *path* (absolute; relative paths resolve against its directory)."""
    shown = path if shown is None else shown
    base = os.path.dirname(path)

    def fail(message: str, task: str | None = None, fld: str | None = None):
        raise WorkflowFileError(shown, message, task, fld)

    if not isinstance(data, dict):
        fail(f"the file must be a mapping with the keys {', '.join(TOP_KEYS)} (got {_kind(data)})")
    _unknown(data, TOP_KEYS, fail, None, None)
    transport = None
    if data.get("transport") is not None:
        t = data["transport"]
        if not isinstance(t, str) or t.strip().lower() not in TRANSPORTS:
            fail(f"must be one of {', '.join(TRANSPORTS)}, got {_show(t)}", None, "transport")
        transport = t.strip().lower()
    timeout = None
    if data.get("timeout") is not None:
        t = data["timeout"]
        # compared before math.isfinite, which cannot take an integer of 400 digits
        if not _is_number(t) or t <= 0 or t > MAX_TIMEOUT or not math.isfinite(t):
            fail(
                f"must be a number of seconds > 0 and at most {MAX_TIMEOUT}, got {_show(t)}",
                None,
                "timeout",
            )
        timeout = float(t)
    env = _env(data.get("env"), fail, None, "env", top=True)
    raw_tasks = data.get("tasks")
    if not isinstance(raw_tasks, list) or not raw_tasks:
        fail(f"must be a non-empty list of tasks (got {_kind(raw_tasks)})", None, "tasks")

    tasks: list[Task] = []
    names: dict[str, int] = {}
    for i, raw in enumerate(raw_tasks):
        label = f"tasks[{i}]"
        if not isinstance(raw, dict):
            fail(
                f"a task must be a mapping with the keys {', '.join(TASK_KEYS)} (got {_kind(raw)})",
                label,
            )
        name = raw.get("name", f"task{i}")
        if not isinstance(name, str) or not name.strip():
            fail(f"must be a non-empty string, got {_show(name)}", label, "name")
        name = name.strip()
        if any(c < " " or c == "\x7f" for c in name):
            fail(
                f"must hold no control character (a new line, say), got {_show(name)}",
                label,
                "name",
            )
        label = f"{_show(name)} ({label})"
        if name in names:
            fail(
                f"the name is also that of tasks[{names[name]}]: task names must differ",
                label,
                "name",
            )
        names[name] = i
        _unknown(raw, TASK_KEYS, fail, label, None)
        tasks.append(_task(raw, name, label, base, max_ranks, fail))

    total = sum(t.ranks for t in tasks)
    if total > max_ranks:
        fail(
            f"the tasks have {total} ranks in all, more than the limit of {max_ranks} (--max-ranks)",
            None,
            "tasks",
        )
    _check_names(tasks, fail)
    return WorkflowFile(path, tuple(tasks), transport, timeout, env)


def _task(raw: dict, name: str, label: str, base: str, max_ranks: int, fail) -> Task:
    if "command" not in raw:
        fail("missing: give the program to run, as a string or a list", label, "command")
    command = raw["command"]
    if isinstance(command, str):
        try:
            words = shlex.split(command)
        except ValueError as e:
            fail(
                f"cannot be split into words like a shell command ({e}): {_show(command)}",
                label,
                "command",
            )
    elif isinstance(command, list) and all(_is_scalar(w) for w in command):
        words = [_number(w) if not isinstance(w, str) else w for w in command]
    else:
        fail(f"must be a string or a list of strings, got {_show(command)}", label, "command")
    if not words or not words[0]:
        fail("is empty: give the program to run", label, "command")

    if "ranks" not in raw:
        fail("missing: give the number of ranks (an integer >= 1)", label, "ranks")
    ranks = raw["ranks"]
    if not _is_int(ranks) or not 1 <= ranks <= max_ranks:
        fail(
            f"must be an integer from 1 to {max_ranks} (--max-ranks), got {_show(ranks)}",
            label,
            "ranks",
        )

    cwd = None
    if raw.get("cwd") is not None:
        c = raw["cwd"]
        if not isinstance(c, str) or not c:
            fail(
                f"must be a directory (relative to the workflow file's), got {_show(c)}",
                label,
                "cwd",
            )
        cwd = os.path.normpath(os.path.join(base, os.path.expanduser(c)))
        if not os.path.isdir(cwd):
            fail(f"{cwd} is not a directory", label, "cwd")

    env = _env(raw.get("env"), fail, label, "env", top=False)
    shallow = _globs(raw.get("shallow"), fail, label, "shallow")
    queue_limit = _queue_limit(raw.get("queue_limit"), fail, label, "queue_limit")

    writes = []
    for j, item in enumerate(_listed(raw.get("writes"), fail, label, "writes")):
        where = f"writes[{j}]"
        if isinstance(item, dict):
            _unknown(item, WRITE_KEYS, fail, label, where)
            wname = _name(item.get("name"), fail, label, f"{where}.name")
            ws = (
                _globs(item.get("shallow"), fail, label, f"{where}.shallow")
                if "shallow" in item
                else shallow
            )
            wq = _queue_limit(item.get("queue_limit"), fail, label, f"{where}.queue_limit")
            writes.append(Write(wname, ws, queue_limit if wq is None else wq))
        else:
            writes.append(Write(_name(item, fail, label, where), shallow, queue_limit))
    reads = []
    for j, item in enumerate(_listed(raw.get("reads"), fail, label, "reads")):
        where = f"reads[{j}]"
        if isinstance(item, dict):
            _unknown(item, READ_KEYS, fail, label, where)
            rname = _name(item.get("name"), fail, label, f"{where}.name")
            flow = None
            if item.get("flow") is not None:
                try:
                    flow = wfmod.parse_flow(item["flow"])
                except ValueError:
                    fail(
                        "flow must be 'all', 'latest' or a positive integer N (every N-th step), "
                        f"got {_show(item['flow'])}",
                        label,
                        f"{where}.flow",
                    )
            reads.append(Read(rname, flow))
        else:
            reads.append(Read(_name(item, fail, label, where)))
    for kind, items in (("writes", writes), ("reads", reads)):
        seen: set[str] = set()
        for x in items:
            if x.name in seen:
                fail(f"{_show(x.name)} is listed twice", label, kind)
            seen.add(x.name)
    if (shallow or queue_limit is not None) and not writes:
        fail(
            "producer options need names this task writes (writes: [...])",
            label,
            "shallow" if shallow else "queue_limit",
        )
    return Task(name, tuple(words), int(ranks), cwd, env, tuple(writes), tuple(reads))


def _check_names(tasks: list[Task], fail) -> None:
    """Each name has one writer; each name read is written, by another task, exactly as written."""
    writers = [(i, w.name) for i, t in enumerate(tasks) for w in t.writes]
    for a, (i, x) in enumerate(writers):
        for j, y in writers[a + 1 :]:
            if wfmod.routes_meet(x, y):
                who = (
                    f"tasks {_show(tasks[i].name)} and {_show(tasks[j].name)}"
                    if i != j
                    else "this task twice"
                )
                what = (
                    f"{_show(x)}"
                    if x == y
                    else f"{_show(x)} and {_show(y)} (a name can match both, as a whole or by "
                    "its last component)"
                )
                fail(
                    f"{what} written by {who}: each name has one producer",
                    f"{_show(tasks[j].name)} (tasks[{j}])",
                    "writes",
                )
    for j, t in enumerate(tasks):
        label = f"{_show(t.name)} (tasks[{j}])"
        own = {w.name for w in t.writes}
        for k, r in enumerate(t.reads):
            if r.name in own:
                fail(
                    f"the task reads {_show(r.name)}, which it writes itself", label, f"reads[{k}]"
                )
            if any(r.name == x for _, x in writers):
                continue
            close = [x for _, x in writers if fnmatch.fnmatchcase(r.name, x)]
            if close:
                hint = f" ({_show(close[0])} is written: give a name read exactly as the producer's writes list it)"
            else:
                written = ", ".join(repr(x) for _, x in writers) or "nothing"
                hint = (
                    suggest(r.name, [x for _, x in writers]).replace(" Did", ". Did", 1)
                    or f" (written: {written})"
                )
            fail(f"no task writes {_show(r.name)}{hint}", label, f"reads[{k}]")


def _unknown(mapping: dict, allowed: tuple[str, ...], fail, task, where) -> None:
    for k in mapping:
        if k not in allowed:
            key = f"{where}.{k}" if where else str(k)
            hint = suggest(str(k), allowed) if isinstance(k, str) else ""
            fail(f"unknown key (allowed: {', '.join(allowed)}).{hint}", task, key)


def _listed(value, fail, task, fld) -> list:
    if value is None:
        return []
    if isinstance(value, str | dict):
        return [value]
    if not isinstance(value, list):
        fail(f"must be a list of names, got {_show(value)}", task, fld)
    return value


def _name(value, fail, task, fld) -> str:
    if not isinstance(value, str) or not value.strip():
        fail(
            f"must be a name (or glob pattern) as given to lamina.open, got {_show(value)}",
            task,
            fld,
        )
    value = value.strip()
    bad = [c for c in _BAD_NAME_CHARS if c in value]
    if bad:
        fail(
            f"{_show(value)} contains {bad[0]!r}, which LAMINA_WORKFLOW uses as a separator",
            task,
            fld,
        )
    return wfmod.normname(value)


def _globs(value, fail, task, fld) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(
        isinstance(g, str) and g.strip().lstrip("/") for g in items
    ):
        fail(
            f"must be a dataset path glob or a list of them (e.g. [particles, 'grid/*']), got {_show(value)}",
            task,
            fld,
        )
    out = []
    for g in items:
        bad = [c for c in _BAD_GLOB_CHARS if c in g]
        if bad:
            fail(
                f"{_show(g)} contains {bad[0]!r}, which LAMINA_WORKFLOW uses as a separator",
                task,
                fld,
            )
        out.append(g.strip().lstrip("/"))  # dataset paths have no leading '/'
    return tuple(out)


def _queue_limit(value, fail, task, fld) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value < 2:
        fail(
            f"must be an integer >= 2 (steps a producer keeps before it waits for its consumers), got {_show(value)}",
            task,
            fld,
        )
    return int(value)


def _env(value, fail, task, fld, top: bool) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        fail(f"must be a mapping NAME: value, got {_show(value)}", task, fld)
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.fullmatch(k):
            fail(f"{_show(k)} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", task, fld)
        if k in RESERVED_ENV and (top or k != TIMEOUT_ENV):
            field_of = {
                TRANSPORT_ENV: "transport",
                wfmod.ENV: "writes/reads",
                TIMEOUT_ENV: "timeout",
            }[k]
            fail(f"{k} is set by lamina run from the field '{field_of}'", task, f"{fld}.{k}")
        if not _is_scalar(v):
            fail(
                f"the value must be a string or a number, got {_show(v)} (quote yes/no/true/false)",
                task,
                f"{fld}.{k}",
            )
        out[k] = v if isinstance(v, str) else _number(v)
        if k == TIMEOUT_ENV and out[k]:  # (empty: the default) read as the task reads it
            try:
                parse_seconds(out[k])  # (lamina.comm.env_seconds: the task's first open)
            except ValueError as e:
                fail(f"{e}, got {_show(out[k])}", task, f"{fld}.{k}")
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_scalar(v) -> bool:
    return isinstance(v, str) or _is_number(v)


def _number(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _kind(v) -> str:
    return "nothing" if v is None else type(v).__name__
