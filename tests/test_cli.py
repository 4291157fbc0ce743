"""The ``lamina`` command, run in-process (``lamina.cli.main``) and once as a real process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types

import h5py
import numpy as np
import pytest

import lamina
from lamina import cli, hdf5
from lamina.errors import SelectionError
from lamina.selection import parse_text as parse_select
from lamina.text import fmt_bytes

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


@pytest.fixture
def run_file(tmp_path) -> str:
    """Two steps: T (float32, 32 x 16 = 2 KiB per step) in two blocks, then partially; a bool mask; a complex z."""
    path = str(tmp_path / "run.lam")
    with lamina.open(path, "w") as f:
        f.attrs["title"] = "cli test"
        f.attrs["grid"] = np.arange(3)
        t = f.create_dataset("fields/T", shape=(32, 16), dtype="f4", fill=-1)
        t.attrs["units"] = "K"
        m = f.create_dataset("mask", shape=(4,), dtype="?", fill=False)
        z = f.create_dataset("z", shape=(3,), dtype="c16")
        f.create_dataset("never", shape=(2,), dtype="i4", fill=7)
        f.create_group("empty")
        with f.step():
            t[0:16, :] = np.arange(256, dtype=np.float32).reshape(16, 16)
            t[16:32, :] = 2.5
            m[1:3] = True
            z[...] = [1 + 2j, np.nan, -1j]
        with f.step():
            t[0:8, 0:8] = np.nan
    return path


def run(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# --------------------------------------------------------------------------
# ls


def test_ls_tree(run_file, capsys):
    rc, out, err = run(["ls", run_file], capsys)
    assert rc == 0 and err == ""
    assert "2 steps" in out and "4 datasets" in out
    assert "fields/" in out and "empty/" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("T "))
    assert "float32 (32, 16)" in line and "steps 0-1 (2 of 2)" in line and "3 blocks" in line
    assert "2.2 KiB" in line and "compression none" in line and "fill -1.0" in line
    assert "@units = 'K'" in out and "@title = 'cli test'" in out and "@grid = [0, 1, 2]" in out
    assert "never written" in next(ln for ln in out.splitlines() if ln.strip().startswith("never "))
    assert "mask  bool (4,)  steps 0 (1 of 2)" in out


def test_ls_subtree_and_dataset(run_file, capsys):
    rc, out, _ = run(["ls", run_file, "fields"], capsys)
    assert rc == 0 and "/fields/" in out and "T  float32" in out and "mask" not in out
    rc, out, _ = run(["ls", run_file, "/mask"], capsys)
    assert rc == 0 and "/mask  bool (4,)" in out and "fields" not in out


def test_ls_json(run_file, capsys):
    rc, out, _ = run(["ls", run_file, "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert (
        doc["steps"] == 2
        and doc["closed"] is True
        and doc["datasets"] == 4
        and len(doc["step_times"]) == 2
    )
    nodes = {n["path"]: n for n in doc["nodes"]}
    assert nodes["/"]["attrs"] == {"grid": [0, 1, 2], "title": "cli test"}
    t = nodes["/fields/T"]
    assert t["type"] == "dataset" and t["shape"] == [32, 16] and t["dtype"] == "float32"
    assert t["steps_written"] == [0, 1] and t["blocks"] == 3 and t["nbytes"] == 2048 + 256
    assert t["fill"] == -1.0 and t["compression"] == [] and t["attrs"] == {"units": "K"}
    assert nodes["/never"]["steps_written"] == [] and nodes["/empty"]["type"] == "group"
    assert nodes["/z"]["fill"] == [0.0, 0.0]  # complex as [re, im]


# --------------------------------------------------------------------------
# info


def test_info_human(run_file, capsys):
    rc, out, err = run(["info", run_file, "fields/T"], capsys)
    assert rc == 0 and err == ""
    assert out.startswith("/fields/T: float32 (32, 16), fill -1.0, compression none")
    assert "step 0" in out and "2 blocks, 512 of 512 elements (100.0%), 2 KiB stored" in out
    assert "step 1" in out and "1 block, 64 of 512 elements (12.5%)" in out
    assert "[0:16, 0:16]" in out and "[16:32, 0:16]" in out and "[0:8, 0:8]" in out
    row = next(ln for ln in out.splitlines() if "[0:16, 0:16]" in ln).split()
    # box (2 tokens), min, max, sum, count, stored (2), raw (2), subfile, offset, codec, rank
    assert row[2:6] == ["0", "255", "32640", "256"] and row[10] == "data.0.0" and row[12] == "raw"
    nan_row = next(ln for ln in out.splitlines() if "[0:8, 0:8]" in ln).split()
    assert nan_row[2:6] == ["nan", "nan", "0", "0"]


def test_info_step_and_json(run_file, capsys):
    rc, out, _ = run(["info", run_file, "/mask", "--step", "-1"], capsys)
    assert (
        rc == 0
        and "step 1" in out
        and "no blocks (reads as the fill value False)" in out
        and "step 0" not in out
    )
    rc, out, _ = run(["info", run_file, "fields/T", "--json"], capsys)
    doc = json.loads(out)
    with lamina.open(run_file) as f:
        ds = f["fields/T"]
        for k, step in enumerate(doc["steps"]):
            assert step["step"] == k and step["time"] == f.engine.catalog.step_times[k]
            blocks = ds.blocks(k)
            assert len(step["blocks"]) == len(blocks)
            for bj, b in zip(step["blocks"], blocks, strict=True):
                assert bj["box"] == {"start": list(b.box.start), "stop": list(b.box.stop)}
                assert (
                    bj["nbytes"],
                    bj["raw_nbytes"],
                    bj["subfile"],
                    bj["offset"],
                    bj["codec"],
                    bj["rank"],
                ) == (b.nbytes, b.raw_nbytes, b.subfile, b.offset, b.codec, b.rank)
                assert bj["stats"]["count"] == b.stats.count
    assert doc["steps"][1]["blocks"][0]["stats"]["min"] == "nan"  # strict JSON: no NaN literals
    rc, out, _ = run(["info", run_file, "z", "--json", "--step", "0"], capsys)
    assert json.loads(out)["steps"][0]["blocks"][0]["stats"]["count"] == 2


# --------------------------------------------------------------------------
# dump and --select


@pytest.mark.parametrize(
    "text, key",
    [
        ("0:4,:,7", (slice(0, 4), slice(None), 7)),
        ("...", (Ellipsis,)),
        ("", ()),
        ("[1, -2]", (1, -2)),
        ("::2, 1:", (slice(None, None, 2), slice(1, None))),
        (" -3 : -1 : 1 ,...", (slice(-3, -1, 1), Ellipsis)),
        ("5,", (5,)),
        ("+2", (2,)),
        (":", (slice(None),)),
    ],
)
def test_parse_select(text, key):
    assert parse_select(text) == key


@pytest.mark.parametrize(
    "text",
    [
        "a",
        "1:2:3:4",
        "...,...",
        "1:2:0",
        "::-1",
        "1,,2",
        ",",
        "1e3",
        "1.5",
        "__import__('os')",
        "0x10",
        "[1",
        "1;2",
        "(1,2)",
        "9" * 40,
    ],
)
def test_parse_select_rejects(text):
    with pytest.raises(SelectionError):
        parse_select(text)


def test_select_matches_numpy(run_file, capsys):
    a = np.full((32, 16), 2.5, dtype=np.float32)
    a[:16] = np.arange(256).reshape(16, 16)
    for text, key in [
        ("2:5,7", (slice(2, 5), 7)),
        ("...,3", (Ellipsis, 3)),
        ("1:9:3,::5", (slice(1, 9, 3), slice(None, None, 5))),
        ("-1", (-1,)),
        ("4,5", (4, 5)),
        ("-1,0", (-1, 0)),  # a value starting with '-' that is not a number: argparse refused it
        ("-3:,-2", (slice(-3, None), -2)),
    ]:
        rc, out, _ = run(
            ["dump", run_file, "fields/T", "--select", text, "--step", "0", "--json"], capsys
        )
        assert rc == 0, text
        doc = json.loads(out)
        expect = a[key]
        assert doc["shape"] == list(np.shape(expect)) and doc["dtype"] == "float32"
        np.testing.assert_array_equal(np.array(doc["data"], dtype=np.float32), expect)


def test_dump_human(run_file, capsys):
    rc, out, err = run(["dump", run_file, "fields/T", "-s", "0:2,0:4", "--step", "0"], capsys)
    assert rc == 0 and err == ""
    assert out.splitlines()[0] == "/fields/T[0:2, 0:4] at step 0 of 2: float32 (2, 4)"
    np.testing.assert_array_equal(
        np.array(out.replace("[", " ").replace("]", " ").split()[-8:], float),
        [0, 1, 2, 3, 16, 17, 18, 19],
    )
    rc, out, _ = run(["dump", run_file, "fields/T", "-s", "0,0"], capsys)  # default: last step
    assert rc == 0 and "at step 1 of 2" in out and out.splitlines()[1] == "nan"
    rc, out, _ = run(["dump", run_file, "mask", "--step", "0"], capsys)
    assert out.splitlines()[1] == "[False  True  True False]"
    rc, out, _ = run(["dump", run_file, "mask"], capsys)  # not written in step 1: the fill value
    assert out.splitlines()[1] == "[False False False False]"
    rc, out, _ = run(["dump", run_file, "never"], capsys)
    assert out.splitlines()[1] == "[7 7]"


def test_dump_shows_every_value_as_stored(tmp_path, capsys):
    """numpy's default print rounds to 8 digits: [1.0000000001, 0.30000000000000004] showed as
    [1.  0.3], though a 0-d selection and --json gave the values."""
    path = tmp_path / "digits.lam"
    values = [1.0000000001, 0.30000000000000004, 2.5]
    with lamina.open(path, "w") as f:
        f.create_dataset("p", (3,), "f8")
        with f.step():
            f["p"][...] = values
    rc, out, _ = run(["dump", path, "p"], capsys)
    assert rc == 0 and [float(v) for v in out.splitlines()[1].strip("[]").split()] == values


def test_dump_of_more_than_it_prints_is_refused_before_a_read(tmp_path, capsys):
    """A dataset of 10^12 float64 (a few elements written) was read whole: a traceback of
    numpy's MemoryError (7.3 TiB); a part of it dumps."""
    path = tmp_path / "huge.lam"
    with lamina.open(path, "w") as f:
        d = f.create_dataset("h", (10**6, 10**6), "f8", fill=-1.0)
        with f.step():
            d[0:2, 0:2] = 1.0
    for extra in ([], ["--json"], ["-s", "0:1000"]):
        rc, _, err = run(["dump", path, "h", *extra], capsys)
        line = one_error_line(rc, err)
        assert "more than dump prints (1 GiB): select a part with --select" in line, line
    rc, out, _ = run(["dump", path, "h", "-s", "0:3,0:3"], capsys)
    assert rc == 0 and out.splitlines()[1] == "[[ 1.  1. -1.]"


