"""One report write validates its rows once and summarises them once.

`write_all` coerces the rows into the canonical frame (`mhc_parity.records.rows.coerce_row` per
row) and summarises that frame (`mhc_parity.reports.summary.summarize`) once; report.json, the
HTML and the Markdown all read that one summary, and the gate reads the frame without
coercing it again. Counted by wrapping both functions wherever a records or reports module binds them.
"""

from __future__ import annotations

import sys

import pytest

import mhc_parity.reports
from mhc_parity.records.rows import coerce_row
from mhc_parity.reports import load_run, to_frame, write_all
from mhc_parity.reports.samples import sample_manifest, sample_rows, write_sample_run
from mhc_parity.reports.summary import summarize
from mhc_parity.reports.writers import write_run_folder


def counted(monkeypatch, function) -> list[tuple]:
    """The calls of `function` from here on: each records and reports module's binding of it is wrapped."""
    calls: list[tuple] = []

    def counting(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        in_layers = any(name == p or name.startswith(p + ".") for p in ("mhc_parity.records", "mhc_parity.reports"))
        if in_layers and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, counting)
    return calls


@pytest.fixture
def rows() -> list[dict]:
    return sample_rows()


@pytest.fixture
def calls(monkeypatch) -> dict[str, list[tuple]]:
    return {"summarize": counted(monkeypatch, summarize), "coerce_row": counted(monkeypatch, coerce_row)}


def test_write_all_summarizes_once_and_coerces_each_row_once(tmp_path, rows, calls):
    baseline = [dict(r) for r in rows]
    write_all(rows, {}, tmp_path, baseline=baseline)
    assert len(calls["summarize"]) == 1
    assert len(calls["coerce_row"]) == len(rows) + len(baseline)  # the run's rows and the baseline's, once each


def test_a_loaded_baseline_is_not_coerced_again(tmp_path, rows, monkeypatch):
    write_sample_run(rows, tmp_path / "baseline", rendered=False)
    baseline = load_run(tmp_path / "baseline")
    coerced = counted(monkeypatch, coerce_row)
    write_all(rows, {}, tmp_path / "current", baseline=baseline)
    assert len(coerced) == len(rows)


def test_write_run_folder_coerces_each_row_once(tmp_path, rows, monkeypatch):
    manifest = sample_manifest(rows)
    summaries, coerced = counted(monkeypatch, summarize), counted(monkeypatch, coerce_row)
    write_run_folder(tmp_path, rows, {}, manifest)
    assert len(summaries) == 1
    assert len(coerced) == len(rows)


def test_loading_a_report_coerces_each_row_once(tmp_path, rows, monkeypatch):
    write_sample_run(rows, tmp_path, rendered=False)
    coerced = counted(monkeypatch, coerce_row)
    assert len(load_run(tmp_path)) == len(rows)
    assert len(coerced) == len(rows)


def test_the_public_renderers_summarize_unless_given_the_summary(rows, calls):
    frame = to_frame(rows)
    summary = summarize(frame)
    calls["summarize"].clear()
    given = (
        mhc_parity.reports.render_html(frame, summary=summary),
        mhc_parity.reports.render_markdown(frame, summary=summary),
    )
    assert calls["summarize"] == []
    assert (mhc_parity.reports.render_html(frame), mhc_parity.reports.render_markdown(frame)) == given
    assert len(calls["summarize"]) == 2
