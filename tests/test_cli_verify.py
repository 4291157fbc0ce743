"""``lamina verify``: every stored block read and checked; damage named block by block."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import lamina
from lamina import cli
from lamina.layouts import Multires


def _write(path: str) -> None:
    """Three steps of a raw dataset in two blocks, a compressed one, a multiresolution one,
    a derived quantity kept as statistics and one kept as its expression."""
    rng = np.random.default_rng(7)
    with lamina.open(path, "w") as f:
        a = f.create_dataset("a", (16, 16), "f8")
        z = f.create_dataset("z", (16, 16), "f4", compression="zstd")
        m = f.create_dataset("m", (32, 32), "f8", layout=Multires(patch=(16, 16), tolerance=1e-3))
        f.derive("s", "a * 2", strategy="stats")
        f.derive("e", "a + 1", strategy="expression")
        for k in range(3):
            with f.step():
                a[:8] = k
                a[8:] = k + 1
                z[...] = np.arange(256, dtype="f4").reshape(16, 16) + k
                m[...] = rng.random((32, 32))


def _blocks(path: str, name: str, step: int, level: int = 0):
    """(subfile, offset, length) of each stored block of *name* (its *level*) at *step*."""
    with lamina.open(path) as f:
        eng = f.engine.stack()[-1]
        cat = eng.catalog
        t = cat.table_of(cat.level(name, level), step)
        return [
            (f"data.{int(s)}.{int(g)}", int(o), int(n))
            for s, g, o, n in zip(t.session, t.agg, t.offset, t.length, strict=True)
        ]


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x10]))


def run(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def good(tmp_path) -> str:
    path = str(tmp_path / "good.lam")
    _write(path)
    return path


def test_an_intact_file(good, capsys):
    rc, out, err = run(["verify", good], capsys)
    # a: 2 blocks a step, z: 1, m: 4 patches x 5 levels; s: statistics only, e: no blocks
    assert rc == 0 and err == ""
    assert (
        out.strip()
        == f"{good}: format 4, 3 steps, 69 blocks, {_size(good)} read and checked: intact"
    )
    rc, out, _ = run(["verify", good, "--json"], capsys)
    rep = json.loads(out)
    assert rc == 0 and rep["intact"] and rep["blocks"] == 69 and rep["problems"] == []
    assert rep["format_version"] == 4


def _size(path: str) -> str:
    """The stored bytes of every block, as verify says them."""
    from lamina.text import fmt_bytes

    parts = [("a", 0), ("z", 0)] + [("m", lv) for lv in range(5)]
    total = sum(n for name, lv in parts for s in range(3) for _, _, n in _blocks(path, name, s, lv))
    return fmt_bytes(total)


def test_each_damaged_block_is_named_and_the_rest_checked(good, tmp_path, capsys):
    """A flipped byte in a raw block, a compressed one and a multiresolution band: each
    named by step, dataset, box and bytes; every other block still checked."""
    path = str(tmp_path / "bad.lam")
    shutil.copytree(good, path)
    sub, off, _ = _blocks(path, "a", 1)[1]
    _flip(os.path.join(path, sub), off + 100)
    sub, off, _ = _blocks(path, "z", 0)[0]
    _flip(os.path.join(path, sub), off + 40)
    sub, off, _ = _blocks(path, "m", 2, level=2)[3]
    _flip(os.path.join(path, sub), off + 20)
    rc, out, err = run(["verify", path], capsys)
    lines = out.strip().splitlines()
    assert rc == 1 and err == "", out
    assert len(lines) == 4, out
    assert lines[0].startswith(f"{path}: step 0: checksum mismatch") and "dataset 'z'" in lines[0]
    assert "step 1:" in lines[1] and "dataset 'a' block [8:16, 0:16]" in lines[1]
    assert "step 2:" in lines[2] and "dataset 'm level 2'" in lines[2]
    assert lines[3] == (
        f"{path}: DAMAGED: 3 of 69 blocks damaged (steps 0-2); format 4, 3 steps, 69 blocks, "
        f"{_size(good)} read and checked"
    )
    rc, out, _ = run(["verify", path, "--json"], capsys)
    rep = json.loads(out)
    assert rc == 1 and not rep["intact"]
    assert [(p["step"], p["dataset"], p["box"]) for p in rep["problems"]] == [
        (0, "z", "[0:16, 0:16]"),
        (1, "a", "[8:16, 0:16]"),
        (2, "m level 2", _box_of(path, "m", 2, 2, 3)),
    ]
    # the file still reads where it is intact, and refuses where it is not
    with lamina.open(path) as f:
        np.testing.assert_array_equal(f["a"].read(step=2)[:8], 2)
        with pytest.raises(lamina.errors.ChecksumError):
            f["a"].read(step=1)


def _box_of(path, name, step, level, row) -> str:
    from lamina.text import fmt_box

    with lamina.open(path) as f:
        cat = f.engine.stack()[-1].catalog
        return fmt_box(cat.table_of(cat.level(name, level), step).box(row))


def test_a_codec_this_installation_cannot_decode(good, capsys, monkeypatch):
    """Intact bytes that do not decode here (a codec missing, a codec's bug) are named too."""
    from lamina import codecs

    def refuse(self, data, dtype, shape, what):
        raise lamina.errors.CodecError(f"{what}: zstd is not installed")

    monkeypatch.setattr(codecs.Pipeline, "decode", refuse)
    rc, out, _ = run(["verify", good], capsys)
    lines = out.strip().splitlines()
    assert rc == 1
    assert [ln.split(": ")[1] for ln in lines[:-1]] == ["step 0", "step 1", "step 2"]
    assert all("dataset 'z'" in ln and "zstd is not installed" in ln for ln in lines[:-1])


def test_a_subfile_cut_short_or_missing_is_damage_of_the_metadata_kind(good, tmp_path, capsys):
    """A cut subfile leaves the steps that need its bytes out of the open (said as it opens):
    verify reports them as left out and exits 1; with the subfile gone, every step."""
    path = str(tmp_path / "cut.lam")
    shutil.copytree(good, path)
    sub, off, n = _blocks(path, "a", 2)[0]
    os.truncate(os.path.join(path, sub), off + n // 2)
    rc, out, _ = run(["verify", path], capsys)
    assert rc == 1
    assert "left out" in out.splitlines()[0]
    assert out.strip().splitlines()[-1].startswith(f"{path}: DAMAGED: ")
    assert "committed record" in out.strip().splitlines()[-1]
    os.remove(os.path.join(path, sub))
    rc, out, _ = run(["verify", path], capsys)
    assert rc == 1 and "subfile data.0.0 is missing" in out
    assert "format 4, 0 steps, 0 blocks" in out.strip().splitlines()[-1]


def test_not_a_file_is_status_2(tmp_path, capsys):
    rc, _, err = run(["verify", tmp_path / "absent.lam"], capsys)
    assert rc == 2 and err.startswith("lamina verify: error:") and "Traceback" not in err


def test_ranks_share_the_reading_and_rank_0_speaks_for_all(good, tmp_path):
    """``mpiexec -n 3 lamina verify``: each rank reads its share; one report, the same as
    one process's, and the job's status 1."""
    import sys

    import mpi_util as mu

    path = str(tmp_path / "bad.lam")
    shutil.copytree(good, path)
    sub, off, _ = _blocks(path, "a", 1)[1]
    _flip(os.path.join(path, sub), off + 100)
    sub, off, _ = _blocks(path, "m", 2, level=2)[3]
    _flip(os.path.join(path, sub), off + 20)
    cmd = [mu.mpiexec(), "-n", "3", sys.executable, "-m", "lamina", "verify", path]
    res = mu.finish(mu.start(cmd), cmd, timeout=120)
    assert res.returncode != 0, res.describe()
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 3, res.describe()  # two blocks and the summary, once
    assert "step 1:" in lines[0] and "dataset 'a'" in lines[0]
    assert "step 2:" in lines[1] and "dataset 'm level 2'" in lines[1]
    assert lines[2].startswith(f"{path}: DAMAGED: 2 of 69 blocks damaged (steps 1-2)")


@pytest.mark.parametrize("name", ["format-v1", "format-v2", "format-v3", "format-v4-early"])
def test_files_of_every_format_version_verify(name, capsys):
    """Version 1-2 block records, version 3-4 sections, early version 4's sections without
    magnitudes: read and checked alike."""
    path = os.path.join(os.path.dirname(__file__), "data", f"{name}.lam")
    rc, out, err = run(["verify", path], capsys)
    assert rc == 0 and err == "", out
    assert out.strip().endswith("read and checked: intact")
    assert f"format {name[8]}, " in out


def test_stats_checks_each_blocks_statistics_against_its_values(tmp_path, capsys, monkeypatch):
    """--stats: statistics that are not those of the values (a writer's bug) are named;
    no false alarm over dtypes whose sums round (float32, NaN, long double, extremes)."""
    from lamina import stats

    path = str(tmp_path / "s.lam")
    rng = np.random.default_rng(3)
    with lamina.open(path, "w") as f:
        dts = ["f8", "f4", ">f4", "f2", "g", "i1", "u8", "i8", "?", "c8", "c16"]
        made = {dt: f.create_dataset(f"d{i}", (200, 100), dt) for i, dt in enumerate(dts)}
        z = f.create_dataset("z", (200, 100), "f8", compression="zstd")
        with f.step():
            for dt, d in made.items():
                t = np.dtype(dt)
                if t.kind in "fc":
                    a = (rng.standard_normal((200, 100)) * 1e4).astype(t)
                    a[rng.random(a.shape) < 0.05] = np.nan
                elif t.kind == "b":
                    a = rng.random((200, 100)) < 0.5
                else:
                    i = np.iinfo(t)
                    a = rng.integers(i.min, i.max, (200, 100), dtype=t, endpoint=True)
                d[:20] = a[:20]  # a small block (staged, summed in a batch) and a large one
                d[20:] = a[20:]
            z[...] = rng.random((200, 100))
    rc, out, _ = run(["verify", "--stats", path], capsys)
    assert rc == 0 and out.strip().endswith("intact"), out
    # a writer whose large blocks' maxima are off by one
    real = stats._finish

    def off(kind, mn, mx, total, count):
        s = real(kind, mn, mx, total, count)
        return s if kind != "f" else stats.Stats(s.min, s.max + 1, s.sum, s.count)

    monkeypatch.setattr(stats, "_finish", off)
    bad = str(tmp_path / "bad.lam")
    with lamina.open(bad, "w") as f:
        d = f.create_dataset("d", (200, 100), "f8")
        with f.step():
            d[...] = np.arange(20000.0).reshape(200, 100)
    monkeypatch.setattr(stats, "_finish", real)
    rc, out, _ = run(["verify", bad], capsys)
    assert rc == 0  # the bytes are what was written
    rc, out, _ = run(["verify", "--stats", bad], capsys)
    assert rc == 1
    assert "dataset 'd' block [0:200, 0:100]: its statistics disagree with its values (max " in out
    assert "20000.0, the values' 19999.0)" in out


def test_stats_bounds_a_float32_sum_by_its_values_not_their_number():
    """A float32 block's sum may differ from its values' by 2^-20 sum |x| (docs/format.md),
    taken four times over, with no factor of n: with one, a block of 2^20 ones passed a
    stored sum of 4,145,728.  Large blocks of float32 and float64 summed alike agree."""
    from lamina import check, stats

    ones = np.ones(1 << 20, np.float32)
    right, _ = stats.compute(ones, checksum=False)
    assert not check._stats_disagree(right, ones)
    wrong = stats.Stats(right.min, right.max, 3 * right.sum + 1e6, right.count)
    assert check._stats_disagree(wrong, ones) == ["sum 4145728.0, the values' 1048576.0"]
    rng = np.random.default_rng(4)
    for dt in ("f4", "f8"):
        a = (rng.standard_normal(1 << 20) * 1e4).astype(dt)
        got, _ = stats.compute(a, checksum=False)
        assert not check._stats_disagree(got, a), dt


def _section_at(path: str, name: str, step: int) -> int:
    """Where in lamina.meta the record of *step* keeps the table of *name*'s blocks."""
    with lamina.open(path) as f:
        cat = f.engine.stack()[-1].catalog
        sb = cat.steps[step]
        return sb._load.base + sb.sections[cat.datasets[name].id].offset


def test_a_damaged_table_of_blocks_is_named_and_the_rest_checked(good, tmp_path, capsys):
    """A step's table of one dataset's blocks (a section of its record, read when first used)
    that fails its checksum: the file opens, so verify reports it and checks the rest (it
    stopped with status 2 and no report, and under mpiexec one rank left the others waiting
    in the gather of findings)."""
    import sys

    import mpi_util as mu

    path = str(tmp_path / "sec.lam")
    shutil.copytree(good, path)
    _flip(os.path.join(path, "lamina.meta"), _section_at(path, "a", 1) + 3)
    rc, out, _ = run(["verify", path], capsys)
    lines = out.strip().splitlines()
    assert rc == 1 and len(lines) == 2, out
    assert lines[0].startswith(f"{path}: step 1: ") and "blocks of dataset 'a' fail" in lines[0]
    # a's two blocks of step 1 unread: 67 of the 69 blocks checked
    assert lines[1].startswith(
        f"{path}: DAMAGED: 1 dataset unreadable (step 1); format 4, 3 steps, 67 blocks"
    )
    cmd = [mu.mpiexec(), "-n", "2", sys.executable, "-m", "lamina", "verify", path]
    res = mu.finish(mu.start(cmd), cmd, timeout=120)
    assert res.returncode != 0 and res.stdout.strip().splitlines() == lines, res.describe()


def test_patches_that_do_not_decode_are_found(good, capsys, monkeypatch):
    """A multiresolution dataset's bands pass their checksums and headers, and its patches
    are decoded as a read would (zfp missing here, or a stream a writer got wrong):
    named by dataset, step and region (verify checked only the bands' headers)."""
    import sys

    monkeypatch.setitem(sys.modules, "zfpy", None)  # import zfpy: ImportError
    rc, out, _ = run(["verify", good], capsys)
    lines = out.strip().splitlines()
    assert rc == 1 and len(lines) == 4, out
    for k, ln in enumerate(lines[:3]):
        assert ln.startswith(
            f"{good}: step {k}: dataset 'm': the patches of [0:32, 0:32] do not decode"
        )
        assert "zfpy cannot be imported" in ln
    assert lines[3].startswith(
        f"{good}: DAMAGED: 1 dataset unreadable (steps 0-2); format 4, 3 steps, 69 blocks"
    )


def test_a_layout_this_lamina_cannot_read_is_found(tmp_path, capsys):
    """A multiresolution dataset whose layout record holds a field this lamina does not
    know (a newer writer's): `lamina ls` marks it unreadable, a read refuses it, and verify
    says so once (it said the file was intact)."""
    from lamina.catalog import model

    path = str(tmp_path / "new.lam")
    real = model.DatasetSpec.encode

    def newer(self, e):  # a writer that adds a field to the layout record
        if self.layout is not None and self.layout.get("layout") == "multires":
            self = model.DatasetSpec(
                self.path, self.shape, self.dtype, self.fill, self.codecs, self.id,
                {**self.layout, "wavelet": "cdf97"},
            )  # fmt: skip
        real(self, e)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model.DatasetSpec, "encode", newer)
        with lamina.open(path, "w") as f:
            m = f.create_dataset("m", (32, 32), "f8", layout=Multires(patch=(16, 16)))
            for k in range(2):
                with f.step():
                    m[...] = k
    rc, out, _ = run(["verify", path], capsys)
    lines = out.strip().splitlines()
    assert rc == 1 and len(lines) == 2, out
    assert "dataset 'm'" in lines[0] and "'wavelet', which this lamina does not know" in lines[0]
    assert lines[1].startswith(f"{path}: DAMAGED: 1 dataset unreadable (step 0); format 4, 2 steps")


def test_a_damaged_last_commit_entry_is_said(good, tmp_path, capsys):
    """The commit log's last entry whole in length but failing its checksum: an open takes it
    for a commit cut short (the record it names left out, silently, as a follower may see an
    entry being written), and verify said the file was intact with the close (or the last
    step) gone. It says so now; a tail shorter than an entry (a write that never ended, a
    crash in it) is no damage of anything committed."""
    from lamina.engines.native import format as fmt

    path = str(tmp_path / "entry.lam")
    shutil.copytree(good, path)
    log = os.path.join(path, "lamina.commit")
    size = os.path.getsize(log)
    with open(log, "ab") as fh:  # a commit cut short by a crash: part of an entry
        fh.write(b"\x07" * (fmt.ENTRY_SIZE - 5))
    rc, out, _ = run(["verify", path], capsys)
    assert rc == 0 and out.strip().endswith(": intact"), out
    os.truncate(log, size)
    _flip(log, size - 10)  # the last entry: the writer's close record
    rc, out, _ = run(["verify", path], capsys)
    lines = out.strip().splitlines()
    assert rc == 1 and len(lines) == 2, out
    n = (size - fmt.HEADER_SIZE) // fmt.ENTRY_SIZE - 1
    assert lines[0] == (
        f"{log}: commit entry {n} (bytes {size - fmt.ENTRY_SIZE}..{size}), the last, fails its "
        "checksum: a commit cut short by a crash, or a damaged entry of a committed record; the "
        "record it names is left out"
    )
    assert lines[1].startswith(
        f"{path}: DAMAGED: the commit log's last entry damaged; format 4, 3 steps"
    )
    rc, out, _ = run(["verify", path, "--json"], capsys)
    rep = json.loads(out)
    assert rc == 1 and not rep["intact"] and rep["commit_log"] == lines[0]


def test_a_file_whose_metadata_does_not_open_is_damaged_not_absent(good, tmp_path, capsys):
    """A record in the middle of lamina.meta damaged: the file does not open. That is a
    damaged file (status 1, said as such), not a path without a lamina file (status 2, as
    before, which a script could not tell from a typo in the path)."""
    from lamina.engines.native import format as fmt

    path = str(tmp_path / "mid.lam")
    shutil.copytree(good, path)
    with open(os.path.join(path, "lamina.commit"), "rb") as fh:
        entries, _, _ = fmt.parse_commits(
            fh.read(), os.path.getsize(os.path.join(path, "lamina.meta"))
        )
    _flip(os.path.join(path, "lamina.meta"), entries[1].offset + entries[1].length - 5)
    rc, out, err = run(["verify", path], capsys)
    assert rc == 1 and err == "", err
    assert out.startswith(f"{path}: DAMAGED: the file does not open: ") and "record 1" in out, out
    rc, out, _ = run(["verify", path, "--json"], capsys)
    rep = json.loads(out)
    assert (
        rc == 1 and rep["intact"] is False and rep["opens"] is False and "record 1" in rep["error"]
    )
    rc, _, err = run(["verify", str(tmp_path / "absent.lam")], capsys)
    assert rc == 2 and "no such lamina file" in err
    shutil.rmtree(path)
    shutil.copytree(good, path)
    _flip(os.path.join(path, "lamina.meta"), 0)  # its magic: the open says "not a lamina file"
    rc, out, _ = run(["verify", path], capsys)
    assert (
        rc == 1 and out.startswith(f"{path}: DAMAGED: the file does not open: ") and "magic" in out
    )


def test_an_entry_being_written_by_a_running_writer_is_not_said(good, tmp_path):
    """A last entry that fails its checksum is looked at again after a pause: one a running
    writer was writing (here: made whole meanwhile) is no damage."""
    import threading

    from lamina.engines.native import format as fmt

    path = str(tmp_path / "live.lam")
    shutil.copytree(good, path)
    log = os.path.join(path, "lamina.commit")
    size = os.path.getsize(log)
    with open(log, "ab") as fh:  # an entry whole in length, not yet right
        fh.write(b"\x07" * fmt.ENTRY_SIZE)
    with lamina.open(path) as f:
        eng = f.engine.stack()[-1]
        assert "commit entry" in eng.unfinished_commit(pause=0.0)
        fixed = threading.Timer(0.05, os.truncate, (log, size))  # (as if the writer finished)
        fixed.start()
        try:
            assert eng.unfinished_commit(pause=1.0) is None
        finally:
            fixed.join()


def test_payloads_read_into_a_buffer_given_keep_each_run_apart(tmp_path):
    """``payloads(..., into=buf)``: blocks of runs apart in the subfile (another dataset's
    blocks between them) each in a part of *buf* of their own, the same bytes as read into
    fresh memory (the runs were all read at the start of *buf*, each over the last: the
    checksums passed as each run was read, and the values were the last run's)."""
    path = str(tmp_path / "runs.lam")
    rng = np.random.default_rng(3)
    with lamina.open(path, "w") as f:
        a = f.create_dataset("a", (4, 1 << 14), "f8")
        b = f.create_dataset("b", (4, 1 << 14), "f8")
        with f.step():
            for k in range(4):  # a0 b0 a1 b1 ... in the subfile: a's blocks in four runs
                a[k : k + 1] = rng.random((1, 1 << 14))
                b[k : k + 1] = rng.random((1, 1 << 14))
    with lamina.open(path) as f:
        eng = f.engine.stack()[-1]
        spec = eng.catalog.datasets["a"]
        t = eng.catalog.table_of(spec, 0)
        rows = np.arange(len(t))
        fresh = [bytes(p) for p in eng.payloads(0, [(spec, t, rows)])[0]]
        buf = np.empty(int(t.length.sum()) + 4096 * (len(t) + 1), np.uint8)
        into = [bytes(p) for p in eng.payloads(0, [(spec, t, rows)], into=buf)[0]]
    assert len(fresh) == 4 and into == fresh
