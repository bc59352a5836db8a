"""The Speed section's plot (`RooflineFigure`) as inline SVG: a line per case, a marker per program at its fraction of
the chip's peak HBM bandwidth, on a log axis up to the peak. Only `figure_store` calls it.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from mhc_parity.reports.plots import decade_label, inline_svg
from mhc_parity.reports.program_speed import RooflineFigure

# One colour and marker per program, in first-seen order (cycled past ten programs).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "*")
# Geometry in inches: a case's line, the plot's width, the margins (case names left, legend above).
CASE_HEIGHT, WIDTH, NAME_WIDTH = 0.22, 7.5, 0.055
_TOP, _BOTTOM, LEGEND_ROW = 0.12, 0.55, 0.17
PEAK_COLOUR = "#555555"


def roofline_svg(figure_data: RooflineFigure) -> str:
    cases = list(dict.fromkeys(case for case, _, _ in figure_data.points))
    programs = list(dict.fromkeys(path for _, path, _ in figure_data.points))
    legend_rows = math.ceil(len(programs) / 3)
    left = 0.3 + NAME_WIDTH * max(len(case) for case in cases)
    height = CASE_HEIGHT * len(cases) + _BOTTOM + _TOP + LEGEND_ROW * legend_rows
    fractions = np.array([f for _, _, f in figure_data.points], dtype=float)
    positive = fractions[np.isfinite(fractions) & (fractions > 0)]
    low = 10 ** math.floor(math.log10(positive.min() / 1.3)) if len(positive) else 1e-4
    high = max(1.0, 10 ** math.ceil(math.log10(positive.max()))) if len(positive) else 1.0

    def draw(figure: Figure) -> None:
        axes = figure.add_subplot()
        row = {case: index for index, case in enumerate(cases)}
        for index, program in enumerate(programs):
            mine = [(row[c], f) for c, p, f in figure_data.points if p == program and f > 0]
            if mine:
                y, x = zip(*mine)
                axes.plot(
                    x,
                    y,
                    linestyle="none",
                    marker=MARKERS[index % len(MARKERS)],
                    markersize=4.5,
                    color=COLOURS[index % len(COLOURS)],
                )
        axes.axvline(1.0, color=PEAK_COLOUR, linewidth=0.8, linestyle="--")
        axes.set_xscale("log")
        axes.set_xlim(low, high * 1.3)
        axes.set_ylim(len(cases) - 0.5, -0.5)  # the first case on top, as in the table
        axes.set_yticks(range(len(cases)), cases)
        axes.minorticks_off()
        axes.xaxis.set_major_locator(LogLocator(numticks=9))
        axes.xaxis.set_major_formatter(FuncFormatter(decade_label))
        axes.grid(axis="x", color="#e6e6e6", linewidth=0.6)
        axes.set_axisbelow(True)
        axes.set_xlabel(
            f"fraction of the peak HBM bandwidth of {figure_data.device_kind} "
            f"({figure_data.peak_gb_per_s:.0f} GB/s; dashed: the peak)"
        )
        handles = [
            Line2D(
                [],
                [],
                linestyle="none",
                marker=MARKERS[i % len(MARKERS)],
                color=COLOURS[i % len(COLOURS)],
                label=program,
            )
            for i, program in enumerate(programs)
        ]
        figure.legend(handles=handles, loc="upper center", ncols=min(3, len(programs)))
        figure.subplots_adjust(
            left=left / WIDTH,
            right=1 - 0.2 / WIDTH,
            bottom=_BOTTOM / height,
            top=1 - (_TOP + LEGEND_ROW * legend_rows) / height,
        )

    return inline_svg(
        draw,
        (WIDTH, height),
        prefix="roofline",
        label=f"fraction of the peak HBM bandwidth of {figure_data.device_kind} per case and program",
    )
