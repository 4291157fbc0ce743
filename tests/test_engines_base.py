"""The reusable engine test base (lamina.testing.engines) run against every built-in engine.

In this process for the file engines; as real programs under mpiexec with 2
writer ranks and 3 reader ranks for native files (written, then read by
another launch) and for the in situ transport (producer and consumer side by
side in one MPMD launch, engines 'mpi' and 'both').
"""

from __future__ import annotations

import os

import pytest

from lamina.engines import memory
from lamina.testing.engines import PEER_TIMEOUT, EngineTests, LaunchedEngineTests, filename

#: the transport's consumers take steps as a stream (each released when the next is asked for),
#: blocks travel raw, producers cannot read back (but those of 'both', from their file), and nothing
#: outlives the launch: none of the extras
TRANSPORT: frozenset[str] = frozenset()


class TestNative(EngineTests):
    engine = "native"
    options = {"durable": False}  # durability is what the crash tests check


class TestMemory(EngineTests):
    engine = "memory"

    def location(self, directory, case):
        return f"mem://{os.getpid()}/{directory}/{filename(case)}"

    def cleanup(self, path):
        memory.drop(path)
        memory.drop(path + "-new")


@pytest.mark.slow
class TestNativeLaunched(LaunchedEngineTests):
    """Two writer ranks, then three reader ranks on the files they left."""

    engine = "native"
    options = {"durable": False}


@pytest.mark.slow
class TestMPI(LaunchedEngineTests):
    """The in situ transport: two producer ranks and three consumer ranks in one MPMD launch."""

    engine = "mpi"
    capabilities = TRANSPORT
    mpmd = True
    options = read_options = {"timeout": PEER_TIMEOUT}


@pytest.mark.slow
class TestBoth(LaunchedEngineTests):
    """The transport that also writes the native file, which three ranks of another launch then read."""

    engine = "both"
    reread_engine = "native"
    # its producers read back from the file they write
    capabilities = TRANSPORT | {"writer_reads"}
    mpmd = True
    options = {"timeout": PEER_TIMEOUT, "durable": False}
    read_options = {"timeout": PEER_TIMEOUT}


class TestNativeAsync(EngineTests):
    """The native engine written with background I/O: every round trip, steps committed on a thread."""

    engine = "native"
    options = {"durable": False, "io": "async"}


class TestMemoryAsync(TestMemory):
    """The memory engine written with background I/O."""

    options = {"io": "async"}


@pytest.mark.slow
class TestNativeLaunchedAsync(LaunchedEngineTests):
    """Two writer ranks with background I/O, then three reader ranks on the files they left."""

    engine = "native"
    options = {"durable": False, "io": "async"}


@pytest.mark.slow
class TestMPIAsync(TestMPI):
    """The in situ transport with background I/O on both sides: the producer's steps are sent on
    its background thread, the consumer may read ahead."""

    options = read_options = {"timeout": PEER_TIMEOUT, "io": "async"}


@pytest.mark.slow
class TestBothAsync(TestBoth):
    """The transport that also writes the native file, its steps committed in the background."""

    options = {"timeout": PEER_TIMEOUT, "durable": False, "io": "async"}
    read_options = {"timeout": PEER_TIMEOUT, "io": "async"}
