"""What a report shows first: the gate's verdict against the baseline, in words a reader takes in.

With a baseline, the HTML banner, the top of summary.md and the end of the terminal summary
carry the gate's verdict (pass, or the rows that grew past the growth factor) from the one
judgement `mhc-parity gate` makes (`mhc_parity.reports.gate.judgement`), so the report and the gate cannot
disagree; a baseline the gate refuses is said to be refused, in both. A zero count is drawn
neutral, and the plots' axes are labelled in words with their units, not column names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mhc_parity.harness.commands.gate import main as gate_main
from mhc_parity.records.schema import ROW_COLUMNS, row_key
from mhc_parity.reports import load_baseline, load_run, to_frame, write_all, write_baseline
from mhc_parity.reports.gate.judgement import judge
from mhc_parity.reports.html.figures import bound_panels, histograms
from mhc_parity.reports.html.page import render_html
from mhc_parity.reports.html.svg import bound_panel_svg, histogram_svg
from mhc_parity.reports.samples import sample_rows, write_sample_run
from mhc_parity.reports.sources import baseline_as_run
from mhc_parity.reports.terminal import exit_code, format_summary
from mhc_parity.reports.writers import judge_frame

# A bfloat16 activation gradient of 3 eps, grown x3 over its baseline: far inside its bound,
# past the gate's growth factor of 2 (above its 2-eps noise floor).
GROWN = ("bf16_small", "interpret/unsharded", "reference/unsharded", "d_x")


def passing_rows() -> list[dict]:
    """The sample rows without fail/error verdicts: a run that passes on its own."""
    return [dict(r) for r in sample_rows() if r["verdict"] in ("pass", "skip", "unsupported")]


def grown(rows: list[dict], key: tuple = GROWN, factor: float = 3.0) -> list[dict]:
    """`rows` with the `key` row's oracle error `factor` times larger (its verdict unchanged)."""
    current = [dict(r) for r in rows]
    for row in current:
        if row_key(row) == key:
            row["cand_oracle_max_err"] *= factor
    return current


def banner(html: str) -> str:
    """The page's first screen: its banner."""
    return html.split('<header id="summary"', 1)[1].split("</header>", 1)[0]


def test_a_leaf_grown_inside_its_bound_heads_every_report(tmp_path):
    rows = grown(passing_rows())
    paths = write_all(rows, {}, tmp_path, baseline=passing_rows())
    top = banner(paths["html"].read_text())
    assert "mHC parity: FAIL" in top
    assert "Gate against the baseline rows: FAIL: 1 row grew more than ×2" in top
    assert 'id="gate-first-findings"' in top and "<b>d_x</b>" in top and "(x3)" in top
    markdown = paths["markdown"].read_text()
    head = markdown.split("### Verdict per implementation", 1)[0]
    assert "❌ **Gate against the baseline rows: FAIL: 1 row grew more than ×2" in head
    assert "| regression | bf16_small | interpret/unsharded | reference/unsharded | d_x |" in head
    document = json.loads(paths["json"].read_text())
    assert document["gate"]["verdict"] == "FAIL" and document["gate"]["baseline"] == "the baseline rows"


def test_the_terminal_summary_ends_with_the_gates_verdict_and_a_grown_leaf_fails_the_run(tmp_path):
    rows = grown(passing_rows())
    judgement = judge_frame(to_frame(rows), {}, passing_rows(), None, tmp_path / "report.json")
    text = format_summary(rows, {}, judgement)
    parity, gate = text.rsplit("parity: PASS", 1)
    assert gate.splitlines()[1].startswith("Gate against the baseline rows: FAIL: 1 row grew more than ×2")
    assert "regression" in gate and "d_x" in gate and "(x3)" in gate
    assert exit_code(rows) == 0 and exit_code(rows, judgement) == 1
    clean = judge_frame(to_frame(rows), {}, rows, None, tmp_path / "report.json")
    assert exit_code(rows, clean) == 0
    # The verdict closes the summary; only the gate's own remarks (indented) may follow it, such
    # as the note that these sample rows keep no gain for the systematic-shift rule.
    lines = format_summary(rows, {}, clean).splitlines()
    verdict_at = max(i for i, line in enumerate(lines) if line.startswith("Gate against the baseline rows:"))
    assert lines[verdict_at].startswith("Gate against the baseline rows: PASS")
    assert all(line.startswith("  ") for line in lines[verdict_at + 1 :]), lines[verdict_at:]


def test_a_passing_gate_says_so_on_the_first_screen(tmp_path):
    rows = passing_rows()
    paths = write_all(rows, {}, tmp_path, baseline=rows)
    top = banner(paths["html"].read_text())
    assert "mHC parity: PASS" in top and "Gate against the baseline rows: PASS" in top
    assert "no oracle error grew more than ×2" in top and 'id="gate-first-findings"' not in top
    assert "✅ **Gate against the baseline rows: PASS" in paths["markdown"].read_text().split("| pass |", 1)[0]


