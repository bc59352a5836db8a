"""Rows and run folders: the row schema, the files of a run, the reports and the PR gate.

The layer under `harness`: plain Python and pandas (matplotlib draws the HTML report's
plots), no JAX and nothing of `mhc`, `cases` or `harness` (tests/test_import_graph.py holds that).
It owns every file a run writes, so whatever writes or reads one agrees on its format:

    schema      the row columns, verdicts, comparison and leaf kinds
    manifest    manifest.json: what a run asked, selected and whether it finished
    store       rows.jsonl while a run is in progress (resumable)
    writers     rows.csv, report.json, report.html (html: heatmaps, and histograms and bound_plots,
                drawn by plots), summary.md (markdown)
    baseline    the committed baseline CSV
    sources     a finished run from a folder or file, refused unless a manifest vouches
    gate        a current run against a baseline (drift: the growth rule)
    kill_matrix / sweep   the fault kill matrix's and the false-positive sweep's files
    commands    `mhc-parity gate | baseline | render`
    rows, text  reading and writing cells; the one number formatter and table printer

Public entry points:

    load_rows(path) -> DataFrame            .jsonl / .csv row files, validated
    load_run(path) -> LoadedRun             a finished run (folder, report.json); refused unless
                                            its manifest says complete, and for a baseline file
    load_baseline(path, *, allow_legacy=False) -> Baseline   a baseline file, every check done
                                            (mhc_parity.reports.sources.load_baseline_or_run: a baseline or a run)
    to_frame(rows) -> DataFrame             validate + type a list of dicts / a DataFrame
    write_all(rows, metadata, out_dir, *, baseline=None, manifest=None) -> {"csv","json","html","markdown": Path}
    summarize(frame) -> dict                verdict counts, worst leaf
    render_html(frame, metadata, *, summary=None) / render_markdown(frame, *, summary=None)
    gate(baseline_rows, current_rows, *, growth_factor=2.0) -> GateResult
    write_baseline(rows, path, *, policy_hash=None) -> Path
    ReportInputError                        any input that does not fit the schema
"""

import importlib

from mhc_parity.records.rows import ReportInputError, load_rows, to_frame
from mhc_parity.reports.baseline import write_baseline
from mhc_parity.reports.baseline_load import load_baseline
from mhc_parity.reports.gate import GateFinding, GateResult, gate
from mhc_parity.reports.sources import load_run
from mhc_parity.reports.summary import summarize

# The report writers draw with matplotlib, which what only reads or gates rows (the pytest
# plugin in every pytest run, `mhc-parity gate`) never needs: they load on first use.
_WRITER_NAMES = {"OUTPUT_FILES": "mhc_parity.reports.writers", "write_all": "mhc_parity.reports.writers"}


def __getattr__(name: str):
    if name not in _WRITER_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WRITER_NAMES[name]), name)


def render_html(frame, metadata=None, **options):
    """The HTML report of a row set as a string (see `mhc_parity.reports.html.render_html`; a `summary=`
    given in `options` is used, else the summary is computed)."""
    return importlib.import_module("mhc_parity.reports.html").render_html(to_frame(frame), metadata, **options)


def render_markdown(frame, **options):
    """The Markdown summary of a row set as a string (see `mhc_parity.reports.markdown.render_markdown`; a
    `summary=` given in `options` is used, else the summary is computed)."""
    return importlib.import_module("mhc_parity.reports.markdown").render_markdown(to_frame(frame), **options)


__all__ = [
    "OUTPUT_FILES",
    "GateFinding",
    "GateResult",
    "ReportInputError",
    "gate",
    "load_baseline",
    "load_rows",
    "load_run",
    "render_html",
    "render_markdown",
    "summarize",
    "to_frame",
    "write_all",
    "write_baseline",
]
