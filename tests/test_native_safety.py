"""The native file under misuse: two writers, a re-created file, foreign directories, planted links, old files."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import lamina
from lamina.engines.native import format as fmt
from lamina.engines.native import lock as lock_mod
from lamina.errors import FormatError, LockError, NotALaminaFileError

pytestmark = pytest.mark.usefixtures("fast_native")

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

HOLDER = """
import sys, time, lamina
f = lamina.open(sys.argv[1], "a", durable=False)
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
f.close()
"""


def hold(path: str, seconds: float) -> subprocess.Popen:
    """Another process that opens *path* for writing and keeps it open."""
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("LAMINA_ENGINE", None)
    env.pop("LAMINA_TRANSPORT", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def write_steps(path: str, mode: str, values) -> None:
    with lamina.open(path, mode) as f:
        x = f["x"] if "x" in f else f.create_dataset("x", shape=(4,))
        for v in values:
            with f.step():
                x[...] = v


# ------------------------------------------------------------------ two writers


def test_second_writing_process_is_refused_naming_the_holder(native_path):
    write_steps(native_path, "w", [1.0])
    proc = hold(native_path, 30)
    try:
        for mode in ("a", "w"):
            with pytest.raises(LockError) as ei:
                lamina.open(native_path, mode)
            msg = str(ei.value)
            assert f"pid {proc.pid}" in msg and f"host {socket.gethostname()}" in msg, msg
        with lamina.open(native_path, "r") as f:  # readers are welcome
            assert f.steps == 1 and f["x"][0] == 1.0
    finally:
        proc.kill()
        proc.wait()
    # the holder was killed: its lock went with it, the next writer goes on after step 0
    write_steps(native_path, "a", [2.0])
    with lamina.open(native_path, "r") as f:
        assert f.steps == 2 and f.at(0)["x"][0] == 1.0 and f["x"][0] == 2.0


def test_alternating_writers_lose_nothing(native_path):
    """Two processes that take turns appending: every step of both is there, in order."""
    write_steps(native_path, "w", [0.0])
    for k in range(1, 5):
        if k % 2:
            write_steps(native_path, "a", [float(k)])
        else:
            env = {**os.environ, "PYTHONPATH": SRC}
            code = (
                f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            )
            code += f"from test_native_safety import write_steps; write_steps({native_path!r}, 'a', [{float(k)}])"
            subprocess.run([sys.executable, "-c", code], check=True, env=env)
    with lamina.open(native_path, "r") as f:
        assert [f.at(k)["x"][0] for k in range(f.steps)] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_second_writer_in_the_same_process_is_refused(native_path):
    with lamina.open(native_path, "w") as f:
        f.create_dataset("x", shape=(1,))
        with pytest.raises(LockError, match="already open for writing in this process"):
            lamina.open(native_path, "a")
    with lamina.open(native_path, "a") as f:  # released at close
        assert "x" in f


def test_lock_without_file_system_locks(native_path, monkeypatch):
    """Where fcntl locks are refused, the lock file itself is the lock; a dead holder's is taken over."""

    def no_locks(fd, op, *args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock_mod.fcntl, "lockf", no_locks)
    write_steps(native_path, "w", [1.0])
    lockfile = os.path.join(native_path, lock_mod.LOCK_NAME)
    assert not os.path.exists(lockfile)  # removed at close
    # a holder of this host that is gone
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(lockfile, "w") as fh:
        fh.write(f"host {socket.gethostname()} pid {dead.pid} since then\n")
    write_steps(native_path, "a", [2.0])
    # one that runs
    with open(lockfile, "w") as fh:
        fh.write(f"host {socket.gethostname()} pid {os.getppid()} since then\n")
    with pytest.raises(LockError, match=f"pid {os.getppid()}"):
        lamina.open(native_path, "a")
    # one of another host: it may be alive; say what to remove if it is not
    with open(lockfile, "w") as fh:
        fh.write("host elsewhere.example pid 12 since then\n")
    with pytest.raises(
        LockError, match="elsewhere.example.*no locks: if that process is gone, remove"
    ):
        lamina.open(native_path, "a")
    os.unlink(lockfile)
    with lamina.open(native_path, "r") as f:
        assert f.steps == 2


def test_lock_file_without_locks_is_never_taken_from_a_live_writer(native_path, monkeypatch):
    """Without file system locks: two writers taking over one stale lock file at once do not
    each remove the other's (the second finds the first's new lock and is refused), no writer
    finds a lock file it must take for free while the holder writes who it is (the file
    appears whole), and a release removes no other writer's lock."""

    def no_locks(fd, op, *args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock_mod.fcntl, "lockf", no_locks)
    os.makedirs(native_path)
    lockfile = os.path.join(native_path, lock_mod.LOCK_NAME)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(lockfile, "w") as fh:
        fh.write(f"host {socket.gethostname()} pid {dead.pid} since then\n")
    first, second = lock_mod.WriterLock(native_path), lock_mod.WriterLock(native_path)
    read = lock_mod._read_info
    calls = []

    def judged_then_overtaken(fd):
        info = read(fd)
        if not calls:  # the first writer has judged the stale lock: the second takes it now
            calls.append(info)
            second._acquire_without_locks()
        return info

    monkeypatch.setattr(lock_mod, "_read_info", judged_then_overtaken)
    with pytest.raises(LockError, match=f"pid {os.getpid()}"):
        first._acquire_without_locks()
    assert calls and f"pid {dead.pid}" in calls[0]
    held = os.fstat(second.fd)
    there = os.stat(lockfile)
    assert (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)  # the second's, kept
    with open(lockfile) as fh:
        assert f"pid {os.getpid()}" in fh.read()  # never empty: written before it appeared
    assert sorted(os.listdir(native_path)) == [lock_mod.LOCK_NAME]  # nothing left aside
    # a lock file replaced under its holder (removed by hand, another writer's since): kept
    os.unlink(lockfile)
    with open(lockfile, "w") as fh:
        fh.write("host elsewhere.example pid 12 since then\n")
    second.release()
    with open(lockfile) as fh:
        assert "elsewhere.example" in fh.read()


def test_lockf_is_what_holds_the_file(native_path):
    """The lock is a POSIX record lock: another process sees it held through fcntl."""
    with lamina.open(native_path, "w") as f:
        f.create_dataset("x", shape=(1,))
        probe = (
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n    print('held')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, os.path.join(native_path, lock_mod.LOCK_NAME)],
            capture_output=True,
            text=True,
        ).stdout
        assert out.strip() == "held"
    assert fcntl  # the module the lock uses


