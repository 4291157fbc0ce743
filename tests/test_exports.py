"""What the package exports: every error class docs/api.md names, and ``python -m lamina``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import lamina
import lamina.errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _error_table() -> list[str]:
    """The error classes in the table of docs/api.md's section "Errors", in order."""
    with open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE)


def test_the_error_table_is_read():
    names = _error_table()
    assert len(names) >= 20 and "RangeError" in names and "ConfigError" in names


@pytest.mark.parametrize("name", [*_error_table(), "LaminaError", "TransportError"])
def test_every_documented_error_is_at_top_level(name):
    cls = getattr(lamina, name, None)
    assert cls is not None, f"lamina.{name} is missing"
    assert cls is getattr(lamina.errors, name)
    assert issubclass(cls, lamina.LaminaError)
    assert name in lamina.__all__


def test_python_m_lamina_is_the_lamina_command():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, "-m", "lamina", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: lamina ") and "COMMAND" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "lamina", "ls", os.path.join(ROOT, "no-such-file.lam")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
