"""``lamina bench derived``: the derived-quantity kernels against memcpy and plain numpy, one run.

The kernels of Table II of "To Derive or Not to Derive" (ADIOS2 derived
variables), each on ``--mib`` MiB of float64 input in all (one buffer of
random numbers, cut into the inputs; the stencil's inputs are cubes):

``add``        ``a + b``
``magnitude``  ``magnitude(vx, vy, vz)``
``curl``       ``curl(u, v, w)``

and, with ``--kernels``, ``magnitude-curl`` (``magnitude(curl(u, v, w))``) and
``laplacian`` (``laplacian(u)``).  Each kernel runs as:

``numpy``         the naive numpy expression, with its temporaries (``numpy.gradient``
                  for the stencils): the baseline
``lamina``        :func:`lamina.derived.evaluate`, returning new arrays
``lamina out=``   the same into preallocated arrays (no page faults of a new result)
``lamina gpu``    ``device="gpu"``, host to device and back included (only with CuPy and a device)
``lamina gpu out=``     the same into preallocated host arrays
``lamina gpu resident`` inputs already on the device, results left there: the device's kernels alone

The result of every lamina row's last timed run (the ``out=`` rows: the
arrays they write into, each row its own) is compared with numpy's,
untimed; a difference is reported and the exit status is 1.

Speeds are GB/s of compulsory memory traffic: inputs read once, outputs
written once (:meth:`lamina.derived.Expr.bytes_per_element`).  The same run
measures this machine's memcpy (``numpy.copyto`` of up to 128 MiB into a
preallocated array, bytes read + written; see :data:`MEMCPY_BYTES`) in every
round of every kernel, and the targets compare ``lamina out=`` (preallocated
like the memcpy) with it: ``add`` and ``magnitude`` >= 0.6x memcpy, ``curl``
>= 0.3x.  A round runs the memcpy and every implementation of a kernel once,
in an order that rotates, after one untimed run of each; times are the best
of ``--repeat`` rounds, ratios the median over rounds of the ratio within a
round (best case in parentheses), since on a shared machine the load changes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..text import fmt_bytes, table
from . import common

#: bytes of the memcpy: far beyond the caches, but below glibc's threshold for non-temporal
#: stores (3/4 of the last-level cache, 192 MiB on a 32 MiB-L3 machine), so that the copy writes
#: through the cache as numpy's ufuncs do (a streaming copy runs up to twice as fast)
MEMCPY_BYTES = 128 << 20
#: kernel -> target ratio of its speed (lamina out=) to memcpy
TARGETS = {"add": 0.6, "magnitude": 0.6, "curl": 0.3}


def _grad(x: np.ndarray, axis: int) -> np.ndarray:
    return np.gradient(x, axis=axis, edge_order=2)


def _numpy_curl(u, v, w):
    return (
        _grad(w, 1) - _grad(v, 2),
        _grad(u, 2) - _grad(w, 0),
        _grad(v, 0) - _grad(u, 1),
    )


@dataclass(frozen=True)
class Kernel:
    name: str
    expr: str
    inputs: tuple[str, ...]
    cube: bool
    numpy: Callable[..., Any]


KERNELS = {
    k.name: k
    for k in (
        Kernel("add", "a + b", ("a", "b"), False, lambda a, b: a + b),
        Kernel(
            "magnitude",
            "magnitude(vx, vy, vz)",
            ("vx", "vy", "vz"),
            False,
            lambda vx, vy, vz: np.sqrt(vx * vx + vy * vy + vz * vz),
        ),
        Kernel("curl", "curl(u, v, w)", ("u", "v", "w"), True, _numpy_curl),
        Kernel(
            "magnitude-curl",
            "magnitude(curl(u, v, w))",
            ("u", "v", "w"),
            True,
            lambda u, v, w: np.sqrt(sum(c * c for c in _numpy_curl(u, v, w))),
        ),
        Kernel(
            "laplacian",
            "laplacian(u)",
            ("u",),
            True,
            lambda u: sum(_grad(_grad(u, j), j) for j in range(3)),
        ),
    )
}
DEFAULT_KERNELS = ("add", "magnitude", "curl")
NOTES = {
    "memcpy": "numpy.copyto, the reference",
    "numpy": "naive, with temporaries",
    "lamina": "evaluate, new result",
    "lamina out=": "evaluate(out=...)",
    "lamina gpu": "device='gpu', host<->device copies included",
    "lamina gpu out=": "the same into preallocated host arrays",
    "lamina gpu resident": "inputs and results on the device: the kernels alone",
}


def _gpu_fns(e, arrays: dict, outs: list) -> dict[str, Callable[[], object]]:
    """The GPU rows: from and to host memory, into preallocated host arrays (*outs*, this
    row's own), and on the device.

    Each waits for the device to finish, so that its time is the work's, and returns its
    result (the resident row's on the device).
    """
    import cupy  # type: ignore[import-not-found]

    from ..derived import evaluate

    sync = cupy.cuda.Device().synchronize
    on_device = {p: cupy.asarray(a) for p, a in arrays.items()}

    def resident():
        got = evaluate(e, on_device, device="gpu", to_host=False)
        sync()
        return got

    def into():
        evaluate(e, arrays, device="gpu", out=outs)
        return outs

    return {
        "lamina gpu": lambda: evaluate(e, arrays, device="gpu"),
        "lamina gpu out=": into,
        "lamina gpu resident": resident,
    }


def _gpu_status() -> tuple[bool, str]:
    """(usable, why not)."""
    from ..derived import gpu_available

    if gpu_available():
        return True, ""
    try:
        import cupy  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False, "CuPy is not installed"
    except Exception as e:  # noqa: BLE001 - a broken installation is a reason too
        return False, f"CuPy does not load ({type(e).__name__}: {e})"
    return False, "CuPy finds no CUDA device"


def _inputs(buf: np.ndarray, k: Kernel) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """The kernel's inputs as views of *buf* (each 1/k of it; cubes for stencils)."""
    n = buf.size // len(k.inputs)
    shape: tuple[int, ...] = (n,)
    if k.cube:
        side = int(round(n ** (1 / 3)))
        while side**3 > n:
            side -= 1
        if side < 3:
            raise ValueError(f"--mib too small for the stencil of {k.name}")
        shape = (side, side, side)
    m = int(np.prod(shape))
    return {p: buf[i * n : i * n + m].reshape(shape) for i, p in enumerate(k.inputs)}, shape


def _row(kernel: str, impl: str, times: list[float], traffic: int, note: str = "") -> dict:
    s = common.summarize(times)
    return {
        "kernel": kernel,
        "impl": impl,
        "min": s["min"],
        "median": s["median"],
        "times": s["times"],
        "gbps": traffic / s["min"] / 1e9,
        "note": note,
    }


def _same(got, want) -> bool:
    """Whether *got* (a list of results, numpy or CuPy) is *want* (numpy's: one array or a
    tuple of them)."""
    got = list(got) if isinstance(got, tuple | list) else [got]
    want = list(want) if isinstance(want, tuple | list) else [want]
    return len(got) == len(want) and all(
        np.allclose(g.get() if hasattr(g, "get") else g, w, rtol=1e-12, atol=1e-12)
        for g, w in zip(got, want, strict=True)
    )


def run(
    mib: int,
    repeat: int,
    kernels: list[str],
    chunk: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Measure memcpy and every kernel; the JSON document of the run."""
    from ..derived import evaluate, parse

    say = progress or (lambda _msg: None)
    n = mib * common.MiB // common.ITEM
    say(f"filling {fmt_bytes(n * common.ITEM)} of float64...")
    buf = np.random.default_rng(0).random(n)
    # memcpy: part of the buffer into a preallocated array, counting bytes read and written; run
    # in every round of every kernel, so that it is measured under the same load
    src = buf[: min(n // 2, MEMCPY_BYTES // common.ITEM)]
    dst = np.empty_like(src)
    copy_times: list[float] = []
    gpu, why = _gpu_status()
    rows: list[dict] = []
    checks: dict[str, bool] = {}
    for name in kernels:
        k = KERNELS[name]
        e = parse(k.expr)
        arrays, shape = _inputs(buf, k)
        traffic = e.bytes_per_element(common.ITEM) * int(np.prod(shape))
        args = [arrays[p] for p in k.inputs]
        outs = [np.empty(shape) for _ in range(e.ncomponents)]

        def into(e=e, arrays=arrays, outs=outs):
            evaluate(e, arrays, chunk_elements=chunk, out=outs)
            return outs

        fns: dict[str, Callable[[], object]] = {
            "memcpy": lambda: np.copyto(dst, src),
            "numpy": lambda k=k, args=args: k.numpy(*args),
            "lamina": lambda e=e, arrays=arrays: evaluate(e, arrays, chunk_elements=chunk),
            "lamina out=": into,
        }
        if gpu:
            fns.update(_gpu_fns(e, arrays, [np.empty(shape) for _ in range(e.ncomponents)]))
        say(f"{name}: {', '.join(fns)}...")
        # every lamina row's own result of its last timed run against numpy's (untimed)
        want = k.numpy(*args)
        ok: dict[str, bool] = {}

        def check(impl: str, got, want=want, ok=ok) -> None:
            if impl.startswith("lamina"):
                ok[impl] = _same(got, want)

        times = common.rounds(fns, repeat, check)
        copy = times.pop("memcpy")
        copy_times += copy
        copy_gbps = [2 * src.nbytes / t / 1e9 for t in copy]
        mrow = _row(name, "memcpy", copy, 2 * src.nbytes, NOTES["memcpy"])
        krows = [_row(name, impl, t, traffic, NOTES[impl]) for impl, t in times.items()]
        for r in krows:
            r["ok"] = ok.get(r["impl"], True)
        base = krows[0]  # numpy
        for r in [mrow, *krows]:
            # paired: this row's speed over the memcpy's in the same round; best case: best / best
            pairs = [traffic / t / 1e9 / c for t, c in zip(r["times"], copy_gbps, strict=True)]
            if r is mrow:
                pairs = [1.0] * len(copy)
            r["vs_memcpy"] = common.summarize(pairs)["median"]
            r["vs_memcpy_best"] = r["gbps"] / mrow["gbps"]
            r["vs_numpy"] = common.speedup(base, r)[0] if r is not mrow else None
            r["vs_numpy_best"] = base["min"] / r["min"] if r is not mrow else None
        rows += [mrow, *krows]
        checks[name] = all(ok.get(impl, False) for impl in fns if impl.startswith("lamina"))
        del outs, fns
    memcpy = {
        "bytes": src.nbytes,
        "min": min(copy_times),
        "median": common.summarize(copy_times)["median"],
        "gbps": 2 * src.nbytes / min(copy_times) / 1e9,
        "median_gbps": 2 * src.nbytes / common.summarize(copy_times)["median"] / 1e9,
    }
    by = {(r["kernel"], r["impl"]): r for r in rows}
    targets = []
    for name in kernels:
        if name not in TARGETS:
            continue
        out, new = by[(name, "lamina out=")], by[(name, "lamina")]
        goal = TARGETS[name]
        targets.append(
            {
                "kernel": name,
                "target": goal,
                "vs_memcpy": out["vs_memcpy"],
                "vs_memcpy_best": out["vs_memcpy_best"],
                "verdict": common.verdict(out["vs_memcpy"], goal, best=out["vs_memcpy_best"]),
                "met": out["vs_memcpy"] >= goal,
                "vs_memcpy_new_result": new["vs_memcpy"],
                "vs_numpy": new["vs_numpy"],
                "vs_numpy_best": new["vs_numpy_best"],
            }
        )
    return {
        "benchmark": "derived",
        "options": {"mib": mib, "repeat": repeat, "kernels": kernels, "chunk": chunk},
        "machine": common.machine(),
        "memcpy": memcpy,
        "gpu": {"used": gpu, "skipped_because": why},
        "rows": rows,
        "checks": checks,
        "targets": targets,
    }


def _ratio(med: float | None, best: float | None) -> str:
    return common.ratio_cell((med, best))


def report(doc: dict) -> str:
    o = doc["options"]
    mc = doc["memcpy"]
    out = [
        f"lamina bench derived: float64, {fmt_bytes(o['mib'] * common.MiB)} of input per kernel, "
        f"{o['repeat']} round{'s' if o['repeat'] != 1 else ''} after 1 untimed run; a round runs "
        "the memcpy and every implementation of a kernel once",
        "GB/s of compulsory traffic (inputs read once, outputs written once; memcpy: bytes read + "
        "written) in the best round; ratios: paired median over rounds (best case in parentheses)",
        f"memcpy (numpy.copyto, {fmt_bytes(mc['bytes'])}) over the whole run: "
        f"best {mc['gbps']:.2f} GB/s, median {mc['median_gbps']:.2f} GB/s",
        "",
    ]
    body = []
    for r in doc["rows"]:
        body.append(
            [
                r["kernel"],
                r["impl"],
                f"{r['min'] * 1e3:.1f}",
                f"{r['gbps']:.2f}",
                _ratio(r["vs_memcpy"], r["vs_memcpy_best"]),
                _ratio(r["vs_numpy"], r["vs_numpy_best"]),
                r["note"],
            ]
        )
    out.append(
        table(["kernel", "impl", "best ms", "GB/s", "x memcpy", "x numpy", "note"], body, "llrrrrl")
    )
    if not doc["gpu"]["used"]:
        out.append(f"GPU path skipped: {doc['gpu']['skipped_because']}")
    bad = [f"{r['kernel']} ({r['impl']})" for r in doc["rows"] if not r.get("ok", True)]
    out.append(
        "results agree with numpy (every lamina row's)"
        if not bad
        else f"RESULTS DIFFER from numpy: {', '.join(bad)}"
    )
    if doc["targets"]:
        out.append("")
        out.append("### targets")
        body = [
            [
                t["kernel"],
                f">= {t['target']:.1f}x",
                _ratio(t["vs_memcpy"], t["vs_memcpy_best"]),
                t["verdict"],
                f"{t['vs_memcpy_new_result']:.2f}x",
                _ratio(t["vs_numpy"], t["vs_numpy_best"]),
            ]
            for t in doc["targets"]
        ]
        out.append(
            table(
                [
                    "kernel",
                    "target vs memcpy",
                    "lamina out=",
                    "verdict",
                    "lamina (new result)",
                    "lamina vs numpy",
                ],
                body,
                "llrlrr",
            )
        )
        out.append(
            "the target is judged on 'lamina out=' (output preallocated, as the memcpy's); "
            "'new result' includes the page faults of a fresh array"
        )
    return "\n".join(out)


def parser(prog: str = "lamina bench derived") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Derived-quantity kernels (add, magnitude, curl) vs memcpy and plain numpy.",
    )
    p.add_argument(
        "--mib",
        type=int,
        default=512,
        help="MiB of float64 input per kernel, all inputs together (default 512)",
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="timed runs per row, best kept (default 3)"
    )
    p.add_argument(
        "--kernels",
        default=",".join(DEFAULT_KERNELS),
        help=f"comma-separated, from {', '.join(KERNELS)} (default {','.join(DEFAULT_KERNELS)})",
    )
    p.add_argument("--chunk", type=int, default=None, help="elements per block of the CPU kernels")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout (the table goes to stderr)",
    )
    return p


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    if ns.mib < 1:
        p.error("--mib must be at least 1")
    if ns.repeat < 1:
        p.error("--repeat must be at least 1")
    if ns.chunk is not None and ns.chunk < 1:
        p.error("--chunk must be at least 1")
    try:
        common.check_memory(ns.mib << 20, f"--mib {ns.mib}")
    except ValueError as e:
        p.error(str(e))
    try:
        kernels = common.parse_choices(ns.kernels, "--kernels", KERNELS)
    except ValueError as e:
        p.error(str(e))
    try:
        doc = run(
            ns.mib,
            ns.repeat,
            kernels,
            ns.chunk,
            progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True),
        )
    except (ValueError, MemoryError) as e:
        print(f"lamina bench derived: {e}", file=sys.stderr)
        return 2
    common.emit(ns.json, report(doc), doc)
    return 0 if all(doc["checks"].values()) else 1
