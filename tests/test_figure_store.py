"""The report's figures are drawn once per drawing code and numbers (`mhc_parity.reports.html.figures.figure_svg`).

A stored figure is the SVG the drawing makes of the same arguments, byte for byte; other
numbers, another drawing module or a damaged entry draw it again; and a report whose
figures are all stored imports no matplotlib.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mhc_parity.records.cache_root import CACHE_ENV_VAR
from mhc_parity.reports import to_frame
from mhc_parity.reports.html import figures as figure_store
from mhc_parity.reports.html.figures import bound_panels, histograms
from mhc_parity.reports.html.svg import bound_panel_svg
from mhc_parity.reports.samples import sample_rows

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh figure store in `tmp_path`, and this process's memo of the store dropped."""
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "cache"))
    figure_store._store.cache_clear()
    yield figure_store
    figure_store._store.cache_clear()


@pytest.fixture(scope="module")
def panel():
    panels, _ = bound_panels(to_frame(sample_rows()))
    assert panels, "the sample rows have a failing pair to draw"
    return panels[0]


def test_a_stored_figure_is_the_drawing_byte_for_byte(store, panel):
    drawn = store.figure_svg("bound_panel", panel, 0)
    assert store.figure_counts() == {"figures_stored_loaded": 0, "figures_stored_missed": 1}
    assert store.figure_svg("bound_panel", panel, 0) == drawn == bound_panel_svg(panel, 0)
    assert store.figure_counts() == {"figures_stored_loaded": 1, "figures_stored_missed": 1}


def test_other_numbers_another_place_or_other_code_draw_again(store, panel, monkeypatch):
    store.figure_svg("bound_panel", panel, 0)
    moved = dataclasses.replace(
        panel, usages=tuple(u * 2 for u in panel.usages), verdicts=("pass",) * len(panel.leaves)
    )
    assert store.figure_svg("bound_panel", moved, 0) == bound_panel_svg(moved, 0)
    assert store.figure_svg("bound_panel", panel, 1) == bound_panel_svg(panel, 1)  # its ids differ
    material = store._drawing_material("bound_panel")
    monkeypatch.setattr(store, "_drawing_material", lambda kind: {**material, "code": "edited"})
    store.figure_svg("bound_panel", panel, 0)
    assert store.figure_counts() == {"figures_stored_loaded": 0, "figures_stored_missed": 4}


def test_a_damaged_entry_is_drawn_again_and_replaced(store, panel):
    drawn = store.figure_svg("bound_panel", panel, 0)
    (entry,) = (Path(os.environ[CACHE_ENV_VAR]) / "figures").iterdir()
    entry.write_bytes(entry.read_bytes()[:-10] + b"<g></g>xx>")
    assert store.figure_svg("bound_panel", panel, 0) == drawn
    assert store._store().rejected == 1
    assert store.figure_svg("bound_panel", panel, 0) == drawn
    assert store.figure_counts()["figures_stored_loaded"] == 1


def test_a_report_of_stored_figures_imports_no_matplotlib(tmp_path):
    code = (
        "import sys\n"
        "from mhc_parity.reports import write_all\n"
        "from mhc_parity.reports.samples import sample_rows\n"
        f"write_all(sample_rows(), {{}}, {str(tmp_path / 'out')!r} + sys.argv[1])\n"
        "print(sorted(m for m in sys.modules if m.startswith('matplotlib'))[:1])\n"
    )
    environment = {**os.environ, CACHE_ENV_VAR: str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(attempt)],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            check=True,
        )
        for attempt in (1, 2)
    ]
    assert runs[0].stdout.strip() == "['matplotlib']"  # drawn: the first report imports it
    assert runs[1].stdout.strip() == "[]"
    assert (tmp_path / "out1" / "report.html").read_bytes() == (tmp_path / "out2" / "report.html").read_bytes()


def test_histograms_are_stored_too(store):
    (figure, *_) = [h for h in histograms(to_frame(sample_rows())).values() if h is not None]
    assert store.figure_svg("histogram", figure) == store.figure_svg("histogram", figure)
    assert store.figure_counts() == {"figures_stored_loaded": 1, "figures_stored_missed": 1}


def test_every_matplotlib_call_is_in_one_module():
    """The drawings live in `mhc_parity/reports/html/svg.py` alone: `figure_svg` imports it only to draw, so no other
    module may bring matplotlib in."""
    importers = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "mhc_parity").rglob("*.py")
        if re.search(r"^\s*(from|import)\s+matplotlib\b", path.read_text(encoding="utf-8"), re.MULTILINE)
    )
    assert importers == ["mhc_parity/reports/html/svg.py"]
