"""Thread switches made deterministic: another thread's call run at each bytecode of a call.

CPython switches threads between bytecodes.  :func:`interleavings` runs a call once per
bytecode boundary of the functions named (not of what they call), and at boundary *k*
runs a second call to its end there, as a thread switched to at that point would, before
the first call goes on.  A lazily built value published before it is complete is seen
half-made by the second call at some boundary, every time, not by chance.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import ModuleType
from typing import Any


class Outcome:
    """What a call gave: its value, or the exception it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.error: BaseException | None = None
        self.value: Any = None
        try:
            self.value = fn()
        except Exception as e:  # (a failure the test names)
            self.error = e

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def interleavings(
    functions: Sequence[Callable | ModuleType],
    setup: Callable[[], Any],
    outer: Callable[[Any], Any],
    inner: Callable[[Any], Any],
    most: int = 10_000,
) -> Iterator[tuple[int, Outcome, Outcome, Any]]:
    """For each bytecode boundary *k* that ``outer(state)`` reaches in frames of *functions*
    (plain functions, methods, a property's getter, or a module: every function of it),
    on a fresh ``state = setup()``: ``outer(state)`` with ``inner(state)`` run once at
    boundary *k*.  Yields ``(k, outer's outcome, inner's outcome, state)``, until *outer*
    ends before reaching boundary *k*."""
    codes = {getattr(f, "__func__", f).__code__ for f in functions if callable(f)}
    files = {f.__file__ for f in functions if isinstance(f, ModuleType)}
    for k in range(most):
        state = setup()
        out, got = _switched_at(k, codes, files, partial(outer, state), partial(inner, state))
        if got is None:
            return
        yield k, out, got, state
    raise AssertionError(f"more than {most} bytecodes: not the call meant")


def _switched_at(
    k: int, codes: set, files: set, outer: Callable[[], Any], inner: Callable[[], Any]
) -> tuple[Outcome, Outcome | None]:
    """*outer* run with *inner* run at its bytecode boundary *k* (None: never reached)."""
    seen = 0
    got: list[Outcome] = []

    def local(frame, event, arg):
        nonlocal seen
        if event == "opcode":
            if seen == k and not got:  # (the tracer is off inside: inner runs untraced)
                got.append(Outcome(inner))
            seen += 1
        return local

    def calls(frame, event, arg):
        if frame.f_code in codes or frame.f_code.co_filename in files:
            frame.f_trace_opcodes = True
            return local
        return None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        out = Outcome(outer)
    finally:
        sys.settrace(before)
    return out, got[0] if got else None