def test_query_selects_a_name_holding_a_comma_in_backticks(tmp_path, capsys):
    """--select split every comma: a dataset named 'a,b' could not be shown."""
    path = tmp_path / "c.lam"
    with lamina.open(path, "w") as f:
        for name in ("a,b", "p"):
            f.create_dataset(name, (3,), "i4")
        with f.step():
            f["a,b"][...] = [7, 8, 9]
            f["p"][...] = [1, 2, 3]
    rc, out, _ = run(["query", path, "-w", "p > 1", "--select", "`a,b`, p"], capsys)
    assert rc == 0 and re.search(r"index +a,b +p\n", out), out
    assert re.search(r"\(2\) +9 +3\n", out), out
    rc, _, err = run(["query", path, "-w", "p > 1", "--select", "`a,b"], capsys)
    assert "--select: a backtick is not closed in '`a,b'" in one_error_line(rc, err)


def test_query_selects_a_name_holding_a_backtick_as_the_condition_writes_it(tmp_path, capsys):
    """--select dropped every backtick: `a``b` (as the condition writes 'a`b') selected the
    dataset 'ab' and printed its values as the answer, with exit status 0."""
    path = tmp_path / "b.lam"
    with lamina.open(path, "w") as f:
        for name in ("a`b", "ab", " s "):
            f.create_dataset(name, (4,), "f8")
        with f.step():
            f["a`b"][...] = [1.0, 2.0, 3.0, 4.0]
            f["ab"][...] = [-1.0, -2.0, -3.0, -4.0]
            f[" s "][...] = [5.0, 6.0, 7.0, 8.0]
    rc, out, _ = run(
        ["query", path, "-w", "`a``b` > 2", "--select", "`a``b`,  ` s `  ,\t ab\t", "--json"],
        capsys,
    )
    assert rc == 0, out
    values = json.loads(out)["exact_answer"]["values"]
    assert values == {"a`b": [3.0, 4.0], " s ": [7.0, 8.0], "ab": [-3.0, -4.0]}, values


