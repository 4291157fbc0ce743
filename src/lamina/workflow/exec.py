"""The program ``lamina run`` starts on every rank: it runs one task's command.

``lamina run`` keeps the words of the workflow file out of ``mpiexec``'s
command line: each section of the MPMD launch is ``python -I .../exec.py
I``, and this program reads task I's command, directory and variables from
the variable ``LAMINA_RUN_TASK_<I>`` (JSON written by
:mod:`.launcher`), changes to the directory and replaces itself with the
command (``os.execvpe``: same process, so exit statuses and signals are the
command's own).  A ``:`` or a leading ``-genv`` in a command is then an
argument of that command, never a word ``mpiexec`` reads.

It runs as a script in isolated mode (``python -I``: no ``PYTHONPATH``, no
current directory on ``sys.path``), importing only the standard library, so
that nothing in the task's directory or environment can replace it and it
costs a few milliseconds a rank.  ``python -m lamina.workflow.exec I`` is the
same program.
"""

from __future__ import annotations

import json
import os
import sys

#: the variable holding task I's command, directory and variables is PREFIX + str(I)
PREFIX = "LAMINA_RUN_TASK_"
#: exit status when the command cannot be started (as a shell: 127 not found, 126 not runnable)
NOT_FOUND, NOT_RUNNABLE = 127, 126


def encode(name: str, argv: list[str], cwd: str, env: dict[str, str]) -> str:
    """The value of ``LAMINA_RUN_TASK_<I>`` for a task (compact JSON)."""
    return json.dumps(
        {"name": name, "argv": list(argv), "cwd": cwd, "env": dict(env)},
        separators=(",", ":"),
        ensure_ascii=False,
    )


def decode(text: str) -> tuple[str, list[str], str, dict[str, str]]:
    """(name, argv, cwd, env) from :func:`encode`'s text; ValueError if it is not that."""
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(spec, dict) or set(spec) != {"name", "argv", "cwd", "env"}:
        raise ValueError("not an object with name, argv, cwd and env")
    name, argv, cwd, env = spec["name"], spec["argv"], spec["cwd"], spec["env"]
    if not (
        isinstance(name, str)
        and isinstance(argv, list)
        and argv
        and all(isinstance(w, str) for w in argv)
        and isinstance(cwd, str)
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise ValueError("a field has the wrong type")
    return name, argv, cwd, env


def main(args: list[str] | None = None) -> int:
    """Run task ``args[0]``'s command in place of this process; returns only on failure."""
    args = sys.argv[1:] if args is None else args
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m lamina.workflow.exec TASK (started by lamina run)", file=sys.stderr)
        return 2
    var = PREFIX + args[0]
    text = os.environ.get(var)
    if text is None:
        print(f"lamina run: task {args[0]}: {var} is not set", file=sys.stderr)
        return NOT_FOUND
    try:
        name, argv, cwd, env = decode(text)
    except ValueError as e:
        print(f"lamina run: task {args[0]}: {var}: {e}", file=sys.stderr)
        return NOT_FOUND
    full = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    full.update(env)
    try:
        os.chdir(cwd)
        os.execvpe(argv[0], argv, full)
    except OSError as e:
        print(
            f"lamina run: task {name!r}: cannot run {argv[0]!r} in {cwd}: {e.strerror or e}",
            file=sys.stderr,
        )
        return NOT_FOUND if isinstance(e, FileNotFoundError) else NOT_RUNNABLE
    return NOT_FOUND  # not reached: execvpe returns only by raising


if __name__ == "__main__":
    sys.exit(main())
