"""The cost model of derived-quantity strategies (lamina.perf), its calibration, its command, and
``lamina bench derived``."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_util  # noqa: E402

import lamina.bench
import lamina.cli
import lamina.perf
from lamina.errors import ExpressionError, LaminaWarning
from lamina.perf import (
    Calibration,
    calibrate,
    default_path,
    load_calibration,
    parse_bandwidth,
    predict,
    recommend,
)
from lamina.perf.model import combine

CAL = perf_util.CAL
# the module (the package's name ``calibrate`` is the function)
calmod = importlib.import_module("lamina.perf.calibrate")
MAG = "magnitude(vx,vy,vz)"
SHAPE = (100, 100, 100)  # N = 1e6


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-18)


# ------------------------------------------------------------------ model
def test_magnitude_by_hand():
    p = predict(MAG, SHAPE, "f8", nblocks=64, query_fraction=0.1, readers=3, calibration=CAL)
    assert list(p) == ["store", "stats", "expression"]
    # N = 1e6, k = 3, c = 1: S_in = 24e6, S_d = 8e6; b = 32, f = 6
    t_c = max(32e6 / 10e9, 6e6 / 1e9)  # 6 ms: bound by the operation rate
    t_st = 8e6 / 8e9
    t_g = 2 * 24e6 / 20e9  # 64 blocks: the inputs copied into the box of a writer's blocks
    assert p["store"].write_s == approx(t_g + t_c + t_st + 8e6 / 2e9)
    assert p["stats"].write_s == approx(t_g + t_c + t_st)
    assert p["expression"].write_s == 0.0
    assert p["store"].read_s == approx(0.1 * 8e6 / 4e9)
    assert p["stats"].read_s == approx(0.1 * (24e6 / 4e9 + t_c))
    # every block computed for its range; a scalar's candidate values kept from there
    assert p["expression"].read_s == approx(24e6 / 4e9 + t_c)
    # Eq. 3: a block row is 78 + 16 d bytes, a section 56; the definition is the extension record
    # "derived:derived" (the default name) and the dataset record, plus the strategy's name
    ext = 1 + (4 + len("derived:derived")) + 8 + 1 + (4 + len(MAG)) + 4 + 1 + 3 * 8 + (4 + 2)
    dataset = 1 + 4 + (4 + len("derived")) + (4 + len("<f8")) + 1 + 3 * 8 + 8 + (4 + 2)
    s_def = ext + dataset
    assert p["store"].storage_bytes == 8_000_000 + 64 * 126 + 56 + s_def + len("store")
    assert p["stats"].storage_bytes == 64 * 126 + 56 + s_def + len("stats")
    assert p["expression"].storage_bytes == s_def + len("expression")
    for s in p.values():
        assert s.total_s == approx(s.write_s + 3 * s.read_s)
        assert s.primary_write_s == approx(24e6 / 2e9)
        assert set(s.as_dict()) >= {"strategy", "compute_s", "write_s", "read_s", "total_s"}
    assert p["store"].compute_s == approx(t_c)
    assert p["stats"].compute_s == approx(t_c + 3 * 0.1 * t_c)
    assert p["expression"].compute_s == approx(3 * t_c)
    assert {s.source for s in p.values()} == {"calibration"}


def test_roofline_memory_bound_and_stencil():
    fast = dataclasses.replace(CAL, flop_rate=1e15)
    t = lamina.perf.terms("a + b", (1000, 1000), calibration=fast)
    assert t.compute_s == approx(24 * 1e6 / 10e9)  # b = 2*8 in + 8 out, kernel bandwidth
    t = lamina.perf.terms("curl(u, v, w)", SHAPE, calibration=fast)
    assert t.components == 3 and t.derived_bytes == 24_000_000
    assert t.compute_s == approx(48 * 1e6 / 5e9)  # stencil bandwidth
    t = lamina.perf.terms("curl(u, v, w)", SHAPE, "f4", nblocks=4, calibration=CAL)
    assert t.stats_bytes == 3 * (4 * (78 + 16 * 3) + 56) and t.input_bytes == 12_000_000
    assert t.compute_s == approx(t.flops_per_element * 1e6 / 1e9)


def test_read_time_and_fraction():
    base = dict(calibration=CAL, readers=1)
    p1 = predict(MAG, SHAPE, query_fraction=0.1, **base)
    p2 = predict(MAG, SHAPE, query_fraction=0.4, **base)
    assert p2["store"].read_s == approx(4 * p1["store"].read_s)
    assert p2["stats"].read_s == approx(4 * p1["stats"].read_s)
    assert p2["expression"].read_s == p1["expression"].read_s  # no pruning
    # a vector: every block for the ranges, the candidates again for the other components
    c1 = predict("curl(vx, vy, vz)", SHAPE, query_fraction=0.1, **base)["expression"]
    c2 = predict("curl(vx, vy, vz)", SHAPE, query_fraction=0.4, **base)["expression"]
    assert c2.read_s == approx(1.4 / 1.1 * c1.read_s)
    # every block a candidate: the values are read over the box the layer computed, once
    c3 = predict("curl(vx, vy, vz)", SHAPE, query_fraction=1.0, **base)["expression"]
    assert c3.read_s == approx(c1.read_s / 1.1)
    slow = predict(MAG, SHAPE, query_fraction=0.1, read_bandwidth=1e9, write_bandwidth=1e9, **base)
    assert slow["store"].read_s == approx(0.1 * 8e6 / 1e9)
    assert slow["store"].primary_write_s == approx(24e6 / 1e9)


def test_recommendation():
    assert recommend(MAG, SHAPE, readers=0, query_fraction=0.01, calibration=CAL)[0] == "expression"
    name, p = recommend(MAG, SHAPE, readers=100, query_fraction=0.01, calibration=CAL)
    assert name == "store"
    assert p["store"].total_s < p["stats"].total_s < p["expression"].total_s
    # one reader of everything: 12 ms (read the inputs, compute) against 13 ms for store
    # (compute 6, statistics 1, write 4, then read 2) and 19 ms for stats
    name, p = recommend(MAG, SHAPE, readers=1, query_fraction=1.0, calibration=CAL)
    assert name == "expression"
    assert [p[s].total_s for s in ("store", "stats", "expression")] == [
        approx(0.013),
        approx(0.019),
        approx(0.012),
    ]
    # one reader of a tenth: 12 ms for expression, 7 + 1.2 for stats, 11 + 0.2 for store
    name, p = recommend(MAG, SHAPE, readers=1, query_fraction=0.1, calibration=CAL)
    assert name == "stats" and p["expression"].total_s == approx(0.012)
    assert p["stats"].total_s == approx(0.0082) and p["store"].total_s == approx(0.0112)
    # a tie (nothing to compute or move) goes to the least storage: the definition alone
    # (expression) is smaller than the definition and a block record (store, stats)
    name, p = recommend(MAG, (0, 10, 10), readers=5, calibration=CAL)
    assert all(s.total_s == 0 for s in p.values()) and name == "expression"
    assert p["store"].storage_bytes == p["stats"].storage_bytes > p["expression"].storage_bytes
    name, p = recommend("a", (0,), readers=5, nblocks=1000, calibration=CAL)
    assert name == "expression"


def test_storage_checksums_of_large_blocks():
    # 8 blocks of 16 MiB: each stored block has 4 checksum segments, 3 more than one
    t = lamina.perf.terms(MAG, (64, 512, 512), nblocks=8, calibration=CAL)
    assert t.checksum_bytes == 8 * 3 * 4
    p = predict(MAG, (64, 512, 512), nblocks=8, calibration=CAL)
    assert p["store"].storage_bytes - p["stats"].storage_bytes == t.derived_bytes + 96
    assert lamina.perf.terms(MAG, SHAPE, nblocks=8, calibration=CAL).checksum_bytes == 0


def _file_bytes(path) -> int:
    return sum(q.stat().st_size for q in path.rglob("*") if q.is_file())


@pytest.mark.parametrize(
    "name, expr, shape, dtype",
    [
        ("vmag", "magnitude(vx, vy, vz)", (8, 6, 5), "f8"),
        ("omega", "curl(vx, vy, vz)", (8, 6, 5), "f8"),
        ("s", "vx + 2 * vy", (12, 10), "f4"),
    ],
)
@pytest.mark.parametrize("nblocks", [2, 4])
def test_storage_is_what_lamina_writes(tmp_path, name, expr, shape, dtype, nblocks):
    """Eq. 3 to the byte: each file minus the same file without the derived quantity."""
    import numpy as np

    import lamina

    rows = shape[0] // nblocks

    def write(path, strategy):
        with lamina.open(path, "w", durable=False) as f:
            dss = {p: f.create_dataset(p, shape, dtype) for p in ("vx", "vy", "vz")}
            if strategy is not None:
                f.derive(name, expr, strategy=strategy)
            with f.step():
                for i, ds in enumerate(dss.values()):
                    for b in range(nblocks):
                        block = np.full((rows, *shape[1:]), i + b + 1.0, dtype=dtype)
                        ds.write(block, offset=(b * rows,) + (0,) * (len(shape) - 1))
        return _file_bytes(path)

    base = write(tmp_path / "base.lam", None)
    p = predict(expr, shape, dtype, nblocks=nblocks, calibration=CAL, name=name)
    for s in ("store", "stats", "expression"):
        assert write(tmp_path / f"{s}.lam", s) - base == p[s].storage_bytes, s


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"query_fraction": 1.5}, "query_fraction"),
        ({"query_fraction": -0.1}, "query_fraction"),
        ({"query_fraction": math.nan}, "query_fraction"),
        ({"readers": -1}, "readers"),
        ({"readers": 1.5}, "readers"),
        ({"readers": True}, "readers"),
        ({"read_bandwidth": 0}, "read_bandwidth"),
        ({"write_bandwidth": -1e9}, "write_bandwidth"),
        ({"read_bandwidth": math.inf}, "read_bandwidth"),
        ({"nblocks": 0}, "nblocks"),
    ],
)
def test_bad_parameters(kw, word):
    with pytest.raises(ValueError, match=word):
        predict(MAG, SHAPE, calibration=CAL, **kw)


def test_bad_expressions():
    with pytest.raises(ExpressionError, match="position"):
        predict("magnitude(vx,,vy)", SHAPE, calibration=CAL)
    with pytest.raises(ExpressionError):
        predict("curl(u, v, w)", (10, 10), calibration=CAL)  # a 3-D stencil on 2-D data


# ------------------------------------------------------------ calibration
def test_json_round_trip():
    assert Calibration.from_json(CAL.to_json()) == CAL
    assert Calibration.from_json(CAL.to_json().encode()) == CAL


def _doc(**change):
    d = json.loads(CAL.to_json())
    d.update(change)
    return d


@pytest.mark.parametrize(
    "text, key",
    [
        (json.dumps(_doc(flop_rate="fast")), "flop_rate"),
        (json.dumps(_doc(read_bandwidth=-1.0)), "read_bandwidth"),
        (json.dumps(_doc(write_bandwidth=0)), "write_bandwidth"),
        (json.dumps(_doc(kernel_bandwidth=True)), "kernel_bandwidth"),
        (json.dumps(_doc(host=5)), "host"),
        (json.dumps(_doc(version="1")), "version"),
        (json.dumps(_doc(created=-3)), "created"),
        (json.dumps(_doc(extra=1)), "extra"),
        (
            json.dumps({k: v for k, v in _doc().items() if k != "stats_bandwidth"}),
            "stats_bandwidth",
        ),
        (CAL.to_json().replace("4000000000.0", "NaN"), "NaN"),
        (json.dumps(_doc(fresh_copy_bandwidth=-1)), "fresh_copy_bandwidth"),
        (json.dumps(_doc(fresh_copy_bandwidth=False)), "fresh_copy_bandwidth"),
        (json.dumps(_doc(created=True)), "created"),
        (json.dumps(_doc(block_seconds=[1])), "block_seconds"),
        (json.dumps(_doc(block_seconds={"fast": [[1, 1]]})), "unknown kind 'fast'"),
        (json.dumps(_doc(block_seconds={"read": []})), r"block_seconds\['read'\]"),
        (json.dumps(_doc(block_seconds={"read": [[1, 1]] * 17})), "1 to 16"),
        (json.dumps(_doc(block_seconds={"read": [[2, 1], [1, 1]]})), "sizes must increase"),
        (json.dumps(_doc(block_seconds={"read": [[1, 0]]})), "finite numbers > 0"),
        (json.dumps(_doc(block_seconds={"read": [[1, True]]})), "finite numbers > 0"),
        (json.dumps(_doc(block_seconds={"read": [[1, 2, 3]]})), "pair"),
        # integers too large for a float: a ValueError naming the key, not an OverflowError
        (json.dumps(_doc(flop_rate=10**400)), "flop_rate"),
        (json.dumps(_doc(fresh_copy_bandwidth=10**400)), "fresh_copy_bandwidth"),
        (json.dumps(_doc(block_seconds={"read": [[10**400, 1]]})), "finite numbers > 0"),
        ("[1, 2]", "object"),
        ("", "JSON"),
        (b"\xff\xfe\x00\x01garbage", "UTF-8"),
        ("{" * 100_000, "calibration"),
    ],
)
def test_corrupt_calibration(text, key):
    with pytest.raises(ValueError, match=key):
        Calibration.from_json(text)


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("LAMINA_CALIBRATION", str(tmp_path / "mine.json"))
    assert default_path() == str(tmp_path / "mine.json")
    monkeypatch.delenv("LAMINA_CALIBRATION")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_path() == str(tmp_path / "xdg" / "lamina" / "calibration.json")


def test_load_uses_cache_and_remeasures(monkeypatch, tmp_path):
    path = tmp_path / "sub" / "cal.json"
    monkeypatch.setenv("LAMINA_CALIBRATION", str(path))
    here = dataclasses.replace(CAL, host=calmod.host())
    measured = []

    def fake(quick=False, directory=None):
        measured.append(quick)
        return dataclasses.replace(here, flop_rate=7e9)

    monkeypatch.setattr(calmod, "calibrate", fake)
    with pytest.raises(FileNotFoundError):
        load_calibration(measure=False)
    notes = []
    got = load_calibration(quick=True, on_measure=notes.append)  # missing: measured and saved
    assert got.flop_rate == 7e9 and measured == [True] and notes == [str(path)]
    assert Calibration.from_json(path.read_text()) == got
    assert load_calibration() == got and measured == [True]  # cached now
    path.write_text(here.to_json())
    assert load_calibration() == here  # this host: used as is
    path.write_text(CAL.to_json())  # another host
    with pytest.raises(ValueError, match="host"):
        load_calibration(measure=False)
    assert load_calibration().flop_rate == 7e9 and len(measured) == 2
    path.write_text(dataclasses.replace(here, version=99).to_json())  # a newer lamina's
    with pytest.warns(LaminaWarning, match="newer lamina"):
        assert load_calibration().version == calmod.CALIBRATION_VERSION and len(measured) == 3
    assert json.loads(path.read_text())["version"] == 99  # measured here, not saved there
    path.write_text(dataclasses.replace(here, version=1).to_json())  # an older one's
    assert load_calibration().version == calmod.CALIBRATION_VERSION and len(measured) == 4
    assert json.loads(path.read_text())["version"] == calmod.CALIBRATION_VERSION
    path.write_bytes(b"\x00garbage")
    with pytest.raises(ValueError), pytest.warns(LaminaWarning, match="ignored"):
        load_calibration(measure=False)
    with pytest.warns(LaminaWarning, match="ignored"):  # a file there, refused: said
        assert load_calibration().flop_rate == 7e9 and len(measured) == 5


def test_another_hosts_calibration_at_the_path_is_kept(monkeypatch, tmp_path):
    """A calibration of another host at the same path (a shared home directory) was
    replaced by this host's: each host measured again at every run, in turn.  Both are
    kept; a file of one host, as written before, is that host's."""
    path = tmp_path / "cal.json"
    theirs = dataclasses.replace(CAL, host="login01", flop_rate=1e9)
    path.write_text(theirs.to_json())  # the form of one host
    here = dataclasses.replace(CAL, host=calmod.host(), flop_rate=7e9)
    measured = []

    def fake(quick=False, directory=None):
        measured.append(1)
        return here

    monkeypatch.setattr(calmod, "calibrate", fake)
    assert load_calibration(str(path)) == here and len(measured) == 1
    assert load_calibration(str(path)) == here and len(measured) == 1  # cached beside theirs
    me = calmod.host()
    monkeypatch.setattr(calmod, "host", lambda: "login01")
    assert load_calibration(str(path)) == theirs and len(measured) == 1
    later = dataclasses.replace(theirs, flop_rate=2e9, created=CAL.created + 1)
    calmod.save_calibration(later, str(path))
    assert calmod.cached(str(path)) == later
    monkeypatch.setattr(calmod, "host", lambda: me)
    assert calmod.cached(str(path)) == here
    doc = json.loads(path.read_text())
    assert doc["host"] == "login01" and set(doc["others"]) == {me}


