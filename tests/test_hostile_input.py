"""Bytes from outside (files, the wire, caches): a value or a clear lamina error, never a crash,
a RecursionError, a hang or a huge allocation.

This file holds the checks that belong to no single reader: the one JSON parser for outside
text (``lamina.catalog.wire.load_json``) and the calibration cache.  The readers themselves are
tested with their modules (test_catalog, test_derived_layer, test_codecs, test_hdf5, test_run).
"""

from __future__ import annotations

import importlib
import json
import os
import warnings

import pytest

from lamina.catalog.wire import MAX_JSON_DEPTH, json_depth, load_json
from lamina.errors import FormatError, LaminaWarning

calmod = importlib.import_module("lamina.perf.calibrate")  # the module, not the function

# --------------------------------------------------------------------------
# load_json


@pytest.mark.parametrize(
    "text, depth",
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[[", "{{{{"]', 1),  # brackets in strings do not count
        (r'["\"[[[", "\\"]', 1),  # nor do escaped quotes end a string
        ("[[]] [[[]]]", 3),
    ],
)
def test_json_depth(text, depth):
    assert json_depth(text) == depth


def test_load_json_values():
    assert load_json('{"a": [1, 2.5, "x"], "b": null}', "t") == {"a": [1, 2.5, "x"], "b": None}
    assert load_json(b'["\xc3\xa9"]', "t") == ["é"]
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_depth(nested) == MAX_JSON_DEPTH and load_json(nested, "t") is not None
    assert load_json("[NaN]", "t")[0] != load_json("[NaN]", "t")[0]  # Python writes NaN
    with pytest.raises(FormatError, match="NaN"):
        load_json("[NaN]", "t", constants=False)


@pytest.mark.parametrize(
    "text, words",
    [
        ("[" * 5000 + "]" * 5000, "nested 5000 levels deep"),  # RecursionError in json.loads
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "more than the limit"),  # too long first
        ("{nope", "not valid JSON"),
        (b"\xff[]", "not UTF-8"),
        ("[" + "9" * 10_000 + "]", "not valid JSON"),  # int() refuses 10000 digits
        ("", "not valid JSON"),
    ],
)
def test_load_json_refuses(text, words):
    with pytest.raises(FormatError, match=words) as info:
        load_json(text, "the thing read")
    assert str(info.value).startswith("the thing read: ")
    assert isinstance(info.value, OSError)  # FormatError: a LaminaError and an OSError


def test_load_json_limits_are_arguments():
    with pytest.raises(FormatError, match="nested 3 levels deep, more than the limit of 2"):
        load_json("[[[]]]", "t", max_depth=2)
    with pytest.raises(FormatError, match="10 characters of JSON, more than the limit of 9"):
        load_json('"12345678"', "t", limit=9)
    with pytest.raises(FormatError, match="10 bytes of JSON"):
        load_json(b'"12345678"', "t", limit=9)


def test_no_json_loads_outside_the_shared_reader():
    """Every JSON parse of a file's or the wire's bytes goes through load_json.

    The calls left are listed: JSON that the same program wrote a moment ago
    (a broadcast from rank 0, a calibration object just made), or the
    benchmark and demo programs' own result files.
    """
    import lamina

    root = os.path.dirname(lamina.__file__)
    allowed = {
        os.path.join("catalog", "wire.py"),  # the reader itself
        os.path.join("layers", "derived", "layer.py"),  # rank 0's choice, broadcast
        os.path.join("perf", "command.py"),  # cal.to_json() of this process
        os.path.join("bench", "strategies.py"),
        os.path.join("bench", "launch.py"),
        os.path.join("demo", "__init__.py"),
        os.path.join("demo", "pair.py"),
        os.path.join("testing", "engines.py"),
        os.path.join("workflow", "exec.py"),  # the task lamina run itself wrote
        "check.py",  # the findings of the job's other ranks, gathered
    }
    found = []
    for d, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(d, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                if "json.load(" in text or "json.loads(" in text:
                    found.append(os.path.relpath(path, root))
    assert sorted(set(found) - allowed) == []


# --------------------------------------------------------------------------
# the calibration cache


def test_calibration_nested_deeply_is_a_value_error():
    with pytest.raises(ValueError, match="calibration: .*nested"):
        calmod.Calibration.from_json("[" * 5000 + "]" * 5000)
    # an object of tables of [size, seconds] pairs is 4 levels deep: one more is refused
    with pytest.raises(ValueError, match="calibration: .*nested 5 levels"):
        calmod.Calibration.from_json('{"block_seconds": {"read": [[[1]]]}}')


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_calibration_fifo_is_refused_without_blocking(tmp_path, monkeypatch):
    """A FIFO (or a device) at the cache's path would block the reader forever: refused."""
    fifo = tmp_path / "cal.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        calmod.read_calibration(str(fifo))
    assert calmod.cached(str(fifo)) is None  # the cache: measured again
    with pytest.raises(ValueError, match="not a regular file"):
        calmod.load_calibration(str(fifo), measure=False)
    if os.path.exists("/dev/zero"):
        with pytest.raises(ValueError, match="not a regular file"):
            calmod.read_calibration("/dev/zero")


def test_bad_calibration_is_measured_again(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    fresh = calmod.Calibration(
        *(1e9 for _ in calmod.RATES), host=calmod.host(), created=1.0, version=1
    )
    monkeypatch.setattr(calmod, "calibrate", lambda quick=False, directory=None: fresh)
    for text in ["[" * 5000, '{"a":' * 5000, json.dumps({"x": [[[]]]}), "\x00" * 10]:
        path.write_text(text)
        assert calmod.load_calibration(str(path)) == fresh
        assert calmod.read_calibration(str(path)) == fresh  # and saved over the bad one


def test_calibration_directory_is_reported(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path} is a directory, not a regular file"):
        calmod.read_calibration(str(tmp_path))
    with pytest.warns(LaminaWarning, match=f"calibration {tmp_path} is a directory"):
        assert calmod.cached(str(tmp_path)) is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_calibration_or_model_checks_fifo_is_not_replaced(tmp_path, monkeypatch):
    """A save replaced the FIFO (a device, as root /dev/null itself) with a regular file:
    nothing is written, one warning naming the path; the null device keeps nothing without
    a word."""
    import stat

    from lamina.perf import checks

    fresh = calmod.Calibration(
        *(1e9 for _ in calmod.RATES), host=calmod.host(), created=1.0, version=1
    )
    monkeypatch.setattr(calmod, "calibrate", lambda quick=False, directory=None: fresh)
    check = checks.Check("async", "lamina model async", 1.0, calmod.host(), ())
    for name, save in (
        ("calibration", lambda p: calmod.load_calibration(p) and calmod.save_calibration(fresh, p)),
        ("model checks", lambda p: checks.record([check], p)),
    ):
        fifo = tmp_path / name.replace(" ", "-")
        os.mkfifo(fifo)
        with pytest.warns(LaminaWarning) as said:
            save(str(fifo))
            save(str(fifo))
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode), name
        assert len(said) == 1 and f"{name} {fifo} is a FIFO" in str(said[0].message), said
        null = tmp_path / (fifo.name + "-null")
        null.symlink_to(os.devnull)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            save(str(null))
        assert null.is_symlink(), name
