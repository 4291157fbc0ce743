"""What this process may use of the machine: its memory.

A batch system (Slurm's cgroup plugin, a container runtime) gives a job a
share of a node's memory through a control group; past it the kernel ends
the job (the OOM killer), though physical memory is free.  A size that
lamina derives from "the machine's memory" is therefore the smaller of
physical memory and the limit of every control group the process is in,
cgroup v2 (``memory.max``) or v1 (``memory.limit_in_bytes``), the group's
own and its parents'.
"""

from __future__ import annotations

import os

#: where control groups are mounted
CGROUP_ROOT = "/sys/fs/cgroup"
#: a limit this large or larger is none (v1 writes "no limit" as 2^63 rounded to a page)
UNLIMITED = 1 << 60


def physical_memory() -> int | None:
    """Bytes of physical memory, None where the system cannot tell."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _read_limit(path: str) -> int | None:
    try:
        with open(path, "rb") as fh:
            text = fh.read(64).strip()
    except (OSError, ValueError):  # (ValueError: a path with a NUL byte)
        return None
    if not text.isdigit():  # "max" (v2: none), or something this does not know
        return None
    n = int(text)
    return n if 0 < n < UNLIMITED else None


def _groups(proc: str) -> list[tuple[str, str]]:
    """``(controllers, path)`` of each line of ``/proc/self/cgroup`` (v2: controllers "")."""
    try:
        with open(proc, encoding="utf-8", errors="replace") as fh:
            lines = fh.read(1 << 16).splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2]))
    return out


def _up(base: str, path: str, name: str) -> list[str]:
    """*name* in the group at *path* under *base* and in each of its parents, up to *base*
    (a container sees its own group as the root of the mount: the path from
    ``/proc/self/cgroup`` may not exist there, the root does)."""
    out = []
    parts = [p for p in path.split("/") if p and p != "."]
    if ".." in parts:  # a group outside this namespace's root: none of its own is visible here
        parts = []  # (with the ".." dropped, "/../sib" named another group, "sib", under the root)
    for k in range(len(parts), -1, -1):
        out.append(os.path.join(base, *parts[:k], name))
    return out


def cgroup_limit(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> int | None:
    """The smallest memory limit of the control groups this process is in, None where
    none is set or none can be read."""
    limits: list[int] = []
    for controllers, path in _groups(proc):
        if controllers == "":  # v2: one hierarchy
            files = _up(root, path, "memory.max")
            if os.path.isdir(os.path.join(root, "unified")):  # hybrid: v2 mounted beside v1
                files += _up(os.path.join(root, "unified"), path, "memory.max")
        elif "memory" in controllers.split(","):
            files = _up(os.path.join(root, "memory"), path, "memory.limit_in_bytes")
        else:
            continue
        limits.extend(n for n in map(_read_limit, files) if n is not None)
    return min(limits) if limits else None


def usable_memory() -> int | None:
    """Bytes of memory this process may use: the smaller of physical memory and its control
    groups' limits; None where neither can be told."""
    known = [n for n in (physical_memory(), cgroup_limit()) if n is not None]
    return min(known) if known else None
