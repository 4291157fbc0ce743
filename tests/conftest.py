"""Shared fixtures for the in-process test suite (one rank, no mpiexec).

``engine`` parametrizes a test over every block engine, so the same
round-trip tests run against ``native`` (files) and ``memory`` (this
process), like zarr's ``testing/store.py`` base class.  ``new_path`` gives
each test a fresh location that fits the engine: a directory under
``tmp_path`` for ``native``, a unique name (dropped afterwards) for
``memory``.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import lamina
from lamina.engines import memory as memory_engine

# lamina keeps what it measures per machine (~/.cache/lamina/history.json: background I/O,
# derived quantities): tests keep theirs apart, a fresh file per test (autouse fixture below),
# in a directory of their own (mpiexec scenarios inherit it through the environment), so that
# what one test measured never steers another's io='auto' or strategy='auto'
HISTORY_DIR = tempfile.mkdtemp(prefix="lamina-tests-")
os.environ["LAMINA_HISTORY"] = os.path.join(HISTORY_DIR, "history.json")
# the benchmarks record their models' errors per machine too (lamina.perf.checks)
os.environ["LAMINA_MODEL_CHECKS"] = os.path.join(HISTORY_DIR, "model-checks.json")
# (removed when the run ends: every launched program has ended by then)
atexit.register(shutil.rmtree, HISTORY_DIR, ignore_errors=True)
_histories = itertools.count()


@pytest.fixture(autouse=True)
def _own_history(monkeypatch):
    from lamina.perf.history import wait_saves

    k = next(_histories)
    monkeypatch.setenv("LAMINA_HISTORY", os.path.join(HISTORY_DIR, f"h{k}.json"))
    monkeypatch.setenv("LAMINA_MODEL_CHECKS", os.path.join(HISTORY_DIR, f"checks{k}.json"))
    yield
    wait_saves()  # a writer's close saves on a thread: done before the next test


# Modest example counts keep the whole in-process suite well under a minute;
# deadline=None because the first example of a test pays numpy/numcodecs
# warm-up costs that are not the code under test.  The default profile is
# derandomized: every run tries the same examples, so `make test` never fails
# by chance.  The long profile searches at random, with many more examples:
#     LAMINA_HYPOTHESIS_PROFILE=lamina-long pytest tests/test_query_sound.py
settings.register_profile(
    "lamina",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "lamina-long",
    max_examples=2000,
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("LAMINA_HYPOTHESIS_PROFILE", "lamina"))

ENGINES = ("native", "memory")


def pytest_configure(config):
    # used by the MPI and crash tests; registered here so that -m 'not slow' works without warnings
    config.addinivalue_line("markers", "slow: long-running test (deselect with -m 'not slow')")


_counter = itertools.count()


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    """Name of the engine under test; every test using it runs once per engine."""
    return request.param


@pytest.fixture
def new_path(engine, tmp_path):
    """Factory of fresh file locations for *engine*: ``new_path()`` or ``new_path("name")``."""
    made: list[str] = []

    def make(name: str | None = None) -> str:
        name = name or f"f{next(_counter)}"
        if engine == "native":
            p = str(tmp_path / f"{name}.lam")
        else:
            p = f"mem://{os.getpid()}/{tmp_path.name}/{name}"
        made.append(p)
        return p

    yield make
    for p in made:
        memory_engine.drop(p)


@pytest.fixture
def open_file(engine, new_path):
    """``open_file(path, mode, **options)`` on the engine under test; closes leftovers at teardown."""
    files: list[lamina.File] = []

    def op(path: str, mode: str = "r", **options) -> lamina.File:
        f = lamina.open(path, mode, engine=engine, **options)
        files.append(f)
        return f

    yield op
    for f in files:
        try:
            f.close()
        except Exception:
            pass


@pytest.fixture
def native_path(tmp_path) -> str:
    """A fresh path for a native lamina file (tests that need real files)."""
    return str(tmp_path / "run.lam")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


def _write_simple(
    path: str, engine: str = "native", steps: int = 3, shape=(8, 6), **ds_kwargs
) -> list[np.ndarray]:
    """Write *steps* steps of a float64 dataset 'fields/T' in two blocks; returns the arrays written."""
    arrays = []
    with lamina.open(path, "w", engine=engine) as f:
        ds = f.create_dataset("fields/T", shape=shape, dtype="f8", **ds_kwargs)
        f.attrs["title"] = "simple"
        half = shape[0] // 2
        for k in range(steps):
            a = np.arange(np.prod(shape), dtype="f8").reshape(shape) + 1000 * k
            with f.step():
                ds[:half] = a[:half]
                ds[half:] = a[half:]
            arrays.append(a)
    return arrays


@pytest.fixture
def write_simple():
    """``write_simple(path, engine="native", steps=3, shape=(8, 6), **create_dataset_kwargs)``.

    Writes *steps* steps of float64 dataset 'fields/T' (two blocks per step)
    and a file attribute; returns the list of arrays written per step.
    """
    return _write_simple


@pytest.fixture
def fast_native(monkeypatch):
    """Make ``durable=False`` the native engine's default (no fsync per commit) for one test.

    Durability is what the crash tests check; everything else only needs the
    bytes, and fsync at every commit would dominate the suite's run time.
    A test that passes ``durable=...`` explicitly still gets what it asks for.
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("fast_native")``.
    """
    from lamina.engines.native.engine import NativeEngine

    original = NativeEngine._open_storage

    def open_storage(self, path, mode):
        self.options.setdefault("durable", False)
        return original(self, path, mode)

    monkeypatch.setattr(NativeEngine, "_open_storage", open_storage)
