"""Speed of the derived-quantity kernels against plain numpy (and numexpr when installed).

``python -m lamina.derived.bench [--mib 128] [--repeat 5] [--chunk N]``

Each case runs lamina's :func:`~lamina.derived.evaluate` and its baselines in
one process on the same data, and prints the best time and the bandwidth of
compulsory memory traffic (inputs read once, outputs written once), plus the
ratio to plain numpy: on a shared machine, ratios are what to compare.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from . import evaluate, parse
from .kernels import CHUNK_ELEMENTS


def _best(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up (page faults of the first allocation, imports)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run(mib: int = 128, repeat: int = 5, chunk: int | None = None) -> list[dict]:
    """Run every case; return rows of {case, impl, seconds, gbps, vs_numpy}."""
    n = mib * 2**20 // 8
    side = round(n ** (1 / 3))
    rng = np.random.default_rng(0)
    flat = {k: rng.random(n) for k in ("vx", "vy", "vz")}
    cube = {k: rng.random((side, side, side)) for k in ("u", "v", "w")}
    try:
        import numexpr  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - optional baseline
        numexpr = None

    vx, vy, vz = flat["vx"], flat["vy"], flat["vz"]
    u, v, w = cube["u"], cube["v"], cube["w"]

    def grad(x, ax):
        return np.gradient(x, axis=ax, edge_order=2)

    cases: list[tuple[str, int, dict[str, Callable[[], object]]]] = [
        (
            "magnitude(vx, vy, vz)",
            4 * n * 8,
            {
                "numpy": lambda: np.sqrt(vx * vx + vy * vy + vz * vz),
                "numexpr": (
                    lambda: numexpr.evaluate("sqrt(vx*vx + vy*vy + vz*vz)", local_dict=flat)
                )
                if numexpr
                else None,
                "lamina": lambda: evaluate("magnitude(vx, vy, vz)", flat, chunk_elements=chunk),
            },
        ),
        (
            "add(vx, vy)",
            3 * n * 8,
            {
                "numpy": lambda: vx + vy,
                "numexpr": (lambda: numexpr.evaluate("vx + vy", local_dict=flat))
                if numexpr
                else None,
                "lamina": lambda: evaluate("add(vx, vy)", flat, chunk_elements=chunk),
            },
        ),
        (
            "curl(u, v, w)",
            6 * side**3 * 8,
            {
                "numpy": lambda: (
                    grad(w, 1) - grad(v, 2),
                    grad(u, 2) - grad(w, 0),
                    grad(v, 0) - grad(u, 1),
                ),
                "lamina": lambda: evaluate("curl(u, v, w)", cube, chunk_elements=chunk),
            },
        ),
        (
            "magnitude(curl(u, v, w))",
            4 * side**3 * 8,
            {
                "numpy": lambda: np.sqrt(
                    sum(
                        c * c
                        for c in (
                            grad(w, 1) - grad(v, 2),
                            grad(u, 2) - grad(w, 0),
                            grad(v, 0) - grad(u, 1),
                        )
                    )
                ),
                "lamina": lambda: evaluate("magnitude(curl(u, v, w))", cube, chunk_elements=chunk),
            },
        ),
        (
            "laplacian(u)",
            2 * side**3 * 8,
            {
                "numpy": lambda: sum(grad(grad(u, j), j) for j in range(3)),
                "lamina": lambda: evaluate("laplacian(u)", cube, chunk_elements=chunk),
            },
        ),
    ]
    rows = []
    for name, traffic, impls in cases:
        base = None
        for impl, fn in impls.items():
            if fn is None:
                continue
            t = _best(fn, repeat)
            base = t if impl == "numpy" else base
            rows.append(
                {
                    "case": name,
                    "impl": impl,
                    "seconds": t,
                    "gbps": traffic / t / 1e9,
                    "vs_numpy": (base / t) if base else 1.0,
                    "flops": parse(name).flops_per_element,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--mib", type=int, default=128, help="size of each input array in MiB (default 128)"
    )
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--chunk", type=int, default=None, help=f"elements per block (default {CHUNK_ELEMENTS})"
    )
    args = p.parse_args(argv)
    print(
        f"inputs: float64, {args.mib} MiB each; best of {args.repeat}; GB/s of compulsory traffic"
    )
    for r in run(args.mib, args.repeat, args.chunk):
        print(
            f"{r['case']:26s} {r['impl']:8s} {r['seconds'] * 1e3:9.1f} ms {r['gbps']:7.2f} GB/s"
            f"   x{r['vs_numpy']:.2f} vs numpy"
        )


if __name__ == "__main__":
    main()
