"""Attributes of files, groups and datasets (a dict-like view)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping

from ..catalog import present_attr
from ..errors import ModeError, NotFoundError, suggest


class Attributes(MutableMapping):
    """``obj.attrs``: scalars, small arrays and strings.

    Setting or deleting may be done by any subset of ranks (rank 0 alone,
    say); the change is committed with the next step or close and then seen
    on every rank.  Ranks that change one attribute in a step must leave it
    the same (else CollectiveMismatchError on every rank, naming them).
    Those of a view of a committed step (``f.at(k)``) are read-only.
    """

    def __init__(self, file, path: str, step: int | None = None):
        self._file = file
        self._path = path
        self._step = step  # the step of the view they were reached through (None: the file)

    def _d(self) -> dict:
        return self._file._engine.attrs_of(self._path)

    def _name(self, name) -> str:
        """*name* as a str (bytes decoded as UTF-8, as h5py takes them); TypeError else."""
        if isinstance(name, bytes):
            try:
                return name.decode("utf-8")
            except UnicodeDecodeError:
                pass
        elif isinstance(name, str):
            return name
        raise TypeError(f"attribute names are strings, got {name!r} on {'/' + self._path!r}")

    def __getitem__(self, name: str):
        name = self._name(name)
        d = self._d()
        if name not in d:
            raise NotFoundError(f"no attribute {name!r} on {'/' + self._path!r}.{suggest(name, d)}")
        return present_attr(d[name])

    def __setitem__(self, name: str, value) -> None:
        """Independent: set attribute *name* (committed with the next step or close)."""
        name = self._name(name)
        self._writable(f"set attribute {name!r}")
        self._file._engine.set_attr(self._path, name, value)

    def __delitem__(self, name: str) -> None:
        """Independent: delete attribute *name* (committed with the next step or close)."""
        name = self._name(name)
        self._writable(f"delete attribute {name!r}")
        self._file._engine.del_attr(self._path, name)

    def _writable(self, what: str) -> None:
        if self._step is not None:
            raise ModeError(
                f"cannot {what} on {'/' + self._path!r}: seen at committed step {self._step} "
                f"(f.at({self._step}), a step of iter_steps), read-only; set attributes "
                "through the file (f.attrs, f[name].attrs)"
            )

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._d()))

    def __len__(self) -> int:
        return len(self._d())

    def __repr__(self) -> str:
        return f"<Attributes of {'/' + self._path!r}: {sorted(self._d())}>"
