"""Engine behaviour the round-trip base cannot express, run against 'native' and 'memory' in this process.

The round trips every engine must pass are :mod:`lamina.testing.cases`, run
for every built-in engine by ``test_engines_base.py``.  Here: property tests
(hypothesis draws the data, so they run in one process), a reader following
a writer of the same process, timeouts, and the registry.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lamina

pytestmark = pytest.mark.usefixtures("fast_native")


class TestInProcess:
    """Behaviour every file engine must show (run once per engine)."""

    @settings(max_examples=30)
    @given(
        name=st.text(min_size=1, max_size=20),
        value=st.one_of(
            st.text(max_size=50),
            st.lists(st.text(max_size=10), min_size=1, max_size=5),
            st.integers(-(2**70), 2**70),
            st.floats(),
            st.complex_numbers(),
            st.booleans(),
            hnp.arrays(
                hnp.scalar_dtypes(),
                hnp.array_shapes(min_dims=0, max_dims=3, max_side=3),
            ),
        ),
    )
    def test_any_accepted_attribute_reopens(self, engine, new_path, name, value):
        """Whatever set accepts, a reader can open and gets back; the rest is refused at once."""
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            try:
                f.attrs[name] = value
            except (ValueError, TypeError) as e:
                assert isinstance(e, lamina.LaminaError) or "attribute" in str(e)
                accepted = False
            else:
                accepted = True
        with lamina.open(path, "r", engine=engine) as f:
            if not accepted:
                assert name not in f.attrs
                return
            got = f.attrs[name]
            if isinstance(value, str):
                assert got == value
            elif isinstance(value, list):  # a list of strings comes back as an array, as in h5py
                assert got.tolist() == value and got.dtype == object
            else:
                expect = np.asarray(value)
                np.testing.assert_array_equal(np.asarray(got), expect)
                g = np.asarray(got).dtype  # 0-D come back as numpy scalars, in native byte order
                assert (g.kind, g.itemsize) == (expect.dtype.kind, expect.dtype.itemsize)
        lamina.engines.memory.drop(path)

    def test_attribute_arrays_are_the_callers_own(self, engine, new_path):
        """An attribute array read back is a copy, as h5py's: changing it changes neither what
        is committed nor what the next read returns."""
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            f.attrs["a"] = np.arange(3)
            f.attrs["a"][0] = 100
        with lamina.open(path, "r", engine=engine) as f:
            got = f.attrs["a"]
            got[1] = -7
            assert f.attrs["a"].tolist() == [0, 1, 2]

    def test_a_second_writer_is_refused(self, engine, new_path):
        """One writer at a time, in this process too: the second open raises LockError and the
        first writer's steps stay readable."""
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            x = f.create_dataset("x", (2,))
            with f.step():
                x[...] = 1
            for mode in ("a", "w"):
                with pytest.raises(lamina.LockError):
                    lamina.open(path, mode, engine=engine)
            with f.step():
                x[...] = 2
        with lamina.open(path, "a", engine=engine) as f:  # the writer closed: free again
            assert f.steps == 2
        with lamina.open(path, "r", engine=engine) as f:
            assert f.steps == 2 and f["x"][...].tolist() == [2.0, 2.0]

    def test_writes_match_numpy_where_lamina_chose_to(self, engine, new_path):
        """A dataset seen at a committed step is read-only; a numpy integer scalar that does not
        fit is refused as numpy refuses it (arrays cast within a kind, as numpy's); a read
        into a masked array fills its data; a read box of another step is a TypeError naming
        the dataset."""
        path = new_path()
        with lamina.open(path, "w", engine=engine) as f:
            x = f.create_dataset("x", (4,), dtype="i1")
            with f.step():
                x[...] = np.arange(4, dtype=np.int8)
            with pytest.raises(lamina.ModeError, match="committed step 0"):
                f.at(0)["x"][2:4] = [9, 9]
            with pytest.raises(lamina.ModeError):
                f.at(0)["x"].write(np.zeros(2, np.int8), offset=(0,))
            for v in (np.int64(300), np.uint8(200), np.uint16(65535)):
                with pytest.raises(lamina.RangeError, match="beyond the range of dtype int8"):
                    x[0] = v
            with f.step():
                x[...] = np.int64(-5)  # fits: taken
        with lamina.open(path, "r", engine=engine) as f:
            assert f.steps == 2 and f["x"][...].tolist() == [-5] * 4
            out = np.ma.zeros(4, dtype=np.int8)
            f["x"].read(np.s_[:], step=0, out=out)
            assert out.data.tolist() == [0, 1, 2, 3]
            with pytest.raises(TypeError, match="dataset '/x'.*step 1"):
                f["x"].read(np.s_[::2])

    def test_reader_follows_writer(self, engine, new_path):
        path = new_path()
        w = lamina.open(path, "w", engine=engine)
        try:
            ds = w.create_dataset("x", shape=(2,), dtype="i4")
            with w.step():
                ds[...] = [1, 1]
            r = lamina.open(path, "r", engine=engine)
            try:
                assert r.steps == 1 and not r.engine.writer_closed
                with w.step():
                    ds[...] = [2, 2]
                assert r.steps == 1
                assert r.refresh() == 2
                np.testing.assert_array_equal(r["x"][...], [2, 2])
                assert r.wait_for_step(1, timeout=1).index == 1
                w.close()
                r.refresh()
                assert r.engine.writer_closed
                assert [v.index for v in r.iter_steps(timeout=1)] == [0, 1]
                # counted from the end once (it went -2, -1, 0, 1: [0, 1, 0, 1])
                assert [v.index for v in r.iter_steps(start=-2, timeout=1)] == [0, 1]
                assert [v.index for v in r.iter_steps(start=-1, timeout=1)] == [1]
                with pytest.raises(lamina.StepError, match=r"start=-3.* 2 committed steps"):
                    next(iter(r.iter_steps(start=-3, timeout=1)))
                with pytest.raises(lamina.StepError, match="never exist"):
                    r.wait_for_step(5, timeout=1)
            finally:
                r.close()
        finally:
            w.close()

    def test_lists_and_masks_read_as_numpy_indexes(self, engine, new_path):
        """One list of indices or boolean mask a read (h5py's rule), with numpy's result; a
        write of one stays refused, saying reads take them."""
        path = new_path()
        a = np.arange(6 * 7 * 8, dtype="f4").reshape(6, 7, 8)
        with lamina.open(path, "w", engine=engine) as w:
            ds = w.create_dataset("x", shape=a.shape, dtype="f4")
            with w.step():
                ds[:3] = a[:3]
                ds[3:] = a[3:]
            with lamina.open(path, "r", engine=engine) as r:
                x = r["x"]
                for key in (
                    [4, 0, 0, -1],
                    (0, slice(None), [7, 1]),
                    (a[..., 0] > 50,),
                    (..., a[0, 0] > 3),
                ):
                    np.testing.assert_array_equal(x[key], a[key])
            with pytest.raises(
                lamina.SelectionError, match=r"unsupported index \[0, 2\].*reads only"
            ):
                with w.step():
                    ds[[0, 2]] = 1.0

    def test_following_calls_on_a_closed_file_are_a_value_error(self, engine, new_path):
        """refresh of a closed reader was mpi4py's 'Invalid communicator', of a closed writer
        a step count; wait_for_step a StepError: as every call on a closed file, ValueError."""
        path = new_path()
        w = lamina.open(path, "w", engine=engine)
        w.create_dataset("x", shape=(1,))
        with w.step():
            pass
        r = lamina.open(path, "r", engine=engine)
        r.close()
        w.close()
        for f in (r, w):
            with pytest.raises(ValueError, match=r"cannot refresh: file .* is closed"):
                f.refresh()
            with pytest.raises(ValueError, match=r"cannot wait for a step: file .* is closed"):
                f.wait_for_step(0, timeout=0)
            with pytest.raises(ValueError, match=r"cannot iterate over steps: file .* is closed"):
                next(iter(f.iter_steps(timeout=0)))

    def test_wait_for_a_step_counted_from_the_end(self, engine, new_path):
        """wait_for_step(-k) waits until there are k steps (it raised 'step -1 does not exist'
        at once on a file with no step yet), then gives the k-th from the last."""
        path = new_path()
        with lamina.open(path, "w", engine=engine) as w:
            ds = w.create_dataset("x", shape=(1,), dtype="i4")
            with lamina.open(path, "r", engine=engine) as r:
                with pytest.raises(
                    lamina.StepTimeoutError, match=r"no step -1 .*\(0 steps committed\)"
                ):
                    r.wait_for_step(-1, timeout=0.1, poll=0.01)
                with w.step():
                    pass
                assert r.wait_for_step(-1, timeout=30, poll=0.01).index == 0
                with w.step():
                    ds[...] = [5]
                r.refresh()
                assert r.wait_for_step(-1, timeout=1).index == 1
                assert r.wait_for_step(-2, timeout=1).index == 0
                with pytest.raises(lamina.StepTimeoutError, match=r"no step -3"):
                    r.wait_for_step(-3, timeout=0.1, poll=0.01)

    def test_wait_for_step_times_out(self, engine, new_path):
        path = new_path()
        with lamina.open(path, "w", engine=engine) as w:
            w.create_dataset("x", shape=(1,))
            with w.step():
                pass
            with lamina.open(path, "r", engine=engine) as r:
                with pytest.raises(lamina.StepTimeoutError, match="no step 3"):
                    r.wait_for_step(3, timeout=0.1, poll=0.01)
                # a poll longer than the timeout waits no longer than the timeout (it waited
                # the whole poll: 8 s under a timeout of 1 s)
                t0 = time.monotonic()
                with pytest.raises(lamina.StepTimeoutError, match="no step 3"):
                    r.wait_for_step(3, timeout=0.2, poll=30)
                with pytest.raises(lamina.StepTimeoutError):
                    next(iter(r.iter_steps(start=1, timeout=0.2, poll=30)))
                assert time.monotonic() - t0 < 10

    @settings(max_examples=25)
    @given(data=st.data())
    def test_random_writes_and_reads(self, engine, new_path, data):
        """Random disjoint boxes written, random selections read back, against a numpy model."""
        shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3), label="shape"))
        nparts = data.draw(st.integers(1, 6), label="nparts")
        parts = lamina.geometry.decompose(shape, nparts)
        keep = data.draw(st.lists(st.booleans(), min_size=nparts, max_size=nparts), label="keep")
        path = new_path()
        model = np.full(shape, -1, dtype="i8")
        with lamina.open(path, "w", engine=engine) as f:
            ds = f.create_dataset("r", shape=shape, dtype="i8", fill=-1)
            with f.step():
                for b, k in zip(parts, keep, strict=True):
                    if k:
                        v = np.arange(b.size, dtype="i8").reshape(b.shape) + 100 * b.start[0]
                        ds[b.slices] = v
                        model[b.slices] = v
        with lamina.open(path, "r", engine=engine) as f:
            ds = f["r"]
            np.testing.assert_array_equal(ds[...], model)
            for _ in range(3):
                key = tuple(
                    slice(a, data.draw(st.integers(a, n)), data.draw(st.integers(1, 3)))
                    for n in shape
                    for a in [data.draw(st.integers(0, n))]
                )
                np.testing.assert_array_equal(ds[key], model[key])
            assert sum(b.size for b in ds.coverage()) == int(
                sum(b.size for b, k in zip(parts, keep, strict=True) if k)
            )
        lamina.engines.memory.drop(path)


