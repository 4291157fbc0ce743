"""Both cost models' errors side by side (``lamina.perf.checks``, ``lamina model checks``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest

from lamina.bench import background
from lamina.perf import checks
from lamina.perf import main as model_main
from lamina.perf.checks import Check


def _check(model="async", pairs=((1.0, 1.0),), command="lamina bench async", **kw) -> Check:
    return dataclasses.replace(Check.of(model, pairs, command), **kw)


def test_summary_counts_errors_relative_to_the_measured_time():
    # errors 0.0, 0.1, 0.2, 0.5, 1.0 (predicted 2 for measured 1)
    c = _check(pairs=[(1.0, 1.0), (1.1, 1.0), (0.8, 1.0), (0.5, 1.0), (2.0, 1.0)])
    s = c.summary()
    assert s["predictions"] == 5
    assert s["within_target"] == 3 and s["within_goal"] == 2
    assert s["median_error"] == pytest.approx(0.2)
    assert s["largest_error"] == pytest.approx(1.0)
    assert s["ratio_range"] == (0.5, 2.0)
    even = _check(pairs=[(1.0, 1.0), (1.1, 1.0), (1.3, 1.0), (1.5, 1.0)]).summary()
    assert even["median_error"] == pytest.approx(0.2)  # the mean of the middle two
    empty = _check(pairs=[]).summary()
    assert empty["predictions"] == 0 and empty["median_error"] is None


def test_pairs_that_are_not_two_positive_finite_times_are_left_out():
    c = _check(
        pairs=[
            (1.0, 2.0),
            (0.0, 1.0),
            (1.0, -1.0),
            (math.nan, 1.0),
            (1.0, math.inf),
            (True, 1.0),
            ("1", 1.0),
            (1.0,),
            None,
            (3, 4),
        ]
    )
    assert c.pairs == ((1.0, 2.0), (3.0, 4.0))
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        Check.of("nope", [], "x")


def test_records_round_trip_and_keep_the_other_models(tmp_path):
    p = str(tmp_path / "sub" / "checks.json")
    assert checks.load(p) == {}
    a = _check("async", [(1.0, 1.2)], "lamina bench async --ranks 1")
    checks.record([a], p)
    d = _check("derived-history", [(2.0, 1.0), (1.0, 1.0)], "lamina bench strategies")
    checks.record([d], p)
    got = checks.load(p)
    assert list(got) == ["derived-history", "async"]  # the table's order
    assert got["async"] == a and got["derived-history"] == d
    a2 = _check("async", [(5.0, 5.0)], "again")
    checks.record([a2], p)
    assert checks.load(p)["async"] == a2 and checks.load(p)["derived-history"] == d


def test_records_of_a_newer_lamina_are_neither_read_nor_replaced(tmp_path):
    """Two lamina versions sharing one home directory: the older one's checks do not throw
    away the newer one's file (it warns once, keeps nothing there)."""
    from lamina.errors import LaminaWarning

    p = tmp_path / "checks.json"
    text = '{"version": 2, "checks": {"async": {"anything": "of version 2"}}}'
    p.write_text(text)
    a = _check("async", [(1.0, 1.2)], "lamina bench async --ranks 1")
    with pytest.warns(LaminaWarning, match="written by a newer lamina .version 2"):
        checks.record([a], str(p))
        assert checks.load(str(p)) == {}
    assert p.read_text() == text
    with pytest.raises(checks.Newer, match="version 2, newer than 1"):
        checks.read_records(str(p))


def test_records_of_another_host_are_not_this_machines(tmp_path):
    p = str(tmp_path / "checks.json")
    checks.record([_check(host="elsewhere"), _check("derived-history")], p)
    assert list(checks.load(p)) == ["derived-history"]
    # kept in the file all the same: the other host's record is its own
    doc = json.loads(open(p).read())
    assert set(doc["checks"]) == {"derived-history"} and set(doc["others"]["elsewhere"]) == {
        "async"
    }


