"""The measured-history machinery both cost models share: fits, persistence, signatures.

Fits are checked on synthetic samples whose answer is known; no timing is asserted.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from lamina.errors import FormatError, LaminaWarning
from lamina.perf import history as hist
from lamina.perf.calibrate import host


def _samples(rate_of, sizes=(1 << 20, 4 << 20, 16 << 20, 64 << 20), ranks=(1, 2, 4)):
    return [(b, r, b / rate_of(b, r)) for b in sizes for r in ranks]


# -- the fit -----------------------------------------------------------------------------


def test_linear_rate_is_recovered():
    fit = hist.fit_rate(_samples(lambda b, r: 1e8 + 2.0 * b + 3e7 * r))
    assert fit.kind == "linear" and fit.r2 == pytest.approx(1.0) and fit.samples == 12
    assert fit.coef == pytest.approx((1e8, 2.0, 3e7), rel=1e-6)
    assert fit.rate(8 << 20, 2) == pytest.approx(1e8 + 2.0 * (8 << 20) + 6e7, rel=1e-6)
    assert fit.seconds(8 << 20, 2) == pytest.approx((8 << 20) / (1e8 + 2.0 * (8 << 20) + 6e7))


def test_linear_log_rate_is_recovered_and_preferred():
    fit = hist.fit_rate(_samples(lambda b, r: 5e7 * math.log(b) + 1e8 * math.log(r) + 1e8))
    assert fit.kind == "linear-log" and fit.r2 == pytest.approx(1.0)


def test_a_per_block_overhead_is_learnt_from_block_sizes():
    """t = elements x 1 ns + blocks x 50 us: the rate rises with the block size; a fit over
    block sizes 4 Ki .. 1 Mi elements predicts 64 Ki within 15 %."""

    def secs(n, per_block):
        return n * 1e-9 + (n / per_block) * 50e-6

    n = 1 << 24
    train = [(n, b, secs(n, b)) for b in (1 << 12, 1 << 14, 1 << 18, 1 << 20)]
    fit = hist.fit_rate(train)
    assert fit.kind == "per-block"
    got = fit.seconds(n, 1 << 16)
    assert got == pytest.approx(secs(n, 1 << 16), rel=0.15)


def test_few_samples_use_the_median_rate_and_none_nothing():
    fit = hist.fit_rate([(1 << 20, 1, 0.01), (1 << 20, 1, 0.02)])
    assert fit.kind == "median" and math.isnan(fit.r2)
    assert fit.coef[0] == pytest.approx(((1 << 20) / 0.01 + (1 << 20) / 0.02) / 2)
    fit = hist.fit_rate([(1 << 20, 1, 0.01), (1 << 20, 1, 0.01), (1 << 20, 1, 0.07)])
    assert fit.kind == "median" and fit.rate(1 << 20, 1) == pytest.approx((1 << 20) / 0.01)
    none = hist.fit_rate([])
    assert none.kind == "none" and none.seconds(1, 1) is None
    assert none.rate(1, 1, default=7.0) == 7.0


def test_equal_rates_fit_exactly():
    fit = hist.fit_rate([(1000 * k, 1, k / 1e6) for k in (1, 2, 3, 4)])
    assert fit.r2 == 1.0 and fit.rate(5000, 1) == pytest.approx(1e9)


def test_noisy_samples_report_their_r2_and_the_rate_stays_above_the_floor():
    rng = np.random.default_rng(0)
    samples = [(b, r, s * rng.uniform(0.5, 1.5)) for b, r, s in _samples(lambda b, r: 1e9)]
    fit = hist.fit_rate(samples)
    assert 0.0 <= fit.r2 < 1.0
    slowest = min(b / s for b, _, s in samples)
    assert fit.rate(1e30, 1e30) >= hist.FLOOR * slowest * (1 - 1e-12)
    assert fit.rate(1.0, 1.0) >= hist.FLOOR * slowest * (1 - 1e-12)


def test_a_few_slow_samples_do_not_drag_the_fit():
    """Writes of a step at 4 GB/s, two of seven 7x slower (the page cache flushing): the line
    goes through the bulk, and a size below the samples is predicted at their rate, not at a
    rate that a least-squares line through the slow ones would send below zero."""
    fast, slow = 4e9, 4e9 / 7
    sizes = [66e6, 66e6, 89e6, 133e6, 66e6, 89e6, 133e6]
    rates = [fast, slow, fast, fast, slow, fast, fast]
    samples = [(b, 1.4e6, b / r) for b, r in zip(sizes, rates, strict=True)]
    fit = hist.fit_rate(samples)
    for b in (22e6, 66e6, 100e6, 1e9):
        assert fit.rate(b, 1.4e6) == pytest.approx(fast, rel=0.02)
    # least squares on the same samples: what the fit used to be
    a = np.asarray(samples)
    design = np.column_stack([np.ones(len(a)), a[:, 0]])
    ls = np.linalg.lstsq(design, a[:, 0] / a[:, 2], rcond=None)[0]
    assert ls @ (1.0, 22e6) < 0.5 * fast


def test_a_line_is_not_extrapolated_beyond_its_samples():
    fit = hist.fit_rate(_samples(lambda b, r: 1e8 + 2.0 * b + 3e7 * r))
    assert fit.kind == "linear"
    top = 1e8 + 2.0 * (64 << 20) + 3e7 * 4
    assert fit.rate(1 << 40, 64) == pytest.approx(top, rel=1e-6)
    assert fit.rate(1, 1) == pytest.approx(1e8 + 2.0 * (1 << 20) + 3e7, rel=1e-6)


def test_samples_close_to_a_prediction_predict_it_by_their_median():
    """A run again: three samples at the size predicted (one of them slow) give their median
    rate; other sizes and other block sizes (x2) leave it to the fit."""
    h = hist.History()
    for b in (1 << 20, 4 << 20, 16 << 20, 64 << 20):
        h.add("s", b, 1e3, b / 1e9)  # 1 GB/s elsewhere
    for t in (0.010, 0.011, 0.050):
        h.add("s", 256 << 20, 1e3, t)
    assert h.local_rate("s", 256 << 20, 1e3) == pytest.approx((256 << 20) / 0.011)
    assert h.seconds("s", 256 << 20, 1e3) == pytest.approx(0.011)
    assert h.local_rate("s", 256 << 20, 2e3) is None  # another block size
    assert h.local_rate("s", 1 << 30, 1e3) is None  # 4x larger: too far
    assert h.seconds("s", 0, 1e3) == 0.0 and h.seconds("t", 1, 1) is None


# -- the history ---------------------------------------------------------------------------


def test_add_ignores_nonsense_and_keeps_the_newest():
    h = hist.History()
    for bad in ((0, 1, 1.0), (1, 0, 1.0), (1, 1, 0.0), (1, 1, float("nan")), (1, 1, -1.0)):
        h.add("s", *bad)
    assert h.samples("s") == [] and h.seconds("s", 1, 1) is None
    for i in range(hist.MAX_SAMPLES + 5):
        h.add("s", 1000 + i, 2, 0.5)
    assert len(h.samples("s")) == hist.MAX_SAMPLES
    assert h.samples("s")[-1] == (1000 + hist.MAX_SAMPLES + 4, 2, 0.5)


def test_a_long_series_is_fitted_again_once_enough_new_samples_could_move_it():
    """A run adds a sample per step; refitting a full series at every step would cost more
    than the step's decision is worth, so the fit follows 1/REFIT of new samples."""
    h = hist.History()
    for b in (1 << 20, 4 << 20, 16 << 20):
        for _ in range(hist.MAX_SAMPLES // 3 + 1):
            h.add("s", b, 1, b / 1e9)  # 1 GB/s
    assert len(h.samples("s")) == hist.MAX_SAMPLES
    first = h.fit("s")
    assert first.rate(4 << 20, 1) == pytest.approx(1e9)
    assert h.median_rate("s") == pytest.approx(1e9)
    # (the adds above left the count of new samples somewhere below the threshold)
    for _ in range(hist.MAX_SAMPLES // hist.REFIT + 1):
        h.add("s", 4 << 20, 1, (4 << 20) / 1e8)  # much slower now
    again = h.fit("s")
    assert again is not first and again.samples == hist.MAX_SAMPLES  # fitted again
    assert again.floor == pytest.approx(hist.FLOOR * 1e8)  # with the slow samples in it
    # (a robust fit: 17 slow samples of 256 do not move the rate; nor does the median)
    assert h.median_rate("s") == pytest.approx(1e9)  # most samples still say 1 GB/s
    short = hist.History()
    short.add("t", 1 << 20, 1, (1 << 20) / 1e9)
    assert short.fit("t").rate(1 << 20, 1) == pytest.approx(1e9)
    short.add("t", 1 << 20, 1, (1 << 20) / 3e9)  # a short series follows every sample
    assert short.fit("t").rate(1 << 20, 1) == pytest.approx(2e9)


@pytest.mark.parametrize("rates", [[3.0], [1.0, 5.0], [4.0, 1.0, 9.0], [2.0, 2.0, 8.0, 1.0]])
def test_median_rate_is_numpys_median(rates):
    h = hist.History()
    assert h.median_rate("c") is None
    for r in rates:
        h.add("c", 1 << 20, 1, (1 << 20) / r)
    assert h.median_rate("c") == pytest.approx(float(np.median(rates)))


def test_saves_later_keep_every_sample_and_report_failures(tmp_path):
    """A writer's close hands its history over to be saved later: nothing is written then,
    load_history in the process sees the samples at once, wait_saves (or the interpreter's
    exit) merges them into the file in one save, and a save that cannot write says why."""
    path = tmp_path / "h.json"
    for k in range(4):  # each from its own load, as four writers closing one after another
        h = hist.load_history(str(path)) if k % 2 else hist.History()
        h.add("async.io", 1 << 20 << k, 1, 0.001)
        hist.save_history_soon(h, str(path))
    assert not path.exists()  # nothing written at close
    want = [1 << 20 << k for k in range(4)]
    got = hist.load_history(str(path)).samples("async.io")  # pending samples, in memory
    assert sorted(x1 for x1, _, _ in got) == want
    hist.wait_saves()
    got = hist.load_history(str(path)).samples("async.io")
    assert sorted(x1 for x1, _, _ in got) == want  # each once: written, no longer pending
    errors: list[OSError] = []
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    h = hist.History()
    h.add("async.io", 1 << 20, 1, 0.001)
    hist.save_history_soon(h, str(blocker / "h.json"), on_error=errors.append)
    hist.wait_saves()
    assert len(errors) == 1 and isinstance(errors[0], OSError)
    hist.save_history_soon(hist.History(), str(path))  # nothing measured: nothing pending
    assert not hist._PENDING


def test_a_history_changed_on_disk_is_read_again(tmp_path):
    """Loads in one process reuse what was read while the file is unchanged, and read it
    again once another process saved to it."""
    path = str(tmp_path / "h.json")
    a = hist.History()
    a.add("x", 10, 1, 1.0)
    hist.save_history(a, path)
    assert hist.load_history(path).samples("x") == [(10, 1, 1.0)]
    first = hist.load_history(path)
    first.series["x"].append((99, 1, 1.0))  # a caller's copy: the next load is not changed
    assert hist.load_history(path).samples("x") == [(10, 1, 1.0)]
    doc = json.loads(open(path).read())  # another process adds a sample
    doc["series"]["x"].append([20, 1, 1.0])
    with open(path, "w") as f:
        f.write(json.dumps(doc) + " " * 7)  # another size: another stamp
    assert hist.load_history(path).samples("x") == [(10, 1, 1.0), (20, 1, 1.0)]


def test_a_save_racing_another_keeps_the_others_samples(tmp_path, monkeypatch):
    """Another process replaces the file right after this one's save: the next load here
    reads the file (not what this process wrote), and the next save keeps both."""
    path = str(tmp_path / "h.json")
    real = hist.write_cache_file

    def racy(p, text, *what):
        st = real(p, text, *what)
        other = hist.History.from_json(open(p).read())  # another process adds its sample
        other.series.setdefault("other", []).append((1.0, 1.0, 1.0))
        real(p, other.to_json() + " " * 3)
        return st

    a = hist.History()
    a.add("mine", 1, 1, 1)
    monkeypatch.setattr(hist, "write_cache_file", racy)
    hist.save_history(a, path)
    monkeypatch.setattr(hist, "write_cache_file", real)
    assert sorted(hist.load_history(path).series) == ["mine", "other"]
    b = hist.History()
    b.add("later", 1, 1, 1)
    hist.save_history(b, path)
    assert sorted(json.loads(open(path).read())["series"]) == ["later", "mine", "other"]


def test_pending_samples_are_not_saved_twice_by_a_forked_child(tmp_path):
    """A child made by fork does not save the samples its parent still has pending."""
    import os

    path = tmp_path / "h.json"
    h = hist.History()
    h.add("async.io", 1 << 20, 1, 0.001)
    hist.save_history_soon(h, str(path))
    pid = os.fork()
    if pid == 0:  # the child: its exit would run wait_saves
        code = 0 if not hist._PENDING else 1
        hist.wait_saves()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not path.exists()
    hist.wait_saves()
    assert len(hist.load_history(str(path)).samples("async.io")) == 1


def test_save_merges_with_what_others_saved(tmp_path):
    path = str(tmp_path / "h.json")
    a, b = hist.load_history(path), hist.load_history(path)  # two runs, both from nothing
    a.add("x", 10, 1, 1.0)
    b.add("x", 20, 1, 1.0)
    b.add("y", 5, 1, 1.0)
    hist.save_history(a, path)
    hist.save_history(b, path)
    back = hist.load_history(path)
    assert back.samples("x") == [(10, 1, 1.0), (20, 1, 1.0)] and back.samples("y") == [(5, 1, 1.0)]
    assert a.added == {} and b.added == {}
    hist.save_history(b, path)  # nothing new: nothing written twice
    assert hist.load_history(path).samples("x") == back.samples("x")


def test_a_file_changed_since_it_was_loaded_is_read_again_before_saving(tmp_path):
    path = str(tmp_path / "h.json")
    seed = hist.History()
    seed.add("x", 1, 1, 1.0)
    hist.save_history(seed, path)
    a, b = hist.load_history(path), hist.load_history(path)
    assert a.stamp is not None and a.stamp == b.stamp
    a.add("x", 2, 1, 1.0)
    hist.save_history(a, path)  # the file is as a found it: written from a, not read again
    b.add("x", 3, 1, 1.0)
    hist.save_history(b, path)  # a changed it since b loaded it: read again and merged
    a.add("x", 4, 1, 1.0)
    hist.save_history(a, path)  # and b since a saved
    assert [s[0] for s in hist.load_history(path).samples("x")] == [1, 2, 3, 4]


def test_merged_keeps_every_series():
    a, b = hist.History(), hist.History()
    a.add("x", 1, 1, 1.0)
    b.add("x", 2, 1, 1.0)
    b.add("z", 3, 1, 1.0)
    m = a.merged(b)
    assert m.samples("x") == [(1, 1, 1.0), (2, 1, 1.0)] and m.samples("z") == [(3, 1, 1.0)]
    assert m.added == {}


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        json.dumps({"version": 1, "host": host(), "io": [], "copy_rates": []}),  # the old one
        json.dumps({"version": hist.HISTORY_VERSION, "host": "elsewhere", "series": {}}),
        json.dumps({"version": hist.HISTORY_VERSION, "host": host(), "series": []}),
        json.dumps([]),
    ],
)
def test_unusable_history_is_a_format_error_and_ignored(tmp_path, doc):
    with pytest.raises(FormatError):
        hist.History.from_json(doc)
    path = tmp_path / "h.json"
    path.write_text(doc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaminaWarning)
        assert hist.load_history(str(path)).series == {}  # a fresh history: measured again


