"""Compressed multiresolution storage: the algorithms (docs/multires.md).

- :mod:`.wavelet`: the CDF 5/3 lifting wavelet on batches of patches
- :mod:`.bound`: per-band zfp tolerances that bound every level
- :mod:`.compress`: encode and decode batches of patches
- :mod:`.patches`: cut a dataset into patches and join levels back
- :mod:`.balance`: patch owners, size-balanced aggregators, simulation

Pure: numpy, zfpy and zlib; no MPI, no files.  The engine does not use
these modules yet.
"""