def test_a_calibration_of_a_newer_lamina_is_neither_read_nor_replaced(monkeypatch, tmp_path):
    """A calibration file written by a newer lamina (a newer calibration version) was
    replaced by this lamina's: two lamina versions sharing a home directory measured again in
    turn, each losing the other's.  It is now neither read nor replaced, with one warning
    naming the path; this lamina measures for itself."""
    path = tmp_path / "cal.json"
    doc = {**CAL.as_doc(), "version": calmod.CALIBRATION_VERSION + 1, "new_rate": 1.0}
    text = json.dumps(doc)
    path.write_text(text)
    here = dataclasses.replace(CAL, host=calmod.host(), flop_rate=7e9)
    measured = []

    def fake(quick=False, directory=None):
        measured.append(1)
        return here

    monkeypatch.setattr(calmod, "calibrate", fake)
    with pytest.warns(LaminaWarning) as said:
        assert load_calibration(str(path)) == here
        calmod.save_calibration(here, str(path))
        assert load_calibration(str(path)) == here
    assert path.read_text() == text
    msgs = [str(w.message) for w in said]
    assert len(msgs) == 1, msgs
    assert str(path) in msgs[0] and "neither read nor replaced" in msgs[0], msgs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json"]


def test_this_host_s_calibration_of_a_newer_lamina_beside_another_s_is_kept(monkeypatch, tmp_path):
    """A file shared by hosts: another host's calibration at the top (this version), this
    host's part beside it a newer lamina's. It was taken for one of another version and
    replaced by this lamina's measurement; it is now neither read nor replaced, as a file of
    a newer lamina is."""
    path = tmp_path / "cal.json"
    theirs = dataclasses.replace(CAL, host="login01")
    mine_newer = {
        **dataclasses.replace(CAL, host=calmod.host()).as_doc(),
        "version": calmod.CALIBRATION_VERSION + 1,
        "new_rate": 1.0,
    }
    text = json.dumps({**theirs.as_doc(), "others": {calmod.host(): mine_newer}})
    path.write_text(text)
    here = dataclasses.replace(CAL, host=calmod.host(), flop_rate=7e9)
    monkeypatch.setattr(calmod, "calibrate", lambda quick=False, directory=None: here)
    with pytest.warns(LaminaWarning) as said:
        assert load_calibration(str(path)) == here
        calmod.save_calibration(here, str(path))
    assert path.read_text() == text
    msgs = [str(w.message) for w in said]
    assert len(msgs) == 1 and "neither read nor replaced" in msgs[0], msgs