# --------------------------------------------------------------------------
# native-only options


@pytest.mark.parametrize(
    "options", [{"durable": False}, {"aggregators": 1}, {"durable": True, "aggregators": 1}]
)
def test_native_options(native_path, options, rng):
    a = rng.standard_normal((5, 5))
    with lamina.open(native_path, "w", engine="native", **options) as f:
        f.create_dataset("a", shape=(5, 5), dtype="f8")[...] = a
    with lamina.open(native_path, "r", engine="native") as f:
        np.testing.assert_array_equal(f["a"][...], a)


def test_default_engine_is_native_and_env_override(tmp_path, monkeypatch):
    p = str(tmp_path / "d.lam")
    with lamina.open(p, "w") as f:
        assert f.engine.name == "native"
    monkeypatch.setenv("LAMINA_ENGINE", "memory")
    with lamina.open("mem://env", "w") as f:
        assert f.engine.name == "memory"
    lamina.engines.memory.drop("mem://env")


def test_engine_registry():
    from lamina.engines import registry

    assert {"native", "memory", "mpi", "both"} <= set(registry.engine_names())
    assert registry.engine_entry("memory").factory("w").name == "memory"
    assert registry.layer_names() == ["background", "derived"]
    assert registry.default_layers() == ["derived"]  # background comes with io="async"
    with pytest.raises(ValueError, match="unknown engine 'memroy'.*Did you mean 'memory'"):
        registry.engine_entry("memroy")
    with pytest.raises(ValueError, match="unknown layer 'derivd'.*Did you mean 'derived'"):
        registry.layer_entry("derivd")