@pytest.mark.parametrize(
    "doc",
    [
        json.dumps({"version": hist.HISTORY_VERSION, "host": host(), "series": {"s": {}}}),
        json.dumps({"version": hist.HISTORY_VERSION, "host": host(), "series": {"s": [[1, 1]]}}),
        json.dumps(
            {"version": hist.HISTORY_VERSION, "host": host(), "series": {"s": [[1, 1, -2]]}}
        ),
        json.dumps(
            {"version": hist.HISTORY_VERSION, "host": host(), "series": {"s": [[1, True, 2]]}}
        ),
        json.dumps(
            {"version": hist.HISTORY_VERSION, "host": host(), "series": {"s": [["1", 1, 2]]}}
        ),
        json.dumps(
            {"version": hist.HISTORY_VERSION, "host": host(), "series": {"s": [[1, 0.5, 2]]}}
        ),
        # inf: JSON has no such number, Python's parser makes one
        '{"version": '
        + str(hist.HISTORY_VERSION)
        + ', "host": '
        + json.dumps(host())
        + ', "series": {"s": [[1e400, 1, 2]]}}',
    ],
)
def test_unusable_samples_and_series_are_left_out(tmp_path, doc):
    got = hist.History.from_json(doc)
    assert got.series == {} and got.dropped == 1
    path = tmp_path / "h.json"
    path.write_text(doc)
    with pytest.warns(LaminaWarning, match="1 unusable samples or series left out"):
        assert hist.load_history(str(path)).series == {}  # a fresh history: measured again


