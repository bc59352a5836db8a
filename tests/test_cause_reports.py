"""Failing rows grouped by cause in every report (mhc_parity.reports.causes): the terminal summary, the
gate, summary.md, report.json, the HTML's first section and the pytest message."""

from __future__ import annotations

import math

import pytest

from mhc_parity.records.rows import to_frame
from mhc_parity.reports import render_html, render_markdown
from mhc_parity.reports.causes import cause_groups, compress_paths, implementation_verdicts
from mhc_parity.reports.gate.rule import gate
from mhc_parity.reports.samples import measured_row
from mhc_parity.reports.summary import summarize
from mhc_parity.reports.terminal import format_summary

UNEXPLAINED = "not explained by any rounding: look for a logic error"
PATHS = ("interpret/unsharded", "interpret/sharded(data=2,fsdp=4)")


def _rows(broken: bool = True) -> list[dict]:
    """Two cases, the reference and two kernel paths, every leaf against the oracle and the
    reference; with `broken`, d_post_bias of every kernel path fails with one cause."""
    rows = []
    for case in ("case_a", "case_b"):
        for leaf in ("out", "d_x", "d_post_bias"):
            kind = {"out": "output", "d_x": "activation_grad", "d_post_bias": "weight_grad"}[leaf]
            rows.append(measured_row(case, "reference/unsharded", "oracle", "vs_oracle", leaf, kind, "float32", 1.0))
            for path in PATHS:
                for partner, comparison in (("oracle", "vs_oracle"), ("reference/unsharded", "vs_reference")):
                    row = measured_row(case, path, partner, comparison, leaf, kind, "float32", 1.0)
                    if broken and leaf == "d_post_bias":
                        row.update(
                            verdict="fail", bound_usage=6.0, cause=UNEXPLAINED, cause_id="unexplained",
                            cause_explained=0.02, reason="too far",
                        )  # fmt: skip
                    rows.append(row)
    return rows


def test_one_broken_leaf_is_one_cause_over_its_rows():
    (group,) = cause_groups(_rows())
    assert len(group.rows) == 8 and group.cases == 2 and group.leaves == ["d_post_bias"]
    assert group.candidates == ["interpret/*"]
    assert group.heading() == (
        f"8 rows in 2 cases: `d_post_bias` of `interpret/*` — {UNEXPLAINED} (the best rounding explains 2%)"
    )
    assert compress_paths(["reference/unsharded", *PATHS]) == ["reference/unsharded", "interpret/*"]


def test_error_rows_and_causeless_failures_group_by_their_message():
    rows = _rows(broken=False)
    rows[1].update(verdict="error", reason="ValueError: boom (at kernel.py:3)\ntraceback line")
    rows[2].update(verdict="error", reason="ValueError: boom (at kernel.py:3)")
    rows[3].update(verdict="fail", reason="rejected a supported case")
    groups = cause_groups(rows)
    assert [(g.verdict, g.cause, len(g.rows)) for g in groups] == [
        ("error", "ValueError: boom (at kernel.py:3)", 2),
        ("fail", "rejected a supported case", 1),
    ]
    assert groups[0].heading().endswith("— error: ValueError: boom (at kernel.py:3)")


def test_each_implementation_gets_one_verdict_with_its_causes():
    verdicts = {v.name: v for v in implementation_verdicts(_rows())}
    assert verdicts["reference"].verdict == "pass" and not verdicts["reference"].groups
    assert verdicts["interpret"].verdict == "fail" and len(verdicts["interpret"].groups) == 1
    # Where it goes wrong, before its causes (issue 67): the forward leaves pass, the pre backward fails.
    assert verdicts["interpret"].where == "forward passes; first fails in pre_backward (d_post_bias)"
    assert verdicts["reference"].where == ""


def test_the_terminal_summary_lists_each_cause_once_with_its_first_rows():
    text = format_summary(_rows())
    assert "8 rows failed, from 1 cause:" in text
    assert text.count("`d_post_bias` of `interpret/*`") == 1
    assert text.rstrip().endswith(
        "parity: FAIL (" + str(len(_rows())) + " rows): reference pass · interpret FAIL "
        "(forward passes; first fails in pre_backward (d_post_bias); 1 cause)"
    )


def test_the_gate_groups_its_failures_by_cause():
    result = gate(_rows(broken=False), _rows())
    assert len(result.failure_causes) == 1 and not result.ok
    table = result.table()
    assert "failure (8 rows, from 1 cause):" in table
    assert table.count(UNEXPLAINED) == 1


def test_summary_markdown_and_json_carry_the_verdict_per_implementation():
    frame = to_frame(_rows(), source="test")
    summary = summarize(frame)
    assert [(i["name"], i["verdict"]) for i in summary["implementations"]] == [
        ("reference", "pass"),
        ("interpret", "fail"),
    ]
    (cause,) = summary["causes"]
    assert cause["rows"] == 8 and cause["cause_id"] == "unexplained" and len(cause["members"]) == 8
    assert not math.isnan(cause["explained"])
    markdown = render_markdown(frame, summary=summary)
    assert "- **interpret**: FAIL" in markdown and markdown.count("`d_post_bias` of `interpret/*`") == 1


def test_the_html_opens_with_the_verdict_per_implementation_and_each_cause_lists_its_rows():
    page = render_html(to_frame(_rows(), source="test"))
    verdicts, nav = page.index('id="implementations"'), page.index("<nav>")
    assert page.index('id="summary"') < verdicts < nav
    section = page[verdicts:nav]
    assert section.count("<details>") == 1 and section.count("<li><a href=") == 8
    assert "<code>d_post_bias</code> of <code>interpret/*</code>" in section


@pytest.mark.parametrize("broken", [False])
def test_a_passing_run_has_no_causes(broken):
    assert cause_groups(_rows(broken)) == []
    assert "from" not in format_summary(_rows(broken)).split("parity:")[0].split("closest")[0]
