"""Smoke test of ``lamina bench verify``: a tiny run times every method on one file.

Not a timed test: it checks that every method is timed, that verify found the
file intact (the benchmark checks it and fails otherwise), that the ratios are
those of the times, and that nonsense is refused by name.
"""

from __future__ import annotations

import json

import pytest

from lamina.bench import main as bench_main
from lamina.bench import verify as bench_verify


def test_bench_verify_smoke_json(capsys, tmp_path):
    argv = ["--mib", "2", "--steps", "2", "--block-mib", "1", "--repeat", "2"]
    assert bench_verify.main([*argv, "--dir", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["bytes"] == 4 << 20 and out["block_bytes"] == 1 << 20
    assert out["on_disk"] >= out["bytes"]
    for m in bench_verify.METHODS:
        assert len(out["times"][m]["times"]) == 2 and out["times"][m]["min"] > 0
        best = out["times"][m]["min"] / out["times"]["read"]["min"]
        assert out["over_read"][m][1] == pytest.approx(best)
    assert out["verify_over_h5py"][1] == pytest.approx(
        out["times"]["verify"]["min"] / out["times"]["h5py"]["min"]
    )
    assert "verify-stats" in captured.err and "/ h5py" in captured.err
    assert list(tmp_path.iterdir()) == []  # its files are gone


def test_bench_verify_fails_where_verify_would_say_damage(monkeypatch, tmp_path):
    """The benchmark checks verify's answer: a verify that found damage in the file it just
    wrote is an error, not a time."""
    from lamina import check as verify_mod

    real = verify_mod.verify

    def damaged(f, stats=False):
        got = real(f, stats)
        got["problems"] = [{"step": 0, "dataset": "u", "box": "[0:1]", "error": "injected"}]
        return got

    monkeypatch.setattr(verify_mod, "verify", damaged)
    with pytest.raises(AssertionError, match="injected"):
        bench_verify.main(
            [
                "--mib",
                "1",
                "--block-mib",
                "1",
                "--steps",
                "1",
                "--repeat",
                "1",
                "--dir",
                str(tmp_path),
            ]
        )


@pytest.mark.parametrize(
    "args, why",
    [
        (["--mib", "0"], "--mib, --steps, --block-mib and --repeat must be at least 1"),
        (["--mib", "2", "--block-mib", "4"], "--block-mib 4 is more than a step (--mib 2)"),
        (["--mib", "100000000"], "--mib 100000000 needs at least"),
    ],
)
def test_bench_verify_refuses_nonsense(args, why, capsys):
    assert bench_main(["verify", *args]) == 2
    assert why in capsys.readouterr().err
