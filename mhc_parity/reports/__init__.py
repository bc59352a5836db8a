"""Reports of a run's rows and the PR gate, over `mhc_parity.records` (the row schema, manifest and row stream): plain
Python and pandas, nothing of JAX, `mhc`, `cases` or `harness` (tests/test_import_graph.py). The files it writes:
README.md here. Two wings and what they share:

    gate/       a run judged against a baseline: the baseline file, drift, the rule, comparability, the judgement
    html/       report.html: the page, its tables and figures (every matplotlib call in html/svg.py)
    sources     a finished run read back; summary, causes, speed: what the rows say; tables: a table as data and
                its plain-text and Markdown printers; terminal, markdown, writers, rerun: the reports themselves;
                kill_matrix, sweep: the faults command's files; samples: a hand-made run for tests

Public entry points:

    load_rows(path) -> DataFrame            .jsonl / .csv row files, validated
    load_run(path) -> LoadedRun             a finished run (folder, report.json); refused unless its manifest
                                            says complete, and for a baseline file
    load_baseline(path, *, allow_legacy=False) -> Baseline   a baseline file, every check done
    to_frame(rows) -> DataFrame             validate + type a list of dicts / a DataFrame
    write_all(rows, metadata, out_dir, *, baseline=None, manifest=None) -> {kind: Path} (`OUTPUT_FILES`)
    summarize(frame) -> dict                verdict counts, worst leaf
    render_html(frame, metadata) / render_markdown(frame)
    write_baseline(rows, path, *, policy_hash=None) -> Path
    ReportInputError                        any input that does not fit the schema

`gate` is the subpackage; the gate of two row sets is `gate.rule.gate(baseline_rows, current_rows) -> GateResult`.
"""

import importlib

from mhc_parity.records.rows import ReportInputError, load_rows, to_frame
from mhc_parity.reports.gate.baseline_file import load_baseline, write_baseline
from mhc_parity.reports.gate.rule import GateFinding, GateResult
from mhc_parity.reports.sources import load_run
from mhc_parity.reports.summary import summarize

# The writers bring the whole page (matplotlib only to draw a figure), which reading and gating rows never need:
# loaded on first use.
_WRITER_NAMES = {"OUTPUT_FILES": "mhc_parity.reports.writers", "write_all": "mhc_parity.reports.writers"}


def __getattr__(name: str):
    if name not in _WRITER_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WRITER_NAMES[name]), name)


def render_html(frame, metadata=None, **options):
    """The HTML report of a row set (`mhc_parity.reports.html.page.render_html`; summary computed unless given)."""
    return importlib.import_module("mhc_parity.reports.html.page").render_html(to_frame(frame), metadata, **options)


def render_markdown(frame, **options):
    """The Markdown summary of a row set (`mhc_parity.reports.markdown.render_markdown`; summary computed unless
    given)."""
    return importlib.import_module("mhc_parity.reports.markdown").render_markdown(to_frame(frame), **options)


__all__ = [
    "OUTPUT_FILES",
    "GateFinding",
    "GateResult",
    "ReportInputError",
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