def test_memory_files_are_shared_in_process_and_dropped():
    from lamina.engines import memory

    with lamina.open("mem://shared", "w", engine="memory") as f:
        f.create_dataset("x", shape=(1,))[...] = 4.0
    with lamina.open("mem://shared", "r", engine="memory") as f:
        assert f["x"][0] == 4.0
    memory.drop("mem://shared")
    with pytest.raises(FileNotFoundError):  # as a file on disk that is not there
        lamina.open("mem://shared", "r", engine="memory")


def test_memory_files_are_one_file_under_every_spelling_and_followed_when_re_created(tmp_path):
    """'./x.lam', its absolute path and 'x.lam/' were three stores: a reader of another
    spelling found nothing, and a second writer wrote to an empty store without LockError.
    A reader of a store re-created ('w') read the old one on; a missing one was a
    NotALaminaFileError (a file on disk: FileNotFoundError)."""
    import os

    from lamina.engines import memory

    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        with lamina.open("x.lam", "w", engine="memory") as f:
            f.create_dataset("a", shape=(2,))[...] = 1.0
            with pytest.raises(lamina.LockError):
                lamina.open(str(tmp_path / "x.lam") + "/", "a", engine="memory")
        with lamina.open(str(tmp_path / "x.lam"), "r", engine="memory") as r:
            assert r["a"][...].tolist() == [1.0, 1.0]
            with lamina.open("./x.lam", "w", engine="memory") as w:
                w.create_dataset("a", shape=(2,))[...] = 9.0
            with pytest.raises(lamina.FormatError, match="re-created"):
                r.refresh()
        with pytest.raises(FileNotFoundError, match="after waiting"):
            lamina.open("y.lam", "r", engine="memory", wait=0.1)
    finally:
        os.chdir(old)
        memory.drop(str(tmp_path / "x.lam"))