def test_a_fifo_is_not_read(tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.warns(LaminaWarning, match="not a regular file"):
        assert hist.load_history(str(fifo)).series == {}


def _one_sample() -> hist.History:
    h = hist.History()
    h.add("x", 1024.0, 1.0, 0.001)
    return h


def test_a_fifo_is_not_replaced_by_a_save(tmp_path):
    """A save left a regular file in the FIFO's place (as root, LAMINA_HISTORY=/dev/null
    replaced the device): nothing is written, with one warning naming the path for the
    load and the saves together."""
    import os
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.warns(LaminaWarning) as said:
        hist.load_history(str(fifo))
        hist.save_history(_one_sample(), str(fifo))
        hist.save_history_soon(_one_sample(), str(fifo))
        hist.wait_saves()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [str(w.message) for w in said] == [
        f"measured history {fifo} is a FIFO, not a regular file: it is neither read nor "
        "replaced, and nothing measured is kept there (give a regular file's path, or "
        f"{os.devnull} to keep nothing)"
    ]
    assert sorted(os.listdir(tmp_path)) == ["fifo"]  # no lock file, no temporary file left


def test_a_directory_as_history_is_named_once(tmp_path):
    """A directory: its path named (not 'Is a directory: 24', a descriptor), once."""
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.warns(LaminaWarning) as said:
        assert hist.load_history(str(d)).series == {}
        hist.save_history(_one_sample(), str(d))
    assert len(said) == 1 and f"{d} is a directory, not a regular file" in str(said[0].message)
    assert list(d.iterdir()) == []


def test_the_null_device_keeps_no_history_without_a_word(tmp_path):
    """LAMINA_HISTORY=/dev/null (here through a link to it): nothing read, nothing saved,
    no warning, the link stays (a save replaced it with a file)."""
    import os

    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hist.load_history(str(link)).series == {}
        hist.save_history(_one_sample(), str(link))
        hist.save_history_soon(_one_sample(), str(link))
        hist.wait_saves()
    assert link.is_symlink() and os.readlink(link) == os.devnull


def test_a_link_to_a_history_is_kept_and_its_file_written(tmp_path):
    """A symbolic link at the path: the file it names is written (as editors do), the link
    stays a link."""
    real = tmp_path / "shared" / "h.json"
    link = tmp_path / "h.json"
    link.symlink_to(real)  # the file does not exist yet
    hist.save_history(_one_sample(), str(link))
    assert link.is_symlink() and real.is_file()
    assert hist.load_history(str(link)).samples("x") == [(1024.0, 1.0, 0.001)]
    assert hist.load_history(str(real)).samples("x") == [(1024.0, 1.0, 0.001)]


def _as_host(monkeypatch, name: str) -> None:
    """This process as host *name* (what it read of the files is forgotten: a process of
    that host reads them afresh)."""
    monkeypatch.setattr(hist, "host", lambda: name)
    hist._LOADED.clear()


def test_another_hosts_history_at_the_path_is_kept(tmp_path, monkeypatch):
    """A history of another host at the same path (a home directory the hosts of a cluster
    share) was taken as empty and replaced: its samples were lost.  Each host's part is
    kept side by side; a file of one host, as written before, is that host's part."""
    path = tmp_path / "h.json"
    theirs = [[1024.0, 1.0, 0.003]] * 50
    doc = {"version": 2, "host": "login01", "series": {"async.io": theirs}, "used": {}}
    path.write_text(json.dumps(doc))
    assert hist.load_history(str(path)).series == {}  # not this host's
    hist.save_history(_one_sample(), str(path))
    assert hist.load_history(str(path)).samples("x") == [(1024.0, 1.0, 0.001)]
    saved = json.loads(path.read_text())
    assert saved["host"] == host() and saved["others"]["login01"]["series"]["async.io"] == theirs
    _as_host(monkeypatch, "login01")  # the other host reads its own, then adds to it
    assert len(hist.load_history(str(path)).samples("async.io")) == 50
    h = hist.History()
    h.add("async.io", 2048.0, 1.0, 0.004)
    hist.save_history(h, str(path))
    assert len(hist.load_history(str(path)).samples("async.io")) == 51
    monkeypatch.undo()  # this host again: its part is there still
    hist._LOADED.clear()
    assert hist.load_history(str(path)).samples("x") == [(1024.0, 1.0, 0.001)]
    saved = json.loads(path.read_text())
    assert saved["host"] == "login01" and set(saved["others"]) == {host()}


def test_a_history_file_keeps_the_most_recently_saved_hosts(tmp_path, monkeypatch):
    """At most MAX_HOSTS hosts (the least recently saved left out first), and never more
    than a reader takes (MAX_FILE_BYTES)."""
    path = tmp_path / "h.json"
    others = {
        f"node{i:02d}": {"series": {"s": [[1024.0, 1.0, 0.001]]}, "used": {"s": 1000.0 + i}}
        for i in range(hist.MAX_HOSTS + 4)
    }
    doc = {"version": 2, "host": "login", "series": {}, "used": {}, "others": others}
    path.write_text(json.dumps(doc))
    hist.save_history(_one_sample(), str(path))
    kept = json.loads(path.read_text())["others"]
    newest = sorted(others)[-(hist.MAX_HOSTS - 1) :]  # "login" (used nothing) left out too
    assert sorted(kept) == newest
    monkeypatch.setattr(hist, "MAX_FILE_BYTES", len(path.read_text()) - 10)
    hist.save_history(_one_sample(), str(path))
    text = path.read_text()
    assert len(text) <= hist.MAX_FILE_BYTES
    assert sorted(json.loads(text)["others"]) == newest[1:]  # the oldest one left out


# -- signatures ----------------------------------------------------------------------------------


def test_signature_numbers_the_inputs_and_names_the_dtype():
    a = hist.signature("magnitude(vx, vy, vz)", "f8")
    assert a == hist.signature("magnitude(u, v, w)", np.float64)
    assert a != hist.signature("magnitude(u, v, w)", "f4")
    assert hist.signature("`g/b` + a * 2", "f8") == hist.signature("y + x * 2", "f8")
    assert hist.signature("`g/b` + a * 2", "f8") != hist.signature("x + y * 2", "f8")
    assert hist.signature("curl(vx, vy, vz)", "f8") != a


# -- what the derived layer records --------------------------------------------------------------


def test_the_derived_layer_times_its_work(tmp_path, monkeypatch):
    import lamina

    path = tmp_path / "history.json"
    monkeypatch.setenv("LAMINA_HISTORY", str(path))
    shape = (16, 32, 32)
    rng = np.random.default_rng(0)
    data = {c: rng.random(shape) for c in ("vx", "vy", "vz")}
    f_path = str(tmp_path / "t.lam")
    with lamina.open(f_path, "w", durable=False) as f:
        for c in data:
            f.create_dataset(c, shape)
        f.derive("m_store", "magnitude(vx, vy, vz)", strategy="store")
        f.derive("m_stats", "magnitude(vx, vy, vz)", strategy="stats")
        f.derive("m_expr", "magnitude(vx, vy, vz)", strategy="expression")
        with f.step():
            for c, a in data.items():
                for i in range(4):  # 4 blocks of 4 planes
                    f[c][4 * i : 4 * i + 4] = a[4 * i : 4 * i + 4]
    h = hist.load_history(str(path))
    sig = hist.signature("magnitude(vx, vy, vz)", "f8")
    n, per_block = 16 * 32 * 32, 4 * 32 * 32
    for s in ("store", "stats"):
        ((x1, x2, t),) = h.samples(f"derive.{s}.{sig}")
        assert x1 == n and x2 == pytest.approx(per_block, rel=0.01) and t > 0  # x2: 2 digits
    ((x1, x2, _),) = h.samples("write")
    assert x1 == 4 * n * 8 and x2 == pytest.approx(per_block * 8, rel=0.01)  # 3 inputs, store
    assert h.samples(f"compute.{sig}") == []  # nothing recomputed yet
    with lamina.open(f_path) as f:
        np.testing.assert_allclose(
            f["m_expr"][...], np.sqrt(data["vx"] ** 2 + data["vy"] ** 2 + data["vz"] ** 2)
        )
        f["m_store"][...]
    h = hist.load_history(str(path))
    ((x1, x2, _),) = h.samples(f"compute.{sig}")
    assert x1 == n and x2 == pytest.approx(per_block, rel=0.01)
    reads = h.samples("read")  # the inputs of the recomputation and the stored quantity
    assert len(reads) == 1 and reads[0][0] == 4 * n * 8
    assert reads[0][1] == pytest.approx(per_block * 8, rel=0.01)
    assert [s for s in h.series if s.startswith("query")] == []  # no query yet
    with lamina.open(f_path) as f:
        top = float(f["m_expr"][...].max())
        # Expression: every unit's values read to find its range, all candidates (kept)
        assert len(f.query(f"m_expr <= {top}", select=["m_expr"], exact=False).candidates) == 4
        # Store, pruned by its statistics: only the selected values of the candidates are read
        res = f.query(f"m_store > {top + 1}", select=["m_store"], exact=False)
        assert res.candidates == []
        f.query(f"m_store <= {top}", select=["m_store"], exact=False)
    h = hist.load_history(str(path))
    for s in ("expression", "store"):  # one series per strategy judged
        ((x1, x2, t),) = h.samples(f"query.{s}")
        assert x1 == n and x2 == pytest.approx(per_block, rel=0.01) and t > 0
    assert h.samples("query") == [] and h.samples("query.stats") == []
    with lamina.open(f_path) as f:  # two strategies judged together: the series of all queries
        f.query(f"m_store <= {top} & m_expr <= {top}", select=["m_store"], exact=False)
    ((x1, _, t),) = hist.load_history(str(path)).samples("query")
    assert x1 >= n and t > 0


def test_a_read_sample_counts_the_bytes_read_and_never_the_checksum_librarys_import(
    tmp_path, monkeypatch
):
    """A read of one value of a 16 KiB block was a sample of 8 bytes (the values selected)
    in the time of the block's read; and the first large read of a process, which imports
    the checksums' library (37 ms), was a sample too: a few `lamina dump` runs made the
    model predict 78 s for a read of 16 KiB."""
    import lamina
    from lamina import stats

    path = tmp_path / "history.json"
    monkeypatch.setenv("LAMINA_HISTORY", str(path))
    f_path = str(tmp_path / "r.lam")
    with lamina.open(f_path, "w", durable=False) as f:
        for c in ("vx", "vy", "vz"):
            f.create_dataset(c, (16, 16, 8))
        f.derive("m", "magnitude(vx, vy, vz)", strategy="expression")
        with f.step():
            for c in ("vx", "vy", "vz"):
                f[c][...] = 1.0
    stats.crc(np.zeros(1 << 15, np.uint8))  # the library loaded: reads below are sampled
    with lamina.open(f_path) as f:
        f["vx"][0, 0, 0]  # one value of the block: no sample
        f["vx"][:9]  # more than half of it: a sample
    reads = hist.load_history(str(path)).samples("read")
    assert [x1 for x1, _, _ in reads] == [9 * 16 * 8 * 8], reads
    monkeypatch.setattr(stats, "_fast_crc", None)  # as in a new process: this read imports it
    with lamina.open(f_path) as f:
        f["vy"][...]
    assert len(hist.load_history(str(path)).samples("read")) == 1


def test_a_file_without_derived_quantities_keeps_no_history(tmp_path, monkeypatch):
    import lamina

    path = tmp_path / "history.json"
    monkeypatch.setenv("LAMINA_HISTORY", str(path))
    with lamina.open(str(tmp_path / "p.lam"), "w", durable=False) as f:
        f.create_dataset("x", (64,), "f8")
        with f.step():
            f["x"][...] = 1.0
    with lamina.open(str(tmp_path / "p.lam")) as f:
        f["x"][...]
        f.query("x > 0", select=["x"])
    assert not path.exists()


def test_a_variable_that_hardly_varies_is_left_out():
    """Two block sizes, the elements nearly equal (grids of slightly different shapes): the fit
    is a line in the block size, not a plane tilted at random by the elements."""
    samples = [(1.00e7, 1e3, 1.00e7 / 1e7), (1.01e7, 1e5, 1.01e7 / 3e7)] * 2
    samples.append((0.99e7, 1e4, 0.99e7 / 2e7))
    fit = hist.fit_rate(samples)
    assert fit.coef[1] == 0.0  # the elements: left out
    assert fit.kind == "linear-log" and fit.r2 == pytest.approx(1.0)
    assert fit.rate(5e6, 1e4) == pytest.approx(2e7)


def test_per_block_cost_extrapolates_to_smaller_blocks():
    """t = N x 10 ns + blocks x 0.7 ms (the shape measured for recomputing block by block):
    fitted at 8 and 16 blocks, it predicts 32 blocks within 5 %, where a line in the block
    size would not."""
    n = 693_600

    def secs(blocks):
        return n * 10e-9 + blocks * 0.7e-3

    train = [(n, n / b, secs(b)) for b in (8, 16)] * 2
    fit = hist.fit_rate(train)
    assert fit.kind == "per-block" and fit.coef == pytest.approx((10e-9, 0.7e-3), rel=1e-6)
    assert fit.seconds(n, n / 32) == pytest.approx(secs(32), rel=0.05)
    assert fit.seconds(2 * n, n / 32) == pytest.approx(2 * secs(32), rel=0.05)


@pytest.mark.parametrize("version", [hist.HISTORY_VERSION + 1, 99])
def test_a_history_of_a_newer_lamina_is_neither_read_nor_replaced(tmp_path, version):
    """A history written by a newer lamina (one $HOME, two lamina versions on a cluster) was
    replaced by this lamina's at the next save: the newer lamina's measurements were lost.
    It is now neither read nor replaced, with one warning naming the path."""
    path = tmp_path / "history.json"
    text = json.dumps(
        {"version": version, "host": host(), "series": {"future.series": [[1.0, 1.0, 0.1]]}}
    )
    path.write_text(text)
    with pytest.warns(LaminaWarning) as said:
        assert hist.load_history(str(path)).series == {}
        hist.save_history(_one_sample(), str(path))
        hist.save_history_soon(_one_sample(), str(path))
        hist.wait_saves()
        assert hist.load_history(str(path)).series == {}
    assert path.read_text() == text
    msgs = [str(w.message) for w in said]
    assert len(msgs) == 1, msgs
    assert str(path) in msgs[0] and f"version {version}" in msgs[0], msgs
    assert "neither read nor replaced" in msgs[0], msgs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json"]


def test_a_history_of_an_older_version_is_replaced_quietly(tmp_path):
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"version": 1, "host": host(), "io": [], "copy_rates": []}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hist.save_history(_one_sample(), str(path))
    assert json.loads(path.read_text())["version"] == hist.HISTORY_VERSION
