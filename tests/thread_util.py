"""Thread switches made deterministic: another thread's call run at each bytecode of a call.

CPython switches threads between bytecodes.  :func:`interleavings` runs a call once per
bytecode boundary of the functions named (not of what they call), and at boundary *k*
runs a second call to its end there, as a thread switched to at that point would, before
the first call goes on.  A lazily built value published before it is complete is seen
half-made by the second call at some boundary, every time, not by chance.

With ``thread=True`` the second call runs on a thread of its own, so that a lock the first
call holds at boundary *k* is held against it: the first call waits for it to end, or to
stop moving (blocked on what the first call holds), and goes on.
"""

from __future__ import annotations

import sys
import threading
import time
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
    thread: bool = False,
) -> Iterator[tuple[int, Outcome, Outcome, Any]]:
    """For each bytecode boundary *k* that ``outer(state)`` reaches in frames of *functions*
    (plain functions, methods, a property's getter, or a module: every function of it),
    on a fresh ``state = setup()``: ``outer(state)`` with ``inner(state)`` run once at
    boundary *k*.  Yields ``(k, outer's outcome, inner's outcome, state)``, until *outer*
    ends before reaching boundary *k*.  With *thread*, *inner* runs on a thread of its own
    (:func:`_on_a_thread`): a lock *outer* holds at boundary *k* blocks it, as it would
    block another thread, instead of being taken again or waited for by one thread.  An
    *inner* that nothing blocks ends before *outer* goes on, as without *thread* (unless
    it stays :data:`STALL` seconds at one bytecode: a lost switch, never a false failure
    of a locked update)."""
    codes = {getattr(f, "__func__", f).__code__ for f in functions if callable(f)}
    files = {f.__file__ for f in functions if isinstance(f, ModuleType)}
    monitor = _Monitor(codes | _codes_of(files)) if hasattr(sys, "monitoring") else None
    try:
        for k in range(most):
            state = setup()
            second = partial(inner, state)
            if thread:
                second = partial(_on_a_thread, second)
            if monitor is not None:
                out, got = monitor.run(k, partial(outer, state), second)
            else:
                out, got = _switched_at(k, codes, files, partial(outer, state), second)
            if got is not None and thread:
                got = got.get().join()
            if got is None:
                return
            yield k, out, got, state
    finally:
        if monitor is not None:
            monitor.close()
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


def _codes_of(files: set) -> set:
    """The code objects of every function of the modules whose files are *files* (methods,
    properties, nested functions and lambdas included)."""
    found: set = set()

    def add(code) -> None:
        if code not in found:
            found.add(code)
            for c in code.co_consts:
                if hasattr(c, "co_code"):
                    add(c)

    def take(obj, depth: int = 0) -> None:
        for name in ("fget", "fset", "fdel", "__func__", "__wrapped__"):
            inner = getattr(obj, name, None)
            if inner is not None and inner is not obj:
                take(inner, depth)
        code = getattr(obj, "__code__", None)
        if code is not None and code.co_filename in files:
            add(code)
        elif isinstance(obj, type) and depth < 3:
            for v in vars(obj).values():
                take(v, depth + 1)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__file__", None) in files:
            for v in vars(mod).values():
                take(v)
    return found


class _Monitor:
    """:func:`_switched_at` by ``sys.monitoring`` (PEP 669), for Python 3.12 and later: they
    deliver no opcode events to a frame whose tracer turns them on at its call event (3.12.1
    none at all), so no boundary was ever reached there.  The bytecodes counted are the
    program thread's in the code objects given (those of the files' functions found by
    :func:`_codes_of`); *inner* runs once, and no bytecode it runs, on this thread or its
    own, is counted or switched at.  One monitoring tool for all the runs of a test."""

    def __init__(self, codes: set) -> None:
        mon = sys.monitoring
        self.tool = next(i for i in range(6) if mon.get_tool(i) is None)
        self.codes = codes
        self.me = threading.get_ident()
        self.k = self.seen = 0
        self.fired = False
        self.inner: Callable[[], Any] | None = None
        self.got: list[Outcome] = []
        mon.use_tool_id(self.tool, "lamina tests: thread switches")
        mon.register_callback(self.tool, mon.events.INSTRUCTION, self._at)
        for code in codes:
            mon.set_local_events(self.tool, code, mon.events.INSTRUCTION)

    def _at(self, code, offset) -> None:
        if self.fired or self.inner is None or threading.get_ident() != self.me:
            return
        if self.seen == self.k:
            self.fired = True
            self.got.append(Outcome(self.inner))
        self.seen += 1

    def run(
        self, k: int, outer: Callable[[], Any], inner: Callable[[], Any]
    ) -> tuple[Outcome, Outcome | None]:
        self.k, self.seen, self.fired, self.got, self.inner = k, 0, False, [], inner
        try:
            out = Outcome(outer)
        finally:
            self.inner = None
        return out, self.got[0] if self.got else None

    def close(self) -> None:
        mon = sys.monitoring
        for code in self.codes:
            mon.set_local_events(self.tool, code, 0)
        mon.register_callback(self.tool, mon.events.INSTRUCTION, None)
        mon.free_tool_id(self.tool)


#: how long a second call on its own thread may stay at one bytecode before the first goes
#: on (it waits for what the first holds); a read of a few bytes stays microseconds
STALL = 0.1


class _Running:
    """A call on a thread of its own, run to its end by :meth:`join`."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.outcome: Outcome | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        self.outcome = Outcome(fn)

    def join(self) -> Outcome:
        self.thread.join(60)
        if self.outcome is None:
            raise AssertionError("the second call did not end: a deadlock")
        return self.outcome


def _on_a_thread(fn: Callable[[], Any]) -> _Running:
    """*fn* started on a thread of its own, and waited for until it ends or stops moving
    for :data:`STALL` seconds (the bytecode its frame is at unchanged): then it waits for
    what the caller holds, and the caller goes on (:meth:`_Running.join` waits for it)."""
    run = _Running(fn)
    ident = run.thread.ident
    where, since = None, time.monotonic()
    while run.thread.is_alive():
        frame = sys._current_frames().get(ident) if ident is not None else None
        now = (id(frame.f_code), frame.f_lasti) if frame is not None else None
        if now != where:
            where, since = now, time.monotonic()
        elif time.monotonic() - since > STALL:
            break
        run.thread.join(STALL / 5)
    return run
