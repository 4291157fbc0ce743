"""Derived quantities whose definition this lamina cannot use (a newer definition version, a
function it does not know, a damaged record): reading one raises FormatError naming the file,
the quantity and why, wherever no values of it are stored; the rest of the file reads and
appends normally, and the definition is kept as it was written."""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import pytest

import lamina
from lamina import cli
from lamina.catalog import Encoder
from lamina.errors import FormatError, LaminaWarning, ModeError

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import mpi_util as mu  # noqa: E402

pytestmark = [pytest.mark.timeout(180)]


def record(version=1, text="T * 10", strategy="expression", spacing=(1.0,), info="{}") -> bytes:
    e = Encoder()
    e.u8(version)
    e.str(text)
    e.str(strategy)
    e.u8(len(spacing))
    for s in spacing:
        e.f64(s)
    e.str(info)
    return e.getvalue()


#: how E's record is changed, and what the error says of it
CASES = {
    # as a newer lamina would write it: another version, a layout this lamina cannot know
    "newer version": (record(version=2) + b"\x00more", ["definition version 2", "version 1"]),
    # a function a newer lamina adds
    "unknown function": (record(text="zzz(T)"), ["unknown function 'zzz'", "position 0"]),
}


def make(path, raw: bytes | None, strategy: str = "expression") -> np.ndarray:
    """A file with T, E = T * 10 kept with *strategy* (its record replaced by *raw*), K = T * 2
    stored; one step written.  Returns T."""
    t = np.arange(8.0)
    with lamina.open(path, "w") as f:
        f.create_dataset("T", (8,), "f8")
        f.derive("E", "T * 10", strategy)
        f.derive("K", "T * 2", "store")
        with f.step():
            f["T"][...] = t
        if raw is not None:
            f.engine.set_ext("derived:E", raw)
    return t


def opened(path, mode="r") -> lamina.File:
    with pytest.warns(LaminaWarning, match="derived quantity 'E' cannot be used"):
        return lamina.open(path, mode)


def raises_unusable(path, words):
    """pytest.raises for the FormatError of reading E, checking what it names."""

    class Check:
        def __enter__(self):
            self.cm = pytest.raises(FormatError)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            out = self.cm.__exit__(*exc)
            msg = str(self.info.value)
            assert str(path) in msg, msg
            assert "'E'" in msg, msg
            for w in words:
                assert w in msg, msg
            return out

    return Check()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("strategy", ["expression", "stats"])
def test_reading_an_unusable_quantity_raises_and_the_rest_reads(tmp_path, case, strategy):
    raw, words = CASES[case]
    p = tmp_path / "u.lam"
    t = make(p, raw, strategy)
    with opened(p) as f:
        assert "E" not in f.derived
        for read in (
            lambda: f["E"][...],
            lambda: f["E"][2:4],
            lambda: f["E"].read(),
            lambda: f["E"].read(collective=True),
            lambda: f.at(0)["E"][...],
            lambda: f.query("E > 1"),
            lambda: f.query("T > 1", select=["E"]),
            lambda: f["E"].coverage(),
        ):
            with raises_unusable(p, words):
                read()
        np.testing.assert_array_equal(f["T"][...], t)
        np.testing.assert_array_equal(f["K"][...], t * 2)
        assert f.query("T > 5").count == 2
        # (a quantity the reader declares over it reads through it: the same error)
        f.derive("F", "E + 1")
        with raises_unusable(p, words):
            f["F"][...]


def test_a_quantity_over_an_unusable_one_cannot_be_used_either(tmp_path):
    p = tmp_path / "u.lam"
    with lamina.open(p, "w") as f:
        f.create_dataset("T", (8,), "f8")
        f.derive("E", "T * 10", "expression")
        f.derive("G", "E + 1", "stats")
        with f.step():
            f["T"][...] = np.arange(8.0)
        f.engine.set_ext("derived:E", record(version=2))
    with pytest.warns(LaminaWarning) as rec:
        f = lamina.open(p)
    with f:
        said = [str(w.message) for w in rec]
        assert any("'G' cannot be used" in s and "'E'" in s for s in said), said
        with pytest.raises(FormatError, match="'G'"):
            f["G"][...]


def test_stored_values_of_an_unusable_quantity_read_as_written(tmp_path):
    """Kept with strategy 'store': the steps that stored its values read them as plain data; a
    step that stores none (appended by this lamina, which cannot compute it) raises."""
    p = tmp_path / "u.lam"
    t = make(p, record(version=2), "store")
    with opened(p, "a") as f:
        with f.step():
            f["T"][...] = t + 1
    with opened(p) as f:
        np.testing.assert_array_equal(f.at(0)["E"][...], t * 10)
        with raises_unusable(p, ["definition version 2", "step 1"]):
            f.at(1)["E"][...]