def test_a_calibration_file_keeps_the_most_recent_hosts(monkeypatch, tmp_path):
    path = tmp_path / "cal.json"
    for i in range(calmod.MAX_HOSTS + 3):
        cal = dataclasses.replace(CAL, host=f"node{i:02d}", created=CAL.created + i)
        calmod.save_calibration(cal, str(path))
    doc = json.loads(path.read_text())
    hosts = {doc["host"], *doc["others"]}
    assert hosts == {f"node{i:02d}" for i in range(3, calmod.MAX_HOSTS + 3)}
    assert len(path.read_bytes()) <= calmod.MAX_FILE_BYTES


def test_a_calibration_that_cannot_be_cached_warns_as_lamina(monkeypatch, tmp_path):
    """The warning was a plain UserWarning, which a filter of lamina's warnings missed."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    here = dataclasses.replace(CAL, host=calmod.host())
    monkeypatch.setattr(calmod, "calibrate", lambda quick=False, directory=None: here)
    with pytest.warns(LaminaWarning, match="could not cache the calibration at"):
        assert load_calibration(str(blocker / "cal.json")) == here


def test_calibrate_quick(tmp_path):
    cal = calibrate(quick=True, directory=str(tmp_path))
    for name in (*calmod.RATES, "fresh_copy_bandwidth"):
        v = getattr(cal, name)
        assert math.isfinite(v) and v > 0, name
    assert cal.host == calmod.host() and cal.version == calmod.CALIBRATION_VERSION
    assert list(tmp_path.iterdir()) == []  # its files are removed
    # a table per kind of work, at the sizes but the largest; the query engine's own, by its
    # probe (lamina.query registers it)
    assert set(cal.block_seconds) == set(calmod.TABLES)
    sizes = {
        "elements": calmod.BLOCK_ELEMENTS,
        "bytes": calmod.BLOCK_BYTES,
        "blocks": calmod.QUERY_BLOCKS,
    }
    for kind, points in cal.block_seconds.items():
        assert [n for n, _ in points] == list(sizes[calmod.TABLES[kind]][:-1]), kind
        assert all(math.isfinite(t) and t > 0 for _, t in points), kind
    assert Calibration.from_json(cal.to_json()) == cal


def test_a_failing_probe_leaves_its_table_out(monkeypatch, tmp_path):
    def broken(directory, quick):
        raise RuntimeError("no disk")

    monkeypatch.setitem(calmod.PROBES, "query", broken)
    with pytest.warns(UserWarning, match="'query' probe failed .*no disk"):
        cal = calibrate(quick=True, directory=str(tmp_path))
    assert "query" not in cal.block_seconds and "read" in cal.block_seconds
    assert list(tmp_path.iterdir()) == []


def test_calibration_values_equal_to_zero_but_not_numbers_are_refused():
    from fractions import Fraction

    for bad in (0j, Fraction(0), True):
        with pytest.raises(ValueError, match="created"):
            dataclasses.replace(CAL, created=bad)
    # a version that is a bool is no version: not "made by version True"
    with pytest.raises(ValueError, match="unknown key 'extra'"):
        Calibration.from_json(json.dumps({**_doc(version=True), "extra": 1}))
    with pytest.raises(ValueError, match="'version' must be an integer"):
        Calibration.from_json(json.dumps(_doc(version=True)))


def test_calibration_of_the_previous_version_is_measured_again(monkeypatch, tmp_path):
    """A file of version 1 (no per-block tables) is not used: the model would lack them."""
    path = tmp_path / "cal.json"
    doc = json.loads(dataclasses.replace(CAL, host=calmod.host(), version=1).to_json())
    del doc["block_seconds"], doc["fresh_copy_bandwidth"]
    path.write_text(json.dumps(doc))
    assert calmod.cached(str(path)) is None
    with pytest.raises(
        ValueError, match=f"made by version 1 of the calibration, not {calmod.CALIBRATION_VERSION}"
    ):
        load_calibration(str(path), measure=False)
    new = dataclasses.replace(CAL, host=calmod.host(), flop_rate=3e9)
    monkeypatch.setattr(calmod, "calibrate", lambda quick=False, directory=None: new)
    assert load_calibration(str(path)) == new and calmod.cached(str(path)) == new


# ------------------------------------------------------- per-block tables
def _tabled(**tables) -> Calibration:
    return dataclasses.replace(CAL, block_seconds=tables)


def test_calibration_tables_are_read_only_and_any_mapping():
    import types

    cal = _tabled(read=[[1e3, 1e-4]])
    with pytest.raises(TypeError):
        cal.block_seconds["read"] = "junk"  # type: ignore[index]
    assert cal.block_seconds["read"] == ((1e3, 1e-4),)
    again = dataclasses.replace(CAL, block_seconds=types.MappingProxyType({"read": ((1e3, 1e-4),)}))
    assert again == cal and hash(again) == hash(cal)
    assert Calibration.from_json(cal.to_json()) == cal
    assert dataclasses.asdict(cal)["block_seconds"] == {"read": ((1e3, 1e-4),)}
    import copy

    assert copy.deepcopy(cal) == cal
    with pytest.raises(ValueError, match="block_seconds"):
        dataclasses.replace(CAL, block_seconds=(p for p in [(1, 1)]))


def test_block_time_interpolates_and_extrapolates():
    cal = _tabled(read=[[1e3, 1e-4], [1e5, 1e-3], [1e7, 1e-1]])
    bt = calmod.block_time
    assert bt(cal, "read", 1e3) == pytest.approx(1e-4)
    assert bt(cal, "read", 1e5) == pytest.approx(1e-3)
    assert bt(cal, "read", 1e4) == pytest.approx(10**-3.5)  # log-log between 1e3 and 1e5
    assert bt(cal, "read", 1e6) == pytest.approx(1e-2)
    assert bt(cal, "read", 1e8) == pytest.approx(1.0)  # the largest size's time per byte
    # below the smallest: the line through the two smallest points, whose fixed cost stays
    per = (1e-3 - 1e-4) / (1e5 - 1e3)
    assert bt(cal, "read", 500) == pytest.approx(1e-4 - per * 500)
    assert bt(cal, "read", 1) == pytest.approx(1e-4 - per * 999)
    assert bt(cal, "read", 0) == 0.0
    assert bt(cal, "write", 1e4) is None  # no table: the caller takes the bandwidth
    one = _tabled(stats=[[100, 1e-6]])
    assert bt(one, "stats", 50) == pytest.approx(0.5e-6)
    assert bt(one, "stats", 400) == pytest.approx(4e-6)
    # above the largest: the line through the two largest points, its fixed cost kept
    q = _tabled(query=[[16, 1e-3], [256, 3e-3]])
    assert bt(q, "query", 4096) == pytest.approx(3e-3 + (2e-3 / 240) * 3840)
    flat = _tabled(read=[[1e3, 2e-3], [1e4, 1e-3]])  # a line that does not rise: per unit
    assert bt(flat, "read", 1e5) == pytest.approx(1e-2)
    assert bt(q, "query", float("nan")) == 0.0


def _tables_for_magnitude() -> Calibration:
    # 1 us a call plus 1 ns an element for every kernel; statistics 0.1 us + 0.1 ns an element;
    # reads 10 us a block plus 1 ns a byte, writes 2 ns a byte (interpolated in log-log, a line
    # is exact only at its points: the test's blocks are of those sizes)
    el = [4096, 32768, 262144]
    line = lambda a, b, xs: [[x, a + b * x] for x in xs]  # noqa: E731
    by = [32768, 262144, 2097152]
    return _tabled(
        kernel=line(1e-6, 1e-9, el),
        stencil=line(1e-6, 2e-9, el),
        magnitude=line(1e-6, 3e-9, el),
        curl=line(1e-6, 30e-9, el),
        stats=line(1e-7, 1e-10, el),
        read=line(1e-5, 1e-9, by),
        write=line(1e-5, 2e-9, by),
    )


def test_model_takes_each_term_at_its_block_size(monkeypatch):
    # blocks gathered into their box (evaluated where they lie from IN_PLACE_ELEMENTS: below)
    monkeypatch.setattr(lamina.perf.model, "IN_PLACE_ELEMENTS", 1 << 19)
    cal = _tables_for_magnitude()
    shape = (64, 64, 64)  # N = 262144: 8 blocks of 32768 elements, 256 KiB
    t = lamina.perf.terms(MAG, shape, nblocks=8, calibration=cal)
    n = 262144
    assert t.compute_s == pytest.approx(1e-6 + 3e-9 * n)  # the table of magnitude itself
    assert t.stats_s == pytest.approx(8 * (1e-7 + 1e-10 * 32768))  # a pass per block
    assert t.gather_s == pytest.approx(2 * 3 * n * 8 / CAL.memcpy_bandwidth)
    assert t.read_s(8 * 262144, 262144) == pytest.approx(8 * (1e-5 + 1e-9 * 262144))
    assert t.write_s(8 * 262144, 262144) == pytest.approx(8 * (1e-5 + 2e-9 * 262144))
    assert t.compute_at(32768) == pytest.approx(1e-6 + 3e-9 * 32768)
    p = combine(t, 0.125, 1)  # one block of eight
    assert p["stats"].write_s == pytest.approx(t.gather_s + t.compute_s + t.stats_s)
    assert p["store"].write_s == pytest.approx(
        t.gather_s + t.compute_s + t.stats_s + 8 * (1e-5 + 2e-9 * 262144)
    )
    assert p["store"].read_s == pytest.approx(1e-5 + 1e-9 * 262144)
    assert p["stats"].read_s == pytest.approx(3 * (1e-5 + 1e-9 * 262144) + t.compute_at(32768))
    assert p["expression"].read_s == pytest.approx(24 * (1e-5 + 1e-9 * 262144) + t.compute_s)
    # a query's own time, by the blocks of the dataset it judges, on every read
    q = dataclasses.replace(
        cal, block_seconds={**cal.block_seconds, "query": ((4, 1e-3), (16, 2e-3))}
    )
    tq = lamina.perf.terms(MAG, shape, nblocks=8, calibration=q)
    t_q = math.sqrt(1e-3 * 2e-3)  # 8 blocks: half way between 4 and 16 in log-log
    assert tq.query_s == pytest.approx(t_q)
    pq = combine(tq, 0.125, 1)
    for s in pq:
        assert pq[s].read_s == pytest.approx(p[s].read_s + t_q), s
        assert pq[s].write_s == p[s].write_s
    # statistics per element: a float32 block's pass is timed as a float64 block's
    f4 = lamina.perf.terms(MAG, shape, "f4", nblocks=8, calibration=cal)
    assert f4.stats_s == pytest.approx(t.stats_s)
    # one block: nothing gathered; a rate the caller gives replaces its table
    assert lamina.perf.terms(MAG, shape, calibration=cal).gather_s == 0.0
    given = lamina.perf.terms(MAG, shape, nblocks=8, calibration=cal, read_bandwidth=1e9)
    assert given.read_s(8 * 262144, 262144) == pytest.approx(8 * 262144 / 1e9)
    assert given.write_s(8 * 262144, 262144) == pytest.approx(8 * (1e-5 + 2e-9 * 262144))


def test_model_query_time_counted_once_with_a_history():
    """A history of the engine's reads but no query series: the calibrated query time is added
    to the read from the history; a history with a query series replaces it."""
    from lamina.perf.history import History

    cal = dataclasses.replace(
        _tables_for_magnitude(), block_seconds={"query": ((4, 1e-3), (64, 1e-3))}
    )
    t = lamina.perf.terms(MAG, (64, 64, 64), nblocks=8, calibration=cal)
    assert t.query_s == pytest.approx(1e-3)
    h = History()
    for k in range(4):
        h.add("read", 1e6 * (k + 1), 262144, 1e-3 * (k + 1))  # 1 GB/s
    p = combine(t, 0.5, 1, h)
    assert p["store"].read_s == pytest.approx(1e-3 + 0.5 * 2097152 / 1e9)
    for k in range(4):
        h.add("query.store", 1e5 * (k + 1), 32768, 5e-3 * (k + 1))
    p = combine(t, 0.5, 1, h)
    assert p["store"].read_s == pytest.approx(5e-3 * 131072 / 1e5 + 0.5 * 2097152 / 1e9)


def test_model_counts_new_memory_at_the_write():
    """The gathering of a writer's inputs and the first touches of the new result, at the rate
    of a copy into new memory (the memcpy rate where it was not measured: no first touches)."""
    assert lamina.perf.terms(MAG, SHAPE, nblocks=64, calibration=CAL).fresh_s == 0.0
    cal = dataclasses.replace(CAL, fresh_copy_bandwidth=5e9)  # memcpy 20e9
    t = lamina.perf.terms(MAG, SHAPE, nblocks=64, calibration=cal)
    assert t.gather_s == pytest.approx(2 * 24e6 / 5e9)
    assert t.fresh_s == pytest.approx(2 * 8e6 * (1 / 5e9 - 1 / 20e9))
    p = predict(MAG, SHAPE, nblocks=64, calibration=cal)
    extra = t.gather_s + t.fresh_s
    assert p["stats"].write_s == pytest.approx(extra + t.compute_s + t.stats_s)
    assert p["store"].write_s == pytest.approx(extra + t.compute_s + t.stats_s + 8e6 / 2e9)
    one = lamina.perf.terms(MAG, SHAPE, calibration=cal)  # one block: nothing gathered
    assert one.gather_s == 0.0 and one.fresh_s == t.fresh_s
    # a query reads into new buffers and computes into new memory: the same first touches
    touch = 2 * (1 / 5e9 - 1 / 20e9)
    assert t.touch_s_per_byte == pytest.approx(touch)
    p = predict(MAG, SHAPE, nblocks=64, query_fraction=0.5, calibration=cal)
    assert p["store"].read_s == pytest.approx(0.5 * 8e6 * (1 / 4e9 + touch))
    assert p["stats"].read_s == pytest.approx(
        0.5 * 24e6 * (1 / 4e9 + touch) + 0.5 * t.compute_s + 0.5 * 8e6 * touch
    )
    assert p["expression"].read_s == pytest.approx(
        24e6 * (1 / 4e9 + touch) + t.compute_s + 8e6 * touch
    )


def test_model_pointwise_over_large_blocks_is_computed_in_place():
    """Blocks of IN_PLACE_ELEMENTS or more: a pointwise expression is evaluated block by block
    at the write (nothing gathered, a kernel call per block); a stencil still gathers."""
    cal = dataclasses.replace(_tables_for_magnitude(), fresh_copy_bandwidth=5e9)
    n_b = lamina.perf.model.IN_PLACE_ELEMENTS
    shape = (4, n_b)  # 4 blocks of n_b elements
    t = lamina.perf.terms(MAG, shape, nblocks=4, calibration=cal)
    assert t.in_place and t.gather_s == 0.0
    assert t.write_compute_s() == pytest.approx(4 * t.compute_at(n_b))
    p = combine(t, 1.0, 0)
    assert p["stats"].write_s == pytest.approx(t.fresh_s + t.write_compute_s() + t.stats_s)
    small = lamina.perf.terms(MAG, (8, n_b // 2), nblocks=8, calibration=cal)
    assert not small.in_place and small.gather_s > 0
    stencil = lamina.perf.terms("gradient(u, 1)", shape, nblocks=4, calibration=cal)
    assert not stencil.in_place and stencil.gather_s > 0


def test_model_roofline_of_the_tables_for_other_expressions():
    cal = _tables_for_magnitude()
    n = 262144
    # float32 magnitude is not the calibrated kernel: the roofline of the tables
    t = lamina.perf.terms(MAG, (64, 64, 64), "f4", calibration=cal)
    ops = (1e-6 + 3e-9 * n) + (1e-6 + 30e-9 * n)  # magnitude and curl together
    f_tables = 6 + lamina.derived.parse("curl(u, v, w)").flops_per_element
    mem = (1e-6 + 1e-9 * n) * t.bytes_per_element / 24  # a + b moves 24 bytes an element
    assert t.compute_s == pytest.approx(max(mem, ops * t.flops_per_element / f_tables))
    # a stencil: the memory term from gradient(u, 0), 16 bytes an element
    g = lamina.perf.terms("gradient(u, 1)", (64, 64, 64), calibration=cal)
    mem = (1e-6 + 2e-9 * n) * g.bytes_per_element / 16
    assert g.compute_s == pytest.approx(max(mem, ops * g.flops_per_element / f_tables))
    # curl of float64 is a calibrated kernel: its own table
    c = lamina.perf.terms("curl(a, b, c)", (64, 64, 64), calibration=cal)
    assert c.compute_s == pytest.approx(1e-6 + 30e-9 * n)


# ------------------------------------------------------------ the command
@pytest.mark.parametrize(
    "text, value",
    [
        ("500MB/s", 5e8),
        ("0.5GB/s", 5e8),
        ("2GiB/s", 2 * 2**30),
        ("1e9", 1e9),
        ("100", 100.0),
        ("1.5 kB / s", 1500.0),
        ("3M", 3e6),
    ],
)
def test_parse_bandwidth(text, value):
    assert parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["fast", "0", "-1GB/s", "5XB/s", "", "1e999"])
def test_parse_bandwidth_bad(text):
    with pytest.raises(ValueError):
        parse_bandwidth(text)


@pytest.fixture
def calfile(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text(CAL.to_json())
    return str(p)


def model(*args):
    return lamina.cli.main(["model", *args])


def test_cli_table(calfile, capsys):
    rc = model(
        "derived",
        "--expr",
        "magnitude(vx,vy,vz)",
        "--query-fraction",
        "0.1",
        "--readers",
        "3",
        "--read-bandwidth",
        "0.5GB/s",
        "--calibration",
        calfile,
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    for word in ("store", "stats", "expression", "compute", "write", "read", "total", "storage"):
        assert word in out.out
    assert "512x512x512" in out.out and "64 blocks" in out.out
    rec = [line for line in out.out.splitlines() if line.startswith("recommendation: ")]
    assert len(rec) == 1
    _, p = recommend(
        "magnitude(vx,vy,vz)",
        (512, 512, 512),
        nblocks=64,
        query_fraction=0.1,
        readers=3,
        read_bandwidth=0.5e9,
        calibration=CAL,
    )
    assert rec[0].split()[1] == min(p, key=lambda s: p[s].total_s)


def test_cli_json(calfile, capsys):
    rc = model(
        "derived",
        "--expr",
        "curl(u, v, w)",
        "--shape",
        "64,64,64",
        "--dtype",
        "f4",
        "--blocks",
        "8",
        "--readers",
        "0",
        "--write-bandwidth",
        "1GB/s",
        "--calibration",
        calfile,
        "--json",
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["recommendation"] == "expression"  # nobody reads
    want = predict(
        "curl(u, v, w)",
        (64, 64, 64),
        "f4",
        nblocks=8,
        readers=0,
        write_bandwidth=1e9,
        calibration=CAL,
    )
    for s, p in want.items():
        assert doc["predictions"][s] == pytest.approx(p.as_dict())
    assert doc["write_bandwidth"] == 1e9 and doc["read_bandwidth"] == CAL.read_bandwidth


def test_cli_uses_cache(monkeypatch, tmp_path, capsys):
    path = tmp_path / "cal.json"
    path.write_text(dataclasses.replace(CAL, host=calmod.host()).to_json())
    monkeypatch.setenv("LAMINA_CALIBRATION", str(path))
    monkeypatch.setattr(calmod, "calibrate", lambda **kw: pytest.fail("measured again"))
    assert model("derived", "--expr", "a + b", "--json") == 0
    out = capsys.readouterr()
    assert "calibrating" not in out.err
    assert json.loads(out.out)["calibration"]["path"] == str(path)


@pytest.mark.parametrize(
    "args, word",
    [
        (["--expr", "magnitude(vx,,vy)"], "position 13"),
        (["--expr", "magnitude(vx,vy,vz)", "--read-bandwidth", "fast"], "bandwidth"),
        (["--expr", "magnitude(vx,vy,vz)", "--query-fraction", "1.5"], "query-fraction"),
        (["--expr", "magnitude(vx,vy,vz)", "--readers", "-2"], "readers"),
        (["--expr", "magnitude(vx,vy,vz)", "--shape", "5,x"], "shape"),
        (["--expr", "magnitude(vx,vy,vz)", "--dtype", "nope"], "dtype"),
        (["--expr", "curl(u,v,w)", "--shape", "10,10"], "curl"),
        (["--expr", "a", "--bogus"], "bogus"),
        ([], "--expr"),
    ],
)
def test_cli_bad_input(calfile, capsys, args, word):
    rc = model("derived", *args, "--calibration", calfile)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and word in err, err


def test_cli_bad_calibration_file(tmp_path, capsys):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(_doc(flop_rate=-1)))
    assert model("derived", "--expr", "a", "--calibration", str(p)) == 2
    assert "flop_rate" in capsys.readouterr().err


def test_cli_usage(capsys):
    assert model() == 2
    assert "lamina model {derived,async,checks}" in capsys.readouterr().err
    assert model("--help") == 0
    assert "usage" in capsys.readouterr().out
    assert model("derived", "--help") == 0
    assert "--query-fraction" in capsys.readouterr().out
    assert model("nonsense") == 2
    assert "derived" in capsys.readouterr().err


# ------------------------------------------------------- lamina bench derived
def test_bench_derived(capsys):
    rc = lamina.bench.main(["derived", "--mib", "8", "--repeat", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for word in ("memcpy", "add", "magnitude", "curl", "numpy", "lamina out=", "### targets"):
        assert word in out
    assert "results agree with numpy" in out
    assert ("GPU path skipped" in out) != any("lamina gpu" in line for line in out.splitlines())


def test_bench_derived_json(capsys):
    rc = lamina.bench.main(
        [
            "derived",
            "--mib",
            "4",
            "--repeat",
            "1",
            "--kernels",
            "laplacian,magnitude-curl",
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["kernel"] for r in doc["rows"]} == {"laplacian", "magnitude-curl"}
    assert doc["memcpy"]["gbps"] > 0 and all(doc["checks"].values())
    assert doc["targets"] == []


def test_bench_derived_bad_option(capsys):
    assert lamina.bench.main(["derived", "--kernels", "nope"]) == 2
    assert lamina.bench.main(["derived", "--mib", "0"]) == 2


# ------------------------------------------------------- the model on measured history
def _hist(series_rates, x2s=(1e3, 1e4, 1e5)):
    """A history whose series run at constant rates: {series: rate}, samples at block sizes *x2s*."""
    from lamina.perf.history import History

    h = History()
    for name, rate in series_rates.items():
        for x2 in x2s:
            h.add(name, 1e6, x2, 1e6 / rate)
    return h


def test_history_terms_by_hand():
    from lamina.perf.history import signature

    sig = signature(MAG, "f8")
    h = _hist(
        {
            f"derive.store.{sig}": 1e8,  # elements/s
            f"derive.stats.{sig}": 2e8,
            f"compute.{sig}": 5e7,
            "write": 1e9,  # bytes/s
            "read": 4e9,
        }
    )
    p = predict(MAG, SHAPE, nblocks=8, query_fraction=0.1, readers=2, calibration=CAL, history=h)
    n, s_d = 1e6, 8e6
    assert p["store"].write_s == approx(n / 1e8 + s_d / 1e9)
    assert p["stats"].write_s == approx(n / 2e8)
    assert p["expression"].write_s == 0.0
    assert p["store"].read_s == approx(0.1 * s_d / 4e9)
    assert p["stats"].read_s == approx(0.1 * n / 5e7)
    assert p["expression"].read_s == approx(n / 5e7)  # a scalar: computed once
    assert {s.source for s in p.values()} == {"history"}
    for s in p.values():
        assert s.total_s == approx(s.write_s + 2 * s.read_s)
    # storage does not come from history: the same bytes either way
    cal_only = predict(MAG, SHAPE, nblocks=8, query_fraction=0.1, readers=2, calibration=CAL)
    assert [s.storage_bytes for s in p.values()] == [s.storage_bytes for s in cal_only.values()]


def test_history_query_term_is_added_to_every_read():
    """Series ``query`` (what a query costs besides its reads) adds its fitted seconds for the
    elements each strategy's block answer reads: the selected components of the candidates,
    and for Expression the tested component everywhere first."""
    from lamina.perf.history import signature

    sig = signature(MAG, "f8")
    rates = {f"compute.{sig}": 5e7, "read": 4e9}
    base = predict(MAG, SHAPE, nblocks=8, query_fraction=0.1, calibration=CAL, history=_hist(rates))
    p = predict(
        MAG,
        SHAPE,
        nblocks=8,
        query_fraction=0.1,
        calibration=CAL,
        history=_hist({**rates, "query": 1e8}),
    )
    n = 1e6
    assert p["store"].read_s == approx(base["store"].read_s + 0.1 * n / 1e8)
    assert p["stats"].read_s == approx(base["stats"].read_s + 0.1 * n / 1e8)
    assert p["expression"].read_s == approx(base["expression"].read_s + n / 1e8)
    assert [s.source for s in p.values()] == [s.source for s in base.values()]
    # a strategy's own series (queries judging its quantities) before the series of all
    own = predict(
        MAG,
        SHAPE,
        nblocks=8,
        query_fraction=0.1,
        calibration=CAL,
        history=_hist({**rates, "query": 1e8, "query.store": 1e7}),
    )
    assert own["store"].read_s == approx(base["store"].read_s + 0.1 * n / 1e7)
    assert own["stats"].read_s == approx(p["stats"].read_s)
    assert own["expression"].read_s == approx(p["expression"].read_s)
    # a vector: three components of the candidates; Expression's tested one is kept
    curl = "curl(vx, vy, vz)"
    rates = {f"compute.{signature(curl, 'f8')}": 5e7, "read": 4e9}
    kw = dict(nblocks=8, query_fraction=0.1, calibration=CAL)
    base = predict(curl, SHAPE, history=_hist(rates), **kw)
    p = predict(curl, SHAPE, history=_hist({**rates, "query": 1e8}), **kw)
    assert p["stats"].read_s == approx(base["stats"].read_s + 3 * 0.1 * n / 1e8)
    assert p["expression"].read_s == approx(base["expression"].read_s + (1 + 2 * 0.1) * n / 1e8)


def test_a_read_never_costs_less_with_more_to_read():
    """With a history of queries alone, a query of no elements (query_fraction 0) took the
    calibrated fixed query time, more than one of a billionth of the data took from the
    history (0.0013 s against 3e-11 s), and could flip 'auto'; and the source said
    'calibration' though the query term came from the history."""
    from lamina.perf.history import History

    h = History()
    for n in (1e4, 1e5, 1e6):
        for _ in range(3):
            h.add("query", n, 4096.0, 2e-3 + 3e-9 * n)
    # a calibrated query of 1.28 ms a block at any size
    cal = dataclasses.replace(CAL, block_seconds={"query": ((1.0, 1.28e-3), (1e9, 1.28e-3))})
    last: dict[str, float] = {}
    for q in (0.0, 1e-12, 1e-9, 1e-6, 1e-3, 0.1, 0.5, 1.0):
        p = predict(
            MAG, SHAPE, nblocks=64, query_fraction=q, readers=1000, calibration=cal, history=h
        )
        for s, v in p.items():
            assert v.read_s >= last.get(s, 0.0), (s, q, v.read_s, last)
            last[s] = v.read_s
            assert v.source == "history+calibration", (s, q, v.source)


def test_history_of_another_expression_is_not_used_and_terms_mix():
    from lamina.perf.history import signature

    other = signature("curl(vx, vy, vz)", "f8")
    h = _hist({f"compute.{other}": 1e3, "read": 4e9})
    p = predict(MAG, SHAPE, query_fraction=0.5, calibration=CAL, history=h)
    base = predict(MAG, SHAPE, query_fraction=0.5, calibration=CAL)
    assert p["stats"].read_s == approx(base["stats"].read_s) and p["stats"].source == "calibration"
    assert p["expression"].source == "calibration"
    # store: its read from history, its write from the calibration
    assert p["store"].source == "history+calibration"
    assert p["store"].write_s == approx(base["store"].write_s)
    assert p["store"].read_s == approx(0.5 * 8e6 / 4e9)
    # renamed inputs are the same expression
    sig = signature(MAG, "f8")
    h = _hist({f"compute.{sig}": 1e7})
    q = predict("magnitude(a, b, c)", SHAPE, query_fraction=0.5, calibration=CAL, history=h)
    assert q["stats"].read_s == approx(0.5 * 1e6 / 1e7)


def test_history_rate_follows_the_block_size():
    """Samples where blocks of 1e3 elements run at 1e7/s and blocks of 1e5 at 1e8/s: the model
    predicts a slower read for small blocks than for large ones."""
    from lamina.perf.history import History, signature

    sig = signature(MAG, "f8")
    h = History()
    for x2, rate in ((1e3, 1e7), (1e4, 5.5e7), (1e5, 1e8)):
        h.add(f"compute.{sig}", 1e6, x2, 1e6 / rate)
    small = predict(MAG, SHAPE, nblocks=1000, calibration=CAL, history=h)["stats"].read_s
    large = predict(MAG, SHAPE, nblocks=10, calibration=CAL, history=h)["stats"].read_s
    assert small == pytest.approx(1e6 / 1e7, rel=0.05)
    assert large == pytest.approx(1e6 / 1e8, rel=0.05)


def test_cli_predicts_from_the_measured_history(calfile, tmp_path, capsys, monkeypatch):
    from lamina.perf.history import save_history, signature

    sig = signature(MAG, "f8")
    h = _hist({f"compute.{sig}": 1e6, f"derive.stats.{sig}": 1e9})
    path = tmp_path / "h.json"
    save_history(h, str(path))
    args = ["--expr", MAG, "--shape", "100,100,100", "--blocks", "8", "--calibration", calfile]
    # the machine's history by default (here the test's own, empty): the calibration alone
    assert model("derived", *args, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert {p["source"] for p in doc["predictions"].values()} == {"calibration"}
    monkeypatch.setenv("LAMINA_HISTORY", str(path))
    assert model("derived", *args, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["history"] == str(path)
    assert doc["predictions"]["expression"]["source"] == "history"
    assert doc["predictions"]["expression"]["read_s"] == approx(1e6 / 1e6)
    assert doc["predictions"]["stats"]["write_s"] == approx(1e6 / 1e9)
    assert model("derived", *args, "--history", "none", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert {p["source"] for p in doc["predictions"].values()} == {"calibration"}
    assert model("derived", *args) == 0
    out = capsys.readouterr().out
    assert "times from" in out and f"measured history: {path}" in out
    # a file that is not a history of this host is refused by name
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert model("derived", *args, "--history", str(bad)) == 2
    assert "--history" in capsys.readouterr().err
    # a file that is not there is said to be missing; one that is not JSON says why, as the
    # error (it warned that 'the next save' would rewrite it: these commands save nothing)
    for sub, extra in (("derived", args), ("async", ["--bytes", "8MiB"])):
        assert model(sub, *extra, "--history", str(tmp_path / "none.json")) == 2
        assert "none.json: no such file" in capsys.readouterr().err
        (tmp_path / "x.py").write_text("print(1)")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert model(sub, *extra, "--history", str(tmp_path / "x.py")) == 2
        assert "not valid JSON" in capsys.readouterr().err