def test_names_with_control_characters_stay_escaped_in_every_command(tmp_path, capsys):
    """A newline or an escape sequence in a name (or in the file's path) is shown escaped, as
    ls and info show it: in the error naming a group's datasets (which listed the whole
    file's), in query's table head, in verify's lines and in plot's default file name."""
    from lamina.cli.plot import _default_name

    path = tmp_path / "v\x1b[31m.lam"
    nl, esc = "g/n\nl", "g/x\x1b[31mRED"
    with lamina.open(path, "w") as f:
        for name in (nl, esc, "p"):
            f.create_dataset(name, (2,), "i4")
        with f.step():
            for name in (nl, esc, "p"):
                f[name][...] = [1, 2]
    for cmd in ("dump", "info"):
        rc, _, err = run([cmd, path, "g"], capsys)
        line = one_error_line(rc, err)
        assert line.endswith("datasets in it: /g/n\\nl, /g/x\\x1b[31mRED"), line
    rc, out, _ = run(["query", path, "-w", "`g/n\nl` > 0", "--select", f"{nl},{esc}"], capsys)
    assert rc == 0 and re.search(r"index +g/n\\nl +g/x\\x1b\[31mRED\n", out), out
    assert "\x1b" not in out and "n\nl" not in out
    rc, out, _ = run(["verify", path], capsys)
    assert rc == 0 and out.startswith(str(tmp_path).replace("\\", "\\\\") + "/v\\x1b[31m.lam: ")
    assert "\x1b" not in out
    args = types.SimpleNamespace(dataset=nl, stats=False, slice=[], step=-1)
    assert _default_name(args) == "g_n_l_steplast.png"


def test_dump_json_special_values(run_file, capsys):
    rc, out, _ = run(["dump", run_file, "z", "--json", "--step", "0"], capsys)
    doc = json.loads(out)
    assert doc["dtype"] == "complex128" and doc["data"] == [[1.0, 2.0], ["nan", 0.0], [0.0, -1.0]]
    rc, out, _ = run(["dump", run_file, "mask", "--json", "--step", "0"], capsys)
    assert json.loads(out)["data"] == [False, True, True, False]


# --------------------------------------------------------------------------
# errors: one line on stderr, status 2


def test_missing_file(tmp_path, capsys):
    rc, out, err = run(["ls", tmp_path / "nope.lam"], capsys)
    line = one_error_line(rc, err)
    assert line.startswith("lamina ls: error:") and "nope.lam" in line and out == ""


def test_unknown_dataset_suggests(run_file, capsys):
    rc, _, err = run(["info", run_file, "fields/t"], capsys)
    line = one_error_line(rc, err)
    assert "no group or dataset '/fields/t'" in line and "Did you mean 'fields/T'" in line
    rc, _, err = run(["dump", run_file, "fields"], capsys)
    assert "is a group, not a dataset" in one_error_line(rc, err)
    rc, _, err = run(["ls", run_file, "nothing/here"], capsys)
    one_error_line(rc, err)


def test_bad_select_and_step(run_file, capsys):
    rc, _, err = run(["dump", run_file, "fields/T", "--select", "0:4:0"], capsys)
    assert "slice step must be a positive integer" in one_error_line(rc, err)
    rc, _, err = run(["dump", run_file, "fields/T", "--select", "os.system('x')"], capsys)
    assert "bad selection" in one_error_line(rc, err)
    rc, _, err = run(["dump", run_file, "fields/T", "--select", "99"], capsys)
    assert "out of bounds" in one_error_line(rc, err)
    rc, _, err = run(["dump", run_file, "fields/T", "--select", "0,0,0"], capsys)
    assert "too many indices" in one_error_line(rc, err)
    rc, _, err = run(["info", run_file, "fields/T", "--step", "5"], capsys)
    assert "step 5 does not exist" in one_error_line(rc, err)


def test_not_a_lamina_file(tmp_path, run_file, capsys):
    rc, _, err = run(["ls", tmp_path], capsys)
    assert "not a lamina file" in one_error_line(rc, err)
    h5 = tmp_path / "x.h5"
    assert run(["convert", run_file, h5, "-q"], capsys)[0] == 0
    rc, _, err = run(["ls", h5], capsys)
    assert "is an HDF5 file" in one_error_line(rc, err) and "lamina convert" in err
    # lamina.open says the same; after a user block too, and not for other files
    with pytest.raises(lamina.NotALaminaFileError, match=r"HDF5 file, .*'lamina convert .*x\.h5"):
        lamina.open(h5)
    with h5py.File(tmp_path / "ub.h5", "w", userblock_size=1024) as h:
        h["x"] = 1
    with pytest.raises(lamina.NotALaminaFileError, match="is an HDF5 file"):
        lamina.open(tmp_path / "ub.h5")
    (tmp_path / "junk.h5").write_bytes(b"\x89HDF\r\n" + bytes(600))  # cut short: not HDF5
    with pytest.raises(lamina.NotALaminaFileError, match=r"not a lamina file \(no lamina.commit"):
        lamina.open(tmp_path / "junk.h5")


def test_usage(capsys):
    rc, out, _ = run(["--version"], capsys)
    assert rc == 0 and out.strip() == f"lamina {lamina.__version__}"
    rc, _, err = run([], capsys)
    assert rc == 2 and "usage: lamina" in err
    rc, _, err = run(["frobnicate"], capsys)
    assert rc == 2 and "invalid choice" in err
    rc, out, _ = run(["dump", "--help"], capsys)
    assert rc == 0 and "--select" in out


