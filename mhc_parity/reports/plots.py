"""Matplotlib figures drawn off-screen as inline SVG for the HTML report.

`inline_svg` builds a `Figure` on its own SVG canvas (no pyplot state), lets `draw` fill it and returns one `<svg>`
element: no prolog, namespaces or metadata, text as `<text>`, every id prefixed with `prefix` so a page's figures share
none. `RC` holds only while it is built; ids are hashed with a fixed salt, so a run's page is byte-identical each time
it is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from html import escape
from io import StringIO

from matplotlib import rc_context
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

RC = {
    "svg.hashsalt": "mhc-parity",  # clip-path and marker ids from a fixed salt, not a fresh uuid4 per save
    "svg.fonttype": "none",  # text stays text: smaller than glyph outlines, selectable, searchable
    "font.size": 8.0,
    "axes.titlesize": 8.0,
    "axes.labelsize": 8.0,
    "xtick.labelsize": 7.0,
    "ytick.labelsize": 7.0,
    "legend.fontsize": 7.0,
    "legend.frameon": False,
    "axes.spines.top": False,  # two lines fewer per panel to draw, and the data reads the same
    "axes.spines.right": False,
}
# What backend_svg writes by default and a reproducible page must not carry.
NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_SUPERSCRIPTS = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
_PROLOG = re.compile(r"\A.*?(?=<svg\b)", re.S)
_NAMESPACES = re.compile(r' xmlns(?::xlink)?="[^"]*"')
# The namespaces `_NAMESPACES` strips, which an SVG file of its own must declare.
_DECLARED_NAMESPACES = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'
_COMMENT = re.compile(r"<!--.*?-->\s*", re.S)
_ID_OR_REFERENCE = re.compile(r'(\bid="|url\(#|href="#)')


def inline_svg(draw: Callable[[Figure], None], size: tuple[float, float], *, prefix: str, label: str) -> str:
    """The figure `draw` fills, `size` (width, height) in inches, as one `<svg class="plot">` element. prefix: letters,
    digits, `-`, unique on the page; label: the accessible name (escaped here)."""
    with rc_context(RC):
        figure = Figure(figsize=size)
        FigureCanvasSVG(figure)
        draw(figure)
        buffer = StringIO()
        figure.savefig(buffer, format="svg", metadata=NO_METADATA)
    svg = _COMMENT.sub("", _NAMESPACES.sub("", _PROLOG.sub("", buffer.getvalue(), count=1)))
    svg = _ID_OR_REFERENCE.sub(lambda match: f"{match.group(1)}{prefix}-", svg)
    return svg.replace("<svg ", f'<svg class="plot" role="img" aria-label="{escape(label, quote=True)}" ', 1).strip()


def standalone_svg(inline: str) -> str:
    """An `inline_svg` element as an .svg file's text, its namespaces declared."""
    return inline.replace("<svg ", f"<svg {_DECLARED_NAMESPACES} ", 1) + "\n"


def decade_label(value: float, _position: object = None) -> str:
    """A log axis tick label as 10 to a Unicode superscript power ("10⁻⁷"), without mathtext's TeX parsing."""
    if not math.isfinite(value) or value <= 0:
        return ""
    power = math.log10(value)
    if abs(power - round(power)) > 1e-9:
        return f"{value:.3g}"
    return "10" + str(round(power)).translate(_SUPERSCRIPTS)
