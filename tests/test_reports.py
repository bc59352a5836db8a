"""The report formats rendered from a hand-made row set, checked for content.

The row set (`mhc_parity.reports.samples.sample_rows`) has passes, a failure past its bound, a
failure with NaN output, an error with hostile text, a skip, an unsupported row and
a lowering row; every format is rendered once per module and inspected.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from mhc_parity.harness.cli import main as cli_main
from mhc_parity.records.schema import FLOAT_COLUMNS, ROW_COLUMNS, VERDICTS, empty_row
from mhc_parity.records.store import RowStore
from mhc_parity.reports import (
    ReportInputError,
    load_rows,
    load_run,
    render_html,
    summarize,
    to_frame,
    write_all,
    write_baseline,
)
from mhc_parity.reports.html.figures import MAX_BOUND_PANELS, NEAR_BOUND, bound_panels, histogram
from mhc_parity.reports.html.svg import histogram_svg
from mhc_parity.reports.samples import HOSTILE_CASE, HOSTILE_REASON, sample_rows, write_sample_run

METADATA = {
    "jax_version": "0.12.0.1",
    "jaxlib_version": "0.12.0.1",
    "flax_version": "0.12.12",
    "backend": "cpu",
    "device_kind": "cpu",
    "device_count": 8,
    "git_commit": "0123abcd",
    "command_line": "mhc-parity run --suite default --note '<b>bold</b>'",
    "start_time": "2025-01-01T00:00:00+00:00",
    "end_time": "2025-01-01T00:01:00+00:00",
    "policy_hash": "sha256:feedface",
}
EXPECTED_COUNTS = {"pass": 45, "fail": 2, "skip": 1, "unsupported": 1, "error": 1}


class PageIndex(HTMLParser):
    """Element ids, link targets, image sources, script/link tags and visible text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.hrefs: list[str] = []
        self.images: list[tuple[str, str]] = []  # (src, id of the enclosing figure)
        self.svg_ids: dict[str, list[str]] = {}  # id of the enclosing figure -> the ids inside its SVG
        self.forbidden_tags: list[str] = []
        self.text: list[str] = []
        self.table_rows: dict[str, int] = {}
        self._figure = ""
        self._table = ""
        self._svg_depth = 0

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if "id" in attributes:
            self.ids.append(attributes["id"])
        if tag in ("script", "link", "iframe", "object", "embed"):
            self.forbidden_tags.append(tag)
        if tag == "a" and "href" in attributes:
            self.hrefs.append(attributes["href"])
        if tag == "figure":
            self._figure = attributes.get("id", "")
        if tag == "img":
            self.images.append((attributes.get("src", ""), self._figure))
        if tag == "svg" or self._svg_depth:
            self._svg_depth += 1
            if "id" in attributes:
                self.svg_ids.setdefault(self._figure, []).append(attributes["id"])
        if tag == "table":
            self._table = attributes.get("id", "")
        if tag == "tr" and self._table:
            self.table_rows[self._table] = self.table_rows.get(self._table, 0) + 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = ""
        if self._svg_depth:
            self._svg_depth -= 1

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return sample_rows()


@pytest.fixture(scope="module")
def written(rows, tmp_path_factory) -> dict[str, Path]:
    """The reports of a complete run folder (with its manifest) made of the sample rows."""
    return write_sample_run(
        rows, tmp_path_factory.mktemp("report"), metadata=METADATA, policy_digest=METADATA["policy_hash"]
    )


@pytest.fixture(scope="module")
def page(written) -> tuple[str, PageIndex]:
    text = written["html"].read_text(encoding="utf-8")
    index = PageIndex()
    index.feed(text)
    return text, index


# ----------------------------------------------------------------------------- files


def test_write_all_writes_every_format_into_one_folder(written):
    assert set(written) == {"csv", "json", "html", "markdown", "speed"}
    assert {p.name for p in written.values()} == {"rows.csv", "report.json", "report.html", "summary.md", "speed.csv"}
    assert len({p.parent for p in written.values()}) == 1
    assert all(p.stat().st_size > 0 for p in written.values())