# --------------------------------------------------------------------------
# convert


def test_convert_roundtrip(run_file, tmp_path, capsys):
    h5 = tmp_path / "run.h5"
    back = tmp_path / "back.lam"
    rc, out, err = run(["convert", run_file, h5], capsys)
    assert rc == 0 and err == ""  # no progress bar: stderr is not a terminal
    assert "lamina to HDF5" in out and "4 datasets" in out and "2 steps" in out
    rc, out, err = run(["convert", h5, back, "--quiet"], capsys)
    assert rc == 0 and out == "" and err == ""
    with lamina.open(run_file) as a, lamina.open(back) as b:
        assert [p for p, _ in a.walk()] == [p for p, _ in b.walk()]
        for k in range(2):
            for name in ("fields/T", "mask", "z", "never"):
                assert a[name].coverage(k) == b[name].coverage(k)
                np.testing.assert_array_equal(a.at(k)[name][...], b.at(k)[name][...])
    rc, _, err = run(["convert", run_file, h5], capsys)
    assert "--force" in one_error_line(rc, err)
    assert run(["convert", run_file, h5, "--force", "--gzip", "6", "-q"], capsys)[0] == 0


def test_convert_plain_hdf5_warns(tmp_path, capsys):
    import h5py

    src = tmp_path / "p.h5"
    with h5py.File(src, "w") as h:
        h["x"] = np.arange(5)
        h["s"] = "text"
    rc, out, err = run(["convert", src, tmp_path / "p.lam", "-q"], capsys)
    assert rc == 0 and out == "" and "warning: skipped dataset /s" in err


# --------------------------------------------------------------------------
# demo and bench: arguments pass through unparsed


@pytest.mark.parametrize("name", ["demo", "bench"])
def test_passthrough(name, monkeypatch, capsys):
    seen = []
    fake = types.ModuleType(f"lamina.{name}")
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, f"lamina.{name}", fake)
    rc = cli.main([name, "--help", "-n", "4", "--json", "x y"])
    assert rc == 3 and seen == [["--help", "-n", "4", "--json", "x y"]]


def test_passthrough_missing(monkeypatch, capsys):
    fake = types.ModuleType("lamina.bench")  # a package without main
    monkeypatch.setitem(sys.modules, "lamina.bench", fake)
    rc, _, err = run(["bench", "write"], capsys)
    assert "not available" in one_error_line(rc, err)


# --------------------------------------------------------------------------
# as a real process


