"""The baselines lamina is measured against, as each is normally used from Python.

* **numpy** ``tofile`` / ``fromfile``, one file per rank: no format, no
  metadata, one ``write``/``read`` of the whole block.  The proxy for what
  the storage (or the page cache) can do.
* **h5py**, one shared file with a contiguous dataset of the global shape.
  The PyPI wheel has no parallel HDF5, so ranks take turns: rank 0 creates
  the file, then each rank in rank order opens it, writes its hyperslab,
  closes it and passes a token to the next rank.  Reads need no turns:
  every rank opens the file read-only at once and reads its hyperslab.
* **ADIOS2 BP5** from PyPI (built without MPI): one writer per rank, each
  with its own ``.bp`` directory holding that rank's block of the global
  array; the array is put in ``Deferred`` mode (zero-copy, ADIOS2's fastest
  way) and written at ``end_step``.  Reads open the files with
  ``adios2.FileReader``.

With ``--fsync`` every baseline fsyncs what it wrote before its clock stops
(and lamina is opened with ``durable=True``); otherwise nobody syncs.
"""

from __future__ import annotations

import os

import numpy as np

from ..geometry import Box, split_range
from . import common
from .harness import Ctx

DATASET = "u"


# ------------------------------------------------------------------- numpy
def numpy_path(ctx: Ctx, rank: int | None = None) -> str:
    return os.path.join(ctx.dir, f"numpy.{ctx.rank if rank is None else rank}.raw")


def numpy_write(ctx: Ctx) -> None:
    with open(numpy_path(ctx), "wb") as f:
        ctx.local.tofile(f)
        if ctx.fsync:
            f.flush()
            os.fsync(f.fileno())


def numpy_read(ctx: Ctx) -> np.ndarray:
    return np.fromfile(numpy_path(ctx), dtype=ctx.local.dtype).reshape(ctx.local.shape)


