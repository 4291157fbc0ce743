"""What ``import lamina`` costs a process: every rank of a job and every command pays it.

lamina's subpackages that a plain write or read does not need (the expression
kernels, the cost model's command line, workflow files) are imported at their
first use; the small checksums come from ``crc32c``'s C module without the
package's ``__init__`` (which imports ``importlib.metadata``).  These tests
hold that, and that the checksum is the same whichever way it is loaded.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import numpy as np
import pytest

from lamina import checksum

#: modules a process that imports lamina (and opens, writes and reads a file) must not import
NOT_AT_IMPORT = [
    "crc32c",  # the package: its __init__ imports importlib.metadata
    "importlib.metadata",
    "argparse",
    "socket",
    "secrets",
    "statistics",  # fractions, decimal, random
    "concurrent.futures",  # logging; imported at the first large block's statistics
    "difflib",  # an error's suggestions
    "lamina.derived.nodes",
    "lamina.derived.bounds",
    "lamina.derived.compute",
    "lamina.perf.command",
    "lamina.perf.model",
    "lamina.workflow.file",
]

_PROGRAM = """
import json, sys, tempfile, os
import numpy as np
import lamina
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "x.lam")
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("u", (8, 8), "f8")
        with f.step():
            ds[:, :] = np.arange(64.0).reshape(8, 8)
    with lamina.open(path) as f:
        assert f["u"][:, :].sum() == 2016.0
print(json.dumps(sorted(m for m in {names} if m in sys.modules)))
"""


def test_import_and_a_round_trip_leave_the_heavy_modules_out():
    code = _PROGRAM.replace("{names}", repr(NOT_AT_IMPORT))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_names_of_the_lazy_packages_resolve():
    import lamina.derived
    import lamina.perf
    import lamina.workflow

    assert lamina.derived.parse("a + 1").inputs == frozenset({"a"})
    assert callable(lamina.perf.calibrate) and callable(lamina.perf.recommend)
    from lamina.perf import calibrate  # the function, not its module of the same name

    assert callable(calibrate)
    assert lamina.workflow.load is importlib.import_module("lamina.workflow.file").load
    with pytest.raises(AttributeError, match="lamina.derived.*no_such_name"):
        lamina.derived.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    "data",
    [b"", b"123456789", bytearray(b"abc" * 100), memoryview(b"abcdef")[1:5], np.arange(50.0)],
    ids=["empty", "check", "bytearray", "memoryview", "ndarray"],
)
def test_the_directly_loaded_checksum_is_the_packages(data):
    from crc32c import crc32c as packaged

    assert checksum.crc32c(data) == packaged(data)
    assert checksum.crc32c(data, 12345) == packaged(data, 12345)


def test_the_package_is_imported_where_its_module_cannot_be_found(monkeypatch):
    def nothing(name, package=None):
        raise ImportError(name)

    monkeypatch.setattr(importlib.util, "find_spec", nothing)
    fn = checksum._load()
    assert fn(b"123456789") == 0xE3069283
    assert fn is sys.modules["crc32c"].crc32c