def _command() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "lamina")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "lamina.cli"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_subprocess(run_file, tmp_path):
    r = subprocess.run(
        [*_command(), "ls", run_file], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert r.returncode == 0, r.stderr
    assert "T  float32 (32, 16)" in r.stdout
    r = subprocess.run(
        [*_command(), "info", run_file, "fields/Tx"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "Did you mean" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_info_of_a_file_shows_its_io_decisions(tmp_path, run_file, capsys):
    """`lamina info FILE` without a dataset: the file, and every decision io='auto' made with
    its predictions and what was measured (`lamina info` required a dataset and showed none)."""
    path = str(tmp_path / "auto.lam")
    with lamina.open(path, "w", io="auto") as f:
        x = f.create_dataset("x", (1 << 12,), "f8")
        for k in range(5):
            with f.step():
                x[...] = k
    rc, out, err = run(["info", path], capsys)
    assert rc == 0 and err == ""
    assert out.startswith(f"{path}: native (format 4), 5 steps (closed), 1 dataset, ")
    assert "io='auto' wrote 5 steps: " in out
    assert "t_io measured" in out and "epoch measured" in out
    rows = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(5))
    assert all(r[1] in ("async", "sync") for r in rows)
    rc, out, _ = run(["info", path, "--step", "-1"], capsys)
    rows = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert rc == 0 and [r[0] for r in rows] == ["4"]
    rc, out, _ = run(["info", path, "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["steps"] == 5 and doc["datasets"] == 1 and doc["io_decisions_all"]
    got = doc["io_decisions"]
    assert [d["step"] for d in got] == list(range(5))
    assert all(d["t_io_measured"] > 0 and d["mode"] in ("async", "sync") for d in got)
    # a file written without io='auto' has none, and says so
    rc, out, _ = run(["info", run_file], capsys)
    assert rc == 0 and "2 steps" in out and "no io='auto' decisions" in out
    rc, out, _ = run(["info", run_file, "--json"], capsys)
    assert json.loads(out)["io_decisions"] is None
    # the dataset form is as it was
    rc, out, _ = run(["info", run_file, "fields/T", "--step", "0"], capsys)
    assert rc == 0 and "io='auto'" not in out and "step 0" in out
    r = subprocess.run(
        [*_command(), "info", path], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert r.returncode == 0 and "io='auto' wrote 5 steps" in r.stdout, r.stderr


def test_broken_pipe_is_quiet(tmp_path):
    path = str(tmp_path / "big.lam")
    with lamina.open(path, "w") as f:
        d = f.create_dataset("d", shape=(4000, 8), dtype="f8")  # > a 64 KiB pipe buffer
        with f.step():
            d[...] = 1.0
    p = subprocess.Popen(
        [*_command(), "dump", path, "d"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
    )
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    p.stderr.close()
    assert "Traceback" not in err and p.returncode in (0, 1)


# --------------------------------------------------------------------------
# errors from the environment and from hostile names: one line, never a traceback


@pytest.mark.parametrize(
    "argv, env, text",
    [
        (["info", "{f}", "../../etc/passwd"], {}, "no group or dataset '../../etc/passwd'"),
        (["dump", "{f}", "/a/../b"], {}, "invalid path component"),
    ],
)
def test_errors_are_one_line(run_file, capsys, monkeypatch, argv, env, text):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, _, err = run([a.format(f=run_file) for a in argv], capsys)
    assert text in one_error_line(rc, err)


def test_commands_read_files_whatever_the_transport_says(run_file, capsys, monkeypatch):
    """With LAMINA_TRANSPORT=memory exported (for an in situ run), lamina ls still reads the file."""
    for transport in ("memory", "both", "bogus"):
        monkeypatch.setenv("LAMINA_TRANSPORT", transport)
        rc, out, err = run(["ls", run_file], capsys)
        assert rc == 0 and "fields/" in out and not err, (transport, err)


@pytest.mark.parametrize(
    "env",
    [
        {"LAMINA_TRANSPORT": "memory"},
        {"LAMINA_TRANSPORT": "both"},
        {"LAMINA_ENGINE": "memory"},
        {"LAMINA_ENGINE": "bogus"},
        {"LAMINA_IO": "bogus"},
        {"LAMINA_IO": "async"},
        {"LAMINA_ENGINE": "memory", "LAMINA_TRANSPORT": "memory", "LAMINA_IO": "auto"},
    ],
)
def test_commands_on_files_whatever_the_environment_says(run_file, tmp_path, capsys, env):
    """The variables set for a job's programs (the engine, the transport, the I/O mode) do
    not reach the commands that inspect and convert files: under LAMINA_TRANSPORT=memory
    convert failed, under LAMINA_ENGINE=memory every command did (a file in this process's
    memory), under LAMINA_IO=bogus ls did."""
    h5, back = tmp_path / "run.h5", tmp_path / "back.lam"
    commands = [
        ["ls", run_file],
        ["info", run_file],
        ["info", run_file, "fields/T"],
        ["dump", run_file, "mask"],
        ["query", run_file, "--where", "`fields/T` > 1"],
        ["convert", run_file, h5, "-q"],
        ["convert", h5, back, "-q"],
        ["ls", back],
    ]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        for argv in commands:
            rc, out, err = run(argv, capsys)
            assert rc == 0 and not err, (argv, err)
        got = hdf5.convert(run_file, tmp_path / "py.h5", overwrite=True, progress=False)
        hdf5.convert(tmp_path / "py.h5", tmp_path / "py.lam", overwrite=True, progress=False)
    assert got.datasets == 4 and os.path.isdir(back) and os.path.isdir(tmp_path / "py.lam")
    with lamina.open(back) as f:
        assert f.steps == 2


def test_json_of_long_double_values_and_underscore_attributes(tmp_path, capsys):
    """--json holds long double values (as float64) and attributes named with '_' (netCDF's
    _FillValue is data, not one of the command's own keys); an expression-derived dataset,
    and one kept as statistics at a step before its declaration, cover their anchor's
    elements in `info`."""
    path = tmp_path / "odd.lam"
    with lamina.open(path, "w") as f:
        f.attrs["_FillValue"] = -999.0
        f.attrs["ld"] = np.longdouble(1.5)
        g = f.create_dataset("g", (2,), dtype=np.longdouble)
        v = f.create_dataset("v", (4,))
        with f.step():
            g[...] = 1
            v[...] = np.arange(4.0)
        f.derive("twice", "`v` * 2", strategy="expression")
        f.derive("thrice", "`v` * 3", strategy="stats")  # stats kept from the next step on
    for argv in (
        ["ls", path, "--json"],
        ["info", path, "g", "--json"],
        ["dump", path, "g", "--json"],
    ):
        rc, out, err = run(argv, capsys)
        assert rc == 0, err
        doc = json.loads(out)
    rc, out, _ = run(["ls", path, "--json"], capsys)
    text = json.dumps(json.loads(out))
    assert '"_FillValue": -999.0' in text and '"ld": 1.5' in text
    rc, out, _ = run(["info", path, "twice"], capsys)
    assert "computed when read (expression), 4 of 4 elements" in out, out
    rc, out, _ = run(["info", path, "thrice"], capsys)  # a step before its declaration
    assert "computed when read (strategy 'stats', nothing stored at this step), 4 of 4" in out, out
    rc, out, _ = run(["info", path, "twice", "--json"], capsys)
    assert json.loads(out)["steps"][0]["covered"] == 4
    del doc


def test_values_starting_with_a_dash(run_file, capsys):
    """A selection, region or condition starting with '-' is the option's value (argparse
    alone said "expected one argument" unless it looked like a number); an option after
    --select is still an option (the value is missing)."""
    rc, out, _ = run(
        ["dump", run_file, "fields/T", "-s", "-2:,-1", "--step", "0", "--json"], capsys
    )
    assert rc == 0 and json.loads(out)["data"] == [2.5, 2.5]
    rc, out, _ = run(
        ["query", run_file, "--where", "-`fields/T` > -1", "-r", "-2:,:", "--json"], capsys
    )
    assert rc == 0 and json.loads(out)["region"] == {"start": [30, 0], "stop": [32, 16]}
    rc, _, err = run(["dump", run_file, "fields/T", "--select", "--json"], capsys)
    assert rc == 2 and "expected one argument" in err


def test_an_expression_error_shows_the_caret_under_its_position(run_file, capsys):
    """The one-line form of errors put the caret on the line of the message, after it, where
    it pointed at nothing: the expression and the caret keep their own lines."""
    rc, _, err = run(["query", run_file, "--where", "`fields/T` >"], capsys)
    lines = err.rstrip("\n").split("\n")
    assert rc == 2 and len(lines) == 3, err
    assert lines[0].startswith("lamina query: error: unexpected end of expression")
    assert lines[0].endswith("(at position 12)")
    assert lines[1] == "    `fields/T` >" and lines[2] == " " * (4 + 12) + "^"
    rc, _, err = run(["query", run_file, "--where", "magnitude() > 1"], capsys)
    assert rc == 2 and "takes at least 1 argument, got 0" in err


def test_info_of_a_multiresolution_dataset_written_in_part(tmp_path, capsys):
    """Per level, `raw` is the bytes of the patches written, as the step's line says, so that
    raw / stored is the ratio shown (raw was the whole level: 256 KiB beside a ratio of the
    part written)."""
    path = tmp_path / "mr.lam"
    x = np.add.outer(np.linspace(0, 1, 64), np.linspace(0, 2, 64)).astype("f4")
    with lamina.open(path, "w") as f:
        T = f.create_dataset(
            "T", x.shape, x.dtype, layout=lamina.Multires(patch=16, tolerance=1e-3)
        )
        with f.step():
            T[0:16] = x[0:16]  # a quarter of the patches
    rc, out, _ = run(["info", path, "T", "--json"], capsys)
    doc = json.loads(out)
    levels = doc["layout"]["levels"]
    assert rc == 0 and levels[0]["raw"] == 16 * 64 * 4 == doc["steps"][0]["raw_nbytes"]
    for lv in levels:
        assert lv["raw"] == lv["blocks"] * 4 * (16 >> lv["level"]) ** 2
        assert lv["ratio"] == pytest.approx(lv["raw"] / lv["stored"])


def test_info_of_multiresolution_levels_says_what_a_read_of_each_takes(tmp_path, capsys):
    """A level's `stored` is the bytes a read of it takes (its band and every coarser one,
    as `stored_bytes(level=k)`), its `band` its own: patches kept lossless hold everything
    in the coarsest band, and band 0 alone (128 B) made level 0 look 28:1.  The step's line
    counts every band (it said band 0's bytes), as `lamina ls` does."""
    path = tmp_path / "mr.lam"
    x = (1000 + np.sin(np.arange(900).reshape(30, 30) * 0.05)).astype("f4")
    with lamina.open(path, "w") as f:
        d = f.create_dataset("d", x.shape, x.dtype, layout=lamina.Multires(patch=8, tolerance=1e-6))
        with f.step():
            d[...] = x
    with lamina.open(path) as f:
        want = [f["d"].stored_bytes(level=k) for k in range(len(f["d"].levels))]
    rc, out, _ = run(["info", path, "d", "--json"], capsys)
    levels = json.loads(out)["layout"]["levels"]
    assert rc == 0 and [lv["stored"] for lv in levels] == want
    assert sum(lv["band"] for lv in levels) == want[0] and levels[0]["ratio"] < 1.0
    rc, out, _ = run(["info", path, "d"], capsys)
    assert rc == 0 and f"{fmt_bytes(want[0])} stored in all bands" in out, out
    rc, out, _ = run(["info", path, "d", "--json"], capsys)
    assert json.loads(out)["steps"][0]["nbytes"] == want[0]  # as the text (it said band 0)


def _steps_of_u(path: str, steps: int) -> None:
    """A native file of *steps* steps of a dataset 'u' of 8 float64 values, k at step k."""
    with lamina.open(path, "w", engine="native") as f:
        d = f.create_dataset("u", shape=(8,), dtype="f8")
        for k in range(steps):
            with f.step():
                d[...] = np.full(8, float(k))


@pytest.mark.parametrize("cut", ["metadata", "metadata-mid-frame", "subfile"])
def test_ls_of_a_copy_cut_short_says_so_not_open_for_writing(tmp_path, capsys, cut):
    """A copy of a file taken while it was written (lamina.meta copied before
    lamina.commit, between two frames or inside one), or with a subfile cut short, opens
    the steps before the records left out (docs/format.md, Files cut short): ``lamina ls``
    says how many records were left out; the writer's close among them, it said the file
    was "open for writing", which no writer has it."""
    import warnings

    from lamina.engines.native import format as fmt

    path = str(tmp_path / "copy.lam")
    _steps_of_u(path, 5)
    meta = os.path.join(path, fmt.META_NAME)
    commit = open(os.path.join(path, fmt.COMMIT_NAME), "rb").read()
    entries, _, _ = fmt.parse_commits(commit, os.path.getsize(meta))
    assert len(entries) == 6  # five steps and the close
    if cut == "metadata":  # copied after step 2's frame
        os.truncate(meta, entries[2].offset + entries[2].length)
    elif cut == "metadata-mid-frame":
        os.truncate(meta, entries[3].offset + entries[3].length // 2)
    else:  # the subfile copied before step 3's blocks were in it
        with lamina.open(path) as f:
            b = f["u"].blocks(3)[0]
        os.truncate(os.path.join(path, b.subfile), b.offset + 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lamina.LaminaWarning)  # (said on opening it)
        rc, out, _ = run(["ls", path], capsys)
        assert rc == 0
        head = out.splitlines()[0]
        assert "open for writing" not in head and "3 steps" in head, head
        assert "cut short: 3 committed records left out" in head, head
        rc, out, _ = run(["ls", path, "--json"], capsys)
    doc = json.loads(out)
    assert doc["steps"] == 3 and doc["closed"] is False and doc["records_left_out"] == 3


def test_ls_and_info_list_a_file_whose_one_step_table_is_damaged(tmp_path, capsys):
    """One byte flipped in the block table of one dataset at one step: the file opens and
    its other steps and datasets read, so ls and info list them all, that (dataset, step)
    marked unreadable with its error and left out of the counts, where both refused the
    whole file (status 2) before."""
    from lamina.engines.native import format as fmt

    path = str(tmp_path / "r.lam")
    with lamina.open(path, "w", engine="native") as f:
        t = f.create_dataset("fields/T", (16, 8), "f8")
        i = f.create_dataset("i32", (10,), "i4")
        for k in range(3):
            with f.step():
                for b in range(4):
                    t[4 * b : 4 * b + 4] = k + b
                i[...] = np.arange(10) + k
    meta = os.path.join(path, fmt.META_NAME)
    commit = open(os.path.join(path, fmt.COMMIT_NAME), "rb").read()
    entries, _, _ = fmt.parse_commits(commit, os.path.getsize(meta))
    with open(meta, "r+b") as fh:  # a byte of step 2's block area, i32's section (the last)
        fh.seek(entries[2].offset - 60)
        b = fh.read(1)
        fh.seek(entries[2].offset - 60)
        fh.write(bytes([b[0] ^ 0xFF]))
    with lamina.open(path) as f:  # (what the library keeps readable)
        assert f.at(2)["fields/T"][0, 0] == 2.0 and f.at(1)["i32"][0] == 1
        with pytest.raises(lamina.FormatError, match="dataset 'i32' fail their checksum"):
            f.at(2)["i32"][...]
    rc, out, _ = run(["ls", path], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert "DAMAGED: 1 dataset step unreadable" in lines[0], out
    (line,) = [x for x in lines if x.strip().startswith("i32")]
    assert "steps 0-1 (2 of 3)" in line and "2 blocks" in line, line
    assert "unreadable at step 2: " in line and "fail their checksum" in line, line
    (line,) = [x for x in lines if x.strip().startswith("T ")]
    assert "steps 0-2" in line and "unreadable" not in line, line
    rc, out, _ = run(["ls", path, "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["unreadable"] == 1
    (node,) = [n for n in doc["nodes"] if n["path"] == "/i32"]
    assert list(node["unreadable_steps"]) == ["2"] and node["steps_written"] == [0, 1]
    rc, out, _ = run(["info", path], capsys)
    assert rc == 0 and "DAMAGED" in out.splitlines()[0]
    rc, out, _ = run(["info", path, "i32"], capsys)
    assert rc == 0 and "step 1 " in out and "step 2 " in out, out
    assert "unreadable: " in out.split("step 2 ", 1)[1], out
    rc, out, _ = run(["info", path, "i32", "--json"], capsys)
    steps = json.loads(out)["steps"]
    assert [s.get("error") is not None for s in steps] == [False, False, True]


def test_a_file_cut_short_is_said_in_a_warning_line_of_the_command(tmp_path):
    """The warning that steps were left out reads 'lamina info: warning: ...', as the other
    messages of the commands do, not Python's warning with its line of source."""
    path = str(tmp_path / "cut.lam")
    _steps_of_u(path, 3)
    with lamina.open(path) as f:
        b = f["u"].blocks(1)[0]
    os.truncate(os.path.join(path, b.subfile), b.offset + 3)
    for cmd in ("info", "ls"):
        out = subprocess.run(
            [sys.executable, "-m", "lamina", cmd, path], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out
        assert f"lamina {cmd}: warning: " in out.stderr and "left out" in out.stderr, out.stderr
        assert "sys.exit" not in out.stderr and "LaminaWarning" not in out.stderr, out.stderr


_WRITER = """
import sys, time, numpy as np, lamina
f = lamina.open(sys.argv[1], "w", engine="native")
f.create_dataset("u", shape=(8,), dtype="f8")
with f.step():
    f["u"][...] = np.arange(8.0)
print("written", flush=True)
time.sleep(120)
"""


def test_ls_tells_a_running_writer_from_one_that_ended_without_closing(tmp_path, capsys):
    """A file whose writer holds it open is "open for writing"; once that writer is killed
    (SIGKILL, no close) ``lamina ls`` says it ended without closing the file (it said "open
    for writing" then too); ``--json`` gives ``writer_running``.  The probe asks who holds
    the lock without taking it."""
    path = str(tmp_path / "w.lam")
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "written"
        rc, out, _ = run(["ls", path], capsys)
        assert rc == 0 and "(open for writing)" in out.splitlines()[0], out
        rc, out, _ = run(["ls", path, "--json"], capsys)
        assert json.loads(out)["writer_running"] is True
    finally:
        proc.kill()
        proc.wait()
    rc, out, _ = run(["ls", path], capsys)
    head = out.splitlines()[0]
    assert rc == 0 and "1 step (not closed: its writer ended without closing it)" in head, head
    rc, out, _ = run(["ls", path, "--json"], capsys)
    assert json.loads(out)["writer_running"] is False
    with lamina.open(path, "a") as f:  # taken over, as the crash tests do
        with f.step():
            f["u"][...] = np.zeros(8)
    rc, out, _ = run(["ls", path, "--json"], capsys)
    doc = json.loads(out)
    assert doc["closed"] is True and doc["writer_running"] is None and doc["steps"] == 2


def test_ls_says_a_writer_that_let_go_without_closing_ended(tmp_path, capsys):
    """Ranks that leave a file after an error let go of it without a close record: its lock
    is emptied, held by nobody.  ``lamina ls`` said "(open for writing)" (``writer_running``
    null) though no writer runs and the next one opens it at once."""
    path = str(tmp_path / "left.lam")
    f = lamina.open(path, "w")
    f.create_dataset("u", shape=(4,), dtype="f8")
    with f.step():
        f["u"][...] = 1.0
    f._engine.abandon()  # what each rank does after the leave (no close record)
    assert os.path.getsize(os.path.join(path, "lamina.lock")) == 0
    rc, out, _ = run(["ls", path], capsys)
    head = out.splitlines()[0]
    assert rc == 0 and "1 step (not closed: its writer ended without closing it)" in head, head
    rc, out, _ = run(["ls", path, "--json"], capsys)
    doc = json.loads(out)
    assert doc["closed"] is False and doc["writer_running"] is False
    with lamina.open(path, "a") as g:  # taken at once
        assert g.steps == 1


# --------------------------------------------------------------------------
# ls and info: each step's blocks read once


def _varied_file(path) -> None:
    """Datasets of one block a step, of many, of none at some steps, compressed, 0-D, of
    several dtypes, a multiresolution one and a quantity computed when read."""
    rng = np.random.default_rng(5)
    with lamina.open(path, "w", durable=False) as f:
        ones = [f.create_dataset(f"one/v{i}", (6,), "f8" if i % 2 else "i2") for i in range(6)]
        many = f.create_dataset("many", (40, 8), "f4")
        packed = f.create_dataset("packed", (64, 64), "f8", compression="zstd")
        scalar = f.create_dataset("scalar", (), "i8")
        sometimes = f.create_dataset("sometimes", (5, 3), "u1")
        mr = f.create_dataset(
            "mr", (32, 32), "f4", layout=lamina.Multires(patch=16, tolerance=1e-3)
        )
        f.create_dataset("never", (3,), "f8")
        f.derive("sum", "`one/v1` + `one/v3`", "expression")
        for k in range(7):
            with f.step():
                for i, d in enumerate(ones):
                    if (k + i) % 5:
                        d[...] = k + i
                for r in range(0, 40, 8 if k % 2 else 20):
                    many[r : r + (8 if k % 2 else 20)] = rng.random((8 if k % 2 else 20, 8))
                packed[...] = np.full((64, 64), float(k))
                scalar[...] = k
                if k % 3 == 0:
                    sometimes[1:4, :2] = 7
                if k in (2, 5):
                    mr[0:16] = rng.random((16, 32)).astype("f4")


def test_ls_sums_what_the_blocks_of_each_step_sum_to(tmp_path, capsys):
    """lamina ls takes each dataset's steps, blocks and bytes from each step's section
    directory and columns; they are what the blocks of every (dataset, step) sum to."""
    from lamina.engines.base import storage_of

    path = tmp_path / "varied.lam"
    _varied_file(path)
    rc, out, _ = run(["ls", path, "--json"], capsys)
    assert rc == 0
    nodes = {n["path"]: n for n in json.loads(out)["nodes"] if n["type"] == "dataset"}
    with lamina.open(path) as f:
        for name, node in nodes.items():
            ds = f[name]
            blocks = [ds.blocks(k) for k in range(f.steps)]
            assert node["steps_written"] == [k for k, b in enumerate(blocks) if b], name
            assert node["blocks"] == sum(len(b) for b in blocks), name
            assert node["raw_nbytes"] == sum(storage_of(b)[1] for b in blocks), name
            if ds.layout is None:
                assert node["nbytes"] == sum(storage_of(b)[0] for b in blocks), name
    assert nodes["/never"]["steps_written"] == [] and nodes["/sum"]["blocks"] == 0
    assert nodes["/sometimes"]["steps_written"] == [0, 3, 6]


def _count_loads(monkeypatch) -> list[int]:
    """The block-area loads of every step read from now on, as the step numbers' count."""
    from lamina.catalog import blocks as blocks_mod

    loads = [0]
    table, ones = blocks_mod.StepBlocks.table, blocks_mod.StepBlocks._decode_ones

    def counted_table(self, spec, *args, **kw):
        if spec.id >= 0 and spec.id not in self._tables and spec.id in self.sections:
            loads[0] += 1
        return table(self, spec, *args, **kw)

    def counted_ones(self, specs):
        loads[0] += 1
        return ones(self, specs)

    monkeypatch.setattr(blocks_mod.StepBlocks, "table", counted_table)
    monkeypatch.setattr(blocks_mod.StepBlocks, "_decode_ones", counted_ones)
    return loads


def test_ls_reads_each_steps_blocks_once_for_every_dataset(tmp_path, capsys, monkeypatch):
    """lamina ls decoded the blocks of every (dataset, step), datasets outside and steps
    inside, so that the tables a catalog keeps (32 steps) were gone when the next dataset
    asked: 1,000 datasets x 200 steps took 22.8 s.  Now a step's one-block sections are
    read together, once: 40 datasets x 50 steps is 50 loads, not 2,000."""
    path = tmp_path / "wide.lam"
    with lamina.open(path, "w", durable=False) as f:
        ds = [f.create_dataset(f"v{i}", (4,), "f8") for i in range(40)]
        for k in range(50):
            with f.step():
                for d in ds:
                    d[...] = k
    loads = _count_loads(monkeypatch)
    rc, out, _ = run(["ls", path], capsys)
    assert rc == 0 and "40 datasets" in out
    assert out.count("steps 0-49 (50 of 50)  50 blocks  1.6 KiB") == 40, out
    assert loads[0] <= 50, loads


def test_info_reads_each_steps_blocks_once(tmp_path, capsys, monkeypatch):
    """lamina info decoded each step's table twice (its blocks, then what they cover, once
    the catalog had let the first go) and made every block's record three times, keeping
    every step's table: 27 s and 667 MB for 100,000 steps."""
    path = tmp_path / "long.lam"
    with lamina.open(path, "w", durable=False) as f:
        x = f.create_dataset("x", (4,), "f8")
        for k in range(80):
            with f.step():
                x[...] = k
    loads = _count_loads(monkeypatch)
    rc, out, _ = run(["info", path, "x"], capsys)
    assert rc == 0 and out.count("1 block, 4 of 4 elements (100.0%), 32 B stored, 32 B raw") == 80
    assert loads[0] == 80, loads


def test_names_with_control_characters_are_one_line_each(tmp_path, capsys):
    """A dataset named 'new<LF>line' printed as two lines of the tree, the second one
    unindented, as if it were another node.  Text output escapes what Python's repr
    escapes (and doubles backslashes, so an escape reads back one way); JSON keeps names."""
    path = tmp_path / "names.lam"
    names = ["new\nline", "tab\there", "back\\slash", "esc\x1b[31mred", "sep\u2028x", "ok é 日"]
    with lamina.open(path, "w", durable=False) as f:
        for n in names:
            f.create_dataset(f"g\rr/{n}", (2,))
        f["g\rr/ok é 日"].attrs["unit\nname"] = "a\nb"
        with f.step():
            f["g\rr/new\nline"][...] = 1
    rc, out, err = run(["ls", path], capsys)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == 2 + 1 + len(names) + 1, out  # head, /, g\rr/, the datasets, @unit
    assert lines[2] == "  g\\rr/"
    shown = [ln[4:].split("  ")[0] for ln in lines[3:] if not ln.startswith("      @")]
    assert shown == sorted(
        ["new\\nline", "tab\\there", "back\\\\slash", "esc\\x1b[31mred", "sep\\u2028x", "ok é 日"]
    )
    assert "      @unit\\nname = 'a\\nb'" in lines
    assert "steps 0 (1 of 1)" in next(ln for ln in lines if "new\\nline" in ln)
    rc, out, _ = run(["ls", path, "--json"], capsys)
    assert rc == 0
    paths = [n["path"] for n in json.loads(out)["nodes"]]
    assert sorted(paths[2:]) == sorted(f"/g\rr/{n}" for n in names)
    rc, out, _ = run(["info", path, "g\rr/new\nline"], capsys)
    assert rc == 0 and out.startswith("/g\\rr/new\\nline: float64 (2,)"), out
    assert len(out.splitlines()[0].split("\n")) == 1
    rc, out, _ = run(["dump", path, "g\rr/tab\there"], capsys)
    assert rc == 0 and out.startswith("/g\\rr/tab\\there[...] at step 0"), out