def write_run(folder: Path, rows: list[dict], policy_hash: str = "p1") -> Path:
    """`rows` as a complete run folder, as `mhc-parity run` leaves one (reports not written)."""
    write_sample_run(rows, folder, metadata={"policy_hash": policy_hash}, policy_digest=policy_hash, rendered=False)
    return folder


def report_of(run_folder: Path, baseline: Path, out: Path) -> dict:
    """The reports of the run in `run_folder` against `baseline`, written as `mhc-parity run
    --baseline` writes them; report.json's "gate"."""
    run = load_run(run_folder)
    write_all(run, run.metadata, out, baseline=load_baseline(baseline), manifest=run.manifest)
    return json.loads((out / "report.json").read_text())["gate"]


@pytest.mark.parametrize("policy", ["p1", "p2"], ids=["same-policy", "other-policy"])
def test_the_report_and_the_gate_command_agree(tmp_path, capsys, policy):
    """One judgement: the report's verdict and findings are the gate command's, and a baseline
    the gate refuses (another tolerance policy) is reported refused with the gate's words."""
    baseline = write_baseline(passing_rows(), tmp_path / "baseline.csv", policy_hash="p1")
    current = write_run(tmp_path / "run", grown(passing_rows()), policy_hash=policy)
    code = gate_main(["--baseline", str(baseline), "--current", str(current)])
    captured = capsys.readouterr()
    gate = report_of(current, baseline, tmp_path / "report")
    if policy == "p1":
        assert code == 1 and gate["verdict"] == "FAIL"
        regressions = [f for f in gate["findings"] if f["category"] == "regression"]
        assert [(f["case"], f["candidate"], f["partner"], f["leaf"]) for f in regressions] == [GROWN]
        assert "regression (1):" in captured.out and GROWN[-1] in captured.out
    else:
        assert code == 2 and gate["verdict"] == "REFUSED" and gate["ok"] is False
        assert gate["refusal"] and gate["refusal"] in captured.err
        html = (tmp_path / "report" / "report.html").read_text()
        assert "not judged" in banner(html) and "mHC parity: PASS" in banner(html)


def test_judge_is_the_gates_judgement_of_two_loaded_runs(tmp_path):
    baseline = load_baseline(write_baseline(passing_rows(), tmp_path / "b.csv", policy_hash="p1"))
    current = load_run(write_run(tmp_path / "run", grown(passing_rows())))
    judgement = judge(baseline_as_run(baseline), current)
    assert judgement.verdict == "FAIL" and [f.key for f in judgement.result.regressions] == [GROWN]
    assert judge(baseline_as_run(baseline), current, growth_factor=4.0).verdict == "PASS"


def test_a_zero_count_is_not_drawn_in_its_verdicts_alarm_colour():
    page = render_html(to_frame(passing_rows()))
    counts = banner(page).split('<ul class="counts">', 1)[1].split("</ul>", 1)[0]
    error, fail = (re.search(rf'<li class="count-{v}[^"]*">.*?</li>', counts).group(0) for v in ("error", "fail"))
    assert "v-error" not in error and "v-fail" not in fail  # red on a passing run would read as a failure
    assert 'class="count-error zero"' in error and "<b>0</b>" in error
    assert '<span class="v-pass">pass</span>' in counts  # a non-zero count keeps its colour


def svg_texts(svg: str) -> list[str]:
    """The text a figure shows (its `<text>` elements, tags stripped) and its accessible name."""
    texts = [re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text\b[^>]*>(.*?)</text>", svg, re.S)]
    return [*texts, *re.findall(r'aria-label="([^"]*)"', svg)]


def test_plot_axes_are_labelled_in_words_with_their_units():
    frame = to_frame(sample_rows())
    panels, _ = bound_panels(frame)
    figures = [bound_panel_svg(panel, index) for index, panel in enumerate(panels)]
    figures += [histogram_svg(h) for h in histograms(frame).values() if h is not None]
    columns = [c for c in ROW_COLUMNS if "_" in c]  # the schema's names a reader would not know
    for svg in figures:
        texts = svg_texts(svg)
        named = [(c, t) for t in texts for c in columns if c in t]
        assert not named, named
    shown = " ".join(" ".join(svg_texts(svg)) for svg in figures)
    assert "error against the float64 oracle" in shown and "error against the unsharded run" in shown
    assert "largest |difference| ÷ largest |oracle|" in shown  # the unit: relative to the largest magnitude
    assert "error against the partner (largest |difference| ÷ largest |partner|)" in shown
    assert "rows (count)" in shown