# --------------------------------------------------------------------------
# the seam: the interface, the layers, the registry


def test_layers_forward_the_whole_interface_explicitly():
    """Every public name of Engine is defined on Layer itself; nothing reaches the inner engine implicitly."""
    from lamina.engines.base import Engine
    from lamina.layers import DerivedLayer, Layer

    public = {n for n in dir(Engine) if not n.startswith("_") and n not in ("OPTIONS", "is_layer")}
    missing = sorted(n for n in public if n not in Layer.__dict__)
    assert missing == [], f"Layer does not forward {missing}"
    for cls in (Layer, DerivedLayer):
        assert "__getattr__" not in vars(cls) and "__getattribute__" not in vars(cls)
    with lamina.open("mem://seam", "w", engine="memory") as f:
        with pytest.raises(AttributeError):
            f.engine.session  # an attribute of the memory engine, not of the interface  # noqa: B018
        assert [type(e).__name__ for e in f.engine.stack()] == ["DerivedLayer", "MemoryEngine"]
        with pytest.raises(AttributeError, match="inner engine"):
            f.engine.mode = "r"
    lamina.engines.memory.drop("mem://seam")


def test_engine_options_are_filtered_by_the_registry(tmp_path):
    # the transport's options mean nothing to files: accepted and ignored, so programs run unchanged
    with lamina.open(tmp_path / "a.lam", "w", timeout=5, queue_limit=3, durable=False) as f:
        assert f.engine.name == "native"
    with pytest.raises(
        TypeError, match=r"unknown option\(s\) \['aggregators'\] for engine 'memory'"
    ):
        lamina.open("mem://opts", "w", engine="memory", aggregators=2)
    with pytest.raises(TypeError, match="accepted: .*aggregators.*device.*durable"):
        lamina.open(tmp_path / "b.lam", "w", agregators=2)
    with pytest.raises(ValueError, match="device must be"):
        lamina.open(tmp_path / "c.lam", "w", device="tpu")