def test_another_hosts_records_at_the_path_are_kept(tmp_path, monkeypatch):
    """A benchmark on another host replaced this host's last record of the model it checked
    (one record per model, whichever host): each host's records are kept side by side; a
    file of the old form is read record by record, each its host's."""
    p = str(tmp_path / "checks.json")
    theirs = _check("async", [(1.0, 2.0)], "on login01", host="login01")
    old = {"version": checks.VERSION, "checks": {"async": theirs.stored()}}
    with open(p, "w") as f:
        json.dump(old, f)
    assert checks.load(p) == {}
    mine = _check("async", [(1.0, 1.0)], "here")
    checks.record([mine], p)
    assert checks.load(p) == {"async": mine}
    me = checks.host()
    monkeypatch.setattr(checks, "host", lambda: "login01")
    assert checks.load(p) == {"async": theirs}
    again = _check("derived-history", [(1.0, 1.0)], "again on login01", host="login01")
    checks.record([again], p)
    assert checks.load(p) == {"derived-history": again, "async": theirs}
    monkeypatch.setattr(checks, "host", lambda: me)
    assert checks.load(p) == {"async": mine}


def test_a_checks_file_keeps_the_most_recently_checked_hosts(tmp_path):
    p = str(tmp_path / "checks.json")
    n = checks.MAX_HOSTS + 2
    checks.record([_check(host=f"node{i:02d}", when=1000.0 + i) for i in range(n)], p)
    doc = json.loads(open(p).read())
    assert sorted(doc["others"]) == [f"node{i:02d}" for i in range(3, n)]


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"version": 0, "checks": {}}',  # an older lamina's (a newer one's is kept: below)
        '{"version": 1, "checks": []}',
        '{"version": 1}',
        '{"version": 1, "checks": {"async": NaN}}',
        "[" * 100000 + "]" * 100000,  # deeper than any parser's recursion
        b"\xff\xfe",
    ],
)
def test_a_file_that_is_not_a_record_is_ignored(tmp_path, text):
    p = tmp_path / "checks.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert checks.load(str(p)) == {}
    checks.record([_check()], str(p))  # written over
    assert list(checks.load(str(p))) == ["async"]


def test_a_bad_record_is_ignored_alone(tmp_path):
    p = tmp_path / "checks.json"
    good = {"command": "c", "when": 1.0, "host": checks.host(), "pairs": [[1.0, 2.0]]}
    bad = [
        {**good, "pairs": [[1.0, -2.0]]},
        {**good, "pairs": "x"},
        {**good, "when": "now"},
        {**good, "host": 3},
        {**good, "command": None},
        "x",
    ]
    for b in bad:
        p.write_text(
            json.dumps({"version": 1, "checks": {"async": b, "derived-history": good, "x": good}})
        )
        assert list(checks.load(str(p))) == ["derived-history"], b


def test_a_file_too_long_or_not_regular_is_ignored(tmp_path):
    p = tmp_path / "checks.json"
    p.write_text(" " * (checks.MAX_FILE_BYTES + 1))
    assert checks.load(str(p)) == {}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert checks.load(str(fifo)) == {}  # not opened for a read that would block
    assert checks.load(str(tmp_path)) == {}  # a directory


def test_table_puts_the_models_side_by_side(tmp_path):
    p = str(tmp_path / "checks.json")
    assert "no model checked on this host yet" in checks.table({})
    old = _check("async", [(1.0, 1.0), (1.3, 1.0)], "lamina bench async --ranks 1,2", when=0.0)
    checks.record([old], p)
    mine = [
        _check("derived-history", [(1.1, 1.0), (1.2, 1.0), (0.7, 1.0)], "lamina bench strategies"),
        _check("derived-calibration", [(0.3, 1.0)], "lamina bench strategies"),
    ]
    both = checks.side_by_side(mine, p)
    assert list(both) == ["derived-history", "derived-calibration", "async"]
    text = checks.table(both, ("derived-history", "derived-calibration"))
    lines = text.splitlines()
    rows = [ln for ln in lines if ln.startswith("| derived") or ln.startswith("| async")]
    assert len(rows) == 3
    assert "this run" in rows[0] and "2 of 3" in rows[0] and "0.70-1.20" in rows[0]
    assert "this run" in rows[1] and "0 of 1" in rows[1]
    assert "1970-01-01 00:00 UTC" in rows[2] and "1 of 2" in rows[2]
    assert "[3] background I/O (io='auto')" in text and "lamina bench async --ranks 1,2" in text
    # a command recorded with control characters (a hostile file) is shown escaped
    odd = _check("async", [(1.0, 1.0)], "lamina bench async\x1b[2J\r\nfake row")
    text = checks.table({"async": odd})
    assert "\x1b" not in text and "\\x1b[2J\\r\\nfake row" in text


