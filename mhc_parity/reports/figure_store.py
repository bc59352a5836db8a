"""The report's figures, drawn once: an SVG is a pure function of its drawing's code and arguments.

`figure_svg` looks it up in `<cache>/figures` under the drawing, the `repr` of its arguments (frozen dataclasses of
plain values), the digest of the drawing module's import closure and the matplotlib version; on a miss it imports the
drawing module (a report's only matplotlib import), draws and stores it.
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
    """The `<svg>` element `DRAWINGS[kind]` draws of `arguments` (values whose `repr` names every field), stored or
    drawn now and stored."""
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