def numpy_write_pwrite(ctx: Ctx) -> None:
    """One ``os.pwrite`` of the block into a new file: lamina's system call, without numpy's fallocate."""
    fd = os.open(numpy_path(ctx), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(ctx.local).cast("B")
        done = 0
        while done < len(mv):
            done += os.pwrite(fd, mv[done:], done)
        if ctx.fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def numpy_read_into(ctx: Ctx, out: np.ndarray) -> np.ndarray:
    """Read the block into *out*, a C-contiguous array of its shape and dtype (``os.preadv``)."""
    mv = memoryview(out).cast("B")
    fd = os.open(numpy_path(ctx), os.O_RDONLY)
    try:
        done = 0
        while done < len(mv):
            n = os.preadv(fd, [mv[done:]], done)
            if n <= 0:
                raise OSError(f"{numpy_path(ctx)}: short read")
            done += n
    finally:
        os.close(fd)
    return out


def numpy_read_aligned(ctx: Ctx) -> np.ndarray:
    """Read the block into a page-aligned array (numpy's own arrays start 16 bytes into a page)."""
    raw = np.empty(ctx.local.nbytes + 4096, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 4096
    out = raw[skip : skip + ctx.local.nbytes].view(ctx.local.dtype).reshape(ctx.local.shape)
    return numpy_read_into(ctx, out)


def numpy_read_slab(ctx: Ctx, slab: Box) -> np.ndarray:
    """Read *slab* of the global array from the per-rank files (np.memmap, copying the parts)."""
    out = np.empty(slab.shape, dtype=ctx.local.dtype)
    n0 = ctx.local.shape[0]
    for q in range(ctx.size):
        block = Box.from_offset((q * n0, 0, 0), ctx.local.shape)
        inter = block.intersect(slab)
        if inter is None:
            continue
        mm = np.memmap(numpy_path(ctx, q), dtype=ctx.local.dtype, mode="r", shape=ctx.local.shape)
        out[inter.relative_to(slab)] = mm[inter.relative_to(block)]
        del mm
    return out


# -------------------------------------------------------------------- h5py
def h5py_path(ctx: Ctx) -> str:
    return os.path.join(ctx.dir, "h5py.h5")


def h5py_write(ctx: Ctx) -> None:
    """Ranks in turn write their hyperslab of one shared file (the wheel has no parallel HDF5)."""
    import h5py

    path = h5py_path(ctx)
    ctx.token_wait()
    if ctx.rank == 0:
        f = h5py.File(path, "w")
        # no fill: HDF5 would otherwise write the whole dataset once before our data
        ds = f.create_dataset(DATASET, shape=ctx.gshape, dtype=ctx.local.dtype, fill_time="never")
    else:
        f = h5py.File(path, "r+")
        ds = f[DATASET]
    ds.write_direct(ctx.local, dest_sel=ctx.box.slices)
    f.close()
    if ctx.fsync:
        common.fsync_path(path)
    ctx.token_pass()


def h5py_read(ctx: Ctx, box: Box) -> np.ndarray:
    import h5py

    with h5py.File(h5py_path(ctx), "r") as f:
        return f[DATASET][box.slices]


def h5py_read_direct(ctx: Ctx, box: Box, out: np.ndarray) -> np.ndarray:
    """Read *box* into *out*, an array of its shape (``read_direct``, no new array)."""
    import h5py

    with h5py.File(h5py_path(ctx), "r") as f:
        f[DATASET].read_direct(out, source_sel=box.slices)
    return out


# ------------------------------------------------------------------ adios2
def adios2_path(ctx: Ctx, rank: int | None = None) -> str:
    return os.path.join(ctx.dir, f"adios2.{ctx.rank if rank is None else rank}.bp")


def adios2_write(ctx: Ctx) -> None:
    """This rank's block of the global array into its own BP5 file (serial ADIOS2)."""
    import adios2

    path = adios2_path(ctx)
    ad = adios2.Adios()
    io = ad.declare_io("lamina-bench")
    io.set_engine("BP5")
    with adios2.Stream(io, path, "w") as s:
        s.begin_step()
        var = io.define_variable(
            DATASET, ctx.local, list(ctx.gshape), list(ctx.box.start), list(ctx.local.shape)
        )
        s.engine.put(var, ctx.local, adios2.bindings.Mode.Deferred)
        s.end_step()
    if ctx.fsync:
        common.fsync_path(path)


def adios2_read(ctx: Ctx, box: Box) -> np.ndarray:
    """Read *box* of the global array from the per-rank BP5 files that hold parts of it.

    Reads into a preallocated array (``read_in_buffer``), ADIOS2's path
    without an extra zero-filled allocation.
    """
    n0 = ctx.local.shape[0]
    out = np.empty(box.shape, dtype=ctx.local.dtype)
    for q in range(ctx.size):
        block = Box.from_offset((q * n0, 0, 0), ctx.local.shape)
        inter = block.intersect(box)
        if inter is None:
            continue
        dst = out if inter == box else np.empty(inter.shape, dtype=out.dtype)
        with common.adios2_reader(adios2_path(ctx, q)) as r:
            var = r.inquire_variable(DATASET)
            var.set_selection([list(inter.start), list(inter.shape)])
            r.read_in_buffer(var, dst)
        if dst is not out:
            out[inter.relative_to(box)] = dst
    return out


# ------------------------------------------------------------------ shared
def slab_box(ctx: Ctx) -> Box:
    """This rank's part of a different decomposition: a slab of the global array along axis 1."""
    lo, hi = split_range(ctx.gshape[1], ctx.size, ctx.rank)
    return Box((0, lo, 0), (ctx.gshape[0], hi, ctx.gshape[2]))


def available(family: str) -> str | None:
    """None if *family* can run here, else why not."""
    try:
        if family == "h5py":
            import h5py  # noqa: F401
        elif family == "adios2":
            import adios2  # noqa: F401
    except ImportError as e:
        return f"{family} is not installed ({e})"
    return None