def test_layers_argument(tmp_path):
    with lamina.open(tmp_path / "bare.lam", "w", layers=[]) as f:
        assert [type(e).__name__ for e in f.engine.stack()] == ["NativeEngine"]
        f.create_dataset("x", shape=(4,))
        with pytest.raises(NotImplementedError, match="'derived' layer"):
            f.derive("y", "2 * x")
        assert f.derived == {}
    with lamina.open(tmp_path / "bare.lam", "r", layers=["derived"]) as f:
        assert [type(e).__name__ for e in f.engine.stack()] == ["DerivedLayer", "NativeEngine"]
    with pytest.raises(ValueError, match="unknown layer 'derivd'.*Did you mean 'derived'"):
        lamina.open(tmp_path / "bare.lam", "r", layers=["derivd"])
    with pytest.raises(TypeError, match="unknown option"):
        lamina.open(tmp_path / "bare.lam", "r", layers=[], device="cpu")  # no layer takes it now


@pytest.mark.parametrize("layers", [[], ["derived"]])
def test_engine_counts_the_stored_bytes_its_reads_take(tmp_path, layers):
    """bytes_read, with or without the derived layer: a raw block's part in the box, a
    compressed block whole, nothing for the fill value outside every block, and nothing for
    a read that fails."""
    path = tmp_path / "count.lam"
    with lamina.open(path, "w", layers=layers) as f:
        u = f.create_dataset("u", shape=(8, 6), dtype="f8")
        z = f.create_dataset("z", shape=(64,), dtype="f8", compression="zstd")
        with f.step():
            u.write(np.ones((4, 6)), offset=(0, 0))
            u.write(np.ones((2, 6)), offset=(6, 0))  # rows 4 and 5 hold no block
            z.write(np.zeros(64))
    with lamina.open(path, "r", layers=layers) as f:
        e = f.engine
        stored = f["z"].blocks(0)[0].nbytes
        assert 0 < stored < 64 * 8
        for read, want in [
            (lambda: f["u"][...], (4 + 2) * 6 * 8),  # the fill rows cost nothing
            (lambda: f["u"][1:3, 2:5], 2 * 3 * 8),  # the part of one block
            (lambda: f["u"][4:6], 0),  # only the fill value
            (lambda: f["u"][3:7, 0], 2 * 8),  # the parts of two blocks
            (lambda: f["z"][10:20], stored),  # a compressed block is read whole
        ]:
            before = e.bytes_read
            read()
            assert e.bytes_read - before == want
        before = e.bytes_read
        with pytest.raises(lamina.BoundsError):
            f["u"].read(lamina.Box((0, 0), (9, 6)))
        assert e.bytes_read == before