def test_add_to_report_records_this_runs_checks(tmp_path):
    p = str(tmp_path / "checks.json")
    doc: dict = {}
    text = checks.add_to_report([_check("async", [(1.0, 2.0)])], "REPORT", doc, p)
    assert text.startswith("REPORT\n\n") and "| async [1] | this run" in text
    assert doc["model_checks"]["async"]["summary"]["largest_error"] == pytest.approx(0.5)
    assert list(checks.load(p)) == ["async"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    doc = {}
    text = checks.add_to_report([_check()], "R", doc, str(blocked / "checks.json"))
    assert "model errors not recorded" in text and "async" in doc["model_checks"]


def test_the_async_benchmark_checks_the_steps_auto_decided_from_step_3():
    d = {"t_sync": 1.0, "t_async": 2.0}
    auto = {
        "method": background.AUTO,
        "io_stats": {
            "decisions": [
                {"step": 2, "mode": "sync", "epoch_measured": 5.0, **d},
                {"step": 3, "mode": "async", "epoch_measured": 2.5, **d},
                {"step": 4, "mode": "sync", "epoch_measured": 0.9, **d},
            ]
        },
    }
    jobs = [{"writes": [auto, {"method": background.SYNC}]}, {"writes": [auto]}]
    (c,) = background.model_checks(jobs, "lamina bench async")
    assert c.model == "async" and c.pairs == ((2.0, 2.5), (1.0, 0.9)) * 2
    assert background.model_checks([{"writes": [{"method": background.SYNC}]}], "x") == []


@pytest.mark.parametrize(
    "name, text, said",
    [
        ("missing.json", None, "no such file"),
        ("dir", "", "is a directory, not a regular file"),
        ("garbage.json", "{bad", "not valid JSON"),
        ("other.json", '{"version": 99, "checks": {}}', "records of version 99, newer than 1"),
        ("list.json", "[]", "not records of version 1"),
    ],
)
def test_lamina_model_checks_of_a_file_that_is_none(tmp_path, capsys, name, text, said):
    """--file naming a missing file, a directory or garbage printed "no model checked on this
    host yet" and exited 0: an error (status 2) as lamina model async --history says it."""
    p = tmp_path / name
    if name == "dir":
        p.mkdir()
    elif text is not None:
        p.write_text(text)
    assert model_main(["checks", "--file", str(p)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert f"lamina model checks: error: --file {p}: " in err and said in err


def test_lamina_model_checks(tmp_path, capsys, monkeypatch):
    p = str(tmp_path / "checks.json")
    checks.record([_check("async", [(1.0, 1.1)], "elsewhere", host="elsewhere")], p)
    assert model_main(["checks", "--file", p]) == 0  # records, none of this host
    assert "no model checked on this host yet" in capsys.readouterr().out
    checks.record([_check("async", [(1.0, 1.1)], "lamina bench async --ranks 2")], p)
    assert model_main(["checks", "--file", p]) == 0
    out = capsys.readouterr().out
    assert "| async [1]" in out and "lamina bench async --ranks 2" in out
    assert model_main(["checks", "--file", p, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["async"]["pairs"] == [[1.0, 1.1]] and doc["async"]["summary"]["predictions"] == 1
    monkeypatch.setenv("LAMINA_MODEL_CHECKS", p)  # the default file
    assert model_main(["checks"]) == 0 and "| async [1]" in capsys.readouterr().out
    assert model_main(["checks", "--bogus"]) == 2
    assert model_main(["nope"]) == 2
    assert "derived, async, checks" in capsys.readouterr().err
