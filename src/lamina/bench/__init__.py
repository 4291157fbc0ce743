"""Benchmark programs behind ``lamina bench``.

``lamina bench write`` and ``lamina bench read`` measure lamina native and
its baselines (raw numpy per rank, h5py, ADIOS2 BP5) in one run on the same
data and print speed ratios; see ``docs/performance.md``.  ``lamina bench
derived`` measures the derived-quantity kernels against memcpy and plain
numpy in one process.  ``lamina bench blocks`` measures the cost per block
of many small blocks (write, read, one-block read, query) against the same
baselines; ``lamina bench steps`` the cost of a step by the number of
datasets written in it.  ``lamina bench async`` measures background I/O (``io='async'``)
against synchronous I/O and ADIOS2 BP5 ``AsyncWrite``; ``lamina bench stats`` the
statistics and checksum pass against a memcpy; ``lamina bench verify``
``lamina verify`` against reading the file's bytes.  ``lamina bench
multires`` measures the multiresolution layout's write pipeline per
balancing scheme, its compression next to zfp and zstd, and reads by
level.  Absolute times on a shared machine are noise; the
ratios are the result.
"""

from __future__ import annotations

import signal
import sys
import threading

BENCHMARKS = {
    "write": "write throughput: numpy tofile, h5py, ADIOS2 BP5, lamina native (several aggregator counts)",
    "read": "read throughput, other decompositions, and bytes touched by a one-block read",
    "derived": "derived-quantity kernels (add, magnitude, curl) vs memcpy and plain numpy",
    "strategies": "derived quantities kept as store, stats, expression: measured vs the cost model",
    "insitu": "in situ transport (memory, file) vs hand-written mpi4py and memcpy, producers:consumers 3:1",
    "blocks": "cost per block, edges 4-64, 64-65,536 blocks per rank per step: numpy, ADIOS2 BP5, h5py chunked, lamina",
    "catalog": "open, step index and memory of a file of 100 steps x 100,000 blocks: lamina vs ADIOS2 BP5",
    "steps": "the cost of a step by the number of datasets in it: numpy, ADIOS2 BP5, h5py, lamina",
    "async": "background I/O: VPIC-IO-like write, BD-CATS-IO-like read, sync vs async vs ADIOS2 BP5 AsyncWrite",
    "stats": "the statistics and checksum pass of a block against a memcpy, by dtype",
    "verify": "lamina verify of a file against reading its bytes (and their CRC-32C) and h5py's fletcher32",
    "multires": "multiresolution layout: write phases and balance per scheme, compression vs zfp and zstd, reads by level, the size-grid micro-benchmark (--size-grid), 10^4-10^5 simulated ranks",
}

USAGE = (
    "usage: lamina bench {"
    + ",".join(BENCHMARKS)
    + "} [options]   (lamina bench NAME --help for the options)"
)


def main(argv: list[str]) -> int:
    """Run ``lamina bench NAME [options]``; returns the exit status."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        out = sys.stdout if argv else sys.stderr
        print(USAGE, file=out)
        for name, text in BENCHMARKS.items():
            print(f"  {name:10} {text}", file=out)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "write":
        from .write import main as run
    elif name == "read":
        from .read import main as run
    elif name == "derived":
        from .derived import main as run
    elif name == "strategies":
        from .strategies import main as run
    elif name == "insitu":
        from .insitu import main as run
    elif name == "blocks":
        from .blocks import main as run
    elif name == "catalog":
        from .catalog import main as run
    elif name == "steps":
        from .steps import main as run
    elif name == "async":
        from .background import main as run
    elif name == "multires":
        from .multires import main as run
    elif name == "stats":
        from .stats import main as run
    elif name == "verify":
        from .verify import main as run
    else:
        print(
            f"lamina bench: unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return run(rest)
    except SystemExit as e:  # argparse --help / usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt as e:
        if isinstance(e, Terminated):
            print("lamina bench: terminated", file=sys.stderr)
            return 128 + signal.SIGTERM
        print("lamina bench: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # the machine's say (--dir a file, a disk full): one line, not a traceback
        print(f"lamina bench {name}: {e}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, a batch scheduler's limit, ``kill``): unwound as a Ctrl-C is, so
    that the files and jobs a benchmark made are removed (they were left: 1.1 GB once)."""


def _terminate(signum, frame) -> None:
    raise Terminated()


__all__ = ["main"]
