"""A fixed machine calibration for tests of the cost model and of what uses it."""

from __future__ import annotations

from lamina.perf import Calibration


def calibration(host: str = "test-host") -> Calibration:
    """Round rates (so expected values can be worked out by hand), filed under *host*."""
    return Calibration(
        memcpy_bandwidth=20e9,
        kernel_bandwidth=10e9,
        stencil_bandwidth=5e9,
        flop_rate=1e9,
        stats_bandwidth=8e9,
        write_bandwidth=2e9,
        read_bandwidth=4e9,
        host=host,
        created=0.0,
    )


CAL = calibration()