def test_csv_loads_in_plain_pandas_with_schema_columns_and_values(written, rows):
    frame = pd.read_csv(written["csv"])
    assert list(frame.columns) == list(ROW_COLUMNS)
    assert len(frame) == len(rows)
    failed = frame[
        (frame["case"] == "bf16_small") & (frame["leaf"] == "d_pre_alpha") & (frame["comparison"] == "vs_reference")
    ]
    assert failed["verdict"].tolist() == ["fail"]
    assert failed["bound_usage"].tolist() == [1.7]
    nan_row = frame[frame["case"] == "bf16_nan"].iloc[0]
    assert nan_row["nan_count"] == 3 and math.isnan(nan_row["cand_oracle_max_err"])
    assert math.isinf(nan_row["bound_usage"])
    assert HOSTILE_REASON in frame["reason"].tolist()


def test_csv_round_trips_exactly_through_load_rows(written, rows):
    pd.testing.assert_frame_equal(load_rows(written["csv"]), to_frame(rows))


def test_jsonl_stream_loads_with_nan_and_infinity_tokens(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n", encoding="utf-8")
    assert "NaN" in path.read_text() and "Infinity" in path.read_text()
    pd.testing.assert_frame_equal(load_rows(path), to_frame(rows))


def test_every_file_writes_non_finite_numbers_one_way_and_older_forms_still_load(written, rows, tmp_path):
    """nan / inf / -inf in rows.jsonl, rows.csv, report.json and the baseline; null, empty
    cells and "Infinity" (files written before) still read."""
    store = RowStore(tmp_path)
    store.start_fresh()
    by_case = {case: [r for r in rows if r["case"] == case] for case in dict.fromkeys(r["case"] for r in rows)}
    for case, case_rows in by_case.items():
        store.append_case(case, case_rows)
    baseline = write_baseline(rows, tmp_path / "baseline.csv", policy_hash="p1")
    stream = store.rows_path.read_text()
    assert '"nan"' in stream and '"inf"' in stream and "null" not in stream and "Infinity" not in stream
    csv_cells = written["csv"].read_text().replace("\n", ",").split(",")
    assert "nan" in csv_cells and "inf" in csv_cells and "Infinity" not in csv_cells
    assert "nan" in baseline.read_text().replace("\n", ",").split(",")
    document = json.loads(written["json"].read_text())
    cells = [row[c] for row in document["rows"] for c in FLOAT_COLUMNS] + [
        document["summary"]["worst_leaf"]["bound_usage"]
    ]
    assert {c for c in cells if not isinstance(c, float)} == {"nan", "inf"}
    streamed = to_frame(store.finished()[0])  # the stream reads back exactly
    pd.testing.assert_frame_equal(streamed, to_frame([r for case_rows in by_case.values() for r in case_rows]))
    old = [dict(row, max_abs_err=None, bound_usage="Infinity", cosine="") for row in rows[:2]]
    frame = to_frame(old)
    assert (
        frame["max_abs_err"].isna().all() and (frame["bound_usage"] == math.inf).all() and frame["cosine"].isna().all()
    )


def test_json_report_has_metadata_summary_and_strict_json_rows(written, rows):
    def reject(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    document = json.loads(written["json"].read_text(encoding="utf-8"), parse_constant=reject)
    assert document["format"] == "mhc-parity-report"
    assert {k: document["metadata"][k] for k in METADATA} == METADATA
    manifest = document["manifest"]  # the run's manifest travels with its report
    assert manifest["state"] == "complete" and manifest["rows"] == len(rows)
    assert document["metadata"]["run_id"] == manifest["run_id"]
    assert document["schema_columns"] == list(ROW_COLUMNS)
    summary = document["summary"]
    assert summary["verdicts"] == EXPECTED_COUNTS
    assert summary["total"] == len(rows) and summary["ok"] is False
    assert summary["worst_leaf"]["case"] == "bf16_nan"
    assert summary["worst_leaf"]["bound_usage"] == "inf"  # non-finite numbers: mhc_parity.records.rows.encode_float
    assert len(document["rows"]) == len(rows)
    error_row = next(r for r in document["rows"] if r["verdict"] == "error")
    assert error_row["max_abs_err"] == "nan" and error_row["reason"] == HOSTILE_REASON
    assert "gate" not in document


def test_report_json_loads_back_as_the_same_rows(written, rows):
    run = load_run(written["json"])
    pd.testing.assert_frame_equal(run.frame, to_frame(rows))
    assert run.policy_hash == METADATA["policy_hash"]
    assert load_run(written["csv"].parent).source.name == "report.json"


def test_summary_counts_every_verdict_and_picks_the_worst_leaf(rows):
    summary = summarize(to_frame(rows))
    assert summary["verdicts"] == EXPECTED_COUNTS
    assert list(summary["verdicts"]) == list(VERDICTS)
    assert summary["cases"] == 5
    assert summary["rows_with_nan_or_inf"] == 1
    assert summary["by_comparison"]["lowering"]["pass"] == 1


def test_sharpness_gives_the_bound_usage_of_passing_rows_per_comparison_and_dtype(rows):
    from mhc_parity.reports.summary import sharpness

    frame = to_frame(rows)
    table = sharpness(frame)
    assert set(table["comparison"]) <= {"vs_oracle", "vs_reference", "vs_unsharded"}
    for line in table.itertuples():
        group = frame[(frame["comparison"] == line.comparison) & (frame["act_dtype"] == line.act_dtype)]
        usage = group.loc[group["verdict"] == "pass", "bound_usage"].dropna()
        assert line.passing == (group["verdict"] == "pass").sum()
        assert line.failing == group["verdict"].isin(["fail", "error"]).sum()
        assert line.median_usage == pytest.approx(usage.median())
        assert line.p90_usage == pytest.approx(usage.quantile(0.9))
        assert line.max_usage == pytest.approx(usage.max()) and line.p90_usage <= line.max_usage
    assert summarize(frame)["sharpness"] == table.to_dict(orient="records")


# ----------------------------------------------------------------------------- HTML


def test_html_is_self_contained(page):
    text, index = page
    assert index.forbidden_tags == []
    assert "http://" not in text and "https://" not in text and "xmlns" not in text
    assert "@import" not in text
    references = re.findall(r"url\(([^)]*)\)|href=\"([^\"]*)\"", text)
    targets = [url or href for url, href in references]
    assert any(t.startswith("#case-") for t in targets) and any(t.startswith("#bound-plot-") for t in targets)
    assert all(t.startswith("#") and t[1:] in index.ids for t in targets)  # every link and clip path is on the page
    assert len(index.ids) == len(set(index.ids))  # each figure's SVG ids are its own
    assert index.images == []  # the heatmaps are tables, the plots inline SVG


def test_html_escapes_case_names_reasons_and_metadata(page):
    text, index = page
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "kernel raised: bad &amp; &lt;worse&gt; &quot;quoted&quot; &#x27;single&#x27;" in text
    assert "&lt;b&gt;bold&lt;/b&gt;" in text and "<b>bold</b>" not in text
    visible = "".join(index.text)
    assert HOSTILE_CASE in visible and HOSTILE_REASON in visible


def test_html_summary_banner_shows_counts_and_worst_leaf(page):
    text, index = page
    assert 'id="summary"' in text and "mHC parity: FAIL" in text
    for verdict, count in EXPECTED_COUNTS.items():
        assert f'<span class="v-{verdict}">{verdict}</span> <b>{count}</b>' in text
    assert "worst-leaf" in index.ids
    assert "bf16_nan" in text.split('id="worst-leaf"')[1].split("</p>")[0]


def test_html_has_a_sharpness_table(page):
    text, index = page
    assert "sharpness-table" in index.ids
    section = text.split('id="sharpness"')[1].split("</section>")[0]
    assert "median usage" in section and "vs_oracle" in section and "bfloat16" in section


def test_html_has_one_heatmap_per_comparison_and_histograms_per_dtype(page, rows):
    text, index = page
    for comparison in ("vs_reference", "vs_unsharded", "vs_oracle", "lowering"):
        assert f"heatmap-{comparison}" in index.ids
        pairs = {(r["case"], r["candidate"]) for r in rows if r["comparison"] == comparison}
        assert index.table_rows[f"heatmap-table-{comparison}"] == 1 + len(pairs)  # header + case × candidate
    heatmaps = text.split('id="heatmaps"')[1].split("</section>")[0]
    assert "<img" not in heatmaps  # tables, nothing to draw
    assert {h[1:] for h in index.hrefs if h.startswith("#case-")} <= set(index.ids)
    for dtype in ("bfloat16", "float32"):
        figure = text.split(f'id="histogram-{dtype}"')[1].split("</figure>")[0]
        assert figure.count("<svg") == 1 and "Error histogram" in figure
        # one matplotlib axes per leaf kind with measured rows of the dtype, each with its ticks
        measured = [r for r in rows if r["dtype"] == dtype and r["verdict"] not in ("skip", "unsupported")]
        kinds = {r["leaf_kind"] for r in measured}
        svg_ids = index.svg_ids[f"histogram-{dtype}"]
        assert len([i for i in svg_ids if re.fullmatch(rf"histogram-{dtype}-axes_\d+", i)]) == len(kinds)
        assert len([i for i in svg_ids if re.fullmatch(rf"histogram-{dtype}-xtick_\d+", i)]) >= len(kinds)
        assert len([i for i in svg_ids if re.fullmatch(rf"histogram-{dtype}-ytick_\d+", i)]) >= 2 * len(kinds)
        assert all(f"{kind} (n=" in figure for kind in kinds) and "max_rel_err" in figure


def test_histogram_bins_each_measured_error_once_and_counts_what_a_log_axis_cannot_show():
    frame = pd.DataFrame(
        {
            "dtype": ["float32"] * 7 + ["bfloat16"],
            "verdict": ["pass", "pass", "fail", "pass", "error", "skip", "pass", "skip"],
            "leaf_kind": [
                "output",
                "output",
                "output",
                "weight_grad",
                "weight_grad",
                "output",
                "weight_grad",
                "output",
            ],
            "comparison": [
                "vs_oracle",
                "vs_reference",
                "vs_oracle",
                "vs_oracle",
                "vs_oracle",
                "vs_oracle",
                "vs_reference",
                "vs_oracle",
            ],
            "max_rel_err": [2e-7, 3e-7, 0.5, 0.0, math.nan, 1e-3, 4e-5, 1e-3],
        }
    )
    figure = histogram(frame, "float32")
    assert histogram(frame, "bfloat16") is None  # its one row was skipped: nothing measured
    assert figure.decades == (-7, 0) and len(figure.edges) == 4 * 7 + 1
    assert figure.comparisons == ("vs_reference", "vs_oracle")
    output, weight_grad = figure.panels
    assert (output.kind, output.rows, output.zeros, output.nonfinite) == ("output", 3, 0, 0)
    assert (weight_grad.rows, weight_grad.zeros, weight_grad.nonfinite) == (3, 1, 1)
    assert sum(output.counts["vs_oracle"]) == 2 and sum(output.counts["vs_reference"]) == 1
    assert sum(weight_grad.counts["vs_oracle"]) == 0 and sum(weight_grad.counts["vs_reference"]) == 1
    svg = histogram_svg(figure)
    assert svg.startswith('<svg class="plot" role="img"') and svg.endswith("</svg>")
    assert len(re.findall(r'id="histogram-float32-axes_\d+"', svg)) == 2
    assert "weight_grad (n=3, zeros=1, nan/inf=1)" in svg and "error against the partner" in svg  # the x axis, in words
    assert "10\u207b\u2077" in svg and "10\u2070" in svg  # the decade ticks at both ends of the axis: 10⁻⁷, 10⁰
    assert "vs_reference" in svg and "vs_oracle" in svg  # the legend


def test_two_writes_of_one_run_are_byte_identical(rows, tmp_path):
    """The SVG's ids come from a fixed salt and it carries no date: one run, one page, here
    and in another process (with another string hash seed)."""
    first = write_all(rows, METADATA, tmp_path / "a")["html"].read_bytes()
    second = write_all(rows, METADATA, tmp_path / "b")["html"].read_bytes()
    code = (
        "import json, sys\n"
        "from mhc_parity.reports import write_all\n"
        "from mhc_parity.reports.samples import sample_rows\n"
        "write_all(sample_rows(), json.loads(sys.argv[1]), sys.argv[2])\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, json.dumps(METADATA), str(tmp_path / "c")],
        check=True,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert first == second == (tmp_path / "c" / "report.html").read_bytes()
    assert b"<metadata" not in first and b"<svg" in first and b"Matplotlib" not in first


def test_bound_panels_pick_failing_and_near_bound_pairs_failing_first(rows):
    frame = to_frame(rows)
    panels, qualifying = bound_panels(frame, limit=100)
    keys = [(p.case, p.candidate, p.partner) for p in panels]
    flagged = {
        (r["case"], r["candidate"], r["partner"])
        for r in rows
        if r["comparison"] != "lowering" and (r["verdict"] == "fail" or r["bound_usage"] >= NEAR_BOUND)
    }
    assert set(keys) == flagged and qualifying == len(flagged)
    assert (HOSTILE_CASE, "ext/unsharded", "reference/unsharded") not in keys  # an error row alone: no numbers
    failing = [p.failing > 0 for p in panels]
    assert failing == sorted(failing, reverse=True) and failing[:2] == [True, True]
    assert keys[0] == ("bf16_nan", "interpret/unsharded", "reference/unsharded")  # usage inf: the worst first
    usages = [p.worst_usage for p in panels if not p.failing]
    assert usages == sorted(usages, reverse=True)
    small = next(p for p in panels if p.case == "bf16_small" and p.comparison == "vs_reference")
    failing_leaf = small.leaves.index("d_pre_alpha")
    assert small.verdicts[failing_leaf] == "fail" and small.usages[failing_leaf] == 1.7
    assert small.bounds[failing_leaf] == pytest.approx(small.errors[failing_leaf] / 1.7)
    assert small.error_column == "cand_oracle_max_err" and not math.isnan(small.partner_errors[0])
    by_comparison = {p.comparison: p for p in panels}
    assert by_comparison["vs_unsharded"].error_column == "max_rel_err"
    assert all(math.isnan(e) for e in by_comparison["vs_unsharded"].partner_errors)
    assert all(math.isnan(e) for e in by_comparison["vs_oracle"].partner_errors)  # the partner is the oracle
    capped, _ = bound_panels(frame)
    assert [(p.case, p.candidate, p.partner) for p in capped] == keys[:MAX_BOUND_PANELS]
    assert bound_panels(frame.assign(bound_usage=0.1, verdict="pass")) == ([], 0)


def test_html_draws_the_failing_and_near_bound_pairs(page, rows):
    text, index = page
    panels, qualifying = bound_panels(to_frame(rows))
    section = text.split('<section id="bound-plots">')[1].split("</section>")[0]
    assert section.count('<figure class="bound-plot"') == len(panels) == MAX_BOUND_PANELS < qualifying
    assert f"The first {MAX_BOUND_PANELS} of {qualifying} pairs" in section
    assert text.index('id="bound-plots"') < text.index('id="sharpness"')  # the first thing after the banner
    for number, panel in enumerate(panels):
        svg_ids = index.svg_ids[f"bound-plot-{number}"]
        assert f"bound-plot-{number}-axes_1" in svg_ids
        assert len([i for i in svg_ids if re.fullmatch(rf"bound-plot-{number}-xtick_\d+", i)]) == len(panel.leaves)
        assert any(re.fullmatch(rf"bound-plot-{number}-ytick_\d+", i) for i in svg_ids)
    first = section.split('<figure class="bound-plot" id="bound-plot-0">')[1].split("</figure>")[0]
    assert "#d62728" in first and "bf16_nan" in first  # the failing leaf in red
    calm = render_html(to_frame(rows).assign(bound_usage=0.1, verdict="pass"))
    assert "No leaf failed or used 0.5 or more of its bound." in calm and 'class="bound-plot"' not in calm


def test_heatmap_cells_follow_the_value_rule():
    """A finite oracle ratio is the value; else bound_usage, marked as a fallback; the
    largest value, the most severe verdict and any failing row win a shared cell."""
    from mhc_parity.reports.html.heatmaps import LOG_RANGE, MAX_HEATMAP_ROWS, WORST_CANDIDATE, cell_colour, heatmap

    def row(candidate, leaf, ratio, usage, verdict="pass", case="c"):
        return {
            **empty_row(),
            "case": case,
            "candidate": candidate,
            "partner": "reference/unsharded",
            "comparison": "vs_reference",
            "leaf": leaf,
            "leaf_kind": "output",
            "oracle_ratio_max": ratio,
            "bound_usage": usage,
            "verdict": verdict,
        }

    frame = to_frame(
        [
            row("k", "out", 2.0, 0.1),
            row("k", "h_pre", math.nan, 0.3),
            row("j", "out", 0.5, 0.2, "fail"),
            row("j", "out", 4.0, 0.1, "pass"),  # two partners: one cell
            row("i", "out", math.nan, math.nan, "skip"),
        ]
    )
    table = heatmap(frame, "vs_reference")
    assert table.rows == (("c", "i"), ("c", "j"), ("c", "k")) and table.leaves == ("h_pre", "out")
    assert table.values.at[2, "out"] == 2.0 and not table.fallback.at[2, "out"]
    assert table.values.at[2, "h_pre"] == 0.3 and table.fallback.at[2, "h_pre"]
    assert table.values.at[1, "out"] == 4.0 and table.failing.at[1, "out"] and table.verdicts.at[1, "out"] == "fail"
    assert math.isnan(table.values.at[0, "out"]) and table.verdicts.at[0, "out"] == "skip"
    assert table.verdicts.at[0, "h_pre"] == "" and not table.aggregated
    many = to_frame([row(f"k{i}", "out", 1.0 + i, 0.1, case=f"c{i % 2}") for i in range(MAX_HEATMAP_ROWS + 1)])
    aggregated = heatmap(many, "vs_reference")
    assert aggregated.rows == (("c0", WORST_CANDIDATE), ("c1", WORST_CANDIDATE))
    assert aggregated.values.at[0, "out"] == 1.0 + MAX_HEATMAP_ROWS  # the worst candidate of case c0
    # The colour scale: white at 1, saturated and dark beyond 10**LOG_RANGE either way, grey without a value.
    assert cell_colour(1.0) == ("#f7f7f7", "#000000")
    assert cell_colour(10 ** (LOG_RANGE + 1)) == cell_colour(math.inf) == ("#67001f", "#ffffff")
    assert cell_colour(0.0) == cell_colour(10 ** -(LOG_RANGE + 1)) == ("#053061", "#ffffff")
    assert cell_colour(math.nan)[0] == "#d9d9d9"


def test_worst_offenders_table_lists_failures_first_and_links_to_case_sections(page):
    text, index = page
    assert index.table_rows["worst-offenders-table"] == 1 + 25  # header + the default limit
    table = text.split('id="worst-offenders-table"')[1].split("</table>")[0]
    body_rows = table.split("<tr>")[2:]
    assert "v-error" in body_rows[0] and "v-fail" in body_rows[1] and "v-fail" in body_rows[2]
    assert "bf16_nan" in body_rows[1] and "d_pre_alpha" in body_rows[2]
    links = [h[1:] for h in index.hrefs if h.startswith("#case-")]
    assert links and all(anchor in index.ids for anchor in links)
    hostile_link = table.split("</a>")[0]
    assert "&lt;script&gt;" in hostile_link and 'href="#case-0-script-alert-1-script"' in hostile_link


def test_html_per_case_sections_and_environment(page):
    text, index = page
    case_ids = [i for i in index.ids if i.startswith("case-")]
    assert len(case_ids) == 5
    assert "environment-table" in index.ids
    environment = text.split('id="environment-table"')[1]
    assert "sha256:feedface" in environment and "0123abcd" in environment
    assert "needs a TPU backend" in text and "UnsupportedInputError" in text
    assert "drift" not in index.ids  # no baseline given


# ----------------------------------------------------------------------------- Markdown


def test_markdown_has_counts_status_and_failure_lines(written):
    text = written["markdown"].read_text(encoding="utf-8")
    assert text.startswith("## mHC parity: ❌ FAIL")
    assert "| pass | fail | skip | unsupported | error | total |" in text
    assert "| 45 | 2 | 1 | 1 | 1 | 50 |" in text
    assert "### Failures (3)" in text
    assert "| bf16_small | interpret/unsharded | reference/unsharded | d_pre_alpha | fail | 1.7 |" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "<script>" not in text
    assert "git_commit: 0123abcd" in text


def test_markdown_truncates_long_failure_lists():
    from mhc_parity.reports import render_markdown

    failing = [
        empty_row(
            case=f"c{i:02d}",
            candidate="a",
            partner="b",
            leaf="out",
            comparison="vs_reference",
            leaf_kind="output",
            dtype="float32",
            verdict="fail",
            reason="bad | pipe",
            bound_usage=2.0,
        )
        for i in range(30)
    ]
    text = render_markdown(failing, max_rows=20)
    assert "### Failures (30)" in text
    assert text.count("| out | fail |") == 20
    assert "… and 10 more" in text
    assert "bad \\| pipe" in text


def test_markdown_pass_line_when_nothing_fails(rows):
    from mhc_parity.reports import render_markdown

    passing = [r for r in rows if r["verdict"] in ("pass", "skip", "unsupported")]
    text = render_markdown(passing)
    assert text.startswith("## mHC parity: ✅ PASS") and "Failures" not in text


@pytest.mark.slow
def test_a_run_under_another_policy_says_so_at_the_top_of_every_summary(tmp_path, capsys, rows):
    from mhc_parity.harness.judging.policy_file import DEFAULT_POLICY_PATH
    from mhc_parity.reports import render_markdown
    from tests.cli_support import REFERENCE_ONLY_CASE

    default = DEFAULT_POLICY_PATH.read_text(encoding="utf-8")
    assert "floor_ulps = 4\n" in default
    policy = tmp_path / "looser.toml"
    policy.write_text(default.replace("floor_ulps = 4\n", "floor_ulps = 40\n", 1), encoding="utf-8")
    digest = hashlib.sha256(policy.read_bytes()).hexdigest()
    out = tmp_path / "run"
    argv = ["run", "--cases", REFERENCE_ONLY_CASE, "--paths", "reference/*", "--no-lowering", "--quiet"]
    code = cli_main([*argv, "--policy", str(policy), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed[-3000:]
    head = "\n".join((out / "summary.md").read_text(encoding="utf-8").splitlines()[:4])
    banner = (out / "report.html").read_text(encoding="utf-8").split("</header>")[0]
    for shown in (head, banner, printed):
        assert str(policy) in shown and digest in shown and "not the packaged default" in shown, shown[-2000:]
    # The packaged policy goes unremarked, as does a run that did not record which policy it had.
    packaged = {"policy_file": str(DEFAULT_POLICY_PATH), "policy_hash": "p", "policy_is_default": True}
    for metadata in (packaged, METADATA):
        assert "packaged default" not in render_markdown(rows, metadata=metadata)


def test_a_run_judged_under_backend_terms_says_so_at_the_top_of_every_summary(tmp_path, rows):
    """Issue 56, item 1: a CPU probe table given the TPU's terms turned a failing run green, and
    neither the terminal nor summary.md said that non-zero terms had judged it."""
    from mhc_parity.reports import render_markdown
    from mhc_parity.reports.terminal import format_summary

    source = "probe table /cache/backend-arithmetic/0123.json"
    widened = {
        **METADATA,
        "backend_arithmetic_terms": "exp 5.6e-06, log 0.000107",
        "backend_arithmetic_source": source,
    }
    paths = write_all(rows, widened, tmp_path)
    head = "\n".join(paths["markdown"].read_text(encoding="utf-8").splitlines()[:4])
    banner = paths["html"].read_text(encoding="utf-8").split("</header>")[0]
    for shown in (head, banner, format_summary(rows, widened)):
        assert "exp 5.6e-06, log 0.000107 on cpu (cpu)" in shown and source in shown, shown[-2000:]
    # A run with no term, or one that recorded none, goes unremarked.
    for metadata in ({**METADATA, "backend_arithmetic_terms": "none", "backend_arithmetic_source": source}, METADATA):
        assert "Backend arithmetic terms" not in render_markdown(rows, metadata=metadata)
        assert "Backend arithmetic terms" not in format_summary(rows, metadata)


# ----------------------------------------------------------------------------- edge cases


def test_empty_row_set_renders_every_format(tmp_path):
    paths = write_all([], {}, tmp_path)
    assert list(pd.read_csv(paths["csv"]).columns) == list(ROW_COLUMNS)
    assert len(load_rows(paths["csv"])) == 0
    document = json.loads(paths["json"].read_text())
    # Nothing compared is never a pass.
    assert document["summary"]["total"] == 0 and document["summary"]["ok"] is False
    assert document["summary"]["worst_leaf"] is None
    text = paths["html"].read_text()
    assert "No rows were produced." in text and "No rows to plot." in text
    assert "No rows were produced." in paths["markdown"].read_text()


def test_only_unmeasured_rows_render(tmp_path):
    rows = [r for r in sample_rows() if r["verdict"] in ("skip", "unsupported", "error")]
    paths = write_all(rows, {}, tmp_path)
    text = paths["html"].read_text()
    assert 'id="heatmap-vs_reference"' in text
    assert "No measured bfloat16 rows." in text


def test_write_all_with_baseline_adds_drift_everywhere(tmp_path, rows):
    baseline = [dict(r) for r in rows]
    for row in baseline:
        if (row["case"], row["leaf"], row["comparison"]) == ("f32_small", "d_branch.w", "vs_reference"):
            row["cand_oracle_max_err"] /= 10.0  # 5 eps now vs 0.5 eps: growth 5/2 above the 2-eps floor
    paths = write_all(rows, METADATA, tmp_path, baseline=baseline)
    document = json.loads(paths["json"].read_text())
    assert document["gate"]["ok"] is False
    assert document["gate"]["counts"]["regression"] == 1
    text = paths["html"].read_text()
    assert 'id="drift-table"' in text and 'id="gate-findings-table"' in text
    drift = text.split('id="drift-table"')[1].split("</table>")[0]
    first_row = drift.split("<tr>")[2]
    assert "f32_small" in first_row and "regression" in first_row
    assert "### Baseline gate: ❌ FAIL" in paths["markdown"].read_text()


# ----------------------------------------------------------------------------- input errors


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_unparsable_jsonl_line_names_file_and_line(tmp_path, rows):
    path = _write_jsonl(tmp_path / "rows.jsonl", rows[:2])
    path.write_text(path.read_text() + '{"case": "truncat\n', encoding="utf-8")
    with pytest.raises(ReportInputError, match=r"rows\.jsonl, line 3: not valid JSON"):
        load_rows(path)


def test_missing_and_unknown_columns_are_named(tmp_path, rows):
    row = dict(rows[0])
    del row["reason"]
    row["surprise"] = 1
    path = _write_jsonl(tmp_path / "rows.jsonl", [rows[0], row])
    with pytest.raises(ReportInputError, match=r"line 2: missing columns \['reason'\]; unknown columns \['surprise'\]"):
        load_rows(path)
    csv_path = tmp_path / "rows.csv"
    pd.DataFrame(rows).drop(columns=["bound"]).to_csv(csv_path, index=False)
    with pytest.raises(ReportInputError, match=r"rows\.csv: missing columns \['bound'\]"):
        load_rows(csv_path)


def test_bad_cells_name_line_and_column(tmp_path, rows):
    csv_path = tmp_path / "rows.csv"
    frame = pd.DataFrame(rows).astype({"max_abs_err": "object"})
    frame.loc[1, "max_abs_err"] = "lots"
    frame.to_csv(csv_path, index=False)
    with pytest.raises(ReportInputError, match=r"rows\.csv, line 3, column 'max_abs_err'"):
        load_rows(csv_path)
    bad_verdict = dict(rows[0], verdict="maybe")
    with pytest.raises(ReportInputError, match=r"row 0, column 'verdict': 'maybe' is not one of"):
        to_frame([bad_verdict])
    with pytest.raises(ReportInputError, match="column 'nan_count'"):
        to_frame([dict(rows[0], nan_count=1.5)])


def test_missing_empty_and_unknown_files(tmp_path):
    with pytest.raises(ReportInputError, match="no such file"):
        load_rows(tmp_path / "absent.jsonl")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ReportInputError, match="empty file"):
        load_rows(tmp_path / "empty.csv")
    (tmp_path / "rows.parquet").write_text("x")
    with pytest.raises(ReportInputError, match="unsupported row file type"):
        load_rows(tmp_path / "rows.parquet")


def test_reports_package_never_imports_jax():
    code = (
        "import sys, mhc_parity.reports, mhc_parity.reports.gate.rule, mhc_parity.reports.gate.baseline_file\n"
        "import mhc_parity.reports.html.page, mhc_parity.reports.html.figures, mhc_parity.reports.markdown\n"
        "import mhc_parity.reports.html.svg, mhc_parity.reports.html.heatmaps, mhc_parity.reports.speed\n"
        "import mhc_parity.reports.html.tables, mhc_parity.records.roofline\n"
        "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib', 'flax')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_render_cli_rewrites_a_finished_run_and_refuses_a_bare_stream(tmp_path, rows, capsys):
    write_sample_run(rows[:6], tmp_path / "run")
    assert cli_main(["render", "--rows", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.html").is_file()
    rendered = load_run(tmp_path / "out")  # a copy of the run, manifest included
    assert rendered.manifest.run_id == load_run(tmp_path / "run").manifest.run_id
    assert cli_main(["render", "--rows", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x")]) == 2
    stream = _write_jsonl(tmp_path / "rows.jsonl", rows[:6])
    assert cli_main(["render", "--rows", str(stream), "--out", str(tmp_path / "y")]) == 2
    assert "bare rows file carries no manifest" in capsys.readouterr().err
