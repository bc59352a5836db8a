"""Reports for parity runs: CSV, JSON, self-contained HTML, Markdown, and the PR gate.

This package reads rows (see `harness.schema`) and writes files; it never imports or
runs JAX. Public entry points:

    load_rows(path) -> DataFrame            .jsonl / .csv row files, validated
    load_run(path) -> LoadedRun             a finished run (folder, report.json, baseline CSV);
                                            refused unless its manifest says complete
    to_frame(rows) -> DataFrame             validate + type a list of dicts / a DataFrame
    write_all(rows, metadata, out_dir, *, baseline=None, manifest=None) -> {"csv","json","html","markdown": Path}
    summarize(frame) -> dict                verdict counts, worst leaf
    render_html(frame, metadata) / render_markdown(frame)
    reports.gate.gate(baseline_rows, current_rows, *, growth_factor=2.0) -> GateResult
    reports.gate.main(argv) -> int          `python -m harness gate` semantics
    reports.baseline.write_baseline(rows, path, *, policy_hash=None) -> Path
    ReportInputError                        any input that does not fit the schema
"""

from reports.baseline import load_baseline, write_baseline
from reports.gate import GateFinding, GateResult, gate
from reports.rows import ReportInputError, load_rows, to_frame
from reports.sources import load_run
from reports.summary import summarize
from reports.writers import OUTPUT_FILES, write_all


def render_html(frame, metadata=None, **options):
    """The HTML report as a string (see `reports.html.render_html`); imports matplotlib lazily."""
    from reports.html import render_html as _render_html

    return _render_html(to_frame(frame), metadata, **options)


def render_markdown(frame, **options):
    """The Markdown summary as a string (see `reports.markdown.render_markdown`)."""
    from reports.markdown import render_markdown as _render_markdown

    return _render_markdown(to_frame(frame), **options)


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
