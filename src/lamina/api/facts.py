"""What ``lamina ls`` and the Jupyter reprs say of datasets, from metadata alone: their storage
summed over the steps, and their multiresolution layouts.  Nothing here reads data."""

from __future__ import annotations

from ..catalog import ReleasedStep


def storage_of_datasets(
    f,
    datasets: list,
    damaged: dict[str, dict[int, str]] | None = None,
    released: list[int] | None = None,
) -> dict[str, tuple[list[int], int, int, int]]:
    """``{path: (steps written, blocks, bytes stored, bytes of the values)}`` of *datasets*
    over every step, as their blocks at each step would sum to, step by step: each step's
    block area is read once for all of them, and no block becomes a record
    (:meth:`lamina.catalog.Catalog.storage`; one dataset at a time, a tree of 200 datasets
    over 1,000 steps took 16-46 s to show).  A dataset by the path of its node; one the file
    holds no blocks of (a quantity computed when read) is left out.  With *damaged*, the
    steps where a dataset's blocks fail their checks (a damaged file) are left out of its
    sums and go there (``{path: {step: error}}``); with *released*, the steps an in situ
    consumer released go there (else they raise StepError)."""
    cat = f.engine.catalog
    specs = {ds.name: cat.datasets.get(ds.name.strip("/")) for ds in datasets}
    ids = {spec.id for spec in specs.values() if spec is not None}
    bad: dict[tuple[int, int], str] = {}
    sums = cat.storage(ids, f.steps, bad if damaged is not None else None, released) if ids else {}
    names = {spec.id: name for name, spec in specs.items() if spec is not None}
    for (k, d), e in sorted(bad.items()):
        if damaged is not None:
            damaged.setdefault(names[d], {})[k] = e
    return {name: sums[spec.id] for name, spec in specs.items() if spec is not None}


def layout_facts(f, ds) -> dict:
    """:func:`lamina.layouts.read.describe` of a multiresolution dataset's last step written,
    plus the bytes it stores at each step written (``_bands``: every band of every patch; a
    block of the dataset is a patch's band 0) and over all steps (``_stored``).  Steps an in
    situ consumer released are left out."""
    from ..layouts import read as layout_read
    from ..layouts.spec import Layout

    eng = f.engine
    cat = eng.catalog
    spec = cat.datasets[ds.name.lstrip("/")]
    layout = Layout.of(spec)
    assert layout is not None
    held = [k for k in range(f.steps) if not isinstance(cat.steps[k], ReleasedStep)]
    bands = {
        k: sum(
            int(cat.table(cat.level(spec.path, j).id, k).length.sum()) for j in range(layout.levels)
        )
        for k in held
        if len(cat.table(spec.id, k))
    }
    out: dict = {
        "patch": list(layout.patch),
        "tolerance": layout.tolerance,
        "order": layout.order,
        "levels": [{"shape": list(s)} for s in layout.shapes(spec.shape)],
        "subfiles": {},
    }
    if bands:
        last = max(bands)
        out = layout_read.describe(eng.stack()[-1], spec, layout, last)  # (the block engine)
        out["step"] = last
    out["_bands"] = bands
    out["_stored"] = sum(bands.values())
    return out


def layout_words(lay: dict) -> str:
    """A multiresolution layout as ``ls`` names its compression: ``multires(patch 16x16, ...)``."""
    patch = "x".join(str(p) for p in lay["patch"])
    words = f"multires(patch {patch}, tolerance {lay['tolerance']:g}, {len(lay['levels'])} levels"
    if lay.get("lossless_patches"):
        words += f", {lay['lossless_patches']} patches lossless (NaN/inf or precision)"
    return words + ")"
