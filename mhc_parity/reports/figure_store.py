"""The report's figures, drawn once: an SVG is a pure function of its drawing's code and arguments.

A figure (`DRAWINGS`: a bound panel, a histogram) is drawn from a frozen dataclass of plain
numbers and strings. `figure_svg(kind, *arguments)` looks the SVG up in `<cache>/figures`
(`mhc_parity.records.artifact_store`, verified when read) under a key of everything it depends on:
the drawing, the `repr` of its arguments (every field, each float in round-trip precision),
the digest of the drawing module's import closure (the drawing and what it calls:
`mhc_parity.records.code.closure_digest`) and the matplotlib version. On a miss it imports the
drawing module — the one import of matplotlib a report makes, deferred so that a report whose
figures are all stored neither imports matplotlib nor lays out a glyph — draws and stores it.
A process that loaded foreign code stores under a key that also covers that code, as every
store does (`mhc_parity.records.foreign_code.write_key`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata

from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import closure_digest

# Bump when an entry's layout or its key material changes meaning.
FIGURE_FORMAT = 1
# kind -> (the module that draws it, its function): imported only to draw.
DRAWINGS = {
    "bound_panel": ("mhc_parity.reports.bound_plot_svg", "bound_panel_svg"),
    "histogram": ("mhc_parity.reports.histogram_svg", "histogram_svg"),
    "roofline": ("mhc_parity.reports.roofline_svg", "roofline_svg"),
}


@functools.cache
def _drawing_material(kind: str) -> dict:
    module, function = DRAWINGS[kind]
    return {
        "format": FIGURE_FORMAT,
        "drawing": f"{module}:{function}",
        "code": closure_digest((module,)),
        "matplotlib": importlib.metadata.version("matplotlib"),
    }


@functools.cache
def _store() -> ArtifactStore:
    return ArtifactStore(cache_root() / "figures", "figure")


def figure_svg(kind: str, *arguments) -> str:
    """The `<svg>` element `DRAWINGS[kind]` draws of `arguments` (frozen dataclasses and plain
    values, whose `repr` names every field), from the store or drawn now and stored."""
    material = {**_drawing_material(kind), "arguments": repr(arguments)}
    stored = _store().load(material)
    if stored is not None:
        return stored.decode("utf-8")
    module, function = DRAWINGS[kind]
    svg = getattr(importlib.import_module(module), function)(*arguments)
    _store().save(material, svg.encode("utf-8"))
    return svg


def figure_counts() -> dict[str, int]:
    """This process's figure lookups so far: {"figures_stored_loaded", "figures_stored_missed"}."""
    store = _store()
    return {"figures_stored_loaded": store.hits, "figures_stored_missed": store.misses}
