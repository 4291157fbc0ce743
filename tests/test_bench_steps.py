"""Smoke test of ``lamina bench steps``: a tiny run that times every method at two dataset counts.

Not a timed test: it checks that each method wrote and read (what every
method reads back is compared inside the benchmark), that the files are
gone, and that nonsense arguments are refused.
"""

from __future__ import annotations

import json

from lamina.bench import steps


def test_bench_steps_smoke_json(tmp_path, capsys):
    argv = ["--datasets", "1,3", "--elements", "8", "--steps", "2", "--warmup", "1"]
    assert steps.main([*argv, "--repeat", "1", "--dir", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [r["datasets"] for r in out["rows"]] == [1, 3]
    for r in out["rows"]:
        for phase in ("write", "read"):
            for m in steps.METHODS:
                assert r[phase][m]["median"] > 0 and len(r[phase][m]["times"]) == 1
    assert "lamina/adios2 BP5" in captured.err
    assert "\nwrite\n" in captured.err and "\nread\n" in captured.err
    assert not list(tmp_path.iterdir())  # every file removed


def test_bench_steps_refuses_nonsense(capsys):
    assert steps.main(["--datasets", "0"]) == 2
    assert "need --datasets" in capsys.readouterr().err
    assert steps.main(["--datasets", "x"]) == 2
    assert steps.main(["--seed", "-1"]) == 2  # (numpy's ValueError, a traceback)
    assert "--seed >= 0" in capsys.readouterr().err
    assert steps.main(["--methods", "lamina,hdf6"]) == 2
    assert "unknown method" in capsys.readouterr().err
