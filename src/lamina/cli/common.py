"""What every ``lamina`` command shares: usage errors, opening a file to inspect, one-line failures."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable

from ..errors import ExpressionError, LaminaError, LaminaWarning


class CLIError(Exception):
    """A usage problem found by a command (reported like a lamina error: one line, status 2)."""


#: options whose values may start with '-' (a selection '-1,0', a region '-4:', a condition
#: '-T > 3'); argparse takes such a value for an option of its own unless it is a number
DASHED_VALUES = frozenset({"--select", "-s", "--slice", "--region", "-r", "--where", "-w"})


def glue_dashed(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """*argv* with ``OPT VALUE`` written ``OPT=VALUE`` where OPT is in :data:`DASHED_VALUES`
    and VALUE starts with '-' but is no option of *parser* or of its subcommands (as
    ``--select=-1,0`` would be given): argparse's own reading stops at the dash
    ("expected one argument")."""
    known: set[str] = set()
    todo = [parser]
    while todo:
        p = todo.pop()
        known.update(p._option_string_actions)
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                todo.extend(act.choices.values())
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return out + argv[i:]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if (
            a in DASHED_VALUES
            and nxt is not None
            and nxt.startswith("-")
            and nxt != "-"
            and nxt.split("=", 1)[0] not in known
        ):
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def message(e: BaseException) -> str:
    """An error as one line; an expression's error keeps its picture (the expression, and a
    caret under the position it names) on the two lines below."""
    text = str(e)
    head, _, picture = text.partition("\n")
    if isinstance(e, ExpressionError) and picture.count("\n") == 1 and picture.endswith("^"):
        return " ".join(head.split()) + "\n" + picture
    return " ".join(text.split()) or type(e).__name__


def guarded(prog: str, fn: Callable[[], int | None]) -> int:
    """Run a command's body; errors from the file or the arguments print one line and give status 2.

    Lamina errors, OS errors (a missing file) and :class:`CLIError` print
    ``PROG: error: MESSAGE`` on stderr (status 2); a closed pipe
    (``lamina dump ... | head``) ends quietly with status 1; Ctrl-C says so
    (status 130).  A lamina warning (steps left out of a damaged file) prints
    ``PROG: warning: MESSAGE``, not Python's line of source.
    """
    formatted = warnings.formatwarning

    def format_warning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        line: str | None = None,
    ) -> str:
        if issubclass(category, LaminaWarning):
            return f"{prog}: warning: {message}\n"
        return formatted(message, category, filename, lineno, line)

    # (the format, not the display: a program or a test that records warnings still gets them)
    warnings.formatwarning = format_warning
    try:
        return int(fn() or 0)
    except BrokenPipeError:
        silence_stdout()
        return 1
    except (LaminaError, OSError, CLIError) as e:
        print(f"{prog}: error: {message(e)}", file=sys.stderr)
        return 2
    except MemoryError as e:  # (numpy's names the bytes it could not allocate)
        print(f"{prog}: error: out of memory: {e or 'an allocation failed'}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = formatted


def silence_stdout() -> None:
    """Point stdout at /dev/null (after a broken pipe, so Python's exit does not complain)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def open_file(path: str):
    """Open the file at *path* for reading on this one process; an HDF5 file gets a hint to convert it.

    A path names a native file on disk, read in this thread, whatever
    ``$LAMINA_ENGINE``, ``$LAMINA_TRANSPORT`` and ``$LAMINA_IO`` say (the
    commands inspect files; they are not a program of an in situ workflow).
    """
    import lamina
    from lamina.engines.registry import ON_DISK

    return lamina.open(path, "r", **ON_DISK)  # (an HDF5 file: the error says how to convert it)


def find_dataset(f, name: str):
    """The dataset *name* of open file *f*; NotFoundError naming the datasets there if it is a group."""
    from lamina import Dataset
    from lamina.errors import NotFoundError
    from lamina.text import fmt_name

    obj = f[name]
    if not isinstance(obj, Dataset):
        names = [o.name for _, o in obj.walk() if isinstance(o, Dataset)]  # (in the group)
        shown = ", ".join(map(fmt_name, names[:8])) + (", ..." if len(names) > 8 else "")
        raise NotFoundError(
            f"{obj.name!r} is a group, not a dataset; datasets in it: {shown or 'none'}"
        )
    return obj
