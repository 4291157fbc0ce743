"""One error hierarchy for lamina.

Every error subclasses :class:`LaminaError` *and* the builtin exception a user
would naturally catch (``KeyError``, ``ValueError``, ``OSError``, ...), so
``except KeyError`` keeps working for code written against h5py or numpy.

Errors travel between ranks by *name* (see :func:`error_from_wire`): a rank
that detects a problem in a collective call tells the others the class name
and the message, and each rank raises the same class.  Only names registered
here can be rebuilt, so nothing read from the wire is ever evaluated.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable


class LaminaError(Exception):
    """Base class of every error lamina raises on purpose."""


class LaminaWarning(UserWarning):
    """Something was left out or done differently, and lamina went on (e.g. steps of a damaged file)."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_caller(message: str, category: type[Warning] = LaminaWarning) -> None:
    """Warn at the first frame outside lamina: the user's call that met it, however deep
    in the library it was found (an open, a refresh, a step loop)."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


class FormatError(LaminaError, OSError):
    """A file's bytes do not follow the lamina format (truncated, corrupt, wrong version)."""


class NotALaminaFileError(FormatError):
    """The path exists but is not a lamina file."""


class LockError(LaminaError, OSError):
    """Another writer holds the file: one writing job at a time."""


class ChecksumError(FormatError):
    """Data read back does not match the checksum recorded when it was written."""


class BoundsError(LaminaError, IndexError):
    """A box or a selection reaches outside a dataset's shape."""


class SelectionError(LaminaError, IndexError):
    """A selection (index expression) is malformed: two ellipses, a zero step, a non-integer bound."""


class ShapeError(LaminaError, ValueError):
    """An array's shape does not match the box it is written to."""


class DTypeError(LaminaError, TypeError):
    """A dtype is not supported, or cannot be converted safely to a dataset's dtype."""


class RangeError(LaminaError, OverflowError):
    """A value does not fit a dataset's dtype (a Python int of 300 for int8, as numpy says too)."""


class ConfigError(LaminaError, ValueError):
    """An engine, layer or transport name, or an environment variable choosing one, is unknown."""


class OverlapError(LaminaError, ValueError):
    """Two boxes written to one dataset in one step overlap."""


class NotFoundError(LaminaError, KeyError):
    """A group, dataset or attribute does not exist."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else ""


class ExistsError(LaminaError, ValueError):
    """A name is already taken by a group or dataset."""


class ModeError(LaminaError, PermissionError):
    """The operation is not allowed in the file's mode (e.g. writing in mode 'r')."""


class StepError(LaminaError, IndexError):
    """A step that does not exist, or a step call out of order."""


class StepTimeoutError(LaminaError, TimeoutError):
    """No new step was committed within the requested time."""


class CollectiveMismatchError(LaminaError, RuntimeError):
    """Ranks disagree on the arguments of a collective call."""


class CodecError(LaminaError, ValueError):
    """A compression codec is unknown, misconfigured or failed."""


class MPIStateError(LaminaError, RuntimeError):
    """MPI cannot be used now: not initialized yet, or finalized while a file was open."""


class RemoteError(LaminaError, RuntimeError):
    """Another rank failed inside a collective call; this rank aborts with it."""


#: whitespace an expression may hold that does not take one column: shown as a space
_BLANKS = {ord(c): " " for c in "\t\r\v\f"}


def _breaks_line(text: str) -> bool:
    """Whether *text* holds a control character or a line or paragraph separator (a non-breaking
    space, a letter of any script, is shown as it is)."""
    import unicodedata

    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


class ExpressionError(LaminaError, ValueError):
    """A derived-quantity expression or query predicate is malformed or cannot be evaluated.

    ``position`` is the 0-based character offset in ``expression`` that the
    error points at (None when no single place is to blame); the message shows
    the expression with a caret under that place.
    """

    def __init__(
        self, message: str, position: int | None = None, expression: str | None = None
    ) -> None:
        self.position = position
        self.expression = expression
        self.reason = message
        if position is not None:
            message = f"{message} (at position {position})"
            # the caret one column a character: a tab or a carriage return shown as a space (a
            # tab moved the caret's column, a return printed the line over itself); other
            # control characters, a line of their own: no echo
            shown = None if expression is None else expression.translate(_BLANKS)
            if shown is not None and len(shown) <= 200 and not _breaks_line(shown):
                message += f"\n    {shown}\n    {' ' * position}^"
        super().__init__(message)


