"""A reader's file descriptors: a file of many more subfiles than the process may open at
once reads whole, from one thread or several, and one that cannot be opened says why."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import lamina
from lamina.engines.native import descriptors
from lamina.engines.native import engine as native_engine

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

#: writer sessions of the file read: one subfile each, far more than 64 descriptors
SESSIONS = 300


def _value(step: int) -> np.ndarray:
    return 10.0 * step + np.arange(4)


@pytest.fixture(scope="module")
def many_subfiles(tmp_path_factory) -> str:
    """A file of :data:`SESSIONS` writer sessions of one step each (one subfile each)."""
    path = str(tmp_path_factory.mktemp("fds") / "appends.lam")
    for s in range(SESSIONS):
        with lamina.open(path, "a", durable=False) as f:
            x = f.create_dataset("x", shape=(4,)) if s == 0 else f["x"]
            with f.step():
                x[...] = _value(s)
    assert len([n for n in os.listdir(path) if n.startswith("data.")]) == SESSIONS
    return path


def _run_limited(code: str, path: str, limit: int) -> subprocess.CompletedProcess:
    """*code* run with *path* as argv[1] by Python in a process that may open *limit* files."""
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("LAMINA_ENGINE", None)
    env.pop("LAMINA_TRANSPORT", None)
    head = (
        "import resource\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, hard))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", head + code, path],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


READ_ALL = """
import os, sys, numpy as np, lamina
with lamina.open(sys.argv[1]) as f:
    got = np.stack([f.at(k)["x"][...] for k in range(f.steps)])
    assert np.array_equal(got, 10.0 * np.arange(f.steps)[:, None] + np.arange(4))
    print(f.steps, len(os.listdir("/proc/self/fd")))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_file_of_more_subfiles_than_the_process_may_open_reads_whole(many_subfiles):
    """A reader kept every subfile it had read open: a file of more subfiles than the
    descriptor limit (1,024 ranks, or 64 ranks restarted 16 times, under the common
    ``ulimit -n 1024``) failed with a bare 'OSError: [Errno 24] Too many open files'."""
    r = _run_limited(READ_ALL, many_subfiles, 64)
    assert r.returncode == 0, r.stderr[-2000:]
    steps, left_open = map(int, r.stdout.split())
    assert steps == SESSIONS and left_open < 64


HOGGED = """
import os, sys, numpy as np, lamina
f = lamina.open(sys.argv[1])
f.at(0)["x"][...]  # lamina.meta and data.0.0 open
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    got = f.at(f.steps - 1)["x"][...]  # a subfile not open, and no descriptor left
finally:
    for fd in hog:
        os.close(fd)
assert np.array_equal(got, 10.0 * (f.steps - 1) + np.arange(4)), got
print("read", flush=True)
"""


def test_a_reader_out_of_descriptors_closes_the_subfiles_it_keeps_and_reads_on(many_subfiles):
    """Every descriptor of the process taken (by other files), a read of a subfile not open
    yet closes the subfiles the reader keeps open but does not use, and reads."""
    r = _run_limited(HOGGED, many_subfiles, 64)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[:1] == ["read"], r.stdout[-2000:]


def test_a_subfile_that_cannot_be_opened_for_the_limit_says_what_to_do(many_subfiles, monkeypatch):
    """A read of a subfile that the descriptor limit keeps from being opened raised a bare
    '[Errno 24] Too many open files: data.299.0': it names the whole path and the way out."""
    real_open = os.open

    def limited(path, flags, *args, **kw):
        if str(path).startswith("data."):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), path)
        return real_open(path, flags, *args, **kw)

    with lamina.open(many_subfiles) as f:
        monkeypatch.setattr(os, "open", limited)
        with pytest.raises(OSError) as got:
            f.at(SESSIONS - 1)["x"][...]
    e = got.value
    assert e.errno == errno.EMFILE, e
    assert e.filename == os.path.join(many_subfiles, f"data.{SESSIONS - 1}.0"), e
    assert "ulimit -n" in str(e) and "aggregators" in str(e), e


def test_a_subfile_held_by_a_read_is_not_closed_when_evicted(many_subfiles, monkeypatch):
    """A subfile in use by a read (another thread's) stays open when reads of others evict
    it from the descriptors kept, and is closed when that read lets it go."""
    monkeypatch.setattr(descriptors, "SUBFILES_KEPT", 4)
    with lamina.open(many_subfiles) as f:
        eng = f.engine.stack()[-1]
        name = "data.0.0"
        held = eng._subfile(name)
        fd = held.fd
        st = os.fstat(fd)
        for k in range(1, 20):  # other subfiles read: data.0.0 is the least recently used
            np.testing.assert_array_equal(f.at(k)["x"][...], _value(k))
        assert len(eng._subfiles) <= 4
        now = os.fstat(fd)  # still open, still that subfile
        assert (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
        assert os.pread(fd, 32, 0) == _value(0).tobytes()
        eng._subfiles.release(held)
        with pytest.raises(OSError) as got:
            os.fstat(fd)
        assert got.value.errno == errno.EBADF
        np.testing.assert_array_equal(f.at(0)["x"][...], _value(0))  # opened again


def test_threads_reading_more_subfiles_than_are_kept_read_every_value(many_subfiles, monkeypatch):
    """Threads of a pool read every step, each in another subfile, while few descriptors
    are kept: each read evicts another's subfile, with thread switches as often as CPython
    makes them and one between each subfile's lookup and its read.  Every value is the one
    written (a descriptor closed under a read and its number reused by another subfile's
    open read the other's bytes: a checksum error), and no descriptor is left open."""
    monkeypatch.setattr(descriptors, "SUBFILES_KEPT", 3)
    pread_into = native_engine._pread_into

    def switched(fd, *args, **kw):  # another thread runs between the lookup and the read
        time.sleep(0)
        return pread_into(fd, *args, **kw)

    monkeypatch.setattr(native_engine, "_pread_into", switched)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    try:
        with lamina.open(many_subfiles) as f, ThreadPoolExecutor(8) as pool:

            def read(k: int) -> bool:
                return bool(np.array_equal(f.at(k)["x"][...], _value(k)))

            for rnd in range(2):
                order = [(7 * j + rnd) % SESSIONS for j in range(SESSIONS)]
                wrong = [k for k, ok in zip(order, pool.map(read, order), strict=True) if not ok]
                assert not wrong, f"round {rnd}: wrong values at steps {wrong[:5]}"
            assert len(f.engine.stack()[-1]._subfiles) <= 3
    finally:
        sys.setswitchinterval(before)
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) <= fds


def test_the_descriptors_kept_follow_the_limit(monkeypatch):
    """At most :data:`SUBFILES_KEPT`, and a quarter of the soft limit where that is less."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (64, hard))
    assert descriptors.subfiles_kept() == 16
    monkeypatch.setattr(resource, "getrlimit", lambda what: (resource.RLIM_INFINITY, hard))
    assert descriptors.subfiles_kept() == descriptors.SUBFILES_KEPT
