"""The report's Speed section: each path's time beside its reference's, from the rows alone.

mhc_parity/reports/speed.py (and its HTML and Markdown renderings), on a small frame of a
simulated TPU run: a Mosaic and an interpret path on the chip, a sharded interpret path on
the host CPU, and a case whose reference did not run.
"""

from __future__ import annotations

import math
import re

import pytest

from mhc_parity.records.schema import empty_row
from mhc_parity.reports import render_html, to_frame
from mhc_parity.reports.markdown import render_markdown
from mhc_parity.reports.speed import NOT_MEASURED_ON_CPU, SPEED_NOTE, speed_lines, speed_summaries

SHARDED = "sharded(data=2,fsdp=4)@cpu"
HOST = "cpu:0-7 (host: tpu has 1 device)"


def _row(case, candidate, partner, comparison, execute_s, runs, devices, verdict="pass"):
    return empty_row(
        case=case,
        candidate=candidate,
        partner=partner,
        comparison=comparison,
        leaf="out",
        leaf_kind="output",
        verdict=verdict,
        compile_s=1.0,
        execute_s=execute_s,
        execute_first_s=10 * execute_s,
        execute_runs=runs,
        devices=devices,
    )


def _tpu_run() -> list[dict]:
    return [
        _row("a", "reference/unsharded", "oracle", "vs_oracle", 0.02, 5, "tpu:0"),
        _row("a", "mosaic/unsharded", "reference/unsharded", "vs_reference", 0.005, 5, "tpu:0"),
        _row("a", "mosaic/unsharded", "oracle", "vs_oracle", 0.005, 5, "tpu:0"),
        _row("a", "interpret/unsharded", "reference/unsharded", "vs_reference", 0.04, 5, "tpu:0"),
        _row("a", f"reference/{SHARDED}", "oracle", "vs_oracle", 0.3, 1, HOST),
        _row("a", f"interpret/{SHARDED}", f"reference/{SHARDED}", "vs_reference", 0.9, 1, HOST),
        # b: the reference errored (no timing), so its Mosaic path has nothing to stand beside
        _row("b", "reference/unsharded", "oracle", "vs_oracle", math.nan, math.nan, "tpu:0", verdict="error"),
        _row("b", "mosaic/unsharded", "reference/unsharded", "vs_reference", 0.005, 5, "tpu:0", verdict="skip"),
    ]


def test_each_path_stands_beside_its_reference_on_the_same_devices():
    lines = speed_lines(to_frame(_tpu_run()))
    assert [(line.case, line.candidate, line.reference) for line in lines] == [
        ("a", "mosaic/unsharded", "reference/unsharded"),
        ("a", "interpret/unsharded", "reference/unsharded"),
        ("a", f"interpret/{SHARDED}", f"reference/{SHARDED}"),
    ]
    mosaic, interpret, host = lines
    assert mosaic.speedup == pytest.approx(4.0) and interpret.speedup == pytest.approx(0.5)
    assert mosaic.measured and mosaic.label == "tpu: 5 timed runs"
    assert not host.measured and host.label == NOT_MEASURED_ON_CPU and host.speedup == pytest.approx(1 / 3)
    summaries = {s.candidate: s for s in speed_summaries(lines)}
    mosaic_text = "mosaic/unsharded vs reference/unsharded on tpu: median speed-up 4 over 1 case"
    assert summaries["mosaic/unsharded"].text == mosaic_text
    assert summaries[f"interpret/{SHARDED}"].text.endswith(f"({NOT_MEASURED_ON_CPU})")


def test_a_path_on_other_devices_than_its_reference_gets_no_ratio():
    rows = _tpu_run()[:2]
    rows[1]["devices"] = "tpu:1"
    (line,) = speed_lines(to_frame(rows))
    assert math.isnan(line.speedup) and not line.measured and "reference ran on tpu:0" in line.label
    (summary,) = speed_summaries([line])
    assert summary.cases == 0 and math.isnan(summary.median_speedup)


def test_a_run_written_before_the_timing_runs_column_says_so():
    rows = [{k: v for k, v in row.items() if k not in ("execute_first_s", "execute_runs")} for row in _tpu_run()[:2]]
    (line,) = speed_lines(to_frame(rows))  # the later columns read as NaN
    assert line.speedup == pytest.approx(4.0) and line.label == "tpu: timing runs not recorded"


def _speed_section(page: str) -> str:
    match = re.search(r'<section id="speed">.*?</section>', page, re.S)
    assert match, "the page has no Speed section"
    return match.group(0)


def test_the_html_page_and_the_summary_show_the_speed_section():
    frame = to_frame(_tpu_run())
    section = _speed_section(render_html(frame))
    assert 'id="speed-table"' in section and "tpu: 5 timed runs" in section
    assert f'<td class="unmeasured">{NOT_MEASURED_ON_CPU}</td>' in section  # labelled, and still shown
    speed_table = section[section.index('id="speed-table"') :]
    assert speed_table.count("<tr>") == 1 + 3  # the header and three lines
    assert 'href="#speed"' in render_html(frame)
    summary = render_markdown(frame)
    assert "<summary>Speed" in summary and SPEED_NOTE.split(";")[0] in summary
    assert "- mosaic/unsharded vs reference/unsharded on tpu: median speed-up 4 over 1 case" in summary
    assert f"| {NOT_MEASURED_ON_CPU} |" in summary
    shortened = render_markdown(frame, max_rows=1)
    assert "… and 2 more (see report.html)." in shortened


def test_a_cpu_run_says_its_times_are_not_a_speed_measurement():
    rows = [_row("a", "reference/unsharded", "oracle", "vs_oracle", 0.02, 1, "cpu:0")]
    rows.append(_row("a", "interpret/unsharded", "reference/unsharded", "vs_reference", 0.5, 1, "cpu:0"))
    frame = to_frame(rows)
    (line,) = speed_lines(frame)
    assert not line.measured and line.label == NOT_MEASURED_ON_CPU
    assert "interpret mode" in SPEED_NOTE and "not a speed measurement" in SPEED_NOTE
    assert NOT_MEASURED_ON_CPU in _speed_section(render_html(frame))


def test_no_pair_renders_an_empty_section_and_no_markdown():
    frame = to_frame(_tpu_run()[6:])
    assert speed_lines(frame) == []
    assert "No path ran beside a reference path" in _speed_section(render_html(frame))
    assert SPEED_NOTE.split(";")[0] not in render_markdown(frame)
    nothing_timed = to_frame(_tpu_run()[6:7])  # only the errored reference: no program timed
    assert "<summary>Speed" not in render_markdown(nothing_timed)