# ------------------------------------------------------------------ logs that are not files


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [fmt.META_NAME, fmt.COMMIT_NAME])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_log_that_is_not_a_regular_file_is_refused_by_name(native_path, name, kind):
    """A named pipe in place of lamina.meta or lamina.commit made open wait for a writer of
    the pipe for ever (info and verify with it); a directory gave a bare IsADirectoryError
    naming nothing. Both are a FormatError naming the file, for readers and writers, and
    'lamina verify' says the file is damaged (exit 1)."""
    write_steps(native_path, "w", [1.0])
    where = os.path.join(native_path, name)
    os.unlink(where)
    if kind == "fifo":
        os.mkfifo(where)
    else:
        os.mkdir(where)
    said = "is a directory" if kind == "directory" else "is a named pipe"
    for mode in ("r", "a"):
        with pytest.raises(FormatError, match=rf"{name} {said} where lamina keeps a file"):
            lamina.open(native_path, mode)
    out = subprocess.run(
        [sys.executable, "-m", "lamina", "verify", native_path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and f"{name} {said}" in out.stdout + out.stderr, out


# ------------------------------------------------------------------ a file re-created under a reader


def test_a_reader_amid_a_re_creation_is_told_so(native_path, monkeypatch):
    """A reader that reads while another run re-creates the file, at the moment the old
    subfiles are being removed, or that opens it while its logs are replaced: 'the file was
    re-created', not 'subfile data.0.0 is missing' or a commit entry past the end of
    lamina.meta (the re-creation removed the subfiles before the commit log, and the first
    read parsed the old commit log against the new lamina.meta before it compared them)."""
    from lamina.engines.native import engine as engine_mod

    write_steps(native_path, "w", [1.0, 2.0, 3.0])
    r = lamina.open(native_path, "r")
    seen: list[str] = []
    unlink = os.unlink

    def read_while_removed(path, *a, **k):
        unlink(path, *a, **k)
        if not seen and os.path.basename(path).startswith("data."):
            try:
                r.at(1)["x"][...]
                seen.append("read")
            except FormatError as e:
                seen.append(str(e))

    monkeypatch.setattr(os, "unlink", read_while_removed)
    write_steps(native_path, "w", [9.0])  # another run starts over
    monkeypatch.setattr(os, "unlink", unlink)
    r.close()
    assert seen and "re-created while open" in seen[0], seen
    write_steps(native_path, "w", [1.0, 2.0, 3.0, 4.0, 5.0])
    real_open = engine_mod._open_in
    armed = [True]

    def re_created_meanwhile(directory, name, flags, mode=0o644, **kw):
        if name == fmt.META_NAME and flags == os.O_RDONLY and armed[0]:
            armed[0] = False
            monkeypatch.setattr(engine_mod, "_open_in", real_open)
            write_steps(native_path, "w", [9.0])  # a shorter lamina.meta of another run
        return real_open(directory, name, flags, mode, **kw)

    monkeypatch.setattr(engine_mod, "_open_in", re_created_meanwhile)
    with pytest.raises(FormatError, match="re-created while being opened"):
        lamina.open(native_path, "r")
    with lamina.open(native_path, "r") as f:  # the new run's file, whole
        assert f.steps == 1 and f["x"][0] == 9.0


def test_reader_notices_a_file_recreated_under_it(native_path):
    write_steps(native_path, "w", [1.0, 2.0])
    r = lamina.open(native_path, "r")
    try:
        assert r.steps == 2
        write_steps(native_path, "w", [9.0])  # another run starts over
        with pytest.raises(FormatError, match="re-created while open"):
            r.refresh()
        assert r.steps == 2  # nothing of the new run spliced in
        with pytest.raises(FormatError, match="re-created while open"):
            r["x"][...]  # the old run's data is gone: said so, not reported as a checksum error
    finally:
        r.close()
    with lamina.open(native_path, "r") as f:
        assert f.steps == 1 and f["x"][0] == 9.0


def test_identity_in_both_headers(native_path):
    write_steps(native_path, "w", [1.0])
    heads = []
    for name, magic in ((fmt.META_NAME, fmt.META_MAGIC), (fmt.COMMIT_NAME, fmt.COMMIT_MAGIC)):
        with open(os.path.join(native_path, name), "rb") as fh:
            heads.append(fmt.check_header(fh.read(64), magic, name))
    assert heads[0] == heads[1] and heads[0].version == fmt.VERSION and heads[0].identity
    write_steps(native_path, "w", [1.0])
    with open(os.path.join(native_path, fmt.COMMIT_NAME), "rb") as fh:
        assert fmt.check_header(fh.read(64), fmt.COMMIT_MAGIC, "c").identity != heads[0].identity
    # logs of two different files put together
    other = native_path + "-other"
    write_steps(other, "w", [5.0])
    shutil.copy(os.path.join(other, fmt.META_NAME), os.path.join(native_path, fmt.META_NAME))
    with pytest.raises(FormatError, match="belong to different files"):
        lamina.open(native_path, "r")


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_the_format_version_is_shown(tmp_path, capsys, version):
    """File.format_version, 'lamina ls' and 'lamina info' (and their --json) give the file's
    format version; a new file's is the latest, a memory file has none."""
    import json

    from lamina import cli

    if version == 4:
        path = str(tmp_path / "new.lam")
        write_steps(path, "w", [1.0])
    else:
        path = str(tmp_path / f"v{version}.lam")
        shutil.copytree(os.path.join(DATA, f"format-v{version}.lam"), path)
    with lamina.open(path) as f:
        assert f.format_version == version
    with lamina.open(path, "a") as f:  # an appending writer keeps the file's
        assert f.format_version == version
    for cmd in ("ls", "info"):
        assert cli.main([cmd, path]) == 0
        assert capsys.readouterr().out.startswith(f"{path}: native (format {version}), ")
        assert cli.main([cmd, path, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["format_version"] == version
    with lamina.open("mem://fv", "w", engine="memory") as f:
        assert f.format_version is None


def _set_version(path: str, name: str, version: int, at: int = 8) -> None:
    """Label *name*'s 32-byte header with format *version* (its flags with *at* = 10), its
    CRC fixed."""
    import struct

    from lamina.stats import crc

    with open(os.path.join(path, name), "r+b") as fh:
        head = bytearray(fh.read(32))
        head[at : at + 2] = struct.pack("<H", version)
        head[28:32] = struct.pack("<I", crc(bytes(head[:28])))
        fh.seek(0)
        fh.write(head)


@pytest.mark.parametrize("name", [fmt.META_NAME, fmt.COMMIT_NAME])
def test_a_header_flag_this_lamina_does_not_know_is_refused(native_path, name):
    """Flags mark features a reader must know to read the file (none yet): a later lamina
    can mark one without a new version, and this one refuses rather than misreads, in
    'r' and in 'a' (which would write beside what it does not understand)."""
    write_steps(native_path, "w", [1.0])
    _set_version(native_path, name, 0x0004, at=10)
    for mode in ("r", "a"):
        with pytest.raises(
            FormatError,
            match=rf"{name}: header flags 0x0004 mark features this lamina does not know "
            r"\(it knows none\): a newer lamina reads it",
        ):
            lamina.open(native_path, mode)


def test_version_messages_say_what_reads_the_file(native_path):
    """A newer format names the versions this lamina reads and that a newer lamina reads it;
    logs of one file (one identity) whose versions differ are said to disagree, not to
    belong to different files."""
    write_steps(native_path, "w", [1.0])
    _set_version(native_path, fmt.META_NAME, 3)
    for mode in ("r", "a"):
        with pytest.raises(
            FormatError,
            match=r"the format versions of lamina.meta \(3\) and lamina.commit \(4\) disagree "
            r"\(identity \d+ in both\): the file is damaged",
        ):
            lamina.open(native_path, mode)
    for name in (fmt.META_NAME, fmt.COMMIT_NAME):
        _set_version(native_path, name, 5)
    for mode in ("r", "a"):
        with pytest.raises(
            FormatError,
            match=r"lamina.commit: format version 5 is newer than this lamina reads \(versions 1 "
            r"to 4\): a newer lamina reads it",
        ):
            lamina.open(native_path, mode)


# ------------------------------------------------------------------ directories lamina did not make


@pytest.mark.parametrize("mode", ["w", "a"])
@pytest.mark.parametrize(
    "name", ["data.csv", "notes.txt", "data.1", "data.01.0", "lamina.metadata"]
)
def test_foreign_directory_is_refused_and_kept(tmp_path, mode, name):
    d = tmp_path / "results"
    d.mkdir()
    (d / name).write_text("precious")
    with pytest.raises(NotALaminaFileError, match=f"holds '{name}', which lamina did not write"):
        lamina.open(d, mode)
    assert sorted(os.listdir(d)) == [name] and (d / name).read_text() == "precious"


def test_truncating_keeps_what_lamina_did_not_write(native_path):
    write_steps(native_path, "w", [1.0, 2.0])
    with open(os.path.join(native_path, "README.txt"), "w") as fh:
        fh.write("mine")
    os.mkdir(os.path.join(native_path, "data.extra"))
    write_steps(native_path, "w", [3.0])
    names = sorted(os.listdir(native_path))
    assert "README.txt" in names and "data.extra" in names
    with lamina.open(native_path, "r") as f:
        assert f.steps == 1 and f["x"][0] == 3.0


def test_a_killed_writers_leftovers_are_cleared(native_path):
    """A directory holding only what a writer killed while creating the file left: 'a' starts it over."""
    os.mkdir(native_path)
    open(os.path.join(native_path, "data.0.0"), "wb").close()
    open(os.path.join(native_path, fmt.META_NAME), "wb").close()
    write_steps(native_path, "a", [4.0])
    with lamina.open(native_path, "r") as f:
        assert f.steps == 1


@pytest.mark.parametrize("damage", ["cut 0", "cut 15", "log gone", "log and meta gone"])
def test_append_refuses_a_file_whose_commit_log_is_damaged_and_changes_nothing(native_path, damage):
    """A commit log missing or cut inside its header beside records (or data) is a damaged
    file, not a creation cut short: 'a' removed the file and started it again (5 committed
    steps gone without a word); it is a FormatError now, the directory as it was, and 'w'
    still starts it again."""
    write_steps(native_path, "w", [1.0, 2.0, 3.0])
    commit = os.path.join(native_path, fmt.COMMIT_NAME)
    if damage.startswith("cut"):
        os.truncate(commit, int(damage.split()[1]))
    else:
        os.remove(commit)
        if damage == "log and meta gone":
            os.remove(os.path.join(native_path, fmt.META_NAME))

    def listing():
        return sorted(
            (n, os.path.getsize(os.path.join(native_path, n))) for n in os.listdir(native_path)
        )

    before = listing()
    with pytest.raises(FormatError, match="cannot append .* nothing was changed"):
        write_steps(native_path, "a", [4.0])
    assert listing() == before
    write_steps(native_path, "w", [5.0])
    with lamina.open(native_path, "r") as f:
        assert f.steps == 1 and f["x"][0] == 5.0


@pytest.mark.parametrize("name", ["lamina.lock", "data.1.0"])
def test_a_directory_where_lamina_keeps_a_file_is_a_lamina_error(native_path, name):
    """A directory named as the lock or the next session's subfile: 'a' raised a bare
    IsADirectoryError from deep inside; a LockError or FormatError naming it now, and the
    file reads as before."""
    write_steps(native_path, "w", [1.0])
    full = os.path.join(native_path, name)
    if os.path.lexists(full):
        os.remove(full)
    os.mkdir(full)
    with pytest.raises(lamina.LaminaError, match=f"{name} is a directory"):
        write_steps(native_path, "a", [2.0])
    with lamina.open(native_path, "r") as f:
        assert f.steps == 1 and f["x"][0] == 1.0


# ------------------------------------------------------------------ links planted inside the file


def test_planted_link_to_a_data_file_is_refused(native_path, tmp_path):
    write_steps(native_path, "w", [1.0])
    victim = tmp_path / "victim.txt"
    victim.write_text("do not touch")
    os.symlink(victim, os.path.join(native_path, "data.1.0"))  # the next session's subfile
    with pytest.raises(FormatError, match="data.1.0 is a symbolic link"):
        write_steps(native_path, "a", [2.0])
    assert victim.read_text() == "do not touch"
    with lamina.open(native_path, "r") as f:
        assert f.steps == 1 and f["x"][0] == 1.0


@pytest.mark.parametrize("mode", ["w", "a"])
def test_a_planted_link_for_the_lock_is_refused_as_the_others(native_path, tmp_path, mode):
    """A link at lamina.lock was a raw 'OSError: [Errno 40] Too many levels of symbolic
    links'; every other planted link is a FormatError saying lamina does not follow it."""
    write_steps(native_path, "w", [1.0])
    victim = tmp_path / "victim.txt"
    victim.write_text("do not touch")
    lock = os.path.join(native_path, lock_mod.LOCK_NAME)
    if os.path.lexists(lock):
        os.unlink(lock)
    os.symlink(victim, lock)
    with pytest.raises(FormatError, match="lamina.lock is a symbolic link"):
        lamina.open(native_path, mode)
    assert victim.read_text() == "do not touch"
    with lamina.open(native_path, "r") as f:
        assert f.steps == 1 and f["x"][0] == 1.0


WRITE_OVER = """
import sys, lamina
try:
    lamina.open(sys.argv[1], "w").close()
    print("opened")
except Exception as e:
    print(type(e).__name__, getattr(e, "filename", None), e, sep="|")
"""


@pytest.mark.parametrize("name", [fmt.COMMIT_NAME, fmt.META_NAME, "data.0.0"])
@pytest.mark.parametrize("perm", [0o444, 0o000])
def test_mode_w_refuses_read_only_files_and_removes_nothing(native_path, name, perm):
    """Mode 'w' deleted read-only logs and subfiles wherever the directory and the lock
    were writable; h5py's 'w' of a read-only file fails: a PermissionError naming the
    file, and every file left as it was."""
    write_steps(native_path, "w", [1.0, 2.0])
    os.chmod(os.path.join(native_path, name), perm)
    names = sorted(os.listdir(native_path))
    try:
        out = run_unprivileged(WRITE_OVER, native_path)
    finally:
        os.chmod(os.path.join(native_path, name), 0o644)
    kind, filename, _ = out.strip().split("|", 2)
    assert kind == "PermissionError" and filename == os.path.join(native_path, name), out
    assert sorted(os.listdir(native_path)) == names
    with lamina.open(native_path, "r") as f:
        assert f.steps == 2 and f["x"][0] == 2.0


@pytest.mark.parametrize("name", [fmt.META_NAME, fmt.COMMIT_NAME])
def test_readers_do_not_follow_links_either(native_path, tmp_path, name):
    write_steps(native_path, "w", [1.0])
    real = tmp_path / "moved"
    shutil.move(os.path.join(native_path, name), real)
    os.symlink(real, os.path.join(native_path, name))
    with pytest.raises(FormatError, match=f"{name} is a symbolic link"):
        lamina.open(native_path, "r")


def test_a_linked_subfile_is_refused_and_nothing_is_dropped(native_path, tmp_path):
    """A subfile replaced by a link is an error for readers and writers (docs/format.md), not
    a file cut short: a writer in 'a' cut both logs to their headers before it raised, and
    every committed step was gone once the subfile was put back."""
    write_steps(native_path, "w", [1.0, 2.0])
    logs = {
        n: open(os.path.join(native_path, n), "rb").read() for n in (fmt.META_NAME, fmt.COMMIT_NAME)
    }
    real = tmp_path / "moved"
    shutil.move(os.path.join(native_path, "data.0.0"), real)
    os.symlink(real, os.path.join(native_path, "data.0.0"))
    for mode in ("r", "a"):
        with pytest.raises(FormatError, match="data.0.0 is a symbolic link"):
            lamina.open(native_path, mode)
        assert {n: open(os.path.join(native_path, n), "rb").read() for n in logs} == logs
    os.remove(os.path.join(native_path, "data.0.0"))
    shutil.move(real, os.path.join(native_path, "data.0.0"))
    with lamina.open(native_path, "r") as f:
        assert f.steps == 2 and f["x"][0] == 2.0


# ------------------------------------------------------------------ files of the previous format version


def test_version_1_files_read_and_append(tmp_path):
    path = str(tmp_path / "v1.lam")
    shutil.copytree(os.path.join(DATA, "format-v1.lam"), path)
    with lamina.open(path, "r") as f:
        assert f.steps == 3 and f.attrs["title"] == "written by format version 1"
        np.testing.assert_array_equal(f.at(1)["fields/T"][:3], np.arange(15.0).reshape(3, 5) + 1)
        np.testing.assert_array_equal(f["fields/n"][...], np.arange(8) * 3)
        np.testing.assert_array_equal(f["T2"][...], 2 * f["fields/T"][...])
        assert f["fields/T"].attrs["units"] == "K"
    with lamina.open(path, "a") as f:  # a writer continues the file in its own version
        with f.step():
            f["fields/T"][...] = 5.0
    with open(os.path.join(path, fmt.COMMIT_NAME), "rb") as fh:
        assert fmt.check_header(fh.read(64), fmt.COMMIT_MAGIC, "c").version == 1
    with lamina.open(path, "r") as f:
        assert f.steps == 4 and f["T2"][0, 0] == 10.0 and f.at(0)["fields/T"][5, 0] == 100.0


def test_version_2_files_read_and_append(tmp_path):
    """Format version 2 (block records inline in the metadata frames): written by 2 ranks."""
    path = str(tmp_path / "v2.lam")
    shutil.copytree(os.path.join(DATA, "format-v2.lam"), path)
    want = [np.arange(40.0).reshape(8, 5) + k for k in range(3)]
    with lamina.open(path, "r") as f:
        assert f.steps == 3 and f.attrs["title"] == "written by format version 2"
        for k in range(3):
            np.testing.assert_array_equal(f.at(k)["fields/T"][...], want[k])
            np.testing.assert_array_equal(f.at(k)["T2"][...], 2 * want[k])
        np.testing.assert_array_equal(f["fields/n"][...], np.arange(8) * 3)
        assert f["fields/T"].attrs["units"] == "K"
        blocks = f["fields/T"].blocks(1)
        assert len(blocks) == 8 and {b.rank for b in blocks} == {0, 1}
        assert [b.stats.max for b in blocks] == [float(want[1][i].max()) for i in range(8)]
        r = f.query("`fields/T` > 37")
        assert r.count == 4 and len(r.candidates) == 1  # 38..41 at the last step, in one block
    with lamina.open(path, "a") as f:  # a writer continues the file in its own version
        with f.step():
            f["fields/T"][...] = 5.0
    with open(os.path.join(path, fmt.COMMIT_NAME), "rb") as fh:
        assert fmt.check_header(fh.read(64), fmt.COMMIT_MAGIC, "c").version == 2
    with lamina.open(path, "r") as f:
        assert f.steps == 4 and f["T2"][0, 0] == 10.0
        np.testing.assert_array_equal(f.at(2)["fields/T"][...], want[2])


@pytest.mark.parametrize("version", [1, 2])
def test_no_multiresolution_dataset_in_a_file_of_a_version_before_it(tmp_path, version):
    """A file of format 1 or 2 is appended to in its own version, which has no band blocks
    (codec 3): a multiresolution dataset there would make the file unreadable to the lamina
    that wrote it, so creating one is refused, naming the file and the versions; the writer
    goes on and the file stays in its version."""
    from lamina.errors import ConfigError

    path = str(tmp_path / f"v{version}.lam")
    shutil.copytree(os.path.join(DATA, f"format-v{version}.lam"), path)
    with lamina.open(path, "a") as f:
        with pytest.raises(
            ConfigError,
            match=rf"{path}: cannot create the multiresolution dataset 'MR': the file is in format "
            rf"version {version}, and multiresolution datasets came with format version 3 .*"
            r"new file \(mode 'w' writes format version 4\)",
        ):
            f.create_dataset("MR", (16, 16), "f4", layout=lamina.Multires(patch=8))
        assert "MR" not in f
        with f.step():
            f["fields/T"][...] = 5.0
    with open(os.path.join(path, fmt.COMMIT_NAME), "rb") as fh:
        assert fmt.check_header(fh.read(64), fmt.COMMIT_MAGIC, "c").version == version
    with lamina.open(path, "r") as f:
        assert f.steps == 4 and "MR" not in f and f["fields/T"][0, 0] == 5.0


def test_version_3_files_read_and_append(tmp_path):
    """Format version 3 (block sections stored as they are), with a multiresolution dataset
    (lossless, patches of 8): written by 2 ranks; a writer appends in version 3."""
    path = str(tmp_path / "v3.lam")
    shutil.copytree(os.path.join(DATA, "format-v3.lam"), path)
    want = [np.arange(40.0).reshape(8, 5) + k for k in range(3)]
    m = [(np.arange(40 * 36, dtype=np.float32).reshape(40, 36) % 97 + k) for k in range(3)]
    with lamina.open(path, "r") as f:
        assert f.steps == 3 and f.attrs["title"] == "written by format version 3"
        for k in range(3):
            np.testing.assert_array_equal(f.at(k)["fields/T"][...], want[k])
            np.testing.assert_array_equal(f.at(k)["T2"][...], 2 * want[k])
            np.testing.assert_array_equal(f.at(k)["M"][...], m[k])
        assert f["M"].levels == [(40, 36), (20, 18), (10, 9), (5, 5)]
        assert f.query("M > 95", level=1).count > 0
    with lamina.open(path, "a") as f:
        with f.step():
            f["fields/T"][...] = 5.0
            f["M"][...] = m[0]
    with open(os.path.join(path, fmt.COMMIT_NAME), "rb") as fh:
        assert fmt.check_header(fh.read(64), fmt.COMMIT_MAGIC, "c").version == 3
    with lamina.open(path, "r") as f:
        assert f.steps == 4 and f["T2"][0, 0] == 10.0
        np.testing.assert_array_equal(f["M"][...], m[0])
        np.testing.assert_array_equal(f.at(2)["M"][...], m[2])


def test_early_version_4_files_read_and_append(tmp_path, capsys):
    """The first writers of format 4 wrote the sections of multiresolution datasets without
    the amax column (compressed for M's 9 bands a level, stored as they are for L's one):
    they read fully, the bands' magnitudes unknown, and so does the file once this lamina
    appended a step with the column (docs/format.md, Block sections)."""
    from lamina import cli

    path = str(tmp_path / "v4e.lam")
    shutil.copytree(os.path.join(DATA, "format-v4-early.lam"), path)
    want = [np.arange(20.0).reshape(4, 5) + k for k in range(2)]
    m = [(np.arange(24 * 24, dtype=np.float32).reshape(24, 24) % 29 + k) for k in range(2)]
    lo = [np.arange(64, dtype=np.float32).reshape(8, 8) * (k + 1) for k in range(2)]

    def check(f, steps):
        for k in steps:
            np.testing.assert_array_equal(f.at(k)["T"][...], want[k])
            assert np.abs(f.at(k)["M"][...] - m[k]).max() <= 0.01
            np.testing.assert_array_equal(f.at(k)["L"][...], lo[k])
        assert f["M"].levels == [(24, 24), (12, 12), (6, 6), (3, 3)]
        assert f.at(1)["M"].level(3)[...].shape == (3, 3)
        assert f.at(1)["M"].read(tolerance=1.0).shape == (24, 24)

    with lamina.open(path, "r") as f:
        assert f.steps == 2 and f.attrs["title"] == "written by the first format version 4 writer"
        check(f, range(2))
        cat = f.engine.stack()[-1].catalog
        assert cat.table(cat.level("M", 0).id, 0).amax is None  # unknown, not made up
    assert cli.main(["ls", path]) == 0
    out = capsys.readouterr().out
    assert "M  float32 (24, 24)" in out and "L  float32 (8, 8)" in out
    with lamina.open(path, "a") as f:
        with f.step():
            f["T"][...] = want[0]
            f["M"][...] = m[0]
            f["L"][...] = lo[0]
    with lamina.open(path, "r") as f:
        assert f.steps == 3
        check(f, range(2))
        np.testing.assert_array_equal(f.at(2)["L"][...], lo[0])
        assert np.abs(f.at(2)["M"][...] - m[0]).max() <= 0.01
        cat = f.engine.stack()[-1].catalog
        assert cat.table(cat.level("M", 0).id, 2).amax is not None
    assert cli.main(["ls", path]) == 0


def test_format_4_keeps_band_metadata_small(tmp_path):
    """Version 4 compresses the block tables of multiresolution datasets: lamina.meta holds
    less than a third of what the tables take uncompressed, and reads back the same."""
    z, y, x = np.meshgrid(*(np.linspace(0, 4, 64),) * 3, indexing="ij")
    v = (np.sin(z) * np.cos(2 * y) + x * x / 8).astype(np.float32)
    path = str(tmp_path / "m.lam")
    with lamina.open(path, "w") as f:
        f.create_dataset("T", v.shape, v.dtype, layout=lamina.Multires(patch=16, tolerance=1e-3))
        with f.step():
            f["T"][...] = v
    meta = os.path.getsize(os.path.join(path, fmt.META_NAME))
    with lamina.open(path) as f:
        cat = f.engine.stack()[-1].catalog
        tables = [cat.table(cat.level("T", k).id, 0) for k in range(5)]
        assert sum(len(t) for t in tables) == 64 * 5  # a band per patch per level
        assert meta < sum(len(t.encode()) for t in tables) / 3
        assert np.abs(f["T"][...] - v).max() <= 1e-3


def test_killed_lock_holder_leaves_nothing_to_clean(native_path):
    write_steps(native_path, "w", [1.0])
    proc = hold(native_path, 60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t = time.monotonic()
    write_steps(native_path, "a", [2.0])
    assert time.monotonic() - t < 5


# ------------------------------------------------------------------ readers that come first


def test_reader_waits_for_a_file_not_created_yet(native_path):
    """The same program as under LAMINA_TRANSPORT=memory: open first, its writer creates the file later."""
    writer = (
        "import sys, time, lamina\n"
        "time.sleep(0.8)\n"
        "with lamina.open(sys.argv[1], 'w', durable=False) as f:\n"
        "    x = f.create_dataset('x', shape=(2,))\n"
        "    for k in range(3):\n"
        "        with f.step():\n"
        "            x[...] = k\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", writer, native_path], env=env)
    try:
        t = time.monotonic()
        with lamina.open(native_path, "r", wait=30) as f:
            assert time.monotonic() - t >= 0.5
            seen = [int(v["x"][0]) for v in f.iter_steps(timeout=30)]
        assert seen == [0, 1, 2]
    finally:
        proc.wait(30)


def test_waiting_reader_gives_up_with_a_clear_error(native_path, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"after waiting 0.3 s"):
        lamina.open(native_path, "r", wait=0.3)
    os.mkdir(native_path)  # created, but no commit log yet
    with pytest.raises(NotALaminaFileError, match=r"after waiting 0.2 s"):
        lamina.open(native_path, "r", wait=0.2)
    with pytest.raises(FileNotFoundError, match="no such lamina file"):
        lamina.open(str(tmp_path / "nope.lam"), "r")  # without wait=: at once, as before
    with pytest.raises(ValueError, match="wait must be"):
        lamina.open(native_path, "r", wait=-1)
    with pytest.raises(FileNotFoundError, match="after waiting"):  # as on disk
        lamina.open("mem://never", "r", engine="memory", wait=0.1)


def test_a_waiting_reader_waits_for_the_commit_logs_header(native_path):
    """Between making ``lamina.commit`` and writing its header, a writer's new file has an
    empty log: a reader with wait= waits on (it said 'bad magic' at once)."""
    with lamina.open(native_path, "w"):
        pass
    with open(os.path.join(native_path, fmt.META_NAME), "rb") as fh:
        meta = fh.read(min(fmt.HEADER_SIZES.values()))
    shutil.rmtree(native_path)
    os.mkdir(native_path)
    with open(os.path.join(native_path, fmt.META_NAME), "wb") as fh:
        fh.write(meta)
    open(os.path.join(native_path, fmt.COMMIT_NAME), "wb").close()
    with pytest.raises(NotALaminaFileError, match=r"after waiting 0.2 s"):
        lamina.open(native_path, "r", wait=0.2)


def _file_of_steps(path, steps: int):
    """A writer of *path* (left open) that committed *steps* steps of dataset a."""
    w = lamina.open(path, "w")
    w.create_dataset("a", (2,), "i8")
    for k in range(steps):
        with w.step():
            w["a"][...] = k
    return w


def test_waits_look_at_the_file_before_judging_it(native_path):
    """What the reader's last refresh saw is not taken for the file now: a timeout of 0 looks
    once (as ADIOS2's BeginStep with timeout 0), a writer that closed and opened the file
    again in mode 'a' adds steps, and iter_steps(start=-k) counts from the steps committed
    at the call."""
    w = _file_of_steps(native_path, 1)
    r = lamina.open(native_path, "r")
    with w.step():
        w["a"][...] = 1
    assert r.wait_for_step(1, timeout=0).index == 1
    with pytest.raises(lamina.StepTimeoutError, match=r"no step 2 .* after 0(\.0)? s"):
        r.wait_for_step(2, timeout=0)
    w.close()
    r.refresh()  # the writer closed: step 2 will never come...
    with pytest.raises(lamina.StepError, match="will never exist"):
        r.wait_for_step(2, timeout=5)
    with lamina.open(native_path, "a") as w:  # ...until it opens the file again
        for k in range(2, 10):
            with w.step():
                w["a"][...] = k
    assert r.wait_for_step(2, timeout=5).index == 2
    assert [int(v["a"][0]) for v in r.iter_steps(start=-2)] == [8, 9]
    assert r.steps == 10
    r.close()


def test_seconds_past_a_float_wait_for_ever(native_path):
    """timeout=10**400 (and open's wait=) is no limit, as inf is, not an OverflowError; a poll
    of inf looks again after the longest pause."""
    w = _file_of_steps(native_path, 1)
    with lamina.open(native_path, "r", wait=10**400) as r:
        assert r.wait_for_step(0, timeout=10**400).index == 0
        assert next(r.iter_steps(timeout=10**400)).index == 0
        with pytest.raises(lamina.StepTimeoutError):
            r.wait_for_step(1, timeout=0.2, poll=1e300)
    w.close()


def test_ls_of_a_file_closed_while_it_was_read_says_closed(native_path):
    """ls reads the logs, then asks whether a writer holds the file: a writer that closed in
    between was said to have ended without closing it."""
    from lamina.cli.files import _file_head, _head_line

    w = _file_of_steps(native_path, 1)
    with lamina.open(native_path, "r") as r:
        w.close()
        line = _head_line(_file_head(r, []))
    assert "1 step (closed)" in line and "without closing" not in line, line
    w = lamina.open(native_path, "a")
    with lamina.open(native_path, "r") as r:
        assert "open for writing" in _head_line(_file_head(r, []))
    w.close()


def test_a_file_whose_sessions_are_used_up_takes_no_writer(native_path, monkeypatch):
    """Sessions are 32 bits in a record: a file whose last writer had the last one (forged, or
    4 billion appends) is refused for writing with a FormatError before any subfile is made,
    and still reads."""
    from lamina.engines.native.engine import NativeEngine

    with lamina.open(native_path, "w") as f:
        x = f.create_dataset("x", (4,))
        with f.step():
            x[...] = 1
    before = sorted(os.listdir(native_path))
    load = NativeEngine._load_new

    def last_session_used_up(self):
        n = load(self)
        self.catalog.last_session = 0xFFFFFFFF
        return n

    monkeypatch.setattr(NativeEngine, "_load_new", last_session_used_up)
    with pytest.raises(FormatError, match="takes no further writer"):
        lamina.open(native_path, "a")
    assert sorted(os.listdir(native_path)) == before
    with lamina.open(native_path) as f:
        assert f.steps == 1 and f["x"][...].tolist() == [1.0] * 4


def test_a_short_pwritev_of_a_record_is_written_again_whole(native_path, monkeypatch):
    """A record's block area and frame go out in one pwritev; where the system writes less
    than both, they are written again whole at the same offsets (a commit stays readable)."""
    calls = []
    real = os.pwritev

    def short(fd, bufs, offset):
        calls.append(offset)
        return real(fd, [bytes(memoryview(bufs[0])[:1])], offset)  # one byte only

    monkeypatch.setattr(os, "pwritev", short)
    with lamina.open(native_path, "w") as f:
        x = f.create_dataset("x", (4,))
        for k in range(3):
            with f.step():
                x[...] = k
    assert calls
    with lamina.open(native_path) as f:
        assert f.steps == 3 and f["x"].read(step=2).tolist() == [2.0] * 4


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files through /proc")
def test_an_append_killed_while_it_cuts_the_unreadable_tail_leaves_the_prefix(native_path):
    """A file whose last session's subfile was cut short reads as its intact prefix; an
    appending writer cuts the commit log and the metadata back to it at open.  Killed
    between the two cuts, it must leave that prefix readable (the metadata cut first left
    commit entries past its end, and every later open refused the file)."""
    import warnings

    def write(mode, ks):
        with lamina.open(native_path, mode) as f:
            if "x" not in f:
                f.create_dataset("x", (100,), "int64")
            for k in ks:
                with f.step():
                    f["x"][...] = np.arange(100) + 1000 * k

    write("w", [0, 1])
    write("a", [2, 3])
    os.truncate(os.path.join(native_path, "data.1.0"), 10)  # session 1's blocks cut short
    child = (
        "import os, signal, sys\n"
        "import lamina\n"
        "real = os.ftruncate\n"
        "def cut(fd, n):\n"
        "    real(fd, n)\n"
        "    if os.readlink(f'/proc/self/fd/{fd}').rsplit('/', 1)[-1] in ('lamina.meta', 'lamina.commit'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)  # at the first of the two cuts\n"
        "os.ftruncate = cut\n"
        "lamina.open(sys.argv[1], 'a')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", child, native_path], env=env, timeout=60)
    assert r.returncode == -signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with lamina.open(native_path) as f:
            assert f.steps == 2 and [int(f.at(k)["x"][0]) for k in range(2)] == [0, 1000]
        write("a", [7])
    with lamina.open(native_path) as f:
        assert f.steps == 3 and int(f["x"][0]) == 7000


def _fill_disk(monkeypatch, target: str, err: int) -> None:
    """Every write of this process to a file whose name starts with *target* fails with
    *err* (a full disk: ENOSPC, or EFBIG past a size limit) until ``monkeypatch.undo()``."""
    real = {"pwrite": os.pwrite, "pwritev": os.pwritev}

    def full(name):
        def write(fd, data, offset):
            if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(target):
                raise OSError(err, os.strerror(err))
            return real[name](fd, data, offset)

        return write

    for name in real:
        monkeypatch.setattr(os, name, full(name))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files through /proc")
@pytest.mark.parametrize(
    "target, words",
    [
        ("data.", r"writing step 1: 2 staged blocks of datasets 'a', 'b'\): '/.*/data\.0\.0'"),
        ("lamina.meta", r"writing the record of step 1\): '.*lamina\.meta'"),
        (
            "lamina.commit",
            r"writing the commit entry of the record of step 1\): '.*lamina\.commit'",
        ),
    ],
)
def test_a_full_disk_names_what_was_being_written(native_path, monkeypatch, target, words):
    """A write that fails names its file and what it held (small blocks said 'the step's
    blocks'; the metadata and the commit log named no file at all); nothing is committed."""
    with lamina.open(native_path, "w", durable=False) as f:
        a, b = f.create_dataset("a", (4,)), f.create_dataset("b", (4,))
        with f.step():
            a[...], b[...] = 1, 2
        _fill_disk(monkeypatch, target, errno.ENOSPC)
        with pytest.raises(OSError, match=words) as got:
            with f.step():
                a[...], b[...] = 3, 4
        monkeypatch.undo()
        assert got.value.errno == errno.ENOSPC
    with lamina.open(native_path) as f:
        assert f.steps == 1 and f["b"][...].tolist() == [2.0] * 4


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files through /proc")
@pytest.mark.parametrize(
    "target, record, words",
    [
        ("data.", "step", r"writing step 1: dataset 'a' box \[0:65536\]\): '/.*/data\.0\.0'"),
        (
            "lamina.meta",
            "meta",
            r"writing the metadata record of changes made outside a step\): '/.*/lamina\.meta'",
        ),
        ("lamina.meta", "close", r"writing the close record\): '/.*/lamina\.meta'"),
        ("lamina.commit", "close", r"writing the commit entry of the close record\)"),
    ],
)
def test_a_full_disk_names_the_step_or_record_and_the_whole_path(
    native_path, monkeypatch, target, record, words
):
    """A full subfile was named by its bare name ('data.0.0', relative to nothing) without
    the step; a close or metadata record that did not fit was 'the step's record'."""
    f = lamina.open(native_path, "w", durable=False)
    a = f.create_dataset("a", (1 << 16,))
    with f.step():
        a[...] = 1
    if record == "meta":
        f.attrs["note"] = "pending"  # committed at close by a metadata record
    _fill_disk(monkeypatch, target, errno.EFBIG)
    with pytest.raises(OSError, match=words) as got:
        if record == "step":
            with f.step():
                a[...] = 2
        f.close()
    monkeypatch.undo()
    assert got.value.errno == errno.EFBIG and os.path.isabs(got.value.filename)
    f.close()
    with lamina.open(native_path) as g:  # nothing committed is lost
        assert g.steps == 1 and g["a"][0] == 1.0


FULL_AT_OPEN = """
import resource, signal, sys, lamina
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
try:
    lamina.open(sys.argv[1], "w")
except OSError as e:
    print(e.errno, e.filename, e.strerror, sep="|")
"""


@pytest.mark.parametrize(
    "limit, name, words",
    [(0, "lamina.lock", "who holds the lock"), (10, "lamina.meta", "the header of lamina.meta")],
)
def test_a_full_disk_at_open_names_the_file(native_path, limit, name, words):
    """A file-size limit (a full disk) hit by open('w') while the lock's holder or the logs'
    headers are written was a bare '[Errno 27] File too large', naming no file; and what
    was written stays openable."""
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("LAMINA_ENGINE", None)
    out = subprocess.run(
        [sys.executable, "-c", FULL_AT_OPEN, native_path, str(limit)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    code, filename, strerror = out.split("|")
    assert int(code) == errno.EFBIG and filename == os.path.join(native_path, name), out
    assert f"(writing {words})" in strerror, out
    for mode in ("w", "a"):
        with lamina.open(native_path, mode):
            pass


UNPRIVILEGED = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
]


def run_unprivileged(code: str, *args: str) -> str:
    """*code* run by Python in a process that file permissions hold (as root: without the
    capabilities that override them); its output.  Skipped where that cannot be had."""
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("LAMINA_ENGINE", None)
    cmd = [sys.executable, "-c", code, *args]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv to drop the capabilities that override permissions")
        cmd = UNPRIVILEGED + cmd
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if os.geteuid() == 0 and r.returncode and "setpriv" in r.stderr:
        pytest.skip(f"cannot drop capabilities here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return r.stdout


OPEN_TO_READ = """
import sys, time, lamina
t0 = time.monotonic()
try:
    lamina.open(sys.argv[1], "r", wait=float(sys.argv[2]))
    print("opened")
except Exception as e:
    print(type(e).__name__, getattr(e, "filename", None), time.monotonic() - t0, e, sep="|")
"""


@pytest.mark.parametrize("wait", [0, 3])
@pytest.mark.parametrize("locked", ["file", "parent"])
def test_a_reader_not_let_in_gets_a_permission_error(native_path, locked, wait):
    """A lamina file (or its parent directory) the user may not enter was 'not a lamina
    file (no lamina.commit inside)' or 'no such lamina file' (after the whole wait): the
    existence checks took EACCES for 'missing'. Writers got PermissionError already."""
    write_steps(native_path, "w", [1.0])
    shut = native_path if locked == "file" else os.path.dirname(native_path)
    os.chmod(shut, 0o000)
    try:
        out = run_unprivileged(OPEN_TO_READ, native_path, str(wait))
    finally:
        os.chmod(shut, 0o755)
    kind, filename, took, _ = out.strip().split("|", 3)
    assert kind == "PermissionError" and filename.startswith(native_path), out
    assert float(took) < 2.5, f"waited {float(took):.1f} s for a file it may not read"


# ------------------------------------------------------------------ a reader following the file


def test_a_refresh_reads_and_checks_only_the_new_commit_entries(native_path, monkeypatch):
    """Each refresh read and checked the whole commit log (a file of n steps cost n entry
    checksums a refresh: following it to the end, O(n^2)); what the reader saw before is
    not read again, and a log cut below it is still found."""
    with lamina.open(native_path, "w", durable=False) as w:
        x = w.create_dataset("x", shape=(4,), dtype="f8")
        for k in range(300):
            with w.step():
                x[...] = k
        with lamina.open(native_path, "r") as r:
            assert r.steps == 300
            calls = []
            real = fmt.crc
            monkeypatch.setattr(fmt, "crc", lambda b, *a: calls.append(len(b)) or real(b, *a))
            for k in (300, 301):
                with w.step():
                    x[...] = k
                calls.clear()
                assert r.refresh() == k + 1
                # the last entry seen, again, the new entry (and its record's frame)
                assert len(calls) <= 4, calls
                np.testing.assert_array_equal(r["x"][...], float(k))
            monkeypatch.undo()
            w.close()
            r.refresh()
            commit = os.path.join(native_path, fmt.COMMIT_NAME)
            os.truncate(commit, os.path.getsize(commit) - 3 * fmt.ENTRY_SIZE)
            with pytest.raises(
                FormatError, match=r"seen before.*: the file was truncated or re-created"
            ):
                r.refresh()


def test_a_reader_reads_and_follows_a_file_renamed_while_open(native_path):
    """A file moved (mv) while a reader had it open was 're-created while open (another
    writer opened it in mode 'w')' at the next refresh, and a step it had seen could not be
    read (FileNotFoundError: lamina.meta, opened by name when first needed).  As an open
    h5py file, it reads on: the reader holds its directory, not its name."""
    w = lamina.open(native_path, "w", durable=False)
    x = w.create_dataset("x", shape=(4,))
    for k in range(2):
        with w.step():
            x[...] = k
    r = lamina.open(native_path, "r")
    try:
        os.rename(native_path, native_path + ".moved")
        with w.step():  # the writer goes on in the moved file
            x[...] = 2
        assert r.refresh() == 3
        assert [r.at(k)["x"][0] for k in range(3)] == [0.0, 1.0, 2.0]
        w.close()
        assert r.wait_for_step(-1, timeout=5)["x"][0] == 2.0
    finally:
        r.close()
        w.close()


def test_a_reader_of_a_file_deleted_while_open_is_told_so(native_path):
    """A file deleted (rm -rf) under a reader was 're-created while open (another writer
    opened it in mode 'w')' though nobody re-created it, and a read of a step it had seen a
    raw FileNotFoundError on lamina.meta."""
    write_steps(native_path, "w", [1.0, 2.0])
    r = lamina.open(native_path, "r")
    try:
        shutil.rmtree(native_path)
        for read in (r.refresh, lambda: r.at(0)["x"][...]):
            with pytest.raises(FormatError, match="deleted while open") as got:
                read()
            assert "re-created" not in str(got.value)
        write_steps(native_path, "w", [9.0])  # another file at the name: not this reader's
        with pytest.raises(FormatError, match="deleted while open"):
            r.refresh()
    finally:
        r.close()


def test_a_log_cut_and_grown_again_under_a_reader_is_refused(native_path):
    """A commit log cut below what a reader saw and grown past it again by another writer
    was read on from the reader's old place: it took the new log's close record and missed
    the steps before it. The last entry it saw is checked to be still there."""
    with lamina.open(native_path, "w") as w:
        x = w.create_dataset("x", shape=(2,), dtype="f8")
        for k in range(3):
            with w.step():
                x[...] = k
    with lamina.open(native_path, "r") as r:
        assert r.steps == 3 and r.engine.writer_closed
        commit = os.path.join(native_path, fmt.COMMIT_NAME)
        meta = os.path.join(native_path, fmt.META_NAME)
        entries, _, _ = fmt.parse_commits(open(commit, "rb").read(), os.path.getsize(meta))
        os.truncate(commit, os.path.getsize(commit) - fmt.ENTRY_SIZE)  # the close record's entry
        os.truncate(meta, entries[-1].offset)
        with lamina.open(native_path, "a") as w:
            for k in (100, 101):
                with w.step():
                    w["x"][...] = k
        with pytest.raises(
            FormatError, match=r"seen before, is gone or changed: the file was truncated"
        ):
            r.refresh()


# ------------------------------------------------------------------ fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_reads_what_its_parent_had_open(native_path):
    """A child made by fork (multiprocessing's default on Linux) after its parent read a
    large block waited for ever on the checksum thread, which the fork did not copy."""
    with lamina.open(native_path, "w") as w:
        w.create_dataset("u", (2_000_000,), "f8")
        with w.step():
            w["u"][...] = 1.0
    with lamina.open(native_path) as f:
        assert f["u"][...].sum() == 2_000_000  # (a block this large is checked on the thread)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os._exit(0 if f["u"][...].sum() == 2_000_000 else 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's read did not finish in 30 s")


# ------------------------------------------------------------------ Ctrl-C in end_step


@pytest.mark.parametrize("where", ["before the record", "after the record"])
def test_an_interrupted_end_step_leaves_no_step_open(native_path, monkeypatch, where):
    """Ctrl-C in end_step, caught as a REPL or Jupyter does: before the record was written
    the step stayed open (the next step was 'already open' and close committed it); after,
    close committed its blocks again as a step of their own. Now as an error at the same
    point: discarded before the record, committed once after it."""
    import lamina.engines.block as block_mod

    armed = [False]
    if where == "before the record":
        real = os.fsync

        def fsync(fd):
            if armed[0]:
                armed[0] = False
                raise KeyboardInterrupt
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)
    else:
        real_end = block_mod.BlockEngine._end_of_step

        def end_of_step(self):
            if armed[0]:
                armed[0] = False
                raise KeyboardInterrupt
            return real_end(self)

        monkeypatch.setattr(block_mod.BlockEngine, "_end_of_step", end_of_step)
    f = lamina.open(native_path, "w", durable=True)
    f.create_dataset("u", (4,), "f8")
    with f.step():
        f["u"][...] = 0
    armed[0] = True
    with pytest.raises(KeyboardInterrupt):
        with f.step():
            f["u"][...] = 1
    kept = [0.0] if where == "before the record" else [0.0, 1.0]
    assert f.steps == len(kept)
    with f.step():
        f["u"][...] = 2
    f.close()
    with lamina.open(native_path) as r:
        assert [r.at(k)["u"][0] for k in range(r.steps)] == [*kept, 2.0]


# ------------------------------------------------------- hostile and damaged files, read


def _forge_zfp_band(monkeypatch, path: str, edge: int = 64) -> None:
    """A multiresolution dataset whose finest band's zfp header says 'fixed rate, 32,768 bits
    a block' (zfp's long mode allows it), every checksum right (lamina's writer wrote it)."""
    import zfpy

    real = zfpy.compress_numpy
    minexp = -1074 + 16495  # zfp's ZFP_MIN_EXP as its 64-bit mode stores it
    long_mode = 0xFFF | (32767 << 12) | (32767 << 27) | (63 << 42) | (minexp << 49)

    def forged(a, **kw):
        blob = bytearray(real(a, **kw))
        if a.ndim == 2 and a.shape[0] > edge:  # the finest detail band only
            v = int.from_bytes(blob[:19], "little")
            v = (v & ((1 << 84) - 1)) | (long_mode << 84) | ((v >> 148) << 148)
            blob[:19] = v.to_bytes(19, "little")
        return bytes(blob)

    monkeypatch.setattr(zfpy, "compress_numpy", forged)
    with lamina.open(path, "w") as f:
        m = f.create_dataset(
            "m",
            (edge, edge),
            "f8",
            layout=lamina.Multires(patch=edge, tolerance=1e-3, verify="none"),
        )
        y, x = np.mgrid[0:edge, 0:edge]
        with f.step():
            m[...] = np.sin(x / 7.0) + np.cos(y / 11.0)
    monkeypatch.setattr(zfpy, "compress_numpy", real)


def test_a_band_whose_zfp_header_reads_past_its_bytes_is_refused(native_path, monkeypatch):
    """zfp reads as far as its header's mode lets it: a band's header of 32,768 bits a block
    read far past the padded stream (a segfault of the reader and of lamina verify).  Read
    in a process of its own: on the code before, the crash would take the suite with it."""
    pytest.importorskip("zfpy")
    _forge_zfp_band(monkeypatch, native_path)
    code = (
        "import lamina\n"
        f"f = lamina.open({native_path!r})\n"
        "try:\n    f['m'][...]\n"
        "except lamina.CodecError as e:\n    print('CodecError', e)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "CodecError" in r.stdout and "32768 bits" in r.stdout, r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "lamina", "verify", native_path],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1 and "DAMAGED" in r.stdout and "32768 bits" in r.stdout, (
        r.returncode, r.stdout, r.stderr[-2000:],
    )  # fmt: skip


def _unclosed(path: str) -> None:
    """A file of one step whose close record is gone from the commit log (its writer killed)."""
    with lamina.open(path, "w") as f:
        d = f.create_dataset("d", shape=(4,), dtype="f8")
        with f.step():
            d[...] = np.arange(4.0)
    p = os.path.join(path, "lamina.commit")
    os.truncate(p, os.path.getsize(p) - 32)


def test_a_lock_file_that_is_a_named_pipe_never_blocks(native_path):
    """lamina ls and info of a file with no close record asked whether its writer runs by
    opening lamina.lock, which waited for ever where it is a named pipe; an append took it
    for the lock and failed with a raw EINVAL."""
    _unclosed(native_path)
    lock = os.path.join(native_path, "lamina.lock")
    os.remove(lock)
    os.mkfifo(lock)
    env = {**os.environ, "PYTHONPATH": SRC}
    for cmd in ("ls", "info"):
        r = subprocess.run(
            [sys.executable, "-m", "lamina", cmd, native_path],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0 and "not closed" in r.stdout, (cmd, r.stdout, r.stderr)
    assert lock_mod.writer_running(native_path) is None
    with pytest.raises(LockError, match="lock file lamina.lock is a named pipe"):
        lamina.open(native_path, "a")
    with lamina.open(native_path) as f:
        np.testing.assert_array_equal(f["d"][...], np.arange(4.0))


def test_a_last_commit_entry_of_a_huge_length_allocates_nothing_of_it(native_path):
    """The last entry of the commit log, its checksum right, claiming a frame of 2 GiB: the
    reader read that much of lamina.meta into memory before it found the frame short (a
    MemoryError under a 1 GiB address space).  Now it reads what lamina.meta holds."""
    import struct

    from lamina.stats import crc

    with lamina.open(native_path, "w") as f:
        d = f.create_dataset("d", shape=(4,), dtype="f8")
        for k in range(2):
            with f.step():
                d[...] = np.arange(4.0) + k
    p = os.path.join(native_path, "lamina.commit")
    com = bytearray(open(p, "rb").read())
    pos = len(com) - 32  # the close record's entry
    seq, off, _, pcrc, _ = struct.unpack_from("<QQQII", com, pos)
    head = struct.pack("<QQQI", seq, off, 1 << 31, pcrc)
    com[pos:] = head + struct.pack("<I", crc(head))
    with open(p, "wb") as fh:
        fh.write(com)
    code = (
        "import resource, warnings, lamina\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "warnings.simplefilter('ignore')\n"
        f"f = lamina.open({native_path!r})\n"
        "print('steps', f.steps, f['d'][...].tolist())\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.stdout.strip() == "steps 2 [1.0, 2.0, 3.0, 4.0]", (r.stdout, r.stderr[-2000:])


def test_verify_finds_blocks_that_overlap(native_path):
    """Two blocks of a step forged to one box, every checksum made right again: a read refuses
    them (blocks ... overlap), and lamina verify said the file was intact."""
    import struct

    from lamina.catalog.blocks import _section_dtype
    from lamina.catalog.model import decode_op
    from lamina.catalog.wire import Decoder
    from lamina.check import verify
    from lamina.stats import crc

    with lamina.open(native_path, "w") as f:
        a = f.create_dataset("a", shape=(8, 8), dtype="f8")
        with f.step():
            a[0:4, :] = 1.0
            a[4:8, :] = 2.0
    mp, cp = os.path.join(native_path, "lamina.meta"), os.path.join(native_path, "lamina.commit")
    meta, com = bytearray(open(mp, "rb").read()), bytearray(open(cp, "rb").read())
    _, off, ln, _, _ = struct.unpack_from("<QQQII", com, 32)  # entry 0: the step's record
    p0 = off + 12
    d = Decoder(bytes(meta[p0 : off + ln]))
    d.fields(struct.Struct("<BqIId"))
    for _ in range(d.u32()):
        decode_op(d)
    assert d.u32() == 1
    dirpos = p0 + d.pos
    _, n, so, sl, _, _ = struct.unpack_from("<IQQQIQ", meta, dirpos)
    d.pos += 40
    k = d.u32()  # (read before pos is: d.pos += 16 * d.u32() loses the u32's 4 bytes)
    d.pos += 16 * k
    fo = d.u64() + so
    _, ncrcs = struct.unpack_from("<QQ", meta, fo)
    sdt = _section_dtype(n, 2, np.dtype("<f8"), ncrcs, False)
    struct.pack_into("<q", meta, fo + 16 + sdt.fields["start"][1] + 16, 0)  # block 1: rows 4..8
    struct.pack_into("<q", meta, fo + 16 + sdt.fields["stop"][1] + 16, 4)  # -> rows 0..4
    struct.pack_into("<I", meta, dirpos + 28, crc(bytes(meta[fo : fo + sl])))
    c = crc(bytes(meta[p0 : off + ln]))
    struct.pack_into("<I", meta, off + 8, c)
    head = struct.pack("<QQQI", 0, off, ln, c)
    com[32:64] = head + struct.pack("<I", crc(head))
    with open(mp, "wb") as fh:
        fh.write(meta)
    with open(cp, "wb") as fh:
        fh.write(com)
    with lamina.open(native_path) as f:
        with pytest.raises(FormatError, match=r"blocks \[0:4, 0:8\] and \[0:4, 0:8\] overlap"):
            f["a"][...]
        report = verify(f)
    assert [p["what"] for p in report["problems"]] == ["table"], report["problems"]
    assert "overlap" in report["problems"][0]["error"]


def test_codec_parameters_from_the_file_are_shown_escaped(native_path, monkeypatch, capsys):
    """A codec's parameters come from the file: a blosc cname holding a newline and a terminal
    escape made lamina ls print a line of its own and colour the terminal."""
    import lamina.codecs
    from lamina.cli import main

    real = lamina.codecs.normalize
    evil = {"id": "blosc", "cname": "lz4\n  FAKE  float64 (1,)  \x1b[31mred\x1b[0m"}
    monkeypatch.setattr(
        lamina.codecs, "normalize", lambda c, dt, nd: (evil,) if c == "evil" else real(c, dt, nd)
    )
    with lamina.open(native_path, "w") as f:
        f.create_dataset("x", shape=(4,), dtype="f8", compression="evil")
    monkeypatch.setattr(lamina.codecs, "normalize", real)
    for cmd in (["ls", native_path], ["info", native_path, "x"]):
        main(cmd)
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\n  FAKE" not in out, out
        assert "cname=lz4\\n  FAKE  float64 (1,)  \\x1b[31mred\\x1b[0m" in out, out