def test_registering_an_engine_and_entry_points(tmp_path, monkeypatch):
    from importlib.metadata import EntryPoint

    from lamina.engines import memory, registry

    class Tagged(memory.MemoryEngine):
        OPTIONS = memory.MemoryEngine.OPTIONS | {"tag"}

        def _open_storage(self, path, mode):
            self.tag = self.options.get("tag")
            super()._open_storage(path, mode)

    registry.register_engine("tagged", lambda mode: Tagged(), Tagged.OPTIONS)
    try:
        with pytest.raises(ValueError, match="already registered"):
            registry.register_engine("tagged", lambda mode: Tagged())
        with lamina.open("mem://tagged", "w", engine="tagged", tag="t1") as f:
            assert f.engine.stack()[-1].tag == "t1"
            f.create_dataset("x", shape=(1,))[...] = 3.0
        with lamina.open("mem://tagged", "r", engine="memory") as f:
            assert f["x"][0] == 3.0
    finally:
        registry._ENGINES.pop("tagged", None)
        memory.drop("mem://tagged")

    # an installed package's engine, found through the lamina.engines entry point group
    eps = [
        EntryPoint("from-package", "lamina.engines.memory:MemoryEngine", "lamina.engines"),
        EntryPoint("broken", "lamina.no_such_module:Engine", "lamina.engines"),
        EntryPoint("not-an-engine", "lamina.geometry:Box", "lamina.engines"),
    ]
    monkeypatch.setattr(
        registry, "_entry_points", lambda group: [e for e in eps if e.group == group]
    )
    monkeypatch.setattr(registry, "_LOADED", set())
    try:
        with pytest.warns(UserWarning) as warned:
            names = registry.engine_names()
        assert "from-package" in names and "broken" not in names and "not-an-engine" not in names
        assert any("cannot load" in str(w.message) for w in warned)
        assert any("not a lamina Engine subclass" in str(w.message) for w in warned)
        with lamina.open("mem://ep", "w", engine="from-package") as f:
            assert f.engine.name == "memory"
    finally:
        registry._ENGINES.pop("from-package", None)
        memory.drop("mem://ep")


def test_an_open_file_collected_says_so(tmp_path, recwarn, monkeypatch):
    """A file dropped open said nothing (a writer's last changes lost, the file locked in this
    process); as Python's own files, a ResourceWarning. A closed one collects silently, and
    so does the File of an open that failed."""
    import gc

    f = lamina.open(tmp_path / "dropped.lam", "w")
    f.create_dataset("x", (2,))
    with pytest.warns(ResourceWarning, match=r"unclosed lamina file .*dropped\.lam.*mode 'w'"):
        del f
        gc.collect()
    g = lamina.open(tmp_path / "closed.lam", "w")
    g.close()
    recwarn.clear()
    del g
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(FileNotFoundError):
        lamina.open(tmp_path / "missing.lam", "r")
    gc.collect()
    assert not [w for w in recwarn if issubclass(w.category, ResourceWarning)]
    assert not unraisable, [u.exc_value for u in unraisable]


@pytest.mark.parametrize("end", ["close", "abandon"])
def test_a_closed_writer_keeps_no_staging_buffers(tmp_path, end):
    """A closed engine lives on in reference cycles until the cycle collector runs: it held
    its pool of staging buffers (4 MiB each) all that time, 64 MiB after 200 open-write-close
    cycles of one process."""
    f = lamina.open(tmp_path / "f.lam", "w")
    eng = f.engine.stack()[-1]
    f.create_dataset("x", (64, 64))
    for k in range(3):
        with f.step():
            f["x"][...] = np.full((64, 64), float(k))
    assert eng._free_chunks  # the pool this test is about
    if end == "close":
        f.close()
    else:
        eng.abandon()
        f.close()
    assert eng._free_chunks == []