@pytest.mark.parametrize("case", list(CASES))
def test_appending_keeps_the_definition_and_refuses_writing_the_quantity(tmp_path, case):
    raw, words = CASES[case]
    p = tmp_path / "u.lam"
    t = make(p, raw)
    meta = (p / "lamina.meta").read_bytes()
    with opened(p, "a") as f:
        assert f.engine.catalog.ext["derived:E"] == raw
        with f.step():
            f["T"][...] = t + 1  # its input: written as any dataset
        with pytest.raises(ModeError, match="'E'"):
            with f.step():
                f["E"][...] = 1.0
        with pytest.raises(ModeError, match="'E'"):
            f["E"].write_blocks([np.ones(2)], [(0,)])
        with pytest.raises(lamina.errors.ExistsError, match="'E'"):
            f.derive("E", "T + 1", "stats")
        with raises_unusable(p, words):
            f["E"][...]
    assert (p / "lamina.meta").read_bytes()[: len(meta)] == meta  # nothing before rewritten
    with opened(p) as f:
        assert f.engine.catalog.ext["derived:E"] == raw
        np.testing.assert_array_equal(f.at(1)["T"][...], t + 1)
        np.testing.assert_array_equal(f.at(1)["K"][...], (t + 1) * 2)
        with raises_unusable(p, words):
            f["E"][...]


def run(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", list(CASES))
def test_cli_shows_an_unusable_quantity_and_refuses_to_dump_it(tmp_path, capsys, case):
    raw, words = CASES[case]
    p = tmp_path / "u.lam"
    make(p, raw)
    with pytest.warns(LaminaWarning):
        rc, out, err = run(["ls", p], capsys)
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.strip().startswith("E "))
    assert "never written" not in line, line
    assert "cannot be evaluated by this lamina" in line and words[0] in line, line
    with pytest.warns(LaminaWarning):
        rc, out, err = run(["ls", p, "--json"], capsys)
    import json

    node = next(n for n in json.loads(out)["nodes"] if n["path"] == "/E")
    assert words[0] in node["derived"]["unusable"], node
    with pytest.warns(LaminaWarning):
        rc, out, err = run(["info", p, "E"], capsys)
    assert rc == 0, err
    assert "cannot be evaluated by this lamina" in out and words[0] in out, out
    with pytest.warns(LaminaWarning):
        rc, out, err = run(["dump", p, "E"], capsys)
    assert rc == 2, out
    assert "FormatError" in err or "cannot" in err, err
    for w in [str(p), "'E'", *words]:
        assert w in err, err
    with pytest.warns(LaminaWarning):
        rc, out, err = run(["dump", p, "T"], capsys)
    assert rc == 0, err
    with opened(p) as f:  # (Jupyter's view says the same as lamina ls)
        html = f["E"]._repr_html_()
    assert "never written" not in html and "cannot be evaluated by this lamina" in html, html


def test_xarray_opens_the_file_and_raises_when_the_quantity_is_read(tmp_path):
    xr = pytest.importorskip("xarray")
    from lamina.xarray import LaminaBackendEntrypoint

    p = tmp_path / "u.lam"
    t = make(p, record(version=2))
    with pytest.warns(LaminaWarning):
        ds = xr.open_dataset(p, engine=LaminaBackendEntrypoint)
    with ds:
        np.testing.assert_array_equal(ds["T"].values[-1], t)
        with raises_unusable(p, ["definition version 2"]):
            _ = ds["E"].values


# each line in one write: mpiexec passes each rank's writes on as they come, and print
# writes its words, spaces and newline one by one ('OKOK 1OK 0' seen)
SCRIPT = """
import os, warnings, lamina
from mpi4py import MPI
c = MPI.COMM_WORLD
warnings.simplefilter("ignore")
say = lambda *words: os.write(1, (" ".join(map(str, words)) + "\\n").encode())
with lamina.open({path!r}, "r", comm=c) as f:
    try:
        f["E"][...]
    except lamina.errors.FormatError as e:
        say(c.rank, "FormatError", "version 2" in str(e))
    try:
        f["E"].read(collective=True)
    except lamina.errors.FormatError as e:
        say(c.rank, "collective FormatError")
    assert f["T"].read(collective=True)[3] == 3.0
say("OK", c.rank)
"""


def _have_mpiexec() -> bool:
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        return False
    return True


@pytest.mark.skipif(not _have_mpiexec(), reason="no mpiexec")
def test_every_rank_raises(tmp_path):
    p = tmp_path / "u.lam"
    make(p, record(version=2))
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(SCRIPT.format(path=str(p))))
    res = mu.run_mpi(3, str(script), timeout=120)
    assert res.stdout.count("FormatError True") == 3, res.stdout
    assert res.stdout.count("collective FormatError") == 3, res.stdout
    assert res.stdout.count("OK ") == 3, res.stdout