class DeviceUnavailableError(LaminaError, RuntimeError):
    """``device="gpu"`` was asked for but CuPy or a CUDA device is missing."""


def suggest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """Return ' Did you mean ...?' for close matches of *name*, or ''."""
    import difflib  # (here: an error's path, not every process's start)

    cands = list(candidates)
    close = difflib.get_close_matches(name, cands, n=n, cutoff=0.6)
    if not close:
        # also match on the last path component, so 'tempr' finds 'fields/temp'
        tail = {c.rsplit("/", 1)[-1]: c for c in cands}
        close = [
            tail[c]
            for c in difflib.get_close_matches(name.rsplit("/", 1)[-1], list(tail), n=n, cutoff=0.6)
        ]
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


_REGISTRY: dict[str, type[LaminaError]] = {}


def register(cls: type[LaminaError]) -> type[LaminaError]:
    """Make *cls* rebuildable by :func:`error_from_wire` (used by later modules)."""
    _REGISTRY[cls.__name__] = cls
    return cls


for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, LaminaError):
        register(_cls)


def mark_collective(exc: BaseException) -> BaseException:
    """Note that every rank raised *exc* in the same collective call (so all may clean up together)."""
    try:
        exc.lamina_collective = True  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return exc


def is_collective(exc: BaseException | None) -> bool:
    """True if *exc* was raised on every rank by the same collective call."""
    return bool(getattr(exc, "lamina_collective", False))


def is_left(exc: BaseException | None) -> bool:
    """True if *exc* says that another rank let go of the file: this one must not call collectives on it."""
    return bool(getattr(exc, "lamina_left", False))


#: builtins a remote failure is re-raised as (with RemoteError), so that the
#: same ``except OSError`` works on every rank
_REMOTE_BASES: dict[str, type[BaseException]] = {
    b.__name__: b
    for b in (
        OSError,
        PermissionError,
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        NotADirectoryError,
        ConnectionError,
        MemoryError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        OverflowError,
        ZeroDivisionError,
        TimeoutError,
        RuntimeError,
        NotImplementedError,
    )
}
_REMOTE_CLASSES: dict[str, type[RemoteError]] = {}


def _remote_class(base: str) -> type[RemoteError]:
    cls = _REMOTE_CLASSES.get(base)
    if cls is None:
        b = _REMOTE_BASES[base]
        cls = _REMOTE_CLASSES[base] = type(
            f"Remote{base}",
            (RemoteError, b),
            {"__str__": lambda self: str(self.args[0]) if self.args else ""},
        )
    return cls


def error_to_wire(exc: BaseException) -> tuple[str, str]:
    """Name and message of *exc* for sending to other ranks."""
    for name, cls in _REMOTE_CLASSES.items():
        if type(exc) is cls:  # a remote error sent on again: it stays the same builtin
            return f"Remote:{name}", str(exc)
    if isinstance(exc, LaminaError):
        return type(exc).__name__, str(exc)
    base = next((b.__name__ for b in type(exc).__mro__ if _REMOTE_BASES.get(b.__name__) is b), None)
    name = f"Remote:{base}" if base else "RemoteError"
    said = str(exc)
    return name, f"{type(exc).__name__}: {said}" if said else type(exc).__name__


def error_from_wire(name: str, message: str, rank: int | None = None) -> LaminaError:
    """Rebuild an error sent by another rank; unknown names become RemoteError.

    A non-lamina error (an OSError from a full disk, say) comes back as a
    RemoteError that is also the same builtin, so every rank can catch it alike.
    """
    if rank is not None and not message.startswith("rank "):
        message = f"rank {rank}: {message}"
    if name.startswith("Remote:") and name[7:] in _REMOTE_BASES:
        return _remote_class(name[7:])(message)
    cls = _REGISTRY.get(name, RemoteError)
    return cls(message)


@register
class TransportError(LaminaError, ConnectionError):
    """The in situ transport lost its peer: nobody produces a name, or a producer or consumer stopped answering."""
